"""Nsight Systems export tables as the reader's arrays: GPU ops joined to their launch calls, NVTX ranges, graph
launches and graph-node creation, CUDA API calls, kernel launch configurations. SQL lives in queries/.
"""
from __future__ import annotations

import json

import numpy as np

from profattr.arrays import unique
from profattr.errors import ProfattrError
from profattr.trace.ops import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, LOW32, Ops
from profattr.trace.nsys_sqlite import (KERNEL, MEMCPY, MEMSET, NVTX, RUNTIME, DamagedValues, NsysTables,
                                        load_query)


SHAPE_COLUMNS = {"grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ", "block_x": "blockX", "block_y": "blockY",
                 "block_z": "blockZ", "registers": "registersPerThread"}


def _optional(export: NsysTables, table: str, alias: str) -> dict:
    out = {"graph_node_id": f"COALESCE({export.column_or(table, 'graphNodeId', alias, '-1')}, -1)",
           "stream_id": f"COALESCE({export.column_or(table, 'streamId', alias, '0')}, 0)",
           "row_range": "1",  # every row (trace/store_build.py fetches ranges of rows at once)
           "name_pair": ""}  # no column more (the store's build asks for one: queries/kernel_name_pair.sql)
    # the launch shape (kernels only): -1 makes the packed value -1 when the export lacks a column
    out.update({key: f"COALESCE({export.column_or(table, col, alias, '-1')}, -1)" for key, col in SHAPE_COLUMNS.items()})
    return out


PACKED_COLS = ["start", "end", "device", "packed", "launch_key", "graph_node", "grid", "block"]


def load_ops(export: NsysTables, include_memory: bool = True) -> Ops:
    """All GPU activities with their launch calls joined. Raises when the export has no kernel data."""
    if not export.has(KERNEL):
        hint = ("nsys recorded no CUDA kernels: capture with `--trace=cuda` (and `--cuda-graph-trace=node` so "
                "replayed CUDA-graph kernels are recorded one by one)")
        if export.has(RUNTIME):
            graph = export.query("SELECT count(*) FROM StringIds WHERE value LIKE 'cudaGraphLaunch%'")[0][0]
            if graph:
                hint = ("the capture has cudaGraphLaunch calls but no kernel rows: it was made with "
                        "`--cuda-graph-trace=graph`; capture again with `--cuda-graph-trace=node`")
        raise ProfattrError(f"{export.path}: no CUDA kernel data; {hint}")
    sources = [(KERNEL, "gpu_kernels", KIND_KERNEL, "k")]
    if include_memory:
        sources += [(t, q, k, "m") for t, q, k in ((MEMCPY, "gpu_memcpy", KIND_MEMCPY), (MEMSET, "gpu_memset",
                                                                                         KIND_MEMSET))
                    if export.has(t)]
    # one column buffer for all three tables: no concatenated copies
    capacity = sum(export.count(t) for t, *_ in sources)
    buf = np.empty((len(PACKED_COLS), capacity), dtype=np.int64)
    kind = np.empty(capacity, dtype=np.int8)
    filled = 0
    for table, query, code, alias in sources:
        sql = load_query(query, **_optional(export, table, alias))
        n = export.arrays_into(sql, buf, filled)
        kind[filled:filled + n] = code
        filled += n
    buf, kind = buf[:, :filled], kind[:filled]
    start, end, device, packed, key, graph_node, grid, block = buf
    low = (packed & LOW32).astype(np.int32)
    # names: kernels carry their demangled-name id; memory ops get negative codes (see Ops)
    demangled_id = low
    is_copy, is_set = kind == KIND_MEMCPY, kind == KIND_MEMSET
    demangled_id[is_copy] = -1 - low[is_copy]
    demangled_id[is_set] = -100
    device = device.astype(np.int32)
    stream = (packed >> 32).astype(np.int32)
    del packed, low
    launch_tid, launch_ns, launched = _join_launches(export, key)
    ops = Ops(start=start, end=end, device=device, launch_key=key, name_id=_short_names(export, demangled_id),
              demangled_id=demangled_id, graph_node=graph_node, stream=stream, kind=kind,
              launch_tid=launch_tid, launch_ns=launch_ns, launched=launched, grid=grid, block=block)
    link_replays(export, ops)
    return ops


