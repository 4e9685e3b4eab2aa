"""A capture's per-op arrays on disk, read window by window: what the budget needs from an Nsight Systems export
(the reader's Ops with their launch shapes, NVTX ranges, graph launches, node creation, the kernel-name strings),
written once by trace/store_build.py. The same folder is the budget cache's entry (trace/cache.py); without the cache
it is a temporary folder.

An entry holds: meta.json (columns, rows, capture facts), ops.COLUMN.bin (raw arrays, in Ops order: kernels, then
memcpys, then memsets), tables.npz (ranges, graph launches, node creation as integer arrays) and strings.json
(NVTX texts and domains, kernel-name strings).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from profattr.errors import ProfattrError
from profattr.trace import nsys_tables
from profattr.trace.ops import KIND_KERNEL, Ops

FORMAT = "profattr.opstore/1"
COLUMNS = {"start": np.int64, "end": np.int64, "device": np.int32, "launch_key": np.int64, "name_id": np.int32,
           "demangled_id": np.int32, "graph_node": np.int64, "stream": np.int32, "kind": np.int8,
           "launch_tid": np.int64, "launch_ns": np.int64, "launched": np.bool_, "grid": np.int64, "block": np.int64}
DEFAULT_WINDOW_OPS = 1 << 19  # ops per window: about 43 MB of op arrays, a few times that while a window is worked


def window_ops() -> int:
    try:
        return max(1, int(os.environ.get("PROFATTR_WINDOW_OPS", DEFAULT_WINDOW_OPS)))
    except ValueError:
        return DEFAULT_WINDOW_OPS


class OpStore:
    """A finished store folder: rows, windows of ops, and the small tables."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = json.loads((self.folder / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{folder}: not a {FORMAT} store")
        self.meta = meta
        self.rows = int(meta["rows"])
        for name, dtype in COLUMNS.items():
            size = (self.folder / f"ops.{name}.bin").stat().st_size
            if size != self.rows * np.dtype(dtype).itemsize:
                raise ValueError(f"{folder}: ops.{name}.bin has {size} bytes, expected {self.rows} rows")
        with np.load(self.folder / "tables.npz", allow_pickle=False) as z:
            self.tables = {k: z[k] for k in z.files}
        self.text = json.loads((self.folder / "strings.json").read_text())
        # one string object per distinct range text (a long capture repeats a few texts in every step)
        self.ranges_text = _shared_strings(self.text.pop("ranges_text", []))
        self._ranges = None

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows lo..hi of one column, read with plain file reads (no memory map: RSS stays the window's)."""
        hi = self.rows if hi is None else hi
        dtype = np.dtype(COLUMNS[name])
        with open(self.folder / f"ops.{name}.bin", "rb") as fh:
            fh.seek(lo * dtype.itemsize)
            out = np.fromfile(fh, dtype=dtype, count=hi - lo)
        if len(out) != hi - lo:
            raise ValueError(f"{self.folder}: ops.{name}.bin is short")
        return out

    def ops(self, lo: int = 0, hi: int | None = None) -> Ops:
        return Ops(**{name: self.column(name, lo, hi) for name in COLUMNS})

    def bounds(self, size: int | None = None):
        size = size or window_ops()
        return [(lo, min(lo + size, self.rows)) for lo in range(0, self.rows, size)] or [(0, 0)]

    def windows(self, size: int | None = None):
        """Ops of each window, in order."""
        for lo, hi in self.bounds(size):
            yield lo, self.ops(lo, hi)

    def time_windows(self, size: int | None = None):
        """Ops in windows of GPU start time, every table's ops at once: the kernel rows of each row window, with
        the memcpys and memsets that start between its first kernel and the next window's. Every (device, step)
        then meets its ops in start order, which the busy time's running union needs (attribute/accumulate.py).
        None when a table's rows are not in start order."""
        segments = self.meta.get("segments") or []
        if not segments or not all(seg[3] for seg in segments) or segments[0][0] != KIND_KERNEL:
            return None
        _, k_lo, k_hi, _ = segments[0]
        size = size or window_ops()
        row_bounds = [(lo, min(lo + size, k_hi)) for lo in range(k_lo, k_hi, size)] or [(k_lo, k_hi)]
        cuts = [int(self.column("start", lo, lo + 1)[0]) for lo, _ in row_bounds[1:]]
        others = []
        for _, lo, hi, _ in segments[1:]:
            pos = np.searchsorted(self.column("start", lo, hi), cuts, side="left") + lo
            others.append(np.concatenate([[lo], pos, [hi]]).astype(np.int64))
        return self._time_windows(row_bounds, others)

    def _time_windows(self, row_bounds, others):
        for i, (lo, hi) in enumerate(row_bounds):
            parts = [self.ops(lo, hi)] + [self.ops(int(b[i]), int(b[i + 1])) for b in others]
            parts = [p for p in parts if len(p)] or parts[:1]
            ops = concat_ops(parts) if len(parts) > 1 else parts[0]
            del parts  # not held while the window is worked on: one copy of it, not two
            yield ops

    def kernel_configs(self) -> "dict | None":
        """Every kernel row's device, name (demangled id), grid x/y/z, block x/y/z, start and duration, as
        queries/check_kernel_sequence.sql gives them (unordered); None when a row's device, name, grid or block did
        not fit its field (the SQL then says what it holds) or the store holds no kernel segment first."""
        segments = self.meta.get("segments") or []
        if not segments or segments[0][0] != KIND_KERNEL:
            return None
        _, lo, hi, _ = segments[0]
        cols = {name: self.column(name, lo, hi) for name in ("device", "demangled_id", "grid", "block")}
        if any((values < 0).any() for values in cols.values()):
            return None
        start = self.column("start", lo, hi)
        grid, block = cols["grid"], cols["block"]
        return {"device": cols["device"].astype(np.int64), "name": cols["demangled_id"].astype(np.int64),
                "gx": grid >> 32, "gy": (grid >> 16) & 0xFFFF, "gz": grid & 0xFFFF,
                "bx": block >> 48, "by": (block >> 32) & 0xFFFF, "bz": (block >> 16) & 0xFFFF,
                "start": start, "duration": self.column("end", lo, hi) - start}

    def sorted_kernel_starts(self) -> "ColumnView | None":
        """Every kernel's start, when the kernel rows are in start order (as nsys writes them), as a sequence read a
        value at a time; None otherwise."""
        segments = self.meta.get("segments") or []
        if not segments or segments[0][0] != KIND_KERNEL or not segments[0][3]:
            return None
        return ColumnView(self, "start", segments[0][1], segments[0][2])

    def launch_windows(self, size: int | None = None):
        """(launch_tid, launch_ns, launched) of each window: all steps.auto_steps needs from the ops."""
        for lo, hi in self.bounds(size):
            yield (self.column("launch_tid", lo, hi), self.column("launch_ns", lo, hi),
                   self.column("launched", lo, hi))

    # --- the small tables, as the reader returns them ------------------------------------------------------------
    def ranges(self) -> "pd.DataFrame":
        """The NVTX ranges frame, built once from the stored columns (which are then let go: a long capture's
        ranges are held once, in the frame); each call gets a shallow copy of it."""
        if self._ranges is None:
            import pandas as pd  # here: a store is built and opened before pandas is needed (budget_result)

            t = self.tables
            if "ranges_start" not in t or not len(t["ranges_start"]):
                self._ranges = nsys_tables.empty_ranges()
            else:
                # column by column (a tuple per row would hold every range as Python objects)
                frame = pd.DataFrame({"start": t["ranges_start"], "end": t["ranges_end"], "tid": t["ranges_tid"],
                                      "text": self.ranges_text, "domain_id": t["ranges_domain"]})
                domains = {(int(d), int(p)): s for d, p, s in self.text["domains"]}
                self._ranges = nsys_tables.with_domains(frame, domains)
            for name in ("start", "end", "tid", "domain"):
                t.pop(f"ranges_{name}", None)
            self.ranges_text = None
        return self._ranges.copy(deep=False)

    def _group(self, prefix: str, names) -> dict | None:
        if f"{prefix}_{names[0]}" not in self.tables:
            return None
        return {n: self.tables[f"{prefix}_{n}"] for n in names}

    def graph_launches(self) -> dict | None:
        return self._group("graph", ("start", "end", "tid", "correlation"))

    def node_creation(self) -> dict | None:
        return self._group("nodes", ("node", "original", "start", "tid"))

    def strings(self, ids) -> dict:
        known = self.text["strings"]
        return {int(i): known[str(int(i))] for i in {int(i) for i in ids if i is not None}
                if str(int(i)) in known}


class ColumnView:
    """Rows lo..hi of one store column as a sequence (len, [i]) read a value at a time: for binary searches."""

    def __init__(self, store: OpStore, name: str, lo: int, hi: int):
        self.store, self.name, self.lo, self.hi = store, name, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return int(self.store.column(self.name, self.lo + i, self.lo + i + 1)[0])


def _shared_strings(values: list) -> np.ndarray:
    """`values` (strings or None) as an object array holding one string object per distinct value."""
    import pandas as pd

    codes, uniques = pd.factorize(np.array(values, dtype=object), use_na_sentinel=True)
    out = np.full(len(codes), None, dtype=object)
    known = codes >= 0
    out[known] = uniques[codes[known]]
    return out


def concat_ops(parts) -> Ops:
    return Ops(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in COLUMNS})


def store_or_error(folder: Path) -> OpStore:
    try:
        return OpStore(folder)
    except (OSError, ValueError, KeyError) as exc:
        raise ProfattrError(f"{folder}: unreadable op store ({exc})") from None
