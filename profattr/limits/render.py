"""Text renderings of `profattr.limit/1` and `profattr.gap/1`: plain tables for a terminal, markdown for reports.

Strings that come from a capture (device names, category ids, component names, paths) are escaped.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from profattr.text import md_escape, md_name


def _fmt_ms(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.3f}"


def _fmt_pct(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}%"


def _is_number(cell) -> bool:
    try:
        float(str(cell).rstrip("%") or "0")
        return True
    except ValueError:
        return False


def _table(headers: Sequence[str], rows: List[Sequence[str]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in rows) for i in range(len(headers))]
    line = lambda cells: "  ".join(str(c).rjust(w) if numeric[i] else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join(s.rstrip() for s in [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def render_limit_table(limit: Dict[str, Any]) -> str:
    """The limit JSON as text: both floors' terms, their assumptions and the sensitivity table."""
    from profattr.text import clean_tree

    limit = clean_tree(limit)
    model, hw = limit["model"], limit["hardware"]
    out = [f"{model['name']} on {hw['name']}, tp {model['tp']}, context {model['context_len']} tokens"]
    if model.get("quantization"):
        out.append(f"quantization: {model['quantization']}")
    for floor, label in (("weights_only", "Weights-only floor"), ("realistic", "Realistic floor")):
        total = limit[f"{floor}_ms"]
        out.append("")
        out.append(f"{label}: {total:.3f} ms/token ({1e3 / total:.0f} tokens/s)")
        terms = [t for t in limit["terms"] if t["floor"] == floor]
        out.append(_table(["term", "ms", "detail"], [[t["term"], _fmt_ms(t["ms"]), t["detail"]] for t in terms]))
        out.append("assumptions:")
        out += [f"  - {a['id']}: {a['text']} [{a['source']}]" for a in limit["assumptions"] if a["floor"] == floor]
    out.append("")
    out.append("Sensitivity (one assumption changed at a time)")
    out.append(_table(["floor", "change", "ms", "delta ms"],
                      [[s["floor"], s["change"], _fmt_ms(s["ms"]), f"{s['delta_ms']:+.3f}"]
                       for s in limit["sensitivity"]]))
    return "\n".join(out)


def render_gap_table(gap: Dict[str, Any]) -> str:
    """The gap JSON as text, one block per device."""
    from profattr.text import clean_tree

    gap = clean_tree(gap)
    out = []
    if (gap.get("model") or {}).get("quantization"):
        out += [f"quantization: {gap['model']['quantization']}", ""]
    for dev in gap["devices"]:
        out.append(f"device {dev['device']}: measured {dev['measured_step_ms']:.3f} ms/step, floor "
                   f"{dev['floor_ms']:.3f} ms ({_fmt_pct(dev['efficiency_pct'])} of measured)")
        out.append(_table(["category", "measured ms", "floor ms", "efficiency", "above floor ms", "bound"],
                          [[r["category"], _fmt_ms(r["measured_ms"]), _fmt_ms(r["floor_ms"]),
                            _fmt_pct(r["efficiency_pct"]), _fmt_ms(r["above_floor_ms"]), r["bound"]]
                           for r in dev["categories"]]))
        out.append("waterfall (floor -> measured):")
        out.append(_table(["component", "ms", "running ms"], _waterfall_rows(dev, _fmt_ms)))
        out.append("")
    out.append("assumptions:")
    out += [f"  - {a}" for a in gap["assumptions"]]
    return "\n".join(out)


def _waterfall_rows(dev: Dict[str, Any], fmt, escape=str) -> List[List[str]]:
    running = dev["floor_ms"]
    rows = [["floor", fmt(dev["floor_ms"]), fmt(running)]]
    for comp in dev["components"]:
        running += comp["ms"]
        rows.append([escape(comp["component"]), f"{comp['ms']:+.3f}", fmt(running)])
    rows.append(["measured step", fmt(dev["measured_step_ms"]), fmt(dev["measured_step_ms"])])
    return rows


def _md_table(headers: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def render_gap_markdown(gap: Dict[str, Any]) -> str:
    """A markdown section for `profattr report`: per device, the category table and the waterfall."""
    model, hw = gap["model"], gap["hardware"]
    out = ["## Gap to the hardware limit", "",
           f"Model {md_escape(model['name'])} ({md_escape(model['quant'])}, tp {model['tp']}, context "
           f"{model['context_len']} tokens) on {md_escape(hw['name'])}."]
    if model.get("quantization"):
        out += ["", f"Weights priced by {md_escape(model['quantization'])}."]
    for dev in gap["devices"]:
        out += ["", f"### Device {md_escape(dev['device'])}", "",
                f"Measured {dev['measured_step_ms']:.3f} ms/step against a floor of {dev['floor_ms']:.3f} ms "
                f"({_fmt_pct(dev['efficiency_pct'])} of the hardware limit); memory bandwidth "
                f"{dev['memory_bandwidth_bytes_per_s'] / 1e12:.3f} TB/s ({md_escape(dev['bandwidth_source'])}).",
                ""]
        out += _md_table(["category", "measured ms", "floor ms", "efficiency", "above floor ms", "bound"],
                         [[md_name(r["category"]), _fmt_ms(r["measured_ms"]), _fmt_ms(r["floor_ms"]),
                           _fmt_pct(r["efficiency_pct"]), _fmt_ms(r["above_floor_ms"]), md_escape(r["bound"])]
                          for r in dev["categories"]])
        out += ["", "Waterfall from floor to measured:", ""]
        out += _md_table(["component", "ms", "running ms"], _waterfall_rows(dev, _fmt_ms, md_escape))
    out += ["", "Assumptions:", ""] + [f"- {md_escape(a)}" for a in gap["assumptions"]]
    return "\n".join(out) + "\n"
