"""GPU work of a capture as flat arrays: kernels, memcpys and memsets, each linked to the CPU call that launched it.

A GPU activity links to its launch through (process, correlationId): the runtime row with the same correlationId
whose thread belongs to the activity's process (`globalPid == globalTid & ~0xFFFFFF`). Graph replays are one
launch (`cudaGraphLaunch`) whose nodes all share its correlationId.
"""
from __future__ import annotations

import json
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
    """One row per GPU activity, as parallel arrays, kept narrow (millions of rows).

    `name_id` / `demangled_id` (int32) are StringIds ids for kernels; for memory ops they are negative codes
    (-1 - copyKind for memcpy, -100 for memset). `launch_key` is (VM and process bits) << 32 | correlationId.
    `launch_tid` / `launch_ns` are the launching thread and the start of the launch call (-1 when no launch call
    was recorded).
    """

    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    device: np.ndarray  # int16
    launch_key: np.ndarray  # int64
    name_id: np.ndarray  # int32
    demangled_id: np.ndarray  # int32
    graph_node: np.ndarray  # int64, -1 outside graphs
    stream: np.ndarray  # int32
    kind: np.ndarray  # int8
    launch_tid: np.ndarray  # int64
    launch_ns: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.start)

    @property
    def correlation(self) -> np.ndarray:
        return self.launch_key & LOW32

    @property
    def pid(self) -> np.ndarray:
        """VM and process bits of the globalPid (globalPid >> 24)."""
        return self.launch_key >> 32

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
    start, end, packed, key, graph_node = buf
    low = (packed & LOW32).astype(np.int32)
    # names: kernels carry their demangled-name id; memory ops get negative codes (see Ops)
    demangled_id = low
    is_copy, is_set = kind == KIND_MEMCPY, kind == KIND_MEMSET
    demangled_id[is_copy] = -1 - low[is_copy]
    demangled_id[is_set] = -100
    device = (packed >> 56).astype(np.int16)
    stream = ((packed >> 32) & 0xFFFFFF).astype(np.int32)
    del packed, low
    launch_tid, launch_ns = _join_launches(export, key)
    return Ops(start=start, end=end, device=device, launch_key=key, name_id=_short_names(export, demangled_id),
               demangled_id=demangled_id, graph_node=graph_node, stream=stream, kind=kind,
               launch_tid=launch_tid, launch_ns=launch_ns)


def _short_names(export: Export, demangled_id: np.ndarray) -> np.ndarray:
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


def _join_launches(export: Export, op_key: np.ndarray):
    """For each activity, the thread and start time of its launch call (-1 when absent), by a sorted-key join.

    key = (VM and process bits) << 32 | correlationId: correlationIds are 32-bit and unique within a process.
    """
    n = len(op_key)
    tid_out = np.full(n, -1, dtype=np.int64)
    ns_out = np.full(n, -1, dtype=np.int64)
    if not export.has(RUNTIME) or n == 0:
        return tid_out, ns_out
    # fast path: launch calls picked by API name (a handful of ids); then, exactly, by correlationId for whatever
    # is left (ops whose launch call lies before the capture window, or an API name not foreseen)
    name_ids = ",".join(str(int(r[0])) for r in export.query(load_query("launch_call_names")))
    found = np.zeros(n, dtype=bool)
    if name_ids:
        calls = export.arrays(load_query("launch_calls_by_name", name_ids=name_ids), ["key", "tid", "start"],
                              max_rows=n + n // 8 + 1024)  # about one launch per op, some launches of nothing
        found = _match(calls, op_key, tid_out, ns_out)
    missing = np.unique(op_key[~found] & LOW32)
    if len(missing):
        calls = export.arrays(load_query("launch_calls_for"), ["key", "tid", "start"],
                              params=(json.dumps(missing.tolist()),))
        _match(calls, op_key, tid_out, ns_out)
    return tid_out, ns_out


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
