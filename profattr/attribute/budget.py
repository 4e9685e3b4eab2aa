"""The per-step time budget: for each GPU, how long a decode step takes and where that time goes.

Definitions (all per device, over the steps that launched work on it):
- span of a step: first start to last end of the GPU work launched in that step;
- `step_ms`: median span; `mean_step_ms`: mean span;
- busy: length of the union of the step's kernel and memory intervals (streams may overlap);
- `idle_ms_per_step` = mean span - mean busy (GPU waiting inside the step: launch gaps, syncs, CPU work);
- `overlap_ms_per_step` = mean summed op time - mean busy (time during which two streams ran at once);
  so `mean_step_ms = sum(category ms) - overlap + idle` holds exactly;
- `distributions`: the spread over the steps (median, p90, max, outlier steps) of the span, the idle time and each
  category's exclusive time (distributions.py), and of the largest kernels' op time where every op was read at once;
- category / kernel `ms_per_step`: summed durations over the steps, divided by the number of steps;
- category `exclusive_ms_per_step`: its share of the busy time (each slice of busy time shared equally among the
  categories running in it, exclusive.py), so `mean_step_ms = sum(category exclusive ms) + idle` holds exactly
  (integer ns per step); `overlapped_ms_per_step` = its ms_per_step - its exclusive ms (the part of its time that
  ran alongside other categories; the device's overlap is their sum); `share` = exclusive / mean step, so the
  categories' shares and `idle_share` add up to 1.

Optional views: `by="layer"` adds per-layer rows (layers.py); with collectives on two or more GPUs each device gets
a `comm` split into transfer and wait (comm.py); `mapping=CAPTURE` gives replayed graph kernels without a
capture-time NVTX context the context of their matching kernel in an eager capture (mapping.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from profattr.attribute.accumulate import Combos, StepTotals
from profattr.attribute.comm import collective_split
from profattr.attribute.distributions import device_distributions, kernel_distributions
from profattr.attribute.graphs import STATUS_MAPPING, STATUS_NAMES, STATUS_UNPLACED, place_contexts
from profattr.attribute.nvtx import Ranges, enclosed, load_ranges
from profattr.attribute.precision import annotate as annotate_precision
from profattr.attribute.shapes import kernel_shapes, short_kernel_stats
from profattr.attribute.steps import Steps, find_steps
from profattr.errors import ProfattrError
from profattr.regexguard import MAX_MATCH_CHARS
from profattr.attribute.context import (ContextTexts, evidence_block, launch_stack_bits, torch_op_bits,
                                        warn_unmatched_contexts)
from profattr.taxonomy.classify import load_rules
from profattr.trace.ops import Ops
from profattr.trace.source import open_trace

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
    per_step_category: pd.DataFrame | None  # device, step, category, ns, count, exclusive_ns (None: not asked for)
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


def compute_budget(path, steps: str = "auto", rules: Sequence = (), force: bool = False,
                   keep_attribution: bool = False, mapping=None, by: str = "category",
                   layer_range: str | None = None, skip_steps=None, step_categories: bool = True) -> Budget:
    """Read a capture (.sqlite, .nsys-rep exported on demand, or torch-profiler traces) and compute its per-step
    budget.

    `mapping`: an eager capture of the same workload whose NVTX context is lent to replayed graph ops that have
    none (mapping.py). `by="layer"` adds per-layer rows to every device (`layer_range`: the layer regex).
    `skip_steps`: leave out the first N steps of each thread, or "auto" the slow start the steady-state test
    finds (attribute/steady.py); the budget says what it left out. `step_categories=False` leaves out
    `per_step_category` (one row per step and category: what diff reads, the largest table of a long capture).
    """
    if by not in ("category", "layer"):
        raise ProfattrError(f"--by {by!r}: expected category or layer")
    ruleset = load_rules(rules)
    source = None
    if mapping is not None:
        source = _mapping_attribution(mapping, steps, ruleset, force)
    windowed = source is None and not keep_attribution and by == "category" and layer_range is None
    with open_trace(path, force=force) as export:
        warn_unmatched_contexts(export, ruleset)
        reader = store_source(export)
        try:
            budget = budget_windowed(reader, steps, ruleset, skip_steps, step_categories) if windowed else None
            claims = getattr(reader, "claims", None)
            if budget is not None and (not budget.devices or (claims is not None and claims.total())):
                budget = None  # damaged rows or no work in the steps: the one-window path counts and says it
            if budget is None:  # needs every op at once (attribution, layers, mapping) or ops out of start order
                budget = budget_of(reader, steps, ruleset, mapping=source, skip_steps=skip_steps)
        finally:
            if reader is not export:
                reader.close()
    attribution = budget.attribution
    if not windowed:  # the spread of the largest kernels: where the caller reads every op at once (not where a
        kernel_distributions(budget)  # windowed budget fell back to one window: its JSON stays the same)
    if by == "layer" or layer_range is not None:
        add_layers(budget, attribution, layer_range)
    if not keep_attribution:
        budget.attribution = None
    if not step_categories:
        budget.per_step_category = None
    return budget


def store_source(export):
    """The reader to compute with: an nsys export's op store (cached, trace/cache.py), else the reader itself."""
    from profattr.trace.reader import Export

    if isinstance(export, Export):
        from profattr.trace.cache import open_store
        from profattr.trace.reader import DamagedValues

        try:
            return open_store(export)
        except (DamagedValues, TypeError, ValueError, OverflowError):
            return export  # damaged rows: the export's own reader finds, counts and hides them (validate.py)
    return export


