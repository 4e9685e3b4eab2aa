"""The budget's kernel rows per launch shape: each kernel row's shapes (grid, block, registers per thread, and the
GEMM's M, N, K where an NVTX range names them), the replicates' mean of them, and the GPU's short kernels.

A launch shape comes from the reader's per-op `grid` and `block` (trace/ops.py) and `gemm` (attribute/gemm_dims.py),
summed per (device, combination, shape) by accumulate.StepTotals; here those sums become the JSON rows.
"""
from __future__ import annotations

import pandas as pd

from profattr.attribute.accumulate import SHORT_KERNEL_NS
from profattr.attribute.gemm_dims import unpack_mnk
from profattr.trace.ops import shape_label, unpack_shape

NS_PER_MS = 1e6


def kernel_shapes(combos: pd.DataFrame, n_steps: int, total_op_ns: float) -> dict:
    """(name, demangled, category, family) -> its launch shapes (trace/ops.py), longest first: each shape's grid,
    block, registers per thread (and the GEMM's M, N, K where its linear layer's NVTX range names them), label, launches and ms per step, mean duration and share of the GPU's op time.
    Memory ops have none."""
    keys = ["name", "demangled", "category", "family"]
    kernels = combos[~combos["category"].str.startswith("memory.")]
    if not len(kernels):
        return {}
    unknown = (kernels["grid"] < 0) | (kernels["block"] < 0)  # part of a shape missing: the shape is not known
    if unknown.any():
        kernels = kernels.assign(grid=kernels["grid"].where(~unknown, -1), block=kernels["block"].where(~unknown, -1),
                                 gemm=kernels["gemm"].where(~unknown, -1))
    by_shape = (kernels.groupby(keys + ["grid", "block", "gemm"], sort=False)[["ns", "count"]].sum().reset_index()
                .sort_values(["ns", "grid", "block", "gemm"], ascending=[False, True, True, True]))
    out: dict = {}
    for r in by_shape.itertuples():
        shape = unpack_shape(r.grid, r.block)
        mnk = unpack_mnk(r.gemm)
        if shape is not None and mnk is not None:
            shape["gemm"] = mnk
        out.setdefault((r.name, r.demangled, r.category, r.family), []).append({
            "shape": shape, "label": shape_label(shape), "ms_per_step": r.ns / n_steps / NS_PER_MS,
            "count_per_step": r.count / n_steps, "mean_us": r.ns / r.count / 1e3 if r.count else 0.0,
            "share": r.ns / total_op_ns if total_op_ns else 0.0})
    return out


def mean_shapes(devices: list, kernels: list) -> dict | None:
    """Replicates' mean of the kernel rows' shapes, as diff's mean budget takes the mean of the kernel rows: set in
    place on the mean `kernels` rows; returns the mean short_kernels (None when a replicate lacks them). Each
    replicate weighs the same; mean_us is the mean time over the mean launches."""
    n = len(devices)
    per_kernel: dict = {}
    for d in devices:
        for k in d["kernels"]:
            acc = per_kernel.setdefault((k["name"], k["demangled"], k["category"], k.get("family")), {})
            for sh in k.get("shapes") or []:
                row = acc.setdefault(sh["label"], {**sh, "ms_per_step": 0.0, "count_per_step": 0.0, "share": 0.0})
                for f in ("ms_per_step", "count_per_step", "share"):
                    row[f] += sh[f] / n
    for k in kernels:
        rows = list(per_kernel.get((k["name"], k["demangled"], k["category"], k.get("family")), {}).values())
        for row in rows:
            row["mean_us"] = 1e3 * row["ms_per_step"] / row["count_per_step"] if row["count_per_step"] else 0.0
        k["shapes"] = sorted(rows, key=lambda r: -r["ms_per_step"])
        if "mean_us" in k:
            k["mean_us"] = 1e3 * k["ms_per_step"] / k["count_per_step"] if k["count_per_step"] else 0.0
    if not all(d.get("short_kernels") for d in devices):
        return None
    first = devices[0]["short_kernels"]
    return {"under_us": first["under_us"], **{f: sum(d["short_kernels"][f] for d in devices) / n
                                              for f in ("count_per_step", "ms_per_step", "share")}}


def short_kernel_stats(ns_count, n_steps: int, total_op_ns: float) -> dict:
    """Kernels shorter than accumulate.SHORT_KERNEL_NS: launches and ms per step, share of the GPU's op time."""
    ns, count = ns_count
    return {"under_us": SHORT_KERNEL_NS / 1e3, "count_per_step": count / n_steps if n_steps else 0.0,
            "ms_per_step": ns / n_steps / NS_PER_MS if n_steps else 0.0,
            "share": ns / total_op_ns if total_op_ns else 0.0}
