"""Render a budget (the `profattr.budget/1` dict) as a table for a person, CSV, or markdown. Every renderer cleans
the strings it is given first (text.clean_tree: no control character from a kernel name or NVTX text gets out)."""
from __future__ import annotations

import csv
import io

from profattr.attribute.precision import describe as precision_text
from profattr.text import md_escape, md_name
from profattr.report.shapes import short_kernel_line, shape_rows
from profattr.text import clean_tree

TOP_KERNELS = 15


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}"


OUTSIDE_LAYERS = "outside layers"


def layer_name(label) -> str:
    """Display name of a layer row's label (None: the ops outside every layer range)."""
    return OUTSIDE_LAYERS if label is None else f"layer {label}"


def exclusive_ms(c: dict) -> float:
    """A category row's exclusive ms per step (a budget from before exclusive time: its op time)."""
    return c.get("exclusive_ms_per_step", c["ms_per_step"])


def overlapped_ms(c: dict) -> float:
    return c.get("overlapped_ms_per_step", 0.0)


def category_share(c: dict, d: dict) -> float:
    """A category's share of the device's mean step: its exclusive time over the mean step, as the budget computed
    it (`share`); so the categories' shares and idle's add up to 100 %."""
    if "share" in c:
        return c["share"]
    return exclusive_ms(c) / d["mean_step_ms"] if d["mean_step_ms"] else 0.0


def idle_share(d: dict) -> float:
    if "idle_share" in d:
        return d["idle_share"]
    return d["idle_ms_per_step"] / d["mean_step_ms"] if d["mean_step_ms"] else 0.0


def _top_categories(layer: dict, n: int = 3) -> str:
    return ", ".join(f"{c['category']} {c['ms_per_step']:.3f}" for c in layer["categories"][:n])


def _comm_line(comm: dict) -> str:
    return (f"collectives {comm['collective_ms_per_step']:.3f} ms/step = transfer "
            f"{comm['transfer_ms_per_step']:.3f} + wait for slower ranks {comm['wait_ms_per_step']:.3f}; "
            f"slowest rank in {100.0 * comm['slowest_rank_share']:.0f}% of steps")


def _placement_lines(budget: dict) -> list:
    """The note suggesting --mapping, when replayed graph ops lack NVTX context."""
    placement = budget.get("nvtx_placement") or {}
    return [f"note: {placement['hint']}"] if placement.get("hint") else []


def capture_tool(cap: dict) -> str:
    """What recorded the capture, in a few words."""
    if cap.get("format") == "torch":
        return cap.get("profiler_version") or "torch profiler"
    return f"nsys {cap.get('nsys_version') or '?'}"


