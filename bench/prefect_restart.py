"""`rlhf stage-worker` (or `rlhf serve`) across a restart of its Prefect server, with Prefect's
default polling and retries: a real `prefect server start` on a free port, the command, a flow
run, the server killed by its PID for DOWN seconds and started again on the same port and
database, a flow run created once it answers, then SIGTERM. Prints a timeline (seconds since
the start) and the command's own `rlhf:` lines.

    python bench/prefect_restart.py stage-worker --down 240
    python bench/prefect_restart.py serve --down 240

The flow runs are cheap: `rlhf-stage` with an unknown stage (fails at once, in the worker) and
`collect/test` with no champion registered (fails in its first task, in the served process).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.flows.prefect_procs import (  # noqa: E402
    ROOT,
    TERMINAL,
    _wait_http,
    base_env,
    free_port,
    stop,
)

T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["stage-worker", "serve"])
    parser.add_argument("--down", type=float, default=240, help="seconds the server is gone")
    parser.add_argument("--folder", type=Path,
                        default=Path(tempfile.gettempdir()) / "prefect_restart")
    args = parser.parse_args()
    tmp = (args.folder / f"{args.command}-{int(time.time())}").resolve()
    tmp.mkdir(parents=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = base_env(tmp)
    env.pop("PREFECT_RUNNER_POLL_FREQUENCY")  # Prefect's default (10 s), as in production
    env["PREFECT_API_URL"] = api

    def server():
        log = tmp / "server.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(port)], env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT,
            cwd=tmp)
        _wait_http(f"{api}/health", proc, log, 180)
        say("the server answers")
        return proc

    if args.command == "serve":
        cmd = ["serve", "--config", str(ROOT / "configs" / "test.yaml"), "--name", "test",
               "--set", f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db",
               "--set", f"tracking.workdir={tmp}/runs"]
        name, params = "collect/test", {}
    else:
        cmd, name, params = ["stage-worker", "--name", "w"], "rlhf-stage/w", {
            "stage": "bogus", "spec": {}}
    srv = server()
    log = tmp / "command.log"
    proc = subprocess.Popen([sys.executable, "-m", "cli", *cmd], env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=tmp)
    from prefect.client.orchestration import SyncPrefectClient

    def deployment():
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with SyncPrefectClient(api) as client:
                    return client.read_deployment_by_name(name)
            except Exception:  # noqa: BLE001 - not registered yet
                time.sleep(1)

    def run(label: str, timeout: float = 180) -> None:
        with SyncPrefectClient(api) as client:
            created = client.create_flow_run_from_deployment(deployment().id,
                                                             parameters=params)
            say(f"{label}: flow run created")
            start, picked = time.monotonic(), None
            while time.monotonic() - start < timeout:
                state = client.read_flow_run(created.id).state
                if picked is None and state.type.value != "SCHEDULED":
                    picked = time.monotonic() - start
                    say(f"{label}: picked up {picked:.1f} s after it was created")
                if state.type.value in TERMINAL:
                    say(f"{label}: {state.type.value} after {time.monotonic() - start:.1f} s "
                        f"({(state.message or '')[:90]})")
                    return
                time.sleep(0.5)
            say(f"{label}: not finished after {timeout:g} s; command running: "
                f"{proc.poll() is None}")

    deployment()
    say("deployment registered")
    run("before")
    stop(srv)
    say(f"server killed; back in {args.down:g} s")
    time.sleep(args.down)
    say(f"command running: {proc.poll() is None} (exit status {proc.returncode})")
    srv = server()
    if proc.poll() is None:
        run("after the restart")
    start = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        say(f"SIGTERM: ended after {time.monotonic() - start:.1f} s, status {proc.returncode}")
    stop(srv)
    for line in log.read_text().splitlines():
        if line.startswith("rlhf:") or "exceeded error threshold" in line[:80]:
            print("   ", line)
    print(f"logs: {tmp}")


if __name__ == "__main__":
    main()
