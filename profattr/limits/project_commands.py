"""Click command `profattr project`: a capture's decode step projected to another GPU, TP size or layer count."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from profattr.errors import ProfattrError
from profattr.limits.project import INTERCONNECTS
from profattr.outputs import check_output, emit, output_options
from profattr.text import clean_tree


def _specs(capture: Path, run_json: Optional[Path], tp: Optional[int], layers: Optional[int],
           batch: Optional[int] = None, dsa_runs: bool = True):
    """(source spec, target spec) from the capture's run.json model_config."""
    from profattr.limits.model import spec_from_config
    from profattr.limits.served import spec_from_run
    from profattr.limits.workload import load_run_json
    from profattr.trace.reader import run_json_path

    path = Path(run_json) if run_json else run_json_path(capture)
    if not path.exists():
        raise ProfattrError(f"no model for {capture.name}: {path.name} not found; pass --run-json with the run.json "
                            "that records the model's config.json (model_config)")
    run = load_run_json(path)
    if not run.model_config:
        raise ProfattrError(f"{path.name} records no model_config (the model's config.json), which a projection "
                            "needs; pass --run-json with a run.json that has it (profattr capture records it)")
    source = spec_from_run(run, source=path.name, tp=None, context_len=None, kv_dtype=None, dsa_runs=True)
    config = dict(source.config or {})
    target_tp = tp or source.tp
    if layers is not None:
        config["num_hidden_layers"] = layers
    for key in ("moe_intermediate_size", "intermediate_size"):
        size = config.get(key)
        if isinstance(size, int) and target_tp > source.tp and size % (target_tp // source.tp or 1):
            raise ProfattrError(f"--tp {target_tp} does not divide {key} {size} of the model; use a tp that divides "
                                "the heads and the experts' intermediate size")
    if target_tp % source.tp:
        raise ProfattrError(f"--tp {target_tp} is not a multiple of the capture's tp {source.tp}")
    changes = {"tp": target_tp, "dsa_runs": dsa_runs and source.dsa_runs, **({"batch": batch} if batch else {})}
    target = spec_from_config(config, **{**(source.derive_args or {}), **changes})
    return source, target


def _dummy_routing(capture: Path, run_json: Optional[Path], source) -> Optional[int]:
    """top_k when the server ran dummy weights (--load-format dummy routes every sequence to the same experts)."""
    from profattr.limits.workload import load_run_json
    from profattr.trace.reader import run_json_path

    path = Path(run_json) if run_json else run_json_path(capture)
    args = load_run_json(path).logged_server_args if path.exists() else {}
    top_k = (source.config or {}).get("num_experts_per_tok")
    return int(top_k) if args.get("load_format") == "dummy" and top_k else None


def project_capture(capture: Path, to: str, *, tp=None, layers=None, batch=None, interconnect="auto", host="measured",
                    allreduce="oneshot", run_json=None, steps="auto", replicates=()) -> dict:
    """`profattr.project/1` of one capture (and the band over replicate captures)."""
    from profattr.attribute.budget import compute_budget
    from profattr.attribute.host_cycle import host_cycle
    from profattr.limits.gap import budget_gpus
    from profattr.limits.hardware import hardware_presets, load_hardware, match_hardware
    from profattr.limits.project import project_budget
    from profattr.trace.reader import resolve_capture
    from profattr.trace.source import open_trace

    dst_hw = load_hardware(to)
    if interconnect == "auto":
        link = dst_hw.interconnect
    else:
        link = INTERCONNECTS[interconnect]
        if link is not None and link != dst_hw.interconnect:
            raise ProfattrError(f"--interconnect {interconnect}: {dst_hw.id}'s GPUs link over {dst_hw.interconnect}, "
                                "and its all-reduce latencies are measured there; pass --interconnect "
                                f"{'nvlink' if dst_hw.interconnect == 'nvlink' else 'pcie5'} or none")
    results = []
    for path in [capture, *replicates]:
        sqlite_path = Path(resolve_capture(path))
        with open_trace(sqlite_path) as trace:  # opened once: the budget, its GPUs and the host cycle
            budget = compute_budget(trace, steps=steps).to_dict()
            measured_host = host_cycle(trace)
        names = {str(g.get("name") or "") for g in budget_gpus(budget).values()}
        matched = {match_hardware(n) for n in names if n}
        if len(matched) != 1 or None in matched:
            raise ProfattrError(f"cannot tell the capture's GPU ({', '.join(sorted(names)) or 'none'}); known: "
                                f"{', '.join(hardware_presets())}")
        src_hw = load_hardware(matched.pop())
        source, target = _specs(path, run_json if path == capture else None, tp, layers, batch, dst_hw.dsa_runs)
        results.append(project_budget(budget, source, target, src_hw, dst_hw, measured_host,
                                      interconnect=link, allreduce=allreduce, host_mode=host,
                                      experts_touched=_dummy_routing(path, run_json if path == capture else None,
                                                                     source)))
    head = results[0]
    if len(results) > 1:
        values = [r["predicted_ms_per_step"] for r in results]
        head["band"] = {"min_ms": min(values), "max_ms": max(values), "replicates": len(values),
                        "captures": [str(p) for p in [capture, *replicates]]}
    return head


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
