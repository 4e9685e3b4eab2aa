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
    pid: np.ndarray  # VM and process bits of the globalPid (globalPid >> 24)
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
            "stream_id": f"COALESCE({export.column_or(table, 'streamId', alias, '0')}, 0)"}


PACKED_COLS = ["start", "end", "packed", "launch_key", "graph_node"]
LOW32 = np.int64(0xFFFFFFFF)


def _fetch(export: Export, table: str, query: str) -> dict:
    return export.arrays(load_query(query, **_optional(export, table, "k" if table == KERNEL else "m")),
                         PACKED_COLS, max_rows=export.count(table))


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
    parts = [(_fetch(export, KERNEL, "gpu_kernels"), KIND_KERNEL)]
    tables = [KERNEL]
    if include_memory:
        for table, query, kind in ((MEMCPY, "gpu_memcpy", KIND_MEMCPY), (MEMSET, "gpu_memset", KIND_MEMSET)):
            if export.has(table):
                parts.append((_fetch(export, table, query), kind))
                tables.append(table)
    cols = {c: np.concatenate([p[c] for p, _ in parts]) if len(parts) > 1 else parts[0][0][c]
            for c in PACKED_COLS}
    kind = np.concatenate([np.full(len(p["start"]), k, dtype=np.int8) for p, k in parts])
    packed = cols.pop("packed")
    low = packed & LOW32
    # names: kernels carry their demangled-name id; memory ops get negative codes (see Ops)
    demangled_id = np.where(kind == KIND_KERNEL, low, np.where(kind == KIND_MEMCPY, -1 - low, -100))
    name_id = _short_names(export, demangled_id)
    key = cols.pop("launch_key")
    launch_tid, launch_ns = _join_launches(export, tables, key)
    return Ops(start=cols["start"], end=cols["end"], device=packed >> 56, correlation=key & LOW32, pid=key >> 32,
               name_id=name_id, demangled_id=demangled_id, graph_node=cols["graph_node"],
               stream=(packed >> 32) & 0xFFFFFF, kind=kind, launch_tid=launch_tid, launch_ns=launch_ns)


def _short_names(export: Export, demangled_id: np.ndarray) -> np.ndarray:
    """Short-name id per op, from the (demangled, short) pairs of the kernel table (few distinct names)."""
    pairs = np.array(export.query(load_query("kernel_names")), dtype=np.int64).reshape(-1, 2)
    out = demangled_id.copy()
    if len(pairs):
        order = np.argsort(pairs[:, 0])
        keys, vals = pairs[order, 0], pairs[order, 1]
        pos = np.clip(np.searchsorted(keys, demangled_id), 0, len(keys) - 1)
        hit = (keys[pos] == demangled_id) & (demangled_id >= 0)
        out[hit] = vals[pos[hit]]
    return out


def _join_launches(export: Export, tables, op_key: np.ndarray):
    """For each activity, the thread and start time of its launch call (-1 when absent), by a sorted-key join.

    key = (VM and process bits) << 32 | correlationId: correlationIds are 32-bit and unique within a process.
    """
    n = len(op_key)
    tid_out = np.full(n, -1, dtype=np.int64)
    ns_out = np.full(n, -1, dtype=np.int64)
    if not export.has(RUNTIME) or n == 0:
        return tid_out, ns_out
    union = " UNION ALL ".join(f"SELECT correlationId FROM {t}" for t in tables)
    calls = export.arrays(load_query("launch_calls", gpu_correlations=union), ["key", "tid", "start"], max_rows=n)
    if len(calls["key"]) == 0:
        return tid_out, ns_out
    order = np.argsort(calls["key"], kind="stable")
    sorted_keys = calls["key"][order]
    pos = np.minimum(np.searchsorted(sorted_keys, op_key), len(sorted_keys) - 1)
    found = sorted_keys[pos] == op_key
    hit = order[pos[found]]
    tid_out[found] = calls["tid"][hit]
    ns_out[found] = calls["start"][hit]
    return tid_out, ns_out
