"""The Budget and Attribution types and the pieces that both ways of computing a budget build it from: the whole
capture at once (budget.py) and window by window over an op store (windows.py). Context bits per op from the NVTX
ranges, the leading steps left out, the per-device dicts assembled from the step tables, the collective split."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.attribute.distributions import device_distributions
from profattr.attribute.graphs import STATUS_NAMES
from profattr.attribute.nvtx import Ranges, enclosed
from profattr.attribute.shapes import kernel_shapes, short_kernel_stats
from profattr.attribute.steps import Steps
from profattr.attribute.step_table import StepCategories
from profattr.errors import ProfattrError
from profattr.regexguard import search_mask
from profattr.attribute.context import evidence_block
from profattr.trace.ops import Ops

SCHEMA = "profattr.budget/1"
NS_PER_MS = 1e6


@dataclass
class Attribution:
    """Everything the budget knows per GPU op, for later stages (diff, layers, comm): parallel arrays."""

    ops: Ops
    step: np.ndarray  # step index per op, -1 outside every step
    combo: np.ndarray  # index into `combos` per op
    combos: pd.DataFrame  # one row per distinct (name, context): name, demangled, category, family
    steps: Steps
    ranges: Ranges
    context_method: str
    ctx_tid: np.ndarray | None = None  # per op: thread and time at which its NVTX context is read
    ctx_ns: np.ndarray | None = None
    status: np.ndarray | None = None  # per op: graphs.STATUS_* (how its context point was found)
    mask: np.ndarray | None = None  # per op: bit b set when an NVTX range matching context pattern b encloses it
    mapping: "Attribution | None" = None  # the eager mapping capture's attribution, when one was given
    mapped: np.ndarray | None = None  # per op: index of its matched op in `mapping.ops`, -1 when none
    mapping_report: dict | None = None
    names: np.ndarray | None = None  # per op: demangled name (filled when a mapping needed it)
    gemm_mnk: np.ndarray | None = None  # per op: packed M, N, K of its linear layer's NVTX range (gemm_dims.py)

    def category(self) -> np.ndarray:
        """Category id per op (object array)."""
        return self.combos["category"].to_numpy()[self.combo]

    def placement(self) -> dict:
        """How the ops inside steps got their NVTX context: op counts per method, plus mapping details."""
        inside = self.step >= 0
        status = self.status[inside] if self.status is not None else np.zeros(int(inside.sum()), dtype=np.int8)
        return placement_dict(np.bincount(status.astype(np.int64), minlength=4), self.mapping_report)

def placement_dict(status_counts: np.ndarray, mapping_report: dict | None = None) -> dict:
    """Attribution.placement's dict from op counts per graphs.STATUS_* code (ops inside steps)."""
    out = {name: int(status_counts[code]) for code, name in STATUS_NAMES.items()}
    out["mapping_capture"] = mapping_report
    unplaced = out["unplaced"]
    out["hint"] = None
    if unplaced and mapping_report is None:
        out["hint"] = (f"{unplaced} replayed graph ops have no NVTX context (their graph was captured outside "
                       "the profiled window or without NVTX ranges), so their layer and NVTX-context categories "
                       "are unknown; pass --mapping EAGER_CAPTURE (the same workload captured eagerly, with "
                       "the same NVTX ranges)")
    return out

@dataclass
class WindowedPass:
    """What a budget computed window by window (windows.py) read its ops with, for views that read the windows
    again: the steps ops were assigned to and their renumbering into the budget's (`remap`, None: the same), the
    budget's steps, the NVTX ranges, and the op time per (device, combination, launch shape) with its combos."""

    assign: Steps
    remap: np.ndarray | None
    steps: Steps
    ranges: Ranges
    per_combo: pd.DataFrame  # device, combo, grid, block, gemm, ns, count (inside steps)
    combos: pd.DataFrame  # accumulate.COMBO_COLUMNS, rows in their final order

    def step_of(self, ops: Ops) -> np.ndarray:
        """The budget's step of each op (-1 outside its steps), as the budget assigned it."""
        step = self.assign.assign(ops.launch_tid, ops.launch_ns, ops.launched)
        return self.remap[step] if self.remap is not None else step


