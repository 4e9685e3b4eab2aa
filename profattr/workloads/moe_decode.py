"""A small Mixture-of-Experts decoder that decodes greedily, for real Nsight Systems captures of decode.

    python -m profattr.workloads.moe_decode [--preset default|tiny] [--moe-impl loop|grouped]
        [--mode eager|graph] [--graph-window after|before] [--batch B] [--steps N] [--meta-out PATH] ...
    torchrun --nproc-per-node 2 -m profattr.workloads.moe_decode ...     (tensor parallel over 2 GPUs)

Model (Qwen3-MoE-like, deterministic seeded random weights, nothing downloaded, no torch.compile): token embedding;
per layer RMSNorm -> attention (fused QKV projection, rotary embedding, write into a preallocated KV cache, decode
attention over the whole cache with torch SDPA and an additive mask built from a position tensor, GQA) -> o_proj
-> residual -> RMSNorm -> MoE block (router linear, softmax, top-k, renormalise, SwiGLU experts, weighted combine)
-> residual; final RMSNorm, lm_head, greedy argmax; the next token and position are written back into the step's
own input buffers, so one decode step has static shapes, never synchronises with the host and can be captured
into a CUDA graph. Weights are bf16 on CUDA and float32 on CPU unless `--dtype` says otherwise.

MoE implementations (`--moe-impl`):
- `loop`: one iteration per expert, each running its own gate, up and down GEMMs plus SiLU, multiply and a
  weighted accumulate (6 kernels per expert and layer). To stay capturable (static shapes, no host sync) every
  expert runs on every token of the batch, and tokens not routed to it get weight 0: the loop reads all experts'
  weights each step (`moe_reads_all_experts` in the metadata).
- `grouped`: few large kernels. `torch._grouped_mm` over the tokens sorted by expert where it has a fast CUDA path
  (bf16 on SM90/SM100, checked against a reference at start-up), else the chosen experts' weights gathered with one
  index op and two `torch.bmm`. `--grouped-kernel` forces either; the metadata says which one ran (`moe_kernel`).

NVTX (CUDA only; no-ops on CPU). Every decode step is one range `decode_step`; in graph mode the capture itself is
inside a range `graph_capture`. Per module, ranges follow SGLang's layerwise NVTX markers
(`--enable-layerwise-nvtx-marker`: sglang python/sglang/srt/utils/nvtx_pytorch_hooks.py, registered in
python/sglang/srt/model_executor/model_runner.py with `module_prefix="model"`): forward pre/post hooks on every
module, named by its path from `named_modules(prefix="model")`, whose message is the text of a dict, e.g.
`{'Module': 'model.model.layers.3.mlp.gate', 'TrainableParams': {'weight': [32, 2048]}, 'Inputs': [[1, 2048]]}`
(`--nvtx-format sglang`, the default), or just the path (`--nvtx-format path`), or none (`--nvtx-format off`).
The module paths, outermost first (N = layer index):

    model                                      whole forward (embedding to logits)
    model.model                                decoder stack (also builds the attention mask once per step)
    model.model.embed_tokens
    model.model.layers.N
    model.model.layers.N.input_layernorm
    model.model.layers.N.self_attn
    model.model.layers.N.self_attn.qkv_proj
    model.model.layers.N.self_attn.rotary_emb
    model.model.layers.N.self_attn.attn        KV cache write + SDPA
    model.model.layers.N.self_attn.o_proj      includes the tensor-parallel all-reduce
    model.model.layers.N.post_attention_layernorm
    model.model.layers.N.mlp                   MoE block; its tensor-parallel all-reduce follows mlp.experts
    model.model.layers.N.mlp.gate              router linear
    model.model.layers.N.mlp.topk              softmax, top-k, renormalise
    model.model.layers.N.mlp.experts
    model.model.norm
    model.lm_head
    sampler                                    greedy argmax (SGLang samples outside the model)

As in SGLang, ranges opened while a CUDA graph is captured are recorded only at capture time, not at replay:
`--mode graph --graph-window before` opens the profiler window before the capture so that they are recorded.

Run order: warm-up (`--warmup-steps` eager steps; in graph mode then 3 more on the capture stream, the capture and
`--warmup-steps` replays), then ms per decode step measured WITHOUT the profiler window (`--timed-trials` x
`--timed-steps`, CUDA events), then cudaProfilerStart, `--steps` decode steps, cudaProfilerStop (profiler calls only
on CUDA). With `--graph-window before` the timing uses a first graph; it is released and a second one is captured
inside the window. Before a real capture, SDPA and torch._grouped_mm are test-captured on their own: `auto` falls
back (SDPA to efficient then math, experts to bmm) when one cannot be captured, and the metadata says so.
On CPU, graph mode is emulated (the step is called instead of replayed) so that its control flow can be tested.

Tensor parallel (launched by torchrun, WORLD_SIZE > 1): attention heads and expert intermediate dims are split
over ranks, all-reduce after o_proj and after the MoE block; embedding, router and lm_head are replicated. NCCL
on CUDA (device cuda:LOCAL_RANK), gloo on CPU. Only rank 0 prints and writes `--meta-out`.

Metadata (`--meta-out`, schema `profattr.workload/1`): config, implementation, mode, dtype, device, exact
parameter counts from the model's tensors (`params`), KV cache bytes, ms per token without the profiler.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace

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


# --------------------------------------------------------------------------------------------------------------
# NVTX
# --------------------------------------------------------------------------------------------------------------

class Nvtx:
    """push/pop of NVTX ranges: torch.cuda.nvtx on CUDA (proven to be recorded by nsys), no-ops elsewhere.
    Tests may pass their own push/pop to see the names."""

    def __init__(self, enabled: bool, push=None, pop=None):
        if push is not None:
            self.push, self.pop = push, pop
        elif enabled:
            torch = _torch()
            self.push, self.pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        else:
            self.push = self.pop = _noop

    @contextlib.contextmanager
    def range(self, name: str):
        self.push(name)
        try:
            yield
        finally:
            self.pop()


def _noop(*_args):
    return None


def _shapes(obj, out: list) -> list:
    torch = _torch()
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _shapes(item, out)
    elif isinstance(obj, torch.Tensor):
        out.append(list(obj.shape))
    return out


def module_range_message(fmt: str, name: str, module, args) -> str:
    """NVTX text for one module call: the module path, or SGLang's dict text
    {'Module': path, 'TrainableParams': {name: shape} (own parameters, if any), 'Inputs': [shape, ...]}."""
    if fmt == "path":
        return name
    marker = {"Module": name}
    own = {pname: list(p.shape) for pname, p in module.named_parameters(recurse=False)}
    if own:
        marker["TrainableParams"] = own
    inputs = _shapes(args, [])
    if inputs:
        marker["Inputs"] = inputs
    return str(marker)


def register_layerwise_ranges(model, sampler, nvtx: Nvtx, fmt: str) -> list:
    """Forward pre/post hooks that open and close one NVTX range per module call; returns the hook handles."""
    if fmt == "off":
        return []
    named = list(model.named_modules(prefix=MODULE_PREFIX)) + [(SAMPLER_NAME, sampler)]
    handles = []
    for name, module in named:
        def pre(mod, args, _name=name):
            nvtx.push(module_range_message(fmt, _name, mod, args))

        def post(mod, args, output):
            nvtx.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles


# --------------------------------------------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------------------------------------------

class Decoder:
    """Static input/output buffers and one decode step that feeds its own output back.

    `tokens` [B] and `positions` [B] are read by the step; the step writes the argmax token into `tokens` and
    advances `positions` (wrapping at the cache length, where the static-shape attention costs the same), so
    eager steps and CUDA graph replays run the same code. `logits` holds the last step's logits."""

    def __init__(self, model, sampler, batch: int, seed: int = 0):
        torch = _torch()
        cfg = model.config
        device = model.lm_head.weight.device
        self.model, self.sampler, self.context_len = model, sampler, cfg.context_len
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed + 7)
        first = torch.randint(cfg.vocab_size, (batch,), generator=gen)  # one prompt token per sequence
        self.tokens = first.to(device)
        self.positions = torch.zeros(batch, dtype=torch.int64, device=device)
        self.logits = None

    def step(self):
        logits = self.model(self.tokens, self.positions)
        self.tokens.copy_(self.sampler(logits))
        self.positions.add_(1).remainder_(self.context_len)
        self.logits = logits
        return logits