def budget_windowed(source, steps_spec: str, ruleset, skip_steps=None, step_categories: bool = True
                    ) -> "Budget | None":
    """The budget of an op-store reader (trace/cache.py StoreSource), window by window (attribute/windows.py);
    None when its ops are not in start order (then budget_of computes it in one window)."""
    from profattr.attribute.windows import windowed_budget

    if getattr(source, "store", None) is None:  # a torch-profiler trace: streamed into columns, no op store
        return None
    budget = windowed_budget(source, steps_spec, ruleset, skip_steps, step_categories)
    if budget is not None:
        annotate_precision(budget.devices, ruleset)
    return budget


def budget_of(export, steps: str = "auto", ruleset=None, mapping: "Attribution | None" = None,
              skip_steps=None, require_work: bool = True) -> Budget:
    """The budget of an open reader (trace/source.py open_trace), keeping its attribution. `require_work=False`
    (the checks) returns a budget with no devices instead of the error when its steps hold no GPU work."""
    ruleset = ruleset if ruleset is not None else load_rules(())
    attribution = attribute(export, steps, ruleset, mapping=mapping)
    budget = summarize(export, attribution)
    if skip_steps not in (None, 0, "0"):
        leading = _leading_to_skip(budget, skip_steps)
        if leading:
            how = "auto: the slow start the steady-state test found" if skip_steps == "auto" else "--skip-steps"
            attribution = skip_leading_steps(attribution, leading, f"first {leading} step(s) of each thread ({how})")
            budget = summarize(export, attribution)
    claims = getattr(export, "claims", None)
    if require_work or len(attribution.ops) == 0:
        _require_work(export, budget, attribution, claims)
    budget.attribution = attribution
    annotate_precision(budget.devices, ruleset)
    if claims is not None:
        budget.skipped_rows = {t: dict(r) for t, r in claims.skipped.items()}
        claims.warn()
    return budget


def _require_work(export, budget: Budget, att: Attribution, claims) -> None:
    """One clear error when there is nothing to budget: no GPU work in the capture, or none inside its steps."""
    if budget.devices:
        return
    damaged = f" (and {claims.total()} damaged row(s) were skipped)" if claims is not None and claims.total() else ""
    if len(att.ops) == 0 and claims is not None and getattr(claims, "why_no_work", None) and claims.why_no_work():
        raise ProfattrError(claims.why_no_work())
    if len(att.ops) == 0:
        raise ProfattrError(f"{export.path}: no GPU work in the capture: no kernel, memcpy or memset rows{damaged}; "
                            "capture with `--trace=cuda` (and `--cuda-graph-trace=node`)")
    raise ProfattrError(f"{export.path}: no GPU work in its steps: none of its {len(att.ops)} GPU ops was launched "
                        f"inside one of the {len(att.steps)} steps ({att.steps.source}){damaged}; try --steps whole, "
                        "or --steps nvtx:NAME with a range that encloses the launches")


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


