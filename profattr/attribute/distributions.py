"""The spread of a device's step over its steps, not only the mean: per category, for the step span and its idle
time, and (where the attribution is at hand) for the largest kernels.

A category's value in a step is its exclusive time there (exclusive.py: its share of the step's busy time), so the
categories and idle of a step add up to its span; a kernel's is its summed op time. For each series (one value per
step of the device, in ms; 0 for a step where a category or kernel did not run):
median, p90 (numpy's linear percentile), max, mean, and the outlier steps: those above median + 3 x MAD (the median
absolute deviation, scaled by 1.4826 to a normal sigma) and above median + 5% (so that a series tighter than its
timer's noise names no step), plus, for the step span, the warm-up steps the
steady-state check finds (steady.py). Steps are named by the budget's step index (the `step` of per_step).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profattr.attribute.ns_sums import checked_ns

NS_PER_MS = 1e6
MAD_FACTOR = 3.0
MAD_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal data
MIN_EXCESS = 0.05  # an outlier is at least this share above the median
TOP_KERNELS = 5
MAX_OUTLIERS = 20  # steps listed per series; `outliers` counts them all


def spread(values_ns: np.ndarray, steps: np.ndarray) -> dict:
    """median, p90, max and mean (ms) of one value per step, and the steps above median + 3 x MAD."""
    v = np.asarray(values_ns, dtype=np.float64)
    if not len(v):
        return {"median_ms": 0.0, "p90_ms": 0.0, "max_ms": 0.0, "mean_ms": 0.0, "mad_ms": 0.0, "outliers": 0,
                "outlier_steps": []}
    median = float(np.median(v))
    mad = float(np.median(np.abs(v - median)))
    above = np.flatnonzero(v > median + max(MAD_FACTOR * MAD_SIGMA * mad, MIN_EXCESS * median))
    above = above[np.argsort(-v[above], kind="stable")]
    return {"median_ms": median / NS_PER_MS, "p90_ms": float(np.percentile(v, 90)) / NS_PER_MS,
            "max_ms": float(v.max()) / NS_PER_MS, "mean_ms": float(v.mean()) / NS_PER_MS, "mad_ms": mad / NS_PER_MS,
            "outliers": int(len(above)), "outlier_steps": [int(s) for s in steps[above][:MAX_OUTLIERS]]}


def device_distributions(d_steps: pd.DataFrame, table=None, device: int | None = None) -> dict:
    """The `distributions` block of one device from its per_step rows and the step table (step_table.py
    StepCategories: its exclusive time per step and category; None: only the step and idle series)."""
    from profattr.attribute.steady import steady_state

    d_steps = d_steps.sort_values("start_ns")
    steps = d_steps["step"].to_numpy(np.int64)
    span = d_steps["span_ns"].to_numpy(np.int64)
    step = spread(span, steps)
    warm = steady_state(span).warmup_steps
    step["warmup_steps"] = [int(s) for s in steps[:warm]]
    out = {"steps": int(len(steps)),
           "outlier_rule": f"above median + max({MAD_FACTOR:g} x 1.4826 x MAD, {MIN_EXCESS:.0%} of the median)",
           "category_time": "exclusive", "step": step,
           "idle": spread(span - d_steps["busy_ns"].to_numpy(np.int64), steps), "categories": []}
    present = table.present(device, exclusive=True) if table is not None else np.zeros(0, dtype=bool)
    if present.any():
        # the categories with exclusive time on the device, by name, summed as a frame and sorted by its sums the
        # way a pivot of the per-row table was (equal sums keep the order that sort gives them)
        names = np.asarray(table.categories, dtype=object)[present]
        by_name = np.argsort(names, kind="stable")
        values = table.table(device, steps, "exclusive_ns")[:, np.flatnonzero(present)[by_name]]
        frame = pd.DataFrame(values, index=pd.Index(steps, name="step"),
                             columns=pd.Index(names[by_name], name="category"))
        for name in frame.sum(axis=0).sort_values(ascending=False).index:
            out["categories"].append({"category": str(name), **spread(frame[name].to_numpy(), steps)})
    return out


def kernel_distributions(budget, top: int = TOP_KERNELS) -> None:
    """Add `kernels` (the `top` largest kernels by time, by short name) to each device's `distributions`, from the
    budget's attribution. Ops are grouped by integer codes of their names (no text column of every op)."""
    att = budget.attribution
    if att is None:
        return
    name_code, names = _name_codes(att.combos)
    inside = att.step >= 0
    device = att.ops.device[inside]
    step = att.step[inside]
    code = name_code[att.combo[inside]] if len(names) else np.zeros(int(inside.sum()), dtype=np.int64)
    ns = att.ops.duration_ns[inside].astype(np.int64)
    for d in budget.devices:
        if d.get("distributions") is None:
            continue
        mine = device == d["device"]
        c, v, st = code[mine], ns[mine], step[mine]
        total = checked_ns(np.bincount(c, weights=v, minlength=len(names)))  # exact: sums far below 2**53
        order = _largest(total, np.bincount(c, minlength=len(names)) > 0, names, top)
        steps = _device_steps(budget, d["device"])
        _set_kernels(d, order, steps, _code_table(c, st, v, steps, {str(n): i for i, n in enumerate(names)}, order))


