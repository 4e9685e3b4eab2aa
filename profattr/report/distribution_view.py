"""The report's Distributions section: how much a step, its idle time and its largest categories vary from step to
step (the budget's `distributions`, attribute/distributions.py; a category's exclusive time), as a table and a violin chart of each series'
per-step values relative to its median. A replicate group shows its first replicate.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from profattr.report.charts import IDLE_COLOR, PALETTE, _plt, _save, safe_label
from profattr.text import md_escape
from profattr.report.md_table import _devices_label, _table

NS_PER_MS = 1e6
CHART_CATEGORIES = 6  # per (capture, GPU): the step, idle and this many categories
TABLE_CATEGORIES = 6
DISTRIBUTION_CHART = "distributions.png"
LISTED_STEPS = 6


def _first(cap):
    """(budget dict, per_step, per_step_category) of the capture, or of a group's first replicate."""
    side = cap.side
    if side is None:
        return cap.budget, None, None
    first = side.members[0]
    return first.budget, first.per_step, first.per_step_category


def series(d: dict, per_step, per_step_category, limit: int = CHART_CATEGORIES) -> list:
    """[(name, per-step ns array)] of one device: step span, idle, and its largest categories' exclusive time (0
    where absent)."""
    rows = per_step[per_step["device"] == d["device"]].sort_values("start_ns")
    steps = rows["step"].to_numpy(np.int64)
    out = [("step", rows["span_ns"].to_numpy(np.float64)),
           ("idle", (rows["span_ns"] - rows["busy_ns"]).to_numpy(np.float64))]
    if per_step_category is None or per_step_category.exclusive_ns is None:
        return out
    table = per_step_category.table(d["device"], steps, "exclusive_ns")  # step_table.py: steps x categories
    ran = per_step_category.present(d["device"])
    column = {name: j for j, name in enumerate(per_step_category.categories) if ran[j]}
    for c in [c["category"] for c in d.get("distributions", {}).get("categories", [])][:limit]:
        if c in column:
            out.append((c, table[:, column[c]].astype(np.float64)))
    return out


def write_distribution_chart(panels: list, path) -> Path:
    """`panels`: [(title, [(name, ns array)])]; one violin per series of per-step value / median (%, log axis)."""
    plt = _plt()
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels) + 0.6), squeeze=False)
    for ax, (title, items) in zip(axes[:, 0], panels):
        values, labels = [], []
        for name, v in items:
            median = float(np.median(v)) if len(v) else 0.0
            if median <= 0:
                continue
            values.append(100.0 * v / median)
            labels.append(safe_label(f"{name}\n{median / NS_PER_MS:.3f} ms"))
        if not values:
            ax.axis("off")
            continue
        parts = ax.violinplot(values, showmedians=True, showextrema=True, widths=0.8)
        for k, body in enumerate(parts["bodies"]):
            body.set_facecolor(IDLE_COLOR if k < 2 else PALETTE[(k - 2) % len(PALETTE)])
            body.set_alpha(0.7)
        ax.set_xticks(range(1, len(labels) + 1))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")  # a tight category and a wild idle time on one axis
        ax.set_ylabel("per step, % of its median (log)", fontsize=8)
        ax.set_title(safe_label(title), fontsize=9, loc="left")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, path)


def _steps(s: dict) -> str:
    listed = ", ".join(str(k) for k in s["outlier_steps"][:LISTED_STEPS])
    more = f" (+{s['outliers'] - LISTED_STEPS})" if s["outliers"] > LISTED_STEPS else ""
    return listed + more


def distribution_section(data, out_dir) -> list:
    """Table of median / p90 / max per step and the outlier steps, and the violin chart in out_dir (checked by the
    report's output policy); [] when no capture has distributions."""
    rows, panels = [], []
    for cap in data.captures:
        budget, per_step, per_step_category = _first(cap)
        for d in budget["devices"]:
            dist = d.get("distributions")
            if not dist:
                continue
            label = _devices_label(cap, d)
            named = [("step", dist["step"]), ("idle", dist["idle"])]
            named += [(c["category"], c) for c in dist["categories"][:TABLE_CATEGORIES]]
            for name, s in named:
                rows.append([label, md_escape(name), f"{s['median_ms']:.3f}", f"{s['p90_ms']:.3f}",
                             f"{s['max_ms']:.3f}", _steps(s)])
            warm = dist["step"].get("warmup_steps") or []
            if warm:
                rows.append([label, "warm-up steps", "", "", "", ", ".join(str(k) for k in warm[:LISTED_STEPS])])
            if per_step is not None and out_dir is not None:
                panels.append((f"{cap.label} GPU {d['device']}", series(d, per_step, per_step_category)))
    if not rows:
        return []
    rule = next(d["distributions"]["outlier_rule"] for c in data.captures for d in _first(c)[0]["devices"]
                if d.get("distributions"))
    out = ["## Step-to-step spread", "",
           f"Per step, not only the mean: the median, 90th percentile and largest value over the steps, in ms (a "
           f"category's exclusive time, so that a step's categories and idle add up to it), and "
           f"the steps {md_escape(rule)} (step numbers as in `profattr export` and `profattr timeline --step`)."
           + (" A replicate group shows its first capture." if any(
               c.side is not None and len(c.side.members) > 1 for c in data.captures) else ""), ""]
    out += _table(["capture", "series", "median ms", "p90 ms", "max ms", "outlier steps"], rows)
    if panels:
        from profattr.outputs import atomic_path

        with atomic_path(Path(out_dir) / DISTRIBUTION_CHART, force=True) as tmp:
            write_distribution_chart(panels, tmp)
        out += ["", f"![per-step spread of the step, idle and the largest categories]({DISTRIBUTION_CHART})"]
    return out + [""]
