"""A real Prefect server and a real `rlhf serve` as subprocesses, for deployment tests.

Each gets its own PREFECT_HOME and SQLite database under a temporary folder, a free port on
127.0.0.1, and is ended by its own PID. A new database starts as a copy of one migrated once
per Prefect version (:func:`migrated_db`): a server then starts in about half the CPU.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def base_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith(("PREFECT_", "MLFLOW_"))]:
        del env[key]
    env.update({"PREFECT_HOME": str(home / "prefect_home"),
                "PREFECT_API_DATABASE_CONNECTION_URL":
                    f"sqlite+aiosqlite:///{home}/prefect.db",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
                "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_LOGGING_LEVEL": "WARNING",
                # a 503 (database busy) is logged with its cause in the server's log
                "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",
                # the repository first, then what the caller had (packages installed there)
                "PYTHONPATH": os.pathsep.join(
                    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                "TOKENIZERS_PARALLELISM": "false"})
    return env


def migrated_db() -> Path:
    """A Prefect SQLite database migrated to the installed Prefect's head -> its path. Made
    once (`prefect server database upgrade`) per Prefect version on this machine, in a temp
    folder that test sessions and their xdist workers share, under a lock, and kept (a fresh
    CI machine makes it once). Copy it; never open it."""
    folder = Path(tempfile.gettempdir()) / f"rlhf-test-prefect-db-{version('prefect')}"
    db = folder / "prefect.db"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.exists():
            build = folder / "build"
            shutil.rmtree(build, ignore_errors=True)
            build.mkdir()
            out = subprocess.run([sys.executable, "-m", "prefect", "server", "database",
                                  "upgrade", "-y"], env=base_env(build), cwd=build,
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"prefect database upgrade failed:\n{out.stdout[-3000:]}"
                                   f"{out.stderr[-3000:]}")
            os.replace(build / "prefect.db", db)
    return db


def with_migrated_db(home: Path) -> Path:
    """``home`` (made if need be) holding base_env's database, a copy of
    :func:`migrated_db` unless it has one already (a server started again keeps its own)."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        shutil.copyfile(migrated_db(), home / "prefect.db")
    return home


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """End a process we started, by its PID (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def prefect_server(home: Path, extra_env: dict[str, str] | None = None,
                   port: int | None = None):
    """`prefect server start` on ``port`` (default: a free one) -> (api_url, env for
    clients). Started again on the same home and port, it is the same server (same
    database, same URL) after a restart."""
    with_migrated_db(home)
    port, env = port or free_port(), {**base_env(home), **(extra_env or {})}
    log = home / "server.log"
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                                 "127.0.0.1", "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=home)
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_http(f"{api}/health", proc, log, 180)
        yield api, {**env, "PREFECT_API_URL": api}
    finally:
        stop(proc)


@contextmanager
def rlhf_serve(env: dict, workdir: Path, args: list[str], command: str = "serve"):
    """`rlhf serve ARGS` (or another long-running COMMAND, e.g. stage-worker) with the
    server's API -> the process and its log (stopped on exit)."""
    log = workdir / f"{command}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", command, *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        yield proc, log
    finally:
        stop(proc)


def wait_deployment(client, name: str, proc, log: Path, timeout: float = 180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rlhf serve exited:\n{log.read_text()[-3000:]}")
        try:
            return client.read_deployment_by_name(name)
        except Exception:  # noqa: BLE001 - ObjectNotFound until serve registered it
            time.sleep(1)
    raise TimeoutError(f"deployment {name} not registered:\n{log.read_text()[-3000:]}")


def wait_run(client, run_id, timeout: float = 300):
    """Poll the flow run until it is terminal -> the run."""
    deadline, run = time.time() + timeout, None
    while time.time() < deadline:
        run = client.read_flow_run(run_id)
        if run.state is not None and run.state.type.value in TERMINAL:
            return run
        time.sleep(1)
    state = run.state if run is not None else None
    raise TimeoutError(f"flow run {run_id} not finished after {timeout} s (last state: {state})")
