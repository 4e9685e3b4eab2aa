"""PNG charts of the report (matplotlib, Agg backend): categories per capture, and idle / launches per capture.

Inputs are plain structures: budget dicts (`profattr.budget/1`) and the launch stats of `report.launches`. Every
label that comes from a capture or a user is made safe for matplotlib (no mathtext).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from profattr.report.budget_view import category_share, exclusive_ms

MAX_CATEGORIES = 10  # shown one by one; the rest are summed into "other categories"
IDLE_COLOR = "#d9d9d9"
OTHER_COLOR = "#7f7f7f"
# ten distinct colours without grey (grey is for "other categories" and idle)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#393b79")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def safe_label(text) -> str:
    """A label matplotlib prints as is: `$` would start mathtext."""
    return str(text).replace("\\", "\\\\").replace("$", r"\$")


def bar_label(label: str, device, n_devices: int) -> str:
    return safe_label(label if n_devices == 1 else f"{label} / GPU {device}")


def _bars(captures: Sequence[dict]):
    """(bar label, device budget dict, launch stats or None) per capture and device."""
    out = []
    for cap in captures:
        devices = cap["budget"]["devices"]
        launches = {s["device"]: s for s in cap.get("launches") or []}
        for d in devices:
            out.append((bar_label(cap["label"], d["device"], len(devices)), d, launches.get(d["device"])))
    return out


def chosen_categories(device_budgets: Sequence[dict], limit: int = MAX_CATEGORIES) -> list:
    """Categories shown on their own: the largest share of the step in any capture first."""
    best: dict = {}
    for d in device_budgets:
        for c in d["categories"]:
            best[c["category"]] = max(best.get(c["category"], 0.0), category_share(c, d))
    return sorted(best, key=lambda c: -best[c])[:limit]



def _label_bars(axes, x, labels) -> None:
    """One x tick per capture (slanted when there are many), and a light horizontal grid behind the bars."""
    slanted = len(labels) > 2
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=20 if slanted else 0, ha="right" if slanted else "center", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)

def mark_mean_steps(ax, tops: Sequence[float], means: Sequence[float]) -> None:
    """On stacked bars at x = 0, 1, ... of exclusive time and idle (`tops`: their heights, the mean step itself; a
    budget from before exclusive time stacks op time, taller by the overlap): a black line at each bar's mean step,
    its value written above the bar."""
    x = range(len(means))
    ax.hlines(means, [i - 0.33 for i in x], [i + 0.33 for i in x], colors="black", linewidth=1.6,
              label="mean step")
    for i, (top, mean) in enumerate(zip(tops, means)):
        ax.annotate(f"{mean:.3g} ms", (i, max(top, mean)), ha="center", va="bottom", fontsize=8)


def write_category_chart(captures: Sequence[dict], path) -> Path:
    """Stacked bars per capture (and GPU): exclusive ms per step by category plus idle, which is the mean step
    (marked), and the same as shares of the mean step.

    `captures`: dicts with `label` and `budget` (a budget dict). Returns the path written.
    """
    plt = _plt()
    bars = _bars(captures)
    cats = chosen_categories([d for _, d, _ in bars])
    series = {c: [] for c in cats}
    series["other categories"] = []
    series["idle"] = []
    for _, d, _ in bars:
        by_cat = {c["category"]: exclusive_ms(c) for c in d["categories"]}
        for c in cats:
            series[c].append(by_cat.get(c, 0.0))
        series["other categories"].append(sum(v for k, v in by_cat.items() if k not in cats))
        series["idle"].append(d["idle_ms_per_step"])
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(cats)}
    colors["other categories"] = OTHER_COLOR
    colors["idle"] = IDLE_COLOR
    width = max(8.0, 1.6 * len(bars) + 5.0)
    fig, (ax_ms, ax_pct) = plt.subplots(1, 2, figsize=(width, 5.2))
    x = list(range(len(bars)))
    totals = [sum(series[k][i] for k in series) for i in x]
    bottoms_ms = [0.0] * len(bars)
    bottoms_pct = [0.0] * len(bars)
    for name, values in series.items():
        if not any(v > 0 for v in values):
            continue
        pct = [100.0 * v / t if t else 0.0 for v, t in zip(values, totals)]
        ax_ms.bar(x, values, bottom=bottoms_ms, color=colors[name], label=safe_label(name), width=0.6)
        ax_pct.bar(x, pct, bottom=bottoms_pct, color=colors[name], width=0.6)
        bottoms_ms = [b + v for b, v in zip(bottoms_ms, values)]
        bottoms_pct = [b + v for b, v in zip(bottoms_pct, pct)]
    _label_bars((ax_ms, ax_pct), x, [b[0] for b in bars])
    mark_mean_steps(ax_ms, bottoms_ms, [d["mean_step_ms"] for _, d, _ in bars])
    ax_ms.set_ylabel("ms per step (exclusive time by category + idle)")
    ax_ms.set_title("Time per decode step", fontsize=11)
    ax_pct.set_ylabel("% of the mean step")
    ax_pct.set_ylim(0, 100)
    ax_pct.set_title("Shares of the mean step", fontsize=11)
    handles, names = ax_ms.get_legend_handles_labels()
    fig.legend(handles[::-1], names[::-1], loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    return _save(fig, plt, path)


def write_launch_chart(captures: Sequence[dict], path) -> Path:
    """Per capture (and GPU): the step split into kernel-busy time, idle waiting for a graph replay to start, idle
    between replayed nodes and idle before eagerly launched ops (% of the step), and GPU ops per step replayed from a
    graph vs launched one by one.

    `captures`: dicts with `label`, `budget` and `launches` (the launch stats list). Returns the path written.
    """
    plt = _plt()
    bars = [b for b in _bars(captures) if b[2] is not None]
    width = max(9.0, 1.8 * len(bars) + 5.0)
    fig, (ax_step, ax_ops) = plt.subplots(1, 2, figsize=(width, 5.4))
    x = list(range(len(bars)))
    parts = [("GPU busy (kernels, copies)", "#4472c4",
              [s["mean_step_ms"] - s["idle_ms_per_step"] for _, _, s in bars]),
             ("idle waiting for a replay to start", "#ffc000",
              [s.get("idle_before_replay_ms", 0.0) for _, _, s in bars]),
             ("idle between replayed nodes", "#ed7d31",
              [s["idle_before_graph_ops_ms"] - s.get("idle_before_replay_ms", 0.0) for _, _, s in bars]),
             ("idle before eager launches", "#c00000", [s["idle_before_eager_ops_ms"] for _, _, s in bars])]
    bottom = [0.0] * len(bars)
    for name, color, values in parts:
        pct = [100.0 * v / s["mean_step_ms"] if s["mean_step_ms"] else 0.0 for v, (_, _, s) in zip(values, bars)]
        ax_step.bar(x, pct, bottom=bottom, color=color, label=name, width=0.6)
        bottom = [b + p for b, p in zip(bottom, pct)]
    for i, (_, _, s) in enumerate(bars):
        ax_step.annotate(f"{s['mean_step_ms']:.3g} ms", (i, 100.0), ha="center", va="bottom", fontsize=8)
    ax_step.set_ylim(0, 110)
    ax_step.set_ylabel("% of the mean step")
    ax_step.set_title("Where the step goes: busy vs idle", fontsize=11)
    below = -0.12 if len(bars) <= 2 else -0.3  # under the (rotated) tick labels
    ax_step.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, below), ncol=2, frameon=False)
    graph = [s["graph_ops_per_step"] for _, _, s in bars]
    eager = [s["eager_ops_per_step"] for _, _, s in bars]
    ax_ops.bar(x, graph, color="#70ad47", label="replayed from a CUDA graph", width=0.6)
    ax_ops.bar(x, eager, bottom=graph, color="#a5a5a5", label="launched one by one", width=0.6)
    for i, (g, e) in enumerate(zip(graph, eager)):
        ax_ops.annotate(f"{g + e:.0f}", (i, g + e), ha="center", va="bottom", fontsize=8)
    ax_ops.set_ylim(0, 1.12 * max([g + e for g, e in zip(graph, eager)] + [1.0]))
    ax_ops.set_ylabel("GPU ops per step")
    ax_ops.set_title("How the work is launched", fontsize=11)
    ax_ops.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, below), ncol=2, frameon=False)
    _label_bars((ax_step, ax_ops), x, [b[0] for b in bars])
    fig.tight_layout()
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    path = Path(path)
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path
