"""MLflow on PostgreSQL: a real PostgreSQL server, `mlflow server` on it with served
artifacts, and two `rlhf run` processes started at the same time against that one server
(and one Prefect server). Both finish, each with its own intact run tree, read back through
the server like a team's shared MLflow UI would show it.

Needs the PostgreSQL server binaries (Debian: `apt-get install postgresql`, done by .ci/run)
and the `postgres` extra (`pip install -e '.[postgres]'`); without them the test is skipped
with the reason."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests import servers
from tests.servers import artifact_paths, stage_children
from tests.shared import CONCURRENT_RUN, pipeline_stages
from tests.shared import TEST_CONFIG as CONFIG

ROOT = Path(__file__).resolve().parents[2]
RUN_NAMES = ("pg-a", "pg-b")
PPO_CURVES = ("objective/kl", "objective/scores", "loss/policy_avg", "val/explained_variance")


@pytest.fixture(scope="module")
def pg_mlflow(tmp_path_factory):
    """PostgreSQL -> `mlflow server --backend-store-uri postgresql+psycopg://...` -> URL."""
    pytest.importorskip("psycopg", reason="the `postgres` extra is not installed "
                                          "(pip install -e '.[postgres]')")
    bindir = servers.postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, postgres) not found on the PATH, in "
                    "/usr/lib/postgresql/*/bin or $PG_BINDIR (Debian: apt-get install "
                    "postgresql, as .ci/run does)")
    tmp = tmp_path_factory.mktemp("pg_mlflow")
    with servers.postgres_server(bindir) as db_uri, \
            servers.mlflow_server(db_uri, tmp, workers=2) as url:
        yield url


def _start_cli(run_name: str, workdir: Path, env: dict) -> subprocess.Popen:
    # two runs share the CPU cores (one thread each); the sizes matter not, the store does
    sets = [*CONCURRENT_RUN, f"tracking.run_name={run_name}", f"tracking.workdir={workdir}"]
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "run", "--config", str(CONFIG),
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def two_runs(pg_mlflow, prefect_api, tmp_path_factory):
    """Two CLI pipeline runs at the same time -> ({run name: parent run id}, client)."""
    tmp = tmp_path_factory.mktemp("pg_runs")
    env = {**os.environ, "MLFLOW_TRACKING_URI": pg_mlflow, "PREFECT_API_URL": prefect_api,
           "PREFECT_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    procs = {name: _start_cli(name, tmp / name, env) for name in RUN_NAMES}
    parents = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"run {name} failed:\n{out[-4000:]}"
        parents[name] = re.search(r"MLflow parent run: (\w+) ", out).group(1)
        print(f"run {name}: " + re.search(r"total wall time: .*", out).group(0))
    print(f"two concurrent pipeline runs: {time.perf_counter() - start:.1f} s")
    return parents, MlflowClient(pg_mlflow)


def test_both_concurrent_runs_finish_with_their_own_run_trees(two_runs):
    parents, client = two_runs
    assert len(set(parents.values())) == 2
    child_ids = set()
    for name, parent_id in parents.items():
        parent = client.get_run(parent_id)
        assert parent.info.status == "FINISHED", name
        assert parent.data.tags["rlhf.run_name"] == name
        assert parent.info.artifact_uri.startswith("mlflow-artifacts:/"), parent.info.artifact_uri
        by_stage = stage_children(client, parent)
        assert sorted(by_stage) == sorted(pipeline_stages()), name
        assert all(r.info.status == "FINISHED" for r in by_stage.values()), name
        child_ids |= {r.info.run_id for r in by_stage.values()}
        ppo_id = by_stage["ppo"].info.run_id
        for key in PPO_CURVES:  # one value per iteration: no steps from the other run
            assert [m.step for m in client.get_metric_history(ppo_id, key)] == [1, 2], key
        for key in ("eval/rm_accuracy", "eval/judge_win_rate", "eval/kl_to_ref"):
            assert key in parent.data.metrics, (name, key)
        assert "checkpoint/policy/model.safetensors" in artifact_paths(client, ppo_id)
    assert len(child_ids) == 2 * len(pipeline_stages())  # no child run shared or lost


def test_each_run_registered_its_own_versions_and_aliases_resolve(two_runs):
    import mlflow

    parents, client = two_runs
    exp_id = client.get_run(parents["pg-a"]).info.experiment_id
    policy_name = client.get_run(parents["pg-a"]).data.params["tracking.registered_policy"]
    register_runs = {}
    for name, parent_id in parents.items():
        register_runs[name] = stage_children(client, client.get_run(parent_id))["register"]
        assert register_runs[name].info.experiment_id == exp_id  # one experiment, no clash
    versions = {v.run_id: v for v in client.search_model_versions(f"name = '{policy_name}'")}
    register_ids = {r.info.run_id for r in register_runs.values()}
    assert register_ids <= set(versions)  # one version per run, from its own register run
    assert len({versions[i].version for i in register_ids}) == 2
    aliases = client.get_registered_model(policy_name).aliases
    mlflow.set_tracking_uri(client.tracking_uri)  # weights come back from the served store
    if "champion" not in aliases:  # each tiny run lost to its start: both stay challenger
        assert all(versions[i].tags["rlhf.register.decision"] == "worse-than-start"
                   for i in register_ids)
        uri = f"models:/{policy_name}/{aliases['challenger']}"
    else:
        champion = client.get_model_version_by_alias(policy_name, "champion")
        assert champion.run_id in register_ids
        # the other run's version is the challenger, unless it was promoted too (a champion
        # is no challenger)
        assert aliases.get("challenger") in (None, *(str(versions[i].version) for i in
                                                     register_ids - {champion.run_id}))
        uri = f"models:/{policy_name}@champion"
    policy = mlflow.pyfunc.load_model(uri)
    [answer] = policy.predict(pd.DataFrame({"prompt": ["hello , tell me about the weather ."]}),
                              params={"max_new_tokens": 4, "do_sample": False})
    assert isinstance(answer, str) and not answer.startswith("hello , tell me")
