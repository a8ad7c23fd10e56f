"""Named crash and pause points for testing resume: ``RLHF_CRASH_AT=sft:step:3`` SIGKILLs the
process at that :func:`crash_point` (comma-separate several). Unset, a no-op.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _listed(var: str, name: str) -> bool:
    """Is ``name`` among the comma-separated names in $``var``?"""
    return name in {w.strip() for w in os.environ.get(var, "").split(",")}


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is listed in $RLHF_CRASH_AT."""
    if _listed("RLHF_CRASH_AT", name):
        os.kill(os.getpid(), signal.SIGKILL)


def pause_point(name: str, timeout_s: float = 600.0) -> None:
    """When ``name`` is listed in $RLHF_PAUSE_AT, write it to $RLHF_PAUSE_FILE and wait (up to
    ``timeout_s``) until that file is removed: tests stop a server at a known point."""
    if not _listed("RLHF_PAUSE_AT", name):
        return
    path = Path(os.environ["RLHF_PAUSE_FILE"])
    path.write_text(name)
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
