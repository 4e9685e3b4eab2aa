"""Render a diff (the `profattr.diff/1` dict) for a person (table) or as markdown."""
from __future__ import annotations

from profattr.attribute.confounds import describe
from profattr.report.budget_view import layer_name
from profattr.text import md_escape, md_name
from profattr.text import clean_tree


def _ci(ci) -> str:
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "n/a"


def quiet_note(c: dict, d: dict) -> str:
    """Why a component is not a change: its interval holds 0 (noise), or it is real but under the threshold."""
    if not c.get("noise"):
        return ""
    ci = c.get("ci95")
    if c["component"] != "step_variability" and ci and not (ci[0] <= 0.0 <= ci[1]):
        return f"small: under {d.get('practical_threshold_ms', 0.0):.3f} ms"
    return "noise"


def _kernel_line(row: dict, width: int = 60) -> str:
    k = row.get("kernels") or {}
    a = [x["name"] for x in k.get("only_a", [])]
    b = [x["name"] for x in k.get("only_b", [])]
    if not a and not b:
        return ""

    def cut(names):
        s = ", ".join(n if len(n) <= width else n[: width - 1] + "…" for n in names[:2])
        return s + (f" (+{len(names) - 2})" if len(names) > 2 else "")
    return f"{cut(a) or '-'} -> {cut(b) or '-'}"


def family_note(c: dict) -> str:
    """A category's change in parts: added and removed families, count and duration effects of shared ones."""
    parts = []
    for key, label in (("added_ms", "added"), ("removed_ms", "removed"), ("from_count_ms", "count"),
                       ("from_duration_ms", "duration"), ("moved_to_comm_wait_ms", "to comm_wait"),
                       ("moved_to_overlap_ms", "contention taken out")):
        v = c.get(key) or 0.0
        if abs(v) >= 5e-4:
            parts.append(f"{label} {v:+.3f}")
    return ", ".join(parts)


def levels_line(diff: dict) -> str:
    """What each side was measured at and which variance the intervals cover (raw text), or '' for an older diff."""
    la, lb = (diff.get("a") or {}).get("levels"), (diff.get("b") or {}).get("levels")
    cover = diff.get("interval") or {}
    if not la or not lb:
        return ""

    def side(x):
        servers = "?" if x["servers"] is None else x["servers"]
        return f"{servers} server(s), {x['windows']} window(s), {x['steps']} steps"
    text = f"A {side(la)}; B {side(lb)}; intervals cover {', '.join(cover.get('covers') or ['steps'])}"
    if cover.get("missing"):
        text += "; not " + "; not ".join(cover["missing"])
    return text


def verdict_line(diff: dict) -> str:
    """`VERDICT (reason)` (raw text); an older diff's verdict sentence as it is."""
    reason = diff.get("verdict_reason")
    return f"{diff['verdict']} ({reason})" if reason else str(diff.get("verdict", ""))


def render_table(diff: dict) -> str:
    diff = clean_tree(diff)
    first = [w for w in diff.get("warnings", []) if w.startswith("not a backend comparison")]
    lines = [f"WARNING: {w}" for w in first] + [f"A: {diff['a']['path']}", f"B: {diff['b']['path']}"]
    for w in diff.get("warnings", []):
        if w not in first:
            lines.append(f"WARNING: {w}")
    changed, confounds = describe(diff.get("confounds") or [], "intended"), describe(diff.get("confounds") or [],
                                                                                      "confound")
    if changed:
        lines.append(f"changed: {changed}")
    if confounds:
        lines.append(f"WARNING: also differs (part of the step difference may come from it): {confounds}")
    if levels_line(diff):
        lines.append(f"levels: {levels_line(diff)}")
    for d in diff["devices"]:
        s = d["step_ms"]
        lines.append("")
        lines.append(f"GPU {d['device']}: step {s['a']:.3f} -> {s['b']:.3f} ms ({s['delta']:+.3f} ms, 95% CI "
                     f"{_ci(s['ci95'])}); kernels/step {d['kernels_per_step']['a']:.1f} -> "
                     f"{d['kernels_per_step']['b']:.1f}")
        lines.append(f"  {'component':<28}{'A':>9}{'B':>9}{'delta':>10}  {'95% CI':<20} note")
        for c in d["components"]:
            if abs(c["delta_ms_per_step"]) < 5e-5 and abs(c["a_ms_per_step"]) < 5e-5:
                continue
            note = quiet_note(c, d)
            if "from_count_ms" in c and abs(c["delta_ms_per_step"]) >= 5e-4:
                note += f"{'; ' if note else ''}{family_note(c)}"
            lines.append(f"  {c['component']:<28}{c['a_ms_per_step']:>9.3f}{c['b_ms_per_step']:>9.3f}"
                         f"{c['delta_ms_per_step']:>+10.3f}  {_ci(c['ci95']):<20} {note}")
            kl = _kernel_line(c)
            if kl:
                lines.append(f"      {kl}")
        lines.append(f"  components sum to the step delta within {abs(d['closure_ms']):.2e} ms")
        if d.get("layers"):
            lines.append(f"  {'layer':<28}{'A':>9}{'B':>9}{'delta':>10}  ops/step A -> B")
            for r in d["layers"]:
                lines.append(f"  {layer_name(r['layer']):<28}{r['a_ms_per_step']:>9.3f}{r['b_ms_per_step']:>9.3f}"
                             f"{r['delta_ms_per_step']:>+10.3f}  {r['a_count_per_step']:.1f} -> "
                             f"{r['b_count_per_step']:.1f}")
    lines.append("")
    if diff.get("summary"):
        lines.append(f"summary: {diff['summary']}")
    lines.append(f"verdict: {verdict_line(diff)}")
    return "\n".join(lines)


