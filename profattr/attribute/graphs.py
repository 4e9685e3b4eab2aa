"""Where a replayed CUDA-graph kernel "was launched" for NVTX purposes.

NVTX ranges are not emitted when a graph replays, so a replayed kernel's own launch (`cudaGraphLaunch`) sits only
inside step-level ranges. The ranges that were open when its node was captured (layer, block) are recovered from
the node-creation events: exec node -> originalGraphNodeId -> the node created by stream capture, whose time and
thread are the capturing launch's. This works when the profiled window was open during graph capture.
"""
from __future__ import annotations

import numpy as np

from profattr.attribute.ops import Ops
from profattr.trace.reader import Export, load_query

NODE_TABLES = ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS")
MAX_HOPS = 4  # exec node -> capture node (-> cloned graph node ...)


def node_creation(export: Export):
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


def context_points(export: Export, ops: Ops):
    """(thread, time) per op at which its NVTX context is read, and a one-line description of the method.

    Non-graph ops: their launch call. Graph ops whose capture-time node creation was recorded: that creation.
    """
    tid, t_ns = ops.launch_tid.copy(), ops.launch_ns.copy()
    graph_ops = np.flatnonzero(ops.graph_node >= 0)
    if len(graph_ops) == 0:
        return tid, t_ns, "launch"
    ev = node_creation(export)
    if ev is None:
        return tid, t_ns, (f"launch (graph node creation not recorded: {len(graph_ops)} replayed ops only see "
                           "the ranges around cudaGraphLaunch)")
    node = ops.graph_node[graph_ops]
    placed = np.zeros(len(graph_ops), dtype=bool)
    found_start = np.full(len(graph_ops), -1, dtype=np.int64)
    found_tid = np.full(len(graph_ops), -1, dtype=np.int64)
    current = node
    for _ in range(MAX_HOPS):
        pos = np.searchsorted(ev["node"], current)
        pos_c = np.minimum(pos, len(ev["node"]) - 1)
        hit = ev["node"][pos_c] == current
        if not hit.any():
            break
        # the deepest node reached so far gives the capture-time point
        found_start[hit] = ev["start"][pos_c[hit]]
        found_tid[hit] = ev["tid"][pos_c[hit]]
        placed |= hit
        nxt = np.where(hit, ev["original"][pos_c], -1)
        if (nxt < 0).all():
            break
        current = np.where(nxt >= 0, nxt, current)
        # stop following ops whose chain ended
        current = np.where(hit & (nxt >= 0), current, -2)
    tid[graph_ops[placed]] = found_tid[placed]
    t_ns[graph_ops[placed]] = found_start[placed]
    return tid, t_ns, (f"graph capture ({int(placed.sum())} of {len(graph_ops)} replayed ops placed at their "
                       "node's creation)")