def render_table(budget: dict, top: int = TOP_KERNELS) -> str:
    budget = clean_tree(budget)
    lines = []
    cap = budget["capture"]
    steps = budget["steps"]
    lines.append(f"capture: {cap['path']}  ({capture_tool(cap)})")
    lines.append(f"steps:   {steps['source']} x{steps['count']}  ({steps.get('reason', '')})")
    for what, n in (steps.get("excluded") or {}).items():
        lines.append(f"  left out: {n} {what}")
    if budget.get("nvtx_context"):
        lines.append(f"nvtx context: {budget['nvtx_context']}")
    lines.extend(_placement_lines(budget))
    if budget.get("comm"):
        slow = budget["comm"]["slowest_rank_per_step"]
        lines.append(f"ranks: GPUs {', '.join(str(r) for r in budget['comm']['ranks'])}; slowest rank per step: "
                     f"{' '.join(str(r) for r in slow[:40])}{' ...' if len(slow) > 40 else ''}")
    for d in budget["devices"]:
        lines.append("")
        lines.append(f"GPU {d['device']}: step {_fmt_ms(d['step_ms'])} ms (median of {d['steps']} steps; mean "
                     f"{_fmt_ms(d['mean_step_ms'])}), busy {_fmt_ms(d['busy_ms_per_step'])}, idle "
                     f"{_fmt_ms(d['idle_ms_per_step'])}, overlap {_fmt_ms(d['overlap_ms_per_step'])} ms/step; "
                     f"{d['kernels_per_step']:.1f} kernels/step")
        coverage = 100.0 * (1.0 - d["unclassified_share"])
        lines.append(f"  classified: {coverage:.1f}% of GPU time")
        lines.extend(decided_by_lines(d, "  "))
        lines.append(f"  {'category':<24}{'exclusive':>10}{'share':>8}{'overlapped':>11}{'op ms':>10}"
                     f"{'count/step':>12}")
        for c in d["categories"]:
            lines.append(f"  {c['category']:<24}{_fmt_ms(exclusive_ms(c)):>10}{100.0 * category_share(c, d):>7.1f}%"
                         f"{_fmt_ms(overlapped_ms(c)):>11}{_fmt_ms(c['ms_per_step']):>10}{c['count_per_step']:>12.2f}")
        lines.append(f"  {'idle (inside steps)':<24}{_fmt_ms(d['idle_ms_per_step']):>10}{100.0 * idle_share(d):>7.1f}%")
        lines.append(f"  {'mean step':<24}{_fmt_ms(d['mean_step_ms']):>10}{100.0:>7.1f}%  (exclusive: busy time "
                     "shared among the categories running at once; overlapped: the rest of their op time)")
        total = d["mean_step_ms"] or 1.0
        if d.get("gemm_precision"):
            lines.append("  GEMMs by weight precision and how the math ran:")
            for r in d["gemm_precision"]:
                lines.append(f"  {r['category']:<24}{_fmt_ms(r['ms_per_step']):>10}{r['count_per_step']:>12.2f}  "
                             f"{precision_text(r)}")
        if d.get("comm"):
            lines.append(f"  {_comm_line(d['comm'])}")
        if d.get("layers") is not None:
            lines.append(f"  {'layer':<24}{'ms/step':>10}{'count/step':>12}{'share':>8}  top categories (ms/step)")
            for layer in d["layers"]:
                lines.append(f"  {layer_name(layer['layer']):<24}{_fmt_ms(layer['ms_per_step']):>10}"
                             f"{layer['count_per_step']:>12.2f}{100.0 * layer['ms_per_step'] / total:>7.1f}%  "
                             f"{_short(_top_categories(layer), 70)}")
        lines.append("  top kernels (per launch shape):")
        for k in shape_rows(d)[:top]:
            lines.append(f"  {_fmt_ms(k['ms_per_step']):>10} ms {k['count_per_step']:>7.2f}x {k['mean_us']:>8.1f} us  "
                         f"{k['category']:<20} {_short(k['name'], 60)}{'  ' + k['label'] if k['label'] else ''}")
        short = short_kernel_line(d)
        if short:
            lines.append(f"  {short}")
        uncl = [k for k in d["kernels"] if k["category"] == "unclassified"][:5]
        if uncl and "unknowns" not in d:
            lines.append("  top unclassified (add a rule with --rules FILE):")
            for k in uncl:
                lines.append(f"  {_fmt_ms(k['ms_per_step']):>10} ms  {_short(k['demangled'], 110)}")
        out = d.get("outside_steps") or {}
        if out.get("ops"):
            lines.append(f"  outside steps: {out['ops']} ops, {out['ms']:.3f} ms (not in the budget)")
    return "\n".join(lines)


