"""The report's diff section: each capture against its baseline, with sentences chosen by comparing the numbers."""
from __future__ import annotations

from profattr.report import diff_view
from profattr.report.bottlenecks import kernel_idle_sentence, split_delta
from profattr.text import md_escape, md_name
from profattr.report.md_table import _short


def diff_section(data) -> list:
    if not data.diffs:
        return []
    bases = list(dict.fromkeys(e["a"] for e in data.diffs))
    title = f"## Differences against {md_name(bases[0])}" if len(bases) == 1 else "## Differences"
    out = [title, "",
           *([f"Each capture is compared with the first capture of its batch size ({', '.join(map(md_name, bases))})."
              , ""] if len(bases) > 1 else []),
           "Each component is B minus A in ms per step; the components add up to the change of the median step. "
           "Intervals are 95% bootstrap intervals over servers, windows and steps, as many of each as a side has; "
           "a component whose interval holds 0 is noise. Over fewer than 3 windows per side an interval holds the "
           "steps' variation, not the windows', so such a comparison establishes no difference.", ""]
    for entry in data.diffs:
        a, b, diff = entry["a"], entry["b"], entry["diff"]
        out.append(f"### {md_name(b)} vs {md_name(a)}")
        out.append("")
        out += [f"- {line}" for line in diff_explanation(diff, a, b, entry.get("a_modes"), entry.get("b_modes"))]
        ua, ub = entry.get("a_unprofiled_ms_per_token"), entry.get("b_unprofiled_ms_per_token")
        if ua and ub:
            out.append(f"- Without the profiler (run.json timing), {md_name(a)} decodes at {ua:.3f} ms/token and "
                       f"{md_name(b)} at {ub:.3f} ({ub - ua:+.3f} ms, {100.0 * (ub - ua) / ua:+.1f}%): the "
                       "profiled difference above is measured under nsys, whose overhead can differ between the two.")
        out.append("")
        out.append(diff_view.render_markdown(diff, a_label=a, b_label=b))
        out.append("")
    return out


def diff_explanation(diff: dict, a: str, b: str, a_modes: dict | None = None, b_modes: dict | None = None) -> list:
    """Short, escaped sentences that follow the diff's numbers: size and significance of the change, kernel vs idle
    time, the largest components, and a plain statement when the comparison's premise is wrong."""
    A, B = md_name(a), md_name(b)
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
            lines.append(f"{gpu}{B} is {direction} than {A} by {abs(s['delta']):.3f} ms/step{rel}{sig}"
                         f"{limitation(diff)}.")
        parts = split_delta(d)
        wait = (f", waiting inside collectives {parts['comm_wait']:+.3f} ms"
                if any(c["component"] == "comm_wait" for c in d["components"]) else "")
        kernel = ("categories minus overlap" if any(c["component"] == "overlap" for c in d["components"])
                  else "categories' exclusive time")
        lines.append(f"{gpu}Kernel time ({kernel}) {parts['kernel']:+.3f} ms{wait}, idle "
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


def limitation(diff: dict) -> str:
    """The one clause that says why a measured difference is not an established one ('' when it is, or for a diff
    without a verdict)."""
    verdict, v = diff.get("verdict"), diff.get("validity") or {}
    if verdict == "within noise" and v.get("too_few_windows"):
        w = [(diff.get(k) or {}).get("levels", {}).get("windows") for k in ("a", "b")]
        return (f", yet **within noise**: {w[0]} and {w[1]} window(s) per side, too few for the interval to cover "
                "window-to-window variance, so no difference is established")
    if verdict == "not comparable":
        return f", yet **not comparable**: {md_escape('; '.join(v.get('reasons') or []))}"
    return ""


def _names(names: list) -> str:
    if not names:
        return "none"
    return ", ".join(md_escape(_short(x, 50)) for x in names[:2]) + (f" (+{len(names) - 2})" if len(names) > 2 else "")


def _component_detail(c: dict, A: str, B: str) -> str:
    """Count vs duration part of a category change, and the kernels found on one side only (A, B: escaped)."""
    count, dur = c.get("from_count_ms", 0.0), c.get("from_duration_ms", 0.0)
    added, removed = c.get("added_ms", 0.0) or 0.0, c.get("removed_ms", 0.0) or 0.0
    n = c.get("count_delta_per_step", 0.0)
    if abs(added) + abs(removed) > abs(count) + abs(dur):  # kernel families on one side only carry the change
        text = f"mostly from kernels on one side only (added {added:+.3f} ms, removed {removed:+.3f} ms)"
    elif abs(count) >= abs(dur):
        text = f"mostly from the kernel count ({n:+.1f} kernels/step: {count:+.3f} ms)"
    else:
        text = f"mostly from {'longer' if dur > 0 else 'shorter'} kernels ({dur:+.3f} ms; count {n:+.1f}/step)"
    kernels = c.get("kernels") or {}
    only_a = [k["name"] for k in kernels.get("only_a", [])]
    only_b = [k["name"] for k in kernels.get("only_b", [])]
    if only_a or only_b:
        text += f"; kernels only in {A}: {_names(only_a)}; only in {B}: {_names(only_b)}"
    contention = c.get("contention_ms_per_step") or 0.0
    if abs(contention) >= 5e-4:
        text += (f"; besides, its overlapped time (run alongside other categories) changed by {contention:+.3f} ms: "
                 f"contention, which the step does not pay (its op time changed "
                 f"{c.get('op_delta_ms_per_step', 0.0):+.3f} ms)")
    return text + "."
