"""ModelSpec of the built-in decode workload, from the `workload` record (profattr.workload/1) of its run.json.

The record carries exact parameter counts from the model's own tensors: `params.by_component` holds, per component,
its stored count (`attention`, `norms`, `router`, `lm_head`, `embedding`, `experts_total`) and, where a token reads
less than all of it, its active count (`embedding_active_per_token`: one row; `experts_active_per_token`: top-k of
the experts). Counts are of the whole model; how each component splits over the TP ranks comes from the
workload's own table in specs/sharding.toml, and the per-rank sum is checked against `params.per_rank_active`.
Also read: `config` (sizes), `tp`, `batch`, `dtype_bytes`, `context_len`, `kv_cache_bytes_per_token` (whole
model) and `kv_cache_bytes_read_per_step`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from profattr.errors import ProfattrError
from profattr.limits.model import ModelSpec, WeightGroup, load_toml, weight_category
from profattr.run_record import RunRecord

_DTYPE_NAMES = {2: "bf16", 1: "fp8", 4: "fp32"}
_CONFIG_KEYS = {"hidden": ("hidden_size", "hidden"), "layers": ("num_layers", "num_hidden_layers"),
                "vocab": ("vocab_size",), "heads": ("num_heads", "num_attention_heads"), "head_dim": ("head_dim",)}
_ACTIVE_SUFFIX, _TOTAL_SUFFIX = "_active_per_token", "_total"
DEFAULT_ENGINE = "moe_decode"


def served_defaults(run: RunRecord) -> Dict[str, Any]:
    """tp and context length a served-model capture recorded (SGLang target), for `--model` runs.

    The context is the prompt plus half the generated tokens: the mean KV length over the decoded tokens."""
    out: Dict[str, Any] = {}
    if run.tp is not None:
        out["tp"] = run.tp
    if run.input_len is not None and run.max_new_tokens is not None:
        out["context_len"] = run.input_len + run.max_new_tokens // 2
    if run.batch is not None:
        out["batch"] = run.batch
    return out


def load_run_json(path: Path) -> RunRecord:
    """The RunRecord of the run.json at `path` (validated)."""
    from profattr import inputs

    if not os.path.lexists(path):
        raise ProfattrError(f"{path}: no such file; pass --run-json or --model")
    from profattr import run_record

    inputs.regular_file(path, run_record.WHAT)
    return run_record.load(path)


def _config_value(config: Dict[str, Any], key: str) -> Optional[int]:
    for name in _CONFIG_KEYS[key]:
        if isinstance(config.get(name), (int, float)):
            return int(config[name])
    return None


def weight_class_of(component: str) -> Optional[str]:
    """Weight class of a workload component name, by the first matching pattern; None when nothing matches."""
    lowered = component.lower()
    for pattern, cls in load_toml("category_floors.toml")["workload_components"]["patterns"]:
        if pattern in lowered:
            return cls
    return None


def _components(by_component: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """{stem: {"total", "active"}} from the flat counts (`x`, `x_total`, `x_active_per_token`)."""
    stems: Dict[str, Dict[str, float]] = {}
    for key, value in by_component.items():
        if not isinstance(value, (int, float)):
            raise ProfattrError(f"params.by_component[{key!r}] is not a parameter count")
        if key.endswith(_ACTIVE_SUFFIX):
            stems.setdefault(key[: -len(_ACTIVE_SUFFIX)], {})["active"] = value
        elif key.endswith(_TOTAL_SUFFIX):
            stems.setdefault(key[: -len(_TOTAL_SUFFIX)], {})["total"] = value
        else:
            stems.setdefault(key, {})["total"] = value
    for counts in stems.values():
        counts.setdefault("active", counts.get("total", 0))  # read whole unless an active count says less
        counts.setdefault("total", counts["active"])
    return stems


def spec_from_workload(record: Dict[str, Any], *, context_len: Optional[int] = None,
                       source: str = "run.json") -> ModelSpec:
    """ModelSpec of the built-in workload from its `workload` record."""
    params = record.get("params") if isinstance(record.get("params"), dict) else {}
    missing = [k for k in ("params", "dtype_bytes", "tp") if record.get(k) is None]
    if "params" not in missing and not isinstance(params.get("by_component"), dict):
        missing.append("params.by_component")
    if missing:
        raise ProfattrError(f"{source}: workload record is missing fields: {', '.join(missing)}; "
                            "pass --model and --quant instead")
    config = record.get("config") or {}
    tp, batch = int(record["tp"]), int(record.get("batch") or 1)
    dtype_bytes = float(record["dtype_bytes"])
    dtype = _DTYPE_NAMES.get(int(dtype_bytes), f"{dtype_bytes:g}-byte")
    engine = str(record.get("workload") or DEFAULT_ENGINE)
    sharding_tables = load_toml("sharding.toml")
    rules = sharding_tables.get(engine, sharding_tables[DEFAULT_ENGINE])["components"]
    notes: List[str] = []
    groups, unknown = [], []
    for stem, counts in _components(params["by_component"]).items():
        cls = weight_class_of(stem)
        if cls is None:
            unknown.append(stem)
            continue
        sharding = rules[cls]["sharding"]
        groups.append(WeightGroup(component=stem, weight_class=cls, category=weight_category(cls),
                                  params_total=int(counts["total"]), params_per_token=int(counts["active"]),
                                  dtype=dtype, bytes_per_param=dtype_bytes, sharding=sharding,
                                  rank_fraction=1.0 / tp if sharding == "sharded" else 1.0))
    if unknown:
        notes.append(f"components with no weight class, in no floor: {', '.join(sorted(unknown))}")
    per_rank = sum(g.params_per_token * g.rank_fraction for g in groups)
    recorded = params.get("per_rank_active")
    if isinstance(recorded, (int, float)) and abs(per_rank - recorded) > 1e-6 * max(recorded, 1):
        notes.append(f"per-rank active parameters from by_component ({per_rank:.0f}) differ from "
                     f"params.per_rank_active ({recorded})")
    if record.get("moe_reads_all_experts"):
        notes.append(f"the {record.get('moe_impl')} MoE implementation reads every expert's weights; "
                     "the floor counts only the top-k experts a token needs")
    if batch > 1:
        notes.append(f"batch {batch}: weights counted once per step (all sequences routed to the same experts: "
                     "a lower bound); FLOPs and KV traffic scale with the batch")
    ctx = int(context_len if context_len is not None else record.get("context_len") or 0)
    kv_rank = float(record.get("kv_cache_bytes_per_token") or 0) / tp  # KV heads split over the ranks
    if context_len is None and record.get("kv_cache_bytes_read_per_step") is not None:
        kv_read = float(record["kv_cache_bytes_read_per_step"]) / tp
    else:
        kv_read = kv_rank * ctx * batch
    hidden = _config_value(config, "hidden") or 0
    layers = _config_value(config, "layers") or 0
    heads = _config_value(config, "heads") or 0
    head_dim = _config_value(config, "head_dim") or (hidden // heads if heads else 0)
    vocab = _config_value(config, "vocab") or 0
    name = f"{engine} ({record.get('moe_impl', '?')} MoE, {record.get('mode', '?')} mode)"
    return ModelSpec(
        id=engine, name=name, source=source, quant=dtype, tp=tp, context_len=ctx, num_layers=layers,
        hidden_size=hidden, vocab_size=vocab, groups=tuple(groups), kv_cache_bytes_per_token=kv_rank,
        kv_cache_read_bytes=kv_read, indexer_keys_read_bytes=0.0,
        attention_flops=4.0 * head_dim * heads / tp * layers * ctx * batch,  # QK^T and PV per head
        logits_bytes=dtype_bytes * vocab,  # logits in the model dtype
        allreduce_per_step=2 * layers if tp > 1 else 0,  # after o_proj and after the MoE block
        allreduce_message_bytes=hidden * int(dtype_bytes), batch=batch, notes=tuple(notes))
