"""The head of `profattr report`: the Summary (what dominates decode and why, in a few lines with numbers), the
ranked bottlenecks one sentence each, and the waterfall from the hardware floor to the measured step. The long
explanation of each bottleneck is `bottleneck_detail_section`, further down the report. Computes nothing beyond
ranges and maxima of the numbers it shows.
"""
from __future__ import annotations

from profattr.report.bottlenecks import ranks_diff
from profattr.report.budget_view import category_share
from profattr.text import md_escape, md_name
from profattr.report.md_table import _devices_label, _multi_device, _pct, _table

SUMMARY_CATEGORIES = 3  # the largest categories named in the Summary
LISTED_STEPS = 4  # captures named one by one in the Summary's first line; more are a range
REASON_WORDS = 36  # a ranked bottleneck's reason in the list, at most; the rest is in "Bottlenecks in detail"


def _devices(data) -> list:
    """(markdown label, capture, device budget) per capture and GPU."""
    return [(_devices_label(cap, d), cap, d) for cap in data.captures for d in cap.budget["devices"]]


def _span(values, fmt) -> str:
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def summary_lines(data) -> list:
    """3-6 bullet lines: step time, the largest categories' exclusive shares, idle, the floor and what limits it."""
    devs = [(label, cap, d) for label, cap, d in _devices(data) if d["mean_step_ms"]]
    if not devs:
        return []
    out = []
    if len(devs) <= LISTED_STEPS:
        steps = ", ".join(f"{label} {d['mean_step_ms']:.3f} ms" for label, _, d in devs)
    else:
        fast = min(devs, key=lambda x: x[2]["mean_step_ms"])
        slow = max(devs, key=lambda x: x[2]["mean_step_ms"])
        steps = (f"{fast[2]['mean_step_ms']:.3f}-{slow[2]['mean_step_ms']:.3f} ms over {len(devs)} captures "
                 f"(fastest {fast[0]}, slowest {slow[0]})")
    out.append(f"- **Decode step** (mean per step and GPU): {steps}.")
    shares: dict = {}
    for _, _, d in devs:
        for c in d["categories"]:
            shares.setdefault(c["category"], []).append(category_share(c, d))
    top = sorted(shares, key=lambda c: -max(shares[c]))[:SUMMARY_CATEGORIES]
    if top:
        over = " (range over captures)" if len(devs) > 1 else ""
        out.append("- **Largest categories**, exclusive share of the step" + over + ": "
                   + ", ".join(f"{md_name(c)} {_span(shares[c], _pct)}" for c in top) + ".")
    idle = max(devs, key=lambda x: x[2]["idle_ms_per_step"])
    idle_shares = [d["idle_ms_per_step"] / d["mean_step_ms"] for _, _, d in devs]
    modes = sorted({str(s.get("mode")) for _, cap, _ in devs for s in cap.launches or []})
    out.append(f"- **Idle** (GPU waiting inside the step): {_span(idle_shares, _pct)} of the step, most in "
               f"{idle[0]} ({idle[2]['idle_ms_per_step']:.3f} ms/step); launch mode "
               f"{md_escape(', '.join(modes) or '?')}.")
    out += _floor_lines(data)
    return out


def _gap_devices(data) -> list:
    """(markdown label, gap device) per capture and GPU with a gap."""
    out = []
    for cap in data.captures:
        for g in (cap.gap or {}).get("devices") or []:
            n = len(cap.budget["devices"])
            out.append((md_name(cap.label) if n == 1 else f"{md_name(cap.label)} / GPU {g['device']}", g))
    return out


def _floor_lines(data) -> list:
    gaps = _gap_devices(data)
    if not gaps:
        return []
    if len(gaps) <= LISTED_STEPS:
        floors = ", ".join(f"{label} {g['measured_step_ms']:.3f} ms against {g['floor_ms']:.3f} ms "
                           f"({g['efficiency_pct']:.1f}% of the limit)" for label, g in gaps)
    else:
        eff = [g["efficiency_pct"] for _, g in gaps]
        floors = (f"{len(gaps)} captures run at {min(eff):.1f}-{max(eff):.1f}% of their hardware limit "
                  f"(floors {_span([g['floor_ms'] for _, g in gaps], lambda x: f'{x:.3f}')} ms)")
    out = [f"- **Gap to the floor** (hardware limit of the model's bytes and FLOPs): {floors}."]
    label, g, row = max(((label, g, r) for label, g in gaps for r in g["categories"]),
                        key=lambda x: x[2]["above_floor_ms"] or 0.0)
    if (row["above_floor_ms"] or 0.0) > 0:
        eff = row.get("efficiency_pct")
        out.append(f"- **What limits it**: {md_name(row['category'])} spends {row['above_floor_ms']:.3f} ms/step "
                   f"above its floor in {label}" + (f", at {eff:.1f}% of its limit" if eff is not None else "")
                   + f" ({md_escape(row['bound'])}-bound); see the ranked bottlenecks.")
    return out


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
                         (f"{md_name(top['category'])} ({_pct(category_share(top, d))})"
                          if top and d['mean_step_ms'] else "")])
    out = ["## Summary", ""] + summary_lines(data) + [""]
    out += _table(["capture", "steps", "step ms (median)", "mean step ms", "busy ms", "idle ms", "idle share",
                   "kernels/step", "launch mode", "largest category"], rows)
    out += ["", "Launch mode: `graph` when most GPU ops of a step are CUDA-graph replays, `eager` when none are.", ""]
    return out


