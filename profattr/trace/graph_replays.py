"""GPU ops replayed from a CUDA graph that carry no correlationId (0): each is linked to its graph's launch call.

A replayed node normally shares the correlationId of the `cudaGraphLaunch` that replayed it, which is how every op
reaches its launch call and through it its step. Newer Nsight Systems releases are reported to give the kernels of
graphs built before the capture started a correlationId of 0 instead; SGLang builds its graphs at start-up, so a
join on the runtime table alone would leave every replayed kernel outside every step.

Such ops (correlationId 0 and a graph node id) are linked here, per process, from what the export holds without
the id: the replays of a graph run one after the other on the GPU and each runs every node once, so the k-th
execution of a node (in GPU start order; per graph when the kernel table has `graphId`, nsys 2025+) belongs to the
k-th replay.
Replays are put in start order and must not overlap; the launch calls they pair with are the process's
`cudaGraphLaunch` calls that no kernel names by correlationId, in start order, and each must start before its replay's
first op. When any of that does not hold (a replay cut by the window, interleaved graphs without `graphId`) the
process's ops stay unlinked: counted, warned about and named by `check`, never silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profattr.arrays import unique
from profattr.trace.ops import KIND_KERNEL, LOW32


@dataclass
class ReplayLinks:
    """What was linked: ops with correlationId 0 in a graph, those linked to a launch, the replays they formed,
    and why the rest were not (one reason per process left unlinked)."""

    ops: int = 0
    linked: int = 0
    replays: int = 0
    reasons: tuple = ()

    def to_dict(self) -> dict:
        return {"ops": self.ops, "linked": self.linked, "replays": self.replays, "unlinked": self.ops - self.linked,
                "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "ReplayLinks | None":
        if not isinstance(d, dict):
            return None
        return cls(int(d.get("ops", 0)), int(d.get("linked", 0)), int(d.get("replays", 0)),
                   tuple(str(r) for r in d.get("reasons") or ()))

    def sentence(self) -> str:
        text = (f"{self.ops} GPU op(s) replayed from CUDA graphs carry correlationId 0 (graphs built before the "
                f"capture started, as newer nsys releases record them): {self.linked} linked to their "
                f"cudaGraphLaunch by replay order ({self.replays} replays)")
        if self.linked < self.ops:
            text += (f", {self.ops - self.linked} not ({'; '.join(self.reasons)}): they belong to no step")
        return text


def candidates(launch_key: np.ndarray, graph_node: np.ndarray) -> np.ndarray:
    """Which ops are replayed graph nodes without a correlationId."""
    return ((launch_key & LOW32) == 0) & (graph_node >= 0) & (launch_key >= 0)


def link(launch_key: np.ndarray, start: np.ndarray, graph_node: np.ndarray, launches: dict | None,
         graph_id: np.ndarray | None = None, named: np.ndarray | None = None):
    """(rows, keys, tids, starts, ReplayLinks): for the ops without a correlationId that could be linked, their row,
    their launch's key, thread and start. `launches`: graph launch calls (start, tid, correlation), as
    nsys_tables.graph_launches gives them; `graph_id`: the kernel table's graphId per op, when it has one;
    `named`: the launch keys kernels with a correlationId carry (see named_keys; default: those of all the ops
    given)."""
    cand = candidates(launch_key, graph_node)
    rows = np.flatnonzero(cand)
    empty = np.zeros(0, dtype=np.int64)
    if not len(rows):
        return empty, empty, empty, empty, None
    stats = ReplayLinks(ops=len(rows))
    if launches is None or not len(launches["start"]):
        stats.reasons = ("the capture has no cudaGraphLaunch call",)
        return empty, empty, empty, empty, stats
    l_process = (launches["tid"] >> 24) & LOW32
    l_key = (l_process << 32) | (launches["correlation"] & LOW32)
    named = unique(launch_key[~cand]) if named is None else named
    free = ~np.isin(l_key, named)  # launches no op names: the ones whose replays lack the id
    process = launch_key[rows] >> 32
    out_rows, out_keys, out_tids, out_starts, reasons = [], [], [], [], []
    for p in unique(process):
        r = rows[process == p]
        r = r[np.argsort(start[r], kind="stable")]
        gid = graph_id[r] if graph_id is not None else np.zeros(len(r), dtype=np.int64)
        node = graph_node[r]
        # the k-th execution of a node (per graph) is in the k-th replay of that graph
        order = np.lexsort((np.arange(len(r)), node, gid))
        same = np.r_[False, (node[order][1:] == node[order][:-1]) & (gid[order][1:] == gid[order][:-1])]
        run_start = np.maximum.accumulate(np.where(~same, np.arange(len(r)), 0))
        occurrence = np.empty(len(r), dtype=np.int64)
        occurrence[order] = np.arange(len(r)) - run_start
        labels, replay = np.unique(np.stack([gid, occurrence]), axis=1, return_inverse=True)
        replay = replay.reshape(-1)
        n_replays = labels.shape[1]
        first = np.full(n_replays, np.iinfo(np.int64).max)
        last = np.full(n_replays, np.iinfo(np.int64).min)
        np.minimum.at(first, replay, start[r])
        np.maximum.at(last, replay, start[r])
        by_time = np.argsort(first, kind="stable")
        sel = free & (l_process == p)
        l_start, l_tid, l_keys = launches["start"][sel], launches["tid"][sel], l_key[sel]
        lo = np.argsort(l_start, kind="stable")
        l_start, l_tid, l_keys = l_start[lo], l_tid[lo], l_keys[lo]
        if n_replays > 1 and (first[by_time][1:] <= last[by_time][:-1]).any():
            reasons.append(f"process {int(p)}: its replays overlap in time (several graphs interleaved, and no "
                           "graphId to tell them apart)")
            continue
        if n_replays != len(l_start):
            reasons.append(f"process {int(p)}: {n_replays} replays but {len(l_start)} cudaGraphLaunch calls without "
                           "GPU work of their own")
            continue
        if (l_start > first[by_time]).any():
            reasons.append(f"process {int(p)}: a replay starts before the launch call it would pair with")
            continue
        rank = np.empty(n_replays, dtype=np.int64)
        rank[by_time] = np.arange(n_replays)
        which = rank[replay]  # the launch of each op's replay
        out_rows.append(r)
        out_keys.append(l_keys[which])
        out_tids.append(l_tid[which])
        out_starts.append(l_start[which])
        stats.replays += n_replays
    if out_rows:
        stats.linked = int(sum(len(x) for x in out_rows))
    stats.reasons = tuple(reasons)
    cat = lambda parts: np.concatenate(parts) if parts else empty  # noqa: E731
    return cat(out_rows), cat(out_keys), cat(out_tids), cat(out_starts), stats


def graph_ids(export, launch_key: np.ndarray, start: np.ndarray, graph_node: np.ndarray) -> np.ndarray | None:
    """The kernel table's graphId of each op (-1 where it has none), when the export has that column (nsys 2025+);
    matched by (process, start, graph node), which one replay never repeats."""
    from profattr.trace.nsys_sqlite import KERNEL, load_query

    if not export.has(KERNEL) or "graphId" not in export.columns(KERNEL):
        return None
    rows = export.arrays(load_query("replay_graph_ids"), ["process", "start", "node", "graph"])
    out = np.full(len(start), -1, dtype=np.int64)
    if not len(rows["start"]):
        return out
    order = np.lexsort((rows["node"], rows["start"], rows["process"]))
    table = np.stack([rows["process"][order], rows["start"][order], rows["node"][order]])
    mine = np.stack([launch_key >> 32, start, graph_node])
    # a sorted join on the three columns, as one lexicographic search (structured views compare field by field)
    dtype = np.dtype([("p", np.int64), ("s", np.int64), ("n", np.int64)])
    keys = np.ascontiguousarray(table.T).view(dtype).reshape(-1)
    want = np.ascontiguousarray(mine.T).view(dtype).reshape(-1)
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    hit = keys[pos] == want
    out[hit] = rows["graph"][order][pos[hit]]
    return out


def named_keys(launch_key: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The launch keys that kernels with a correlationId carry: a graph launch none of them names is one whose
    replayed kernels lack the id (its memcpy and memset nodes may still carry it)."""
    return unique(launch_key[(kind == KIND_KERNEL) & ((launch_key & LOW32) != 0)])


def apply(ops, launches: dict | None, graph_id: np.ndarray | None = None):
    """`ops` (trace/ops.py Ops) with the ops lacking a correlationId linked in place; the ReplayLinks or None."""
    rows, keys, tids, starts, stats = link(ops.launch_key, ops.start, ops.graph_node, launches, graph_id,
                                           named=named_keys(ops.launch_key, ops.kind))
    if len(rows):
        ops.launch_key[rows] = keys
        ops.launch_tid[rows] = tids
        ops.launch_ns[rows] = starts
        ops.launched[rows] = True
    return stats
