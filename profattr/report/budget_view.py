"""Render a budget (the `profattr.budget/1` dict) as a table for a person, CSV, or markdown."""
from __future__ import annotations

import csv
import io

from profattr.report.escape import md_escape

TOP_KERNELS = 15


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}"


def render_table(budget: dict, top: int = TOP_KERNELS) -> str:
    lines = []
    cap = budget["capture"]
    steps = budget["steps"]
    lines.append(f"capture: {cap['path']}  (nsys {cap.get('nsys_version') or '?'})")
    lines.append(f"steps:   {steps['source']} x{steps['count']}  ({steps.get('reason', '')})")
    if budget.get("nvtx_context"):
        lines.append(f"nvtx context: {budget['nvtx_context']}")
    for d in budget["devices"]:
        lines.append("")
        lines.append(f"GPU {d['device']}: step {_fmt_ms(d['step_ms'])} ms (median of {d['steps']} steps; mean "
                     f"{_fmt_ms(d['mean_step_ms'])}), busy {_fmt_ms(d['busy_ms_per_step'])}, idle "
                     f"{_fmt_ms(d['idle_ms_per_step'])}, overlap {_fmt_ms(d['overlap_ms_per_step'])} ms/step; "
                     f"{d['kernels_per_step']:.1f} kernels/step")
        coverage = 100.0 * (1.0 - d["unclassified_share"])
        lines.append(f"  classified: {coverage:.1f}% of GPU time")
        lines.append(f"  {'category':<24}{'ms/step':>10}{'count/step':>12}{'share':>8}")
        total = sum(c["ms_per_step"] for c in d["categories"]) or 1.0
        for c in d["categories"]:
            lines.append(f"  {c['category']:<24}{_fmt_ms(c['ms_per_step']):>10}{c['count_per_step']:>12.2f}"
                         f"{100.0 * c['ms_per_step'] / total:>7.1f}%")
        lines.append(f"  {'idle (inside steps)':<24}{_fmt_ms(d['idle_ms_per_step']):>10}")
        lines.append("  top kernels:")
        for k in d["kernels"][:top]:
            lines.append(f"  {_fmt_ms(k['ms_per_step']):>10} ms {k['count_per_step']:>7.2f}x  "
                         f"{k['category']:<20} {_short(k['name'])}")
        uncl = [k for k in d["kernels"] if k["category"] == "unclassified"][:5]
        if uncl:
            lines.append("  top unclassified (add a rule with --rules FILE):")
            for k in uncl:
                lines.append(f"  {_fmt_ms(k['ms_per_step']):>10} ms  {_short(k['demangled'], 110)}")
        out = d.get("outside_steps") or {}
        if out.get("ops"):
            lines.append(f"  outside steps: {out['ops']} ops, {out['ms']:.3f} ms (not in the budget)")
    return "\n".join(lines)


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def render_csv(budget: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["device", "row", "category", "name", "ms_per_step", "count_per_step"])
    for d in budget["devices"]:
        w.writerow([d["device"], "step", "", "", d["step_ms"], ""])
        w.writerow([d["device"], "busy", "", "", d["busy_ms_per_step"], ""])
        w.writerow([d["device"], "idle", "", "", d["idle_ms_per_step"], ""])
        for c in d["categories"]:
            w.writerow([d["device"], "category", c["category"], "", c["ms_per_step"], c["count_per_step"]])
        for k in d["kernels"]:
            w.writerow([d["device"], "kernel", k["category"], k["demangled"], k["ms_per_step"], k["count_per_step"]])
    return buf.getvalue()


def render_markdown(budget: dict, top: int = TOP_KERNELS) -> str:
    out = []
    steps = budget["steps"]
    out.append(f"Steps: `{md_escape(steps['source'])}` x{steps['count']} ({md_escape(steps.get('reason', ''))})")
    for d in budget["devices"]:
        out.append("")
        out.append(f"### GPU {d['device']}: {d['step_ms']:.3f} ms/step (median), "
                   f"{d['kernels_per_step']:.1f} kernels/step")
        out.append("")
        out.append("| category | ms/step | count/step | share of step |")
        out.append("|---|---:|---:|---:|")
        for c in d["categories"]:
            out.append(f"| {md_escape(c['category'])} | {c['ms_per_step']:.3f} | {c['count_per_step']:.2f} | "
                       f"{100.0 * c['ms_per_step'] / max(d['mean_step_ms'], 1e-12):.1f}% |")
        out.append(f"| idle (inside steps) | {d['idle_ms_per_step']:.3f} | | "
                   f"{100.0 * d['idle_ms_per_step'] / max(d['mean_step_ms'], 1e-12):.1f}% |")
        if d["overlap_ms_per_step"] > 1e-6:
            out.append(f"| overlap (streams at once, subtracted) | -{d['overlap_ms_per_step']:.3f} | | |")
        out.append("")
        out.append("| kernel | category | ms/step | count/step |")
        out.append("|---|---|---:|---:|")
        for k in d["kernels"][:top]:
            out.append(f"| {md_escape(_short(k['name'], 80))} | {md_escape(k['category'])} | "
                       f"{k['ms_per_step']:.3f} | {k['count_per_step']:.2f} |")
        out.append("")
        out.append(f"Classified: {100.0 * (1 - d['unclassified_share']):.1f}% of GPU time.")
    return "\n".join(out)