def skip_leading_steps(att: Attribution, n: int, what: str) -> Attribution:
    """The attribution without the first `n` steps of each thread (their ops count as outside the steps)."""
    steps, remap = skip_remap(att.steps, n, what)
    return replace(att, steps=steps, step=remap[att.step])  # -1 stays -1 (the extra last slot)


def skip_remap(st: Steps, n: int, what: str):
    """(the steps without the first `n` of each thread, new index per old step index with -1 -> -1)."""
    keep = np.ones(len(st), dtype=bool)
    for tid in np.unique(st.tid):
        idx = np.flatnonzero(st.tid == tid)
        keep[idx[np.argsort(st.start[idx], kind="stable")][:n]] = False
    remap = np.full(len(st) + 1, -1, dtype=np.int64)
    remap[np.flatnonzero(keep)] = np.arange(int(keep.sum()))
    return st.keep(keep, what), remap


def _mapping_attribution(mapping, steps: str, ruleset, force: bool) -> Attribution:
    """The mapping capture's attribution (its steps: the same NVTX range when one was named, else auto)."""
    with open_trace(mapping, force=force) as opened:
        export = store_source(opened)
        att = attribute(export, steps if steps.startswith("nvtx") else "auto", ruleset)
        if len(att.ranges) == 0:
            raise ProfattrError(f"--mapping {mapping}: this capture has no NVTX ranges, so it cannot lend any; "
                                "give an eager capture of the same workload recorded with NVTX (for SGLang: "
                                "--enable-layerwise-nvtx-marker --disable-cuda-graph)")
        from profattr.attribute.mapping import op_names

        att.names = op_names(export, att.ops)
        att.mapping_report = {"capture": str(mapping)}
        if export is not opened:
            export.close()
    return att


def attribute(export, steps_spec: str, ruleset, mapping: Attribution | None = None) -> Attribution:
    """Link every GPU op to its step and its category (and, with `mapping`, borrow missing NVTX contexts).
    `export` is any reader (trace/source.py open_trace)."""
    ops = export.ops()
    ranges = load_ranges(export)
    steps = find_steps(export, steps_spec, ranges, ops)
    step = steps.assign(ops.launch_tid, ops.launch_ns, ops.launched)
    placement = place_contexts(export, ops, ranges)
    patterns = list(ruleset.context_patterns)
    mask = context_mask(ranges, patterns, placement.tid, placement.t_ns)
    status, method = placement.status, placement.method
    mapped, report, names = None, None, None
    if mapping is not None:
        from profattr.attribute.mapping import match_ops, op_names, steps_by_device

        names = op_names(export, ops)
        result = match_ops(names, steps_by_device(ops, step, steps.start), mapping.names,
                           steps_by_device(mapping.ops, mapping.step, mapping.steps.start),
                           mapping.mapping_report["capture"], len(ops))
        mapped = result.source
        # borrow only where this capture has no context of its own, and the matched op had one in the mapping
        usable = mapped >= 0
        usable[usable] = mapping.status[mapped[usable]] != STATUS_UNPLACED
        take = (status == STATUS_UNPLACED) & usable
        mask[take] = mapping.mask[mapped[take]]
        status = status.copy()
        status[take] = STATUS_MAPPING
        report = result.to_dict()
        inside = step >= 0
        method = (f"mapping capture {result.path}: {int((take & inside).sum())} replayed ops placed by their order "
                  f"within the step, {result.name_mismatches} of {result.ops_compared} ops without a same-named "
                  f"match, {int(((status == STATUS_UNPLACED) & inside).sum())} unplaced")
    keys, torch_mask = torch_op_bits(export, ops, ruleset, len(patterns))
    patterns, mask = patterns + keys, mask | torch_mask  # the launching torch operator (torch traces)
    keys, stack_mask = launch_stack_bits(export, ops, ruleset, len(patterns))
    patterns, mask = patterns + keys, mask | stack_mask  # the launch's Python stack (torch traces with_stack)
    combo, combos = classify_masks(export, ops, mask, patterns, ruleset)
    from profattr.attribute.gemm_dims import LinearRanges, without_m

    gemm = LinearRanges(ranges).of(placement.tid, placement.t_ns)
    if mapped is not None and mapping.gemm_mnk is not None:
        # an op that borrowed its context borrows its layer's N and K; not M (the eager twin may run another batch)
        take = (status == STATUS_MAPPING) & (gemm < 0)
        gemm[take] = without_m(mapping.gemm_mnk[mapped[take]])
    return Attribution(ops=ops, step=step, combo=combo, combos=combos, steps=steps, ranges=ranges,
                       context_method=method, ctx_tid=placement.tid, ctx_ns=placement.t_ns, status=status,
                       mask=mask, mapping=mapping, mapped=mapped, mapping_report=report, names=names, gemm_mnk=gemm)


