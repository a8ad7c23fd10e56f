"""One `rlhf gc` at a time per MLflow store: a second gc waits for the first, then finds what
is left, instead of both deleting the same things."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WAIT_S = 600.0  # how long a second gc waits for the first before StoreBusy


class StoreBusy(Exception):  # noqa: N818 - a stop, named after its cause
    """Another gc of the same store held its lock for longer than the wait."""

    until = "once the other gc has finished"


@contextmanager
def one_gc(cfg) -> Iterator[None]:
    """Hold the gc lock of the config's store (beside a SQLite file, else in the temp
    folder); wait up to ``WAIT_S`` for another holder, then StoreBusy."""
    from tasks.platform.mlflow.addresses import default_tracking_uri
    from tasks.platform.mlflow.runs import resolved_store

    store = resolved_store(default_tracking_uri(cfg.tracking.tracking_uri))
    if store.startswith("sqlite:///"):
        db = Path(store.removeprefix("sqlite:///"))
        path = db.with_name(db.name + ".gc.lock")
    else:
        path = Path(tempfile.gettempdir()) / \
            f"rlhf-gc-{hashlib.sha256(store.encode()).hexdigest()[:16]}.lock"
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            print(f"gc: another gc of {store} is running ({holder}); waiting for it to finish")
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreBusy(f"another gc of {store} ({holder}) has held it for "
                                        f"more than {WAIT_S:g} s; nothing was deleted") from None
                    time.sleep(0.5)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)
