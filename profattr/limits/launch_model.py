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


def linear_layers(spec: ModelSpec, experts_touched: Optional[int] = None) -> List[Dict[str, Any]]:
    """The decode step's weight GEMMs of an MLA model at the spec's per-rank shapes: name, n, k, launches per step,
    experts (CTA groups per launch), dtype ("quant" for the checkpoint's format, "bf16" where the engine keeps it
    unquantized). Empty for architectures not laid out here."""
    cfg = spec.config or {}
    if not cfg.get("kv_lora_rank") or not cfg.get("q_lora_rank"):
        return []
    tp, layers, hidden = spec.tp, spec.num_layers, int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"]) // tp
    nope, rope, v = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
    q_lora, kv_lora = int(cfg["q_lora_rank"]), int(cfg["kv_lora_rank"])
    dense = min(int(cfg.get("first_k_dense_replace", 0) or 0), layers)
    moe = layers - dense if cfg.get("n_routed_experts") else 0
    dense = layers - moe
    out = [("attention.qkv_a", q_lora + kv_lora + rope, hidden, layers, 1, "quant"),
           ("attention.q_b_proj", heads * (nope + rope), q_lora, layers, 1, "quant"),
           ("attention.o_proj", hidden, heads * v, layers, 1, "quant")]
    if cfg.get("index_n_heads"):
        ih, idim = int(cfg["index_n_heads"]), int(cfg["index_head_dim"])
        out += [("indexer.wq_b", ih * idim, q_lora, layers, 1, "quant"), ("indexer.wk", idim, hidden, layers, 1, "quant"),
                ("indexer.weights_proj", ih, hidden, layers, 1, "bf16")]
    inter = int(cfg.get("intermediate_size") or 0) // tp
    if dense and inter:
        out += [("dense_mlp.gate_up", 2 * inter, hidden, dense, 1, "quant"),
                ("dense_mlp.down", hidden, inter, dense, 1, "quant")]
    if moe:
        mi = int(cfg["moe_intermediate_size"]) // tp
        shared = int(cfg.get("n_shared_experts") or 0)
        # distinct experts a step's batch routes to: at most top_k x batch (dummy weights route every sequence alike)
        touched = experts_touched or min(int(cfg["n_routed_experts"]), int(cfg["num_experts_per_tok"]) * spec.batch)
        if shared:
            out += [("shared_experts.gate_up", 2 * mi * shared, hidden, moe, 1, "quant"),
                    ("shared_experts.down", hidden, mi * shared, moe, 1, "quant")]
        out += [("routed_experts.gate_up", 2 * mi, hidden, moe, touched, "quant"),
                ("routed_experts.down", hidden, mi, moe, touched, "quant")]
    return [{"name": n, "n": nn, "k": k, "count": c, "experts": e, "dtype": d} for n, nn, k, c, e, d in out]


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
