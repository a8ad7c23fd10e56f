"""What a finished run keeps on local disk, and deleting the rest safely. Resume state (each
stage's ``checkpoints/``) serves only a run that can continue, so ``finish`` deletes it once the
run is FINISHED unless ``tracking.keep_resume_state``. Each deletion first renames to a
``.trash-`` sibling (atomic), so a kill never leaves a half-deleted folder; the next deletion
sweeps the trash.

Which run folders a live process is using: a process running a stage holds a shared
``fcntl.flock`` on ``<run folder>/.owner.lock``, which the kernel drops even on SIGKILL, and
`rlhf gc` sweeps a killed stage's leftovers only while holding it exclusively."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rlhf_core.faults import crash_point

TRASH = ".trash-"
RESUME_STATE = "checkpoints"  # a stage folder's mid-stage training-state checkpoints
OWNER_LOCK = ".owner.lock"
_held: dict[str, tuple[int, int]] = {}  # folder -> (its lock's descriptor, nesting depth)
_guard = threading.Lock()


class Removed(BaseModel):
    model_config = ConfigDict(frozen=True)
    path: str
    bytes: int


class Retention(BaseModel):
    """What dropping a finished run's resume state removed, and the bytes still kept."""

    model_config = ConfigDict(frozen=True)
    workdir: str
    removed: list[Removed]
    kept_bytes: int

    @property
    def freed_bytes(self) -> int:
        return sum(r.bytes for r in self.removed)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a file: its size; missing: 0)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                pass  # gone meanwhile
    return total


def remove_tree(path: Path, label: str = "retention") -> Removed:
    """Delete a file or folder via an atomic rename to a ``.trash-`` sibling (crash point
    ``remove:<label>`` between the two)."""
    size = tree_bytes(path)
    trash = path.with_name(f"{TRASH}{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, trash)
    crash_point(f"remove:{label}")
    delete_path(trash)
    return Removed(path=str(path), bytes=size)


def delete_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def trash_in(folder: Path) -> list[Path]:
    """Leftovers of a deletion killed after its rename, directly in ``folder``."""
    return sorted(folder.glob(f"{TRASH}*")) if folder.is_dir() else []


def drop_resume_state(workdir: Path) -> Retention:
    """Delete a finished run's resume state (its ``checkpoints/`` folders, any node or rank,
    and trash left in its stage folders); a folder that cannot go is named and left."""
    removed, found, stages = [], [], []
    if workdir.is_dir():
        found = sorted(p for p in workdir.rglob(RESUME_STATE) if p.is_dir())
        stages = sorted({p.parent for p in found} | {p for p in workdir.iterdir() if p.is_dir()})
    for path in found + [t for stage in stages for t in trash_in(stage)]:
        if TRASH in path.name:
            delete_path(path)
            continue
        try:
            gone = remove_tree(path)
        except OSError as err:
            print(f"retention: could not delete {path} ({err}); it stays, the run finished")
            continue
        print(f"retention: deleted {gone.path} ({gone.bytes} bytes): resume state of a "
              "finished run (tracking.keep_resume_state: false)")
        removed.append(gone)
    out = Retention(workdir=str(workdir), removed=removed, kept_bytes=tree_bytes(workdir))
    if removed:
        print(f"retention: {workdir} keeps {out.kept_bytes} bytes, the stages' outputs "
              f"({out.freed_bytes} bytes of resume state deleted)")
    return out


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