@dataclass
class Budget:
    path: str
    nsys_version: str | None
    schema_version: str | None
    gpus: list
    steps_source: str
    steps_reason: str
    steps_count: int
    devices: list  # list of dicts, see to_dict()
    per_step: pd.DataFrame  # device, step, start_ns, end_ns, span_ns, busy_ns, op_ns, kernels
    # per (device, step) and category: op time, count, exclusive time (step_table.py; None: not asked for)
    per_step_category: StepCategories | None
    attribution: Attribution | None = field(default=None, repr=False)
    context_method: str = "launch"
    nvtx_placement: dict | None = None  # ops per context method (Attribution.placement)
    comm: dict | None = None  # ranks, steps compared, slowest rank per step (comm.py); None with < 2 ranks
    per_step_comm: pd.DataFrame | None = None  # device, step, category, collective_ns, wait_ns
    layer_pattern: str | None = None  # set when per-layer rows were computed
    format: str = "nsys"  # the reader: nsys (SQLite export) or torch (torch-profiler trace)
    tool_version: str | None = None
    steps_excluded: dict = field(default_factory=dict)
    skipped_rows: dict = field(default_factory=dict)  # {table: {reason: rows, "rows": total}} (trace/validate.py)
    windowed: "WindowedPass | None" = field(default=None, repr=False)  # how windows.py read it (else None)

    def to_dict(self) -> dict:
        out = {
            "schema": SCHEMA,
            "capture": {"path": self.path, "format": self.format, "nsys_version": self.nsys_version,
                        "export_schema_version": self.schema_version, "profiler_version": self.tool_version,
                        "gpus": self.gpus},
            "steps": {"source": self.steps_source, "count": self.steps_count, "reason": self.steps_reason,
                      "excluded": self.steps_excluded},
            "nvtx_context": self.context_method,
            "devices": self.devices,
        }
        if self.skipped_rows:
            out["capture"]["skipped_rows"] = self.skipped_rows
        if self.nvtx_placement is not None:
            out["nvtx_placement"] = self.nvtx_placement
        if self.layer_pattern is not None:
            out["layer_pattern"] = self.layer_pattern
        if self.comm is not None:
            out["comm"] = self.comm
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

def _leading_to_skip(budget: Budget, skip_steps) -> int:
    if skip_steps == "auto":
        from profattr.attribute.steady import steady_state

        found = [steady_state(budget.per_step.loc[budget.per_step["device"] == d["device"]]
                              .sort_values("start_ns")["span_ns"].to_numpy()).warmup_steps for d in budget.devices]
        return max(found, default=0)
    try:
        n = int(skip_steps)
    except (TypeError, ValueError):
        raise ProfattrError(f"--skip-steps {skip_steps!r}: expected a number of steps or auto") from None
    if n < 0:
        raise ProfattrError(f"--skip-steps must be 0 or more (got {n})")
    if n and n >= budget.steps_count:
        raise ProfattrError(f"--skip-steps {n} leaves no step: the capture has "
                            f"{budget.steps_count} steps")
    return n

def skip_remap(st: Steps, n: int, what: str):
    """(the steps without the first `n` of each thread, new index per old step index with -1 -> -1)."""
    keep = np.ones(len(st), dtype=bool)
    for tid in unique(st.tid):
        idx = np.flatnonzero(st.tid == tid)
        keep[idx[np.argsort(st.start[idx], kind="stable")][:n]] = False
    remap = np.full(len(st) + 1, -1, dtype=np.int64)
    remap[np.flatnonzero(keep)] = np.arange(int(keep.sum()))
    return st.keep(keep, what), remap

def context_mask(ranges: Ranges, regexes: Sequence, ctx_tid, ctx_ns, selected: list | None = None
                 ) -> np.ndarray:
    """Per op, bit b set when an NVTX range whose text matches regexes[b] (RuleSet.context_regexes) encloses its
    context point. `selected`: context_ranges(ranges, regexes), when already computed (windows)."""
    mask = np.zeros(len(ctx_ns), dtype=np.int64)
    for bit, (tid, start, end) in enumerate(selected if selected is not None else context_ranges(ranges, regexes)):
        if len(start):
            hit = enclosed(tid, start, end, ctx_tid, ctx_ns)
            mask |= hit.astype(np.int64) << bit
    return mask

def context_ranges(ranges: Ranges, regexes: Sequence) -> list:
    """Per compiled pattern (RuleSet.context_regexes), the (tid, start, end) arrays of the ranges whose text (its
    first MAX_MATCH_CHARS characters) it finds a match in."""
    frame = ranges.frame
    out = []
    for regex in regexes:
        sel = frame[search_mask(frame["text"], regex)] if len(frame) else frame
        out.append((sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy()))
    return out

