"""What launching a CUDA graph costs, and how much of that the profiler adds.

Per capture (`launch_costs`): for every cudaGraphLaunch, the call's time on the host, the time from the call to the
first GPU work it launched, and how long the GPU sat idle right before that work (0 when other work was running).
Under nsys's per-node graph tracing (`--cuda-graph-trace=node`, what gives kernels one by one) a launch of a few
hundred nodes costs the host far more than unprofiled; under graph-level tracing (`--cuda-graph-trace=graph`) the
launch costs what it costs, but the kernels inside are not seen. `tracing_cost` sets a per-node capture against a
graph-level twin of the same decode: what per-node tracing adds to each launch, and whether the GPU's wait before a
replay is still there without it, which is what makes "the GPU waits for the host" a claim about the decode and not
about the profiler.
"""
from __future__ import annotations

import numpy as np

from profattr.arrays import unique
from profattr.trace.nsys_graphs import graph_tracing

NS_PER_US = 1e3
# the wait before replays is confirmed without per-node tracing when the twin keeps at least this share of it
CONFIRM_SHARE = 0.5
CONFIRM_MIN_US = 20.0


class IdleBefore:
    """For each time in `at`: how long the GPU was idle right before it (0 when an interval covers it or touches
    it); NaN when no interval ended before it. The GPU's intervals are added in any number of parts (`add`): the
    intervals started and ended before a time, and the last end before it, add up over the parts."""

    def __init__(self, at: np.ndarray):
        self.at = at
        self.started = np.zeros(len(at), dtype=np.int64)
        self.ended = np.zeros(len(at), dtype=np.int64)
        self.prev = np.full(len(at), -1, dtype=np.int64)

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        s, e = np.sort(starts), np.sort(ends)
        self.started += np.searchsorted(s, self.at, side="left")
        before = np.searchsorted(e, self.at, side="left")
        self.ended += before
        self.prev = np.where(before > 0, np.maximum(self.prev, e[np.maximum(before - 1, 0)]), self.prev)

    def result(self) -> np.ndarray:
        running = self.started - self.ended > 0
        out = np.where(running, 0.0, (self.at - self.prev).astype(float))
        out[(self.ended == 0) & ~running] = np.nan
        return out


def launch_costs(source) -> dict | None:
    """Medians over a capture's graph launches (µs): `call_us` on the host, `call_to_gpu_us` from the call to its
    first GPU work, `wait_us` the GPU's idle right before that work; with `tracing` (node or graph) and
    `launches`. None for a capture without graph launches or one that is not an nsys export. The reader gives the
    launches and the GPU's intervals (from its op store a window at a time where it has one, else by SQL)."""
    tables = source.nsys_tables()
    if tables is None:
        return None
    mode = graph_tracing(tables)
    g = source.launch_gpu_starts() if mode else None
    if g is None:
        return None
    seen = g["gpu_start"] >= 0
    if not seen.any():
        return None
    wait = np.full(len(g["start"]), np.nan)
    devices = unique(g["device"][seen])
    mine = {device: seen & (g["device"] == device) for device in devices}
    idle = {device: IdleBefore(g["gpu_start"][mine[device]]) for device in devices}
    for iv in source.gpu_interval_windows():
        for device in devices:
            on = iv["device"] == device
            idle[device].add(iv["start"][on], iv["end"][on])
    for device in devices:
        wait[mine[device]] = idle[device].result()
    call = (g["end"] - g["start"]) / NS_PER_US
    to_gpu = (g["gpu_start"][seen] - g["start"][seen]) / NS_PER_US
    waits = wait[~np.isnan(wait)] / NS_PER_US
    return {"tracing": mode, "launches": int(len(call)), "launches_with_gpu_work": int(seen.sum()),
            "call_us": float(np.median(call)), "call_to_gpu_us": float(np.median(to_gpu)),
            "wait_us": float(np.median(waits)) if len(waits) else None,
            "waited_share": float(np.mean(waits > 0)) if len(waits) else None}


def tracing_cost(node: dict | None, graph: dict | None) -> dict | None:
    """A per-node capture's launch costs against a graph-level twin's: `call_us_added` per launch by per-node
    tracing, the two waits, the share of the per-node wait that the twin does not have (`profiler_share_of_wait`),
    and `confirmed`: the wait is there without per-node tracing too. None unless one of each is given."""
    if not node or not graph or node.get("tracing") != "node" or graph.get("tracing") != "graph":
        return None
    wn, wg = node.get("wait_us"), graph.get("wait_us")
    out = {"call_us": {"node": node["call_us"], "graph": graph["call_us"]},
           "call_us_added": node["call_us"] - graph["call_us"],
           "call_to_gpu_us": {"node": node["call_to_gpu_us"], "graph": graph["call_to_gpu_us"]},
           "wait_us": {"node": wn, "graph": wg}, "profiler_share_of_wait": None, "confirmed": None}
    if wn is not None and wg is not None:
        out["profiler_share_of_wait"] = max(0.0, (wn - wg) / wn) if wn > 0 else 0.0
        out["confirmed"] = bool(wg >= max(CONFIRM_SHARE * wn, CONFIRM_MIN_US))
    return out


def describe(cost: dict) -> str:
    """One sentence: what per-node tracing adds to a launch and whether the wait before replays is the decode's."""
    c, w = cost["call_us"], cost["wait_us"]
    text = (f"per-node graph tracing adds {cost['call_us_added']:.0f} µs to each cudaGraphLaunch on the host "
            f"({c['node']:.0f} µs against {c['graph']:.0f} µs in the graph-level twin)")
    if cost.get("confirmed") is None:
        return text
    text += (f"; the GPU waits {w['node']:.0f} µs before a replay with it and {w['graph']:.0f} µs without")
    if cost["confirmed"]:
        return text + ": the wait is the decode's (host-bound), not only the profiler's"
    return (text + f": {100 * cost['profiler_share_of_wait']:.0f}% of that wait is the profiler's; the decode's own "
            f"wait is about {w['graph']:.0f} µs per replay")


def costs_of(path) -> dict | None:
    """launch_costs of the capture at `path` (a .sqlite export, or a .nsys-rep exported beside it), from its op
    store where it has one."""
    from profattr.trace.cache import store_or_export
    from profattr.trace.reader import resolve_capture
    from profattr.trace.source import open_trace

    with open_trace(resolve_capture(path)) as source:
        reader = store_or_export(source)
        try:
            return launch_costs(reader)
        finally:
            if reader is not source:
                reader.close()
