"""Real servers for tests, each on a free port of 127.0.0.1 with its own folders, each ended
by its own PID: an `mlflow server` (any backend store, served artifacts) and a PostgreSQL
server from the system's binaries (Debian's `postgresql` package); and reading a pipeline
run back through a server's client API."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.stores import seed_sqlite_store

# a served reward model's stand-in, speaking MLflow's scoring protocol: each row scored by its
# response's length (null for an empty one); a prompt "bad" refused with 400; with argv[2]
# "die-on-batch", the server exits without answering the first request of more than one row
SCORING_SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Score(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rows = body["dataframe_split"]["data"]
        if len(rows) > 1 and sys.argv[2:] == ["die-on-batch"]:
            os._exit(0)
        if any(p == "bad" for p, _ in rows):
            self.send_response(400); self.end_headers(); self.wfile.write(b"no bad rows")
            return
        out = json.dumps({"predictions": [None if r == "" else float(len(r))
                                          for _, r in rows]}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.end_headers(); self.wfile.write(out)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Score).serve_forever()
"""


def start_scoring_server(port: int, *args: str) -> subprocess.Popen:
    """:data:`SCORING_SERVER` on ``port``, answering once it returns."""
    proc = subprocess.Popen([sys.executable, "-c", SCORING_SERVER, str(port), *args])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError("the scoring server did not start")


PORTS = Path(tempfile.gettempdir()) / "rlhf-test-ports"  # ports handed out: "port time"


