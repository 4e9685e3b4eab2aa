"""What a CUDA-graph launch costs, as the export recorded it: each cudaGraphLaunch call with the first GPU work it
launched, and every GPU interval, whether the graph was traced per node (its kernels are in the kernel table) or
as a whole (CUPTI_ACTIVITY_KIND_GRAPH_TRACE, nsys --cuda-graph-trace=graph). SQL lives in queries/.
"""
from __future__ import annotations

from profattr.trace.reader import KERNEL, MEMCPY, MEMSET, RUNTIME, Export, load_query

GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def graph_tracing(export: Export) -> str | None:
    """How the export traced graph replays: "graph" (one activity per replay), "node" (its kernels, with graph
    node ids), or None (no graph launch recorded)."""
    launches = export.query("SELECT count(*) FROM StringIds WHERE value LIKE 'cudaGraphLaunch%' "
                            "OR value LIKE 'cuGraphLaunch%'")[0][0] if export.has(RUNTIME) else 0
    if not launches:
        return None
    if export.has(GRAPH_TRACE) and export.count(GRAPH_TRACE):
        return "graph"
    return "node"


def launch_gpu_starts(export: Export) -> dict | None:
    """Arrays start, end (the call on the host), tid, gpu_start, device (-1 where no GPU work was found) of every
    graph launch, in call order; None without kernels or launch calls."""
    if not (export.has(RUNTIME) and export.has(KERNEL)):
        return None
    graph = (f"UNION ALL SELECT g.correlationId, g.start, g.deviceId FROM {GRAPH_TRACE} AS g "
             "WHERE g.correlationId IN (SELECT correlationId FROM launch)") if export.has(GRAPH_TRACE) else ""
    out = export.arrays(load_query("graph_launch_gpu_start", graph_trace=graph),
                        ["start", "end", "tid", "gpu_start", "device"])
    return out if len(out["start"]) else None


def gpu_intervals(export: Export) -> dict:
    """Arrays start, end, device of every GPU activity (kernels, memory copies and sets, whole-graph replays)."""
    union = "UNION ALL SELECT start, \"end\", deviceId FROM {}"
    return export.arrays(load_query(
        "gpu_intervals", graph_trace_note=" and whole-graph replays",
        memcpy=union.format(MEMCPY) if export.has(MEMCPY) else "",
        memset=union.format(MEMSET) if export.has(MEMSET) else "",
        graph_trace=union.format(GRAPH_TRACE) if export.has(GRAPH_TRACE) else ""), ["start", "end", "device"])
