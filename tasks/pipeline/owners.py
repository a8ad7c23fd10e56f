"""Which run folders a live process is using, and one `rlhf gc` at a time per store.

Every process that runs a stage of a pipeline run (the pipeline's own, a stage worker's)
holds a shared lock on ``<run folder>/.owner.lock`` while the stage runs: ``fcntl.flock``,
which the kernel drops when the process ends, SIGKILL included. What a killed gate or stage
left in the folder (``*.part`` files, a checkpoint save's ``.<name>.tmp``) is swept by
`rlhf gc` only while it holds that lock exclusively: no live process owns the folder, and
none can start writing in it until the sweep is done.

`rlhf gc` itself takes an exclusive lock per MLflow store (beside a SQLite store's file, else
in the temporary folder, named by the store), so a second gc of the store waits for the first
and then finds what is left, instead of both deleting the same things.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWNER_LOCK = ".owner.lock"
_held: dict[str, tuple[int, int]] = {}  # folder -> (its lock's descriptor, nesting depth)
_guard = threading.Lock()


class StoreBusy(Exception):  # noqa: N818 - a stop, named after its cause
    """Another gc of the same store held its lock for longer than the wait."""

    until = "once the other gc has finished"


@contextmanager
def owning(folder: str | Path) -> Iterator[None]:
    """Hold ``folder``'s owner lock (shared: several processes of one run may) while the body
    runs; nested and concurrent uses in one process share one descriptor."""
    key = str(Path(folder).resolve())
    with _guard:
        fd, depth = _held.get(key, (-1, 0))
        if fd < 0:
            Path(key).mkdir(parents=True, exist_ok=True)
            fd = os.open(Path(key) / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
        _held[key] = (fd, depth + 1)
    try:
        yield
    finally:
        with _guard:
            fd, depth = _held.pop(key)
            if depth > 1:
                _held[key] = (fd, depth - 1)
            else:
                os.close(fd)  # closing the descriptor drops the lock


def owner_lock_kept(folder: Path) -> bool:
    """Does ``folder`` have an owner lock file (a stage ran in it since owners were kept)?"""
    return (folder / OWNER_LOCK).is_file()


@contextmanager
def unowned(folder: Path) -> Iterator[bool]:
    """Take ``folder``'s owner lock exclusively for the body, without waiting -> True; False
    when a live process owns the folder (or it has no lock file: nothing proves it free)."""
    try:
        fd = os.open(folder / OWNER_LOCK, os.O_RDWR)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def gc_lock_path(store: str) -> Path:
    """Where the gc lock of ``store`` (a resolved store URI) lives: beside a SQLite file,
    else in the temporary folder under a name made from the URI."""
    if store.startswith("sqlite:///"):
        db = Path(store.removeprefix("sqlite:///"))
        return db.with_name(db.name + ".gc.lock")
    return Path(tempfile.gettempdir()) / \
        f"rlhf-gc-{hashlib.sha256(store.encode()).hexdigest()[:16]}.lock"


@contextmanager
def one_gc(store: str, wait_s: float = 600.0, say=print) -> Iterator[None]:
    """Hold the gc lock of ``store`` for the body; when another gc holds it, say so once and
    wait for it (up to ``wait_s``; then StoreBusy, nothing deleted)."""
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
