"""Array helpers every stage uses."""
from __future__ import annotations

import numpy as np


def unique(values) -> np.ndarray:
    """np.unique(values): the sorted distinct values. Integer and boolean arrays are sorted and compared with their
    neighbours: numpy 2.3 and later find them with a hash table instead, which is over 100 times slower on millions
    of distinct values (benchmarks/RESULTS.md). Other dtypes go to np.unique itself."""
    a = np.asarray(values).reshape(-1)
    if a.dtype.kind not in "iub":
        return np.unique(a)
    ordered = np.sort(a)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered if keep.all() else ordered[keep]  # all distinct (call keys, ...): the sorted copy itself


def value_counts(values) -> tuple:
    """(sorted distinct integer values, how often each occurs)."""
    ordered = np.sort(np.asarray(values, dtype=np.int64).reshape(-1))
    if not len(ordered):
        return ordered, np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    return ordered[first], np.diff(np.concatenate([first, [len(ordered)]]))


class Median:
    """The exact median of integers added a part at a time: the distinct values and their counts are kept (far
    fewer than the values for times in ns), and the median is np.median's: the middle value, or the mean of the
    two middle ones."""

    def __init__(self):
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, values) -> None:
        v, c = value_counts(values)
        if not len(v):
            return
        if len(self.values):
            v = np.concatenate([self.values, v])
            c = np.concatenate([self.counts, c])
            order = np.argsort(v, kind="stable")
            v, c = v[order], c[order]
            first = np.flatnonzero(np.concatenate([[True], v[1:] != v[:-1]]))
            v, c = v[first], np.add.reduceat(c, first)
        self.values, self.counts = v, c

    def __len__(self) -> int:
        return int(self.counts.sum())

    def median(self) -> float | None:
        """None when nothing was added."""
        n = len(self)
        if n == 0:
            return None
        reach = np.cumsum(self.counts)
        low = float(self.values[np.searchsorted(reach, (n - 1) // 2, side="right")])
        high = float(self.values[np.searchsorted(reach, n // 2, side="right")])
        return low if n % 2 else (low + high) / 2