def context_mask(ranges: Ranges, patterns: Sequence[str], ctx_tid, ctx_ns, selected: list | None = None
                 ) -> np.ndarray:
    """Per op, bit b set when an NVTX range whose text matches patterns[b] encloses its context point.
    `selected`: context_ranges(ranges, patterns), when already computed (windows)."""
    mask = np.zeros(len(ctx_ns), dtype=np.int64)
    for bit, (tid, start, end) in enumerate(selected if selected is not None else context_ranges(ranges, patterns)):
        if len(start):
            hit = enclosed(tid, start, end, ctx_tid, ctx_ns)
            mask |= hit.astype(np.int64) << bit
    return mask


def context_ranges(ranges: Ranges, patterns: Sequence[str]) -> list:
    """Per pattern, the (tid, start, end) arrays of the ranges whose text matches it."""
    frame = ranges.frame
    texts = frame["text"].astype(str).str.slice(0, MAX_MATCH_CHARS) if len(frame) else None  # regexguard.py
    out = []
    for pattern in patterns:
        sel = frame[texts.str.contains(pattern, regex=True)] if len(frame) else frame
        out.append((sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy()))
    return out


def classify_masks(export, ops: Ops, mask: np.ndarray, patterns: Sequence[str], ruleset):
    """(combo per op, combos frame) from each op's context bits (see context_mask)."""
    registry = Combos(export, patterns, ruleset)
    reg = registry.ids(ops, mask)
    final, combos = registry.finish()
    return final[reg], combos


def summarize(export, att: Attribution) -> Budget:
    totals = StepTotals()
    totals.add(att.ops, att.step, att.combo, None, None, categories=att.combos["category"].to_numpy(),
               gemm=att.gemm_mnk)
    tables = totals.finish(np.arange(len(att.combos)), att.combos)
    texts = ContextTexts(export)
    texts.add(att.ops, att.combo, att.combos["evidence"].to_numpy(), att.combos["conflict"].to_numpy(), att.ranges,
              att.ctx_tid, att.ctx_ns, att.status, att.step >= 0)
    budget = assemble(export, att.steps, att.context_method, att.combos, *tables,
                      att.placement() if att.status is not None else None, exclusive=totals.exclusive_ns(),
                      short_kernels=totals.short, context_summary=texts.finish())
    add_comm(budget, att)
    return budget