def link_replays(export: NsysTables, ops: Ops) -> None:
    """Replayed graph nodes without a correlationId, linked to their cudaGraphLaunch (trace/graph_replays.py); what
    was linked is kept on the export's claims (`replay_links`) for the budget's warning and `check`."""
    from profattr.trace import graph_replays

    if not graph_replays.candidates(ops.launch_key, ops.graph_node).any():
        return
    graph_id = graph_replays.graph_ids(export, ops.launch_key, ops.start, ops.graph_node)
    stats = graph_replays.apply(ops, graph_launches(export), graph_id)
    note_replay_links(export, stats)


def note_replay_links(export: NsysTables, stats) -> None:
    from profattr.errors import warn

    if stats is None or export.claims is None:
        return
    export.claims.replay_links = stats
    if stats.linked < stats.ops:
        warn(f"{export.path}: {stats.sentence()}; `profattr check` names them")


def _short_names(export: NsysTables, demangled_id: np.ndarray) -> np.ndarray:
    """Short-name id per op, from the (demangled, short) pairs of the kernel table (few distinct names)."""
    pairs = np.array(export.query(load_query("kernel_names")), dtype=np.int64).reshape(-1, 2)
    out = demangled_id.copy()  # int32
    if len(pairs):
        order = np.argsort(pairs[:, 0])
        keys, vals = pairs[order, 0], pairs[order, 1]
        pos = np.clip(np.searchsorted(keys, demangled_id), 0, len(keys) - 1)
        hit = (keys[pos] == demangled_id) & (demangled_id >= 0)
        out[hit] = vals[pos[hit]].astype(np.int32)
    return out