class StepGraph:
    """One decode step captured into a torch.cuda.CUDAGraph and replayed; on CPU an emulation that only calls the
    step (so the graph-mode control flow runs in CPU tests)."""

    def __init__(self, step, cuda: bool, nvtx: Nvtx, stream=None):
        self.step, self.cuda, self.nvtx, self.stream = step, cuda, nvtx, stream
        self.graph = None

    def capture(self) -> None:
        torch = _torch()
        with self.nvtx.range(CAPTURE_RANGE):
            if not self.cuda:
                self.graph = "emulated"
                return
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: only this thread's unsafe CUDA calls abort the capture, not e.g. NCCL's watchdog
            with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
                self.step()

    def replay(self) -> None:
        if self.cuda:
            self.graph.replay()
        else:
            self.step()

    def release(self) -> None:
        if self.cuda and self.graph is not None:
            self.graph.reset()
        self.graph = None


# --------------------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------------------

def _set_parallel_env() -> None:
    """NVLink multicast (NVLS) off unless the user chose otherwise: it is not available on every host."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def _init_distributed(use_cuda: bool) -> tuple:
    """(Dist, local_rank); initialises torch.distributed when launched by torchrun with WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist(), 0
    _set_parallel_env()  # before NCCL reads its environment
    torch = _torch()
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ProfattrError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices; "
                                f"launch at most that many processes per node")
        torch.cuda.set_device(local_rank)
        try:
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        except TypeError:  # torch < 2.3 has no device_id
            dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return _Dist(dist.get_rank(), dist.get_world_size()), local_rank


