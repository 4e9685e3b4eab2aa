"""The report's "On the target" section: a `profattr.project/1` result (limits/project.py) as markdown."""
from __future__ import annotations

from profattr.text import md_escape, md_name


def section(result) -> list:
    """Markdown lines of the section; none without a projection."""
    if not result:
        return []
    t = result["target"]
    out = ["## On the target", "",
           f"{md_escape(str(result['capture']['path']))} projected to **{md_escape(t['name'])}**, tp "
           f"{t['model']['tp']}, {t['layers']} layers, interconnect {md_escape(str(t['interconnect']))}, host "
           f"{md_escape(t['host'])}: **{result['predicted_ms_per_step']:.3f} ms per decode step** (GPU "
           f"{result['gpu_ms']:.3f} + collectives {result['collectives']['ms']:.3f} + host {result['host']['ms']:.3f};"
           f" the target's bytes floor {result['floor_ms']:.3f}). Measured on the source: "
           f"{result['capture']['measured_step_ms']:.3f} ms.", "",
           "| category | source ms | target ms | launches on the target | at the latency floor |",
           "|---|---:|---:|---:|---:|"]
    for c in result["categories"][:10]:
        out.append(f"| {md_name(c['category'])} | {c['source_ms']:.4f} | {c['projected_ms']:.4f} | "
                   f"{c['launches_target']:.0f} | {c['at_latency_floor']:.0f} |")
    out += ["", "Assumptions:", ""] + [f"- {md_escape(a)}" for a in result["assumptions"]] + [""]
    return out
