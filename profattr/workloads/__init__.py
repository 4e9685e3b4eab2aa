"""Built-in workloads that profattr can capture, each runnable as `python -m profattr.workloads.<name>`.

- `moe_decode`: a small MoE decoder decoding greedily on CUDA (eager or CUDA graph, one GPU or tensor parallel under
  torchrun) with SGLang-style layerwise NVTX ranges; writes `profattr.workload/1` metadata (`--meta-out`).
- `cpu_smoke`: a CPU-only process emitting nested NVTX ranges, to check that a capture records NVTX.

Nothing here imports torch at package import time.
"""