def _grouped_mm_fast_path(device, dtype) -> bool:
    """torch._grouped_mm has a capturable fast path only for bf16 on SM90/SM100 (elsewhere it syncs per group)."""
    torch = _torch()
    return (device.type == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(device)[0] in (9, 10))


TOLERANCE = 5e-2  # relative error (max abs / max abs) accepted for bf16 results against a float32 reference


def _relative_error(got, want) -> float:
    return (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)


def _capture_problem(fn, want, device) -> str | None:
    """None when `fn()` (no arguments, returns a tensor) can be captured into a CUDA graph and its replay
    reproduces `want`; else what went wrong. Used before the real capture, so a failure there stays a choice."""
    torch = _torch()
    stream = torch.cuda.Stream(device)
    graph = torch.cuda.CUDAGraph()
    try:
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # warm the capture stream
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            out = fn()
        graph.replay()
        torch.cuda.synchronize(device)
        err = _relative_error(out, want)
        return None if err < TOLERANCE else f"graph replay differs from eager (relative error {err:.3g})"
    except Exception as exc:
        return _first_line(exc)
    finally:
        try:
            graph.reset()
        except Exception:
            pass


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _probe_grouped_mm(device, dtype, cfg: ModelConfig, tp: int, capture: bool) -> str | None:
    """None when experts_grouped_mm, at this model's expert sizes and with empty groups, matches experts_bmm on
    this device (and, with `capture`, also in a CUDA graph replay); else why not."""
    torch = _torch()
    hidden, inter, num_experts, k = cfg.hidden_size, cfg.moe_intermediate_size // tp, cfg.num_experts, cfg.top_k
    if hidden % 8 or inter % 8:
        return f"hidden ({hidden}) and per-rank expert width ({inter}) must be multiples of 8 for torch._grouped_mm"
    try:
        gen = torch.Generator(device=device)
        gen.manual_seed(1)
        n = 3  # a few tokens: most experts get no rows, which the kernel must handle
        x = torch.randn((n, hidden), generator=gen, device=device).to(dtype)
        w13 = (torch.randn((num_experts, 2 * inter, hidden), generator=gen, device=device) / hidden ** 0.5).to(dtype)
        w2 = (torch.randn((num_experts, hidden, inter), generator=gen, device=device) / inter ** 0.5).to(dtype)
        probs = torch.rand((n, num_experts), generator=gen, device=device)
        topk_weights, topk_ids = torch.topk(probs, k, dim=-1)
        topk_weights = (topk_weights / topk_weights.sum(-1, keepdim=True)).to(dtype)
        want = experts_bmm(x.float(), w13.float(), w2.float(), topk_weights.float(), topk_ids)
        got = experts_grouped_mm(x, w13, w2, topk_weights, topk_ids)
        torch.cuda.synchronize(device)
        err = _relative_error(got, want)
        if err >= TOLERANCE:
            return f"torch._grouped_mm differs from the bmm reference (relative error {err:.3g})"
        if capture:
            problem = _capture_problem(lambda: experts_grouped_mm(x, w13, w2, topk_weights, topk_ids), want, device)
            if problem:
                return f"torch._grouped_mm in a CUDA graph: {problem}"
        return None
    except Exception as exc:  # any failure means: use the bmm path
        return f"torch._grouped_mm failed: {_first_line(exc)}"


