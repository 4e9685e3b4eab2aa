"""The markdown of `profattr report`, from a `collect.ReportData`. Computes nothing; every sentence that interprets
a number is chosen by comparing that number (see `diff_explanation` and `bottlenecks.py`).

Every string that comes from a capture, a run.json or the user (kernel names, labels, paths, commands, messages)
goes through `md_escape`, or into a fenced code block whose fence is longer than any backtick run inside it.
"""
from __future__ import annotations

from profattr import __version__
from profattr.report import why_slow
from profattr.report.budget_view import (category_share, category_table_md, decided_by_lines, layer_name,
                                        precision_markdown)
from profattr.report.campaign import campaign_section
from profattr.report.escape import md_escape
from profattr.report.bottlenecks import ranks_diff
from profattr.report.md_diff import diff_explanation, diff_section  # noqa: F401  (diff_explanation: for callers)
from profattr.report.md_runtime import launch_section, tp_section
from profattr.report.timeline import timeline_section
from profattr.report.distribution_view import distribution_section
from profattr.report.shapes import short_kernel_line, shape_rows
from profattr.report.md_table import (  # noqa: F401  (code_block: for campaign.py)
    _devices_label, _multi_device, _pct, _short, _table, code_block)

TOP_KERNELS = 10
STATUS_MARK = {"pass": "pass", "warn": "**warn**", "fail": "**FAIL**", "skip": "skip"}
PACKAGES = ("torch", "sglang", "sglang_kernel", "flashinfer", "triton", "nvtx", "profattr")


def render_report(data) -> str:
    """The whole report as markdown."""
    labels = [c.label for c in data.captures]
    out = [f"# Decode step report: {' vs '.join(md_escape(x) for x in labels)}", ""]
    out += [f"Written by profattr {md_escape(__version__)}. Everything below is per decode step and per GPU, measured "
            "from the captures listed under Reproducibility; shares are of the mean step.", ""]
    out += summary_section(data)
    out += sweep_section(data)
    out += bottleneck_section(data)
    out += why_slow.section(data)
    out += reproducibility_section(data)
    out += budget_section(data)
    out += top_kernels_section(data)
    out += category_chart_section(data)
    out += campaign_section(data)
    out += launch_section(data)
    out += timeline_section(data, data.out_dir) + distribution_section(data, data.out_dir)
    out += tp_section(data)
    out += diff_section(data)
    out += lint_section(data)
    out += gap_section(data)
    out += projection_section(data)
    return "\n".join(out).rstrip("\n") + "\n"


# --- summary and bottlenecks --------------------------------------------------------------------------------------

SWEEP_CATEGORIES = 4  # the largest categories (over all captures) shown per row of the batch sweep


def projection_section(data) -> list:
    """On the target: the first capture's step projected with `report --to` (report/md_project.py)."""
    from profattr.report.md_project import section

    return section(getattr(data, "projection", None))


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
        label = md_escape(r["label"]) + (f" / GPU {md_escape(r['device'])}" if multi else "")
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
                   "unprofiled ms/step"] + [f"{md_escape(c)} exclusive ms" for c in cats], rows)
    return out + ["", "Unprofiled ms/step: the client's timing of decode without the profiler (run.json), per "
                  "generated token of each sequence.", ""]


def summary_section(data) -> list:
    rows = []
    for cap in data.captures:
        launches = {s["device"]: s for s in cap.launches}
        for d in cap.budget["devices"]:
            s = launches.get(d["device"]) or {}
            top = next((c for c in d["categories"]), None)
            rows.append([_devices_label(cap, d), f"{d['steps']}", f"{d['step_ms']:.3f}", f"{d['mean_step_ms']:.3f}",
                         f"{d['busy_ms_per_step']:.3f}", f"{d['idle_ms_per_step']:.3f}",
                         _pct(d['idle_ms_per_step'] / d['mean_step_ms']) if d['mean_step_ms'] else "",
                         f"{d['kernels_per_step']:.1f}", md_escape(s.get("mode", "?")),
                         (f"{md_escape(top['category'])} ({_pct(category_share(top, d))})"
                          if top and d['mean_step_ms'] else "")])
    out = ["## Summary", ""]
    out += _table(["capture", "steps", "step ms (median)", "mean step ms", "busy ms", "idle ms", "idle share",
                   "kernels/step", "launch mode", "largest category"], rows)
    out += ["", "Launch mode: `graph` when most GPU ops of a step are CUDA-graph replays, `eager` when none are.", ""]
    return out


