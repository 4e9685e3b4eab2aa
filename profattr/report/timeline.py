"""A timeline of one decode step per GPU (the median one by default), as a PNG: what ran on each stream, where the
GPU idled, and what the host was doing meanwhile.

The data come from the budget's attribution (compute_budget(..., keep_attribution=True)): the step's GPU ops, one
lane per CUDA stream, coloured by category with the report's palette (charts.py); the idle gaps between its
consecutive ops (host_gaps.idle_intervals: their sum is the step's idle time) shaded across the lanes; above them the
CUDA API calls of the step's CPU thread (graph launches, kernel launches, memory calls, synchronizations) and its
innermost NVTX ranges; beside it the step's own budget (op ms per category, and idle). The median step is the step
whose span is the median of the device's spans (the lower middle one for an even count, the earlier step on a tie).
With two captures the two steps are drawn one above the other on one time axis (ms from each step's start).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from profattr.arrays import unique
from profattr.errors import ProfattrError
from profattr.report import host_gaps
from profattr.report.charts import IDLE_COLOR, OTHER_COLOR, PALETTE, _plt, _save, chosen_categories, safe_label
from profattr.text import clean
from profattr.trace.calls import WholeCalls

NS_PER_MS = 1e6
LEGEND_CATEGORIES = 8  # categories named in the step's budget beside the timeline
KIND_COLORS = ("#70ad47", "#4472c4", "#ffc000", "#c00000")  # host_gaps.KINDS order
TIMELINE_CHART = "timeline.png"
HOST_LINE_CHARS = 180


def choose_step(budget, device: int, spec="median") -> int:
    """The budget's step index on `device` that `spec` names: "median" (see the module docstring) or a number."""
    rows = budget.per_step[budget.per_step["device"] == device]
    if not len(rows):
        raise ProfattrError(f"GPU {device} has no step with GPU work; nothing to draw")
    if str(spec) == "median":
        ordered = rows.sort_values(["span_ns", "start_ns"], kind="stable")
        return int(ordered["step"].iloc[(len(ordered) - 1) // 2])
    try:
        step = int(spec)
    except (TypeError, ValueError):
        raise ProfattrError(f"--step {spec!r}: expected median or a step number") from None
    steps = rows["step"].to_numpy(np.int64)
    if step not in set(steps.tolist()):
        raise ProfattrError(f"--step {step}: GPU {device} has no step {step}; its steps are numbered "
                            f"{int(steps.min())} to {int(steps.max())} ({len(steps)} steps)")
    return step


def step_view(budget, device: int, step: int, api, ranges) -> dict:
    """What the timeline draws for one step of one device (times in ns from the step's start), from the budget's
    attribution; `api`: the reader's host_calls()."""
    att = budget.attribution
    ops = att.ops
    idx = np.flatnonzero((ops.device == device) & (att.step == step))
    idx = idx[np.argsort(ops.start[idx], kind="stable")]
    category = att.combos["category"].to_numpy()[att.combo[idx]].astype(str)
    return view_of(budget, device, step, ops.take(idx), category, att.steps, api, ranges)


def view_of(budget, device: int, step: int, ops, category: np.ndarray, steps, api, ranges) -> dict:
    """step_view from the step's ops (trace/ops.py Ops, in start order) and their categories; `steps`: the
    budget's steps (the step's thread, and the ranges that enclose a step)."""
    row = budget.per_step[(budget.per_step["device"] == device) & (budget.per_step["step"] == step)].iloc[0]
    origin, end = int(row["start_ns"]), int(row["end_ns"])
    gs, ge = host_gaps.idle_intervals(np.zeros(len(ops), dtype=np.int64), ops.start, ops.end)
    tid = int(steps.tid[step]) if steps.source != "whole" else -1
    # the calls of the step's span (any thread): the ones that can overlap its gaps, which lie inside it
    near = api.between(origin, end)
    near = {k: v[(near["end"] > origin) & (near["start"] < end)] for k, v in near.items()}
    calls = near["tid"] == tid
    host = {k: near[k][calls] - (origin if k != "kind" else 0) for k in ("start", "end", "kind")}
    nvtx = []
    if ranges is not None and len(ranges):
        leaf = host_gaps.leaf_ranges(ranges) & ~host_gaps.enclosing_steps(ranges, steps)
        r = ranges[leaf & (ranges["tid"].to_numpy(np.int64) == tid) & (ranges["end"].to_numpy(np.int64) > origin)
                   & (ranges["start"].to_numpy(np.int64) < end)]
        nvtx = [(int(s) - origin, int(e) - origin, host_gaps.label(clean(str(t)), 40))
                for s, e, t in zip(r["start"], r["end"], r["text"])]
    activity = host_gaps.host_activity(gs, ge, WholeCalls(near), ranges, steps, 1)
    per_cat: dict = {}
    for c, ns in zip(category, (ops.end - ops.start).tolist()):
        per_cat[c] = per_cat.get(c, 0) + ns
    return {"device": int(device), "step": int(step), "start_ns": origin, "span_ns": end - origin,
            "busy_ns": int(row["busy_ns"]), "steps": int((budget.per_step["device"] == device).sum()),
            "start": ops.start - origin, "end": ops.end - origin, "stream": ops.stream,
            "category": category, "gap_start": gs - origin, "gap_end": ge - origin, "host": host, "nvtx": nvtx,
            "host_line": host_gaps.describe(activity),
            "budget_ms": sorted(((c, ns / NS_PER_MS) for c, ns in per_cat.items()), key=lambda x: -x[1])}


def capture_views(budget, spec="median", source=None) -> list:
    """One step_view per device of the budget (it must keep its attribution); `source`: the capture's reader,
    already open (else it is opened again from the budget's path)."""
    from profattr.trace.source import open_trace

    if budget.attribution is None:
        raise ValueError("capture_views needs compute_budget(..., keep_attribution=True)")
    if source is None:
        with open_trace(budget.path) as opened:
            return capture_views(budget, spec, opened)
    api = source.host_calls()
    ranges = source.ranges()
    return [step_view(budget, int(d["device"]), choose_step(budget, int(d["device"]), spec), api, ranges)
            for d in budget.devices]


def describe_view(label: str, v: dict) -> str:
    """One line: which step was drawn and its span."""
    return (f"{label} GPU {v['device']}: step {v['step']} ({v['span_ns'] / NS_PER_MS:.3f} ms span, "
            f"{(v['span_ns'] - v['busy_ns']) / NS_PER_MS:.3f} ms idle; {v['steps']} steps)")


def write_timeline(groups: Sequence[tuple], path, device_budgets: Sequence[dict] = ()) -> Path:
    """Draw `groups` [(label, [step_view, ...]), ...] one row per (capture, device) on one time axis; colours by
    category as in the report (chosen over `device_budgets`, the budget dicts' devices, else the views)."""
    plt = _plt()
    rows = [(label, v) for label, views in groups for v in views]
    if device_budgets:
        cats = chosen_categories(device_budgets)
    else:
        cats = sorted({c for _, v in rows for c, _ in v["budget_ms"][:10]})
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(cats)}
    heights = [len(unique(v["stream"])) + 2 for _, v in rows]
    fig = plt.figure(figsize=(15, 1.2 + sum(0.42 * h + 0.9 for h in heights)))
    grid = fig.add_gridspec(len(rows), 2, width_ratios=(5.2, 1), height_ratios=heights, hspace=0.55, wspace=0.02)
    span_ms = max(v["span_ns"] for _, v in rows) / NS_PER_MS
    first = None
    for k, (label, v) in enumerate(rows):
        ax = fig.add_subplot(grid[k, 0], sharex=first)
        first = first or ax
        _draw_step(ax, label, v, colors)
        ax.set_xlim(0, span_ms * 1.01)
        _draw_budget(fig.add_subplot(grid[k, 1]), v, colors)
    first.figure.axes[-2].set_xlabel("ms from the step's first GPU op")
    return _save(fig, plt, path)


def _draw_step(ax, label: str, v: dict, colors: dict) -> None:
    streams = unique(v["stream"])
    lanes = {s: k + 2 for k, s in enumerate(streams)}
    start, dur = v["start"] / NS_PER_MS, (v["end"] - v["start"]) / NS_PER_MS
    for c in unique(v["category"]):
        sel = v["category"] == c
        for s in unique(v["stream"][sel]):
            both = sel & (v["stream"] == s)
            ax.broken_barh(list(zip(start[both], np.maximum(dur[both], 1e-4))), (lanes[s] - 0.4, 0.8),
                           facecolors=colors.get(c, OTHER_COLOR), linewidth=0)
    for gs, ge in zip(v["gap_start"] / NS_PER_MS, v["gap_end"] / NS_PER_MS):
        ax.axvspan(gs, ge, color=IDLE_COLOR, alpha=0.6, linewidth=0, zorder=0)
    host = v["host"]
    for kind in range(len(host_gaps.KINDS)):
        sel = host["kind"] == kind
        if sel.any():
            ax.broken_barh(list(zip(host["start"][sel] / NS_PER_MS,
                                    np.maximum((host["end"][sel] - host["start"][sel]) / NS_PER_MS, 1e-4))),
                           (1 - 0.35, 0.7), facecolors=KIND_COLORS[kind], linewidth=0,
                           label=host_gaps.KINDS[kind])
    span_ms = v["span_ns"] / NS_PER_MS
    for s, e, text in v["nvtx"]:
        ax.broken_barh([(s / NS_PER_MS, (e - s) / NS_PER_MS)], (0 - 0.35, 0.7), facecolors="#cfd8e3",
                       edgecolor="#7f8c9d", linewidth=0.4)
        if (e - s) / NS_PER_MS > 0.08 * span_ms:
            ax.text(max(s, 0) / NS_PER_MS, 0, safe_label(text), fontsize=6, va="center", clip_on=True)
    ax.set_yticks([0, 1] + list(lanes.values()))
    ax.set_yticklabels(["NVTX", "CUDA API"] + [f"stream {int(s)}" for s in streams], fontsize=7)
    ax.set_ylim(len(streams) + 1.6, -0.6)
    title = (f"{label} GPU {v['device']}: step {v['step']} of {v['steps']}, {span_ms:.3f} ms "
             f"({(v['span_ns'] - v['busy_ns']) / NS_PER_MS:.3f} ms idle, shaded)")
    if v["host_line"]:
        line = v["host_line"]
        title += "\n" + (line if len(line) <= HOST_LINE_CHARS else line[: HOST_LINE_CHARS - 1] + "…")
    ax.set_title(safe_label(title), fontsize=8, loc="left")
    if any((host["kind"] == k).any() for k in range(len(host_gaps.KINDS))):
        ax.legend(fontsize=6, loc="lower right", frameon=False, ncol=4)
    ax.grid(axis="x", alpha=0.3)


def _draw_budget(ax, v: dict, colors: dict) -> None:
    """The step's budget: op ms of its largest categories, and its idle ms."""
    import matplotlib.patches as mpatches

    ax.axis("off")
    rows = v["budget_ms"][:LEGEND_CATEGORIES]
    rest = sum(ms for _, ms in v["budget_ms"][LEGEND_CATEGORIES:])
    handles = [mpatches.Patch(color=colors.get(c, OTHER_COLOR), label=safe_label(f"{c}  {ms:.3f} ms"))
               for c, ms in rows]
    if rest > 0:
        handles.append(mpatches.Patch(color=OTHER_COLOR, label=f"other  {rest:.3f} ms"))
    handles.append(mpatches.Patch(color=IDLE_COLOR, label=f"idle  {(v['span_ns'] - v['busy_ns']) / NS_PER_MS:.3f} ms"))
    ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=False, title="this step (op ms)",
              title_fontsize=7)