def render_markdown(diff: dict, a_label: str = "A", b_label: str = "B") -> str:
    diff = clean_tree(diff)
    out = []
    for w in diff.get("warnings", []):
        out.append(f"> **Warning:** {md_escape(w)}")
        out.append("")
    changed, confounds = describe(diff.get("confounds") or [], "intended"), describe(diff.get("confounds") or [],
                                                                                      "confound")
    if changed:
        out += [f"Changed between the runs: {md_escape(changed)}.", ""]
    if confounds:
        out += [f"> **Also differs** (not what the comparison changes; part of the step difference may come from "
                f"it): {md_escape(confounds)}.", ""]
    if levels_line(diff):
        out += [f"Levels: {md_escape(levels_line(diff))}.", ""]
    for d in diff["devices"]:
        s = d["step_ms"]
        out.append(f"**GPU {md_escape(d['device'])}**: {s['a']:.3f} → {s['b']:.3f} ms/step "
                   f"(**{s['delta']:+.3f} ms**, 95% CI {_ci(s['ci95'])}); kernels/step "
                   f"{d['kernels_per_step']['a']:.1f} → {d['kernels_per_step']['b']:.1f}")
        out.append("")
        out.append(f"| component | {md_name(a_label)} ms | {md_name(b_label)} ms | Δ ms | 95% CI | "
                   "families added / removed | from count | from duration | contention | kernels (only A → only B) |")
        out.append("|---|---:|---:|---:|---|---:|---:|---:|---:|---|")
        for c in d["components"]:
            if abs(c["delta_ms_per_step"]) < 5e-5 and abs(c["a_ms_per_step"]) < 5e-5:
                continue
            ci = _ci(c["ci95"]) + (f" ({quiet_note(c, d)})" if c["noise"] else "")
            fc = f"{c['from_count_ms']:+.3f}" if "from_count_ms" in c else ""
            fd = f"{c['from_duration_ms']:+.3f}" if "from_duration_ms" in c else ""
            ar = (f"{c['added_ms']:+.3f} / {c['removed_ms']:+.3f}" if "added_ms" in c else "")
            ct = f"{c['contention_ms_per_step']:+.3f}" if "contention_ms_per_step" in c else ""
            out.append(f"| {md_escape(c['component'])} | {c['a_ms_per_step']:.3f} | {c['b_ms_per_step']:.3f} | "
                       f"{c['delta_ms_per_step']:+.3f} | {ci} | {ar} | {fc} | {fd} | {ct} | "
                       f"{md_escape(_kernel_line(c, 48))} |")
        out.append("")
        if d.get("layers"):
            out.append(f"| layer | {md_name(a_label)} ms | {md_name(b_label)} ms | Δ ms | ops/step |")
            out.append("|---|---:|---:|---:|---|")
            for r in d["layers"]:
                out.append(f"| {md_escape(layer_name(r['layer']))} | {r['a_ms_per_step']:.3f} | "
                           f"{r['b_ms_per_step']:.3f} | {r['delta_ms_per_step']:+.3f} | "
                           f"{r['a_count_per_step']:.1f} → {r['b_count_per_step']:.1f} |")
            out.append("")
    out.append(f"Verdict: **{md_escape(diff['verdict'])}**" + (f" ({md_escape(diff['verdict_reason'])})"
                                                                 if diff.get("verdict_reason") else ""))
    return "\n".join(out)
