"""Per GEMM category: the precision of the weights and how the math ran, from the taxonomy rules' data.

A GEMM category says what the math is (`gemm.fp4`: dense GEMMs with FP4 weights), not how a GPU did it: on SM90 an
NVFP4 linear runs as a weight-only Marlin kernel (FP4 weights unpacked to BF16 inside the kernel, BF16 tensor-core
math: W4A16), on SM100/SM120 as a block-scaled FP4 tensor-core GEMM. The rules say which (their `weight_dtype` and
`math` fields, profattr/taxonomy/rules/*.toml); this module puts that on every GEMM kernel of a budget and sums it
per (category, weight precision, math), so that a reader of an SM90 capture does not take it for SM120 behaviour.
"""
from __future__ import annotations

GEMM_CATEGORY_PREFIX = "gemm."
EXPERT_GEMM = "moe.gemm"


def is_gemm_category(category: str) -> bool:
    """Dense GEMM categories (`gemm.*`) and the expert GEMMs (`moe.gemm`)."""
    return str(category).startswith(GEMM_CATEGORY_PREFIX) or category == EXPERT_GEMM


def kernel_precision(ruleset, demangled: str, name: str, category: str) -> tuple:
    """(weight_dtype, math) of one GEMM kernel: what its rule states; a dense category's dtype when the rule is
    silent (`gemm.bf16` -> bf16, the math then unknown: None)."""
    rule = ruleset.match(demangled or name or "", frozenset(), short=name)
    weight = (rule.weight_dtype if rule is not None else "") or ""
    math = (rule.math if rule is not None else "") or ""
    if not weight and str(category).startswith(GEMM_CATEGORY_PREFIX):
        weight = str(category)[len(GEMM_CATEGORY_PREFIX):]
    return (weight or None, math or None)


def annotate(devices: list, ruleset) -> None:
    """Add `weight_dtype` and `math` to each GEMM kernel of each device dict, and the device's `gemm_precision`
    rows: one per (category, weight_dtype, math) with its ms/step, launches/step and kernel names, largest first."""
    for d in devices:
        groups: dict = {}
        for k in d.get("kernels") or []:
            if not is_gemm_category(k.get("category", "")):
                continue
            weight, math = kernel_precision(ruleset, k.get("demangled"), k.get("name"), k["category"])
            k["weight_dtype"], k["math"] = weight, math
            row = groups.setdefault((k["category"], weight, math),
                                    {"category": k["category"], "weight_dtype": weight, "math": math,
                                     "ms_per_step": 0.0, "count_per_step": 0.0, "kernels": 0})
            row["ms_per_step"] += float(k["ms_per_step"])
            row["count_per_step"] += float(k["count_per_step"])
            row["kernels"] += 1
        d["gemm_precision"] = sorted(groups.values(), key=lambda r: -r["ms_per_step"])


def describe(row: dict) -> str:
    """'weights fp4; W4A16: unpacked to BF16 in the kernel' for a gemm_precision row."""
    weight = row.get("weight_dtype") or "?"
    math = row.get("math") or "math not stated by the rule"
    return f"weights {weight}; {math}"
