"""A tracking outage mid-PPO, timed (README § A server that goes away during a run).

    .venv/bin/python bench/tracking_outage.py /tmp/outage

Starts an `mlflow server` (SQLite, served artifacts) under the given folder, runs
`rlhf run --config configs/test.yaml` with 30 PPO iterations against it, stops the server by
its PID (SIGTERM) once PPO iteration 5 is logged, starts it again on the same port 20 s after
it is gone, and prints when the spool took over, how long the server was away and how soon
after its return the spool was sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402 - the test suite's server helpers
from tests.shared import TEST_CONFIG  # noqa: E402

SETTINGS = ["ppo.iterations=30", "ppo.checkpoint_every=5", "tracking.progress=true",
            "tracking.system_metrics=false"]
STEP = re.compile(r"(\d\d:\d\d:\d\d\.\d+) \| INFO    \| Task run '[^']*' - ppo: step (\d+)/")


def main(tmp: Path) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    store = f"sqlite:///{tmp}/server.db"
    server = servers.start_mlflow(store, tmp, port)
    args = ["run", "--config", str(TEST_CONFIG)]
    for item in [*SETTINGS, f"tracking.workdir={tmp}/runs"]:
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "INFO",
           "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    env.pop("PREFECT_API_URL", None)
    log = tmp / "run.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)

    def wait(text: str) -> float:
        while text not in log.read_text():
            if proc.poll() is not None:
                raise SystemExit(log.read_text()[-3000:])
            time.sleep(0.02)
        return time.time()

    try:
        wait("ppo: step 5/")
        servers.stop(server)
        gone = time.time()
        wait("does not answer; tracking records go to")
        time.sleep(20)
        server = servers.start_mlflow(store, tmp, port)
        back = time.time()
        sent = wait("answers again after")
        rc = proc.wait(600)
    finally:
        proc.kill()
        servers.stop(server)
    text = log.read_text()
    steps = {int(n): t for t, n in STEP.findall(text)}
    took_over = re.search(r"(\d\d:\d\d:\d\d\.\d+) \| WARNING \| rlhf.spool - the MLflow server "
                          r"does not answer", text).group(1)
    away = re.search(r"answers again after ([\d.]+) s", text).group(1)

    def seconds(stamp: str) -> float:
        h, m, s = stamp.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    print(f"spool took over {seconds(took_over) - seconds(steps[5]):.2f} s after iteration 5 "
          f"was logged (the stop signal followed it at once)")
    print(f"PPO iterations 6..30 during the outage: {seconds(steps[30]) - seconds(steps[5]):.1f} s")
    print(f"server away {back - gone:.1f} s; first write it did not take -> spool sent: "
          f"{away} s; spool sent {sent - back:.2f} s after the server answered; exit {rc}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
