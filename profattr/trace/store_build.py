"""Writing a capture's op store (trace/store.py reads it) from an open Nsight Systems export, window by window.

Building streams the export in windows of ops (in table order, which nsys writes sorted by start), joins each window
to its launch calls through a sliding buffer of launch calls (calls run before their GPU work; a call that left the
buffer or was never recorded by name is looked up exactly at the end), and appends each column to its own file. So
memory is bounded by a window, not by the capture.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from profattr.arrays import unique
from profattr.trace import fetch, nsys_tables
from profattr.trace.ops import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, LOW32, Ops
from profattr.trace.reader import KERNEL, MEMCPY, MEMSET, RUNTIME, DamagedValues, load_query
from profattr.trace.store import COLUMNS, FORMAT, OpStore, window_ops

MIN_LAUNCH_MARGIN_NS = 2_000_000_000  # launch calls kept this long (or 4x the longest lag seen) behind the window


def build(export, folder: Path, size: int | None = None) -> OpStore:
    """Write the store of an open nsys export into `folder` (which must not exist), window by window."""
    size = size or window_ops()
    folder = Path(folder)
    folder.mkdir(parents=True)
    try:
        rows, segments, name_pairs = _write_ops(export, folder, size)
        tables, text = _small_tables(export, name_pairs)
        np.savez(folder / "tables.npz", **tables)
        (folder / "strings.json").write_text(json.dumps(text))
        meta = {"format": FORMAT, "rows": rows, "segments": segments, "columns": {k: np.dtype(v).str for k, v in COLUMNS.items()},
                "nsys_version": export.nsys_version, "schema_version": export.schema_version,
                "gpus": export.gpus}
        links = export.claims.replay_links
        if links is not None:  # ops without a correlationId linked to their graph launch (graph_replays.py)
            meta["replay_links"] = links.to_dict()
        (folder / "meta.json").write_text(json.dumps(meta))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return OpStore(folder)


def _write_ops(export, folder: Path, size: int) -> int:
    if not export.has(KERNEL):
        nsys_tables.load_ops(export)  # raises the reader's own error (no kernel data, and why)
    files = {name: open(folder / f"ops.{name}.bin", "wb") for name in COLUMNS if name != "name_id"}
    missing_rows, missing_keys, name_pairs = [], [], []
    written = 0
    segments = []  # [kind, first row, end row, rows in start order]
    try:
        sources = [(KERNEL, "gpu_kernels", KIND_KERNEL, "k")]
        sources += [(t, q, k, "m") for t, q, k in ((MEMCPY, "gpu_memcpy", KIND_MEMCPY),
                                                   (MEMSET, "gpu_memset", KIND_MEMSET)) if export.has(t)]
        for table, query, code, alias in sources:
            # kernels bring their (demangled, short) name pair along (queries/kernel_name_pair.sql): no second scan
            pair = ("\n" + load_query("kernel_name_pair")) if code == KIND_KERNEL else ", -1"
            fragments = {**nsys_tables._optional(export, table, alias), "name_pair": pair}
            blocks = export.blocks_by_rows(table, alias, query, len(nsys_tables.PACKED_COLS) + 1, fetch.threads(),
                                           **fragments)
            # memory ops are few: their launch calls are looked up exactly at the end with the ops the join missed,
            # instead of reading every launch call once more
            launches = _LaunchStream(export if code == KIND_KERNEL else None)
            segment = [int(code), written, written, True]
            last_start = None
            for block in _windows_of(blocks, size):
                if code == KIND_KERNEL:
                    name_pairs.append(unique(block[-1]))
                ops = _window_ops(block[:-1], code)
                if len(ops):
                    in_order = bool((ops.start[1:] >= ops.start[:-1]).all())
                    if not in_order or (last_start is not None and int(ops.start[0]) < last_start):
                        segment[3] = False
                    last_start = int(ops.start[-1])
                miss = launches.join(ops)
                missing_rows.append(np.flatnonzero(miss) + written)
                missing_keys.append(ops.launch_key[miss])
                for name, fh in files.items():
                    getattr(ops, name).astype(COLUMNS[name], copy=False).tofile(fh)
                written += len(ops)
            segment[2] = written
            segments.append(segment)
    finally:
        for fh in files.values():
            fh.close()
    pairs = _name_pairs(export, name_pairs)
    _write_short_names(folder, written, _short_name_table(pairs))
    rows = np.concatenate(missing_rows) if missing_rows else np.zeros(0, dtype=np.int64)
    keys = np.concatenate(missing_keys) if missing_keys else np.zeros(0, dtype=np.int64)
    if len(rows) and export.has(RUNTIME):
        _patch_missing(export, folder, rows, keys)
    if len(rows):
        _link_replays(export, folder, rows, keys, written)
    return written, segments, pairs


def _link_replays(export, folder: Path, rows: np.ndarray, keys: np.ndarray, written: int) -> None:
    """Replayed graph nodes without a correlationId among the ops the join missed, linked to their launch
    (trace/graph_replays.py) and patched in place; the launch keys other ops carry are read a window at a time."""
    from profattr.trace import graph_replays

    graph_node = np.memmap(folder / "ops.graph_node.bin", dtype=COLUMNS["graph_node"], mode="r")[rows]
    if not graph_replays.candidates(keys, graph_node).any():
        return
    start = np.memmap(folder / "ops.start.bin", dtype=COLUMNS["start"], mode="r")[rows]
    named = []
    size = window_ops()
    with open(folder / "ops.launch_key.bin", "rb") as keys_fh, open(folder / "ops.kind.bin", "rb") as kinds_fh:
        for _ in range(0, written, size):
            named.append(graph_replays.named_keys(np.fromfile(keys_fh, dtype=COLUMNS["launch_key"], count=size),
                                                  np.fromfile(kinds_fh, dtype=COLUMNS["kind"], count=size)))
    named = unique(np.concatenate(named)) if named else np.zeros(0, dtype=np.int64)
    graph_id = graph_replays.graph_ids(export, keys, start, graph_node)
    found, new_keys, tids, starts, stats = graph_replays.link(keys, start, graph_node,
                                                              nsys_tables.graph_launches(export), graph_id, named)
    if len(found):
        at = rows[found]
        for name, values in (("launch_key", new_keys), ("launch_tid", tids), ("launch_ns", starts),
                             ("launched", np.ones(len(at), dtype=bool))):
            mm = np.memmap(folder / f"ops.{name}.bin", dtype=COLUMNS[name], mode="r+")
            mm[at] = values.astype(COLUMNS[name])
            mm.flush()
            del mm
    nsys_tables.note_replay_links(export, stats)


def _windows_of(blocks, size: int):
    """Regroup (cols x n) blocks into (cols x size) windows (the last one shorter)."""
    pending, have = [], 0
    for block in blocks:
        pending.append(block)
        have += block.shape[1]
        while have >= size:
            joined = np.concatenate(pending, axis=1) if len(pending) > 1 else pending[0]
            yield joined[:, :size]
            rest = joined[:, size:]
            pending, have = ([rest] if rest.shape[1] else []), rest.shape[1]
    if have:
        yield np.concatenate(pending, axis=1) if len(pending) > 1 else pending[0]


def _name_pairs(export, uniques: list) -> list:
    """[(demangled id, short id)] as queries/kernel_names.sql gives them (the smallest short id of each demangled
    id), from the name-pair column of every window."""
    packed = unique(np.concatenate(uniques)) if uniques else np.zeros(0, dtype=np.int64)
    if len(packed) and packed[0] == -2:
        raise DamagedValues(f"{export.path}: a kernel row with neither a demangled nor a short name")
    packed = packed[packed >= 0]
    demangled, short = packed >> 32, packed & LOW32
    first = np.ones(len(packed), dtype=bool)  # sorted by demangled, then short: the first of each is the smallest
    first[1:] = demangled[1:] != demangled[:-1]
    if len(packed) and (short[first] == LOW32).any():  # only short names that are no id (MIN gives NULL)
        raise DamagedValues(f"{export.path}: a kernel name without a short name id that fits 31 bits")
    return list(zip(demangled[first].tolist(), short[first].tolist()))


def _short_name_table(pairs):
    pairs = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    order = np.argsort(pairs[:, 0])
    return pairs[order, 0], pairs[order, 1]


def _write_short_names(folder: Path, rows: int, short, size: int = 1 << 22) -> None:
    """ops.name_id.bin from ops.demangled_id.bin: the short-name id of each kernel's demangled name (as
    nsys_tables._short_names), window by window."""
    keys, vals = short
    with open(folder / "ops.demangled_id.bin", "rb") as src, open(folder / "ops.name_id.bin", "wb") as dst:
        for lo in range(0, rows, size):
            demangled_id = np.fromfile(src, dtype=np.int32, count=min(size, rows - lo))
            name_id = demangled_id.copy()
            if len(keys):
                pos = np.clip(np.searchsorted(keys, demangled_id), 0, len(keys) - 1)
                hit = (keys[pos] == demangled_id) & (demangled_id >= 0)
                name_id[hit] = vals[pos[hit]].astype(np.int32)
            name_id.tofile(dst)


def _window_ops(block: np.ndarray, code: int) -> Ops:
    """One window's Ops, as nsys_tables.load_ops makes them (launch columns filled by the join, short names
    written at the end by _write_short_names)."""
    start, end, device, packed, key, graph_node, grid, shape_block = (np.ascontiguousarray(c) for c in block)
    n = len(start)
    low = (packed & LOW32).astype(np.int32)
    if code == KIND_MEMCPY:
        demangled_id = -1 - low
    elif code == KIND_MEMSET:
        demangled_id = np.full(n, -100, dtype=np.int32)
    else:
        demangled_id = low
    return Ops(start=start, end=end, device=device.astype(np.int32), launch_key=key, name_id=demangled_id,
               demangled_id=demangled_id, graph_node=graph_node, stream=(packed >> 32).astype(np.int32),
               kind=np.full(n, code, dtype=np.int8), launch_tid=np.full(n, -1, dtype=np.int64),
               launch_ns=np.full(n, -1, dtype=np.int64), launched=np.zeros(n, dtype=bool), grid=grid,
               block=shape_block)


class _LaunchStream:
    """Launch calls (by API name, in table order = start order) read alongside GPU windows in start order.

    Before ops are joined, every call that started before them is read; calls far behind them are dropped. An op
    not matched here (its call was dropped, or is not a launch by name, or was never recorded) is returned as
    missing and looked up exactly at the end (_patch_missing): the join stays exact.
    """

    def __init__(self, export):
        self.blocks = None  # no export: no calls (every op is looked up exactly at the end)
        if export is not None and export.has(RUNTIME):
            name_ids = ",".join(str(int(r[0])) for r in export.query(load_query("launch_call_names")))
            if name_ids:
                # one thread reads the calls ahead while the ops are joined
                self.blocks = export.blocks_by_rows(RUNTIME, "r", "launch_calls_by_name", 3, 1, name_ids=name_ids)
        self.buf = np.zeros((3, 0), dtype=np.int64)  # key, tid, start
        self.max_lag = 0

    def join(self, ops: Ops) -> np.ndarray:
        """Fill ops' launch columns in place; returns which ops were not matched. Ops in start order are joined in
        pieces, a block of calls at a time, so that the buffer holds the calls of a stretch of time, not of the
        window: a window of sparse ops (memcpys) can span the whole capture."""
        n = len(ops)
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return found
        if not (ops.start[1:] >= ops.start[:-1]).all():
            self._read_until(int(ops.start.max()))
            self._match(ops, slice(0, n), found)
            return ~found
        lo = 0
        while lo < n:
            self._read_until(int(ops.start[lo]))
            # ops before the last buffered call's start have all their calls read (a call starts before its op)
            hi = n if self.blocks is None or not self.buf.shape[1] else max(
                lo + 1, int(np.searchsorted(ops.start, self.buf[2, -1], side="left")))
            self._match(ops, slice(lo, hi), found)
            lo = hi
        return ~found

    def _read_until(self, t_ns: int) -> None:
        """Read blocks of calls until the buffer holds a call that starts after t_ns (or the calls end)."""
        parts = [self.buf]
        while self.blocks is not None and (parts[-1].shape[1] == 0 or int(parts[-1][2, -1]) <= t_ns):
            block = next(self.blocks, None)
            if block is None:
                self.blocks = None
                break
            parts.append(block)
        self.buf = np.concatenate(parts, axis=1) if len(parts) > 1 else self.buf

    def _match(self, ops: Ops, piece: slice, found: np.ndarray) -> None:
        """Join ops[piece] to the buffer; then drop the calls far behind the piece's first op."""
        if not self.buf.shape[1]:
            return
        calls = {"key": self.buf[0], "tid": self.buf[1], "start": self.buf[2]}
        start = ops.start[piece]
        hit = nsys_tables._match(calls, ops.launch_key[piece], ops.launch_tid[piece], ops.launch_ns[piece])
        found[piece] = hit
        ops.launched[piece] = hit
        if hit.any():
            self.max_lag = max(self.max_lag, int((start[hit] - ops.launch_ns[piece][hit]).max()))
        keep_from = int(start.min()) - max(4 * self.max_lag, MIN_LAUNCH_MARGIN_NS)
        self.buf = self.buf[:, self.buf[2] >= keep_from]


