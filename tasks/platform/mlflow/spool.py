"""A local spool for a stage run's tracking writes, so a server that stops answering mid-stage
does not stop the training: writes wait in order under ``<workdir>/.spool`` until it answers;
past ``tracking.outage_limit_s`` :class:`TrackingOutage` stops the stage. A sample table replaces
one of its name (MLflow's ``log_table`` appends), its list kept within MLflow's tag length cap."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from tasks.platform.files import read_jsonl, write_json
from tasks.platform.mlflow.errors import TrackingOutage

log = logging.getLogger("rlhf.spool")
RETRIES_ENV, TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"
_ENV_LOCK = threading.RLock()  # (a guarded call inside a fail_fast block)


class LoginRefused(TrackingOutage):
    """The tracking server refused the run's login mid-run (401/403): stopped like an outage."""

    until = "once the login is fixed"


def refused(err: BaseException | None) -> int | None:
    """401 or 403 when ``err`` (or an error behind it) is the server refusing the login."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        code = err.get_http_status_code() if isinstance(err, MlflowException) else \
            getattr(getattr(err, "response", None), "status_code", None)
        if code in (401, 403):
            return code
        err = err.__cause__ or err.__context__
    return None


def refusal(code: int, uri: str, doing: str) -> str:
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    who = f"user '{user}'" if user else "the run's login"
    why = ("HTTP 401 Unauthorized: its password changed or it was removed" if code == 401
           else "HTTP 403 Permission denied: a permission it needs was taken away")
    return f"the MLflow server at {uri} refused {who} ({why}; at {doing})"


def unreachable(err: BaseException) -> bool:
    """Is ``err`` the server being away (no connection, a timeout, a 5xx), not a refusal?"""
    if isinstance(err, MlflowException):
        return err.get_http_status_code() >= 500
    return isinstance(err, OSError)


@contextmanager
def fail_fast(timeout_s: int = 5) -> Iterator[None]:
    """MLflow requests inside: one try of ``timeout_s`` at most (a stop signal's value is kept)."""
    with _ENV_LOCK:
        old = {k: os.environ.get(k) for k in (RETRIES_ENV, TIMEOUT_ENV)}
        mine = {RETRIES_ENV: "0", TIMEOUT_ENV: str(timeout_s)}
        os.environ.update(mine)
        try:
            yield
        finally:
            for key, value in old.items():
                if os.environ.get(key) != mine[key]:
                    continue
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def bounded(listed: list[dict]) -> list[dict]:
    """The tag's list within MLflow's cap, oldest dropped first (their files stay)."""
    while len(listed) > 1 and len(json.dumps(listed)) > MAX_TAG_VAL_LENGTH:
        listed = listed[1:]
    return listed


class Spool:
    """The ordered tracking writes of one run that the server has not taken yet."""

    def __init__(self, client: MlflowClient, run_id: str, folder: Path,
                 retry_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        client = getattr(client, "raw", client)  # (tries once itself, never waits)
        self.client, self.run_id, self.retry_s, self.clock = client, run_id, retry_s, clock
        self.folder = folder  # made on the first record spooled: none while the server answers
        self.path = folder / f"{run_id}.jsonl"
        self.sent_path = folder / f"{run_id}.sent"
        self.lock, self.send_lock = threading.RLock(), threading.Lock()
        self.down_since: float | None = None
        self.refused: int | None = None  # the server refused the login (401/403)
        self.records: list[dict] = read_jsonl(self.path) if self.path.exists() else []
        self.sent = int(self.sent_path.read_text()) if self.sent_path.exists() else 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.kept = "the run keeps its finished stages"  # (set at each checkpoint)

    def pending(self) -> list[dict]:
        return self.records[self.sent:]

    def _append(self, record: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records.append(record)

    def _mark(self, n: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.sent_path, n)
        self.sent = n
        if n == len(self.records):  # all sent: start the next outage from an empty file
            self.path.unlink(missing_ok=True)
            self.sent_path.unlink(missing_ok=True)
            self.records, self.sent = [], 0

    def write(self, record: dict) -> None:
        """Send ``record`` now, or spool it behind the ones still waiting."""
        with self.lock:
            if not self.pending() and self._try(record):
                return
            if self.down_since is None:
                self.down_since = self.clock()
                why = f"refused the login (HTTP {self.refused})" if self.refused else \
                    "does not answer"
                log.warning("the MLflow server %s; tracking records go to %s until it takes "
                            "them", why, self.path)
            self._append(record)
            self._start_retrying()

    def _try(self, record: dict) -> bool:
        try:
            with fail_fast():
                self._send(record)
            self.refused = None
            return True
        except Exception as err:  # noqa: BLE001 - classified just below
            self.refused = refused(err) or self.refused
            if not (unreachable(err) or refused(err)):
                raise
            return False

    def _send(self, record: dict) -> None:
        if record["kind"] == "table":  # uploaded, replacing one of that name, and listed
            path, name = Path(record["file"]), record["artifact_file"]
            self.client.log_artifact(self.run_id, str(path), posixpath.dirname(name) or None)
            tags = self.client.get_run(self.run_id).data.tags
            listed = json.loads(tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
            if {"path": name, "type": "table"} not in listed:
                listed = bounded([*listed, {"path": name, "type": "table"}])
                self.client.set_tag(self.run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(listed))
            shutil.rmtree(path.parent, ignore_errors=True)
            return
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in record.get("metrics", [])]
        tags = [RunTag(k, v) for k, v in record.get("tags", [])]
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)

    def flush(self) -> bool:
        """Send the waiting records in order -> True when none is left. The records' lock is
        not held while sending, so a hanging server never blocks the training's writes."""
        with self.send_lock:
            while True:
                with self.lock:
                    if not self.pending():
                        if self.down_since is not None:
                            log.warning("the MLflow server answers again after %.1f s; the "
                                        "spool is sent", self.clock() - self.down_since)
                            self.down_since = None
                        return True
                    index, record = self.sent, self.pending()[0]
                if not self._try(record):
                    with self.lock:
                        if self.down_since is None:  # a spool an earlier process left
                            self.down_since = self.clock()
                    return False
                with self.lock:
                    self._mark(index + 1)

    def _start_retrying(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._retry_loop, daemon=True,
                                            name=f"rlhf-spool-{self.run_id[:8]}")
            self._thread.start()

    def _retry_loop(self) -> None:
        while not self._stop.wait(self.retry_s):
            if self.flush():
                return

    def close(self) -> None:
        self._stop.set()

    def outage_s(self) -> float:
        """Seconds since the first write the server did not take (0 while it answers)."""
        return 0.0 if self.down_since is None else self.clock() - self.down_since

    def check(self, limit_s: float) -> None:
        """Raise TrackingOutage past ``limit_s``, or LoginRefused at once (waiting fixes none)."""
        kept = (f"{self.kept} and {len(self.pending())} tracking records spooled in "
                f"{self.path}, sent first when the run is resumed")
        if self.refused:
            self.close()
            raise LoginRefused(
                f"{refusal(self.refused, self.client.tracking_uri, 'a checkpoint')}; {kept}")
        down = self.outage_s()
        if down > limit_s:
            self.close()
            raise TrackingOutage(
                f"the MLflow server at {self.client.tracking_uri} has not answered for "
                f"{down:.0f} s (tracking.outage_limit_s={limit_s:g}); {kept}")


_SPOOLS: dict[str, Spool] = {}
_SPOOLS_LOCK = threading.Lock()


def spool_for(client: MlflowClient, run_id: str, workdir: str | Path) -> Spool:
    """The process's one spool of ``run_id`` (under ``<workdir>/.spool``); a new one first
    sends what an earlier process left in it."""
    with _SPOOLS_LOCK:  # stages running in threads (a sweep) share the parent run's spool
        spool = _SPOOLS.get(run_id)
        if spool is None or spool._stop.is_set():  # (closed: it stopped a stage here)
            spool = _SPOOLS[run_id] = Spool(client, run_id, Path(workdir) / ".spool")
            # under torchrun only rank 0 logs: the other ranks never send its spool
            if spool.pending() and os.environ.get("RANK", "0") == "0":
                spool.flush() or spool._start_retrying()
    return spool


def resend_left(client: MlflowClient, workdir: str | Path) -> None:
    """Send what earlier processes left in the spools under ``workdir`` (any run's)."""
    for path in sorted((Path(workdir) / ".spool").glob("*.jsonl")):
        spool_for(client, path.stem, workdir)


def spool_tags(spool: Spool, tags: dict[str, str]) -> None:
    """Set ``tags`` on the spool's run, in order with its other writes."""
    spool.write({"kind": "batch", "tags": [[k, str(v)] for k, v in tags.items()]})


def spool_table(spool: Spool, rows, artifact_file: str) -> None:
    """Log ``rows`` (a DataFrame) as the MLflow table ``artifact_file``, through the spool."""
    with spool.lock:
        folder = spool.folder / "tables" / spool.run_id / str(time.time_ns())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / Path(artifact_file).name
        rows.to_json(path, orient="split", index=False, date_format="iso")
        spool.write({"kind": "table", "file": str(path), "artifact_file": artifact_file})


def drain_all(limit_s: float) -> None:
    """Send this process's spools before a stage publishes; TrackingOutage past ``limit_s``."""
    for spool in list(_SPOOLS.values()):
        while not spool.flush():
            spool.check(limit_s)
            time.sleep(0.5)


def spooled_left(workdir: str | Path) -> int:
    """How many tracking records the spools under ``workdir`` still hold."""
    left = 0
    for path in (Path(workdir) / ".spool").glob("*.jsonl"):
        sent = path.with_suffix(".sent")
        lines = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        left += lines - (int(sent.read_text()) if sent.exists() else 0)
    return left