def bottleneck_section(data) -> list:
    out = ["## Bottlenecks, ranked", ""]
    if not data.bottlenecks:
        return out + ["Nothing above the thresholds (idle under 10% of the step, no category over 5%, no change "
                      "beyond noise).", ""]
    out.append("Largest first, in ms per step; each reason is built from that capture's numbers.")
    unranked = [e for e in data.diffs if not ranks_diff(e["diff"])]
    if unranked and len(unranked) == len(data.diffs):
        out[-1] += (" No difference between captures is ranked: no comparison here has the windows per side (3) "
                    "and like-for-like runs that establish one, so each capture ranks by its own budget.")
    elif unranked:
        out[-1] += (f" {len(unranked)} of the {len(data.diffs)} comparisons establish no difference (too few "
                    "windows per side, or confounded runs) and are not ranked.")
    out.append("")
    for b in data.bottlenecks:
        where = md_escape(b["capture"])
        if _multi_device(data):
            where += f", GPU {md_escape(b['device'])}"
        of = "of the slower step" if b["kind"] == "diff" else "of the step"
        also = ""
        if b.get("also"):
            others = [f"{a['capture']}" + (f" GPU {a['device']}" if _multi_device(data) else "")
                      + f" {a['ms_per_step']:.3f} ms" for a in b["also"]]
            also = f"; also {', '.join(others)}"
        out.append(f"{b['rank']}. **{md_escape(b['title'])}** ({where}; {b['ms_per_step']:.3f} ms/step, "
                   f"{_pct(b['share_of_step'])} {of}): {md_escape(b['reason'] + also)}")
    return out + [""]


# --- reproducibility ----------------------------------------------------------------------------------------------

def reproducibility_section(data) -> list:
    out = ["## Reproducibility", ""]
    if data.command:
        out += ["This report was written by (paths relative to the folder it ran in):", ""]
        out += code_block(data.command, "sh") + [""]
    out += evidence_lines(data) + [""]
    for cap in data.captures:
        out += capture_header(cap) + [""]
    return out


def evidence_lines(data) -> list:
    gpus = sorted({str(g.get("name")) for c in data.captures for g in _gpu_list(c) if g.get("name")})
    n = len(data.captures)
    ev = data.evidence
    out = ["**Evidence.** Measured: every number in this report comes from the "
           f"{n} capture{'s' if n > 1 else ''} below, recorded by Nsight Systems on "
           f"{md_escape(', '.join(gpus) or 'the GPUs they name')}."]
    if ev:
        hit = ev.get("hit_by_evidence", {})
        ms = ev.get("ms_by_evidence", {})
        total_ms = sum(ms.values()) or 1.0
        parts = ", ".join(f"{md_escape(k)} {v} ({_pct(ms.get(k, 0.0) / total_ms)} of classified kernel time)"
                          for k, v in sorted(hit.items()))
        out.append(f"Classification: {len(ev.get('rules_hit', []))} of the taxonomy's {ev.get('rules_total', 0)} "
                   f"rules classified these kernels (by the evidence the taxonomy records for each rule: "
                   f"{parts or 'none'}; `observed` = seen in a published profile, `source` = read from kernel "
                   "source, `derived` = from a naming rule); rules that fire here are confirmed on these real kernel "
                   "names.")
        if ev.get("unmatched_rules"):
            by_ev = ", ".join(f"{md_escape(k)} {v}" for k, v in sorted(ev["unmatched_by_evidence"].items()))
            text = (f"From sources only: the other {ev['unmatched_rules']} rules (evidence {by_ev}) matched no kernel "
                    "in these captures; their kernel names come from published profiles and kernel source, not from "
                    "a capture of this report")
            if ev.get("other_hardware_rules"):
                examples = ", ".join(md_escape(x) for x in ev.get("other_hardware_examples", []))
                text += (f". Among them are {ev['other_hardware_rules']} rules whose names or patterns are of "
                         f"SM100/SM120 or FP4 (NVFP4) kernels, e.g. {examples}")
            out.append(text + ".")
    return [" ".join(out)]


def _gpu_list(cap) -> list:
    run = cap.run or {}
    if isinstance(run.get("gpus"), list) and run["gpus"]:
        return [g for g in run["gpus"] if isinstance(g, dict)]
    return [g for g in cap.budget["capture"].get("gpus") or [] if isinstance(g, dict)]


