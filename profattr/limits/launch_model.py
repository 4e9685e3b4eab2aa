"""Per-launch time of a GEMM kernel family on the target, from the launch shapes the source measured.

A decode GEMM at batch 1 streams its weights; how fast depends on how many CTAs share the work. A kernel family
whose grid is fixed by its tile width (SGLang's Triton block-FP8 GEMM and fused MoE on their default configs: one
CTA per BLOCK_N output columns, per expert) is matched here to the model's linear layers (`linear_layers`): the
tile width is the first power of two for which every one of the kernel's (at least two) launch shapes is a set of
layers with that CTA count and launch count. A matched launch of W weight bytes over c CTAs takes

    t = t0 + max(W / c x waves / r_cta, W / BW_agg)      waves = ceil(c / SMs)

- t0: the GPU's launch floor, the median duration of the source step's launches of categories that move no bytes;
- r_cta (the per-CTA roof: one CTA's streaming rate, bytes/s): from the family's launch shapes with at most a
  quarter as many CTAs as SMs (they cannot be bound by DRAM), the median over them; a family with none borrows the
  median of the other matched families on the device;
- BW_agg (the family's DRAM roof): from its launch shape with the most bytes per launch.
Everything is read from the source capture; the target's launches are the same layers at the target's per-rank
shapes, on the same tile width (a kernel config the engine picks only at the target's shapes is not seen).

On another GPU (`target_roofs`): BW_agg scales with the DRAM bandwidth ratio (a launch that fills the GPU is bound
by DRAM). r_cta scales with the SM clock ratio only. By Little's law one CTA's rate is the bytes it keeps in flight
over the memory latency; the bytes in flight are the kernel's own (same code, same tile, same pipeline stages), and
the latency is taken as the same number of SM cycles on both GPUs (no preset has a latency measured the same way on
both): so r_cta x clock_target / clock_source. The DRAM bandwidth does not enter: a lone CTA is far from it (the
H200's Triton block-FP8 GEMM streams about 27 GB/s per CTA against 4.8 TB/s).

Where the engine runs the kernel with another config at the target's key than at the source's (`target_config`,
from specs/engine_configs.toml: a tuned config the engine ships for that key), the target's launches take that
config's tile width and r_cta scales with its weight bytes in flight, (num_stages - 1) x BLOCK_N x BLOCK_K.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from profattr.limits.model import ModelSpec
from profattr.limits.specs import load_toml

TILE_WIDTHS = (16, 32, 64, 128, 256)
PER_CTA_SHARE = 0.25  # launches with at most this share of the SMs as CTAs give the per-CTA roof
MIN_SHAPES = 2  # one launch shape agreeing with one layer's CTA count is too weak a match to trust


# the decode step's weight GEMMs of an MLA model: name, sharding.toml component, module path (layer 0), output rows
# n, inputs k, batched heads, and which of them tensor parallelism splits when the component is sharded ("n":
# column-parallel, "k": row-parallel, "heads": a per-head batched GEMM)
def _mla_layers(cfg: Mapping[str, Any]) -> List[tuple]:
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nope, rope, v = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
    q_lora, kv_lora = int(cfg["q_lora_rank"]), int(cfg["kv_lora_rank"])
    a = "model.layers.0.self_attn"
    out = [("attention.qkv_a", "attention.q_a_proj", f"{a}.q_a_proj", q_lora + kv_lora + rope, hidden, 1, "n"),
           ("attention.q_b_proj", "attention.q_b_proj", f"{a}.q_b_proj", heads * (nope + rope), q_lora, 1, "n"),
           # MLA's absorbed decode: q_nope x w_kc and the attention output x w_vc, batched over the rank's heads
           ("attention.w_kc", "attention.w_kc", f"{a}.kv_b_proj", kv_lora, nope, heads, "heads"),
           ("attention.w_vc", "attention.w_vc", f"{a}.kv_b_proj", v, kv_lora, heads, "heads"),
           ("attention.o_proj", "attention.o_proj", f"{a}.o_proj", hidden, heads * v, 1, "k")]
    if cfg.get("index_n_heads"):
        ih, idim = int(cfg["index_n_heads"]), int(cfg["index_head_dim"])
        out += [("indexer.wq_b", "indexer.wq_b", f"{a}.indexer.wq_b", ih * idim, q_lora, 1, "n"),
                ("indexer.wk", "indexer.wk", f"{a}.indexer.wk", idim, hidden, 1, "n"),
                ("indexer.weights_proj", "indexer.weights_proj", f"{a}.indexer.weights_proj", ih, hidden, 1, "n")]
    return out


def _sharded(engine: str, component: str) -> bool:
    rules = (load_toml("sharding.toml").get(engine) or load_toml("sharding.toml")["sglang"])["components"]
    rule = rules.get(component) or rules.get(component.split(".")[0]) or {"sharding": "sharded"}
    return rule["sharding"] == "sharded"


def _layer_dtype(spec: ModelSpec, component: str, path: str) -> str:
    """"bf16" where the engine runs the layer unquantized, else "quant" (the checkpoint's format)."""
    from profattr.limits.quantization import FP8_BLOCK, runs_unquantized

    quant = (spec.derive_args or {}).get("quantization")
    if runs_unquantized(quant, path):
        return "bf16"
    if quant is None:  # a --quant preset: the format of the component's weights
        dtypes = [g.dtype for g in spec.groups if g.component == component or g.weight_class == component]
        if dtypes and all(d == "bf16" for d in dtypes):
            return "bf16"
    # kv_b_proj in 128x128 FP8 blocks is dequantized to BF16 at load for the absorbed bmm (deepseek_v2.py
    # post_load_weights, CUDA, unless SGL_USE_DEEPGEMM_BMM)
    if path.endswith(".kv_b_proj") and quant is not None and quant.weight_format == FP8_BLOCK and \
            tuple(quant.block or ()) == (128, 128):
        return "bf16"
    return "quant"


def linear_layers(spec: ModelSpec, experts_touched: Optional[int] = None) -> List[Dict[str, Any]]:
    """The decode step's weight GEMMs of an MLA model at the spec's per-rank shapes: name, n, k, launches per step,
    experts (CTA groups per launch: routed experts, or heads of a batched GEMM), dtype ("quant" for the checkpoint's
    format, "bf16" where the engine runs it unquantized), sharded (whether tensor parallelism splits it, from
    specs/sharding.toml), runs (false for the DSA indexer's projections where the engine does not run the indexer).
    Empty for architectures not laid out here."""
    cfg = spec.config or {}
    if not cfg.get("kv_lora_rank") or not cfg.get("q_lora_rank"):
        return []
    tp, layers, hidden = spec.tp, spec.num_layers, int(cfg["hidden_size"])
    engine = (spec.derive_args or {}).get("engine", "sglang")
    dense = min(int(cfg.get("first_k_dense_replace", 0) or 0), layers)
    moe = layers - dense if cfg.get("n_routed_experts") else 0
    dense = layers - moe
    rows = [(*r, layers) for r in _mla_layers(cfg)]
    inter = int(cfg.get("intermediate_size") or 0)
    if dense and inter:
        rows += [("dense_mlp.gate_up", "dense_mlp", "model.layers.0.mlp.gate_proj", 2 * inter, hidden, 1, "n", dense),
                 ("dense_mlp.down", "dense_mlp", "model.layers.0.mlp.down_proj", hidden, inter, 1, "k", dense)]
    if moe:
        mi, m = int(cfg["moe_intermediate_size"]), f"model.layers.{layers - 1}.mlp"
        shared = int(cfg.get("n_shared_experts") or 0)
        # distinct experts a step's batch routes to: at most top_k x batch (dummy weights route every sequence alike)
        touched = experts_touched or min(int(cfg["n_routed_experts"]), int(cfg["num_experts_per_tok"]) * spec.batch)
        if shared:
            rows += [("shared_experts.gate_up", "shared_experts", f"{m}.shared_experts.gate_proj", 2 * mi * shared,
                      hidden, 1, "n", moe),
                     ("shared_experts.down", "shared_experts", f"{m}.shared_experts.down_proj", hidden, mi * shared,
                      1, "k", moe)]
        rows += [("routed_experts.gate_up", "routed_experts", f"{m}.experts.0.gate_proj", 2 * mi, hidden, touched,
                  "n", moe),
                 ("routed_experts.down", "routed_experts", f"{m}.experts.0.down_proj", hidden, mi, touched, "k", moe)]
    if not cfg.get("tie_word_embeddings", False):
        rows.append(("lm_head", "lm_head", "lm_head", int(cfg["vocab_size"]), hidden, 1, "n", 1))
    out = []
    for name, component, path, n, k, experts, split, count in rows:
        sharded = _sharded(engine, component)
        if sharded and split == "n":
            n = -(-n // tp)
        elif sharded and split == "k":
            k = -(-k // tp)
        elif sharded and split == "heads":
            experts = -(-experts // tp)
        # an engine that does not run the DSA indexer (spec.dsa_runs false) runs none of its projections either
        out.append({"name": name, "n": n, "k": k, "count": count, "experts": experts, "sharded": sharded,
                    "dtype": _layer_dtype(spec, component, path),
                    "runs": spec.dsa_runs or not name.startswith("indexer.")})
    return out


def _ctas(layer: Mapping[str, Any], tile: int) -> int:
    return layer["experts"] * math.ceil(layer["n"] / tile)


def _candidates(category: str, layers: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    if category.startswith("moe"):
        return [l for l in layers if l["name"].startswith("routed_experts")]
    want = "bf16" if category.endswith(".bf16") else "quant"
    return [l for l in layers if not l["name"].startswith("routed_experts") and l["dtype"] == want]


def match_shapes(category: str, shapes: Sequence[Mapping[str, Any]], layers: Sequence[Mapping[str, Any]]
                 ) -> Optional[Dict[str, Any]]:
    """{"tile": BLOCK_N, "groups": [[layer names] per shape]} when one tile width explains every launch shape of
    the kernel as layers with that CTA count and launch count (each layer used once), else None."""
    cands = _candidates(category, layers)
    if not cands or len(shapes) < MIN_SHAPES:
        return None
    for tile in TILE_WIDTHS:
        used: set = set()
        groups = []
        for s in shapes:
            g = s["shape"]["grid"]
            ctas = int(g[0]) * int(g[1]) * int(g[2])
            pool = [l for l in cands if l["name"] not in used and _ctas(l, tile) == ctas]
            pick = None
            for r in range(1, len(pool) + 1):
                for combo in itertools.combinations(pool, r):
                    if abs(sum(l["count"] for l in combo) - float(s["count_per_step"])) < 1e-6:
                        pick = combo
                        break
                if pick:
                    break
            if not pick:
                break
            used |= {l["name"] for l in pick}
            groups.append([l["name"] for l in pick])
        else:
            return {"tile": tile, "groups": groups}
    return None


def _engine_config(kernel: str, spec: ModelSpec, hardware: str, engine: str) -> Optional[Dict[str, Any]]:
    """The config the engine runs `kernel` with at the spec's per-rank shapes on `hardware` (engine_configs.toml):
    {block_n, block_k, num_stages, tuned, source}; None where the table knows nothing of the kernel."""
    table = (load_toml("engine_configs.toml").get(engine) or {}).get(kernel)
    cfg = spec.config or {}
    block = ((cfg.get("quantization_config") or {}).get("weight_block_size"))
    if not table or not block or (cfg.get("quantization_config") or {}).get("quant_method") != "fp8":
        return None
    n = int(cfg.get("moe_intermediate_size") or 0) // spec.tp
    for entry in table.get("tuned", []):
        if (entry["hardware"], entry["experts"], entry["n"], list(entry["block_shape"])) == (
                hardware, int(cfg.get("n_routed_experts") or 0), n, list(block)):
            key = min(entry["configs"], key=lambda m: abs(int(m) - spec.batch))
            bn, bk, stages = entry["configs"][key]
            return {"block_n": bn, "block_k": bk, "num_stages": stages, "tuned": True, "source": entry["source"]}
    default = table["default"]
    return {"block_n": block[0], "block_k": block[1], "num_stages": default["num_stages"], "tuned": False,
            "source": default["source"]}


def target_config(kernel: str, source: ModelSpec, target: ModelSpec, src_hw: str, dst_hw: str,
                  engine: str = "sglang") -> Optional[Dict[str, Any]]:
    """The target's tile width and the change of one CTA's weight bytes in flight where the engine runs the kernel
    with another config at the target's key than at the source's: {tile_n, inflight_ratio, source}; else None."""
    s, t = _engine_config(kernel, source, src_hw, engine), _engine_config(kernel, target, dst_hw, engine)
    if not s or not t or all(s[k] == t[k] for k in ("block_n", "block_k", "num_stages")):
        return None
    inflight = {k: (c["num_stages"] - 1) * c["block_n"] * c["block_k"] for k, c in (("s", s), ("t", t))}
    return {"tile_n": t["block_n"], "inflight_ratio": inflight["t"] / inflight["s"], "source": t["source"]}


def weight_bytes(layer: Mapping[str, Any], bytes_per_param: float) -> float:
    return layer["n"] * layer["k"] * layer["experts"] * bytes_per_param


def launch_us(w_bytes: float, ctas: int, sms: int, t0_us: float, rate_cta: float, bw_agg: float) -> float:
    """The model's time of one launch (us): latency floor plus the binding roof (rate_cta: one CTA's bytes/s)."""
    waves = math.ceil(ctas / sms)
    per_cta = w_bytes / ctas * waves / rate_cta if rate_cta > 0 else 0.0
    return t0_us + max(per_cta, w_bytes / bw_agg if bw_agg > 0 else 0.0) * 1e6


def target_roofs(rate_cta: float, bw_agg: float, clock_source_hz: float, clock_target_hz: float,
                 bw_source: float, bw_target: float) -> Dict[str, float]:
    """The roofs on another GPU: one CTA's rate x the SM clock ratio (Little's law, latency in SM cycles equal),
    the DRAM roof x the DRAM bandwidth ratio."""
    clock = clock_target_hz / clock_source_hz if clock_source_hz > 0 and clock_target_hz > 0 else 1.0
    return {"rate_cta": rate_cta * clock, "bw_agg": bw_agg * (bw_target / bw_source if bw_source > 0 else 1.0)}


def fit_family(groups: Sequence[Mapping[str, Any]], sms: int, t0_us: float) -> Dict[str, Optional[float]]:
    """Roofs of one matched family from its source groups ({ctas, mean_us, layers: [(count, bytes)]}): rate_cta
    (one CTA's bytes/s) and bw_agg (bytes/s of the launch with the most bytes), None where no shape gives one."""
    per_cta = []
    for g in groups:
        n = sum(c for c, _ in g["layers"])
        busy_s = (g["mean_us"] - t0_us) * 1e-6
        if g["ctas"] <= PER_CTA_SHARE * sms and busy_s > 0:
            cta_bytes = sum(c * w for c, w in g["layers"]) / n / g["ctas"] * math.ceil(g["ctas"] / sms)
            per_cta.append(cta_bytes / busy_s)
    big = max(groups, key=lambda g: sum(c * w for c, w in g["layers"]) / sum(c for c, _ in g["layers"]))
    n_big = sum(c for c, _ in big["layers"])
    busy = (big["mean_us"] - t0_us) * 1e-6
    bw_agg = sum(c * w for c, w in big["layers"]) / n_big / busy if busy > 0 else None
    per_cta.sort()
    rate_cta = per_cta[len(per_cta) // 2] if per_cta else None
    return {"rate_cta": rate_cta, "bw_agg": bw_agg}
