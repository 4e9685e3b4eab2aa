"""The facts the checks look at, computed once per capture from its reader (any format): GPU work per device,
CUDA calls, kernel names with their time, and the export's own records (NVTX event types, nsys diagnostics)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from profattr.arrays import unique
from profattr.trace.ops import KIND_KERNEL, LOW32


@dataclass
class Facts:
    devices: list  # per device: deviceId, processes, kernels, graph_node_kernels, first_start_ns, last_end_ns, kernel_ns
    calls: tuple  # (CUDA launch/copy/sync calls, of them graph launches)
    names: list  # (demangled, short, executions, kernel_ns), largest first
    api: dict  # api_calls() arrays
    format: str = "nsys"
    nvtx_types: dict | None = None  # nsys: NVTX rows per eventType
    diagnostics: list = field(default_factory=list)  # nsys's own messages (severity, text)
    traced_cuda: bool | None = None  # the capture settings say CUDA was traced


def gather(source, ops) -> Facts:
    kernel = ops.kind == KIND_KERNEL
    devices = []
    for dev in unique(ops.device[kernel]) if kernel.any() else []:
        sel = kernel & (ops.device == dev)
        devices.append({"deviceId": int(dev), "processes": int(len(unique(ops.launch_key[sel] >> 32))),
                        "kernels": int(sel.sum()), "graph_node_kernels": int((ops.graph_node[sel] >= 0).sum()),
                        "first_start_ns": int(ops.start[sel].min()), "last_end_ns": int(ops.end[sel].max()),
                        "kernel_ns": int((ops.end[sel] - ops.start[sel]).sum())})
    api = source.api_calls()
    calls = (int(len(api["kind"])), int((api["kind"] == 0).sum()))
    names = []
    if kernel.any():
        demangled, short_ids = ops.demangled_id[kernel], ops.name_id[kernel]
        ids = unique(demangled)  # sorted ids; each row's place among them (np.unique's inverse, by a search)
        inverse = np.searchsorted(ids, demangled)
        counts = np.bincount(inverse)
        ns = np.bincount(inverse, weights=(ops.end - ops.start)[kernel])
        # each name's short name as its last kernel row gives it
        last = np.zeros(len(ids), dtype=np.int64)
        np.maximum.at(last, inverse, np.arange(len(demangled)))
        short_of = dict(zip(ids.tolist(), short_ids[last].tolist()))
        strings = source.strings(list(ids) + [short_of[int(i)] for i in ids])
        for i, c, t in sorted(zip(ids.tolist(), counts.tolist(), ns.tolist()), key=lambda r: -r[2]):
            names.append((strings.get(i), strings.get(short_of[i]), c, int(round(t))))
    facts = Facts(devices=devices, calls=calls, names=names, api=api, format=source.format)
    tables = source.nsys_tables()
    if tables is not None:
        from profattr.check.nsys_records import diagnostics, nvtx_event_types, traced_cuda

        facts.nvtx_types = nvtx_event_types(tables)
        facts.diagnostics = diagnostics(tables)
        facts.traced_cuda = traced_cuda(tables)
    return facts


# a gap this large (ids) and this many times the usual gap: API calls that produce no GPU work (lazy library set-up
# at a first step makes about a thousand) stay below it; the lost records seen with nsys 2023.4.4 jumped by tens of
# thousands
BIG_GAP_IDS = 10_000
BIG_GAP_FACTOR = 200


def correlation_gaps(keys: np.ndarray) -> dict:
    """Per process: the gaps in the sequence of correlation ids of its recorded CUDA calls. CUPTI numbers every
    call of a process; ids that never appear are calls the profiler did not record (or API kinds it does not
    trace): a gap far larger than the usual one means records were dropped."""
    keys = unique(keys)  # sorted: each process's ids come in order, one run of keys per process
    out = {"processes": 0, "largest_gap": 0, "usual_gap": 0, "big_gaps": 0, "ids_in_big_gaps": 0, "span": 0}
    if not len(keys):
        return out
    proc = keys >> 32
    bounds = np.flatnonzero(np.r_[True, proc[1:] != proc[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ids = keys[lo:hi] & LOW32
        if len(ids) < 3:
            continue
        gaps = np.diff(ids)
        usual = max(int(np.median(gaps)), 1)
        big = gaps > max(BIG_GAP_IDS, BIG_GAP_FACTOR * usual)
        out["processes"] += 1
        out["largest_gap"] = max(out["largest_gap"], int(gaps.max()))
        out["usual_gap"] = max(out["usual_gap"], usual)
        out["big_gaps"] += int(big.sum())
        out["ids_in_big_gaps"] += int(gaps[big].sum())
        out["span"] += int(ids[-1] - ids[0])
    return out
