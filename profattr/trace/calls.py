"""A capture's CUDA calls that launch, copy or wait (the reader's api_calls: tid, start, end, kind) for the views that
sweep them against time: held whole, or for a long capture spilled a block at a time to a temporary file, so that
memory holds a few blocks, not every call.

Both forms give the calls in start order (stable: calls of one start keep the reader's order) through `blocks()`,
and through `between(lo, hi)` the calls of any time range: a run of calls in start order that holds every call
overlapping [lo, hi) (start < hi, end > lo); a spilled form may add calls of the same blocks that do not overlap it,
which add nothing to an overlap and are what a filter on start and end leaves out. So every figure swept from them
is the same in both forms (tests/test_calls.py).

The reader chooses (trace/reader.py host_calls): an export whose CUDA-call table holds more than WHOLE_ROWS rows,
with its calls in start order in the table (as nsys writes them), is spilled; anything else is held whole.
"""
from __future__ import annotations

import tempfile

import numpy as np

COLUMNS = ("tid", "start", "end", "kind")
WHOLE_ROWS = 1 << 22  # CUDA-call table rows up to which the calls are held whole (at most 128 MB of calls)
BLOCK_CALLS = 1 << 18  # calls per spilled block (8 MB)
CACHED_BLOCKS = 4  # spilled blocks kept read (consecutive windows ask for the same time)


class ApiCalls:
    """The calls in start order: `len`, `count(kind)`, `blocks()`, `between(lo, hi)`, `close()`."""

    def __len__(self) -> int:
        return self.n

    def count(self, kind: int) -> int:
        return int(self.kinds[kind]) if 0 <= kind < len(self.kinds) else 0

    def close(self) -> None:
        pass


class WholeCalls(ApiCalls):
    """Every call in memory, sorted by start (a stable sort where the reader's order is not)."""

    def __init__(self, api: dict):
        start = np.asarray(api["start"], dtype=np.int64)
        order = None if len(start) < 2 or bool((start[1:] >= start[:-1]).all()) else np.argsort(start, kind="stable")
        self.cols = {k: np.asarray(api[k], dtype=np.int64) if order is None else np.asarray(api[k], dtype=np.int64)[
            order] for k in COLUMNS}
        self.reach = np.maximum.accumulate(self.cols["end"]) if len(start) else self.cols["end"]
        self.n = len(start)
        self.kinds = np.bincount(self.cols["kind"][self.cols["kind"] >= 0], minlength=4)

    def blocks(self):
        size = BLOCK_CALLS
        for lo in range(0, self.n, size):
            yield {k: v[lo:lo + size] for k, v in self.cols.items()}

    def between(self, lo: int, hi: int) -> dict:
        at = slice(int(np.searchsorted(self.reach, lo, side="right")), int(np.searchsorted(self.cols["start"], hi)))
        return {k: v[at] for k, v in self.cols.items()}


class SpilledCalls(ApiCalls):
    """The calls in a temporary file, a block of BLOCK_CALLS at a time (each column of a block contiguous), with
    per block its first start and the latest end of it and every block before (`reach`)."""

    def __init__(self):
        self.file = tempfile.TemporaryFile(prefix="profattr-calls-")
        self.offsets, self.sizes, self.first, self.reach = [], [], [], []
        self.n = 0
        self.kinds = np.zeros(4, dtype=np.int64)
        self.cache: dict = {}
        self._pending: list = []  # calls not yet written (less than a block)
        self._last_start = None
        self._reach = None

    @classmethod
    def of(cls, parts) -> "SpilledCalls | None":
        """The calls of `parts` (dicts of COLUMNS, in the reader's order); None when they are not in start order
        (the caller holds them whole instead, sorted)."""
        out = cls()
        try:
            for part in parts:
                if not out._add(part):
                    out.close()
                    return None
            out._flush(everything=True)
        except BaseException:
            out.close()
            raise
        return out

    def _add(self, part: dict) -> bool:
        start = np.asarray(part["start"], dtype=np.int64)
        if not len(start):
            return True
        if (self._last_start is not None and int(start[0]) < self._last_start) or (
                len(start) > 1 and not bool((start[1:] >= start[:-1]).all())):
            return False
        self._last_start = int(start[-1])
        kind = np.asarray(part["kind"], dtype=np.int64)
        self.kinds += np.bincount(kind[kind >= 0], minlength=4)[:4]
        self._pending.append({k: np.asarray(part[k], dtype=np.int64) for k in COLUMNS})
        self._flush()
        return True

    def _flush(self, everything: bool = False) -> None:
        waiting = sum(len(p["start"]) for p in self._pending)
        while waiting >= BLOCK_CALLS or (everything and waiting):
            cols = {k: np.concatenate([p[k] for p in self._pending]) for k in COLUMNS}
            take = min(BLOCK_CALLS, waiting)
            block = np.stack([cols[k][:take] for k in COLUMNS])
            self._pending = [{k: v[take:] for k, v in cols.items()}] if take < waiting else []
            waiting -= take
            end = int(block[2].max())
            self._reach = end if self._reach is None else max(self._reach, end)
            self.offsets.append(self.file.tell())
            self.sizes.append(take)
            self.first.append(int(block[1, 0]))
            self.reach.append(self._reach)
            block.tofile(self.file)
            self.n += take

    def _block(self, b: int) -> dict:
        if b not in self.cache:
            if len(self.cache) >= CACHED_BLOCKS:
                self.cache.pop(next(iter(self.cache)))
            self.file.seek(self.offsets[b])
            block = np.fromfile(self.file, dtype=np.int64, count=len(COLUMNS) * self.sizes[b])
            self.cache[b] = dict(zip(COLUMNS, block.reshape(len(COLUMNS), -1)))
        return self.cache[b]

    def blocks(self):
        for b in range(len(self.sizes)):
            yield self._block(b)

    def between(self, lo: int, hi: int) -> dict:
        first = int(np.searchsorted(np.asarray(self.reach, dtype=np.int64), lo, side="right"))
        last = int(np.searchsorted(np.asarray(self.first, dtype=np.int64), hi))  # blocks [first, last)
        parts = [self._block(b) for b in range(first, last)]
        if not parts:
            return {k: np.zeros(0, dtype=np.int64) for k in COLUMNS}
        return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in COLUMNS}

    def close(self) -> None:
        self.cache.clear()
        self.file.close()