def _resolve_grouped_kernel(choice: str, moe_impl: str, device, dtype, cfg: ModelConfig, tp: int,
                            capture: bool) -> tuple:
    """(kernel, note): the grouped path that will run and, when auto fell back to bmm, why."""
    if moe_impl == "loop" or choice == "bmm":
        return "bmm", None  # the loop does not use it
    if not _grouped_mm_fast_path(device, dtype):
        if choice == "grouped_mm" and device.type == "cuda":
            raise ProfattrError("--grouped-kernel grouped_mm needs bf16 on an SM90/SM100 GPU (elsewhere "
                                "torch._grouped_mm synchronises and cannot be graph-captured); use bmm or auto")
        if choice == "grouped_mm":
            return "grouped_mm", None  # CPU: torch's reference implementation, for tests
        return "bmm", "torch._grouped_mm has no fast path here (needs CUDA bf16 on SM90/SM100)"
    why = _probe_grouped_mm(device, dtype, cfg, tp, capture)
    if why is None:
        return "grouped_mm", None
    if choice == "grouped_mm":
        raise ProfattrError(f"{why}; use --grouped-kernel bmm")
    return "bmm", why


def _resolve_sdpa_backend(choice: str, model, batch: int, capture: bool) -> tuple:
    """(backend choice, note). With `auto` before a CUDA graph capture: keep torch's own pick if the decode
    attention captures and replays correctly, else the first of efficient, math that does."""
    torch = _torch()
    attn = model.model.layers[0].self_attn.attn
    device = attn.k_cache.device
    if choice != "auto" or not capture or device.type != "cuda":
        return choice, None
    F = torch.nn.functional
    kc = attn.k_cache
    b, hkv, T, D = kc.shape
    group = model.config.num_heads // model.config.num_kv_heads
    gen = torch.Generator(device=device)
    gen.manual_seed(2)
    q = torch.randn((b, hkv, group, D), generator=gen, device=device).to(kc.dtype)
    k = torch.randn(kc.shape, generator=gen, device=device).to(kc.dtype)
    v = torch.randn(kc.shape, generator=gen, device=device).to(kc.dtype)
    bias = torch.zeros((b, hkv, group, T), device=device, dtype=kc.dtype)
    bias[..., T // 2:] = float("-inf")
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    problems = []
    for candidate in ("auto", "efficient", "math"):
        with _sdpa_context(candidate):
            problem = _capture_problem(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), want, device)
        if problem is None:
            note = None if candidate == "auto" else f"auto SDPA not capturable ({'; '.join(problems)})"
            return candidate, note
        problems.append(f"{candidate}: {problem}")
    raise ProfattrError(f"no SDPA backend could be captured into a CUDA graph ({'; '.join(problems)}); "
                        f"use --mode eager")


