"""`rlhf serve` and `rlhf stage-worker` outlive a restart of a real Prefect server (killed by
its PID, started again on the same port and database): once it answers again they serve again
and run flow runs created after the restart; a SIGTERM while it is gone ends them within
seconds.

Prefect's runner rides out a short outage by itself (its client retries a refused connection
for about a minute) and gives up after 3 failed polls in a row; with one retry
(PREFECT_CLIENT_MAX_RETRIES=1, after about 2 s) and a 1 s poll it gives up within seconds, so
the test reaches the part that is ours (tasks/platform/prefect/reconnect.py) without waiting
minutes. The one retry is kept: the restarted server on SQLite answers 503 to a write that collides
with another (the two commands poll every second), which Prefect's client retries by itself.
"""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from pathlib import Path

from tests.flows.prefect_procs import (
    ROOT,
    free_port,
    prefect_server,
    rlhf_serve,
    wait_deployment,
    wait_run,
)

GONE = "not answering"
BACK = "answers again"
FAST = {"PREFECT_CLIENT_MAX_RETRIES": "1", "RLHF_RECONNECT_EVERY_S": "1"}


def wait_line(log: Path, text: str, count: int, proc, timeout: float = 60) -> float:
    """Wait until ``text`` is in the log ``count`` times -> when (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while log.read_text().count(text) < count:
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n" \
                                            f"{log.read_text()[-3000:]}"
        time.sleep(0.2)
    return time.monotonic()


def test_serve_and_stage_worker_serve_again_after_a_prefect_restart(tmp_path):
    from prefect.client.orchestration import SyncPrefectClient

    home, port = tmp_path / "server", free_port()
    serve_args = ["--config", str(ROOT / "configs" / "test.yaml"), "--name", "test",
                  "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
                  "--set", f"tracking.workdir={tmp_path}/runs"]
    with ExitStack() as procs:  # the two commands outlive the first server
        with prefect_server(home, port=port) as (api, env):
            env = {**env, **FAST}
            worker, wlog = procs.enter_context(
                rlhf_serve(env, tmp_path, ["--name", "t"], "stage-worker"))
            served, slog = procs.enter_context(rlhf_serve(env, tmp_path, serve_args))
            with SyncPrefectClient(api) as client:
                stage = wait_deployment(client, "rlhf-stage/t", worker, wlog)
                collect = wait_deployment(client, "collect/test", served, slog)
        # the server is gone (ended by its PID)
        for proc, log in ((worker, wlog), (served, slog)):
            wait_line(log, GONE, 1, proc)
            assert f"Prefect API at {api} not answering" in log.read_text()
        with prefect_server(home, port=port), SyncPrefectClient(api) as client:
            back = time.monotonic()
            for proc, log in ((worker, wlog), (served, slog)):
                again = wait_line(log, BACK, 1, proc)
                print(f"{log.name}: serving again {again - back:.1f} s after the server "
                      "answered")
            # a run of each, created after the restart, runs in the process that serves it
            bogus = client.create_flow_run_from_deployment(
                stage.id, parameters={"stage": "bogus", "spec": {}})
            fresh = client.create_flow_run_from_deployment(collect.id)
            ran = wait_run(client, bogus.id, timeout=300)
            print(f"stage run done {time.monotonic() - back:.1f} s after the server answered")
            assert ran.state.type.value == "FAILED", ran.state
            assert "rlhf-stage runs sft, reward_model, ppo, not 'bogus'" in ran.state.message
            try:
                ran = wait_run(client, fresh.id, timeout=300)
            except TimeoutError as err:
                raise TimeoutError(f"{err}\n{slog.read_text()[-3000:]}") from err
            print(f"collect run done {time.monotonic() - back:.1f} s after the server answered")
            assert ran.state.type.value in ("COMPLETED", "FAILED"), ran.state
            assert "Flow run encountered an exception" in ran.state.message \
                or ran.state.type.value == "COMPLETED", ran.state
        # gone again: a SIGTERM while they wait for it ends them within seconds
        for proc, log in ((worker, wlog), (served, slog)):
            wait_line(log, GONE, 2, proc)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            assert time.monotonic() - start < 15
            assert "stopped by SIGTERM: no longer serving" in log.read_text()
