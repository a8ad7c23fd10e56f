"""SIGTERM and SIGINT end a command within seconds: mid-PPO, `rlhf run` marks its runs
KILLED and prints the command that continues it; a clean-up stuck on a server that is gone is
cut short after RLHF_STOP_GRACE_S; a second Ctrl-C ends it at once."""

import os
import signal
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient

from tests.servers import stage_children
from tests.shared import ROOT, TEST_CONFIG
from tests.stores import seed_sqlite_store

STUCK = """
import time
from cli.stopping import stop_within_seconds
with stop_within_seconds(lambda s: f"stopped by {s}; run R is kept"):
    try:
        print("ready", flush=True)
        time.sleep(60)
    except BaseException:
        while True:  # a clean-up that waits on a server that is gone
            try:
                time.sleep(60)
            except BaseException:
                pass
"""


def stuck_process(**env) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stuck_clean_up_is_cut_short_after_the_grace_time():
    proc = stuck_process(RLHF_STOP_GRACE_S="1")
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.perf_counter() - start < 5
    assert proc.returncode == 128 + signal.SIGTERM
    assert "rlhf: stopped by 15; run R is kept (ended at once: its clean-up still waited " \
           "after 1 s)" in err


def test_a_second_ctrl_c_ends_at_once():
    proc = stuck_process(RLHF_STOP_GRACE_S="60")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    start = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.perf_counter() - start < 5
    assert proc.returncode == 128 + signal.SIGINT and "a second Ctrl-C" in err


def test_sigterm_mid_ppo_marks_the_runs_killed_and_says_how_to_resume(prefect_api, tmp_path):
    sig = signal.SIGTERM
    uri = f"sqlite:///{tmp_path}/m.db"
    args = ["run", "--config", str(TEST_CONFIG), "--set", "ppo.iterations=500",
            "--set", "ppo.sample_every=1000", "--set", "tracking.progress=true",
            "--set", f"tracking.workdir={tmp_path}/runs", "--set", "tracking.system_metrics=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": uri, "PREFECT_LOGGING_LEVEL": "INFO"}
    log = tmp_path / "err.txt"
    seed_sqlite_store(uri)
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp_path,
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.time() + 300
    while "ppo: step 2/500" not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    start = time.perf_counter()
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert time.perf_counter() - start < 15
    text = log.read_text()
    assert proc.returncode == 128 + sig and "Traceback" not in text, text[-3000:]
    client = MlflowClient(uri)
    (parent,) = [r for r in client.search_runs(
        [client.get_experiment_by_name("rlhf-test").experiment_id])
        if "mlflow.parentRunId" not in r.data.tags]
    run_id = parent.info.run_id
    last = text.strip().splitlines()[-1]
    assert last == (f"rlhf: stopped by {signal.Signals(sig).name}; run {run_id} keeps its "
                    "finished stages and the last checkpoint of the stage it was in; continue "
                    f"it with: rlhf {' '.join(args)} --resume {run_id}")
    assert parent.info.status == "KILLED"
    children = stage_children(client, parent)
    assert children["ppo"].info.status == "KILLED"
    assert children["sft"].info.status == "FINISHED"
