"""Budgets of many reports: one per report (the mapper the nsys recipe nsys_recipes/profattr_budget runs, serially,
in processes or on Dask workers), and one budget of the per-rank reports of one tensor-parallel run.

Merging ranks: each rank's report holds its own process (its GPU, its threads, its launches, its ranges); on one
host all reports share one clock, so the ranks' ops, ranges, graph launches and node-creation events put side by
side are what one report of all processes would hold, and the budget over them has every device and the
collectives' transfer/wait split between ranks (comm.py). String ids are the report's own: a name another report
interned under another id gets the id of the first report that has it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.errors import ProfattrError
from profattr.trace.ops import Ops
from profattr.trace.protocol import KeyBlocks


def report_budget(report_path, steps: str = "auto", rules: Sequence = (), export_with_recipe: bool = False):
    """(report name, `profattr.budget/1` dict) of one report (.nsys-rep exported beside it first, or .sqlite).

    `export_with_recipe`: export through nsys's recipe DataService (inside `nsys recipe`), else with nsys directly.
    A module-level function, so that Dask and process pools can send it to workers by name."""
    from profattr.attribute.budget import compute_budget

    return _name(report_path), compute_budget(sqlite_of(report_path, export_with_recipe), steps=steps,
                                              rules=rules).to_dict()


def sqlite_of(report_path, export_with_recipe: bool = False) -> Path:
    report = Path(report_path)
    if report.suffix not in (".nsys-rep", ".qdrep"):
        return report
    sqlite = report.with_suffix(".sqlite")
    if sqlite.exists() and sqlite.stat().st_mtime >= report.stat().st_mtime:
        return sqlite
    if export_with_recipe:
        from nsys_recipe.data_service import DataService

        if not DataService(str(report)).export(None, {"format": "sqlite", "path": str(sqlite)}):
            raise ProfattrError(f"{report}: nsys could not export it to SQLite")
        return sqlite
    from profattr.trace.reader import resolve_capture

    return resolve_capture(report)


def _name(path) -> str:
    name = Path(path).name
    for suffix in (".nsys-rep", ".qdrep", ".sqlite"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class MergedSource:
    """The reader interface (trace/protocol.py Reader) over several ranks' readers (op stores or exports), as one
    capture of all of them. String ids of names (ops, kernel configurations, CPU samples) are remapped into one
    table; call ops() first: it builds that table."""

    format = "nsys"

    def __init__(self, sources: list):
        if not sources:
            raise ProfattrError("no reports to merge")
        self.sources = sources
        first = sources[0]
        self.path = " + ".join(str(s.path) for s in sources)
        self.nsys_version = first.nsys_version
        self.schema_version = first.schema_version
        self.tool_version = first.tool_version
        gpus = {}
        for s in sources:
            for g in s.gpus:
                gpus.setdefault(g.get("id"), g)
        self.gpus = [gpus[k] for k in sorted(gpus, key=lambda k: (k is None, k))]
        self._strings: dict = {}

    @property
    def claims(self):
        """The ranks' claims as one: what each skipped, summed by table and reason."""
        from profattr.trace.validate import Claims

        merged = Claims(self.path)
        for src in self.sources:
            for table, reasons in src.claims.skipped.items():
                entry = merged.skipped.setdefault(table, {})
                for reason, n in reasons.items():
                    entry[reason] = entry.get(reason, 0) + n
        return merged

    def _remap(self, src, ids) -> dict:
        """Old string id -> merged id for the names `ids` of one source (the same id when the name agrees)."""
        ids = sorted({int(x) for x in unique(ids) if x >= 0})
        values = src.strings(ids)
        by_value = {v: k for k, v in self._strings.items()}
        remap = {}
        for old in ids:
            value = values.get(old)
            if value is None:
                continue
            if value in by_value:
                new = by_value[value]
            elif old not in self._strings:
                new = old
            else:  # the id means another name in an earlier report
                new = max(self._strings) + 1
            self._strings[new] = value
            by_value[value] = new
            remap[old] = new
        return remap

    def _mapped(self, index: int, arrays: dict, columns) -> dict:
        """`arrays` of source `index` with the string-id `columns` remapped into the merged table."""
        src = self.sources[index]
        remap = {k: v for k, v in self._remap(src, np.concatenate([arrays[c] for c in columns])).items() if k != v}
        out = dict(arrays)
        for col in columns if remap else ():
            values = arrays[col]
            mapped = values.copy()
            for old, new in remap.items():
                mapped[values == old] = new
            out[col] = mapped
        return out

    def _concat(self, parts: list):
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def ops(self, include_memory: bool = True) -> Ops:
        """Every rank's ops, rank after rank (call first: it also builds the merged string table)."""
        parts = []
        self._strings = {}
        for i, src in enumerate(self.sources):
            ops = src.ops(include_memory)
            cols = self._mapped(i, {"demangled_id": ops.demangled_id, "name_id": ops.name_id},
                                ("demangled_id", "name_id"))
            ops.demangled_id, ops.name_id = cols["demangled_id"], cols["name_id"]
            parts.append(ops)
        return Ops(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in parts[0].__dict__})

    def time_windows(self, size: int | None = None):
        return None  # the ranks side by side are read at once

    def ranges(self) -> pd.DataFrame:
        frames = [s.ranges() for s in self.sources]
        frames = [f for f in frames if len(f)] or frames[:1]
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        return frame.sort_values(["tid", "start"], kind="stable").reset_index(drop=True)

    def graph_launches(self):
        g = self._concat([s.graph_launches() for s in self.sources])
        if g is None:
            return None
        order = np.lexsort((g["start"], g["tid"]))
        return {k: v[order] for k, v in g.items()}

    def node_creation(self):
        ev = self._concat([s.node_creation() for s in self.sources])
        if ev is None:
            return None
        order = np.lexsort((-ev["original"], ev["node"]))
        ev = {k: v[order] for k, v in ev.items()}
        first = np.ones(len(ev["node"]), dtype=bool)
        first[1:] = ev["node"][1:] != ev["node"][:-1]
        return {k: v[first] for k, v in ev.items()}

    def strings(self, ids) -> dict:
        return {int(i): self._strings[int(i)] for i in ids if i is not None and int(i) in self._strings}

    def api_calls(self) -> dict:
        return self._concat([s.api_calls() for s in self.sources])  # thread ids hold the process: no clash

    def host_calls(self):
        from profattr.trace.calls import WholeCalls

        return WholeCalls(self.api_calls())

    def fold_api_keys(self, start):
        acc = start()  # process << 32 | correlationId: the sources' keys do not clash
        for source in self.sources:  # each source read whole first: one that reads again starts afresh
            for block in source.fold_api_keys(KeyBlocks).blocks:
                acc.add(block)
        return acc

    def record_span(self) -> tuple:
        spans = [s.record_span() for s in self.sources]
        starts = [a for a, _ in spans if a is not None]
        ends = [b for _, b in spans if b is not None]
        return (min(starts), max(ends)) if starts and ends else (None, None)

    def kernel_configs(self) -> dict:
        return self._concat([self._mapped(i, s.kernel_configs(), ("name",)) for i, s in enumerate(self.sources)])

    def cpu_samples(self):
        columns = ("leaf_symbol", "leaf_module", "py_symbol", "py_module")
        return self._concat([None if got is None else self._mapped(i, got, columns)
                             for i, got in enumerate(s.cpu_samples() for s in self.sources)])

    def sampling_period_ns(self):
        return next((p for p in (s.sampling_period_ns() for s in self.sources) if p is not None), None)

    def torch_ops(self):
        return None

    def python_frames(self):
        return None

    def nsys_tables(self):
        return None  # several exports: no one set of SQL tables

    def launch_gpu_starts(self):
        return None  # graph launch costs are a capture's own

    def gpu_interval_windows(self):
        return iter(())

    def close(self) -> None:
        for s in self.sources:
            s.close()


def merged_budget(paths: Sequence, steps: str = "auto", rules: Sequence = (), export_with_recipe: bool = False):
    """One Budget over the per-rank reports of one run (see the module docstring): every device, and with two or
    more ranks running collectives, the comm split."""
    from profattr.attribute.budget import compute_budget, store_source
    from profattr.trace.source import open_trace

    opened, sources = [], []
    try:
        for p in paths:
            export = open_trace(sqlite_of(p, export_with_recipe))
            opened.append(export)
            sources.append(store_source(export))
        merged = MergedSource(sources)
        return compute_budget(merged, steps, rules)
    finally:
        for s, e in zip(sources, opened):
            if s is not e:
                s.close()
        for e in opened:
            e.close()