def category_table_md(d: dict) -> list:
    """The markdown table of a device's categories: exclusive ms and share of the mean step (adding up, with idle,
    to the mean step and 100 %), overlapped ms (run alongside other categories), op time and count."""
    out = ["| category | exclusive ms/step | share of step | overlapped ms/step | op ms/step | count/step |",
           "|---|---:|---:|---:|---:|---:|"]
    for c in d["categories"]:
        out.append(f"| {md_name(c['category'])} | {exclusive_ms(c):.3f} | {100.0 * category_share(c, d):.1f}% | "
                   f"{overlapped_ms(c):.3f} | {c['ms_per_step']:.3f} | {c['count_per_step']:.2f} |")
    out.append(f"| idle (inside steps) | {d['idle_ms_per_step']:.3f} | {100.0 * idle_share(d):.1f}% | | | |")
    out.append(f"| **mean step** | **{d['mean_step_ms']:.3f}** | 100.0% | {d['overlap_ms_per_step']:.3f} | | |")
    return out


def decided_by_lines(d: dict, indent: str = "", limit: int = 10) -> list:
    """What decided the categories (name rules, launch context, nothing), each kernel no certain name rule covers
    with its share and context, and the name rules a strong context contradicts (budget's evidence section)."""
    ev = d.get("evidence")
    if not ev:
        return []
    s = ev["shares"]
    context = ", ".join(f"{k.split(':', 1)[1]} {100.0 * v:.1f}%" for k, v in s.items() if k.startswith("context:") and v)
    lines = [f"{indent}evidence: name rules {100.0 * ev['name_share']:.1f}%, context {100.0 * ev['context_share']:.1f}%"
             f"{' (' + context + ')' if context else ''}, nothing {100.0 * ev['none_share']:.1f}% of GPU time"
             + (f"; torch operators {ev['torch_ops']}" if ev.get("torch_ops", "").startswith("absent") else "")]
    unknowns = d.get("unknowns") or []
    if unknowns:
        lines.append(f"{indent}kernels no certain name rule covers ({d.get('unknowns_total', len(unknowns))}; "
                     "`profattr taxonomy suggest` drafts rules for them):")
        for u in unknowns[:limit]:
            lines.append(f"{indent}  {100.0 * u['share']:6.2f}%  {u['category']:<20} {u['evidence']:<27} "
                         f"{_short(u['name'], 60)}  [{_context_text(u['context'])}]")
    for c in (d.get("conflicts") or [])[:limit]:
        lines.append(f"{indent}conflict: {_short(c['name'], 60)} named {c['category']} by rule {c['rule']}, inside "
                     f"{_context_text(c['context'])} (context rule {c['contradicted_by']}), "
                     f"{100.0 * c['share']:.2f}% of GPU time")
    return lines


