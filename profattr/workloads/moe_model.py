"""The decode workload's model (moe_decode.py): sizes and presets, the Qwen3-MoE-like decoder with its three expert
implementations (per-expert loop, gathered bmm, torch._grouped_mm), the greedy sampler and exact parameter counts.
Seeded random weights, nothing downloaded; torch is imported lazily (`--help` and the metadata helpers work
without it)."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

try:
    from profattr.errors import ProfattrError
except ImportError:  # GPU hosts may run this file without click installed

    class ProfattrError(Exception):  # type: ignore[no-redef]
        """What is wrong and what to do, in one line."""


SCHEMA = "profattr.workload/1"
STEP_RANGE = "decode_step"
CAPTURE_RANGE = "graph_capture"
MODULE_PREFIX = "model"  # SGLang registers its hooks with module_prefix="model"
SAMPLER_NAME = "sampler"
MOE_IMPLS = ("loop", "grouped")
GROUPED_KERNELS = ("auto", "grouped_mm", "bmm")
NVTX_FORMATS = ("sglang", "path", "off")
SDPA_BACKENDS = ("auto", "efficient", "cudnn", "math")
DEFAULT_TIMED_TRIALS = 5


@dataclass(frozen=True)
class ModelConfig:
    """Model sizes. `moe_intermediate_size` is one expert's SwiGLU width; `context_len` the KV cache length."""

    hidden_size: int = 2048
    num_layers: int = 8
    num_experts: int = 32
    top_k: int = 4
    moe_intermediate_size: int = 256
    num_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 32000
    context_len: int = 1024
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6


# default: about 0.62 G parameters (1.24 GB in bf16), about 0.20 G read per token; tiny: for CPU tests
PRESETS = {
    "default": ModelConfig(),
    "tiny": ModelConfig(hidden_size=64, num_layers=2, num_experts=8, top_k=2, moe_intermediate_size=32,
                        num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256, context_len=64),
}


# CLI flag of every size field (validation messages name the flag the user typed)
SIZE_FLAGS = {"hidden_size": "--hidden-size", "num_layers": "--layers", "num_experts": "--experts",
              "top_k": "--top-k", "moe_intermediate_size": "--moe-intermediate-size", "num_heads": "--heads",
              "num_kv_heads": "--kv-heads", "head_dim": "--head-dim", "vocab_size": "--vocab-size",
              "context_len": "--context-len", "rope_theta": "--rope-theta"}


def validate_config(cfg: ModelConfig, tp: int = 1) -> None:
    """Raise ProfattrError when the sizes cannot build a model split over `tp` ranks."""
    for name, flag in SIZE_FLAGS.items():
        if name != "rope_theta" and getattr(cfg, name) < 1:
            raise ProfattrError(f"{flag} must be >= 1; got {getattr(cfg, name)}")
    if cfg.rope_theta <= 0:
        raise ProfattrError(f"--rope-theta must be > 0; got {cfg.rope_theta}")
    if cfg.top_k > cfg.num_experts:
        raise ProfattrError(f"--top-k ({cfg.top_k}) must not exceed --experts ({cfg.num_experts})")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ProfattrError(f"--heads ({cfg.num_heads}) must be a multiple of --kv-heads ({cfg.num_kv_heads})")
    if cfg.head_dim % 2:
        raise ProfattrError(f"--head-dim must be even for the rotary embedding; got {cfg.head_dim}")
    if cfg.context_len < 2:
        raise ProfattrError(f"--context-len must be >= 2; got {cfg.context_len}")
    for name in ("num_heads", "num_kv_heads", "moe_intermediate_size"):
        if getattr(cfg, name) % tp:
            raise ProfattrError(f"{SIZE_FLAGS[name]} ({getattr(cfg, name)}) must be divisible by the "
                                f"tensor-parallel size {tp}; choose sizes that split evenly")


# --------------------------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------------------------

def _torch():
    import torch  # imported lazily so that `--help` and metadata helpers work without torch

    return torch


class _Dist:
    """Tensor-parallel context of this process: rank, size and the all-reduce used after o_proj and the MoE block."""

    def __init__(self, rank: int = 0, size: int = 1):
        self.rank = rank
        self.size = size
        self._all_reduce = None
        if size > 1:
            import torch.distributed as dist

            self._all_reduce = dist.all_reduce

    def all_reduce(self, t):
        """Sum `t` over the ranks in place (nothing with one rank); returns `t`."""
        if self._all_reduce is not None:
            self._all_reduce(t)
        return t


def _seeded_randn(shape, name: str, seed: int, device, std: float):
    """Float32 normal tensor, the same for a given (seed, name, shape) whatever the order of creation or rank."""
    torch = _torch()
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std


