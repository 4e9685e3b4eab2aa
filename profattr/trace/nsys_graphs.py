"""What a CUDA-graph launch costs, as the export recorded it: each cudaGraphLaunch call with the first GPU work it
launched, and every GPU interval, whether the graph was traced per node (its kernels are in the kernel table) or
as a whole (CUPTI_ACTIVITY_KIND_GRAPH_TRACE, nsys --cuda-graph-trace=graph). SQL lives in queries/.
"""
from __future__ import annotations

import numpy as np

from profattr.arrays import unique
from profattr.trace.ops import KIND_KERNEL, LOW32
from profattr.trace.nsys_sqlite import KERNEL, MEMCPY, MEMSET, RUNTIME, NsysTables, load_query

GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def graph_tracing(export: NsysTables) -> str | None:
    """How the export traced graph replays: "graph" (one activity per replay), "node" (its kernels, with graph
    node ids), or None (no graph launch recorded)."""
    launches = export.query("SELECT count(*) FROM StringIds WHERE value LIKE 'cudaGraphLaunch%' "
                            "OR value LIKE 'cuGraphLaunch%'")[0][0] if export.has(RUNTIME) else 0
    if not launches:
        return None
    if export.has(GRAPH_TRACE) and export.count(GRAPH_TRACE):
        return "graph"
    return "node"


def launch_gpu_starts(export: NsysTables) -> dict | None:
    """Arrays start, end (the call on the host), tid, gpu_start, device (-1 where no GPU work was found) of every
    graph launch, in call order; None without kernels or launch calls."""
    if not (export.has(RUNTIME) and export.has(KERNEL)):
        return None
    graph = (f"UNION ALL SELECT g.correlationId, g.globalPid >> 24, g.start, g.deviceId FROM {GRAPH_TRACE} AS g "
             "WHERE g.correlationId IN (SELECT correlationId FROM launch)") if export.has(GRAPH_TRACE) else ""
    out = export.arrays(load_query("graph_launch_gpu_start", graph_trace=graph),
                        ["start", "end", "tid", "gpu_start", "device"])
    return out if len(out["start"]) else None


def gpu_intervals(export: NsysTables) -> dict:
    """Arrays start, end, device of every GPU activity (kernels, memory copies and sets, whole-graph replays)."""
    union = "UNION ALL SELECT start, \"end\", deviceId FROM {}"
    return export.arrays(load_query(
        "gpu_intervals", graph_trace_note=" and whole-graph replays",
        memcpy=union.format(MEMCPY) if export.has(MEMCPY) else "",
        memset=union.format(MEMSET) if export.has(MEMSET) else "",
        graph_trace=union.format(GRAPH_TRACE) if export.has(GRAPH_TRACE) else ""), ["start", "end", "device"])


def store_launch_gpu_starts(store) -> dict | None:
    """launch_gpu_starts from a capture's op store (trace/store.py), read a window at a time: the store's graph
    launch calls (the same rows as queries/graph_launches.sql), each with the first start and the lowest device of
    the kernels whose launch key (process and correlationId, as the kernels' own) is the call's; None without
    launch calls, or where the store holds no kernel rows. A replayed kernel without a correlationId that the store
    linked to its launch (trace/graph_replays.py) counts for that launch."""
    g = store.graph_launches()
    if g is None or not len(g["start"]) or not store.rows:
        return None
    order = np.argsort(g["start"], kind="stable")  # call order, as the query's ORDER BY start
    g = {k: np.asarray(v, dtype=np.int64)[order] for k, v in g.items()}
    corr = g["correlation"]
    fits = (corr >= 0) & (corr <= LOW32)
    key = np.where(fits, (((g["tid"] >> 24) & LOW32) << 32) | corr, -2)  # -2: matches no kernel's key
    keys = unique(key)
    first = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
    device = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
    for lo, hi in store.bounds():
        kernel = store.column("kind", lo, hi) == KIND_KERNEL
        launch = store.column("launch_key", lo, hi)[kernel]
        pos = np.minimum(np.searchsorted(keys, launch), len(keys) - 1)
        hit = keys[pos] == launch
        np.minimum.at(first, pos[hit], store.column("start", lo, hi)[kernel][hit])
        np.minimum.at(device, pos[hit], store.column("device", lo, hi)[kernel][hit].astype(np.int64))
    at = np.searchsorted(keys, key)
    none = first[at] == np.iinfo(np.int64).max
    return {"start": g["start"], "end": g["end"], "tid": g["tid"],
            "gpu_start": np.where(none, -1, first[at]), "device": np.where(none, -1, device[at])}


def store_gpu_windows(store):
    """gpu_intervals from a capture's op store, a window of rows at a time: arrays start, end, device of its
    kernels, memory copies and sets (a store holds no whole-graph replays)."""
    for lo, hi in store.bounds():
        yield {"start": store.column("start", lo, hi), "end": store.column("end", lo, hi),
               "device": store.column("device", lo, hi)}
