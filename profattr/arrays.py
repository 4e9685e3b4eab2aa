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
    return ordered[keep]
