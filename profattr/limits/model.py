"""Model specs: the bytes one tensor-parallel rank reads per decoded token, by weight class and category.

A ModelSpec comes from a preset (specs/models/*.toml), a Hugging Face config.json plus a quantization scheme, or
the parameter counts the built-in workload records in run.json (see workload.py). Everything downstream (floor.py,
gap.py) reads only ModelSpec.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from profattr.errors import ProfattrError
from profattr.limits import architectures
from profattr.limits.specs import load_toml, preset_ids

if TYPE_CHECKING:  # pragma: no cover
    from profattr.limits.quantization import Quantization

DEFAULT_CONTEXT_LEN = 1024
ACTIVATION_BYTES = 2  # BF16 hidden states: the all-reduce payload per element


@dataclass(frozen=True)
class WeightGroup:
    """Weights of one component, summed over layers, as one rank reads them per decoded token."""

    component: str
    weight_class: str
    category: str
    params_total: int
    params_per_token: int
    dtype: str
    bytes_per_param: float
    sharding: str  # sharded | replicated | kv_heads | one_row
    rank_fraction: float  # share of params_per_token one rank reads, as the engine shards it

    @property
    def bytes_per_token(self) -> float:
        """Bytes of this group read per token, summed over all ranks' unique weights (no replication)."""
        return self.params_per_token * self.bytes_per_param

    def rank_bytes_per_token(self, tp: int, ideal: bool) -> float:
        """Bytes one rank reads per token: evenly split over `tp` ranks if `ideal`, else as the engine shards."""
        return self.bytes_per_token / tp if ideal else self.bytes_per_token * self.rank_fraction

    def rank_flops_per_token(self) -> float:
        """FLOPs one rank spends on these weights per token: a multiply-add (2 FLOPs) per weight (batch 1)."""
        if self.sharding == "one_row":  # a lookup, not a product
            return 0.0
        return 2.0 * self.params_per_token * self.rank_fraction


@dataclass(frozen=True)
class ModelSpec:
    """What one decode step of one rank must move, with the inputs it came from."""

    id: str
    name: str
    source: str
    quant: str
    tp: int
    context_len: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    groups: Tuple[WeightGroup, ...]
    kv_cache_bytes_per_token: float  # per rank, per cached token, all layers
    kv_cache_read_bytes: float  # per rank per step at context_len (DSA reads only its top-k)
    indexer_keys_read_bytes: float  # per rank per step (DSA only)
    attention_flops: float  # per rank per step at context_len
    logits_bytes: float  # logits one sequence reads in sampling (FP32 for served models)
    allreduce_per_step: int
    allreduce_message_bytes: int
    kernels_per_step: Optional[Tuple[float, str]] = None  # (count, source)
    batch: int = 1  # sequences decoded per step: weights are read once, FLOPs and KV traffic scale with it
    dsa_runs: bool = False
    notes: Tuple[str, ...] = ()
    config: Optional[Dict[str, Any]] = field(default=None, compare=False, repr=False)
    derive_args: Optional[Dict[str, Any]] = field(default=None, compare=False, repr=False)
    quant_source: str = ""  # where the weights' formats came from, in words (config.json or a --quant preset)
    warnings: Tuple[str, ...] = ()  # said on stderr as `warning:` lines (e.g. an ignore pattern that matches nothing)

    def weight_bytes_per_rank(self, ideal: bool, exclude: Tuple[str, ...] = ()) -> float:
        """Weight bytes one rank reads per token (`exclude`: weight classes left out)."""
        return sum(g.rank_bytes_per_token(self.tp, ideal) for g in self.groups if g.weight_class not in exclude)

    def params_per_token(self) -> int:
        """Active parameters read per decoded token (whole model; the embedding counts one row)."""
        return sum(g.params_per_token for g in self.groups)

    def params_total(self) -> int:
        """Stored parameters (whole model, MTP layers excluded)."""
        return sum(g.params_total for g in self.groups)

    def describe(self) -> Dict[str, Any]:
        """JSON-ready summary of the spec."""
        return {"id": self.id, "name": self.name, "source": self.source, "quant": self.quant, "tp": self.tp,
                "context_len": self.context_len, "batch": self.batch, "params_total": self.params_total(),
                "params_per_token": self.params_per_token(), "dsa_runs": self.dsa_runs,
                "quantization": self.quant_source or None, "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
                "weights": [{"component": g.component, "weight_class": g.weight_class, "dtype": g.dtype,
                             "params_per_token": g.params_per_token, "bytes_per_token": g.bytes_per_token,
                             "rank_bytes_per_token": g.rank_bytes_per_token(self.tp, ideal=False)}
                            for g in self.groups]}


