"""Id lists held flat in Arrow's list layout (``values`` and ``offsets``, often memory-mapped),
so a stage makes a batch's ids when the batch is drawn, not every row up front.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np


class RaggedIds(Sequence):
    """N id lists from ``chunks`` of (values [total], offsets [n + 1]); ``ids[i]`` ->
    list[int], ``ids[a:b]`` -> a RaggedIds over the same arrays (no copy)."""

    def __init__(self, chunks: Sequence[tuple[np.ndarray, np.ndarray]]):
        self._chunks = [(np.asarray(v), np.asarray(o)) for v, o in chunks if len(o) > 1]
        self._starts = list(itertools.accumulate((len(o) - 1 for _, o in self._chunks), initial=0))

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[int]]) -> RaggedIds:
        """The same ids from Python lists."""
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64,
                             count=int(offsets[-1]))
        return cls([(values, offsets)])

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            if i.step not in (None, 1):
                return RaggedIds.from_lists([self[j] for j in range(len(self))[i]])
            start, stop, _ = i.indices(len(self))  # a view of the same arrays
            out = []
            for (values, offsets), first in zip(self._chunks, self._starts):
                a, b = max(start - first, 0), min(stop - first, len(offsets) - 1)
                if a < b:
                    out.append((values, offsets[a: b + 1]))
            return RaggedIds(out)
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"RaggedIds: row {i} of {n}")
        c = bisect.bisect_right(self._starts, i) - 1
        values, offsets = self._chunks[c]
        j = i - self._starts[c]
        return values[offsets[j]: offsets[j + 1]].tolist()

    def lengths(self) -> np.ndarray:
        """[N] int64: the length of each id list."""
        parts = [np.diff(o).astype(np.int64) for _, o in self._chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class Joined(Sequence):
    """Row i: ``parts[0][i] + parts[1][i] + ... + tail`` (e.g. prompt + response + [EOS])."""

    def __init__(self, parts: Sequence[RaggedIds], tail: Sequence[int] = ()):
        if len({len(p) for p in parts}) > 1:
            raise ValueError(f"Joined: columns of unequal lengths {[len(p) for p in parts]}")
        self.parts, self.tail = tuple(parts), list(tail)

    def __len__(self) -> int:
        return len(self.parts[0]) if self.parts else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Joined([p[i] for p in self.parts], self.tail)
        out: list[int] = []
        for part in self.parts:
            out += part[i]
        return out + self.tail
