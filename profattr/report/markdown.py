"""The markdown of `profattr report`, from a `collect.ReportData`: report.md (`render_report`) and the details file
beside it (`render_details`). Computes nothing; every sentence that interprets a number is chosen by comparing that
number (see `diff_explanation` and `bottlenecks.py`).

report.md reads top-down as an analysis: the Summary, the ranked bottlenecks and the waterfall first, then the
budgets, kernels, launches, diffs and drills, and Reproducibility last (its long part, run facts, versions, checks and
the full gap tables, is details.md). Each section is one function returning its lines; a section is added by one
call in `render_report`.

Every string that comes from a capture, a run.json or the user (kernel names, labels, paths, commands, messages)
goes through `md_escape` or `md_name` (identifiers as code spans), or into a fenced code block whose fence is longer
than any backtick run inside it.
"""
from __future__ import annotations

from profattr import __version__
from profattr.report import why_slow
from profattr.report.budget_view import category_table_md, decided_by_lines, layer_name, precision_markdown
from profattr.report.campaign import campaign_section
from profattr.text import md_escape, md_name
from profattr.report.md_details import (  # noqa: F401  (evidence_lines, capture_header: for callers)
    STATUS_MARK, capture_header, evidence_lines, gap_section, lint_section, reproducibility_section)
from profattr.report.md_diff import diff_explanation, diff_section  # noqa: F401  (diff_explanation: for callers)
from profattr.report.md_runtime import launch_section, tp_section
from profattr.report.md_summary import (  # noqa: F401  (summary_lines: for callers)
    bottleneck_detail_section, bottleneck_section, summary_lines, summary_section, waterfall_section)
from profattr.report.timeline import timeline_section
from profattr.report.distribution_view import distribution_section
from profattr.report.shapes import short_kernel_line, shape_rows
from profattr.report.md_table import (  # noqa: F401  (code_block: for campaign.py)
    _devices_label, _multi_device, _pct, _short, _table, code_block)

TOP_KERNELS = 10
DETAILS_FILE = "details.md"


def _title(data) -> str:
    return " vs ".join(md_name(c.label) for c in data.captures)


def render_report(data) -> str:
    """report.md: the analysis, then a short Reproducibility section that links the details file."""
    out = [f"# Decode step report: {_title(data)}", ""]
    out += [f"Written by profattr {md_escape(__version__)}. Everything below is per decode step and per GPU, measured "
            "from the captures listed under Reproducibility (in full in details.md); shares are of the mean step.", ""]
    out += summary_section(data)
    out += bottleneck_section(data)
    out += waterfall_section(data)
    out += sweep_section(data)
    out += budget_section(data)
    out += top_kernels_section(data)
    out += category_chart_section(data)
    out += campaign_section(data)
    out += launch_section(data)
    out += timeline_section(data, data.out_dir) + distribution_section(data, data.out_dir)
    out += tp_section(data)
    out += diff_section(data)
    out += projection_section(data)
    out += why_slow.section(data)
    out += bottleneck_detail_section(data)
    out += reproducibility_summary(data)
    return "\n".join(out).rstrip("\n") + "\n"


def render_details(data) -> str:
    """details.md: how to reproduce the report, the capture checks and the gap to the hardware limit in full."""
    out = [f"# Details of the decode step report: {_title(data)}", "",
           f"Beside [report.md](report.md); written by profattr {md_escape(__version__)}.", ""]
    out += reproducibility_section(data)
    out += lint_section(data)
    out += gap_section(data)
    return "\n".join(out).rstrip("\n") + "\n"


def reproducibility_summary(data) -> list:
    """The command, one line of check results per capture, and the link to the details file."""
    out = ["## Reproducibility", ""]
    if data.command:
        out += ["This report was written by (paths relative to the folder it ran in):", ""]
        out += code_block(data.command, "sh") + [""]
    rows = []
    for cap in data.captures:
        counts: dict = {}
        for f in cap.checks or []:
            counts[str(f.get("status"))] = counts.get(str(f.get("status")), 0) + 1
        found = ", ".join(f"{n} {STATUS_MARK.get(k, md_escape(k))}" for k, n in sorted(counts.items()))
        rows.append([md_name(cap.label), found or md_escape(cap.checks_note or "none"),
                     md_escape(cap.budget["capture"].get("nsys_version") or "?")])
    out += _table(["capture", "capture checks", "Nsight Systems export"], rows) + [""]
    out += [f"Each capture's run.json facts (command lines, versions, GPUs, unprofiled timing), the capture checks "
            f"finding by finding, the taxonomy's evidence and the gap tables with their assumptions are in "
            f"[{DETAILS_FILE}]({DETAILS_FILE}).", ""]
    return out


