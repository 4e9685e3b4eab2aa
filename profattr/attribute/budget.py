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

from contextlib import contextmanager
from dataclasses import replace
from typing import Sequence

import numpy as np

from profattr.attribute.accumulate import Combos, StepTotals
from profattr.attribute.comm import collective_split
from profattr.attribute.distributions import kernel_distributions
from profattr.attribute.graphs import STATUS_MAPPING, STATUS_UNPLACED, place_contexts
from profattr.attribute.nvtx import load_ranges
from profattr.attribute.precision import annotate as annotate_precision
from profattr.attribute.steps import find_steps
from profattr.errors import ProfattrError
from profattr.attribute.context import (ContextTexts, launch_stack_bits, torch_op_bits,
                                        warn_unmatched_contexts)
from profattr.attribute.windows import by_windows
from profattr.taxonomy.classify import load_rules
from profattr.taxonomy.ruleset import RuleSet
from profattr.trace.ops import Ops
from profattr.trace.cache import StoreSource, store_or_export
from profattr.trace.store import window_ops
from profattr.trace.protocol import is_reader
from profattr.trace.source import open_trace
# the types and the shared pieces live in budget_parts.py (windows.py builds from them too); importable here
from profattr.attribute.budget_parts import (NS_PER_MS, SCHEMA, Attribution, Budget,  # noqa: F401
                                             _category_row, _leading_to_skip, _steps_per_device, apply_comm,
                                             assemble, context_mask, context_ranges, placement_dict, skip_remap)


# keep_attribution=ONE_WINDOW: compute the budget window by window where it can (its `windowed` then says how, for
# views that read the windows again: report/window_views.py), and keep the attribution only where it was computed
# over all ops at once (as it is where they fit one window)
ONE_WINDOW = "one-window"


def compute_budget(capture, steps: str = "auto", rules=(), *, force: bool = False, keep_attribution: bool = False,
                   mapping=None, by: str = "category", layer_range: str | None = None, skip_steps=None,
                   step_categories: bool = True, require_work: bool = True) -> Budget:
    """The per-step budget of a capture: the one budget engine every command and the library call.

    `capture`: a path (.sqlite, .nsys-rep exported on demand, torch-profiler traces, a folder of rank traces) or a
    reader already open (trace/protocol.py Reader): it is read, and left open, so a command that needs more than
    the budget opens the capture once. `rules`: rule files (TOML), or a RuleSet already loaded.

    How it is computed is the engine's choice, and the result is the same either way: window by window over the
    capture's op store (windows.py: memory bounded by a window) where nothing asks for every op at once, else in
    one window over all ops (`keep_attribution`, `mapping`, layers; readers without windows; damaged rows, which the
    one-window path counts and names; keep_attribution=ONE_WINDOW keeps it only then). `mapping`: an eager capture of the same workload whose NVTX context is lent
    to replayed graph ops that have none (mapping.py). `by="layer"` adds per-layer rows to every device
    (`layer_range`: the layer regex). `skip_steps`: leave out the first N steps of each thread, or "auto" the slow
    start the steady-state test finds (attribute/steady.py); the budget says what it left out.
    `step_categories=False` leaves out `per_step_category` (op time and count per step and category,
    step_table.py: what diff reads). `require_work=False` (the checks) returns a budget with no devices instead of
    the error when the steps hold no GPU work.
    """
    if by not in ("category", "layer"):
        raise ProfattrError(f"--by {by!r}: expected category or layer")
    ruleset = rules if isinstance(rules, RuleSet) else load_rules(rules)
    lent = _mapping_attribution(mapping, steps, ruleset, force) if mapping is not None else None
    windowed = (lent is None and keep_attribution in (False, ONE_WINDOW) and by == "category"
                and layer_range is None)
    if is_reader(capture):
        budget = _read_budget(capture, steps, ruleset, lent, skip_steps, step_categories, windowed, require_work,
                              keep_attribution == ONE_WINDOW)
    else:
        with open_trace(capture, force=force) as export:
            budget = _read_budget(export, steps, ruleset, lent, skip_steps, step_categories, windowed, require_work,
                                  keep_attribution == ONE_WINDOW)
    attribution = budget.attribution
    # the spread of the largest kernels: where the caller reads every op at once (not where a windowed budget fell
    # back to one window: its JSON stays the same), and for ONE_WINDOW callers (who add it from the windows)
    if not windowed or (keep_attribution == ONE_WINDOW and attribution is not None):
        kernel_distributions(budget)
    if by == "layer" or layer_range is not None:
        add_layers(budget, attribution, layer_range)
    if not keep_attribution:
        budget.attribution = None
    if keep_attribution != ONE_WINDOW:
        budget.windowed = None  # only a caller that reads the windows again needs what they were read with
    if not step_categories:
        budget.per_step_category = None
    return budget


