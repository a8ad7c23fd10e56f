"""Freed memory handed back to the OS (Linux, glibc; elsewhere a no-op): tensors of changing
shapes leave free chunks glibc returns only from a heap's top, so :class:`HeapTrimmer` calls
``malloc_trim(0)`` when the resident set has grown.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time

try:
    _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):  # no C library with the call
    _MALLOC_TRIM = None
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
    """:meth:`tick` checks the resident set at most every ``every_s`` seconds and trims once it
    has grown ``grow_mb`` since the last trim."""

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