def capture_header(cap) -> list:
    run = cap.run or {}
    budget = cap.budget
    out = [f"### {md_escape(cap.label)}", ""]
    lines = [f"capture: {md_escape(cap.path)}"]
    if cap.run_path:
        lines.append(f"run metadata: {md_escape(cap.run_path)}")
    if cap.run_note:
        lines.append(md_escape(cap.run_note))
    if run.get("created_utc"):
        lines.append(f"captured: {md_escape(run['created_utc'])} (target {md_escape(run.get('target', '?'))})")
    backend = run.get("backend")
    if isinstance(backend, dict) and backend:
        lines.append("MoE runner backend: " + ", ".join(f"{md_escape(k)} {md_escape(v)}"
                                                        for k, v in backend.items()))
    workload = run.get("workload") if isinstance(run.get("workload"), dict) else None
    if workload:
        lines.append(f"built-in workload: {md_escape(workload.get('moe_impl', '?'))} MoE "
                     f"({md_escape(workload.get('moe_kernel', '?'))}), {md_escape(workload.get('mode', '?'))} mode, "
                     f"batch {md_escape(workload.get('batch', '?'))}, tp {md_escape(workload.get('tp', '?'))}, "
                     f"{md_escape(workload.get('dtype', '?'))}")
    if run.get("model"):
        requests = run.get("requests") if isinstance(run.get("requests"), dict) else {}
        lines.append(f"model: {md_escape(run['model'])}, tp {md_escape(run.get('tp', '?'))}, batch "
                     f"{md_escape(requests.get('batch', '?'))}, {md_escape(requests.get('input_len', '?'))} input "
                     f"tokens, {md_escape(requests.get('max_new_tokens', '?'))} new tokens")
    gpus = _gpu_list(cap)
    if gpus:
        names = ", ".join(f"{md_escape(g.get('index', g.get('id', '?')))}: {md_escape(g.get('name', '?'))}"
                          for g in gpus)
        driver = run.get("driver_version") or next((g.get("driver_version") for g in gpus
                                                    if g.get("driver_version")), None)
        where = "GPUs of the host" if run.get("gpus") else "GPUs in the export"
        lines.append(f"{where}: {names}" + (f"; driver {md_escape(driver)}" if driver else ""))
    nsys = (run.get("nsys") or {}).get("version") if isinstance(run.get("nsys"), dict) else None
    lines.append(f"Nsight Systems: {md_escape(nsys or '?')} (capture), export "
                 f"{md_escape(budget['capture'].get('nsys_version') or '?')}")
    packages = run.get("packages") if isinstance(run.get("packages"), dict) else {}
    if packages:
        shown = [(k, packages[k]) for k in PACKAGES if packages.get(k)]
        shown += [(k, v) for k, v in sorted(packages.items()) if k not in PACKAGES and v]
        lines.append("packages: " + ", ".join(f"{md_escape(k)} {md_escape(v)}" for k, v in shown))
    host = run.get("host") if isinstance(run.get("host"), dict) else {}
    if host.get("python"):
        lines.append(f"python {md_escape(host['python'])} on {md_escape(host.get('platform', '?'))}")
    timing = run.get("timing") if isinstance(run.get("timing"), dict) else {}
    unprofiled = timing.get("ms_per_token_unprofiled")
    if isinstance(unprofiled, (int, float)):
        text = f"decode without the profiler: {unprofiled:.3f} ms/token"
        profiled = timing.get("ms_per_token_profiled")
        if isinstance(profiled, (int, float)) and unprofiled:
            text += f"; under nsys {profiled:.3f} ms/token ({profiled / unprofiled:.2f}x)"
        lines.append(text)
    steps = budget["steps"]
    lines.append(f"steps: {md_escape(steps['source'])} ×{steps['count']} ({md_escape(steps.get('reason', ''))})")
    if budget.get("nvtx_context"):
        lines.append(f"NVTX context of replayed kernels: {md_escape(budget['nvtx_context'])}")
    out += [f"- {line}" for line in lines]
    commands = run.get("commands") if isinstance(run.get("commands"), dict) else {}
    shell = commands.get("profile_shell") or (" ".join(map(str, commands["profile"]))
                                              if isinstance(commands.get("profile"), list) else None)
    if shell:
        out += ["", "Capture command:", ""] + code_block(str(shell), "sh")
    for key in ("import", "export"):
        if isinstance(commands.get(key), list):
            out += ["", f"{key.capitalize()}:", ""] + code_block(" ".join(map(str, commands[key])), "sh")
    return out


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
                rows.append([md_escape(_short(k["name"])), md_escape(k["label"]), md_escape(k["category"]),
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


# --- lint and gap -----------------------------------------------------------------------------------------------------

def lint_section(data) -> list:
    out = ["## Capture checks", ""]
    for cap in data.captures:
        out.append(f"### {md_escape(cap.label)}")
        out.append("")
        if cap.checks_source == "run.json":
            out.append("Recorded in run.json by `profattr check` when the capture was made.")
        elif cap.checks_source == "now":
            out.append("Computed now by `profattr check` (run.json records none).")
        else:
            out.append("Not available: " + md_escape(cap.checks_note or "no findings"))
        out.append("")
        if cap.checks:
            rows = [[STATUS_MARK.get(str(f.get("status")), md_escape(f.get("status"))), md_escape(f.get("check", "")),
                     md_escape(f.get("message", ""))] for f in cap.checks]
            out += _table(["status", "check", "finding"], rows)
            out.append("")
    return out


def gap_section(data) -> list:
    out = ["## Gap to the hardware limit", ""]
    any_gap = False
    for cap in data.captures:
        out.append(f"### {md_escape(cap.label)}")
        out.append("")
        if cap.gap is None:
            out += [md_escape(cap.gap_note or "skipped"), ""]
            continue
        any_gap = True
        from profattr.limits.render import render_gap_markdown

        text = render_gap_markdown(cap.gap)
        # demote the gap renderer's headings under this capture's heading; drop its own title
        lines = text.splitlines()
        if lines and lines[0].startswith("## "):
            lines = lines[1:]
        out += [("##" + line) if line.startswith("### ") else line for line in lines]
        chart = data.charts.get(f"gap:{cap.label}")
        if chart:
            out += ["", f"![waterfall from the hardware floor to the measured step]({chart})"]
        out.append("")
    if not any_gap:
        out.insert(2, "The floor needs the model's sizes: the built-in workload records them in run.json; for "
                      "other captures use `profattr gap CAPTURE --model PRESET`.")
        out.insert(3, "")
    return out
