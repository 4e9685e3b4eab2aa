"""Click command `profattr project`: a capture's decode step projected to another GPU, TP size or layer count."""
from __future__ import annotations

import json
from pathlib import Path

import click

from profattr.limits.project import INTERCONNECTS
from profattr.limits.projection import project_capture
from profattr.outputs import check_output, emit, output_options
from profattr.text import clean_tree


def render_project_table(result: dict) -> str:
    t = result["target"]
    lines = [f"{result['capture']['path']} -> {t['name']}: tp {t['model']['tp']}, {t['layers']} layers, "
             f"interconnect {t['interconnect']}, host {t['host']}",
             f"predicted {result['predicted_ms_per_step']:.3f} ms per step (GPU {result['gpu_ms']:.3f} + collectives "
             f"{result['collectives']['ms']:.3f} + host {result['host']['ms']:.3f}); measured on the source "
             f"{result['capture']['measured_step_ms']:.3f} ms"]
    if result.get("band"):
        b = result["band"]
        lines.append(f"band over {b['replicates']} replicate captures: {b['min_ms']:.3f} - {b['max_ms']:.3f} ms")
    lines.append("")
    lines.append(f"{'category':<22}{'source ms':>11}{'target ms':>11}{'launches':>10}{'at floor':>10}")
    for c in result["categories"]:
        lines.append(f"{c['category']:<22}{c['source_ms']:>11.4f}{c['projected_ms']:>11.4f}"
                     f"{c['launches_target']:>10.0f}{c['at_latency_floor']:>10.0f}")
    lines.append("")
    lines.append("waterfall from the target's floor:")
    for w in result["waterfall"]:
        lines.append(f"  {w['component']:<44}{w['ms']:>+10.4f}")
    lines.append("")
    lines.append("assumptions:")
    lines += [f"  - {a}" for a in result["assumptions"]]
    return "\n".join(lines)


def render_project_markdown(result: dict) -> str:
    t = result["target"]
    out = [f"Predicted **{result['predicted_ms_per_step']:.3f} ms per decode step** on {t['name']} (tp "
           f"{t['model']['tp']}, {t['layers']} layers, interconnect {t['interconnect']}, host {t['host']}).", "",
           "| category | source ms | target ms |", "|---|---:|---:|"]
    out += [f"| {c['category']} | {c['source_ms']:.4f} | {c['projected_ms']:.4f} |" for c in result["categories"]]
    out += ["", "Assumptions:", ""] + [f"- {a}" for a in result["assumptions"]]
    return "\n".join(out)


@click.command("project")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--to", "to", required=True, help="Target GPU preset (e.g. rtx-pro-6000-ws, h200, b200, h100).")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Tensor-parallel size on the target (default: the capture's).")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Layers of the real model (default: the capture's; GLM-5 has 78).")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Sequences per decode step on the target (default: the capture's).")
@click.option("--interconnect", type=click.Choice(["auto", *sorted(INTERCONNECTS)]), default="auto", show_default=True,
              help="Link the all-reduces run over (auto: the target's own, pcie5 for the RTX cards, nvlink for "
                   "H100/H200/B200); none leaves collectives out.")
@click.option("--allreduce", type=click.Choice(["oneshot", "nccl"]), default="oneshot", show_default=True,
              help="All-reduce implementation (measured latencies in the target's preset).")
@click.option("--host", type=click.Choice(["measured", "none"]), default="measured", show_default=True,
              help="Carry the source's host time over as measured, or drop it.")
@click.option("--replicate", "replicates", multiple=True, type=click.Path(path_type=Path),
              help="Replicate captures of the same config: the band of their projections.")
@click.option("--run-json", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Run metadata with the model's config.json (default: NAME.run.json beside the capture).")
@click.option("--steps", default="auto", show_default=True, help="Step definition passed to the budget.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@output_options()
def project(capture, to, tp, layers, batch, interconnect, allreduce, host, replicates, run_json, steps, fmt, output, force):
    """Predict CAPTURE's ms per decode step on another GPU (--to), TP size and layer count, as a waterfall from
    the target's floor: kernel time from bytes, the source's efficiency and latency floors; collectives from
    measured all-reduce latencies; host time as measured."""
    given = [capture, run_json, *replicates]
    if output:
        check_output(output, force, given)
    result = project_capture(capture, to, tp=tp, layers=layers, batch=batch, interconnect=interconnect, host=host,
                             allreduce=allreduce, run_json=run_json, steps=steps, replicates=replicates)
    result = clean_tree(result)
    if fmt == "json":
        text = json.dumps(result, indent=2)
    elif fmt == "markdown":
        text = render_project_markdown(result)
    else:
        text = render_project_table(result)
    emit(text.rstrip("\n"), output, force, given)
