"""Which run folders a live process is using: a process running a stage holds a shared
``fcntl.flock`` on ``<run folder>/.owner.lock``, which the kernel drops even on SIGKILL, and
`rlhf gc` sweeps a killed stage's leftovers only while holding it exclusively."""

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
    """Hold ``folder``'s shared owner lock while the body runs; nested and concurrent uses in
    one process share one descriptor."""
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
    return (folder / OWNER_LOCK).is_file()


@contextmanager
def unowned(folder: Path) -> Iterator[bool]:
    """Take ``folder``'s owner lock exclusively without waiting -> True; False when owned or
    without a lock file (nothing proves it free)."""
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
