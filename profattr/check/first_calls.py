"""The figures of the first-call check (timing.check_first_calls), summed a part of the kernels at a time: the
whole capture's kernel rows at once (the reader's kernel_configs, in any order), or a window of ops at a time in
start order (report/window_views.py), with the same result.

Per launch configuration (device, kernel name, grid, block): its first call's duration and start (the earliest
start; on a tie, the row given first), its number of calls and the exact median of the other calls' durations
(arrays.Median); the median of every kernel's duration and their total; and per kernel name and device its first
call (the earliest start; on a tie, the configuration first in key order), which says whether a collective's slow
first call was waiting for a later rank.
"""
from __future__ import annotations

import numpy as np

from profattr.arrays import Median
from profattr.trace.ops import KIND_KERNEL

KEY_COLUMNS = ["device", "name", "gx", "gy", "gz", "bx", "by", "bz"]


class FirstCalls:
    def __init__(self):
        self.usable = True  # False once a window's kernel lacked its launch shape (the reader's SQL has it)
        self.total_ns = 0
        self.durations = Median()  # every kernel's
        self.configs: dict = {}  # key -> [first duration, first start, calls, Median of the other calls]
        self.first_of: dict = {}  # (name, device) -> (start, grid and block key, duration) of its first call

    @classmethod
    def of_configs(cls, seq: dict) -> "FirstCalls":
        """From every kernel row's columns (the reader's kernel_configs), in any order."""
        start = np.asarray(seq["start"], dtype=np.int64)
        order = None if len(start) < 2 or bool((start[1:] >= start[:-1]).all()) else np.argsort(start, kind="stable")
        cols = [np.asarray(seq[c], dtype=np.int64) for c in KEY_COLUMNS + ["start", "duration"]]
        calls = cls()
        calls.add(*(c if order is None else c[order] for c in cols))
        return calls

    def add_ops(self, ops) -> None:
        """A window's kernels (trace/ops.py Ops, in start order: the op store's windows)."""
        k = ops.kind == KIND_KERNEL
        if not k.any() or not self.usable:
            return
        grid, block = ops.grid[k], ops.block[k]
        device, name = ops.device[k].astype(np.int64), ops.demangled_id[k].astype(np.int64)
        if (grid < 0).any() or (block < 0).any() or (device < 0).any() or (name < 0).any():
            self.usable = False  # not packed in the store: kernel_configs reads them from SQL
            return
        start = ops.start[k]
        # the store's packed grid (gx, gy, gz) and block (bx, by, bz, registers) without the registers: they sort
        # and compare as the six columns do
        self._add([(device << 32) | name, grid, block >> 16], start, ops.end[k] - start, packed=True)

    def add(self, device, name, gx, gy, gz, bx, by, bz, start, duration) -> None:
        """Kernel rows in start order (on a tie, as given), after every row added before."""
        self._add([device, name, gx, gy, gz, bx, by, bz], start, duration, packed=False)

    def _add(self, columns: list, start, duration, packed: bool) -> None:
        """`columns`: the configuration key, as (device << 32 | name, grid, block) packed (the windows') or as its
        eight columns; one FirstCalls is fed one way."""
        from profattr.attribute.accumulate import group_rows

        if not len(start):
            return
        self.total_ns += int(duration.sum())
        self.durations.add(duration)
        keys, group = group_rows(*columns)
        if packed:  # back to (device, name, grid, block): key[0] and key[1] are the device and the name
            keys = np.stack([keys[:, 0] >> 32, keys[:, 0] & 0xFFFFFFFF, keys[:, 1], keys[:, 2]], axis=1)
        order = np.argsort(group, kind="stable")  # each configuration's rows, in start order
        runs = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]])
        for g, lo, hi in zip(group[order][runs].tolist(), runs.tolist(), np.r_[runs[1:], len(order)].tolist()):
            rows = order[lo:hi]
            key = tuple(keys[g].tolist())
            entry = self.configs.get(key)
            if entry is None:
                first = int(rows[0])
                entry = self.configs[key] = [int(duration[first]), int(start[first]), 0, Median()]
                rows = rows[1:]
                mine = (key[1], key[0])
                candidate = (entry[1], key[2:], entry[0])
                if mine not in self.first_of or candidate[:2] < self.first_of[mine][:2]:
                    self.first_of[mine] = candidate
            entry[2] += hi - lo
            entry[3].add(duration[rows])

    def first_calls_of(self, name_id: int) -> dict:
        """device -> (start, duration) of the first call of kernel `name_id` on that device."""
        return {dev: (v[0], v[2]) for (name, dev), v in self.first_of.items() if name == name_id}