def _param(t, component: str, sharded: bool):
    """Frozen parameter tagged with its component (for the counts) and whether it is split over TP ranks."""
    torch = _torch()
    p = torch.nn.Parameter(t.contiguous(), requires_grad=False)
    p.profattr_component = component
    p.profattr_sharded = sharded
    return p


def experts_loop(x, w13, w2, topk_weights, topk_ids, expert_ids=None):
    """Per-expert loop: gate, up and down GEMMs of every expert on every token, scaled by the token's routing
    weight for that expert (0 when not chosen), so shapes are static and nothing waits for the host.
    x [n, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/topk_ids [n, k] -> [n, H]."""
    torch = _torch()
    F = torch.nn.functional
    n, num_experts, inter = x.shape[0], w13.shape[0], w2.shape[2]
    route = torch.zeros((n, num_experts), device=x.device, dtype=x.dtype).scatter_(1, topk_ids, topk_weights)
    out = torch.zeros_like(x)
    for e in range(num_experts):
        gate = F.linear(x, w13[e, :inter])
        up = F.linear(x, w13[e, inter:])
        out.addcmul_(F.linear(F.silu(gate) * up, w2[e]), route[:, e:e + 1])
    return out


def experts_bmm(x, w13, w2, topk_weights, topk_ids, expert_ids=None):
    """Grouped by gathering: the chosen experts' weights gathered with one index op per matrix, then two bmm over
    the n*k (token, slot) pairs and a weighted sum over the slots. Same arguments as experts_loop."""
    torch = _torch()
    F = torch.nn.functional
    n, k, hidden = x.shape[0], topk_ids.shape[1], x.shape[1]
    flat_ids = topk_ids.reshape(-1)  # token-major: row t*k + j is token t's j-th choice
    w13_sel = w13.index_select(0, flat_ids)  # [n*k, 2I, H]
    w2_sel = w2.index_select(0, flat_ids)  # [n*k, H, I]
    xk = x.unsqueeze(1).expand(n, k, hidden).reshape(n * k, 1, hidden)
    gate, up = torch.bmm(xk, w13_sel.transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, w2_sel.transpose(1, 2))  # [n*k, 1, H]
    return (y.view(n, k, hidden) * topk_weights.unsqueeze(-1)).sum(dim=1)


def experts_grouped_mm(x, w13, w2, topk_weights, topk_ids, expert_ids=None):
    """Grouped GEMM: the (token, slot) rows sorted by expert, one torch._grouped_mm for gate|up and one for down
    (each expert reads only its own rows), rows put back in token order, weighted sum over the slots.
    `expert_ids` = arange(E) on the device (made here when not given). Same arguments as experts_loop."""
    torch = _torch()
    F = torch.nn.functional
    n, k, hidden = x.shape[0], topk_ids.shape[1], x.shape[1]
    if expert_ids is None:
        expert_ids = torch.arange(w13.shape[0], device=x.device)
    flat_ids = topk_ids.reshape(-1)
    sorted_ids, order = torch.sort(flat_ids, stable=True)
    # end offset of every expert's rows in the sorted order, computed on the device (no host sync)
    offs = torch.searchsorted(sorted_ids, expert_ids, right=True, out_int32=True)
    xs = x.index_select(0, torch.div(order, k, rounding_mode="floor"))
    gate, up = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
    ys = torch._grouped_mm((F.silu(gate) * up).contiguous(), w2.transpose(-2, -1), offs=offs)
    y = torch.empty((n * k, hidden), device=x.device, dtype=x.dtype).index_copy_(0, order, ys)
    return (y.view(n, k, hidden) * topk_weights.unsqueeze(-1)).sum(dim=1)


EXPERT_KERNELS = {"loop": experts_loop, "bmm": experts_bmm, "grouped_mm": experts_grouped_mm}


