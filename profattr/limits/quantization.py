"""The quantization a checkpoint records in its config.json (`quantization_config`), module by module.

Forms read:
- ModelOpt, flat (`{"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": [...],
  "kv_cache_quant_algo": "FP8"}`; `exclude_modules` is read like `ignore`) and nested as in hf_quant_config.json
  (`{"quantization": {"quant_algo": ..., "group_size": ..., "exclude_modules": [...], "kv_cache_quant_algo": ...}}`);
- compressed-tensors (`quant_method: compressed-tensors`, `config_groups` whose `weights` give `num_bits`, `type`,
  `group_size`, `strategy`; `ignore`; `kv_cache_scheme`);
- FP8 blocks (`quant_method: fp8`, `weight_block_size`; `modules_to_not_convert` / `ignored_layers`).

Bytes per stored linear weight tensor of `out x in` weights:
- NVFP4: 0.5 B per weight (E2M1) + one FP8 E4M3 scale (1 B) per `group_size` weights + one FP32 global scale (4 B);
- FP8 per tensor: 1 B per weight + one FP32 scale; FP8 blocks: 1 B per weight + one FP32 scale per block;
- INT4/INT8 groups (W4A16/W8A16): bits/8 B per weight + one BF16 scale per group (+ a zero point if asymmetric).
A module whose path (`model.layers.3.self_attn.q_a_proj`, `lm_head`) an `ignore` pattern matches (fnmatch-style,
or `re:REGEX` as compressed-tensors writes them; a pattern naming a parent module covers its children) stays in
the checkpoint's own dtype (BF16). Embeddings, norms, the router (`mlp.gate`) and lm_head are never quantized: the
engine keeps them BF16 whatever the config says (ENGINE_UNQUANTIZED).
"""
from __future__ import annotations

import fnmatch
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from profattr.errors import ProfattrError
from profattr.regexguard import compile_engine_pattern

NVFP4, FP8, FP8_BLOCK, INT = "nvfp4", "fp8", "fp8_block", "int"
MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4", "FP8")  # W4A16_NVFP4: the same FP4 weights, BF16 activations
COMPRESSED_TENSORS_TYPES = ("float 4-bit (NVFP4)", "float 8-bit (FP8)", "int 4-bit", "int 8-bit")
SCALE_BYTES = {"fp8_e4m3": 1.0, "fp32": 4.0, "bf16": 2.0}
UNQUANTIZED_BYTES = 2.0  # BF16 checkpoint dtype of ignored modules
GLOBAL_SCALE_BYTES = 4.0
# Linear weights the engine never quantizes, as globs over module paths: SGLang's lm_head is a ParallelLMHead (a
# VocabParallelEmbedding, not a LinearBase), and the FP8, ModelOpt and compressed-tensors quant methods return a quant
# method for LinearBase and FusedMoE layers only (python/sglang/srt/layers/quantization/fp8.py, modelopt_quant.py
# get_quant_method); the DSA indexer's weights_proj is built without a quant config and runs as a BF16 GEMM with
# FP32 output (examples/h200/glm5, FP8 checkpoint: nvjet_sm90_tss_*_splitK inside self_attn.indexer).
ENGINE_UNQUANTIZED = ("lm_head", "model.layers.*.self_attn.indexer.weights_proj")