# --- summary and bottlenecks --------------------------------------------------------------------------------------

SWEEP_CATEGORIES = 4  # the largest categories (over all captures) shown per row of the batch sweep


def projection_section(data) -> list:
    """On the target: the first capture's step projected with `report --to` (report/md_project.py)."""
    from profattr.report.md_project import section

    return section(data.projection)


def sweep_section(data) -> list:
    """Batch sweep: a step at batch B decodes B tokens, so steps compare as ms per token and tokens per second."""
    if not data.sweep:
        return []
    totals: dict = {}
    for r in data.sweep:
        for cat, ms in r["categories"].items():
            totals[cat] = totals.get(cat, 0.0) + ms
    cats = sorted(totals, key=lambda c: -totals[c])[:SWEEP_CATEGORIES]
    multi = _multi_device(data)
    rows = []
    # the FP8 GEMM backend SGLang resolved (server log) is a column when the captures differ in it
    fp8 = len({r.get("fp8_gemm_backend") for r in data.sweep}) > 1
    for r in sorted(data.sweep, key=lambda r: (str(r["backend"]), str(r.get("fp8_gemm_backend")), r["batch"] or 0)):
        label = md_name(r["label"]) + (f" / GPU {md_escape(r['device'])}" if multi else "")
        rows.append([label, md_escape(r["backend"] or "?")]
                    + ([md_escape(r.get("fp8_gemm_backend") or "?")] if fp8 else [])
                    + [r["batch"] or "?", f"{r['mean_step_ms']:.3f}",
                     f"{r['ms_per_token']:.3f}" if r["ms_per_token"] else "",
                     f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "",
                     f"{r['unprofiled_ms_per_step']:.3f}" if r["unprofiled_ms_per_step"] else ""]
                    + [f"{r['categories'].get(c, 0.0):.3f}" for c in cats])
    out = ["## Batch sweep", "",
           "A step at batch B decodes B tokens: per token and per second are the comparable figures. The diffs "
           "below compare captures of the same batch size only.", ""]
    out += _table(["capture", "MoE backend"] + (["FP8 GEMM backend"] if fp8 else []) + ["batch", "mean step ms",
                   "GPU ms/token", "tokens/s",
                   "unprofiled ms/step"] + [f"{md_name(c)} exclusive ms" for c in cats], rows)
    return out + ["", "Unprofiled ms/step: the client's timing of decode without the profiler (run.json), per "
                  "generated token of each sequence.", ""]


# --- budget and kernels ---------------------------------------------------------------------------------------------

def budget_section(data) -> list:
    out = ["## Per-step budget", "",
           "Time per category, and idle time inside the step (GPU waiting: launch gaps, host work, syncs). A "
           "category's exclusive time is its part of the GPU's busy time, each moment shared equally among the "
           "categories running then; exclusive times plus idle are the mean step, and their shares add up to 100%. "
           "Overlapped time is the rest of a category's op time: what ran alongside other categories (another "
           "stream).", ""]
    for cap in data.captures:
        for d in cap.budget["devices"]:
            out.append(f"### {_devices_label(cap, d)}: {d['step_ms']:.3f} ms/step (median of {d['steps']} steps; "
                       f"mean {d['mean_step_ms']:.3f})")
            out.append("")
            out += category_table_md(d)
            notes = [f"classified: {_pct(1.0 - d['unclassified_share'])} of GPU time"]
            outside = d.get("outside_steps") or {}
            if outside.get("ops"):
                notes.append(f"outside every step (not in the budget): {outside['ops']} ops, {outside['ms']:.3f} ms")
            out += ["", "; ".join(notes) + ".", ""]
            precision = precision_markdown(d)
            if precision:
                out += ["GEMMs by the precision of their weights and how the math ran (from the kernel rules: "
                        "`W4A16` kernels read FP4 weights and multiply in BF16; native FP4 needs SM100/SM120):"]
                out += precision + [""]
            evidence = decided_by_lines(d)
            if evidence:
                out += [md_escape(evidence[0]), ""]
                out += [f"- {md_escape(line.strip())}" for line in evidence[1:]] + ([""] if len(evidence) > 1 else [])
            out += _layer_table(d)
    return out