def assemble(export, steps: Steps, context_method: str, combos_frame: pd.DataFrame, per_step: pd.DataFrame,
             table: StepCategories, per_combo: pd.DataFrame, outside: dict, nvtx_placement: dict | None,
             short_kernels: dict | None = None, context_summary: dict | None = None) -> Budget:
    """The Budget from the totals (accumulate.StepTotals.finish) of its steps; `table`: the step table, whose
    exclusive split (the busy time split among categories) gives the categories' exclusive time and their
    distributions, and which is the budget's per_step_category when it holds op time and counts;
    `short_kernels`: per device, (ns, count) of the kernels under accumulate.SHORT_KERNEL_NS (StepTotals.short)."""
    devices = []
    for device in sorted(set(per_step["device"].tolist())):
        d_steps = per_step[per_step["device"] == device]
        n = len(d_steps)
        excl = table.device_sums(int(device), "exclusive_ns")
        combos = per_combo[per_combo["device"] == device].merge(combos_frame, left_on="combo", right_index=True)
        total_op_ns = float(combos["ns"].sum())
        kernels = (combos.groupby(["name", "demangled", "category", "family"], sort=False)[["ns", "count"]]
                   .sum().reset_index().sort_values("ns", ascending=False))
        cats = (combos.groupby("category")[["ns", "count"]].sum().reset_index()
                .sort_values("ns", ascending=False))
        uncl_ns = float(cats.loc[cats["category"] == "unclassified", "ns"].sum())
        mean_span = float(d_steps["span_ns"].mean()) / NS_PER_MS
        mean_busy = float(d_steps["busy_ns"].mean()) / NS_PER_MS
        kernel_only = kernels[~kernels["category"].str.startswith("memory.")]
        shapes = kernel_shapes(combos, n, total_op_ns)  # attribute/shapes.py
        devices.append({
            "device": int(device),
            "steps": n,
            "step_ms": float(np.median(d_steps["span_ns"].to_numpy())) / NS_PER_MS,
            "mean_step_ms": mean_span,
            "busy_ms_per_step": mean_busy,
            "idle_ms_per_step": mean_span - mean_busy,
            "overlap_ms_per_step": total_op_ns / n / NS_PER_MS - mean_busy,
            "kernels_per_step": float(kernel_only["count"].sum()) / n,
            "memops_per_step": float(kernels["count"].sum() - kernel_only["count"].sum()) / n,
            "idle_share": (mean_span - mean_busy) / mean_span if mean_span else 0.0,
            "categories": [_category_row(r.category, r.ns, r.count, int(excl.get(r.category, 0)), n, mean_span)
                           for r in cats.itertuples()],
            "kernels": [{"name": r.name, "demangled": r.demangled, "category": r.category, "family": r.family,
                         "ms_per_step": r.ns / n / NS_PER_MS, "count_per_step": r.count / n,
                         "mean_us": r.ns / r.count / 1e3 if r.count else 0.0,
                         "shapes": shapes.get((r.name, r.demangled, r.category, r.family), [])}
                        for r in kernels.itertuples()],
            "short_kernels": short_kernel_stats((short_kernels or {}).get(int(device), (0, 0)), n, total_op_ns),
            "unclassified_share": uncl_ns / total_op_ns if total_op_ns else 0.0,
            "outside_steps": {"ops": int(outside.get(int(device), (0, 0))[1]),
                              "ms": float(outside.get(int(device), (0, 0))[0]) / NS_PER_MS},
            # what decided the categories, the kernels no certain name rule covers, the contradicted rules
            **evidence_block(combos, int(device), n, total_op_ns, context_summary),
            "distributions": device_distributions(d_steps, table, int(device)),
        })
    return Budget(path=str(export.path), nsys_version=export.nsys_version,
                  schema_version=export.schema_version, gpus=export.gpus, steps_source=steps.source,
                  steps_reason=steps.reason, steps_count=len(steps), devices=devices, per_step=per_step,
                  format=export.format, tool_version=export.tool_version, steps_excluded=dict(steps.excluded),
                  per_step_category=table if table.ns is not None else None, context_method=context_method,
                  nvtx_placement=nvtx_placement)

def _category_row(category: str, op_ns: float, count: float, exclusive_ns: int, n: int, mean_step_ms: float) -> dict:
    """A device's category row: op time, exclusive and overlapped time per step, share of the mean step."""
    exclusive_ms = exclusive_ns / n / NS_PER_MS
    return {"category": category, "ms_per_step": op_ns / n / NS_PER_MS, "count_per_step": count / n,
            "exclusive_ms_per_step": exclusive_ms, "overlapped_ms_per_step": (op_ns - exclusive_ns) / n / NS_PER_MS,
            "share": exclusive_ms / mean_step_ms if mean_step_ms else 0.0}

def _steps_per_device(budget: Budget) -> dict:
    return {d["device"]: d["steps"] for d in budget.devices}

def apply_comm(budget: Budget, split) -> None:
    """Put collective_split's (per device, summary, per-step table) on the budget; nothing when it is None."""
    if split is None:
        return
    per_device, summary, frame = split
    for d in budget.devices:
        if d["device"] in per_device:
            d["comm"] = per_device[d["device"]]
    budget.comm = summary
    budget.per_step_comm = frame