@dataclass(frozen=True)
class Quantization:
    """What config.json says about the weights' storage, ready to price any linear module."""

    method: str  # modelopt | compressed-tensors | fp8
    algo: str  # NVFP4 | FP8 | FP8_BLOCK | W4A16 ...
    weight_format: str  # nvfp4 | fp8 | fp8_block | int
    bits: int
    group_size: Optional[int]  # weights per scale (grouped formats)
    block: Optional[Tuple[int, int]]  # FP8 block (rows, cols)
    ignore: Tuple[str, ...]
    kv_dtype: Optional[str]  # fp8 | bf16 | None (not stated)
    symmetric: bool = True

    @property
    def dtype(self) -> str:
        """The weight-group dtype name downstream uses (quant.toml dtypes; nvfp4 -> gemm.fp4 kernels)."""
        return {NVFP4: "nvfp4", FP8: "fp8", FP8_BLOCK: "fp8", INT: f"int{self.bits}"}[self.weight_format]

    def describe(self) -> str:
        """'modelopt NVFP4, group 16, 3 ignore patterns'."""
        parts = [f"{self.method} {self.algo}"]
        if self.group_size:
            parts.append(f"group {self.group_size}")
        if self.block:
            parts.append(f"blocks {self.block[0]}x{self.block[1]}")
        parts.append(f"{len(self.ignore)} ignore pattern{'' if len(self.ignore) == 1 else 's'}")
        if self.kv_dtype:
            parts.append(f"KV cache {self.kv_dtype}")
        return ", ".join(parts)

    def ignored(self, path: str) -> bool:
        return any(_matches(p, path) for p in self.ignore)

    def tensor_bytes(self, out_features: int, in_features: int) -> float:
        """Stored bytes of one quantized `out x in` weight tensor with its scales."""
        n = out_features * in_features
        if self.weight_format == NVFP4:
            return 0.5 * n + n / self.group_size * SCALE_BYTES["fp8_e4m3"] + GLOBAL_SCALE_BYTES
        if self.weight_format == FP8:
            return 1.0 * n + GLOBAL_SCALE_BYTES
        if self.weight_format == FP8_BLOCK:
            rows, cols = self.block
            return 1.0 * n + math.ceil(out_features / rows) * math.ceil(in_features / cols) * SCALE_BYTES["fp32"]
        groups = n / self.group_size if self.group_size else out_features  # channel-wise without a group
        zero = 0.0 if self.symmetric else groups * self.bits / 8.0
        return self.bits / 8.0 * n + groups * SCALE_BYTES["bf16"] + zero


def runs_unquantized(quant: Optional[Quantization], path: str) -> bool:
    """Whether the engine runs the linear module at `path` in BF16: the config ignores it, or the engine never
    quantizes it (ENGINE_UNQUANTIZED); without a quantization_config only the engine's own list counts."""
    if quant is not None and quant.ignored(path):
        return True
    return any(_matches(g, path) for g in ENGINE_UNQUANTIZED)


def _matches(pattern: str, path: str) -> bool:
    return _compiled(pattern).match(path) is not None


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> "re.Pattern[str]":
    """The regex of an ignore pattern: `re:REGEX` as written, else the fnmatch glob; either also matches the
    children of the module it names (`model.layers.0.mlp` covers `model.layers.0.mlp.down_proj`)."""
    if pattern.startswith("re:"):
        where = "config.json quantization_config ignore"
        compile_engine_pattern(pattern[3:], where)  # alone first: a bad pattern is named as written
        return compile_engine_pattern(f"(?s:(?:{pattern[3:]}))(?:\\..*)?\\Z", where)
    core = re.sub(r"\\[Zz]$", "", fnmatch.translate(pattern))
    return re.compile(f"(?s:(?:{core}))(?:\\..*)?\\Z")


def _positive_int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _patterns(qc: Mapping[str, Any], *keys: str) -> Tuple[str, ...]:
    out: List[str] = []
    for key in keys:
        value = qc.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise ProfattrError(f"config.json quantization_config: {key} must be a list of module name patterns; "
                                "fix the config or pass --quant")
        out.extend(value)
    return tuple(dict.fromkeys(out))


