"""Parameter counts of decoder architectures, derived from a Hugging Face config.json.

`derive(config)` returns a Layout: every weight component with its stored parameter count and the parameters a
decode step reads per token, plus what attention reads from the KV cache. Supported `model_type`s: MLA MoE
(glm_moe_dsa, deepseek_v32, deepseek_v3, deepseek_v2), Qwen MoE (qwen3_moe, qwen2_moe) and dense llama-style
(llama, mistral, qwen2, qwen3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from profattr.errors import ProfattrError

MLA_TYPES = ("glm_moe_dsa", "deepseek_v32", "deepseek_v3", "deepseek_v2")
DSA_TYPES = ("glm_moe_dsa", "deepseek_v32")
QWEN_MOE_TYPES = ("qwen3_moe", "qwen2_moe")
DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = MLA_TYPES + QWEN_MOE_TYPES + DENSE_TYPES

# DSA indexer key cache per token per layer: 128 FP8 values + one FP32 scale (assumption from the roofline method).
INDEXER_KEY_SCALE_BYTES = 4


@dataclass(frozen=True)
class Component:
    """One weight tensor family summed over all layers. `name` keys the sharding table; `weight_class` the quant."""

    name: str
    weight_class: str
    params_total: int
    params_per_token: int


@dataclass(frozen=True)
class DsaLayout:
    """DeepSeek Sparse Attention: the indexer picks `index_topk` tokens; `full_layers` compute their own top-k."""

    index_topk: int
    index_n_heads: int
    index_head_dim: int
    full_layers: int


@dataclass(frozen=True)
class Layout:
    """What one decode step of the model reads, before quantization and tensor parallelism are applied."""

    model_type: str
    components: List[Component]
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    kv_elements_per_token_per_layer: int  # MLA: latent + rope key; GQA: K and V of every KV head
    kv_split: str  # "replicated" (MLA latent lives whole on every rank) or "kv_heads"
    attention_flops_per_context_token_per_head: int  # per layer
    has_routed_experts: bool
    dsa: Optional[DsaLayout] = None
    notes: List[str] = field(default_factory=list)
    kv_rope_elements: int = 0  # MLA: the rope key part of kv_elements_per_token_per_layer (kept BF16 in FP8 caches)


def _require(config: Dict[str, Any], names: Sequence[str], model_type: str) -> None:
    missing = [name for name in names if config.get(name) is None]
    if missing:
        raise ProfattrError(
            f"config.json (model_type {model_type}) is missing fields: {', '.join(missing)}; "
            "add them from the checkpoint's config.json"
        )


def derive(config: Dict[str, Any], indexer_full_layers: Optional[int] = None) -> Layout:
    """Layout of the model that `config` (a parsed config.json) describes."""
    model_type = config.get("model_type")
    if not model_type:
        raise ProfattrError("config.json is missing fields: model_type; is this a Hugging Face config.json?")
    if model_type in MLA_TYPES:
        return _mla(config, model_type, indexer_full_layers)
    if model_type in QWEN_MOE_TYPES:
        return _gqa(config, model_type, moe=True)
    if model_type in DENSE_TYPES:
        return _gqa(config, model_type, moe=False)
    raise ProfattrError(
        f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def _embedding_and_head(config: Dict[str, Any], hidden: int, vocab: int) -> List[Component]:
    tied = bool(config.get("tie_word_embeddings", False))
    # the embedding lookup reads one row per token; lm_head reads the whole (possibly tied) matrix
    return [
        Component("embedding", "embedding", vocab * hidden, hidden),
        Component("lm_head", "lm_head", 0 if tied else vocab * hidden, vocab * hidden),
    ]


def _mla(config: Dict[str, Any], model_type: str, indexer_full_layers: Optional[int]) -> Layout:
    required = ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                "moe_intermediate_size", "intermediate_size", "first_k_dense_replace", "n_shared_experts"]
    if model_type in DSA_TYPES:
        required += ["index_topk", "index_n_heads", "index_head_dim", "q_lora_rank"]
    _require(config, required, model_type)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, kv_lora = config["num_attention_heads"], config["kv_lora_rank"]
    nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q_lora = config.get("q_lora_rank")
    experts, top_k = config["n_routed_experts"], config["num_experts_per_tok"]
    moe_inter, dense_inter = config["moe_intermediate_size"], config["intermediate_size"]
    dense_layers = min(config["first_k_dense_replace"], layers)
    freq = config.get("moe_layer_freq") or 1
    moe_layers = sum(1 for i in range(dense_layers, layers) if i % freq == 0)
    dense_layers = layers - moe_layers
    shared = config["n_shared_experts"]

    per_layer: List[tuple] = []  # (name, class, params per layer)
    if q_lora:
        per_layer += [("attention.q_a_proj", "attention", hidden * q_lora),
                      ("attention.q_b_proj", "attention", q_lora * heads * (nope + rope)),
                      ("norm", "norm", q_lora)]
    else:
        per_layer += [("attention.q_proj", "attention", hidden * heads * (nope + rope))]
    per_layer += [("attention.kv_a_proj", "attention", hidden * (kv_lora + rope)),
                  ("attention.kv_b_proj", "attention", kv_lora * heads * (nope + v_dim)),
                  ("attention.o_proj", "attention", heads * v_dim * hidden),
                  ("norm", "norm", kv_lora + 2 * hidden)]
    comps: Dict[str, List[int]] = {}

    def add(name: str, cls: str, total: int, per_token: int) -> None:
        entry = comps.setdefault(name, [cls, 0, 0])
        entry[1] += total
        entry[2] += per_token

    for name, cls, count in per_layer:
        add(name, cls, count * layers, count * layers)
    dsa = None
    notes = [f"{dense_layers} dense + {moe_layers} MoE layers; MTP layers (num_nextn_predict_layers) not run"]
    if model_type in DSA_TYPES:
        idx_heads, idx_dim = config["index_n_heads"], config["index_head_dim"]
        # wq_b (q_lora -> heads*dim), wk (hidden -> dim), weights_proj (hidden -> heads), k_norm (LayerNorm w+b)
        idx = q_lora * idx_heads * idx_dim + hidden * idx_dim + hidden * idx_heads + 2 * idx_dim
        add("indexer", "indexer", idx * layers, idx * layers)
        full = indexer_full_layers if indexer_full_layers is not None else layers
        dsa = DsaLayout(config["index_topk"], idx_heads, idx_dim, full)
    expert = 3 * hidden * moe_inter  # gate, up, down
    add("dense_mlp", "dense_mlp", 3 * hidden * dense_inter * dense_layers, 3 * hidden * dense_inter * dense_layers)
    add("routed_experts", "routed_experts", expert * experts * moe_layers, expert * top_k * moe_layers)
    add("shared_experts", "shared_experts", expert * shared * moe_layers, expert * shared * moe_layers)
    # router weight (experts x hidden) plus the per-expert score correction bias of noaux_tc routing
    bias = experts if config.get("topk_method", "noaux_tc") == "noaux_tc" and model_type != "deepseek_v2" else 0
    add("router", "router", (experts * hidden + bias) * moe_layers, (experts * hidden + bias) * moe_layers)
    add("norm", "norm", hidden, hidden)  # final norm
    components = [Component(n, c, t, p) for n, (c, t, p) in comps.items()]
    components += _embedding_and_head(config, hidden, vocab)
    return Layout(model_type, components, layers, hidden, vocab, heads, heads,
                  kv_elements_per_token_per_layer=kv_lora + rope, kv_split="replicated",
                  attention_flops_per_context_token_per_head=2 * (kv_lora + rope) + 2 * kv_lora,
                  has_routed_experts=experts > 0, dsa=dsa, notes=notes, kv_rope_elements=rope)


def _gqa(config: Dict[str, Any], model_type: str, moe: bool) -> Layout:
    required = ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "intermediate_size"]
    if moe:
        required += ["num_experts", "num_experts_per_tok", "moe_intermediate_size"]
    _require(config, required, model_type)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    bias = bool(config.get("attention_bias", model_type == "qwen2" or model_type == "qwen2_moe"))
    q = hidden * heads * head_dim + (heads * head_dim if bias else 0)
    kv = hidden * kv_heads * head_dim + (kv_heads * head_dim if bias else 0)
    o = heads * head_dim * hidden
    # input + post-attention norms; qwen3 adds per-head q/k norms
    norm = 2 * hidden + (2 * head_dim if model_type in ("qwen3", "qwen3_moe") else 0)

    moe_layer_ids: List[int] = []
    if moe:
        step = config.get("decoder_sparse_step") or 1
        dense_only = set(config.get("mlp_only_layers") or [])
        moe_layer_ids = [i for i in range(layers)
                         if i not in dense_only and config["num_experts"] > 0 and (i + 1) % step == 0]
    moe_layers = len(moe_layer_ids)
    dense_layers = layers - moe_layers
    comps = [
        Component("attention.q_proj", "attention", q * layers, q * layers),
        Component("attention.k_proj", "attention", kv * layers, kv * layers),
        Component("attention.v_proj", "attention", kv * layers, kv * layers),
        Component("attention.o_proj", "attention", o * layers, o * layers),
        Component("norm", "norm", norm * layers + hidden, norm * layers + hidden),
        Component("dense_mlp", "dense_mlp", 3 * hidden * inter * dense_layers, 3 * hidden * inter * dense_layers),
    ]
    notes = [f"{dense_layers} dense + {moe_layers} MoE layers"] if moe else []
    if moe:
        experts, top_k = config["num_experts"], config["num_experts_per_tok"]
        expert = 3 * hidden * config["moe_intermediate_size"]
        comps.append(Component("routed_experts", "routed_experts", expert * experts * moe_layers,
                               expert * top_k * moe_layers))
        comps.append(Component("router", "router", experts * hidden * moe_layers, experts * hidden * moe_layers))
        shared_inter = config.get("shared_expert_intermediate_size") or 0
        if shared_inter:
            # qwen2_moe: one shared expert plus a sigmoid gate (hidden -> 1)
            shared = (3 * hidden * shared_inter + hidden) * moe_layers
            comps.append(Component("shared_experts", "shared_experts", shared, shared))
    comps += _embedding_and_head(config, hidden, vocab)
    return Layout(model_type, comps, layers, hidden, vocab, heads, kv_heads,
                  kv_elements_per_token_per_layer=2 * kv_heads * head_dim, kv_split="kv_heads",
                  attention_flops_per_context_token_per_head=4 * head_dim,
                  has_routed_experts=moe, notes=notes)
