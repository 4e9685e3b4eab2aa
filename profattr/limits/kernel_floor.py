"""The weight bytes a drilled kernel's category must read per decode step: the floor that `profattr drill-report`
and the report's "Why the top kernels are slow" set each category's DRAM traffic against.

Assumption, stated with every figure: a weights-streaming GEMM at decode reads each of its weights once per step, so
its category's floor bytes are the weights of that category one rank reads per step, as the engine shards them
(weight class -> category: specs/category_floors.toml; a category rolls up to its floor row as in gap.py). A
category with a precision suffix (`gemm.fp8`, `gemm.bf16`) counts only the weights stored in that precision, since
each precision runs its own kernels. The model comes from the config.json (and its quantization_config) that
`profattr capture` recorded in the drill's run.json; the GPU from the GPU name recorded there.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from profattr.errors import ProfattrError
from profattr.limits.gap import precision_suffix, row_of
from profattr.limits.model import ModelSpec, load_toml
from profattr.run_record import RunRecord, or_empty

ASSUMPTION = ("a weights-streaming GEMM at decode reads each weight once per step: its category's floor bytes are "
              "the weights of that category one rank reads per step (routed experts: the experts one token "
              "activates)")


def spec_for_run(run: Optional[RunRecord]) -> Tuple[Optional[ModelSpec], str]:
    """(ModelSpec of the model a run.json recorded, or None; how it was made or why not): the built-in workload's
    record, else the served model's config.json (limits/served.py)."""
    run = or_empty(run)
    if run.has("workload"):
        from profattr.limits.workload import spec_from_workload

        try:
            spec = spec_from_workload(run.workload, source="run.json workload")
        except ProfattrError as exc:
            return None, exc.format_message()
        return spec, f"the built-in workload's recorded sizes, tp {spec.tp}"
    from profattr.limits.served import spec_from_run

    try:
        spec = spec_from_run(run, source="run.json", tp=None, context_len=None, kv_dtype=None, dsa_runs=True)
    except ProfattrError as exc:
        return None, exc.format_message()
    return spec, f"{spec.name} from run.json model_config, {spec.quant}, tp {spec.tp}"


def weight_bytes(spec: ModelSpec) -> Dict[str, Dict[str, float]]:
    """floor row -> {precision: weight bytes one rank reads per step} for every weight group of the model."""
    rows: Dict[str, Dict[str, float]] = {}
    for g in spec.groups:
        by_dtype = rows.setdefault(g.category, {})
        by_dtype[g.dtype] = by_dtype.get(g.dtype, 0.0) + g.rank_bytes_per_token(spec.tp, ideal=False)
    return rows


def category_floor(category: str, rows: Dict[str, Dict[str, float]]) -> Optional[Dict[str, Any]]:
    """{bytes_per_step, row, precision, assumption} of a budget category, or None when no weights roll up to it."""
    row = row_of(category, rows)
    if row not in rows:
        return None
    by_suffix = {precision_suffix(d): d for d in load_toml("quant.toml")["dtypes"]}
    suffix = category.rsplit(".", 1)[-1] if "." in category else None
    precision = by_suffix.get(suffix) if suffix else None
    by_dtype = rows[row]
    total = by_dtype.get(precision, 0.0) if precision else sum(by_dtype.values())
    if total <= 0:
        return None
    what = f"the {precision} weights of {row}" if precision else f"the weights of {row}"
    return {"bytes_per_step": total, "row": row, "precision": precision,
            "assumption": f"{what} ({total / 1e6:.1f} MB per step), read once per step"}


LOGITS_SHAPE_RULE = ("the logits projection (lm_head) is the GEMM launch shape run exactly once per step with the "
                     "longest mean duration of all GEMM shapes (SGLang runs it once per decode step, after the last "
                     "layer, over the whole vocabulary)")


def logits_shape(device: dict) -> Optional[Dict[str, Any]]:
    """The budget device's shape row that is the logits projection (LOGITS_SHAPE_RULE), with its kernel's name and
    the name's other shapes; None when no GEMM shape runs once per step."""
    best = None
    for k in device.get("kernels") or []:
        if not str(k.get("category", "")).startswith("gemm"):
            continue
        for s in k.get("shapes") or []:
            once = abs(s["count_per_step"] - 1.0) < 1e-9
            if once and s.get("shape") and (best is None or s["mean_us"] > best[1]["mean_us"]):
                best = (k, s)
    if best is None:
        return None
    k, s = best
    others = [o for o in k["shapes"] if o is not s]
    longest_other = max((o["mean_us"] for k2 in device["kernels"] if str(k2["category"]).startswith("gemm")
                         for o in k2.get("shapes") or [] if o is not s), default=0.0)
    if longest_other >= s["mean_us"]:
        return None  # a GEMM run more often takes as long: nothing sets the logits projection apart
    return {"name": k["name"], "category": k["category"], "label": s["label"], "shape": s["shape"],
            "ms_per_step": s["ms_per_step"], "mean_us": s["mean_us"], "other_shapes": len(others),
            "other_shapes_count_per_step": sum(o["count_per_step"] for o in others),
            "other_shapes_mean_us": (1e3 * sum(o["ms_per_step"] for o in others)
                                     / sum(o["count_per_step"] for o in others)) if others else None,
            "name_mean_us": k.get("mean_us")}


def lm_head_rows(budget: dict, spec: ModelSpec, bandwidth_bytes_per_s: float) -> Dict[int, Dict[str, Any]]:
    """device -> the logits projection's own efficiency: its weight bytes per step (the model's lm_head, one rank's
    share) at the GPU's DRAM bandwidth against its measured time. Devices whose logits shape is not found, or whose
    measured time is under that floor (then it is not the lm_head), get none."""
    nbytes = sum(g.rank_bytes_per_token(spec.tp, ideal=False) for g in spec.groups if g.weight_class == "lm_head")
    out: Dict[int, Dict[str, Any]] = {}
    if nbytes <= 0 or bandwidth_bytes_per_s <= 0:
        return out
    floor_ms = nbytes / bandwidth_bytes_per_s * 1e3
    for d in budget.get("devices") or []:
        row = logits_shape(d)
        if row is None or row["ms_per_step"] < floor_ms:
            continue
        out[d["device"]] = {**row, "weight_bytes": nbytes, "floor_ms": floor_ms,
                            "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
                            "achieved_bytes_per_s": nbytes / (row["ms_per_step"] * 1e-3),
                            "efficiency_pct": 100.0 * floor_ms / row["ms_per_step"], "rule": LOGITS_SHAPE_RULE}
    return out
