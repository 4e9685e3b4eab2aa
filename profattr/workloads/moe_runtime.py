"""The decode workload's runtime (moe_decode.py): NVTX ranges in SGLang's layerwise format, the decoder's static
buffers and its CUDA graph, tensor-parallel start-up, the start-up probes (torch._grouped_mm and SDPA, each checked
in a CUDA graph replay before the real capture), unprofiled timing and the nsys capture window."""
from __future__ import annotations

import contextlib
import os
import statistics
import time

from profattr.workloads.moe_model import (CAPTURE_RANGE, MODULE_PREFIX, SAMPLER_NAME, ModelConfig, ProfattrError,
                                          _Dist, _torch, experts_bmm, experts_grouped_mm)


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
