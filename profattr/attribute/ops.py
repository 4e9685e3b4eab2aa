"""GPU work of a capture as flat arrays: kernels, memcpys and memsets, each linked to the CPU call that launched it.

A GPU activity links to its launch through (process, correlationId): the runtime row with the same correlationId
whose thread belongs to the activity's process (`globalPid == globalTid & ~0xFFFFFF`). Graph replays are one
launch (`cudaGraphLaunch`) whose nodes all share its correlationId.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profattr.errors import ProfattrError
from profattr.trace.reader import KERNEL, MEMCPY, MEMSET, RUNTIME, Export, load_query

PID_MASK = np.int64(~0xFFFFFF)  # keeps hardware, VM and process bits of a globalTid

# Op kinds
KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2

COPY_KINDS = {0: "unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}


@dataclass
class Ops:
    """One row per GPU activity, as parallel arrays (int64 unless noted).

    `name_id` / `demangled_id` are StringIds ids for kernels; for memory ops they are negative codes
    (-1 - copyKind for memcpy, -100 for memset). `launch_tid` / `launch_ns` are the launching thread and the
    start of the launch call (-1 when no launch call was recorded).
    """

    start: np.ndarray
    end: np.ndarray
    device: np.ndarray
    correlation: np.ndarray
    pid: np.ndarray
    name_id: np.ndarray
    demangled_id: np.ndarray
    graph_node: np.ndarray
    stream: np.ndarray
    kind: np.ndarray  # int8
    launch_tid: np.ndarray
    launch_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end - self.start

    def take(self, index) -> "Ops":
        return Ops(**{k: v[index] for k, v in self.__dict__.items()})


def memop_name(code: int) -> str:
    """Display name of a memory op's negative name code."""
    if code == -100:
        return "[CUDA memset]"
    return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, str(-1 - code))}]"


def _optional(export: Export, table: str, alias: str) -> dict:
    return {"graph_node_id": f"COALESCE({export.column_or(table, 'graphNodeId', alias, '-1')}, -1)",
            "stream_id": f"COALESCE({export.column_or(table, 'streamId', alias, '-1')}, -1)"}


def load_ops(export: Export, include_memory: bool = True) -> Ops:
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
    cols = ["start", "end", "device", "correlation", "pid", "name_id", "demangled_id", "graph_node", "stream"]
    parts = [export.arrays(load_query("gpu_kernels", **_optional(export, KERNEL, "k")), cols)]
    kinds = [np.full(len(parts[0]["start"]), KIND_KERNEL, dtype=np.int8)]
    tables = [KERNEL]
    if include_memory and export.has(MEMCPY):
        m = export.arrays(load_query("gpu_memcpy", **_optional(export, MEMCPY, "m")),
                          ["start", "end", "device", "correlation", "pid", "copy_kind", "bytes", "graph_node",
                           "stream"])
        m["name_id"] = m["demangled_id"] = -1 - m.pop("copy_kind")
        m.pop("bytes")
        parts.append(m)
        kinds.append(np.full(len(m["start"]), KIND_MEMCPY, dtype=np.int8))
        tables.append(MEMCPY)
    if include_memory and export.has(MEMSET):
        m = export.arrays(load_query("gpu_memset", **_optional(export, MEMSET, "m")),
                          ["start", "end", "device", "correlation", "pid", "bytes", "graph_node", "stream"])
        m.pop("bytes")
        m["name_id"] = m["demangled_id"] = np.full(len(m["start"]), -100, dtype=np.int64)
        parts.append(m)
        kinds.append(np.full(len(m["start"]), KIND_MEMSET, dtype=np.int8))
        tables.append(MEMSET)
    merged = {c: np.concatenate([p[c] for p in parts]) for c in cols}
    kind = np.concatenate(kinds)
    launch_tid, launch_ns = _join_launches(export, tables, merged["pid"], merged["correlation"])
    return Ops(kind=kind, launch_tid=launch_tid, launch_ns=launch_ns, **merged)


def _join_launches(export: Export, tables, pid: np.ndarray, corr: np.ndarray):
    """For each activity, the thread and start time of its launch call (-1 when absent), by a sorted-key join."""
    n = len(pid)
    tid_out = np.full(n, -1, dtype=np.int64)
    ns_out = np.full(n, -1, dtype=np.int64)
    if not export.has(RUNTIME) or n == 0:
        return tid_out, ns_out
    union = " UNION ALL ".join(f"SELECT correlationId FROM {t}" for t in tables)
    calls = export.arrays(load_query("launch_calls", gpu_correlations=union),
                          ["correlation", "tid", "start", "end", "name_id"])
    if len(calls["tid"]) == 0:
        return tid_out, ns_out
    # key = (process index, correlationId): correlationIds are 32-bit and unique within a process
    call_pid = calls["tid"] & PID_MASK
    pids, inverse = np.unique(np.concatenate([call_pid, pid]), return_inverse=True)
    call_key = (inverse[:len(call_pid)].astype(np.int64) << 32) | (calls["correlation"] & 0xFFFFFFFF)
    op_key = (inverse[len(call_pid):].astype(np.int64) << 32) | (corr & 0xFFFFFFFF)
    order = np.argsort(call_key, kind="stable")
    sorted_keys = call_key[order]
    pos = np.searchsorted(sorted_keys, op_key)
    pos_clipped = np.minimum(pos, len(sorted_keys) - 1)
    found = sorted_keys[pos_clipped] == op_key
    hit = order[pos_clipped[found]]
    tid_out[found] = calls["tid"][hit]
    ns_out[found] = calls["start"][hit]
    return tid_out, ns_out
