"""Which run folders a live process is using.

Every process that runs a stage of a pipeline run (the pipeline's own, a stage worker's)
holds a shared lock on ``<run folder>/.owner.lock`` while the stage runs: ``fcntl.flock``,
which the kernel drops when the process ends, SIGKILL included. What a killed gate or stage
left in the folder (``*.part`` files, a checkpoint save's ``.<name>.tmp``) is swept by
`rlhf gc` only while it holds that lock exclusively: no live process owns the folder, and
none can start writing in it until the sweep is done.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWNER_LOCK = ".owner.lock"
_held: dict[str, tuple[int, int]] = {}  # folder -> (its lock's descriptor, nesting depth)
_guard = threading.Lock()


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
