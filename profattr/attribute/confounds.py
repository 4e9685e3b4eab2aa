"""What else differs between two captures' runs, beyond what the comparison means to change.

A diff of two captures credits every difference in step time to what differs between them. run.json (written by
`profattr capture`) records enough to list those differences: the server's arguments, the backends SGLang resolved,
the request shape, tensor parallelism, package and profiler versions, the GPUs (name, driver, clocks, power limit)
and the host. `compare_runs` returns them as `intended` (the server's arguments and the MoE backend: what the user
chose to change) or `confound` (anything else: the step-time difference may come from it).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from profattr.run_record import RunRecord

# GPU fields that change the speed of the same kernels
GPU_FIELDS = ("name", "clocks_max_sm_mhz", "clocks_max_mem_mhz", "power_limit_w", "memory_total_mib")
REQUEST_FIELDS = ("batch", "input_len", "max_new_tokens")
# server arguments that only name where things are, not how they run
IGNORED_SERVER_ARGS = {"port", "host", "model_path", "tokenizer_path", "served_model_name", "log_level"}


def _differ(kind: str, what: str, a: Any, b: Any) -> Optional[Dict[str, Any]]:
    if a == b or a is None or b is None:  # the same, or not recorded on one side: unknown is not a difference
        return None
    return {"kind": kind, "what": what, "a": a, "b": b}


def _pairs(a: Optional[dict], b: Optional[dict], keys: Iterable[str]) -> Iterable[Tuple[str, Any, Any]]:
    for key in keys:
        yield key, (a or {}).get(key), (b or {}).get(key)


def compare_runs(a: Optional[RunRecord], b: Optional[RunRecord]) -> List[Dict[str, Any]]:
    """Differences between two run.json records, each {kind: intended|confound, what, a, b}. Empty when either
    run is unknown (there is nothing to compare: the report says so elsewhere)."""
    if a is None or b is None:
        return []
    out: List[Optional[Dict[str, Any]]] = []
    args_a, args_b = a.logged_server_args, b.logged_server_args
    for key in sorted(set(args_a) | set(args_b)):
        if key not in IGNORED_SERVER_ARGS:
            out.append(_differ("intended", f"server argument {key}", args_a.get(key), args_b.get(key)))
    if not args_a or not args_b:  # no server arguments recorded: the backend profattr was asked for
        out.append(_differ("intended", "MoE backend requested", a.backend_requested, b.backend_requested))
    requested = {k for k in set(args_a) | set(args_b) if args_a.get(k) != args_b.get(k)}
    # flags the server log's server_args line does not show (e.g. --cuda-graph-max-bs), from the command line; a
    # flag whose change the line already shows under SGLang's own name is not said twice
    shown = {(args_a.get(k), args_b.get(k)) for k in requested}
    flags_a, flags_b = a.server_flags, b.server_flags
    # an attached server (capture --server) has no command line of profattr's: its settings are the server info's
    # server_args, compared above; an absent flag there is unknown, not off
    both = bool(flags_a) and bool(flags_b)
    for key in sorted(set(flags_a) | set(flags_b)) if both else ():
        va, vb = flags_a.get(key, False), flags_b.get(key, False)
        if key in args_a or key in args_b or key in IGNORED_SERVER_ARGS or va == vb or (va, vb) in shown:
            continue
        requested.add(key)
        out.append({"kind": "intended", "what": f"server flag --{key.replace('_', '-')}", "a": va, "b": vb})
    graphs_a, graphs_b = a.graph_batch_sizes, b.graph_batch_sizes
    # the decode graphs the server captured: a confound unless a flag that sets them changed
    out.append(_differ("intended" if any("cuda_graph" in k for k in requested) else "confound",
                       "CUDA graph batch sizes the server captured", graphs_a, graphs_b))
    res_a, res_b = a.resolved, b.resolved
    for key, va, vb in _pairs(res_a, res_b, sorted(set(res_a) | set(res_b))):
        if key in requested and (va, vb) == (args_a.get(key), args_b.get(key)):
            continue  # resolved as asked: the server argument above says it
        # a backend SGLang resolved differently although the argument that sets it is the same on both sides
        kind = "intended" if key in requested else "confound"
        out.append(_differ(kind, f"backend SGLang resolved: {key}", va, vb))
    for key, va, vb in _pairs(a.requests, b.requests, REQUEST_FIELDS):
        out.append(_differ("confound", f"requests {key}", va, vb))
    out.append(_differ("confound", "tensor-parallel size", a.tp, b.tp))
    out += _model_differences(a, b)
    pa, pb = a.packages, b.packages
    for key, va, vb in _pairs(pa, pb, sorted((set(pa) | set(pb)) - {"profattr"})):
        out.append(_differ("confound", f"{key} version", va, vb))
    out.append(_differ("confound", f"{a.profiler_used} version", a.nsys_version or a.profiler_version,
                       b.nsys_version or b.profiler_version))
    out.append(_differ("confound", "profiler", a.profiler, b.profiler))
    out.append(_differ("confound", "CUDA graph trace mode", a.cuda_graph_trace, b.cuda_graph_trace))
    out.append(_differ("confound", "driver", a.driver_version, b.driver_version))
    gpus_a, gpus_b = a.gpus, b.gpus
    out.append(_differ("confound", "GPU count", len(gpus_a) or None, len(gpus_b) or None))
    for ga, gb in zip(gpus_a, gpus_b):
        for key, va, vb in _pairs(ga, gb, GPU_FIELDS):
            out.append(_differ("confound", f"GPU {ga.get('index', '?')} {key}", va, vb))
    out.append(_differ("confound", "host platform", a.host.get("platform"), b.host.get("platform")))
    return [d for d in out if d is not None]


def _quantization(run: RunRecord):
    """The weight format a run's recorded config.json names (quant_method and quant_algo), or None."""
    q = run.model_config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    nested = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}
    return " ".join(str(x) for x in (q.get("quant_method"), q.get("quant_algo") or nested.get("quant_algo")) if x) \
        or "quantized"


def _model_differences(a: RunRecord, b: RunRecord) -> list:
    """Two model folders whose config.json differ only in quantization_config are one model in two weight formats:
    that difference is the comparison's (intended), not a confound; any other model difference is one."""
    if a.model == b.model:
        return []
    ca, cb = a.model_config, b.model_config
    if ca and cb:
        rest_a = {k: v for k, v in ca.items() if k != "quantization_config"}
        rest_b = {k: v for k, v in cb.items() if k != "quantization_config"}
        if rest_a == rest_b:
            return [d for d in [_differ("intended", "model weights' quantization (config.json quantization_config)",
                                        _quantization(a) or "none", _quantization(b) or "none")] if d]
    return [d for d in [_differ("confound", "model", a.model, b.model)] if d]


def describe(differences: List[Dict[str, Any]], kind: str) -> str:
    """One line of the differences of one kind: `what a → b; ...` (raw text)."""
    return "; ".join(f"{d['what']} {d['a']} → {d['b']}" for d in differences if d["kind"] == kind)
