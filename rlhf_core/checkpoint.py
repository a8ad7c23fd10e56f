"""Atomic checkpoint folders: write into a temporary sibling, then rename into place.

A crash while saving leaves the previous folder intact (rename is atomic on POSIX within one
filesystem). Weights go through ``save_pretrained`` / safetensors; JSON for small state.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target`` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def save_policy(model, tokenizer, target: str | Path) -> Path:
    """save_pretrained (safetensors) of model and tokenizer, atomically."""
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(target)


def save_scalar_model(model, target: str | Path) -> Path:
    """ScalarHeadModel.save, atomically."""
    with atomic_dir(target) as tmp:
        model.save(tmp)
    return Path(target)