def _read_budget(export, steps: str, ruleset, mapping, skip_steps, step_categories: bool, windowed: bool,
                 require_work: bool, small_at_once: bool = False) -> Budget:
    """The budget of an open reader: window by window where it can, else in one window (keeping the attribution).
    `small_at_once`: a store whose ops fit one window is read at once (the same memory; the caller's views then
    come from the attribution instead of a second pass over the window)."""
    warn_unmatched_contexts(export, ruleset)
    reader = store_source(export)
    try:
        budget = None
        if small_at_once and isinstance(reader, StoreSource) and reader.store.rows <= window_ops():
            windowed = False
        if windowed and isinstance(reader, StoreSource):  # None when its ops are not in start order
            budget = by_windows(reader, steps, ruleset, skip_steps, step_categories)
        if budget is not None and (not budget.devices or reader.claims.total()):
            budget = None  # damaged rows or no work in the steps: the one-window path counts and says it
        if budget is not None:
            annotate_precision(budget.devices, ruleset)
        else:  # needs every op at once (attribution, layers, mapping), or no windows to read
            budget = _one_window(reader, steps, ruleset, mapping=mapping, skip_steps=skip_steps,
                                 require_work=require_work)
    finally:
        if reader is not export:
            reader.close()
    return budget


@contextmanager
def opened(capture, force: bool = False):
    """The reader a command computes everything with (`with opened(path) as reader:`): the capture opened once
    (trace/source.py open_trace) and, for an nsys export, its op store (cached), so that the budget, the checks and
    the views read the store's columns instead of SQL again; closed at the end."""
    with open_trace(capture, force=force) as export:
        try:
            reader = store_source(export)
        except ProfattrError:  # nothing to store (no kernel data, ...): the budget says so where a command expects
            reader = export
        try:
            yield reader
        finally:
            if reader is not export:
                reader.close()


store_source = store_or_export  # the reader to compute with (trace/cache.py); importable here too


def _one_window(export, steps: str, ruleset, mapping: "Attribution | None" = None, skip_steps=None,
                require_work: bool = True) -> Budget:
    """The budget of an open reader over all its ops at once, keeping its attribution (compute_budget's engine
    where windows cannot serve; the tests' reference for the windowed one)."""
    attribution = attribute(export, steps, ruleset, mapping=mapping)
    budget = summarize(export, attribution)
    if skip_steps not in (None, 0, "0"):
        leading = _leading_to_skip(budget, skip_steps)
        if leading:
            how = "auto: the slow start the steady-state test found" if skip_steps == "auto" else "--skip-steps"
            attribution = skip_leading_steps(attribution, leading, f"first {leading} step(s) of each thread ({how})")
            budget = summarize(export, attribution)
    claims = export.claims
    if require_work or len(attribution.ops) == 0:
        _require_work(export, budget, attribution, claims)
    budget.attribution = attribution
    annotate_precision(budget.devices, ruleset)
    budget.skipped_rows = {t: dict(r) for t, r in claims.skipped.items()}
    claims.warn()
    return budget