def _join_launches(export: NsysTables, op_key: np.ndarray):
    """For each activity, the thread and start time of its launch call (-1 when absent) and whether one was found,
    by a sorted-key join.

    key = (VM and process bits) << 32 | correlationId: correlationIds are 32-bit and unique within a process.
    """
    n = len(op_key)
    tid_out = np.full(n, -1, dtype=np.int64)
    ns_out = np.full(n, -1, dtype=np.int64)
    if not export.has(RUNTIME) or n == 0:
        return tid_out, ns_out, np.zeros(n, dtype=bool)
    # fast path: launch calls picked by API name (a handful of ids); then, exactly, by correlationId for whatever
    # is left (ops whose launch call lies before the capture window, or an API name not foreseen)
    name_ids = ",".join(str(int(r[0])) for r in export.query(load_query("launch_call_names")))
    found = np.zeros(n, dtype=bool)
    if name_ids:
        calls = export.arrays(load_query("launch_calls_by_name", name_ids=name_ids, row_range="1"), ["key", "tid", "start"],
                              max_rows=n + n // 8 + 1024)  # about one launch per op, some launches of nothing
        found = _match(calls, op_key, tid_out, ns_out)
    missing = unique(op_key[~found] & LOW32)
    if len(missing):
        calls = export.arrays(load_query("launch_calls_for"), ["key", "tid", "start"],
                              params=(json.dumps(missing.tolist()),))
        found |= _match(calls, op_key, tid_out, ns_out)
    return tid_out, ns_out, found


def _match(calls: dict, op_key: np.ndarray, tid_out: np.ndarray, ns_out: np.ndarray) -> np.ndarray:
    """Fill (in place) the launch thread/start of ops whose key is among `calls`, by a sorted-key join; returns
    which ops were found."""
    if len(calls["key"]) == 0:
        return np.zeros(len(op_key), dtype=bool)
    order = np.argsort(calls["key"], kind="stable")
    sorted_keys = calls["key"][order]
    pos = np.minimum(np.searchsorted(sorted_keys, op_key), len(sorted_keys) - 1)
    found = sorted_keys[pos] == op_key
    hit = order[pos[found]]
    tid_out[found] = calls["tid"][hit]
    ns_out[found] = calls["start"][hit]
    return found


EMPTY_RANGES = {"start": np.int64, "end": np.int64, "tid": np.int64, "text": object, "domain": object}


def empty_ranges() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({k: pd.Series([], dtype=v) for k, v in EMPTY_RANGES.items()})


def load_ranges(export: NsysTables) -> pd.DataFrame:
    """Closed push/pop and start/end ranges: start, end, tid, text, domain (name or '')."""
    return ranges_frame(*range_rows(export))


def range_rows(export: NsysTables):
    """(rows of start, end, tid, text, domain id; {(domain id, process bits): domain name}) of the closed ranges."""
    if not export.has(NVTX):
        return [], {}
    cols = export.columns(NVTX)
    text_id = "n.textId" if "textId" in cols else "NULL"
    same_thread = "n.endGlobalTid IS NULL" if "endGlobalTid" in cols else "1"
    rows = export.query(load_query("nvtx_ranges", text_id=text_id, same_thread=same_thread))
    if not rows:
        return [], {}
    domains = {(int(d), int(p)): t for d, p, t in export.query(load_query("nvtx_domains")) if t}
    return rows, domains


def ranges_frame(rows: list, domains: dict) -> pd.DataFrame:
    """The ranges frame of range_rows' output (also what the op store rebuilds it from)."""
    import pandas as pd

    if not rows:
        return empty_ranges()
    frame = pd.DataFrame(rows, columns=["start", "end", "tid", "text", "domain_id"])
    if frame[["start", "end", "tid"]].isna().to_numpy().any():  # a NULL time or thread: the rows get checked
        raise DamagedValues("an NVTX range with a NULL start, end or thread")
    return with_domains(frame, domains)


def with_domains(frame: pd.DataFrame, domains: dict) -> pd.DataFrame:
    """The ranges frame from one with start, end, tid, text, domain_id columns: the domain's name for its id."""
    import pandas as pd

    if not domains:
        frame["domain"] = ""
        return frame.drop(columns="domain_id")
    # a join on (domain id, process), not a lookup per range: domain id 0 or NULL is the default domain ("")
    ids = pd.to_numeric(frame["domain_id"], errors="coerce").fillna(0).to_numpy(dtype=np.int64)
    pid = frame["tid"].to_numpy(dtype=np.int64) & ~0xFFFFFF
    names = pd.DataFrame([(int(d), int(p), n) for (d, p), n in domains.items()], columns=["id", "pid", "domain"])
    keys = pd.DataFrame({"id": ids, "pid": pid})
    found = keys.merge(names.drop_duplicates(["id", "pid"]), on=["id", "pid"], how="left")["domain"]
    frame["domain"] = found.where(ids != 0, "").fillna("").to_numpy(dtype=object)
    return frame.drop(columns="domain_id")


def graph_launches(export: NsysTables) -> dict | None:
    """cudaGraphLaunch calls as arrays start, end, tid, correlation (time order per thread); None without any."""
    if not export.has(RUNTIME):
        return None
    g = export.arrays(load_query("graph_launches"), ["start", "end", "tid", "correlation"])
    return g if len(g["start"]) else None


NODE_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")  # the table was renamed in 2024.x exports


def node_creation(export: NsysTables) -> dict | None:
    """Arrays (node, original, start, tid) of node-creation events, sorted by node id; None when absent."""
    for table in NODE_TABLES:
        if export.has(table) and {"graphNodeId", "originalGraphNodeId"} <= export.columns(table):
            ev = export.arrays(load_query("graph_node_events", table=table), ["node", "original", "start", "tid"])
            if len(ev["node"]):
                # a node can have two events (its creation, and its cloning at instantiation, which names the
                # original): per node, keep the event that points back to an original, so the chain continues
                order = np.lexsort((-ev["original"], ev["node"]))
                ev = {k: v[order] for k, v in ev.items()}
                first = np.ones(len(ev["node"]), dtype=bool)
                first[1:] = ev["node"][1:] != ev["node"][:-1]
                return {k: v[first] for k, v in ev.items()}
    return None
