"""Decode floors for one model on one GPU type: weights-only and realistic, each a list of terms in ms.

weights_only: every active weight read once per token, split evenly over the TP ranks, at peak bandwidth;
nothing else costs time. realistic: weights split as the engine splits them (some replicated), the KV cache at the
context length, achievable rather than peak bandwidth, small-message all-reduces and kernel launches, added
serially. `compute_limit` returns the `profattr.limit/1` JSON with both floors, their assumptions, and a
sensitivity table (how far each assumption moves the floor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from profattr.limits.hardware import HardwareSpec
from profattr.limits.model import ModelSpec, load_toml, respec

SCHEMA = "profattr.limit/1"
KERNELS_PER_LAYER = 25  # assumed when no count is known: about 2,000 kernels for GLM-5's 78 layers
KERNELS_PER_STEP_FIXED = 50
SENSITIVITY_CONTEXTS = (8192, 32768, 131072)
WHAT_IF_QUANTS = ("nvfp4-all", "nvfp4-fp8", "fp8", "bf16")


@dataclass(frozen=True)
class Term:
    term: str
    ms: float
    detail: str = ""


@dataclass(frozen=True)
class Floor:
    """A floor in ms: the sum of its terms, and the assumptions behind it."""

    name: str
    terms: Tuple[Term, ...]
    assumptions: Tuple[Dict[str, str], ...]

    @property
    def ms(self) -> float:
        return sum(t.ms for t in self.terms)


def _ms(nbytes: float, bandwidth_bytes_per_s: float) -> float:
    return nbytes / bandwidth_bytes_per_s * 1e3


def _by_class(spec: ModelSpec, ideal: bool, exclude: Tuple[str, ...] = ()) -> List[Tuple[str, str, float]]:
    """(weight class, formats, bytes per rank) for each weight class, largest first."""
    classes: Dict[str, List[Any]] = {}
    for g in spec.groups:
        if g.weight_class in exclude:
            continue
        entry = classes.setdefault(g.weight_class, [set(), 0.0])
        entry[0].add(g.dtype)
        entry[1] += g.rank_bytes_per_token(spec.tp, ideal)
    rows = [(cls, "+".join(sorted(fmts)), nbytes) for cls, (fmts, nbytes) in classes.items()]
    return sorted(rows, key=lambda r: -r[2])


def _quant_assumption(spec: ModelSpec) -> Dict[str, str]:
    formats = ", ".join(f"{cls} {fmt}" for cls, fmt, _ in _by_class(spec, True))
    if spec.quant_source.startswith("quantization from config.json"):
        return {"id": "quantization", "text": f"{spec.quant_source}: {formats}", "source": spec.source}
    scheme = load_toml("quant.toml")["schemes"].get(spec.quant, {}) if spec.config is not None else {}
    preset = f" ({spec.quant_source})" if spec.quant_source else ""
    return {"id": "quantization", "text": f"{spec.quant}: {scheme.get('description', spec.quant)} ({formats}){preset}",
            "source": scheme.get("source", spec.source)}


def weights_only_floor(spec: ModelSpec, hw: HardwareSpec, exclude: Tuple[str, ...] = ()) -> Floor:
    """Active weight bytes per rank under ideal sharding, at peak bandwidth (`exclude`: weight classes left out)."""
    bandwidth = hw.memory_bandwidth_bytes_per_s
    terms = tuple(Term(f"weights: {cls} ({fmt})", _ms(nbytes, bandwidth.value),
                       f"{nbytes / 1e9:.3f} GB per rank, split evenly over {spec.tp}")
                  for cls, fmt, nbytes in _by_class(spec, True, exclude))
    assumptions = (
        {"id": "weights_read_once", "text": "every active weight is read from memory once per token (batch 1)",
         "source": "roofline method"},
        {"id": "ideal_sharding", "text": f"every weight split evenly over {spec.tp} ranks; nothing replicated",
         "source": "idealisation"},
        {"id": "peak_bandwidth", "text": f"peak memory bandwidth {bandwidth.value / 1e12:.3f} TB/s",
         "source": bandwidth.source},
        _quant_assumption(spec),
        {"id": "dsa_indexer", "text": "DSA indexer runs" if spec.dsa_runs else
         "DSA indexer weights not read (indexer not run, or the model has none)",
         "source": "hardware preset dsa_runs" if spec.config else spec.source},
        {"id": "no_kv_cache", "text": "KV-cache reads not counted", "source": "idealisation"},
        {"id": "no_communication", "text": "all-reduces cost nothing", "source": "idealisation"},
        {"id": "no_launch_cost", "text": "kernel launches cost nothing", "source": "idealisation"},
        {"id": "one_token_per_step", "text": "no speculative decoding (MTP off): one token per step",
         "source": "batch-1 decode"},
    )
    return Floor("weights_only", terms, assumptions)


def kernels_per_step(spec: ModelSpec, override: Optional[int] = None) -> Tuple[float, str]:
    """Kernels per decode step: the override, the spec's own count, or an estimate from the layer count."""
    if override is not None:
        return float(override), "given with --kernels"
    if spec.kernels_per_step:
        return spec.kernels_per_step
    estimate = KERNELS_PER_LAYER * spec.num_layers + KERNELS_PER_STEP_FIXED
    return float(estimate), (f"assumed {KERNELS_PER_LAYER} per layer + {KERNELS_PER_STEP_FIXED} "
                             "(about 2,000 for 78 layers); measure it with profattr budget")