def _where(data, b) -> str:
    where = md_name(b["capture"])
    if _multi_device(data):
        where += f", GPU {md_escape(b['device'])}"
    return where


def _also(data, b) -> str:
    if not b.get("also"):
        return ""
    return "; also " + ", ".join(md_name(a["capture"]) + (f" GPU {md_escape(a['device'])}" if _multi_device(data)
                                                          else "") + f" {a['ms_per_step']:.3f} ms" for a in b["also"])


def short_reason(reason: str, words: int = REASON_WORDS) -> tuple:
    """(the reason's leading clauses within `words` words, whether anything was left out). A first clause too long
    keeps its opening and its conclusion (the parts before the first and after the last ": ") and as much of the
    middle as fits."""
    clauses = reason.split("; ")
    taken, count = [], 0
    for clause in clauses:
        n = len(clause.split())
        if taken and count + n > words:
            break
        taken.append(clause if taken else _fit(clause, words))
        count += len(taken[-1].split())
    text = "; ".join(taken)
    cut = len(taken) < len(clauses) or taken[0] != clauses[0]
    if len(text.split()) > words:
        text, cut = " ".join(text.split()[:words]) + " …", True
    return text, cut


def _fit(clause: str, words: int) -> str:
    parts = clause.split(": ")
    if len(clause.split()) <= words or len(parts) < 3:
        return clause
    kept = [parts[0]]
    for part in parts[1:-1]:
        if len(": ".join(kept + [part, parts[-1]]).split()) <= words:
            kept.append(part)
    return ": ".join(kept + [parts[-1]])


def bottleneck_section(data) -> list:
    out = ["## Bottlenecks, ranked", ""]
    if not data.bottlenecks:
        return out + ["Nothing above the thresholds (idle under 10% of the step, no category over 5%, no change "
                      "beyond noise).", ""]
    out.append("Largest first, in ms per step; one line each, from that capture's numbers (the full reasoning is "
               "under Bottlenecks in detail).")
    unranked = [e for e in data.diffs if not ranks_diff(e["diff"])]
    if unranked and len(unranked) == len(data.diffs):
        out[-1] += (" No difference between captures is ranked: none has the windows per side (3) and "
                    "like-for-like runs that establish one.")
    elif unranked:
        out[-1] += (f" {len(unranked)} of the {len(data.diffs)} comparisons establish no difference (too few "
                    "windows per side, or confounded runs) and are not ranked.")
    out.append("")
    for b in data.bottlenecks:
        of = "of the slower step" if b["kind"] == "diff" else "of the step"
        text, _ = short_reason(b["reason"])
        end = "" if text.endswith("…") else "."
        out.append(f"{b['rank']}. **{md_escape(b['title'])}** ({_where(data, b)}; {b['ms_per_step']:.3f} ms/step, "
                   f"{_pct(b['share_of_step'])} {of}): {md_escape(text)}{end}")
    return out + [""]


def bottleneck_detail_section(data) -> list:
    """Each ranked bottleneck with its whole reason and the other captures where it also ranks."""
    if not data.bottlenecks:
        return []
    out = ["## Bottlenecks in detail", ""]
    for b in data.bottlenecks:
        out.append(f"{b['rank']}. **{md_escape(b['title'])}** ({_where(data, b)}; {b['ms_per_step']:.3f} ms/step): "
                   f"{md_escape(b['reason'])}{_also(data, b)}")
    return out + [""]


def waterfall_section(data) -> list:
    """From the floor to the measured step, one column per capture (and GPU): the floor, what each category spends
    above its floor, the overlap and the idle; the full gap tables are in the details file."""
    gaps = _gap_devices(data)
    if not gaps:
        return []
    components: list = []
    for _, g in gaps:
        components += [c["component"] for c in g["components"] if c["component"] not in components]
    components.sort(key=lambda c: "(" in c)  # categories first; overlap and idle (described in words) last
    by = [{c["component"]: c["ms"] for c in g["components"]} for _, g in gaps]
    rows = [["floor"] + [f"{g['floor_ms']:.3f}" for _, g in gaps]]
    rows += [[md_name(c) if "(" not in c else md_escape(c)] + [f"{m[c]:+.3f}" if c in m else "" for m in by]
             for c in components]
    rows.append(["**measured step**"] + [f"**{g['measured_step_ms']:.3f}**" for _, g in gaps])
    out = ["## From the floor to the measured step", "",
           "The floor is the step at the hardware limit (each category's bytes over memory bandwidth or FLOPs over "
           "peak); each row adds what a category spends above its floor (op time), then the overlap between "
           "categories and the idle, down to the measured mean step. ms per step; floors, efficiencies and "
           "assumptions per capture are in the details file.", ""]
    out += _table(["component (ms/step)"] + [label for label, _ in gaps], rows)
    charts = [(cap.label, data.charts.get(f"gap:{cap.label}")) for cap in data.captures]
    out += [""] + [f"![{md_name(label)}: waterfall from the hardware floor to the measured step]({name})"
                   for label, name in charts if name]
    return out + [""]