def build_model(cfg: ModelConfig, device="cpu", dtype=None, moe_impl: str = "grouped", grouped_kernel: str = "bmm",
                batch: int = 1, seed: int = 0, dist: _Dist | None = None):
    """The decoder (a torch.nn.Module: forward(tokens [B], positions [B]) -> logits [B, vocab]) for `batch`
    sequences, with this rank's shard of every weight. `grouped_kernel` is 'grouped_mm' or 'bmm' (resolved)."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional
    dtype = dtype or torch.float32
    dist = dist or _Dist()
    tp, rank = dist.size, dist.rank
    validate_config(cfg, tp)
    if moe_impl not in MOE_IMPLS:
        raise ProfattrError(f"--moe-impl must be one of {', '.join(MOE_IMPLS)}; got {moe_impl!r}")
    if grouped_kernel not in ("grouped_mm", "bmm"):
        raise ProfattrError(f"grouped kernel must be grouped_mm or bmm; got {grouped_kernel!r}")
    H, D, T = cfg.hidden_size, cfg.head_dim, cfg.context_len
    hq, hkv = cfg.num_heads // tp, cfg.num_kv_heads // tp  # heads of this rank
    group = cfg.num_heads // cfg.num_kv_heads
    E, K = cfg.num_experts, cfg.top_k

    def weight(name, shape, fan_in):
        return _seeded_randn(shape, name, seed, device, 1.0 / math.sqrt(fan_in))

    def shard(t, dim, parts):
        size = t.shape[dim] // parts
        return t.narrow(dim, rank * size, size)

    class Linear(nn.Module):
        def __init__(self, w, component, sharded, reduce=False):
            super().__init__()
            self.weight = _param(w.to(dtype), component, sharded)
            self.reduce = reduce

        def forward(self, x):
            y = F.linear(x, self.weight)
            return dist.all_reduce(y) if self.reduce else y

    class Embedding(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = _param(w.to(dtype), "embedding", False)

        def forward(self, tokens):
            return F.embedding(tokens, self.weight)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = _param(torch.ones(H, device=device, dtype=dtype), "norms", False)
            self.eps = cfg.rms_norm_eps

        def forward(self, x):
            return F.rms_norm(x, (H,), self.weight, self.eps)

    class RotaryEmbedding(nn.Module):
        """Rotate-half (NeoX) rotary embedding; cos|sin per position precomputed for the whole cache length."""

        def __init__(self):
            super().__init__()
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
            angles = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
            self.register_buffer("cos_sin_cache", torch.cat([angles.cos(), angles.sin()], -1).to(dtype),
                                 persistent=False)

        def forward(self, positions, q, k):
            cos, sin = self.cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

        @staticmethod
        def _rotate(x, cos, sin):
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class DecodeAttention(nn.Module):
        """Writes this step's K and V at each sequence's position, then attends over the whole cache (static
        shape) with the additive mask; GQA as `group` queries per KV head."""

        def __init__(self):
            super().__init__()
            shape = (batch, hkv, T, D)
            self.register_buffer("k_cache", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
            self.register_buffer("v_cache", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

        def forward(self, q, k, v, positions, attn_bias):
            idx = positions.view(batch, 1, 1, 1).expand(batch, hkv, 1, D)
            self.k_cache.scatter_(2, idx, k.reshape(batch, hkv, 1, D))
            self.v_cache.scatter_(2, idx, v.reshape(batch, hkv, 1, D))
            out = F.scaled_dot_product_attention(q.reshape(batch, hkv, group, D), self.k_cache, self.v_cache,
                                                 attn_mask=attn_bias)
            return out.reshape(batch, hq * D)

    class Attention(nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}.self_attn"
            wq = shard(weight(f"{p}.q", (cfg.num_heads * D, H), H), 0, tp)
            wk = shard(weight(f"{p}.k", (cfg.num_kv_heads * D, H), H), 0, tp)
            wv = shard(weight(f"{p}.v", (cfg.num_kv_heads * D, H), H), 0, tp)
            self.qkv_proj = Linear(torch.cat([wq, wk, wv], 0), "attention", True)
            self.rotary_emb = RotaryEmbedding()
            self.attn = DecodeAttention()
            wo = shard(weight(f"{p}.o", (H, cfg.num_heads * D), cfg.num_heads * D), 1, tp)
            self.o_proj = Linear(wo, "attention", True, reduce=True)

        def forward(self, x, positions, attn_bias):
            q, k, v = self.qkv_proj(x).split([hq * D, hkv * D, hkv * D], dim=-1)
            q, k = self.rotary_emb(positions, q.reshape(batch, hq, D), k.reshape(batch, hkv, D))
            return self.o_proj(self.attn(q, k, v, positions, attn_bias))

    class TopK(nn.Module):
        def forward(self, router_logits):
            probs = torch.softmax(router_logits.float(), dim=-1)
            topk_weights, topk_ids = torch.topk(probs, K, dim=-1)
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
            return topk_weights.to(dtype), topk_ids

    class Experts(nn.Module):
        """E SwiGLU experts: w13_weight [E, 2*I, H] (gate rows, then up rows), w2_weight [E, H, I]."""

        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}.mlp.experts"
            full = cfg.moe_intermediate_size
            gate = shard(weight(f"{p}.gate", (E, full, H), H), 1, tp)
            up = shard(weight(f"{p}.up", (E, full, H), H), 1, tp)
            self.w13_weight = _param(torch.cat([gate, up], 1).to(dtype), "experts", True)
            self.w2_weight = _param(shard(weight(f"{p}.down", (E, H, full), full), 2, tp).to(dtype),
                                    "experts", True)
            self.register_buffer("expert_ids", torch.arange(E, device=device), persistent=False)
            self.impl = EXPERT_KERNELS["loop" if moe_impl == "loop" else grouped_kernel]

        def forward(self, x, topk_weights, topk_ids):
            return self.impl(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, self.expert_ids)

    class SparseMoeBlock(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.gate = Linear(weight(f"layers.{i}.mlp.gate", (E, H), H), "router", False)
            self.topk = TopK()
            self.experts = Experts(i)

        def forward(self, x):
            topk_weights, topk_ids = self.topk(self.gate(x))
            return dist.all_reduce(self.experts(x, topk_weights, topk_ids))

    class DecoderLayer(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention(i)
            self.post_attention_layernorm = RMSNorm()
            self.mlp = SparseMoeBlock(i)

        def forward(self, x, positions, attn_bias):
            x = x + self.self_attn(self.input_layernorm(x), positions, attn_bias)
            return x + self.mlp(self.post_attention_layernorm(x))

    class MoeModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = Embedding(_seeded_randn((cfg.vocab_size, H), "embed_tokens", seed, device, 1.0))
            self.layers = nn.ModuleList([DecoderLayer(i) for i in range(cfg.num_layers)])
            self.norm = RMSNorm()
            self.register_buffer("key_positions", torch.arange(T, device=device), persistent=False)

        def forward(self, tokens, positions):
            # additive mask over the whole cache: 0 where key position <= the sequence's position, else -inf;
            # materialised in the SDPA shape once per step so no layer has to expand or pad it
            visible = self.key_positions.unsqueeze(0) <= positions.unsqueeze(1)
            bias = torch.zeros((batch, T), device=device, dtype=dtype).masked_fill_(~visible, float("-inf"))
            bias = bias.view(batch, 1, 1, T).expand(batch, hkv, group, T).contiguous()
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                x = layer(x, positions, bias)
            return self.norm(x)

    class MoeForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = MoeModel()
            self.lm_head = Linear(weight("lm_head", (cfg.vocab_size, H), H), "lm_head", False)

        def forward(self, tokens, positions):
            return self.lm_head(self.model(tokens, positions))

    model = MoeForCausalLM()
    model.config = cfg
    model.tp = tp
    model.moe_kernel = "loop" if moe_impl == "loop" else grouped_kernel
    return model


def make_sampler():
    """Greedy sampling as a module (so it gets an NVTX range): logits [B, V] -> token ids [B]."""
    torch = _torch()

    class GreedySampler(torch.nn.Module):
        def forward(self, logits):
            return torch.argmax(logits, dim=-1)

    return GreedySampler()


# --------------------------------------------------------------------------------------------------------------
# parameter counts
# --------------------------------------------------------------------------------------------------------------

def count_params(model) -> dict:
    """Exact parameter counts from the model's own tensors.

    Returns {total, active_per_token, per_rank_active, by_component: {embedding, embedding_active_per_token,
    attention, norms, router, experts_total, experts_active_per_token, lm_head}}. Counts are of the whole model
    (a tensor split over TP ranks counts tp times its shard); `per_rank_active` is what one rank reads per token.
    Active per token: one embedding row, all attention, norm, router and lm_head weights, top-k of the experts.
    """
    cfg, tp = model.config, model.tp
    full = {c: 0 for c in ("embedding", "attention", "norms", "router", "experts", "lm_head")}
    local = dict(full)
    embedding_row = 0
    for p in model.parameters():
        comp = p.profattr_component
        local[comp] += p.numel()
        full[comp] += p.numel() * (tp if p.profattr_sharded else 1)
        if comp == "embedding":
            embedding_row = p.shape[1]  # a token reads one row

    def active(counts):
        # every expert has the same size, so top_k of them are exactly top_k / num_experts of the experts' weights
        experts_active = counts["experts"] // cfg.num_experts * cfg.top_k
        return (embedding_row + counts["attention"] + counts["norms"] + counts["router"] + experts_active
                + counts["lm_head"]), experts_active

    active_per_token, experts_active = active(full)
    per_rank_active, _ = active(local)
    return {
        "total": sum(full.values()),
        "active_per_token": active_per_token,
        "per_rank_active": per_rank_active,
        "by_component": {
            "embedding": full["embedding"],
            "embedding_active_per_token": embedding_row,
            "attention": full["attention"],
            "norms": full["norms"],
            "router": full["router"],
            "experts_total": full["experts"],
            "experts_active_per_token": experts_active,
            "lm_head": full["lm_head"],
        },
    }


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype_bytes: int) -> int:
    """Bytes of K and V that one token of context occupies, all layers and KV heads of the whole model."""
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