def free_port() -> int:
    """A port of 127.0.0.1 that is free now and that no test on this machine was handed in the
    last hour. The kernel picks a port for a bind to port 0 at random, so two pytest-xdist
    workers can each be handed the same one: the second server then fails to bind while its
    health check reaches the first one's. The ports handed out are kept in a file under a
    lock, so no two servers of a test session share one."""
    with open(PORTS, "a+") as claims:
        fcntl.flock(claims, fcntl.LOCK_EX)
        claims.seek(0)
        now = time.time()
        recent = {int(port): at for port, at in
                  (line.split() for line in claims.read().splitlines() if line.strip())
                  if now - float(at) < 3600}
        for _ in range(1000):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in recent:
                break
        else:
            raise RuntimeError(f"no free port of 127.0.0.1 outside the {len(recent)} in {PORTS}")
        recent[port] = str(now)
        claims.seek(0)
        claims.truncate()
        claims.writelines(f"{p} {at}\n" for p, at in recent.items())
        return port


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str,
               timeout_s: float = 120) -> None:
    """Poll ``ready()`` until it holds; a dead process or the timeout raises with its log."""
    deadline = time.time() + timeout_s
    while not ready():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.3)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """End one server by its PID (``sig`` first, SIGKILL if it does not exit in time)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def start_mlflow(backend_store_uri: str, folder: Path, port: int, workers: int = 1,
                 app_name: str | None = None, env: dict[str, str] | None = None
                 ) -> subprocess.Popen:
    """Start ``mlflow server`` on ``port`` (artifacts served from ``folder/artifacts``;
    ``app_name``, e.g. ``basic-auth``, with ``env`` added to its environment) and wait until
    it answers -> its process (end it with :func:`stop`)."""
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    seed_sqlite_store(backend_store_uri)  # a new SQLite store: no migrations at its start
    log = folder / "mlflow-server.log"
    app = ["--app-name", app_name] if app_name else []
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", backend_store_uri, "--serve-artifacts",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", str(workers),
         *app],
        stdout=open(log, "a"), stderr=subprocess.STDOUT,
        # no background job runner (MLflow's async jobs): the pipeline uses none
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})})
    try:
        wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/health"), proc, log,
                   "mlflow server")
    except BaseException:
        stop(proc)
        raise
    return proc


def start_model_server(model_uri: str, tracking_uri: str, folder: Path,
                       port: int) -> subprocess.Popen:
    """``mlflow models serve`` of ``model_uri`` (this environment's packages) on ``port``,
    answering once it returns -> its process, leader of its own process group (it runs its
    server as a child): end it with :func:`stop_group`."""
    log = folder / "models-serve.log"
    bin_dir = str(Path(sys.executable).parent)  # its uvicorn
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", model_uri,
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri,
             "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
    try:
        wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/ping"), proc, log,
                   "mlflow models serve")
    except BaseException:
        stop_group(proc)
        raise
    return proc


def stop_group(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """End a server started as the leader of its own process group, with its children."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextmanager
def mlflow_server(backend_store_uri: str, folder: Path, workers: int = 1) -> Iterator[str]:
    """``mlflow server`` on ``backend_store_uri`` with artifacts served from
    ``folder/artifacts`` -> its URL."""
    port = free_port()
    proc = start_mlflow(backend_store_uri, folder, port, workers)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def auth_env(folder: Path, admin_password: str, secret_key: str,
             default_permission: str = "READ") -> dict[str, str]:
    """The environment of an ``mlflow server --app-name basic-auth`` with its own user store
    (``folder/auth.db``), its admin ``admin`` with ``admin_password`` (12 characters at
    least), the Flask secret key and the permission a user has on what others created.
    Checked logins are cached for a minute (one worker: a password changed through the API
    takes effect at once): each uncached request hashes the password again, which on a
    small machine costs more CPU than the tiny pipeline's own tracking."""
    ini = folder / "basic_auth.ini"
    ini.write_text("[mlflow]\n"
                   f"default_permission = {default_permission}\n"
                   f"database_uri = sqlite:///{folder}/auth.db\n"
                   "admin_username = admin\n"
                   "auth_cache_ttl_seconds = 60\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth"
                   "\n")
    return {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secret_key}


def rest(url: str, path: str, login: tuple[str, str], method: str = "GET",
         body: dict | None = None) -> dict:
    """One call of an MLflow server's REST API as ``login`` (user, password) -> its JSON."""
    import base64
    import json

    token = base64.b64encode(":".join(login).encode()).decode()
    request = urllib.request.Request(
        f"{url}/api/{path}", method=method, data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        text = resp.read()
    return json.loads(text) if text.strip() else {}


def postgres_bindir() -> Path | None:
    """Folder of ``initdb``/``postgres``: $PG_BINDIR, the PATH, else the newest
    /usr/lib/postgresql/<version>/bin (Debian keeps them off the PATH)."""
    if os.environ.get("PG_BINDIR"):
        given = Path(os.environ["PG_BINDIR"])
        return given if (given / "initdb").exists() else None
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    return found[-1].parent if found else None


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError as err:
        raise RuntimeError("running as root and there is no `postgres` user to run "
                           "PostgreSQL as") from err
    return "postgres"


def _pg_accepts(port: int) -> bool:
    import psycopg

    try:
        psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                        connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


@contextmanager
def postgres_server(bindir: Path, database: str = "mlflow") -> Iterator[str]:
    """A throw-away PostgreSQL cluster (trust auth, TCP on 127.0.0.1 only, its own socket
    folder, durability off for speed) with an empty ``database`` -> its SQLAlchemy URI
    (driver ``psycopg``, the project's ``postgres`` extra).

    The cluster lives in a fresh folder under the system temp dir rather than pytest's
    tmp_path: as root the server runs as ``postgres``, which cannot enter root's 0700
    pytest folders. The folder is removed afterwards."""
    import psycopg

    user = _server_user()
    root = Path(tempfile.mkdtemp(prefix="rlhf-pg-"))
    if user:
        shutil.chown(root, user)
    data, log, port = root / "data", root / "postgres.log", free_port()
    proc = None
    try:
        subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--no-sync"],
                       check=True, capture_output=True, user=user, cwd=root)
        proc = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, user=user, cwd=root)
        wait_until(lambda: _pg_accepts(port), proc, log, "postgres", timeout_s=60)
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        # the driver named explicitly: SQLAlchemy's default for plain postgresql:// changed
        # from psycopg2 (2.0) to psycopg 3 (2.1)
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{database}"
    finally:
        if proc is not None:
            stop(proc, signal.SIGINT)  # "fast" shutdown: ends open sessions
        shutil.rmtree(root, ignore_errors=True)


def stage_children(client, parent) -> dict:
    """The parent run's child runs by their ``rlhf.stage`` tag."""
    return {r.data.tags["rlhf.stage"]: r for r in client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}


def artifact_paths(client, run_id: str, path: str = "") -> list[str]:
    """Every artifact file of a run (recursive listing)."""
    out = []
    for item in client.list_artifacts(run_id, path):
        out += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return out
