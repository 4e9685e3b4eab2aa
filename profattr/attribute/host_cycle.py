"""The host's own time per decode step, apart from the GPU: what a projection carries over as measured.

From the CUDA calls of the thread that launches the step's CUDA graphs (the thread with the most graph launches):
- host cycle: the time from one graph launch call to the next, less the time the thread spent in synchronizing
  calls (cudaEventSynchronize etc.) in between: how long the host needs per step when it never waits for the GPU;
- host lead: from the start of the innermost NVTX range that encloses a graph launch (SGLang's step[DECODE ...]
  range, inside which the step's eager kernels are launched) to the end of the graph launch call: the host time
  before the GPU can run the step's graph. A step bound by the host takes at least this lead plus the graph's GPU
  time.
Medians over the capture's graph launches. Under nsys node-level graph tracing (--cuda-graph-trace=node) a
cudaGraphLaunch call costs far more host time than unprofiled; both figures include that.
"""
from __future__ import annotations

import numpy as np

from profattr.trace.reader import load_query

NS_PER_MS = 1e6
SYNC_KIND = 3  # api_calls(): 3 synchronization


def host_cycle(trace) -> dict | None:
    """{"host_cycle_ms", "host_lead_ms", "graph_launches", "sync_ms_per_step", "launch_call_ms"} of a reader
    (trace/protocol.py), or None when it records no graph launches (an eager capture), no CUDA calls, or is not an
    nsys export (the launch SQL needs its tables)."""
    tables = trace.nsys_tables()
    if tables is None or not tables.has("CUPTI_ACTIVITY_KIND_RUNTIME"):
        return None
    sql = load_query("host_graph_launch_lead" if tables.has("NVTX_EVENTS") else "host_graph_launches")
    g = tables.arrays(sql, ["tid", "start", "end", "range_start"])
    if len(g["tid"]) < 2:
        return None
    tids, counts = np.unique(g["tid"], return_counts=True)
    tid = tids[np.argmax(counts)]
    on = g["tid"] == tid
    start, end, range_start = g["start"][on], g["end"][on], g["range_start"][on]
    api = trace.api_calls()
    sync = (api["kind"] == SYNC_KIND) & (api["tid"] == tid)
    ss, se = np.sort(api["start"][sync]), np.sort(api["end"][sync])
    period = np.diff(start)
    waits = _overlap(ss, se, start[:-1], start[1:])
    lead = (end - range_start)[range_start >= 0]
    return {"graph_launches": int(len(start)),
            "host_cycle_ms": float(np.median(period - waits)) / NS_PER_MS,
            "period_ms": float(np.median(period)) / NS_PER_MS,
            "sync_ms_per_step": float(np.median(waits)) / NS_PER_MS,
            "host_lead_ms": float(np.median(lead)) / NS_PER_MS if len(lead) else None,
            "launch_call_ms": float(np.median(end - start)) / NS_PER_MS}


def _overlap(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo, hi): total overlap (ns) with the intervals [s, e) (one thread's calls: disjoint, sorted)."""
    if len(s) == 0:
        return np.zeros(len(lo), dtype=np.int64)
    dur = np.concatenate([[0], np.cumsum(e - s)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(s, t, side="right")  # calls starting at or before t
        partial = np.where(i > 0, np.clip(t - s[np.maximum(i - 1, 0)], 0, None)
                           - np.clip(t - e[np.maximum(i - 1, 0)], 0, None), 0)
        return dur[np.maximum(i - 1, 0)] * (i > 0) + partial

    return covered(hi) - covered(lo)
