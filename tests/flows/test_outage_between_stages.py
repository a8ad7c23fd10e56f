"""An MLflow server that goes away outside the training loop (here: in evaluate, its figures
computed and not yet logged) stops the run within a few seconds of
``tracking.outage_limit_s``, with exit 75 and the `--resume` command (tasks/platform/mlflow/spool.py
GuardedClient), rather than minutes of MLflow's retries and a traceback; the command, run
once the server is back, finishes the run with every stage run FINISHED.

A pause point (rlhf_core/faults.py) holds the run while the server is stopped by its PID.
"""

import os
import shlex
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient

from tests import servers
from tests.shared import ROOT, TEST_CONFIG, pipeline_stages, rlhf_in_process

LIMIT_S = 3
SETTINGS = ["ppo.iterations=2", "ppo.checkpoint_every=2", "tracking.progress=true",
            "tracking.system_metrics=false", "tracking.register_models=false",
            "demo.n_sft=64", "demo.n_pref=64", "demo.n_eval=8", "demo.n_pref_eval=16",
            "eval.num_prompts=8", "model.torch_threads=1",
            f"tracking.outage_limit_s={LIMIT_S}"]


def test_an_outage_in_evaluate_stops_with_the_resume_command(prefect_api, tmp_path, capfd,
                                                             threads_kept):
    port = servers.free_port()
    store = f"sqlite:///{tmp_path}/s.db"
    server = servers.start_mlflow(store, tmp_path, port)
    uri = f"http://127.0.0.1:{port}"
    args = ["run", "--config", str(TEST_CONFIG)]
    for item in [*SETTINGS, f"tracking.workdir={tmp_path / 'runs'}"]:
        args += ["--set", item]
    pause = tmp_path / "paused"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": uri, "PREFECT_LOGGING_LEVEL": "INFO",
           "RLHF_PAUSE_AT": "evaluate:scored", "RLHF_PAUSE_FILE": str(pause)}
    log = tmp_path / "run.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.time() + 240
        while not pause.exists():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        servers.stop(server)
        gone = time.time()
        pause.unlink()
        assert proc.wait(timeout=120) == 75, log.read_text()[-3000:]
        took = time.time() - gone
        text = log.read_text()
        last = text.strip().splitlines()[-1]
        assert "not answering (" in text and "Traceback" not in text, text[-3000:]
        assert last.startswith(f"rlhf: the MLflow server at {uri} has not answered"), last
        assert "keeps its finished stages" in last and " --resume " in last, last
        assert took < LIMIT_S + 20, took  # not MLflow's minutes of retries
        command = shlex.split(last.split("continue it with: ")[1])
        server = servers.start_mlflow(store, tmp_path, port)
        # the command, run in this process (no new process needed to run it)
        resumed = rlhf_in_process(command[1:], capfd, PREFECT_API_URL=prefect_api,
                                  MLFLOW_TRACKING_URI=uri)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("rlhf-test")
        (parent,) = [r for r in client.search_runs([exp.experiment_id])
                     if "mlflow.parentRunId" not in r.data.tags]
        assert parent.info.run_id == command[command.index("--resume") + 1]
        assert parent.info.status == "FINISHED"
        children = servers.stage_children(client, parent)
        assert set(children) == set(pipeline_stages())
        assert {r.info.status for r in children.values()} == {"FINISHED"}
        evaluate = children["evaluate"].info.run_id
        for key in children["evaluate"].data.metrics:
            steps = [m.step for m in client.get_metric_history(evaluate, key)]
            assert steps == [0], (key, steps)
    finally:
        proc.kill()
        servers.stop(server)
