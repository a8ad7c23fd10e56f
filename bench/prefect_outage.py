"""The Prefect API stopped mid-PPO, timed (README § A server that goes away during a run).

    .venv/bin/python bench/prefect_outage.py /tmp/prefect-outage

Starts a `prefect server` (its own home and SQLite database under the given folder), runs
`rlhf run --config configs/test.yaml` with 40 PPO iterations against it (MLflow on a SQLite
file), stops the server by its PID (SIGTERM) once PPO iteration 2 is logged, and prints the
exit code, how long after the stop the command ended, and its last line; then runs the
`--resume` command that line names against Prefect's local ephemeral API.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.flows.prefect_procs import _wait_http, base_env, free_port, stop  # noqa: E402
from tests.shared import TEST_CONFIG  # noqa: E402

SETTINGS = ["ppo.iterations=40", "ppo.checkpoint_every=2", "tracking.progress=true",
            "tracking.system_metrics=false"]


def main(tmp: Path) -> None:
    home = tmp / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    port, env = free_port(), base_env(home)
    with open(home / "server.log", "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start",
                                   "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  stdout=out, stderr=subprocess.STDOUT, cwd=home)
    api = f"http://127.0.0.1:{port}/api"
    _wait_http(f"{api}/health", server, home / "server.log", 180)
    env = {**env, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "INFO",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db"}
    args = ["run", "--config", str(TEST_CONFIG)]
    for item in [*SETTINGS, f"tracking.workdir={tmp}/runs"]:
        args += ["--set", item]
    log = tmp / "run.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        while "ppo: step 2/" not in log.read_text():
            if proc.poll() is not None:
                raise SystemExit(log.read_text()[-3000:])
            time.sleep(0.05)
        stop(server)
        gone = time.time()
        rc = proc.wait(900)
    finally:
        proc.kill()
        stop(server)
    last = [line for line in log.read_text().splitlines() if line.startswith("rlhf: ")][-1]
    print(f"exit {rc}, {time.time() - gone:.0f} s after the Prefect server was stopped")
    print(last)
    command = shlex.split(last.split("continue it with: ")[1])[1:]
    env.pop("PREFECT_API_URL")
    start = time.time()
    resumed = subprocess.run([sys.executable, "-m", "cli", *command], cwd=tmp, env=env,
                             capture_output=True, text=True)
    print(f"resume: exit {resumed.returncode} in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
