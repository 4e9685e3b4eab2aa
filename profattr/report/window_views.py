"""The report's views of a capture's ops, read window by window from its op store: the launch and idle analysis
(launches.py), the median step of each GPU for the timeline (timeline.py), the facts the checks read
(check/facts.py) and the spread of the largest kernels (attribute/distributions.py). Memory is bounded by a window
of ops, not by the capture, as for the budget (attribute/windows.py), and every view is the one the budget's
attribution over all ops gives: each is a sum, a count, an extreme or an exact median over the windows, or (the
timeline) the ops of one step gathered as the windows pass.

For a budget computed window by window (compute_budget(..., keep_attribution=ONE_WINDOW) with its `windowed`);
None where it was not (its attribution then serves the views at once).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profattr.attribute.accumulate import Combos
from profattr.attribute.distributions import KernelSteps
from profattr.attribute.windows import WindowContexts
from profattr.check.facts import OpFacts
from profattr.check.first_calls import FirstCalls
from profattr.report.launches import LaunchTally
from profattr.report.timeline import choose_step, view_of
from profattr.trace.store import concat_ops


@dataclass
class Views:
    launches: list  # launches.launch_stats
    timeline: list  # timeline.step_view per device
    op_facts: OpFacts  # for check/run.py evaluate_budget


def window_views(budget, source, ruleset, timeline_step="median") -> Views | None:
    """The views of `source` (the reader the budget was computed from) in one more pass over its windows, with
    the budget's steps; adds the largest kernels' spread to the budget's distributions. None when the budget was
    not computed window by window."""
    w = budget.windowed
    if w is None:
        return None
    windows = source.time_windows()
    if windows is None:
        return None
    api, ranges = source.host_calls(), source.ranges()
    launches = LaunchTally(budget, source, w.steps, api, ranges)
    facts = OpFacts(FirstCalls())  # the ops in start order: the first-call check's figures too
    kernels = KernelSteps(budget, source)
    chosen = _ChosenSteps(budget, source, ruleset, timeline_step)
    for ops in windows:
        step = w.step_of(ops)
        launches.add(ops, step)
        facts.add(ops)
        kernels.add(ops, step)
        chosen.add(ops, step)
        del ops, step  # not held while the next window is read
    kernels.finish()
    views = [view_of(budget, device, s, ops, category, w.steps, api, ranges)
             for device, s, ops, category in chosen.finish()]
    return Views(launches=launches.finish(), timeline=views, op_facts=facts)


class _ChosenSteps:
    """The ops of one chosen step per device (the timeline's), with their categories: classified as the budget
    classified them (windows.py WindowContexts: each op's context point, context bits and combination are its
    own)."""

    def __init__(self, budget, source, ruleset, spec):
        w = budget.windowed
        self.steps = {int(d["device"]): choose_step(budget, int(d["device"]), spec) for d in budget.devices}
        self.contexts = WindowContexts(source, w.ranges, Combos(source, list(ruleset.context_patterns), ruleset))
        self.parts = {device: [] for device in self.steps}

    def add(self, ops, step: np.ndarray) -> None:
        picks = {device: np.flatnonzero((ops.device == device) & (step == s)) for device, s in self.steps.items()}
        if not any(len(idx) for idx in picks.values()):
            return
        combos = self.contexts.combos
        for device, idx in picks.items():
            if len(idx):  # an op's context and category are its own: only the step's ops are classified
                chosen = ops.take(idx)
                _, _, reg = self.contexts.of(chosen)
                category = np.array([combos.category_of(int(r)) for r in reg], dtype=object)
                self.parts[device].append((chosen, category))

    def finish(self):
        """(device, step, its ops in start order, their categories) per device."""
        for device, s in self.steps.items():
            parts = self.parts[device]
            ops = concat_ops([p[0] for p in parts])
            category = np.concatenate([p[1] for p in parts])
            order = np.argsort(ops.start, kind="stable")
            yield device, s, ops.take(order), category[order].astype(str)
