"""Sums of nanoseconds that must fit int64: a clear error instead of a wrapped, negative or garbage total.

Every time profattr keeps lies within 2**62 ns of 0 (trace/validate.py), so one duration or span always fits; a sum
of many (overlapping streams, per-step totals added window after window) need not. Sums are made in float64 by
numpy's bincount (exact below 2**53 ns, about 104 days) and turned into int64 here, and int64 totals are added
through add_ns, which checks for wrap-around.
"""
from __future__ import annotations

import numpy as np

from profattr.errors import ProfattrError

_LIMIT = float(2 ** 63)


def _too_big(what: str) -> ProfattrError:
    return ProfattrError(f"summed {what} reach 2**63 ns (292 years): the export's times or durations are damaged or "
                         "not nanoseconds; export the report again (`nsys export --type sqlite`)")


def checked_ns(sums: np.ndarray, what: str = "GPU op durations") -> np.ndarray:
    """float64 sums of ns, rounded, as int64; ProfattrError when one does not fit."""
    sums = np.asarray(sums, dtype=np.float64).round()
    if len(sums) and not (np.abs(sums) < _LIMIT).all():  # NaN fails too
        raise _too_big(what)
    return sums.astype(np.int64)


def add_ns(total: np.ndarray, at, values: np.ndarray, what: str = "GPU op durations") -> None:
    """total[at] += values (int64, `at` without repeats), raising ProfattrError instead of wrapping around."""
    before = total[at]
    after = before + values
    # a signed sum wraps exactly when both terms share a sign that the result does not
    if len(after) and ((before ^ after) & (values ^ after) < 0).any():
        raise _too_big(what)
    total[at] = after
