"""The markdown of `profattr report`, from a `collect.ReportData`. Computes nothing; every sentence that interprets
a number is chosen by comparing that number (see `diff_explanation` and `bottlenecks.py`).

Every string that comes from a capture, a run.json or the user (kernel names, labels, paths, commands, messages)
goes through `md_escape`, or into a fenced code block whose fence is longer than any backtick run inside it.
"""
from __future__ import annotations

import re

from profattr import __version__
from profattr.report import diff_view, host_gaps, why_slow
from profattr.report.budget_view import layer_name
from profattr.report.bottlenecks import idle_reason, kernel_idle_sentence, split_delta
from profattr.report.campaign import campaign_section
from profattr.report.escape import md_escape

TOP_KERNELS = 10
NAME_WIDTH = 80
STATUS_MARK = {"pass": "pass", "warn": "**warn**", "fail": "**FAIL**", "skip": "skip"}
PACKAGES = ("torch", "sglang", "sglang_kernel", "flashinfer", "triton", "nvtx", "profattr")


def code_block(text: str, lang: str = "") -> list:
    """A fenced code block that nothing inside can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + lang, text, fence]


def _short(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _f(value, fmt: str = ".1f", none: str = "n/a") -> str:
    return none if value is None else format(value, fmt)


def _devices_label(cap, d) -> str:
    n = len(cap.budget["devices"])
    return md_escape(cap.label) if n == 1 else f"{md_escape(cap.label)} / GPU {d['device']}"


def _numeric(cell) -> bool:
    text = str(cell).strip("*% ").replace(",", "")
    try:
        float(text)
        return True
    except ValueError:
        return False


def _table(headers, rows) -> list:
    """A markdown table; columns whose cells are all numbers (or empty) are right-aligned."""
    align = []
    for i, _ in enumerate(headers):
        cells = [r[i] for r in rows if str(r[i]).strip()]
        align.append("---:" if cells and all(_numeric(c) for c in cells) else "---")
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


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
    out += tp_section(data)
    out += diff_section(data)
    out += lint_section(data)
    out += gap_section(data)
    return "\n".join(out).rstrip("\n") + "\n"


# --- summary and bottlenecks --------------------------------------------------------------------------------------

SWEEP_CATEGORIES = 4  # the largest categories (over all captures) shown per row of the batch sweep


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
    for r in sorted(data.sweep, key=lambda r: (str(r["backend"]), r["batch"] or 0)):
        label = md_escape(r["label"]) + (f" / GPU {md_escape(r['device'])}" if multi else "")
        rows.append([label, md_escape(r["backend"] or "?"), r["batch"] or "?", f"{r['mean_step_ms']:.3f}",
                     f"{r['ms_per_token']:.3f}" if r["ms_per_token"] else "",
                     f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "",
                     f"{r['unprofiled_ms_per_step']:.3f}" if r["unprofiled_ms_per_step"] else ""]
                    + [f"{r['categories'].get(c, 0.0):.3f}" for c in cats])
    out = ["## Batch sweep", "",
           "A step at batch B decodes B tokens: per token and per second are the comparable figures. The diffs "
           "below compare captures of the same batch size only.", ""]
    out += _table(["capture", "MoE backend", "batch", "mean step ms", "GPU ms/token", "tokens/s",
                   "unprofiled ms/step"] + [f"{md_escape(c)} ms" for c in cats], rows)
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
                         (f"{md_escape(top['category'])} ({_pct(top['ms_per_step'] / d['mean_step_ms'])})"
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


def _multi_device(data) -> bool:
    return any(len(c.budget["devices"]) > 1 for c in data.captures)


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
           "Kernel time per category, and idle time inside the step (GPU waiting: launch gaps, host work, syncs). "
           "Category time plus idle, minus overlap (two streams at once), is the mean step.", ""]
    for cap in data.captures:
        for d in cap.budget["devices"]:
            step = d["mean_step_ms"] or 1e-12
            out.append(f"### {_devices_label(cap, d)}: {d['step_ms']:.3f} ms/step (median of {d['steps']} steps; "
                       f"mean {d['mean_step_ms']:.3f})")
            out.append("")
            rows = [[md_escape(c["category"]), f"{c['ms_per_step']:.3f}", f"{c['count_per_step']:.2f}",
                     _pct(c["ms_per_step"] / step)] for c in d["categories"]]
            rows.append(["idle (inside steps)", f"{d['idle_ms_per_step']:.3f}", "", _pct(d["idle_ms_per_step"] / step)])
            if d["overlap_ms_per_step"] > 5e-4:
                rows.append(["overlap (subtracted)", f"-{d['overlap_ms_per_step']:.3f}", "", ""])
            rows.append(["**mean step**", f"**{d['mean_step_ms']:.3f}**", "", "100.0%"])
            out += _table(["category", "ms/step", "count/step", "share"], rows)
            notes = [f"classified: {_pct(1.0 - d['unclassified_share'])} of GPU time"]
            outside = d.get("outside_steps") or {}
            if outside.get("ops"):
                notes.append(f"outside every step (not in the budget): {outside['ops']} ops, {outside['ms']:.3f} ms")
            out += ["", "; ".join(notes) + ".", ""]
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
            for k in d["kernels"][:TOP_KERNELS]:
                mean_us = 1e3 * k["ms_per_step"] / k["count_per_step"] if k["count_per_step"] else 0.0
                rows.append([md_escape(_short(k["name"])), md_escape(k["category"]), f"{k['ms_per_step']:.3f}",
                             f"{k['count_per_step']:.2f}", f"{mean_us:.1f}", _pct(k["ms_per_step"] / step)])
            out += _table(["kernel", "category", "ms/step", "count/step", "µs per call", "share"], rows)
            more = len(d["kernels"]) - TOP_KERNELS
            if more > 0:
                out += ["", f"{more} more kernel name{'s' if more > 1 else ''} "
                            f"({sum(k['ms_per_step'] for k in d['kernels'][TOP_KERNELS:]):.3f} ms/step)."]
            out.append("")
    return out


def category_chart_section(data) -> list:
    name = data.charts.get("categories")
    if not name:
        return []
    return ["## Categories per capture", "",
            f"![kernel time per category and idle time, per capture]({name})", "",
            "Left: ms per step, stacked by category, idle on top; right: the same as shares of the step. "
            "The largest categories are shown one by one, the rest summed.", ""]


# --- idle and launches ----------------------------------------------------------------------------------------------

def launch_section(data) -> list:
    out = ["## Idle time and launches", "",
           "Launch calls are counted per step on the step's CPU thread; gaps are between consecutive GPU ops of a "
           "step (their sum is the idle time), each charged to the op that ends it: one replayed from a CUDA "
           "graph, or one launched by itself.", ""]
    rows, gap_rows, notes = [], [], []
    for cap in data.captures:
        devices = {d["device"]: d for d in cap.budget["devices"]}
        for s in cap.launches:
            d = devices[s["device"]]
            label = _devices_label(cap, d)
            rows.append([label, md_escape(s["mode"]), _f(s["graph_launches_per_step"], ".2f"),
                         _f(s["kernel_launches_per_step"], ".1f"), _f(s["memory_calls_per_step"], ".1f"),
                         _f(s["sync_calls_per_step"], ".1f"), f"{s['kernels_per_step']:.1f}",
                         f"{s['graph_ops_per_step']:.1f}", f"{s['eager_ops_per_step']:.1f}"])
            gap_rows.append([label, f"{s['mean_step_ms']:.3f}", f"{s['idle_ms_per_step']:.3f}",
                             _pct(s["idle_share"]), f"{s['idle_before_graph_ops_ms']:.3f}",
                             f"{s['idle_before_eager_ops_ms']:.3f}", f"{s['mean_gap_us']:.2f}",
                             f"{s['median_gap_us']:.2f}", f"{s['largest_gap_us']:.1f}"])
            reason = idle_reason(s)
            notes.append(f"- **{label}**: " + (md_escape(f"idle {100 * s['idle_share']:.0f}% of the step: {reason}")
                                               if reason else
                                               md_escape(f"idle {100 * s['idle_share']:.1f}% of the step: the GPU "
                                                         "runs kernels nearly back to back; the step is kernel "
                                                         "time")))
            host = host_gaps.describe(s.get("host_in_idle") or {})
            if host:
                notes[-1] += md_escape(f"; {host}")
    out += _table(["capture", "mode", "graph launches/step", "kernel launches/step", "memcpy/memset calls/step",
                   "sync calls/step", "kernels/step", "ops replayed from a graph/step", "ops launched eagerly/step"],
                  rows)
    out += [""]
    out += _table(["capture", "mean step ms", "idle ms", "idle share", "idle inside graph replays ms",
                   "idle before eager ops ms", "mean gap µs", "median nonzero gap µs", "largest gap per step µs"],
                  gap_rows)
    out += [""] + notes + [""]
    name = data.charts.get("launches")
    if name:
        out += [f"![busy vs idle time and how the ops are launched, per capture]({name})", ""]
    return out


def tp_section(data) -> list:
    """Tensor parallelism: per rank, collective time split into transfer and waiting for the slowest rank."""
    caps = [c for c in data.captures if c.budget.get("comm")]
    if not caps:
        return []
    out = ["## Tensor parallelism", "",
           "The k-th collective of a step is matched on every rank: its transfer time is its duration on the rank "
           "that arrived last; on every other rank the rest is waiting for that rank (skew, not communication).", ""]
    for cap in caps:
        rows, devices = [], [d for d in cap.budget["devices"] if d.get("comm")]
        for d in devices:
            c = d["comm"]
            share = c["wait_ms_per_step"] / c["collective_ms_per_step"] if c["collective_ms_per_step"] else 0.0
            rows.append([f"GPU {md_escape(d['device'])}", f"{d['mean_step_ms']:.3f}", f"{c['collective_ms_per_step']:.3f}",
                         f"{c['transfer_ms_per_step']:.3f}", f"{c['wait_ms_per_step']:.3f}", _pct(share),
                         f"{c.get('caused_wait_ms_per_step', 0.0):.3f}", _pct(c["slowest_rank_share"])])
        out += [f"### {md_escape(cap.label)}", ""]
        out += _table(["rank", "mean step ms", "collectives ms/step", "transfer ms", "wait ms", "wait share",
                       "others' wait it caused ms", "slowest in % of steps"], rows)
        if devices:
            slow = max(devices, key=lambda d: (d["comm"].get("caused_wait_ms_per_step", 0.0),
                                               d["comm"]["slowest_rank_share"]))
            others = [d for d in devices if d is not slow]
            caused = slow["comm"].get("caused_wait_ms_per_step", 0.0)
            total = sum(d["comm"]["collective_ms_per_step"] for d in others)
            out += ["", md_escape(
                f"GPU {slow['device']} is the rank the others wait for: they spend {caused:.3f} ms/step in all "
                f"waiting at collectives it reached last"
                + (f" ({100 * caused / total:.0f}% of their collective time)" if total else "")
                + f"; it was the slowest rank in {100 * slow['comm']['slowest_rank_share']:.0f}% of "
                f"{cap.budget['comm'].get('steps_compared', '?')} steps. Speed up that rank's work before the "
                "collectives (or its launches), not the all-reduce.")]
        out.append("")
    return out


# --- diffs ------------------------------------------------------------------------------------------------------------

def diff_section(data) -> list:
    if not data.diffs:
        return []
    bases = list(dict.fromkeys(e["a"] for e in data.diffs))
    title = f"## Differences against {md_escape(bases[0])}" if len(bases) == 1 else "## Differences"
    out = [title, "",
           *([f"Each capture is compared with the first capture of its batch size ({', '.join(map(md_escape, bases))})."
              , ""] if len(bases) > 1 else []),
           "Each component is B minus A in ms per step; the components add up to the change of the median step. "
           "Intervals are 95% bootstrap intervals over steps; a component whose interval holds 0 is noise.", ""]
    for entry in data.diffs:
        a, b, diff = entry["a"], entry["b"], entry["diff"]
        out.append(f"### {md_escape(b)} vs {md_escape(a)}")
        out.append("")
        out += [f"- {line}" for line in diff_explanation(diff, a, b, entry.get("a_modes"), entry.get("b_modes"))]
        ua, ub = entry.get("a_unprofiled_ms_per_token"), entry.get("b_unprofiled_ms_per_token")
        if ua and ub:
            out.append(f"- Without the profiler (run.json timing), {md_escape(a)} decodes at {ua:.3f} ms/token and "
                       f"{md_escape(b)} at {ub:.3f} ({ub - ua:+.3f} ms, {100.0 * (ub - ua) / ua:+.1f}%): the "
                       "profiled difference above is measured under nsys, whose overhead can differ between the two.")
        out.append("")
        out.append(diff_view.render_markdown(diff, a_label=a, b_label=b))
        out.append("")
    return out


def diff_explanation(diff: dict, a: str, b: str, a_modes: dict | None = None, b_modes: dict | None = None) -> list:
    """Short, escaped sentences that follow the diff's numbers: size and significance of the change, kernel vs idle
    time, the largest components, and a plain statement when the comparison's premise is wrong."""
    A, B = md_escape(a), md_escape(b)
    lines = []
    for w in diff.get("warnings") or []:
        lines.append(f"**The premise of this comparison is wrong:** {md_escape(w)}.")
    sa, sb = (diff.get("a") or {}).get("steps") or {}, (diff.get("b") or {}).get("steps") or {}
    if sa.get("source") and sb.get("source") and sa["source"] != sb["source"]:
        lines.append(f"**Steps are defined differently** ({A}: {md_escape(sa['source'])}, {B}: "
                     f"{md_escape(sb['source'])}): the step times may not be like for like.")
    for d in diff["devices"]:
        s = d["step_ms"]
        gpu = f"GPU {md_escape(d['device'])}: " if len(diff["devices"]) > 1 else ""
        ci = s.get("ci95")
        noise = ci is not None and ci[0] <= 0.0 <= ci[1]
        rel = f" ({100.0 * s['relative']:+.1f}%)" if s.get("relative") is not None else ""
        direction = "slower" if s["delta"] > 0 else "faster"
        if noise:
            lines.append(f"{gpu}{B} differs from {A} by {s['delta']:+.3f} ms/step{rel}, within noise (95% interval "
                         f"[{ci[0]:+.3f}, {ci[1]:+.3f}]): no real difference in step time.")
        else:
            sig = f", 95% interval [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (no interval: budget JSON input)"
            lines.append(f"{gpu}{B} is {direction} than {A} by {abs(s['delta']):.3f} ms/step{rel}{sig}.")
        parts = split_delta(d)
        wait = (f", waiting inside collectives {parts['comm_wait']:+.3f} ms"
                if any(c["component"] == "comm_wait" for c in d["components"]) else "")
        lines.append(f"{gpu}Kernel time (categories minus overlap) {parts['kernel']:+.3f} ms{wait}, idle "
                     f"{parts['idle']:+.3f} ms, median-vs-mean step drift {parts['variability']:+.3f} ms.")
        mode_a, mode_b = (a_modes or {}).get(d["device"]), (b_modes or {}).get(d["device"])
        if mode_a and mode_b and mode_a != mode_b:
            lines.append(f"{gpu}The launch mode differs ({A} {md_escape(mode_a)}, {B} {md_escape(mode_b)}): idle "
                         "time changes with how the kernels are launched, not only with how many there are.")
        ka, kb = d["kernels_per_step"]["a"], d["kernels_per_step"]["b"]
        if abs(kb - ka) >= 0.1 * max(ka, kb, 1e-12) and abs(parts["idle"]) > abs(parts["kernel"]) \
                and parts["idle"] * s["delta"] > 0:
            lines.append(f"{gpu}{B} runs {kb:.0f} kernels/step against {ka:.0f}: most of the change is idle/launch "
                         "time, not kernel time.")
        sentence = kernel_idle_sentence(parts, s["delta"], a, b)
        if sentence:
            lines.append(f"{gpu}{md_escape(sentence)}.")
        comps = [c for c in d["components"] if not c["noise"] and c["component"].startswith("category:")]
        comps.sort(key=lambda c: -abs(c["delta_ms_per_step"]))
        for c in comps[:3]:
            if abs(c["delta_ms_per_step"]) < 1e-3:
                continue
            lines.append(f"{gpu}{md_escape(c['component'].split(':', 1)[1])} {c['delta_ms_per_step']:+.3f} ms: "
                         + _component_detail(c, A, B))
    return lines


def _names(names: list) -> str:
    if not names:
        return "none"
    return ", ".join(md_escape(_short(x, 50)) for x in names[:2]) + (f" (+{len(names) - 2})" if len(names) > 2 else "")


def _component_detail(c: dict, A: str, B: str) -> str:
    """Count vs duration part of a category change, and the kernels found on one side only (A, B: escaped)."""
    count, dur = c.get("from_count_ms", 0.0), c.get("from_duration_ms", 0.0)
    n = c.get("count_delta_per_step", 0.0)
    if abs(count) >= abs(dur):
        text = f"mostly from the kernel count ({n:+.1f} kernels/step: {count:+.3f} ms)"
    else:
        text = f"mostly from {'longer' if dur > 0 else 'shorter'} kernels ({dur:+.3f} ms; count {n:+.1f}/step)"
    kernels = c.get("kernels") or {}
    only_a = [k["name"] for k in kernels.get("only_a", [])]
    only_b = [k["name"] for k in kernels.get("only_b", [])]
    if only_a or only_b:
        text += f"; kernels only in {A}: {_names(only_a)}; only in {B}: {_names(only_b)}"
    return text + "."


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
