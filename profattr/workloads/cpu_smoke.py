"""A CPU-only process that emits nested NVTX push/pop ranges, for checking that a capture records NVTX.

    python -m profattr.workloads.cpu_smoke [--steps N] [--layers L] [--work-us US]

Each step is one range `smoke_step` holding `layer_0` .. `layer_{L-1}`, each holding `attention` then `mlp`, with a
little CPU work inside every leaf so that the ranges have duration. Ranges use the default NVTX domain and plain
ASCII messages. It prints one JSON line (`profattr.smoke/1`) with the range counts it emitted, so a test can
compare them with what the capture recorded.

Why the `nvtx` package: its 0.2.11 release emits ranges that Nsight Systems 2023.4.4 records; 0.2.12 and later
emit ranges that 2023.4.4 drops (only domain create/destroy rows remain). `profattr doctor` checks this for real.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

BLOCKS = ("attention", "mlp")
SCHEMA = "profattr.smoke/1"


def _spin(duration_us: float) -> int:
    """Busy CPU work for about `duration_us` microseconds; returns a checksum so nothing is optimised away."""
    deadline = time.perf_counter() + duration_us / 1e6
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


def run(steps: int = 10, layers: int = 2, work_us: float = 200.0) -> dict:
    """Emit `steps` x (1 + layers x (1 + len(BLOCKS))) ranges; returns the counts per range name."""
    import nvtx  # imported here so that `--help` works without the package

    counts: dict = {"smoke_step": 0}
    checksum = 0
    for _ in range(steps):
        nvtx.push_range("smoke_step")
        for layer in range(layers):
            name = f"layer_{layer}"
            nvtx.push_range(name)
            for block in BLOCKS:
                nvtx.push_range(block)
                checksum = (checksum + _spin(work_us)) & 0xFFFFFFFF
                nvtx.pop_range()
                counts[block] = counts.get(block, 0) + 1
            nvtx.pop_range()
            counts[name] = counts.get(name, 0) + 1
        nvtx.pop_range()
        counts["smoke_step"] += 1
    return {"schema": SCHEMA, "steps": steps, "layers": layers, "work_us": work_us,
            "nvtx_version": nvtx_version(), "ranges": counts, "checksum": checksum}


def nvtx_version() -> str | None:
    """Version of the installed `nvtx` package, or None when it is missing."""
    try:
        from importlib.metadata import version
        return version("nvtx")
    except Exception:
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m profattr.workloads.cpu_smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="number of smoke_step ranges (default 10)")
    parser.add_argument("--layers", type=int, default=2, help="layer_N ranges per step (default 2)")
    parser.add_argument("--work-us", type=float, default=200.0, help="CPU work inside each leaf range, us (default 200)")
    parser.add_argument("--meta-out", help="also write the JSON summary to this file")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.layers < 1 or args.work_us < 0:
        parser.error("--steps and --layers must be >= 1 and --work-us >= 0")
    summary = run(args.steps, args.layers, args.work_us)
    text = json.dumps(summary, sort_keys=True)
    print(text, flush=True)
    if args.meta_out:
        with open(args.meta_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