def _layer_table(d: dict) -> list:
    """Per model layer (NVTX layer ranges, or their mapping from an eager twin): time, ops and top categories."""
    if not d.get("layers"):
        return []
    step = d["mean_step_ms"] or 1e-12
    rows = [[md_escape(layer_name(r["layer"])), f"{r['ms_per_step']:.3f}", f"{r['count_per_step']:.2f}",
             _pct(r["ms_per_step"] / step),
             md_escape(", ".join(f"{c['category']} {c['ms_per_step']:.3f}" for c in r["categories"][:3]))]
            for r in d["layers"]]
    return (["By model layer (kernel time; idle and overlap are not split by layer):", ""]
            + _table(["layer", "ms/step", "ops/step", "share", "top categories (ms/step)"], rows) + [""])


def top_kernels_section(data) -> list:
    out = ["## Top kernels", ""]
    for cap in data.captures:
        for d in cap.budget["devices"]:
            step = d["mean_step_ms"] or 1e-12
            out.append(f"### {_devices_label(cap, d)}")
            out.append("")
            rows = []
            by_shape = shape_rows(d)  # one row per (name, grid, block, registers): a name's launches can differ
            for k in by_shape[:TOP_KERNELS]:
                rows.append([md_name(_short(k["name"])), md_escape(k["label"]), md_name(k["category"]),
                             f"{k['ms_per_step']:.3f}", f"{k['count_per_step']:.2f}", f"{k['mean_us']:.1f}",
                             _pct(k["ms_per_step"] / step)])
            out += _table(["kernel", "launch shape", "category", "ms/step", "count/step", "µs per call", "share"],
                          rows)
            more = len(by_shape) - TOP_KERNELS
            if more > 0:
                out += ["", f"{more} more kernel launch shape{'s' if more > 1 else ''} "
                            f"({sum(k['ms_per_step'] for k in by_shape[TOP_KERNELS:]):.3f} ms/step)."]
            short = short_kernel_line(d)
            if short:
                out += ["", md_escape(short[0].upper() + short[1:]) + "."]
            lm = next((g.get("lm_head") for g in (cap.gap or {}).get("devices") or []
                       if g.get("device") == d["device"] and g.get("lm_head")), None)
            if lm:
                out += ["", md_escape(lm_head_sentence(lm))]
            out.append("")
    return out


def lm_head_sentence(lm: dict) -> str:
    """The logits projection's own row: its shape, time, weight bytes and efficiency, against the rest of its
    kernel name (whose mean over every shape hides it)."""
    text = (f"Logits projection (lm_head): {lm['name']} {lm['label']}, once per step, {lm['mean_us']:.1f} µs; it "
            f"reads {lm['weight_bytes'] / 1e6:.0f} MB of weights per step, {lm['achieved_bytes_per_s'] / 1e12:.2f} "
            f"TB/s: {lm['efficiency_pct']:.1f}% of its limit ({lm['floor_ms'] * 1e3:.1f} µs at "
            f"{lm['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s)")
    if lm.get("other_shapes"):
        text += (f"; the name's {lm['other_shapes']} other shape{'s' if lm['other_shapes'] > 1 else ''} run "
                 f"{lm['other_shapes_count_per_step']:.1f}x per step at {lm['other_shapes_mean_us']:.1f} µs, and its "
                 f"per-name mean of {lm['name_mean_us']:.1f} µs describes neither")
    return text + f". ({lm['rule'][0].upper()}{lm['rule'][1:]}.)"


def category_chart_section(data) -> list:
    name = data.charts.get("categories")
    if not name:
        return []
    return ["## Categories per capture", "",
            f"![kernel time per category and idle time, per capture]({name})", "",
            "Left: exclusive ms per step, stacked by category, idle on top: the stack is the mean step (marked); "
            "right: the same as shares of the mean step. The largest categories are shown one by one, the rest "
            "summed.", ""]


