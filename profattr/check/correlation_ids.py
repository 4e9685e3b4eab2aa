"""The records check's figures (completeness.check_records): the gaps in each process's sequence of correlation ids.

CUPTI numbers every CUDA call of a process; ids that never appear are calls the profiler did not record (or API kinds
it does not trace): a gap far larger than the usual one means records were dropped. The keys (process << 32 |
correlationId) come a block at a time in any order (the reader's fold_api_keys: rowid ranges of the export), and each
process's distinct ids are kept as a bitmap over the range of ids met so far: one bit an id, so the tens of millions
of calls of a long capture take a few MB instead of 8 bytes a key and a sorted copy. A process whose ids are too
sparse for a bitmap (its span over SPARSE_FACTOR times its ids: a damaged or synthetic export) keeps its ids instead.
The figures are those of the sorted distinct ids: the gaps between consecutive ones, their median (np.median's, from
the gaps' distinct values and counts), the largest, and the big ones.
"""
from __future__ import annotations

import numpy as np

from profattr.arrays import Median, unique

# a gap this large (ids) and this many times the usual gap: API calls that produce no GPU work (lazy library set-up
# at a first step makes about a thousand) stay below it; the lost records seen with nsys 2023.4.4 jumped by tens of
# thousands
BIG_GAP_IDS = 10_000
BIG_GAP_FACTOR = 200
SPARSE_FACTOR = 64  # a bitmap costs span / 8 bytes, the ids 8 bytes each: ids beyond this span per id
MIN_BITMAP_IDS = 1 << 23  # any span up to this many ids (1 MB of bits) is a bitmap
SCAN_BYTES = 1 << 18  # bits read back at a time (2 M ids)
LOW32 = 0xFFFFFFFF


class CorrelationIds:
    """The distinct correlation ids of every process, added a block of keys at a time (`add`), and the gap figures
    of all of them (`result`)."""

    def __init__(self):
        self.processes: dict = {}  # process bits -> _Ids

    def add(self, keys) -> "CorrelationIds":
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if not len(keys):
            return self
        process = keys >> 32
        if bool((process == process[0]).all()):  # one process (the usual case): no sort
            parts = [(int(process[0]), keys & LOW32)]
        else:
            order = np.argsort(process, kind="stable")
            process, ids = process[order], keys[order] & LOW32
            cut = np.flatnonzero(process[1:] != process[:-1]) + 1
            parts = zip(process[np.r_[0, cut]].tolist(), np.split(ids, cut))
        for p, ids in parts:
            self.processes.setdefault(p, _Ids()).add(ids)
        return self

    def result(self) -> dict:
        """processes (with three ids or more), largest_gap, usual_gap (the largest process's median gap, at least
        1), big_gaps, ids_in_big_gaps, span (last id - first id, summed over processes)."""
        out = {"processes": 0, "largest_gap": 0, "usual_gap": 0, "big_gaps": 0, "ids_in_big_gaps": 0, "span": 0}
        for ids in self.processes.values():
            gaps, distinct, first, last = ids.gaps()
            if distinct < 3:
                continue
            usual = max(int(gaps.median()), 1)
            big = gaps.values > max(BIG_GAP_IDS, BIG_GAP_FACTOR * usual)
            out["processes"] += 1
            out["largest_gap"] = max(out["largest_gap"], int(gaps.values[-1]))
            out["usual_gap"] = max(out["usual_gap"], usual)
            out["big_gaps"] += int(gaps.counts[big].sum())
            out["ids_in_big_gaps"] += int((gaps.values[big] * gaps.counts[big]).sum())
            out["span"] += last - first
        return out


def correlation_gaps(keys) -> dict:
    """CorrelationIds.result of `keys` (an array of them) all at once."""
    return CorrelationIds().add(keys).result()


class _Ids:
    """One process's distinct ids: bits over [base, base + 8 * len(bits)) (base a multiple of 8), or, once too
    sparse for that, the ids themselves (`listed`)."""

    def __init__(self):
        self.base = None
        self.bits = np.zeros(0, dtype=np.uint8)
        self.added = 0  # ids added, repeats included
        self.listed = None  # arrays of ids, when sparse

    def add(self, ids: np.ndarray) -> None:
        self.added += len(ids)
        if self.listed is not None:
            self.listed.append(ids)
            return
        lo, hi = int(ids.min()), int(ids.max()) + 1
        if self.base is not None:
            lo, hi = min(lo, self.base), max(hi, self.base + 8 * len(self.bits))
        if hi - lo > max(SPARSE_FACTOR * self.added, MIN_BITMAP_IDS):
            self.listed = ([self._set_ids()] if self.base is not None else []) + [ids]
            self.bits = None
            return
        self._cover(lo, hi)
        at = ids - self.base
        np.bitwise_or.at(self.bits, at >> 3, np.left_shift(1, at & 7).astype(np.uint8))

    def _cover(self, lo: int, hi: int) -> None:
        """Grow the bits to hold ids [lo, hi), with room to spare upwards (ids mostly rise)."""
        if self.base is None:
            self.base = lo - lo % 8
            self.bits = np.zeros((hi - self.base + 7) // 8, dtype=np.uint8)
            return
        end = self.base + 8 * len(self.bits)
        if lo >= self.base and hi <= end:
            return
        base = min(self.base, lo - lo % 8)
        if hi > end:
            hi = max(hi, end + (end - base) // 2)
        grown = np.zeros((hi - base + 7) // 8, dtype=np.uint8)
        at = (self.base - base) // 8
        grown[at:at + len(self.bits)] = self.bits
        self.base, self.bits = base, grown

    def _set_ids(self) -> np.ndarray:
        return np.concatenate([part for _, part in self._runs()] or [np.zeros(0, dtype=np.int64)])

    def _runs(self):
        """(first id of the run, its ids in order) over the bits, a part at a time."""
        for lo in range(0, len(self.bits), SCAN_BYTES):
            part = self.bits[lo:lo + SCAN_BYTES]
            if part.any():
                yield lo, np.flatnonzero(np.unpackbits(part, bitorder="little")).astype(np.int64) + (self.base + 8 * lo)

    def gaps(self) -> tuple:
        """(Median of the gaps between consecutive distinct ids, number of distinct ids, first id, last id)."""
        gaps, distinct, first, last = Median(), 0, None, None
        parts = ((None, unique(np.concatenate(self.listed))),) if self.listed is not None else self._runs()
        for _, ids in parts:
            if not len(ids):
                continue
            distinct += len(ids)
            gaps.add(np.diff(ids) if last is None else np.diff(ids, prepend=last))
            first = int(ids[0]) if first is None else first
            last = int(ids[-1])
        return gaps, distinct, first, last