def timeline_section(data, out_dir) -> list:
    """The report's Timeline section: the median step of every capture drawn into out_dir/timeline.png (the
    report's output check covers that file), and one line per step drawn. [] without views or a folder."""
    caps = [c for c in data.captures if c.timeline]
    if not caps or out_dir is None:
        return []
    from profattr.outputs import atomic_path
    from profattr.text import md_escape

    groups = [(c.label, c.timeline) for c in caps]
    with atomic_path(Path(out_dir) / TIMELINE_CHART, force=True) as tmp:
        write_timeline(groups, tmp, [d for c in caps for d in c.budget["devices"]])
    out = ["## Timeline of the median step", "",
           "One decode step per capture and GPU, the one whose span is the median: its GPU ops by stream, coloured "
           "by category, the idle gaps shaded, and above them the CUDA API calls and NVTX ranges of the step's CPU "
           "thread (`profattr timeline` draws any step; `profattr export --format perfetto` opens every step in "
           "ui.perfetto.dev)." + (" A replicate group shows its first capture." if any(
               c.side is not None and len(c.side.members) > 1 for c in caps) else ""), ""]
    out += [f"- {md_escape(describe_view(label, v))}" for label, views in groups for v in views]
    return out + ["", f"![timeline of the median step]({TIMELINE_CHART})", ""]
