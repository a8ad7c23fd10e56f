"""Freed memory handed back to the OS (Linux, glibc).

A CPU process that allocates tensors of ever-changing shapes (training batches padded to their
longest row, scoring batches, rollouts) leaves freed chunks scattered through glibc's heaps,
one heap per thread that allocated; glibc returns only the free space at a heap's top, so the
resident set creeps up with every batch although nothing is live: about 1 GB over a 200k-row
scoring pass of a tiny model. ``malloc_trim(0)`` releases the free pages of every heap (about
10 ms); :class:`HeapTrimmer` calls it from a loop when the resident set has grown by a margin
since the last call. Where the C library is not glibc (macOS, musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time


def _find_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _find_trim()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def trim_heap() -> bool:
    """Release the free pages of every glibc heap -> whether the C library had the call."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def resident_bytes() -> int | None:
    """This process's resident set (Linux: /proc/self/statm), else None."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class HeapTrimmer:
    """From a loop's :meth:`tick`: at most every ``every_s`` seconds, look at the resident
    set, and :func:`trim_heap` when it has grown by ``grow_mb`` since the last look that
    trimmed (or the first)."""

    def __init__(self, every_s: float = 1.0, grow_mb: float = 256):
        self.every_s, self.grow = every_s, grow_mb * 2**20
        self._last = time.monotonic()
        self._base = resident_bytes() if _MALLOC_TRIM is not None else None

    def tick(self) -> None:
        now = time.monotonic()
        if self._base is None or now - self._last < self.every_s:
            return
        self._last = now
        if (resident_bytes() or 0) - self._base > self.grow:
            trim_heap()
            self._base = resident_bytes() or 0
