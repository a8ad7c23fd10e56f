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


class StoreBusy(Exception):  # noqa: N818 - a stop, named after its cause
    """Another gc of the same store held its lock for longer than the wait."""

    until = "once the other gc has finished"


def gc_lock_path(store: str) -> Path:
    """The gc lock of ``store``: beside a SQLite file, else in the temp folder."""
    if store.startswith("sqlite:///"):
        db = Path(store.removeprefix("sqlite:///"))
        return db.with_name(db.name + ".gc.lock")
    return Path(tempfile.gettempdir()) / \
        f"rlhf-gc-{hashlib.sha256(store.encode()).hexdigest()[:16]}.lock"


@contextmanager
def one_gc(store: str, wait_s: float = 600.0, say=print) -> Iterator[None]:
    """Hold the gc lock of ``store``; wait up to ``wait_s`` for another holder, then StoreBusy."""
    path = gc_lock_path(store)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            say(f"gc: another gc of {store} is running ({holder}); waiting for it to finish")
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreBusy(f"another gc of {store} ({holder}) has held it for "
                                        f"more than {wait_s:g} s; nothing was deleted") from None
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
