"""Where a replayed CUDA-graph kernel "was launched" for NVTX purposes.

NVTX ranges are not emitted when a graph replays, so a replayed kernel's own launch (`cudaGraphLaunch`) sits only
inside step-level ranges. The ranges that were open when its node was captured (layer, block) are recovered from
the node-creation events: exec node -> originalGraphNodeId -> the node created by stream capture, whose time and
thread are the capturing launch's. This works when the profiled window was open during graph capture.

When the graph was captured before the window opened, nsys still records the node-creation events (it needs them
to name replayed nodes) but no NVTX range around them: such ops are "unplaced" here, and only an eager mapping
capture (`profattr.attribute.mapping`) can give them a context.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profattr.attribute.nvtx import Ranges, distinct_points, enclosed
from profattr.trace.ops import Ops

# How an op's NVTX context point was found (Placement.status)
STATUS_LAUNCH = 0  # not replayed from a graph: its own launch call
STATUS_CREATION = 1  # replayed graph node whose capture-time creation lies inside an NVTX range
STATUS_MAPPING = 2  # taken from the matching kernel of an eager mapping capture
STATUS_UNPLACED = 3  # replayed graph node without a usable capture-time context
STATUS_NAMES = {STATUS_LAUNCH: "launch", STATUS_CREATION: "graph_node_creation", STATUS_MAPPING: "mapping",
                STATUS_UNPLACED: "unplaced"}
MAX_HOPS = 4  # exec node -> capture node (-> cloned graph node ...)


def _creation_points(source, ops: Ops):
    """(thread, time) per op at which its NVTX context is read, a boolean per op (a graph op whose node creation was
    found), and a one-line description of the method. Non-graph ops: their launch call; graph ops whose node
    creation was recorded: that creation (the capturing launch's thread and time)."""
    tid, t_ns = ops.launch_tid, ops.launch_ns  # shared, not copied, while nothing changes (millions of ops)
    found = np.zeros(len(ops), dtype=bool)
    graph_ops = np.flatnonzero(ops.graph_node >= 0)
    if len(graph_ops) == 0:
        return tid, t_ns, found, "launch"
    ev = source.node_creation()
    if ev is None:
        return tid, t_ns, found, (f"launch (graph node creation not recorded: {len(graph_ops)} replayed ops only "
                                  "see the ranges around cudaGraphLaunch)")
    tid, t_ns = tid.copy(), t_ns.copy()
    # every replay of a graph repeats its node ids: the chain is followed once per distinct node, then spread
    codes, node = pd.factorize(ops.graph_node[graph_ops])
    placed = np.zeros(len(node), dtype=bool)
    found_start = np.full(len(node), -1, dtype=np.int64)
    found_tid = np.full(len(node), -1, dtype=np.int64)
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
    placed, found_start, found_tid = placed[codes], found_start[codes], found_tid[codes]
    tid[graph_ops[placed]] = found_tid[placed]
    t_ns[graph_ops[placed]] = found_start[placed]
    found[graph_ops[placed]] = True
    return tid, t_ns, found, (f"graph capture ({int(placed.sum())} of {len(graph_ops)} replayed ops placed at "
                              "their node's creation)")


@dataclass
class Placement:
    """Per op: the (thread, time) where its NVTX context is read, and how that point was found (STATUS_*)."""

    tid: np.ndarray
    t_ns: np.ndarray
    status: np.ndarray  # int8, STATUS_*
    method: str  # one line for people
    counts_of_method: "PlacementCounts | None" = None  # what `method` says, in numbers (to merge windows)

    def counts(self, mask=None) -> dict:
        """Ops per status name (over `mask` when given)."""
        status = self.status if mask is None else self.status[mask]
        return {name: int((status == code).sum()) for code, name in STATUS_NAMES.items()}


@dataclass
class PlacementCounts:
    """The numbers behind Placement.method: replayed graph ops, those whose node creation was found, those of them
    inside an NVTX range, and the latest creation time outside every range (None when none)."""

    graph: int = 0
    found: int = 0
    inside: int = 0
    outside_max_ns: int | None = None
    creation_recorded: bool = True

    def add(self, other: "PlacementCounts") -> None:
        self.graph += other.graph
        self.found += other.found
        self.inside += other.inside
        if other.outside_max_ns is not None:
            self.outside_max_ns = (other.outside_max_ns if self.outside_max_ns is None
                                   else max(self.outside_max_ns, other.outside_max_ns))
        self.creation_recorded = self.creation_recorded and other.creation_recorded

    def method(self, ranges: Ranges) -> str:
        if self.graph == 0:
            return "launch"
        if not self.creation_recorded:
            return (f"launch (graph node creation not recorded: {self.graph} replayed ops only "
                    "see the ranges around cudaGraphLaunch)")
        method = (f"graph capture ({self.found} of {self.graph} replayed ops placed at "
                  "their node's creation)")
        if self.found and self.inside < self.found:
            frame = ranges.frame
            if not len(frame):
                why = "the capture has no NVTX ranges"
            elif self.outside_max_ns < int(frame["start"].min()):
                why = "the graph was captured before the profiled window"
            else:
                why = "no NVTX range was open there"
            method = (f"graph capture ({self.inside} of {self.graph} replayed ops placed at their node's creation; "
                      f"{self.found - self.inside} created outside every NVTX range: {why})")
        return method


def place_contexts(source, ops: Ops, ranges: Ranges) -> Placement:
    """Context points of all ops, and which replayed graph ops really have a capture-time NVTX context.

    A graph op counts as placed at its node's creation only when that creation lies inside at least one NVTX range
    of the creating thread: a creation recorded before the profiled window carries no range at all, and reading
    layers or NVTX-context rules there would silently put every replayed kernel outside every module.
    """
    tid, t_ns, found, how = _creation_points(source, ops)
    status = np.full(len(ops), STATUS_LAUNCH, dtype=np.int8)
    graph = ops.graph_node >= 0
    counts = PlacementCounts(graph=int(graph.sum()))
    if not graph.any():
        return Placement(tid, t_ns, status, counts.method(ranges), counts)
    counts.creation_recorded = not how.startswith("launch")  # 'launch (graph node creation not recorded...)'
    frame = ranges.frame
    inside = np.zeros(len(ops), dtype=bool)
    if len(frame) and found.any():
        idx = np.flatnonzero(found)
        point_tid, point_ns, point = distinct_points(tid[idx], t_ns[idx])  # replays share their creation point
        inside[idx] = enclosed(frame["tid"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy(),
                               point_tid, point_ns)[point]
    status[graph] = np.where(inside[graph], STATUS_CREATION, STATUS_UNPLACED)
    counts.found, counts.inside = int(found.sum()), int(inside.sum())
    if counts.found and counts.inside < counts.found:
        counts.outside_max_ns = int(t_ns[found & ~inside].max())
    return Placement(tid, t_ns, status, counts.method(ranges), counts)