def _patch_missing(export, folder: Path, rows: np.ndarray, keys: np.ndarray) -> None:
    """Exact lookup (by correlationId, any API name) of the ops the windowed join missed; patched in place."""
    tid = np.full(len(rows), -1, dtype=np.int64)
    ns = np.full(len(rows), -1, dtype=np.int64)
    calls = export.arrays(load_query("launch_calls_for"), ["key", "tid", "start"],
                          params=(json.dumps(unique(keys & LOW32).tolist()),))
    found = nsys_tables._match(calls, keys, tid, ns)
    if not found.any():
        return
    rows, tid, ns = rows[found], tid[found], ns[found]
    for name, values in (("launch_tid", tid), ("launch_ns", ns), ("launched", np.ones(len(rows), dtype=bool))):
        mm = np.memmap(folder / f"ops.{name}.bin", dtype=COLUMNS[name], mode="r+")
        mm[rows] = values.astype(COLUMNS[name])
        mm.flush()
        del mm


def _small_tables(export, name_pairs):
    tables, text = {}, {}
    rows, domains = nsys_tables.range_rows(export)
    if rows:
        cols = list(zip(*rows))
        for i, name in ((0, "start"), (1, "end"), (2, "tid"), (4, "domain")):
            tables[f"ranges_{name}"] = np.array(cols[i], dtype=np.int64)
        text["ranges_text"] = list(cols[3])
    text["domains"] = [[d, p, t] for (d, p), t in domains.items()]
    for prefix, data in (("graph", nsys_tables.graph_launches(export)), ("nodes", nsys_tables.node_creation(export))):
        for k, v in (data or {}).items():
            tables[f"{prefix}_{k}"] = np.asarray(v, dtype=np.int64)
    ids = {int(i) for pair in name_pairs for i in pair if i is not None}
    text["strings"] = {str(k): v for k, v in export.strings(ids).items()}
    return tables, text