def _require_work(export, budget: Budget, att: Attribution, claims) -> None:
    """One clear error when there is nothing to budget: no GPU work in the capture, or none inside its steps."""
    if budget.devices:
        return
    damaged = f" (and {claims.total()} damaged row(s) were skipped)" if claims.total() else ""
    if len(att.ops) == 0 and claims.why_no_work():
        raise ProfattrError(claims.why_no_work())
    if len(att.ops) == 0:
        raise ProfattrError(f"{export.path}: no GPU work in the capture: no kernel, memcpy or memset rows{damaged}; "
                            "capture with `--trace=cuda` (and `--cuda-graph-trace=node`)")
    raise ProfattrError(f"{export.path}: no GPU work in its steps: none of its {len(att.ops)} GPU ops was launched "
                        f"inside one of the {len(att.steps)} steps ({att.steps.source}){damaged}; try --steps whole, "
                        "or --steps nvtx:NAME with a range that encloses the launches")


def skip_leading_steps(att: Attribution, n: int, what: str) -> Attribution:
    """The attribution without the first `n` steps of each thread (their ops count as outside the steps)."""
    steps, remap = skip_remap(att.steps, n, what)
    return replace(att, steps=steps, step=remap[att.step])  # -1 stays -1 (the extra last slot)


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
    mask = context_mask(ranges, ruleset.context_regexes, placement.tid, placement.t_ns)
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


def classify_masks(export, ops: Ops, mask: np.ndarray, patterns: Sequence[str], ruleset):
    """(combo per op, combos frame) from each op's context bits (see context_mask)."""
    registry = Combos(export, patterns, ruleset)
    reg = registry.ids(ops, mask)
    final, combos = registry.finish()
    return final[reg], combos


def summarize(export, att: Attribution) -> Budget:
    """The Budget of an attribution. Its ops are summed a window of them at a time, in start order (the windows
    add up to the same totals, accumulate.py says why): one sum over every op of a long capture held several
    copies of its op arrays at once."""
    totals = StepTotals(pairs=len(att.steps))
    categories = att.combos["category"].to_numpy()
    for index in start_windows(att.ops.start):
        totals.add(att.ops.take(index), att.step[index], att.combo[index], None, None, categories=categories,
                   gemm=att.gemm_mnk[index] if att.gemm_mnk is not None else None)
    tables = totals.finish(np.arange(len(att.combos)), att.combos)
    texts = ContextTexts(export)
    texts.add(att.ops, att.combo, att.combos["evidence"].to_numpy(), att.combos["conflict"].to_numpy(), att.ranges,
              att.ctx_tid, att.ctx_ns, att.status, att.step >= 0)
    budget = assemble(export, att.steps, att.context_method, att.combos, *tables,
                      att.placement() if att.status is not None else None, short_kernels=totals.short,
                      context_summary=texts.finish())
    add_comm(budget, att)
    return budget


def start_windows(start: np.ndarray):
    """Index arrays of the ops in start order, trace/store.py's window size at a time (all of them in one when
    they are few)."""
    from profattr.trace.store import window_ops

    size = window_ops()
    if len(start) <= size:
        yield slice(None)
        return
    order = np.argsort(start, kind="stable")
    for lo in range(0, len(order), size):
        yield order[lo:lo + size]


def add_comm(budget: Budget, att: Attribution) -> None:
    """Per device `comm` (transfer / wait split of collectives) when two or more GPUs run collectives."""
    apply_comm(budget, collective_split(att.ops, att.step, att.steps.start, att.category(),
                                        _steps_per_device(budget)))


def add_layers(budget: Budget, att: Attribution, layer_range: str | None = None) -> None:
    """Per device `layers` rows (layers.py); ops in no layer range form the `layer: None` row."""
    from profattr.attribute.layers import DEFAULT_LAYER_PATTERN, layer_rows, op_layers

    labels = op_layers(att, layer_range)
    rows = layer_rows(att, labels, att.category(), _steps_per_device(budget))
    for d in budget.devices:
        d["layers"] = rows.get(d["device"], [])
    budget.layer_pattern = layer_range if layer_range is not None else DEFAULT_LAYER_PATTERN
