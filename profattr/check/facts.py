"""The facts the checks look at, computed once per capture from its reader (any format): GPU work per device,
CUDA calls, kernel names with their time, and the export's own records (NVTX event types, nsys diagnostics)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from profattr.arrays import unique
from profattr.trace.ops import KIND_KERNEL


@dataclass
class Facts:
    devices: list  # per device: deviceId, processes, kernels, graph_node_kernels, first_start_ns, last_end_ns, kernel_ns
    calls: tuple  # (CUDA launch/copy/sync calls, of them graph launches)
    names: list  # (demangled, short, executions, kernel_ns), largest first
    format: str = "nsys"
    nvtx_types: dict | None = None  # nsys: NVTX rows per eventType
    diagnostics: list = field(default_factory=list)  # nsys's own messages (severity, text)
    traced_cuda: bool | None = None  # the capture settings say CUDA was traced


class OpFacts:
    """What the checks read of a capture's GPU ops, summed a window of them at a time (`add`, in the reader's row
    order) or all at once (`of`): per device its kernels, processes, graph-node kernels, first start, last end and
    kernel time; per kernel name (demangled id) its executions, time and short name (its last row's); and the span
    and number of all ops (kernels and memory)."""

    def __init__(self, first_calls=None):
        """`first_calls`: a first_calls.FirstCalls to add every window's kernels to (windows in start order)."""
        self.first_calls = first_calls
        self.n_ops = 0
        self.first_ns = None  # earliest start of any op
        self.last_ns = None  # latest end of any op
        self.devices: dict = {}  # device -> [processes (set), kernels, graph-node kernels, first, last, kernel ns]
        self.names: dict = {}  # demangled id -> [executions, ns, short id of the last row]

    @classmethod
    def of(cls, ops) -> "OpFacts":
        return cls().add(ops)

    def add(self, ops) -> "OpFacts":
        if not len(ops):
            return self
        self.n_ops += len(ops)
        if self.first_calls is not None:
            self.first_calls.add_ops(ops)
        first, last = int(ops.start.min()), int(ops.end.max())
        self.first_ns = first if self.first_ns is None else min(self.first_ns, first)
        self.last_ns = last if self.last_ns is None else max(self.last_ns, last)
        kernel = ops.kind == KIND_KERNEL
        if not kernel.any():
            return self
        for dev in unique(ops.device[kernel]):
            sel = kernel & (ops.device == dev)
            d = self.devices.setdefault(int(dev), [set(), 0, 0, None, None, 0])
            d[0].update(unique(ops.launch_key[sel] >> 32).tolist())
            d[1] += int(sel.sum())
            d[2] += int((ops.graph_node[sel] >= 0).sum())
            lo, hi = int(ops.start[sel].min()), int(ops.end[sel].max())
            d[3] = lo if d[3] is None else min(d[3], lo)
            d[4] = hi if d[4] is None else max(d[4], hi)
            d[5] += int((ops.end[sel] - ops.start[sel]).sum())
        demangled, short_ids = ops.demangled_id[kernel], ops.name_id[kernel]
        ids = unique(demangled)  # sorted ids; each row's place among them (np.unique's inverse, by a search)
        inverse = np.searchsorted(ids, demangled)
        counts = np.bincount(inverse)
        ns = np.bincount(inverse, weights=(ops.end - ops.start)[kernel])
        last = np.zeros(len(ids), dtype=np.int64)  # each name's last kernel row here
        np.maximum.at(last, inverse, np.arange(len(demangled)))
        for i, c, t, short in zip(ids.tolist(), counts.tolist(), ns.tolist(), short_ids[last].tolist()):
            entry = self.names.setdefault(i, [0, 0, short])
            entry[0] += c
            entry[1] += int(round(t))  # exact: a window's sum of integer ns is far below 2**53
            entry[2] = short
        return self

    def device_rows(self) -> list:
        return [{"deviceId": dev, "processes": len(d[0]), "kernels": d[1], "graph_node_kernels": d[2],
                 "first_start_ns": d[3], "last_end_ns": d[4], "kernel_ns": d[5]}
                for dev, d in sorted(self.devices.items())]


def gather(source, ops) -> Facts:
    """The facts of a capture from its reader and its ops (trace/ops.py Ops, or an OpFacts already summed)."""
    op_facts = ops if isinstance(ops, OpFacts) else OpFacts.of(ops)
    devices = op_facts.device_rows()
    host = source.host_calls()
    calls = (len(host), host.count(0))
    names = []
    if op_facts.names:
        ids = sorted(op_facts.names)
        strings = source.strings(ids + [op_facts.names[i][2] for i in ids])
        for i in sorted(ids, key=lambda i: -op_facts.names[i][1]):
            c, t, short = op_facts.names[i]
            names.append((strings.get(i), strings.get(short), c, t))
    facts = Facts(devices=devices, calls=calls, names=names, format=source.format)
    tables = source.nsys_tables()
    if tables is not None:
        from profattr.check.nsys_records import diagnostics, nvtx_event_types, traced_cuda

        facts.nvtx_types = nvtx_event_types(tables)
        facts.diagnostics = diagnostics(tables)
        facts.traced_cuda = traced_cuda(tables)
    return facts
