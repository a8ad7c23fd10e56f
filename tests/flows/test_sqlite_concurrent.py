"""Two `rlhf run` processes started at the same moment on a new, not yet created SQLite
MLflow store (the same tracking folder): both create the store, the experiment and their
run trees without a schema-migration or experiment-creation race, and both exit 0."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.shared import CONCURRENT_RUN, child_runs_by_stage, pipeline_stages
from tests.shared import TEST_CONFIG as CONFIG

ROOT = Path(__file__).resolve().parents[2]
RUN_NAMES = ("lite-a", "lite-b")


def _start(name: str, tmp: Path, env: dict) -> subprocess.Popen:
    sets = [*CONCURRENT_RUN, f"tracking.run_name={name}", f"tracking.workdir={tmp}/{name}"]
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "run", "--config", str(CONFIG),
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_runs_started_at_once_on_a_new_sqlite_store_both_finish(tmp_path, prefect_api):
    db = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{db}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PREFECT_API_URL": prefect_api,
           "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    assert not db.exists()
    start = time.perf_counter()
    procs = {name: _start(name, tmp_path, env) for name in RUN_NAMES}
    parents = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"run {name} failed:\n{out[-4000:]}"
        assert "Traceback" not in out, out[-4000:]
        parents[name] = re.search(r"MLflow parent run: (\w+) ", out).group(1)
    print(f"two concurrent runs on a new SQLite store: {time.perf_counter() - start:.1f} s")

    client = MlflowClient(uri)
    assert len(set(parents.values())) == 2
    experiments = {client.get_run(p).info.experiment_id for p in parents.values()}
    assert len(experiments) == 1  # one experiment, created once
    children = set()
    for name, parent_id in parents.items():
        parent = client.get_run(parent_id)
        assert parent.info.status == "FINISHED", name
        assert parent.data.tags["rlhf.run_name"] == name
        by_stage = child_runs_by_stage(client, parent_id)
        assert sorted(by_stage) == sorted(pipeline_stages()), name
        assert all(r.info.status == "FINISHED" for r in by_stage.values()), name
        children |= {r.info.run_id for r in by_stage.values()}
        steps = [m.step for m in client.get_metric_history(by_stage["ppo"].info.run_id,
                                                           "objective/kl")]
        assert sorted(steps) == [1, 2], name  # its own iterations only
        assert "eval/judge_win_rate" in parent.data.metrics, name
    assert len(children) == 2 * len(pipeline_stages())  # no child run shared or lost