def _kv_of_algo(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = str(value).upper()
    if "FP8" in text:
        return "fp8"
    if text in ("NONE", "", "BF16", "FP16"):
        return None
    raise ProfattrError(f"config.json quantization_config: kv_cache_quant_algo {value!r} is not known; known: "
                        "FP8 (or none); pass --kv-dtype")


def _kv_of_scheme(scheme: Any) -> Optional[str]:
    if not isinstance(scheme, Mapping):
        return None
    if scheme.get("num_bits") == 8 and str(scheme.get("type", "float")) == "float":
        return "fp8"
    raise ProfattrError(f"config.json quantization_config: kv_cache_scheme {dict(scheme)!r} is not known; known: "
                        "8-bit float (FP8); pass --kv-dtype")


def parse(config: Mapping[str, Any]) -> Optional[Quantization]:
    """The Quantization of a parsed config.json, or None when it has no quantization_config.

    Raises ProfattrError (one line naming the field) for a form or algorithm that is not known, or a grouped
    algorithm without a positive group_size."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ProfattrError("config.json: quantization_config is not an object; fix it or pass --quant")
    method = str(qc.get("quant_method") or "").lower()
    nested = qc.get("quantization")
    if isinstance(nested, Mapping) and not method:
        method = "modelopt"
    if method in ("modelopt", "modelopt_fp4", "modelopt_fp8"):
        return _modelopt(qc, nested if isinstance(nested, Mapping) else {})
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fp8":
        return _fp8(qc)
    raise ProfattrError(f"config.json quantization_config: quant_method {method or '(missing)'!r} is not known; "
                        "known: modelopt (quant_algo NVFP4, FP8), compressed-tensors, fp8; pass --quant")


def _modelopt(qc: Mapping[str, Any], nested: Mapping[str, Any]) -> Quantization:
    merged = {**qc, **nested}
    algo = str(merged.get("quant_algo") or "").upper()
    if algo not in MODELOPT_ALGOS:
        raise ProfattrError(f"config.json quantization_config: quant_algo {merged.get('quant_algo')!r} is not known; "
                            f"known: {', '.join(MODELOPT_ALGOS)}; pass --quant")
    ignore = _patterns(merged, "ignore", "exclude_modules")
    kv = _kv_of_algo(merged.get("kv_cache_quant_algo")) or _kv_of_scheme(merged.get("kv_cache_scheme"))
    if algo in ("NVFP4", "W4A16_NVFP4"):
        group = merged.get("group_size")
        if _positive_int(group) is None:
            raise ProfattrError(f"config.json quantization_config: quant_algo {algo} needs a positive group_size "
                                f"(weights per FP8 scale, 16 in NVFP4 checkpoints), got {group!r}; fix the config")
        return Quantization("modelopt", algo, NVFP4, 4, group, None, ignore, kv)
    return Quantization("modelopt", "FP8", FP8, 8, None, None, ignore, kv)


def _compressed_tensors(qc: Mapping[str, Any]) -> Quantization:
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ProfattrError("config.json quantization_config (compressed-tensors): config_groups is missing or "
                            "empty; fix the config or pass --quant")
    schemes = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            raise ProfattrError(f"config.json quantization_config: config_groups.{name} has no weights scheme; "
                                "fix the config or pass --quant")
        schemes.append((name, weights))
    name, weights = schemes[0]
    if len({(w.get("num_bits"), w.get("type"), w.get("group_size"), w.get("strategy")) for _, w in schemes}) > 1:
        raise ProfattrError("config.json quantization_config: config_groups give different weight schemes; only "
                            "one scheme for all quantized linears is modelled; pass --quant")
    bits, kind = weights.get("num_bits"), str(weights.get("type") or "int").lower()
    strategy = str(weights.get("strategy") or "").lower()
    group = weights.get("group_size")
    ignore = _patterns(qc, "ignore")
    kv = _kv_of_scheme(qc.get("kv_cache_scheme"))
    where = f"config.json quantization_config: config_groups.{name}.weights"
    if strategy in ("group", "tensor_group") and _positive_int(group) is None:
        raise ProfattrError(f"{where}: strategy {strategy} needs a positive group_size, got {group!r}; fix the config")
    if kind == "float" and bits == 4:
        if _positive_int(group) is None:
            raise ProfattrError(f"{where}: 4-bit float (NVFP4) needs a positive group_size, got {group!r}; "
                                "fix the config")
        return Quantization("compressed-tensors", "NVFP4", NVFP4, 4, group, None, ignore, kv)
    if kind == "float" and bits == 8:
        block = weights.get("block_structure")
        if strategy == "block" and isinstance(block, list) and len(block) == 2 and all(map(_positive_int, block)):
            return Quantization("compressed-tensors", "FP8_BLOCK", FP8_BLOCK, 8, None, (block[0], block[1]),
                                ignore, kv)
        return Quantization("compressed-tensors", "FP8", FP8, 8, None, None, ignore, kv)
    if kind == "int" and bits in (4, 8):
        return Quantization("compressed-tensors", f"W{bits}A16", INT, bits, _positive_int(group), None, ignore, kv,
                            symmetric=bool(weights.get("symmetric", True)))
    raise ProfattrError(f"{where}: {bits}-bit {kind} weights are not known; known: "
                        f"{', '.join(COMPRESSED_TENSORS_TYPES)}; pass --quant")


def _fp8(qc: Mapping[str, Any]) -> Quantization:
    ignore = _patterns(qc, "modules_to_not_convert", "ignored_layers", "ignore")
    block = qc.get("weight_block_size")
    if block is None:
        return Quantization("fp8", "FP8", FP8, 8, None, None, ignore, None)
    if not (isinstance(block, list) and len(block) == 2 and all(_positive_int(b) for b in block)):
        raise ProfattrError(f"config.json quantization_config: weight_block_size must be two positive integers "
                            f"(e.g. [128, 128]), got {block!r}; fix the config")
    return Quantization("fp8", "FP8_BLOCK", FP8_BLOCK, 8, None, (block[0], block[1]), ignore, None)


def scheme_name(quant: Quantization) -> str:
    """A short name for specs and what-if tables: nvfp4, fp8, int4, int8."""
    return {NVFP4: "nvfp4", FP8: "fp8", FP8_BLOCK: "fp8"}.get(quant.weight_format, f"int{quant.bits}")


# --- linear modules of an architecture ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Module:
    """One linear weight tensor of the checkpoint: its path, shape and how much of it a decoded token reads."""

    component: str  # architectures.Layout component name
    path: str
    out_features: int
    in_features: int
    per_token: float  # 1.0, or top_k / n_experts for a routed expert


def linear_modules(config: Mapping[str, Any]) -> List[Module]:
    """Every quantizable linear weight of the model config.json describes (MLA MoE, Qwen MoE, llama-style)."""
    from profattr.limits import architectures

    model_type = config.get("model_type")
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    out: List[Module] = []

    def add(component, path, o, i, per_token=1.0):
        out.append(Module(component, path, int(o), int(i), per_token))

    if model_type in architectures.MLA_TYPES:
        _mla_modules(config, add, hidden, layers, model_type in architectures.DSA_TYPES)
    else:
        _gqa_modules(config, add, hidden, layers, model_type in architectures.QWEN_MOE_TYPES)
    if not config.get("tie_word_embeddings", False):
        add("lm_head", "lm_head", vocab, hidden)
    return out


def _mlp(add, component, prefix, hidden, inter, per_token=1.0):
    add(component, f"{prefix}.gate_proj", inter, hidden, per_token)
    add(component, f"{prefix}.up_proj", inter, hidden, per_token)
    add(component, f"{prefix}.down_proj", hidden, inter, per_token)


def _mla_modules(config, add, hidden, layers, dsa):
    heads, kv_lora = config["num_attention_heads"], config["kv_lora_rank"]
    nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q_lora = config.get("q_lora_rank")
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    moe_inter, shared = config["moe_intermediate_size"], config["n_shared_experts"]
    first_dense, freq = min(config["first_k_dense_replace"], layers), config.get("moe_layer_freq") or 1
    for i in range(layers):
        p = f"model.layers.{i}"
        if q_lora:
            add("attention.q_a_proj", f"{p}.self_attn.q_a_proj", q_lora, hidden)
            add("attention.q_b_proj", f"{p}.self_attn.q_b_proj", heads * (nope + rope), q_lora)
        else:
            add("attention.q_proj", f"{p}.self_attn.q_proj", heads * (nope + rope), hidden)
        add("attention.kv_a_proj", f"{p}.self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden)
        add("attention.kv_b_proj", f"{p}.self_attn.kv_b_proj", heads * (nope + v_dim), kv_lora)
        add("attention.o_proj", f"{p}.self_attn.o_proj", hidden, heads * v_dim)
        if dsa:
            idx_heads, idx_dim = config["index_n_heads"], config["index_head_dim"]
            add("indexer", f"{p}.self_attn.indexer.wq_b", idx_heads * idx_dim, q_lora)
            add("indexer", f"{p}.self_attn.indexer.wk", idx_dim, hidden)
            add("indexer", f"{p}.self_attn.indexer.weights_proj", idx_heads, hidden)
        if i >= first_dense and i % freq == 0:
            for j in range(experts):
                _mlp(add, "routed_experts", f"{p}.mlp.experts.{j}", hidden, moe_inter, top_k / experts)
            if shared:
                _mlp(add, "shared_experts", f"{p}.mlp.shared_experts", hidden, moe_inter * shared)
        else:
            _mlp(add, "dense_mlp", f"{p}.mlp", hidden, config["intermediate_size"])


def _gqa_modules(config, add, hidden, layers, moe):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    step = config.get("decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or [])
    for i in range(layers):
        p = f"model.layers.{i}"
        add("attention.q_proj", f"{p}.self_attn.q_proj", heads * head_dim, hidden)
        add("attention.k_proj", f"{p}.self_attn.k_proj", kv_heads * head_dim, hidden)
        add("attention.v_proj", f"{p}.self_attn.v_proj", kv_heads * head_dim, hidden)
        add("attention.o_proj", f"{p}.self_attn.o_proj", hidden, heads * head_dim)
        if moe and i not in dense_only and config["num_experts"] > 0 and (i + 1) % step == 0:
            experts, top_k = config["num_experts"], config["num_experts_per_tok"]
            for j in range(experts):
                _mlp(add, "routed_experts", f"{p}.mlp.experts.{j}", hidden, config["moe_intermediate_size"],
                     top_k / experts)
            shared_inter = config.get("shared_expert_intermediate_size") or 0
            if shared_inter:
                _mlp(add, "shared_experts", f"{p}.mlp.shared_expert", hidden, shared_inter)
        else:
            _mlp(add, "dense_mlp", f"{p}.mlp", hidden, config["intermediate_size"])


# --- pricing a layout's components ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Priced:
    """One component's weights split into its quantized and its BF16 part (parameters and bytes)."""

    component: str
    quantized_params_total: float
    quantized_params_per_token: float
    quantized_bytes_per_token: float
    bf16_params_total: float
    bf16_params_per_token: float


def price(config: Mapping[str, Any], quant: Quantization,
          components: Sequence[Tuple[str, int, int]]) -> Tuple[Dict[str, Priced], List[str]]:
    """Per component (name, params_total, params_per_token): its quantized and BF16 parts; and the ignore patterns
    that matched no linear module (to warn about). Parameters of a component that are not a linear module
    (norms, biases, the router, the embedding) stay BF16."""
    modules = linear_modules(config)
    used = set()
    sums: Dict[str, List[float]] = {}
    for m in modules:
        hit = [p for p in quant.ignore if _matches(p, m.path)]
        used.update(hit)
        if not hit and any(_matches(g, m.path) for g in ENGINE_UNQUANTIZED):
            hit = ["(engine)"]
        n = m.out_features * m.in_features
        entry = sums.setdefault(m.component, [0.0, 0.0, 0.0, 0.0, 0.0])  # q total, q token, q bytes, ignored
        if hit:
            entry[3] += n
            entry[4] += n * m.per_token
        else:
            entry[0] += n
            entry[1] += n * m.per_token
            entry[2] += quant.tensor_bytes(m.out_features, m.in_features) * m.per_token
    priced = {}
    for name, total, per_token in components:
        q_total, q_token, q_bytes, _, _ = sums.get(name, [0.0] * 5)
        priced[name] = Priced(name, q_total, q_token, q_bytes, total - q_total, per_token - q_token)
    unmatched = [p for p in quant.ignore if p not in used and not _matches_non_linear(p, config)]
    return priced, unmatched


def _matches_non_linear(pattern: str, config: Mapping[str, Any]) -> bool:
    """Whether an ignore pattern names a module that is BF16 anyway (router gate, embedding, norms)."""
    layers = config.get("num_hidden_layers") or 0
    names = ["model.embed_tokens", "model.norm"] + [f"model.layers.{i}.{n}" for i in range(layers)
                                                    for n in ("mlp.gate", "input_layernorm",
                                                              "post_attention_layernorm")]
    return any(_matches(pattern, n) for n in names)