def _sdpa_context(choice: str):
    if choice == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "math": SDPBackend.MATH}[choice]
    return sdpa_kernel([backend])


def _sdpa_choice(model, batch: int) -> str:
    """Name of the SDPA backend torch picks for this model's decode attention (under the active sdpa context)."""
    torch = _torch()
    try:
        attn = model.model.layers[0].self_attn.attn
        kc = attn.k_cache
        hkv, T, D = kc.shape[1], kc.shape[2], kc.shape[3]
        group = model.config.num_heads // model.config.num_kv_heads
        q = torch.zeros((batch, hkv, group, D), device=kc.device, dtype=kc.dtype)
        bias = torch.zeros((batch, hkv, group, T), device=kc.device, dtype=kc.dtype)
        code = int(torch._fused_sdp_choice(q, kc, attn.v_cache, bias))
        from torch.nn.attention import SDPBackend

        for name, member in SDPBackend.__members__.items():
            if int(member) == code:
                return name.lower()
        return f"backend {code}"
    except Exception:
        return "unknown"


def _time_trials(run_step, trials: int, steps: int, cuda: bool) -> dict:
    """ms per decode step over `trials` runs of `steps` steps: CUDA events on CUDA, wall clock on CPU."""
    torch = _torch()
    per_trial = []
    for _ in range(trials):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                run_step()
            end.record()
            end.synchronize()
            per_trial.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                run_step()
            per_trial.append((time.perf_counter() - t0) * 1e3 / steps)
    return {"median": statistics.median(per_trial), "min": min(per_trial), "max": max(per_trial),
            "trials": trials, "steps_per_trial": steps, "per_trial_ms": [round(v, 6) for v in per_trial]}


def _barrier(dist_ctx: _Dist) -> None:
    if dist_ctx.size > 1:
        import torch.distributed as dist

        dist.barrier()


def _profiler(cuda: bool, start: bool) -> None:
    """Open or close the nsys capture window (--capture-range=cudaProfilerApi); nothing on CPU."""
    if not cuda:
        return
    torch = _torch()
    torch.cuda.synchronize()
    name = "cudaProfilerStart" if start else "cudaProfilerStop"
    call = getattr(torch.cuda.cudart(), name, None)
    if call is not None:
        call()
    elif start:  # older or newer bindings: torch's own wrapper of the same call
        torch.cuda.profiler.start()
    else:
        torch.cuda.profiler.stop()


@dataclass
class RunOptions:
    """Everything `run` needs; the CLI flags map one to one."""

    config: ModelConfig = field(default_factory=ModelConfig)
    moe_impl: str = "grouped"
    grouped_kernel: str = "auto"
    mode: str = "eager"
    graph_window: str = "after"
    batch: int = 1
    warmup_steps: int = 10
    timed_steps: int = 20
    timed_trials: int = DEFAULT_TIMED_TRIALS
    steps: int = 20
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    nvtx_format: str = "sglang"
    sdpa_backend: str = "auto"
    cold_window: bool = False
    idle_before_window_s: float = 0.0