# --- quantization, sharding, categories (data files) ---------------------------------------------------------

def quant_schemes() -> List[str]:
    return sorted(load_toml("quant.toml")["schemes"])


def dtype_bytes(dtype: str) -> float:
    return float(load_toml("quant.toml")["dtypes"][dtype]["bytes_per_param"])


def class_dtype(scheme: str, weight_class: str, dense_model: bool) -> str:
    """Storage format of `weight_class` under quantization `scheme`."""
    schemes = load_toml("quant.toml")["schemes"]
    if scheme not in schemes:
        raise ProfattrError(f"unknown quantization {scheme!r}; valid: {', '.join(sorted(schemes))}")
    table = schemes[scheme]
    if dense_model and weight_class in table.get("dense_model", {}):
        return table["dense_model"][weight_class]
    return table.get(weight_class, table["default"])


def weight_category(weight_class: str) -> str:
    return load_toml("category_floors.toml")["weights"][weight_class]


def tensor_category(tensor: str) -> str:
    return load_toml("category_floors.toml")["tensors"][tensor]


def _rank_fraction(sharding: str, tp: int, num_kv_heads: int) -> float:
    if sharding == "sharded":
        return 1.0 / tp
    if sharding == "kv_heads":
        return max(num_kv_heads // tp, 1) / num_kv_heads
    return 1.0  # replicated; one_row (the owning rank reads the whole row)


# --- config.json: the architecture fields, validated in one place --------------------------------------------

# field -> smallest value it may take (widths, heads, layers, vocabulary: at least 1; counts that may be 0: 0)
CONFIG_INTEGERS = {
    "hidden_size": 1, "num_hidden_layers": 1, "vocab_size": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
    "intermediate_size": 1, "moe_intermediate_size": 1, "head_dim": 1, "kv_lora_rank": 1, "q_lora_rank": 1,
    "qk_nope_head_dim": 1, "qk_rope_head_dim": 0, "v_head_dim": 1, "n_routed_experts": 0, "num_experts": 0,
    "n_shared_experts": 0, "num_experts_per_tok": 1, "first_k_dense_replace": 0, "moe_layer_freq": 1,
    "decoder_sparse_step": 1, "shared_expert_intermediate_size": 0, "index_topk": 1, "index_n_heads": 1,
    "index_head_dim": 1,
}


def _config_error(source: str, text: str) -> ProfattrError:
    return ProfattrError(f"{source}: {text}; correct the config.json (the checkpoint's own says what the model is)")


def validate_config(config: Dict[str, Any], source: str = "config.json") -> None:
    """ProfattrError unless the architecture fields of a config.json are what a model can have: positive integers
    for widths, heads, layers and the vocabulary (0 or more for counts such as shared experts), no booleans or
    strings for numbers, and the relations between them (the attention heads a multiple of the KV heads, the
    hidden size split evenly over the heads when no head_dim is given, no more experts chosen per token than
    there are). The quantization_config is not looked at here."""
    if not isinstance(config, dict):
        raise _config_error(source, "not a JSON object")
    if config.get("model_type") is not None and not isinstance(config.get("model_type"), str):
        raise _config_error(source, f"model_type is {json.dumps(config['model_type'])[:40]}, expected text")
    for name, least in CONFIG_INTEGERS.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
            value = int(value)  # 4096.0: a number JSON wrote with a point
        if isinstance(value, bool) or not isinstance(value, int):
            raise _config_error(source, f"{name} is {json.dumps(value)[:40]}, expected an integer")
        if value < least:
            raise _config_error(source, f"{name} is {value}, expected {'a positive integer' if least else '0 or more'}")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise _config_error(source, f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    hidden = config.get("hidden_size")
    if heads and hidden and config.get("head_dim") is None and config.get("kv_lora_rank") is None and hidden % heads:
        raise _config_error(source, f"hidden_size {hidden} is not split evenly over {heads} attention heads (and no "
                            "head_dim is given)")
    experts = config.get("n_routed_experts", config.get("num_experts"))
    top_k = config.get("num_experts_per_tok")
    if experts and top_k and top_k > experts:
        raise _config_error(source, f"num_experts_per_tok {top_k} is more than the {experts} routed experts")
    layers_list = config.get("mlp_only_layers")
    if layers_list is not None and not (isinstance(layers_list, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers_list)):
        raise _config_error(source, "mlp_only_layers is not a list of layer numbers")
    tied = config.get("tie_word_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise _config_error(source, f"tie_word_embeddings is {json.dumps(tied)[:40]}, expected true or false")


# --- building specs ----------------------------------------------------------------------------------------

def _check_tp(layout: architectures.Layout, tp: int) -> None:
    if tp < 1:
        raise ProfattrError(f"--tp must be at least 1 (got {tp})")
    if layout.num_heads % tp:
        raise ProfattrError(
            f"tp {tp} does not divide num_attention_heads {layout.num_heads}; use a tp that divides it"
        )
    kv = layout.num_kv_heads
    if layout.kv_split == "kv_heads" and kv % tp and tp % kv:
        raise ProfattrError(f"tp {tp} and num_key_value_heads {kv}: one must divide the other")


def spec_from_config(config: Dict[str, Any], *, quant: str, tp: int, context_len: int = DEFAULT_CONTEXT_LEN,
                     dsa_runs: Optional[bool] = None, kv_dtype: str = "bf16", engine: str = "sglang",
                     model_id: str = "", name: str = "", source: str = "config.json",
                     indexer_full_layers: Optional[int] = None,
                     kernels_per_step: Optional[Tuple[float, str]] = None, batch: int = 1,
                     quantization: Optional["Quantization"] = None) -> ModelSpec:
    """ModelSpec of the model a config.json describes, quantized with `quant`, split over `tp` ranks by `engine`.

    quantization: the config.json's own quantization_config (quantization.parse); when given, every linear module
    is priced as it records (ignored modules BF16) and `quant` only names it.

    dsa_runs: whether the DSA indexer runs (None: it runs when the architecture has one).
    batch: sequences per step; weights are read once per step, KV, indexer keys, logits and FLOPs scale with it.
    """
    validate_config(config, source)
    sizes = {k: int(v) if k in CONFIG_INTEGERS and isinstance(v, float) else v for k, v in config.items()}
    layout = architectures.derive(sizes, indexer_full_layers)
    _check_tp(layout, tp)
    if context_len < 0:
        raise ProfattrError(f"--context must be 0 or more tokens (got {context_len})")
    sharding = load_toml("sharding.toml")
    if engine not in sharding:
        raise ProfattrError(f"unknown engine {engine!r}; valid: {', '.join(sorted(sharding))}")
    rules = sharding[engine]["components"]
    dense_model = not layout.has_routed_experts
    groups = []
    warnings: List[str] = []
    if quantization is not None:
        from profattr.limits.quantization import price

        priced, unmatched = price(sizes, quantization,
                                  [(c.name, c.params_total, c.params_per_token) for c in layout.components])
        warnings += [f"quantization_config ignore pattern {p!r} matches no module of this {layout.model_type} "
                     "model; check the module names (e.g. model.layers.0.self_attn.q_a_proj, lm_head)"
                     for p in unmatched]
        quant_source = f"quantization from config.json quantization_config ({quantization.describe()})"
    else:
        quant_source = f"--quant preset {quant}"
    for comp in layout.components:
        rule = rules.get(comp.name) or rules[comp.weight_class]
        parts = []  # (dtype, params_total, params_per_token, bytes_per_param)
        if quantization is None:
            dtype = class_dtype(quant, comp.weight_class, dense_model)
            parts.append((dtype, comp.params_total, comp.params_per_token, dtype_bytes(dtype)))
        else:
            p = priced[comp.name]
            if p.quantized_params_per_token > 0 or p.quantized_params_total > 0:
                per_param = p.quantized_bytes_per_token / p.quantized_params_per_token if \
                    p.quantized_params_per_token else 0.0
                parts.append((quantization.dtype, round(p.quantized_params_total),
                              round(p.quantized_params_per_token), per_param))
            if p.bf16_params_per_token > 0 or p.bf16_params_total > 0 or not parts:
                parts.append(("bf16", round(p.bf16_params_total), round(p.bf16_params_per_token),
                              dtype_bytes("bf16")))
        for dtype, total, per_token, per_param in parts:
            groups.append(WeightGroup(
                component=comp.name, weight_class=comp.weight_class, category=weight_category(comp.weight_class),
                params_total=total, params_per_token=per_token, dtype=dtype,
                bytes_per_param=per_param, sharding=rule["sharding"],
                rank_fraction=_rank_fraction(rule["sharding"], tp, layout.num_kv_heads)))
    dsa = layout.dsa if (layout.dsa and (dsa_runs is None or dsa_runs)) else None
    if not dsa:
        groups = [g for g in groups if g.weight_class != "indexer"]
    if batch < 1:
        raise ProfattrError(f"batch must be at least 1 (got {batch})")
    kv_fraction = 1.0 if layout.kv_split == "replicated" else _rank_fraction("kv_heads", tp, layout.num_kv_heads)
    kv_per_token = kv_row_bytes(layout, kv_dtype) * layout.num_layers * kv_fraction
    heads_per_rank = layout.num_heads / tp
    flops_per_token = layout.attention_flops_per_context_token_per_head * heads_per_rank * layout.num_layers
    attended = min(context_len, dsa.index_topk) if dsa else context_len
    indexer_keys = 0.0
    attention_flops = flops_per_token * attended * batch
    notes = list(layout.notes)
    if dsa:
        indexer_keys = (context_len * dsa.full_layers * (dsa.index_head_dim + architectures.INDEXER_KEY_SCALE_BYTES)
                        * batch)
        attention_flops += 2.0 * context_len * dsa.index_n_heads * dsa.index_head_dim * dsa.full_layers * batch
        notes.append(f"DSA runs: attention reads the top {dsa.index_topk} tokens; indexer keys "
                     f"({dsa.index_head_dim}+{architectures.INDEXER_KEY_SCALE_BYTES} B/token) on "
                     f"{dsa.full_layers} layers")
    elif layout.dsa:
        notes.append("DSA indexer not run: dense MLA over the whole context")
    if batch > 1:
        notes.append(f"batch {batch}: weights counted once per step and routed experts as if every sequence chose "
                     f"the same ones (a lower bound); KV, indexer keys, logits and FLOPs scale with the batch")
    return ModelSpec(
        id=model_id or str(config.get("_name_or_path") or layout.model_type), name=name or layout.model_type,
        source=source, quant=quant, tp=tp, context_len=context_len, num_layers=layout.num_layers,
        hidden_size=layout.hidden_size, vocab_size=layout.vocab_size, groups=tuple(groups),
        kv_cache_bytes_per_token=kv_per_token, kv_cache_read_bytes=kv_per_token * attended * batch,
        indexer_keys_read_bytes=indexer_keys, attention_flops=attention_flops,
        logits_bytes=4.0 * layout.vocab_size,
        allreduce_per_step=(2 * layout.num_layers + 1) if tp > 1 else 0,
        allreduce_message_bytes=layout.hidden_size * ACTIVATION_BYTES,
        kernels_per_step=kernels_per_step, batch=batch, dsa_runs=bool(dsa), notes=tuple(notes),
        config=dict(config),
        derive_args=dict(quant=quant, tp=tp, context_len=context_len, dsa_runs=dsa_runs, kv_dtype=kv_dtype,
                         engine=engine, model_id=model_id, name=name, source=source,
                         indexer_full_layers=indexer_full_layers, kernels_per_step=kernels_per_step, batch=batch,
                         quantization=quantization),
        quant_source=quant_source, warnings=tuple(warnings))


def kv_row_bytes(layout: architectures.Layout, kv_dtype: str) -> float:
    """Bytes one token's KV cache row takes in one layer (whole, before any split over ranks)."""
    if kv_dtype == "fp8" and layout.kv_split == "replicated" and layout.kv_rope_elements:
        mla = load_toml("quant.toml")["kv_cache"]["mla_fp8"]
        latent = layout.kv_elements_per_token_per_layer - layout.kv_rope_elements
        tiles = -(-latent // int(mla["tile_elements"]))
        return (latent * mla["latent_bytes_per_element"] + tiles * mla["scale_bytes_per_tile"]
                + layout.kv_rope_elements * mla["rope_bytes_per_element"])
    return layout.kv_elements_per_token_per_layer * dtype_bytes(kv_dtype)


def respec(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """The same model re-derived with some inputs changed (quant, tp, context_len, dsa_runs, ...)."""
    if spec.config is None or spec.derive_args is None:
        if set(changes) <= {"context_len"}:  # a recorded spec (run.json): only the KV read scales
            context_len = changes.get("context_len", spec.context_len)
            return replace(spec, context_len=context_len,
                           kv_cache_read_bytes=spec.kv_cache_bytes_per_token * context_len)
        raise ProfattrError("this model spec has no config.json to re-derive from")
    if "quant" in changes:  # a what-if scheme replaces the recorded quantization
        changes = {**changes, "quantization": None}
    return spec_from_config(spec.config, **{**spec.derive_args, **changes})


def model_presets() -> List[str]:
    """Ids of the shipped model presets."""
    return sorted({load_toml(f"models/{f}")["id"] for f in preset_ids("models").values()})


def load_config(path: Path) -> Dict[str, Any]:
    """Parsed config.json at `path` (a file, or a folder holding config.json)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    from profattr import inputs

    if not os.path.lexists(path):
        raise ProfattrError(f"{path}: no such file; pass a preset ({', '.join(model_presets())}) "
                            "or a Hugging Face config.json")
    text = inputs.read_text(path, "a Hugging Face config.json")
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProfattrError(f"{path}: cannot read it as JSON ({exc}); pass a Hugging Face config.json") from None
    if not isinstance(config, dict):
        raise ProfattrError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    return config


def load_model(model: str, *, tp: int, quant: Optional[str] = None, context_len: int = DEFAULT_CONTEXT_LEN,
               dsa_runs: Optional[bool] = None, kv_dtype: Optional[str] = None, batch: int = 1) -> ModelSpec:
    """ModelSpec from a preset id (specs/models/) or a config.json path. A config.json's own quantization_config
    prices its weights unless `quant` names a scheme (then `quant` is required without one). `kv_dtype` None:
    the KV cache dtype the quantization_config states, else BF16."""
    presets = preset_ids("models")
    if model.lower() in presets:
        data = load_toml(f"models/{presets[model.lower()]}")
        kernels = data.get("kernels_per_step")
        full = data.get("indexer_full_layers", {}).get("value")
        return spec_from_config(
            data["config"], quant=quant or data["quant"], tp=tp, context_len=context_len, dsa_runs=dsa_runs,
            kv_dtype=kv_dtype or "bf16", batch=batch, engine=data.get("engine", "sglang"), model_id=data["id"],
            name=data["name"],
            source=f"preset {data['id']} ({data['config_source']['default']})", indexer_full_layers=full,
            kernels_per_step=(kernels["value"], kernels["source"]) if kernels else None)
    path = Path(model)
    if not (path.suffix == ".json" or path.is_dir() or path.exists()):
        raise ProfattrError(f"unknown model {model!r}; presets: {', '.join(model_presets())}, "
                            "or a path to a Hugging Face config.json")
    config = load_config(path)
    from profattr.limits.quantization import parse, scheme_name

    quantization = None if quant else parse(config)
    if not quant and quantization is None:
        raise ProfattrError(f"--quant is required with a config.json that has no quantization_config; valid: "
                            f"{', '.join(quant_schemes())}")
    if kv_dtype is None:
        kv_dtype = (quantization.kv_dtype if quantization is not None else None) or "bf16"
    return spec_from_config(config, quant=quant or scheme_name(quantization), tp=tp, context_len=context_len,
                            dsa_runs=dsa_runs, kv_dtype=kv_dtype, batch=batch,
                            model_id=str(config.get("_name_or_path") or path.stem),
                            name=str(config.get("model_type")), source=str(path), quantization=quantization)
