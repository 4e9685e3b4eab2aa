"""The report's "Campaign" section: ms per step of every experiment of a ledger, stacked by category, as a chart and
as the table behind it.

Input: the plain list `ledger.query.campaign` returns ({"id", "label", "ms_per_token", "budget"} per entry, the
budget a `profattr.budget/1` dict). One bar per entry and GPU; the same categories as the chart's are the table's
columns, so every bar can be read off the table: categories' exclusive time + other + idle = mean step (an entry
recorded before exclusive time was stored stacks op time, taller than the step by its overlap).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from profattr.errors import ProfattrError
from profattr.report.budget_view import exclusive_ms
from profattr.report.charts import (IDLE_COLOR, OTHER_COLOR, PALETTE, _label_bars, _plt, _save, bar_label,
                                    chosen_categories, mark_mean_steps, safe_label)
from profattr.text import md_escape, md_name

CAMPAIGN_CHART = "campaign.png"
REPORT_FILE = "report.md"
MAX_CATEGORIES = 8
OTHER = "other categories"
IDLE = "idle"


def campaign_rows(entries: Sequence[dict]) -> tuple:
    """(chosen categories, rows): one row per entry and GPU with its bar label, step times, exclusive ms/step of each
    chosen category, of the other categories together, idle, and overlap (the categories' overlapped time, in no
    bar)."""
    device_budgets = [d for e in entries for d in e["budget"]["devices"]]
    cats = chosen_categories(device_budgets, MAX_CATEGORIES)
    rows = []
    for e in entries:
        devices = e["budget"]["devices"]
        for d in devices:
            by_cat = {c["category"]: exclusive_ms(c) for c in d["categories"]}
            rows.append({"id": e["id"], "label": e["label"], "device": d["device"], "n_devices": len(devices),
                         "ms_per_token": e.get("ms_per_token"), "step_ms": d["step_ms"],
                         "mean_step_ms": d["mean_step_ms"], "categories": {c: by_cat.get(c, 0.0) for c in cats},
                         OTHER: sum(v for k, v in by_cat.items() if k not in cats),
                         IDLE: d["idle_ms_per_step"], "overlap": d["overlap_ms_per_step"]})
    return cats, rows


def _bar_name(row: dict) -> str:
    return f"#{row['id']} {row['label']}"


def write_campaign_chart(entries: Sequence[dict], path) -> Path:
    """Stacked bars, one per entry (and GPU): exclusive ms per step by category, the other categories, idle on top;
    a black line at the mean step (the top of the stack), written above the bar; each bar named under it."""
    plt = _plt()
    cats, rows = campaign_rows(entries)
    series = [(c, PALETTE[i % len(PALETTE)], [r["categories"][c] for r in rows]) for i, c in enumerate(cats)]
    series += [(OTHER, OTHER_COLOR, [r[OTHER] for r in rows]), (IDLE, IDLE_COLOR, [r[IDLE] for r in rows])]
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(rows) + 5.0), 5.2))
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for name, color, values in series:
        if not any(v > 0 for v in values):
            continue
        ax.bar(x, values, bottom=bottom, color=color, label=safe_label(name), width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    mark_mean_steps(ax, bottom, [r["mean_step_ms"] for r in rows])
    _label_bars([ax], x, [bar_label(_bar_name(r), r["device"], r["n_devices"]) for r in rows])
    ax.set_ylabel("ms per step (exclusive time by category + idle)")
    ax.set_title("Campaign: time per decode step, per experiment", fontsize=11)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], names[::-1], loc="center right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.76, 1))
    return _save(fig, plt, path)


def campaign_lines(entries: Sequence[dict], chart: str | None, ledger: str) -> list:
    """The section's markdown: heading, chart, and the table behind it (labels and categories escaped)."""
    out = ["## Campaign", "",
           f"Experiments recorded in the ledger {md_escape(ledger)}, in the order they were added (`profattr ledger "
           "list`). Each bar is one experiment (and GPU): exclusive time per category and idle time, in ms per "
           "step; the table holds the same numbers (categories + other + idle = mean step; overlap: the categories' "
           "time run alongside other categories, in no bar).", ""]
    if not entries:
        return out + ["The ledger has no entries yet.", ""]
    if chart:
        out += [f"![ms per step of each experiment, stacked by category]({chart})", ""]
    cats, rows = campaign_rows(entries)
    head = (["entry", "label", "GPU", "ms/token", "step ms (median)", "mean step ms"] + [md_escape(c) for c in cats]
            + [OTHER, "idle", "overlap (in no bar)"])
    out += ["| " + " | ".join(head) + " |", "|" + "|".join(["---:", "---"] + ["---:"] * (len(head) - 2)) + "|"]
    for r in rows:
        tok = "" if r["ms_per_token"] is None else f"{r['ms_per_token']:.3f}"
        cells = ([str(r["id"]), md_name(r["label"]), str(r["device"]), tok, f"{r['step_ms']:.3f}",
                  f"{r['mean_step_ms']:.3f}"] + [f"{r['categories'][c]:.3f}" for c in cats]
                 + [f"{r[OTHER]:.3f}", f"{r[IDLE]:.3f}", f"{r['overlap']:.3f}"])
        out.append("| " + " | ".join(cells) + " |")
    return out + ["", "ms/token: decode without the profiler, from each capture's run.json (empty without one).", ""]


def campaign_section(data) -> list:
    """The section of a capture report (`data.campaign` set by `profattr report --ledger`), else nothing."""
    if data.campaign is None:
        return []
    return campaign_lines(data.campaign, data.charts.get("campaign"), data.campaign_ledger)


def write_campaign_report(entries: Sequence[dict], ledger: str, out_dir: Path, command: str,
                          force: bool = False) -> list:
    """A report of the campaign alone (`profattr report --ledger PATH` without captures): report.md and its chart.
    Refuses to replace either without `force`; returns the paths written."""
    from profattr import __version__
    from profattr.report.md_table import code_block

    from profattr.outputs import atomic_path, check_output, ensure_folder, write_text

    targets = [out_dir / REPORT_FILE, out_dir / CAMPAIGN_CHART]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise ProfattrError(f"{existing[0]} exists; pass --force to overwrite the report in {out_dir}")
    for target in targets:
        check_output(target, force, [ledger], "the report")
    ensure_folder(out_dir)
    chart = None
    if entries:
        with atomic_path(targets[1], force, [ledger], "the report") as tmp:
            write_campaign_chart(entries, tmp)
        chart = CAMPAIGN_CHART
    lines = [f"# Campaign report: {md_escape(Path(ledger).name)}", "",
             f"Written by profattr {md_escape(__version__)} from the budgets stored in the ledger, per decode step and "
             "per GPU.", ""]
    lines += campaign_lines(entries, chart, ledger)
    lines += ["## Reproducibility", "", "This report was written by:", ""] + code_block(command, "sh")
    write_text(out_dir / REPORT_FILE, "\n".join(lines).rstrip("\n") + "\n", force, [ledger], "the report")
    return targets if chart else targets[:1]