def realistic_floor(spec: ModelSpec, hw: HardwareSpec, *, allreduce: str = "oneshot", launch: str = "graph",
                    kernels: Optional[int] = None, bandwidth_fraction: Optional[float] = None,
                    ideal_sharding: bool = False) -> Floor:
    """Weights as the engine shards them plus KV at achievable bandwidth, all-reduces and launches, serially."""
    fraction = hw.achievable_bandwidth_fraction if bandwidth_fraction is None else None
    eta = fraction.value if fraction else bandwidth_fraction
    bandwidth = hw.memory_bandwidth_bytes_per_s.value * eta
    how = "split evenly" if ideal_sharding else "as the engine shards them"
    terms = [Term(f"weights: {cls} ({fmt})", _ms(nbytes, bandwidth), f"{nbytes / 1e9:.3f} GB per rank, {how}")
             for cls, fmt, nbytes in _by_class(spec, ideal_sharding)]
    terms.append(Term("kv cache read", _ms(spec.kv_cache_read_bytes, bandwidth),
                      f"{spec.context_len} tokens x {spec.kv_cache_bytes_per_token / 1e3:.1f} KB per rank"))
    if spec.indexer_keys_read_bytes:
        terms.append(Term("dsa indexer keys read", _ms(spec.indexer_keys_read_bytes, bandwidth),
                          f"{spec.indexer_keys_read_bytes / 1e6:.1f} MB per rank"))
    replicated = sorted({g.component for g in spec.groups if g.sharding == "replicated"})
    assumptions = [
        {"id": "engine_sharding", "text": ("every weight split evenly over the ranks" if ideal_sharding else
                                           "weights split as the engine does; replicated on every rank: "
                                           + ", ".join(replicated)),
         "source": "profattr/limits/specs/sharding.toml"},
        {"id": "achievable_bandwidth",
         "text": f"{eta:.3f} x peak = {bandwidth / 1e12:.3f} TB/s", "source": fraction.source if fraction else
         "given"},
        {"id": "kv_cache", "text": f"KV cache of {spec.context_len} tokens, "
         f"{spec.kv_cache_bytes_per_token:.0f} B per token per rank", "source": spec.source},
        _quant_assumption(spec),
        {"id": "serial_sum", "text": "memory, communication and launch terms add up (no overlap)",
         "source": "roofline method"},
    ]
    if spec.allreduce_per_step:
        us, how_us = hw.allreduce_us(allreduce, spec.tp, spec.allreduce_message_bytes)
        terms.append(Term(f"all-reduce ({allreduce})", spec.allreduce_per_step * us / 1e3,
                          f"{spec.allreduce_per_step} x {us:.2f} us"))
        assumptions.append({"id": "allreduce", "text": (
            f"{spec.allreduce_per_step} all-reduces per token (2 per layer + 1) of {spec.allreduce_message_bytes} B "
            f"over {spec.tp} GPUs, {allreduce}: {us:.2f} us each ({how_us})"),
            "source": hw.allreduce[allreduce].source})
    count, count_source = kernels_per_step(spec, kernels)
    if launch == "graph":
        us = hw.graph_launch_us.value + count * hw.graph_node_us.value
        terms.append(Term("launch (CUDA graph replay)", us / 1e3,
                          f"{hw.graph_launch_us.value:g} us + {count:.0f} x {hw.graph_node_us.value:g} us"))
        launch_source = f"{hw.graph_launch_us.source}; {hw.graph_node_us.source}"
    else:
        us = count * hw.kernel_launch_us.value
        terms.append(Term("launch (eager)", us / 1e3, f"{count:.0f} x {hw.kernel_launch_us.value:g} us"))
        launch_source = hw.kernel_launch_us.source
    assumptions.append({"id": "launch", "text": f"{launch} launches, {count:.0f} kernels per step "
                        f"({count_source}), not overlapped with kernel execution", "source": launch_source})
    return Floor("realistic", tuple(terms), tuple(assumptions))


