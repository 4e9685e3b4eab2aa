"""The details file of `profattr report` (details.md, beside report.md): how the report can be reproduced (the
command, each capture's run.json facts, versions, the taxonomy's evidence), the capture checks, and the full gap to
the hardware limit per capture (category floors, the waterfall table, assumptions). Computes nothing.
"""
from __future__ import annotations

from profattr.text import md_escape, md_name
from profattr.report.md_table import _pct, _table, code_block
from profattr.run_record import or_empty

STATUS_MARK = {"pass": "pass", "warn": "**warn**", "fail": "**FAIL**", "skip": "skip"}
PACKAGES = ("torch", "sglang", "sglang_kernel", "flashinfer", "triton", "nvtx", "profattr")


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


def _shown(value):
    """A run.json value for the header, `?` when it is not recorded."""
    return "?" if value is None else value


def _gpu_list(cap) -> list:
    gpus = or_empty(cap.run).gpus
    if gpus:
        return gpus
    return [g for g in cap.budget["capture"].get("gpus") or [] if isinstance(g, dict)]


def capture_header(cap) -> list:
    run = or_empty(cap.run)
    budget = cap.budget
    out = [f"### {md_name(cap.label)}", ""]
    lines = [f"capture: {md_name(cap.path)}"]
    if cap.run_path:
        lines.append(f"run metadata: {md_name(cap.run_path)}")
    if cap.run_note:
        lines.append(md_escape(cap.run_note))
    if run.created_utc:
        lines.append(f"captured: {md_escape(run.created_utc)} (target {md_escape(_shown(run.target))})")
    if run.backend:
        lines.append("MoE runner backend: " + ", ".join(f"{md_escape(k)} {md_escape(v)}"
                                                        for k, v in run.backend.items()))
    workload = run.workload
    if workload:
        lines.append(f"built-in workload: {md_escape(workload.get('moe_impl', '?'))} MoE "
                     f"({md_escape(workload.get('moe_kernel', '?'))}), {md_escape(workload.get('mode', '?'))} mode, "
                     f"batch {md_escape(workload.get('batch', '?'))}, tp {md_escape(workload.get('tp', '?'))}, "
                     f"{md_escape(workload.get('dtype', '?'))}")
    if run.model:
        lines.append(f"model: {md_name(run.model)}, tp {md_escape(_shown(run.tp))}, batch "
                     f"{md_escape(_shown(run.batch))}, {md_escape(_shown(run.input_len))} input "
                     f"tokens, {md_escape(_shown(run.max_new_tokens))} new tokens")
    gpus = _gpu_list(cap)
    if gpus:
        names = ", ".join(f"{md_escape(g.get('index', g.get('id', '?')))}: {md_escape(g.get('name', '?'))}"
                          for g in gpus)
        driver = run.driver_version or next((g.get("driver_version") for g in gpus
                                             if g.get("driver_version")), None)
        where = "GPUs of the host" if run.gpus else "GPUs in the export"
        lines.append(f"{where}: {names}" + (f"; driver {md_escape(driver)}" if driver else ""))
    lines.append(f"Nsight Systems: {md_escape(run.nsys_version or '?')} (capture), export "
                 f"{md_escape(budget['capture'].get('nsys_version') or '?')}")
    packages = run.packages
    if packages:
        shown = [(k, packages[k]) for k in PACKAGES if packages.get(k)]
        shown += [(k, v) for k, v in sorted(packages.items()) if k not in PACKAGES and v]
        lines.append("packages: " + ", ".join(f"{md_escape(k)} {md_escape(v)}" for k, v in shown))
    host = run.host
    if host.get("python"):
        lines.append(f"python {md_escape(host['python'])} on {md_escape(host.get('platform', '?'))}")
    unprofiled = run.ms_per_token_unprofiled
    if unprofiled is not None:
        text = f"decode without the profiler: {unprofiled:.3f} ms/token"
        profiled = run.ms_per_token_profiled
        if profiled is not None and unprofiled:
            text += f"; under nsys {profiled:.3f} ms/token ({profiled / unprofiled:.2f}x)"
        lines.append(text)
    steps = budget["steps"]
    lines.append(f"steps: {md_name(steps['source'])} ×{steps['count']} ({md_escape(steps.get('reason', ''))})")
    if budget.get("nvtx_context"):
        lines.append(f"NVTX context of replayed kernels: {md_escape(budget['nvtx_context'])}")
    out += [f"- {line}" for line in lines]
    commands = run.commands
    shell = commands.get("profile_shell") or (" ".join(map(str, commands["profile"]))
                                              if isinstance(commands.get("profile"), list) else None)
    if shell:
        out += ["", "Capture command:", ""] + code_block(str(shell), "sh")
    for key in ("import", "export"):
        if isinstance(commands.get(key), list):
            out += ["", f"{key.capitalize()}:", ""] + code_block(" ".join(map(str, commands[key])), "sh")
    return out


# --- lint and gap -----------------------------------------------------------------------------------------------------

def lint_section(data) -> list:
    out = ["## Capture checks", ""]
    for cap in data.captures:
        out.append(f"### {md_name(cap.label)}")
        out.append("")
        if cap.checks_source == "run.json":
            out.append("Recorded in run.json by `profattr check` when the capture was made.")
        elif cap.checks_source == "now":
            out.append(f"Computed now by `profattr check` on this report's steps and rules ({md_escape(cap.checks_note)}).")
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
        out.append(f"### {md_name(cap.label)}")
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
