"""An MLflow server that goes away mid-PPO does not stop the training
(tasks/platform/mlflow/spool.py).

Real servers, started and ended by their PID: back within ``tracking.outage_limit_s``, the
run finishes with every metric step recorded once and the weights of an uninterrupted run;
away for longer, the stage stops at a checkpoint with exit 75 and one sentence, and the
command it names (run after the server is back) gives the same weights again.
"""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests import servers
from tests.shared import ROOT, TEST_CONFIG, ppo_iteration_metrics, rlhf_in_process
from tests.stores import seed_sqlite_store

ITERATIONS = 24
SETTINGS = [f"ppo.iterations={ITERATIONS}", "ppo.checkpoint_every=2", "ppo.sample_every=1",
            "tracking.progress=true", "tracking.system_metrics=false",
            "tracking.register_models=false", "demo.n_sft=64", "demo.n_pref=64",
            "demo.n_eval=8", "demo.n_pref_eval=16", "eval.num_prompts=8",
            "model.torch_threads=1"]


def rlhf(tmp: Path, name: str, uri: str, prefect_api: str, *extra: str,
         args: list[str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Start `rlhf run` (workdir ``tmp/name``) -> the process and its stderr file."""
    if args is None:
        args = ["run", "--config", str(TEST_CONFIG)]
        for item in [*SETTINGS, f"tracking.workdir={tmp / name}", *extra]:
            args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": uri, "PREFECT_LOGGING_LEVEL": "INFO"}
    log = tmp / f"{name}.err"
    with open(log, "a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    return proc, log


def wait_for(text: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def weights(workdir: Path) -> bytes:
    (path,) = workdir.glob("*/ppo/policy/model.safetensors")  # <workdir>/<run id>/ppo/...
    return path.read_bytes()


def ppo_history_once(uri: str) -> None:
    """Every PPO metric of the ppo run holds steps 1..ITERATIONS, each once."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("rlhf-test")
    (ppo,) = client.search_runs([exp.experiment_id], "tags.`rlhf.stage` = 'ppo'")
    assert ppo.info.status == "FINISHED"
    for key in ppo_iteration_metrics():
        steps = [m.step for m in client.get_metric_history(ppo.info.run_id, key)]
        assert sorted(steps) == list(range(1, ITERATIONS + 1)), (key, steps)
    tables = servers.artifact_paths(client, ppo.info.run_id, "samples")
    assert len(tables) == ITERATIONS + 1  # one per iteration + all.json


@pytest.fixture(scope="module")
def uninterrupted(prefect_api, tmp_path_factory):
    """-> a function giving the final weights of the same run without an outage (trained
    beside the first test's run, one thread each, to keep the module short)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    seed_sqlite_store(f"sqlite:///{tmp}/m.db")
    proc, log = rlhf(tmp, "runs", f"sqlite:///{tmp}/m.db", prefect_api)

    def get() -> bytes:
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        return weights(tmp / "runs")

    yield get
    proc.kill()


def stopped_mid_ppo(tmp_path, prefect_api, limit_s: int):
    """A run against a real MLflow server on its own port, that server stopped at PPO step 2
    -> (port, uri, server, proc, log)."""
    port = servers.free_port()
    server = servers.start_mlflow(f"sqlite:///{tmp_path}/s.db", tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    proc, log = rlhf(tmp_path, "runs", uri, prefect_api, f"tracking.outage_limit_s={limit_s}")
    try:
        wait_for("ppo: step 2/", proc, log)
    except BaseException:
        proc.kill()
        raise
    finally:
        servers.stop(server)
    return port, uri, server, proc, log


def test_a_server_back_within_the_limit_leaves_a_complete_record(prefect_api, tmp_path,
                                                                 uninterrupted):
    port, uri, server, proc, log = stopped_mid_ppo(tmp_path, prefect_api, 120)
    try:
        wait_for("does not answer; tracking records go to", proc, log)
        server = servers.start_mlflow(f"sqlite:///{tmp_path}/s.db", tmp_path, port)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "answers again after" in text and "Traceback" not in text, text[-3000:]
        ppo_history_once(uri)
    finally:
        proc.kill()
        servers.stop(server)
    assert weights(tmp_path / "runs") == uninterrupted()


def test_a_longer_outage_stops_at_a_checkpoint_and_resumes(prefect_api, tmp_path,
                                                           uninterrupted, capfd, threads_kept):
    port, uri, server, proc, log = stopped_mid_ppo(tmp_path, prefect_api, 1)
    try:
        assert proc.wait(timeout=120) == 75, log.read_text()[-3000:]
        last = log.read_text().strip().splitlines()[-1]
        assert last.startswith("rlhf: the MLflow server at ") and "checkpoint of ppo" in last
        assert "Traceback" not in log.read_text()
        command = last.split("continue it with: ")[1]
        server = servers.start_mlflow(f"sqlite:///{tmp_path}/s.db", tmp_path, port)
        # the command, run in this process (no new process needed to run it)
        resumed = rlhf_in_process(shlex.split(command)[1:], capfd, PREFECT_API_URL=prefect_api,
                                  MLFLOW_TRACKING_URI=uri)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        ppo_history_once(uri)
    finally:
        proc.kill()
        servers.stop(server)
    assert weights(tmp_path / "runs") == uninterrupted()
