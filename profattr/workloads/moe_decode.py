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
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace

# the model and the runtime live in moe_model.py and moe_runtime.py; EXPERT_KERNELS stays importable from here
from profattr.workloads.moe_model import (  # noqa: F401
    CAPTURE_RANGE, DEFAULT_TIMED_TRIALS, EXPERT_KERNELS, GROUPED_KERNELS, MODULE_PREFIX, MOE_IMPLS, NVTX_FORMATS,
    PRESETS, SCHEMA, SDPA_BACKENDS, SIZE_FLAGS, STEP_RANGE, ModelConfig, ProfattrError, _Dist, _torch, build_model,
    count_params, kv_cache_bytes_per_token, make_sampler, validate_config)
from profattr.workloads.moe_runtime import (Decoder, Nvtx, StepGraph, _barrier, _init_distributed, _profiler,
                                            _resolve_grouped_kernel, _resolve_sdpa_backend, _sdpa_choice,
                                            _sdpa_context, _set_parallel_env, _time_trials,
                                            register_layerwise_ranges)


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
