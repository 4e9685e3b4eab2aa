"""The time range from sorted starts read a value at a time (validate.time_window_sorted) against numpy's median and
percentiles of the whole array, computed here."""
import numpy as np
import pytest

from profattr.trace.validate import DAY_NS, TIME_LIMIT_NS, time_window_sorted


def expected(starts, session):
    s = starts[(starts > -TIME_LIMIT_NS) & (starts < TIME_LIMIT_NS)]
    if not len(s):
        lo, hi = session if session is not None else (0, 0)
    elif session is not None and session[0] <= float(np.median(s)) <= session[1]:
        lo, hi = session
    else:
        lo, hi = (int(x) for x in np.percentile(s, [1, 99]))
    margin = max(hi - lo, DAY_NS)
    return max(lo - margin, -TIME_LIMIT_NS), min(hi + margin, TIME_LIMIT_NS)


class Reads(list):
    """A sorted list that counts the values read (the store's column is read a value at a time)."""

    reads = 0

    def __getitem__(self, i):
        Reads.reads += 1
        return super().__getitem__(i)


@pytest.mark.parametrize("seed", range(40))
def test_same_window_as_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    scale = [10 ** 3, 10 ** 9, 10 ** 15, 2 ** 61][seed % 4]
    starts = np.sort(rng.integers(-scale, scale, n)).astype(np.int64)
    if seed % 5 == 0:  # out-of-range values are left out
        starts[:1] = -TIME_LIMIT_NS
        starts[-1:] = TIME_LIMIT_NS
        starts = np.sort(starts)
    for session in (None, (0, int(rng.integers(1, scale)))):
        Reads.reads = 0
        got = time_window_sorted(Reads(starts.tolist()), session)
        assert got == expected(starts, session)
        assert Reads.reads < 200  # order statistics and binary searches, not every value


def test_empty():
    assert time_window_sorted([], None) == expected(np.zeros(0, dtype=np.int64), None)
    assert time_window_sorted([], (0, 5)) == expected(np.zeros(0, dtype=np.int64), (0, 5))