class KernelSteps:
    """kernel_distributions a window of ops at a time, for a budget computed window by window (windows.py): the
    largest kernels from its op time per combination (`budget.windowed.per_combo`), their time per step summed
    over the windows (`add`: ops with their budget step), added to the budget by `finish`."""

    def __init__(self, budget, source, top: int = TOP_KERNELS):
        from profattr.attribute.accumulate import op_names

        self.budget, self.source, self.op_names = budget, source, op_names
        w = budget.windowed
        name_code, self.names = _name_codes(w.combos)
        self.code_of = {str(n): i for i, n in enumerate(self.names)}
        self.pair_code: dict = {}  # (demangled id, short id) -> name code
        self.devices = {}  # device -> [steps, largest names, table]
        per_combo = w.per_combo
        for d in budget.devices:
            if d.get("distributions") is None:
                continue
            pc = per_combo[per_combo["device"] == d["device"]]
            c = name_code[pc["combo"].to_numpy(np.int64)] if len(self.names) else np.zeros(len(pc), dtype=np.int64)
            total = checked_ns(np.bincount(c, weights=pc["ns"].to_numpy(np.int64), minlength=len(self.names)))
            ran = np.bincount(c, weights=pc["count"].to_numpy(np.int64), minlength=len(self.names)) > 0
            order = _largest(total, ran, self.names, top)
            steps = _device_steps(budget, d["device"])
            self.devices[int(d["device"])] = [steps, order, np.zeros((len(steps), len(order)), dtype=np.int64)]

    def add(self, ops, step: np.ndarray) -> None:
        inside = step >= 0
        if not self.devices or not inside.any():
            return
        code = self._codes(ops.demangled_id[inside], ops.name_id[inside])
        device, st, ns = ops.device[inside], step[inside], ops.duration_ns[inside].astype(np.int64)
        for dev, (steps, order, table) in self.devices.items():
            mine = device == dev
            table += _code_table(code[mine], st[mine], ns[mine], steps, self.code_of, order)

    def _codes(self, demangled: np.ndarray, short: np.ndarray) -> np.ndarray:
        """The name code of each op, from its (demangled, short) string ids, as the combos name it."""
        from profattr.attribute.accumulate import group_rows

        uniq, local = group_rows(demangled, short)
        keys = [tuple(int(x) for x in r) for r in uniq]
        new = [k for k in keys if k not in self.pair_code]
        if new:
            strings = self.source.strings([k[0] for k in new if k[0] >= 0] + [k[1] for k in new if k[1] >= 0])
            for k in new:
                self.pair_code[k] = self.code_of[str(self.op_names(k[0], k[1], strings)[0])]
        codes = np.array([self.pair_code[k] for k in keys], dtype=np.int64)
        return codes[local] if len(local) else np.zeros(0, dtype=np.int64)

    def finish(self) -> None:
        for d in self.budget.devices:
            if int(d["device"]) in self.devices:
                steps, order, table = self.devices[int(d["device"])]
                _set_kernels(d, order, steps, table)


def _name_codes(combos: pd.DataFrame) -> tuple:
    """(name code per combination, the names sorted): codes in name order."""
    name_code, names = pd.factorize(combos["name"].to_numpy(), sort=True)
    return name_code, np.asarray(names, dtype=object)


def _largest(total: np.ndarray, ran: np.ndarray, names: np.ndarray, top: int):
    """The `top` names by summed time, of those that ran: a groupby-sum's Series (names sorted), sorted by its sums
    as that was (equal sums keep that sort's order)."""
    sums = pd.Series(total[ran], index=pd.Index(names[ran], name="name"))
    return sums.sort_values(ascending=False).index[:top]


def _device_steps(budget, device) -> np.ndarray:
    steps = budget.per_step.loc[budget.per_step["device"] == device].sort_values("start_ns")["step"]
    return steps.to_numpy(np.int64)


def _set_kernels(d: dict, order, steps: np.ndarray, table: np.ndarray) -> None:
    d["distributions"]["kernels"] = [{"name": str(n), **spread(table[:, j], steps)} for j, n in enumerate(order)]


def _code_table(code, step, ns, steps, code_of: dict, keys) -> np.ndarray:
    """len(steps) x len(keys) summed `ns` of the ops whose name code is that of each key, in the order of `steps`
    (0 where a key did not run)."""
    column = np.full(len(code_of), -1, dtype=np.int64)
    for j, key in enumerate(keys):
        column[code_of[str(key)]] = j
    order = np.argsort(steps, kind="stable")
    col = column[code] if len(code) else np.zeros(0, dtype=np.int64)
    at = np.searchsorted(steps[order], step)
    known = (col >= 0) & (at < len(steps))
    known[known] = steps[order][at[known]] == step[known]
    out = np.zeros((len(steps), len(keys)), dtype=np.int64)
    np.add.at(out, (order[at[known]], col[known]), ns[known])
    return out