def assemble(export, steps: Steps, context_method: str, combos_frame: pd.DataFrame, per_step: pd.DataFrame,
             per_step_category: pd.DataFrame, per_combo: pd.DataFrame, outside: dict,
             nvtx_placement: dict | None, exclusive: pd.DataFrame | None = None,
             short_kernels: dict | None = None, context_summary: dict | None = None) -> Budget:
    """The Budget from the totals (accumulate.StepTotals.finish) of its steps; `exclusive`: StepTotals.exclusive_ns
    (the busy time split among categories), which also gives per_step_category its `exclusive_ns` column; `short_kernels`: per device, (ns,
    count) of the kernels under accumulate.SHORT_KERNEL_NS (StepTotals.short)."""
    if exclusive is None:
        exclusive = pd.DataFrame({"device": [], "step": [], "category": [], "exclusive_ns": []})
    if per_step_category is not None:
        per_step_category = with_exclusive(per_step_category, exclusive)
    excl_by = exclusive.groupby(["device", "category"])["exclusive_ns"].sum()
    devices = []
    for device in sorted(set(per_step["device"].tolist())):
        d_steps = per_step[per_step["device"] == device]
        n = len(d_steps)
        excl = excl_by.loc[device].to_dict() if device in excl_by.index.get_level_values(0) else {}
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
            "distributions": device_distributions(d_steps, exclusive[exclusive["device"] == device]),
        })
    return Budget(path=str(export.path), nsys_version=export.nsys_version,
                  schema_version=export.schema_version, gpus=export.gpus, steps_source=steps.source,
                  steps_reason=steps.reason, steps_count=len(steps), devices=devices, per_step=per_step,
                  format=export.format, tool_version=export.tool_version, steps_excluded=dict(steps.excluded),
                  per_step_category=per_step_category, context_method=context_method,
                  nvtx_placement=nvtx_placement)


def with_exclusive(per_step_category: pd.DataFrame, exclusive: pd.DataFrame) -> pd.DataFrame:
    """per_step_category with an `exclusive_ns` column: the exclusive time of the same (device, step, category), 0
    where it has none. The rows of a left merge, in the same order, found by one index look-up instead (a merge
    holds copies of both tables: on a long capture, millions of rows each)."""
    keys = ["device", "step", "category"]
    out = per_step_category.copy(deep=False)
    if not len(exclusive) or not len(out):
        out["exclusive_ns"] = np.zeros(len(out), dtype=np.int64)
        return out
    right = pd.MultiIndex.from_arrays([exclusive[k].to_numpy() for k in keys])
    pos = right.get_indexer(pd.MultiIndex.from_arrays([out[k].to_numpy() for k in keys]))
    values = exclusive["exclusive_ns"].to_numpy().astype(np.int64)
    out["exclusive_ns"] = np.where(pos >= 0, values[np.maximum(pos, 0)], 0).astype(np.int64)
    return out


def _category_row(category: str, op_ns: float, count: float, exclusive_ns: int, n: int, mean_step_ms: float) -> dict:
    """A device's category row: op time, exclusive and overlapped time per step, share of the mean step."""
    exclusive_ms = exclusive_ns / n / NS_PER_MS
    return {"category": category, "ms_per_step": op_ns / n / NS_PER_MS, "count_per_step": count / n,
            "exclusive_ms_per_step": exclusive_ms, "overlapped_ms_per_step": (op_ns - exclusive_ns) / n / NS_PER_MS,
            "share": exclusive_ms / mean_step_ms if mean_step_ms else 0.0}


def _steps_per_device(budget: Budget) -> dict:
    return {d["device"]: d["steps"] for d in budget.devices}


def add_comm(budget: Budget, att: Attribution) -> None:
    """Per device `comm` (transfer / wait split of collectives) when two or more GPUs run collectives."""
    apply_comm(budget, collective_split(att.ops, att.step, att.steps.start, att.category(),
                                        _steps_per_device(budget)))


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


def add_layers(budget: Budget, att: Attribution, layer_range: str | None = None) -> None:
    """Per device `layers` rows (layers.py); ops in no layer range form the `layer: None` row."""
    from profattr.attribute.layers import DEFAULT_LAYER_PATTERN, layer_rows, op_layers

    labels = op_layers(att, layer_range)
    rows = layer_rows(att, labels, att.category(), _steps_per_device(budget))
    for d in budget.devices:
        d["layers"] = rows.get(d["device"], [])
    budget.layer_pattern = layer_range if layer_range is not None else DEFAULT_LAYER_PATTERN
