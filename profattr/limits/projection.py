"""One capture's decode step projected to another GPU, TP size or layer count (`profattr project`, `report --to`):
the capture's budget and host cycle (read here, or given by a caller that read them), the model from its run.json,
both GPUs' specs, handed to limits/project.py's model."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from profattr.errors import ProfattrError
from profattr.limits.project import INTERCONNECTS


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
                    allreduce="oneshot", run_json=None, steps="auto", replicates=(), measured=None) -> dict:
    """`profattr.project/1` of one capture (and the band over replicate captures). `measured`: (budget dict, host
    cycle) of `capture` already read by the caller (a report's own budget of it): the capture is not opened again."""
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
        if measured is not None and path == capture:
            budget, measured_host = measured
        else:
            with open_trace(Path(resolve_capture(path))) as trace:  # opened once: the budget, its GPUs, the host
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
