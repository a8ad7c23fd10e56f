"""A tracking outage outside the training loop, timed (README § A server that goes away
during a run).

    .venv/bin/python bench/outage_between_stages.py /tmp/between before:evaluate [limit_s [back_s]]

Starts an `mlflow server` (SQLite, served artifacts) under the folder, runs `rlhf run
--config configs/test.yaml` (small settings, models registered) with the pause point given
(rlhf_core/faults.py: ``before:<stage>``, ``evaluate:scored``, ``register:log_models``),
stops the server by its PID (SIGTERM) while the run waits there, lets the run go on, and
prints how long until the process printed its next line and until it ended, its exit code
and last lines; then starts the server again on the same port, runs the `--resume` command
and prints its exit code and every stage run's status. With ``back_s`` the server is started
again that long after the stop, while the run waits (no resume when the run then ends well).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402 - the test suite's server helpers
from tests.shared import TEST_CONFIG  # noqa: E402

SETTINGS = ["ppo.iterations=4", "ppo.checkpoint_every=2", "tracking.progress=true",
            "tracking.system_metrics=false", "demo.n_sft=64", "demo.n_pref=64",
            "demo.n_eval=8", "demo.n_pref_eval=16", "eval.num_prompts=8",
            "model.torch_threads=1"]


def main(tmp: Path, point: str, limit_s: str | None = None, back_s: float | None = None,
         cap_s: float = 1500) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    store = f"sqlite:///{tmp}/server.db"
    server = servers.start_mlflow(store, tmp, port)
    uri = f"http://127.0.0.1:{port}"
    args = ["run", "--config", str(TEST_CONFIG)]
    extra = [] if limit_s is None else [f"tracking.outage_limit_s={limit_s}"]
    for item in [*SETTINGS, *extra, f"tracking.workdir={tmp}/runs"]:
        args += ["--set", item]
    pause = tmp / "paused"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "INFO",
           "MLFLOW_TRACKING_URI": uri, "RLHF_PAUSE_AT": point, "RLHF_PAUSE_FILE": str(pause),
           "PREFECT_HOME": str(tmp / "prefect")}
    env.pop("PREFECT_API_URL", None)
    log = tmp / "run.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        while not pause.exists():
            if proc.poll() is not None:
                raise SystemExit(log.read_text()[-3000:])
            time.sleep(0.05)
        servers.stop(server)
        size = log.stat().st_size
        gone = time.time()
        pause.unlink()
        said = None
        while proc.poll() is None and time.time() - gone < cap_s:
            if said is None and log.stat().st_size > size:
                said = time.time() - gone
            if back_s is not None and time.time() - gone > back_s:
                server, back_s = servers.start_mlflow(store, tmp, port), None
                print(f"server back {time.time() - gone:.1f} s after the stop")
            time.sleep(0.1)
        rc = proc.poll()
        ended = time.time() - gone
        if rc is None:
            proc.kill()
            proc.wait()
    finally:
        proc.kill()
    text = log.read_text()
    print(f"[{point}] first line after the stop: {said and round(said, 1)} s; ended after "
          f"{ended:.1f} s; exit {rc}; traceback: {'Traceback' in text[size:]}")
    print("last lines:\n  " + "\n  ".join(text.strip().splitlines()[-4:]))
    if server.poll() is not None:  # (with back_s it is running again already)
        server = servers.start_mlflow(store, tmp, port)
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("rlhf-test")
        (parent,) = [r for r in client.search_runs([exp.experiment_id])
                     if "mlflow.parentRunId" not in r.data.tags]
        said = [line for line in text.splitlines() if line.startswith("rlhf: ")]
        last = said[-1] if said else ""
        if "--resume " in last:
            resume = shlex.split(last.split("continue it with: ")[1])[1:]
        else:
            resume = [*args, "--resume", parent.info.run_id]
        env.pop("RLHF_PAUSE_AT")
        start = time.time()
        rc2 = None
        if rc != 0:
            with open(tmp / "resume.err", "w") as err:
                rc2 = subprocess.run([sys.executable, "-m", "cli", *resume], cwd=tmp,
                                     env=env, stdout=subprocess.DEVNULL,
                                     stderr=err).returncode
        stages = {r.data.tags["rlhf.stage"]: r.info.status for r in client.search_runs(
            [exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}
        parent = client.get_run(parent.info.run_id)
        print(f"resume ({'printed command' if '--resume ' in last else 'built by hand'}): "
              f"exit {rc2} in {time.time() - start:.1f} s; parent {parent.info.status}; "
              f"stages {stages}")
        versions = {m.name: len(client.search_model_versions(f"name = '{m.name}'"))
                    for m in client.search_registered_models()}
        print(f"registered versions: {versions}")
    finally:
        servers.stop(server)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None,
         float(sys.argv[4]) if len(sys.argv) > 4 else None)
