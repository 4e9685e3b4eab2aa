"""The budget computed window by window over a capture's op store (trace/store.py): memory is bounded by a window
of ops, not by the capture, and the result is identical to computing it over all ops at once (budget.py attribute +
summarize): the same steps, contexts, combinations and totals (attribute/accumulate.py says why the sums, and the
busy time in start order, add up exactly).
"""
from __future__ import annotations

import numpy as np

from profattr.attribute import budget_parts as B
from profattr.attribute.accumulate import Combos, StepTotals
from profattr.attribute.comm import collective_split
from profattr.attribute.gemm_dims import LinearRanges
from profattr.attribute.context import ContextTexts
from profattr.attribute.graphs import PlacementCounts, place_contexts
from profattr.attribute.nvtx import distinct_points, load_ranges
from profattr.attribute.steps import find_steps


def by_windows(source, steps_spec: str, ruleset, skip_steps=None, step_categories: bool = True):
    """The Budget of `source` (an op-store reader, trace/cache.py StoreSource) window by window; None when its ops
    are not in start order. Without `step_categories`, its per_step_category is None (and never held)."""
    store = source.store
    ranges = load_ranges(source)
    steps = find_steps(source, steps_spec, ranges, store)
    patterns = list(ruleset.context_patterns)
    combos = Combos(source, patterns, ruleset)
    budget = _pass(source, store, steps, ranges, patterns, combos, step_categories=step_categories)
    if budget is None or skip_steps in (None, 0, "0"):
        return budget
    leading = B._leading_to_skip(budget, skip_steps)
    if not leading:
        return budget
    how = "auto: the slow start the steady-state test found" if skip_steps == "auto" else "--skip-steps"
    kept, remap = B.skip_remap(steps, leading, f"first {leading} step(s) of each thread ({how})")
    return _pass(source, store, kept, ranges, patterns, combos, remap, assign=steps, step_categories=step_categories)


class WindowContexts:
    """How each window's ops are classified: their NVTX context point (graphs.py), the context bits and linear
    layer shape read there, and their combination's id in `combos` (new combinations classified)."""

    def __init__(self, source, ranges, combos: Combos):
        self.source, self.ranges, self.combos = source, ranges, combos
        self.selected = B.context_ranges(ranges, combos.ruleset.context_regexes)
        self.linear = LinearRanges(ranges)  # layerwise NVTX markers of linear layers: a GEMM's M, N, K (gemm_dims.py)
        self.asks_ranges = len(self.linear) > 0 or any(len(start) for _, start, _ in self.selected)

    def of(self, ops):
        """(placement, gemm per op, combination id per op) of one window's ops."""
        ranges, regexes = self.ranges, self.combos.ruleset.context_regexes
        placement = place_contexts(self.source, ops, ranges)
        if self.asks_ranges:  # the NVTX questions, once per distinct context point (graph replays share theirs)
            point_tid, point_ns, point = distinct_points(placement.tid, placement.t_ns)
            mask = B.context_mask(ranges, regexes, point_tid, point_ns, self.selected)[point]
            gemm = self.linear.of(point_tid, point_ns)[point]
        else:  # no range to look up: nothing to share
            mask = B.context_mask(ranges, regexes, placement.tid, placement.t_ns, self.selected)
            gemm = self.linear.of(placement.tid, placement.t_ns)
        return placement, gemm, self.combos.ids(ops, mask)


def _pass(source, store, steps, ranges, patterns, combos: Combos, remap=None, assign=None, step_categories=True):
    """One pass over the windows. `steps` are the budget's; with `remap`, ops are assigned to the steps `assign`
    (all of them) and then renumbered into `steps` (-1: a left-out step)."""
    assign = steps if assign is None else assign

    windows = source.time_windows()
    if windows is None:
        return None
    totals = StepTotals(step_categories, pairs=len(steps))
    counts = PlacementCounts()
    contexts = WindowContexts(source, ranges, combos)
    texts = ContextTexts(source)
    for ops in windows:
        step = assign.assign(ops.launch_tid, ops.launch_ns, ops.launched)
        if remap is not None:
            step = remap[step]
        placement, gemm, reg = contexts.of(ops)
        counts.add(placement.counts_of_method)
        totals.add(ops, step, reg, combos, placement.status, gemm=gemm)
        texts.add(ops, reg, [v[4] for v in combos.values], [v[7] for v in combos.values], ranges, placement.tid,
                  placement.t_ns, placement.status, step >= 0)
        if not totals.in_order:
            return None
        del ops, step, placement, gemm, reg  # not held while the next window is read
    final, frame = combos.finish()
    per_step, table, per_combo, outside = totals.finish(final, frame)
    budget = B.assemble(source, steps, counts.method(ranges), frame, per_step, table, per_combo, outside,
                        B.placement_dict(totals.status), short_kernels=totals.short,
                        context_summary=texts.finish(final))
    budget.windowed = B.WindowedPass(assign=assign, remap=remap, steps=steps, ranges=ranges, per_combo=per_combo,
                                     combos=frame)
    category_of_reg = np.array([combos.category_of(i) for i in range(len(combos.rows))], dtype=object)
    comm = totals.comm_ops(category_of_reg)
    if comm is not None:
        ops, step, category = comm
        B.apply_comm(budget, collective_split(ops, step, steps.start, category, B._steps_per_device(budget)))
    return budget