def sensitivity(spec: ModelSpec, hw: HardwareSpec, *, allreduce: str, launch: str,
                kernels: Optional[int]) -> List[Dict[str, Any]]:
    """How far each assumption moves each floor: one row per change, with the new floor and the delta (ms)."""
    base_w = weights_only_floor(spec, hw).ms
    base_r = realistic_floor(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels).ms
    peak = hw.memory_bandwidth_bytes_per_s.value
    eta = hw.achievable_bandwidth_fraction.value
    rows: List[Tuple[str, str, float]] = []
    replicated = _ms(spec.weight_bytes_per_rank(ideal=False), peak)
    rows.append(("weights_only", "weights sharded as the engine does (replicated weights read on every rank)",
                 replicated))
    rows.append(("weights_only", f"... and achievable bandwidth ({eta:.3f} x peak)", replicated / eta))
    rows.append(("weights_only", f"+ KV cache at {spec.context_len} tokens",
                 base_w + _ms(spec.kv_cache_read_bytes + spec.indexer_keys_read_bytes, peak)))
    rows.append(("weights_only", "lm_head not counted", weights_only_floor(spec, hw, exclude=("lm_head",)).ms))
    if spec.config is not None:
        if any(g.weight_class == "indexer" for g in respec(spec, dsa_runs=True).groups):
            flip = not spec.dsa_runs
            rows.append(("weights_only", "DSA indexer runs" if flip else "DSA indexer not run",
                         weights_only_floor(respec(spec, dsa_runs=flip), hw).ms))
        for quant in WHAT_IF_QUANTS:
            if quant != spec.quant:
                other = respec(spec, quant=quant)
                rows.append(("weights_only", f"quantization {quant}", weights_only_floor(other, hw).ms))
    for impl in sorted(hw.allreduce):
        if impl != allreduce and spec.allreduce_per_step:
            rows.append(("realistic", f"all-reduce {impl} instead of {allreduce}",
                         realistic_floor(spec, hw, allreduce=impl, launch=launch, kernels=kernels).ms))
    other_launch = "eager" if launch == "graph" else "graph"
    rows.append(("realistic", f"{other_launch} launches instead of {launch}",
                 realistic_floor(spec, hw, allreduce=allreduce, launch=other_launch, kernels=kernels).ms))
    rows.append(("realistic", "peak bandwidth instead of achievable",
                 realistic_floor(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels,
                                 bandwidth_fraction=1.0).ms))
    rows.append(("realistic", "ideal sharding (nothing replicated)",
                 realistic_floor(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels,
                                 ideal_sharding=True).ms))
    for ctx in SENSITIVITY_CONTEXTS:
        if ctx != spec.context_len:
            rows.append(("realistic", f"context {ctx} tokens",
                         realistic_floor(respec(spec, context_len=ctx), hw, allreduce=allreduce, launch=launch,
                                         kernels=kernels).ms))
    base = {"weights_only": base_w, "realistic": base_r}
    return [{"floor": floor, "change": change, "ms": ms, "delta_ms": ms - base[floor]}
            for floor, change, ms in rows]


def compute_limit(spec: ModelSpec, hw: HardwareSpec, *, allreduce: str = "oneshot", launch: str = "graph",
                  kernels: Optional[int] = None) -> Dict[str, Any]:
    """The `profattr.limit/1` JSON: both floors, their terms and assumptions, and the sensitivity table."""
    floors = [weights_only_floor(spec, hw),
              realistic_floor(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels)]
    weights_only, realistic = floors
    return {
        "schema": SCHEMA,
        "model": {**spec.describe(), "notes": list(spec.notes)},
        "hardware": {"id": hw.id, "name": hw.name,
                     "memory_bandwidth_bytes_per_s": hw.memory_bandwidth_bytes_per_s.value,
                     "interconnect": hw.interconnect},
        "weights_only_ms": weights_only.ms,
        "realistic_ms": realistic.ms,
        "tokens_per_s": {"weights_only": 1e3 / weights_only.ms, "realistic": 1e3 / realistic.ms},
        "terms": [{"floor": f.name, "term": t.term, "ms": t.ms, "detail": t.detail} for f in floors for t in f.terms],
        "assumptions": [{"floor": f.name, **a} for f in floors for a in f.assumptions],
        "sensitivity": sensitivity(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels),
    }