def _context_text(context: dict) -> str:
    parts = [f"op {context['torch_op']}" if context.get("torch_op") else "",
             f"module {context['nvtx_module']}" if context.get("nvtx_module") else ""]
    return ", ".join(p for p in parts if p) or "no context"


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def render_csv(budget: dict) -> str:
    """One row per device figure, category, kernel, launch shape and layer; names exactly as captured (the csv
    module quotes a field holding a comma, a quote or a line break)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    header = ["device", "row", "category", "name", "ms_per_step", "count_per_step", "exclusive_ms_per_step",
              "overlapped_ms_per_step", "share"]
    w.writerow(header)

    def row(values: list) -> None:  # every row as wide as the header: empty where a row kind has no value
        w.writerow(values + [""] * (len(header) - len(values)))

    for d in budget["devices"]:
        row([d["device"], "step", "", "", d["step_ms"], ""])
        row([d["device"], "busy", "", "", d["busy_ms_per_step"], ""])
        row([d["device"], "idle", "", "", d["idle_ms_per_step"], "", "", "", idle_share(d)])
        for c in d["categories"]:
            row([d["device"], "category", c["category"], "", c["ms_per_step"], c["count_per_step"],
                        exclusive_ms(c), overlapped_ms(c), category_share(c, d)])
        for k in d["kernels"]:
            row([d["device"], "kernel", k["category"], k["demangled"], k["ms_per_step"], k["count_per_step"]])
            for sh in k.get("shapes") or []:  # its launch shapes, after it (they sum to it)
                row([d["device"], "kernel_shape", k["category"], f"{k['demangled']} [{sh['label']}]",
                            sh["ms_per_step"], sh["count_per_step"]])
        short = d.get("short_kernels")
        if short:
            row([d["device"], "short_kernels", "", f"under {short['under_us']:g} us", short["ms_per_step"],
                        short["count_per_step"]])
        for layer in d.get("layers") or []:
            name = layer_name(layer["layer"])
            row([d["device"], "layer", "", name, layer["ms_per_step"], layer["count_per_step"]])
            for c in layer["categories"]:
                row([d["device"], "layer_category", c["category"], name, c["ms_per_step"],
                            c["count_per_step"]])
        if d.get("comm"):
            for key in ("collective", "transfer", "wait"):
                row([d["device"], f"comm_{key}", "", "", d["comm"][f"{key}_ms_per_step"], ""])
    return buf.getvalue()


def render_markdown(budget: dict, top: int = TOP_KERNELS) -> str:
    budget = clean_tree(budget)
    out = []
    steps = budget["steps"]
    out.append(f"Steps: `{md_escape(steps['source'])}` x{steps['count']} ({md_escape(steps.get('reason', ''))})")
    if budget.get("nvtx_context"):
        out.append("")
        out.append(f"NVTX context: {md_escape(budget['nvtx_context'])}")
    for line in _placement_lines(budget):
        out.append("")
        out.append(f"> **Note:** {md_escape(line[len('note: '):])}")
    for d in budget["devices"]:
        out.append("")
        out.append(f"### GPU {d['device']}: {d['step_ms']:.3f} ms/step (median), "
                   f"{d['kernels_per_step']:.1f} kernels/step")
        out.append("")
        out.extend(category_table_md(d))
        if d.get("comm"):
            out.append("")
            out.append(md_escape(_comm_line(d["comm"])[0].upper() + _comm_line(d["comm"])[1:]) + ".")
        if d.get("layers") is not None:
            out.append("")
            out.append("| layer | ms/step | count/step | share of step | top categories (ms/step) |")
            out.append("|---|---:|---:|---:|---|")
            for layer in d["layers"]:
                out.append(f"| {md_escape(layer_name(layer['layer']))} | {layer['ms_per_step']:.3f} | "
                           f"{layer['count_per_step']:.2f} | "
                           f"{100.0 * layer['ms_per_step'] / max(d['mean_step_ms'], 1e-12):.1f}% | "
                           f"{md_escape(_top_categories(layer))} |")
        out.extend(precision_markdown(d))
        out.append("")
        out.append("| kernel | launch shape | category | ms/step | count/step | µs per call |")
        out.append("|---|---|---|---:|---:|---:|")
        for k in shape_rows(d)[:top]:
            out.append(f"| {md_name(_short(k['name'], 80))} | {md_escape(k['label'])} | {md_name(k['category'])} | "
                       f"{k['ms_per_step']:.3f} | {k['count_per_step']:.2f} | {k['mean_us']:.1f} |")
        short = short_kernel_line(d)
        if short:
            out.append("")
            out.append(md_escape(short[0].upper() + short[1:]) + ".")
        out.append("")
        out.append(f"Classified: {100.0 * (1 - d['unclassified_share']):.1f}% of GPU time.")
    return "\n".join(out)


def precision_markdown(d: dict) -> list:
    """The device's GEMM rows by weight precision and how the math ran (attribute/precision.py), as markdown."""
    rows = d.get("gemm_precision") or []
    if not rows:
        return []
    out = ["", "| GEMM category | weights | how the math ran | ms/step | count/step |", "|---|---|---|---:|---:|"]
    for r in rows:
        out.append(f"| {md_escape(r['category'])} | {md_escape(r.get('weight_dtype') or '?')} | "
                   f"{md_escape(r.get('math') or 'not stated by the rule')} | {r['ms_per_step']:.3f} | "
                   f"{r['count_per_step']:.2f} |")
    return out