def run(opts: RunOptions, nvtx_hooks: tuple | None = None) -> dict:
    """Build, warm up, time, profile; returns the metadata dict (schema profattr.workload/1).

    `nvtx_hooks` = (push, pop) replaces the NVTX calls (tests record the range names with it)."""
    torch = _torch()
    _check_options(opts)
    want_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise ProfattrError("--device cuda but torch sees no CUDA device; use --device cpu or a CUDA build of torch")
    dist_ctx, local_rank = _init_distributed(want_cuda)
    device = torch.device("cuda", local_rank) if want_cuda else torch.device("cpu")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    dtype = {"auto": torch.bfloat16 if cuda else torch.float32, "bfloat16": torch.bfloat16,
             "float32": torch.float32, "float16": torch.float16}[opts.dtype]
    if not cuda and opts.sdpa_backend in ("efficient", "cudnn"):
        raise ProfattrError(f"--sdpa-backend {opts.sdpa_backend} needs CUDA; on CPU use auto or math")
    cfg = opts.config
    validate_config(cfg, dist_ctx.size)
    capture = cuda and opts.mode == "graph"
    kernel, kernel_note = _resolve_grouped_kernel(opts.grouped_kernel, opts.moe_impl, device, dtype, cfg,
                                                  dist_ctx.size, capture)
    nvtx = Nvtx(cuda, *(nvtx_hooks or ()))
    with torch.no_grad():
        model = build_model(cfg, device, dtype, opts.moe_impl, kernel, opts.batch, opts.seed, dist_ctx)
        sampler = make_sampler()
        register_layerwise_ranges(model, sampler, nvtx, opts.nvtx_format)
        decoder = Decoder(model, sampler, opts.batch, opts.seed)
        sdpa_choice, sdpa_note = _resolve_sdpa_backend(opts.sdpa_backend, model, opts.batch, capture)
        with _sdpa_context(sdpa_choice):
            sdpa_name = _sdpa_choice(model, opts.batch)
            timing, captured_in_window = _drive(decoder, opts, nvtx, cuda, dist_ctx)
        final_tokens = decoder.tokens.tolist()
    meta = {
        "schema": SCHEMA,
        "workload": "moe_decode",
        "config": asdict(cfg),
        "moe_impl": opts.moe_impl,
        "moe_kernel": model.moe_kernel,
        "moe_kernel_note": kernel_note,
        "moe_reads_all_experts": opts.moe_impl == "loop",
        "mode": opts.mode,
        "graph_window": opts.graph_window if opts.mode == "graph" else None,
        "graph_captured_in_window": captured_in_window,
        "graph_emulated": opts.mode == "graph" and not cuda,
        "batch": opts.batch,
        "tp": dist_ctx.size,
        "dtype": str(dtype).replace("torch.", ""),
        "dtype_bytes": torch.empty((), dtype=dtype).element_size(),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "sdpa_backend": sdpa_name,
        "sdpa_backend_note": sdpa_note,
        "params": count_params(model),
        "context_len": cfg.context_len,
        "warmup_steps": opts.warmup_steps,
        "cold_window": opts.cold_window,
        "idle_before_window_s": opts.idle_before_window_s,
        "ms_per_token_unprofiled": timing,
        "steps_profiled": opts.steps,
        "nvtx": {"format": opts.nvtx_format, "emitted": bool(cuda or nvtx_hooks), "step_range": STEP_RANGE,
                 "capture_range": CAPTURE_RANGE if opts.mode == "graph" else None, "module_prefix": MODULE_PREFIX},
        "seed": opts.seed,
        "final_tokens": final_tokens,
    }
    meta["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(cfg, meta["dtype_bytes"])
    # decode attention reads the whole cache every step (static shape), whatever the positions
    meta["kv_cache_bytes_read_per_step"] = opts.batch * cfg.context_len * meta["kv_cache_bytes_per_token"]
    meta["rank"] = dist_ctx.rank
    if dist_ctx.size > 1:
        import torch.distributed as dist

        _barrier(dist_ctx)
        dist.destroy_process_group()
    return meta


def _drive(decoder: Decoder, opts: RunOptions, nvtx: Nvtx, cuda: bool, dist_ctx: _Dist) -> tuple:
    """Warm-up, unprofiled timing and the profiled window; returns (timing dict, graph captured in window)."""
    torch = _torch()

    def eager_step():
        with nvtx.range(STEP_RANGE):
            decoder.step()

    if opts.mode == "eager" and opts.cold_window:
        # the window opens before any warm-up: lazy initialisation, first-call library set-up and (after the idle
        # pause) low GPU clocks all land in its first steps, as in a capture started too early
        time.sleep(opts.idle_before_window_s)
        _barrier(dist_ctx)
        _profiler(cuda, True)
        for _ in range(opts.steps):
            eager_step()
        _profiler(cuda, False)
        for _ in range(opts.warmup_steps):
            eager_step()
        return _time_trials(eager_step, opts.timed_trials, opts.timed_steps, cuda), False
    for _ in range(opts.warmup_steps):
        eager_step()
    if opts.mode == "eager":
        timing = _time_trials(eager_step, opts.timed_trials, opts.timed_steps, cuda)
        _barrier(dist_ctx)
        _profiler(cuda, True)
        for _ in range(opts.steps):
            eager_step()
        _profiler(cuda, False)
        return timing, False

    stream = None
    if cuda:
        # warm up on the capture stream too: per-stream library state (cuBLAS workspaces) exists before capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                eager_step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    _barrier(dist_ctx)

    graph = StepGraph(decoder.step, cuda, nvtx, stream)

    def graph_step():
        with nvtx.range(STEP_RANGE):
            graph.replay()

    graph.capture()
    for _ in range(opts.warmup_steps):
        graph_step()
    timing = _time_trials(graph_step, opts.timed_trials, opts.timed_steps, cuda)
    _barrier(dist_ctx)
    in_window = opts.graph_window == "before"
    if in_window:
        # a fresh capture inside the window, so nsys records its NVTX ranges and graph node creation
        graph.release()
        _profiler(cuda, True)
        graph.capture()
    else:
        _profiler(cuda, True)
    for _ in range(opts.steps):
        graph_step()
    _profiler(cuda, False)
    graph.release()
    return timing, in_window


def _check_options(opts: RunOptions) -> None:
    checks = [
        (opts.moe_impl in MOE_IMPLS, f"--moe-impl must be one of {', '.join(MOE_IMPLS)}"),
        (opts.grouped_kernel in GROUPED_KERNELS, f"--grouped-kernel must be one of {', '.join(GROUPED_KERNELS)}"),
        (opts.mode in ("eager", "graph"), "--mode must be eager or graph"),
        (not opts.cold_window or opts.mode == "eager", "--cold-window applies to --mode eager"),
        (opts.idle_before_window_s >= 0, "--idle-before-window-s must be >= 0"),
        (opts.graph_window in ("before", "after"), "--graph-window must be before or after"),
        (opts.nvtx_format in NVTX_FORMATS, f"--nvtx-format must be one of {', '.join(NVTX_FORMATS)}"),
        (opts.sdpa_backend in SDPA_BACKENDS, f"--sdpa-backend must be one of {', '.join(SDPA_BACKENDS)}"),
        (opts.device in ("auto", "cuda", "cpu"), "--device must be auto, cuda or cpu"),
        (opts.dtype in ("auto", "bfloat16", "float32", "float16"), "--dtype must be auto, bfloat16, float32 "
                                                                    "or float16"),
        (opts.batch >= 1, "--batch must be >= 1"),
        (opts.warmup_steps >= 1, "--warmup-steps must be >= 1 (lazy initialisation must happen before timing)"),
        (opts.timed_steps >= 1 and opts.timed_trials >= 1, "--timed-steps and --timed-trials must be >= 1"),
        (opts.steps >= 1, "--steps must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ProfattrError(message)


def summary_line(meta: dict) -> str:
    """One human line: what ran and its unprofiled ms per token."""
    p, t = meta["params"], meta["ms_per_token_unprofiled"]
    kernel = "" if meta["moe_impl"] == "loop" else f"({meta['moe_kernel']})"
    window = f" window={meta['graph_window']}" if meta["mode"] == "graph" else ""
    return (f"moe_decode: mode={meta['mode']}{window} moe_impl={meta['moe_impl']}{kernel} batch={meta['batch']} "
            f"tp={meta['tp']} dtype={meta['dtype']} device={meta['device_name']} sdpa={meta['sdpa_backend']} "
            f"params={p['total'] / 1e6:.1f}M active_per_token={p['active_per_token'] / 1e6:.1f}M "
            f"ms_per_token={t['median']:.3f} (min {t['min']:.3f}, max {t['max']:.3f}, {t['trials']} trials) "
            f"steps_profiled={meta['steps_profiled']}")


def _write_meta(meta: dict, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m profattr.workloads.moe_decode",
                                     description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--preset", choices=sorted(PRESETS), default="default", help="model sizes to start from (default: default)")
    sizes = parser.add_argument_group("model sizes (override the preset)")
    for name, flag in SIZE_FLAGS.items():
        sizes.add_argument(flag, dest=name, metavar="X" if name == "rope_theta" else "N",
                           type=float if name == "rope_theta" else int, default=None,
                           help=f"default preset: {getattr(PRESETS['default'], name)}")
    add("--moe-impl", choices=MOE_IMPLS, default="grouped", help="per-expert loop or grouped kernels (grouped)")
    add("--grouped-kernel", choices=GROUPED_KERNELS, default="auto",
        help="grouped path: torch._grouped_mm where it has a fast path, else gather+bmm (auto)")
    add("--mode", choices=("eager", "graph"), default="eager", help="eager launches or CUDA graph replay (eager)")
    add("--graph-window", choices=("after", "before"), default="after",
        help="open the profiler window after the graph capture, or before it so capture-time NVTX is recorded")
    add("--batch", type=int, default=1, help="concurrent sequences (1)")
    add("--warmup-steps", type=int, default=10, help="steps before timing (10)")
    add("--timed-steps", type=int, default=20, help="steps per unprofiled timing trial (20)")
    add("--timed-trials", type=int, default=DEFAULT_TIMED_TRIALS, help=f"timing trials ({DEFAULT_TIMED_TRIALS})")
    add("--steps", type=int, default=20, help="decode steps inside the profiler window (20)")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: CUDA when available")
    add("--dtype", choices=("auto", "bfloat16", "float32", "float16"), default="auto",
        help="auto: bfloat16 on CUDA, float32 on CPU")
    add("--seed", type=int, default=0, help="weights and first tokens (0)")
    add("--nvtx-format", choices=NVTX_FORMATS, default="sglang",
        help="per-module range text: SGLang's dict text, the bare module path, or no module ranges (sglang)")
    add("--sdpa-backend", choices=SDPA_BACKENDS, default="auto", help="force an SDPA backend (auto)")
    add("--cold-window", action="store_true",
        help="eager: open the window before any warm-up (warm-up and timing follow it): a capture started too early")
    add("--idle-before-window-s", type=float, default=0.0, help="with --cold-window: idle this long first, so the "
        "GPU clocks drop as on an idle server (0)")
    add("--meta-out", metavar="PATH", help="write the metadata JSON (profattr.workload/1) here")
    add("--force", action="store_true", help="overwrite --meta-out if it exists")
    return parser


def options_from_args(args: argparse.Namespace) -> RunOptions:
    cfg = PRESETS[args.preset]
    overrides = {f: getattr(args, f) for f in asdict(cfg) if getattr(args, f, None) is not None}
    return RunOptions(config=replace(cfg, **overrides), moe_impl=args.moe_impl, grouped_kernel=args.grouped_kernel,
                      mode=args.mode, graph_window=args.graph_window, batch=args.batch,
                      warmup_steps=args.warmup_steps, timed_steps=args.timed_steps, timed_trials=args.timed_trials,
                      steps=args.steps, device=args.device, dtype=args.dtype, seed=args.seed,
                      nvtx_format=args.nvtx_format, sdpa_backend=args.sdpa_backend, cold_window=args.cold_window,
                      idle_before_window_s=args.idle_before_window_s)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _set_parallel_env()
    try:
        if args.meta_out and os.path.exists(args.meta_out) and not args.force:
            raise ProfattrError(f"{args.meta_out} exists; pass --force to overwrite it or choose another path")
        if args.meta_out and not os.path.isdir(os.path.dirname(os.path.abspath(args.meta_out))):
            raise ProfattrError(f"the folder of --meta-out {args.meta_out} does not exist; create it first")
        try:
            _torch()
        except ImportError:
            raise ProfattrError("this workload needs PyTorch; install torch (pip install torch)") from None
        meta = run(options_from_args(args))
    except ProfattrError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if meta["rank"] == 0:
        if args.meta_out:
            _write_meta(meta, args.meta_out)
        print(summary_line(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
