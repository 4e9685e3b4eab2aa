"""A GPU's kernel rows per launch shape, as the budget's `kernels[].shapes` lists them (attribute/budget.py): one
row per (kernel name, grid, block, registers per thread), longest first. A name launched with one shape gives one
row; the views that listed one row per name list these instead. Computes nothing the budget does not hold.
"""
from __future__ import annotations


def shape_rows(device: dict) -> list:
    """Rows {name, demangled, category, family, label, shape, ms_per_step, count_per_step, mean_us, shapes_of_name}
    of every kernel row's shapes (a memory op, or a budget without shapes: its name row, label ""), longest
    first."""
    rows = []
    for k in device.get("kernels") or []:
        base = {"name": k["name"], "demangled": k.get("demangled", k["name"]), "category": k["category"],
                "family": k.get("family")}
        shapes = k.get("shapes") or []
        if not shapes:
            count = k["count_per_step"]
            rows.append({**base, "label": "", "shape": None, "ms_per_step": k["ms_per_step"],
                         "count_per_step": count, "shapes_of_name": 0,
                         "mean_us": 1e3 * k["ms_per_step"] / count if count else 0.0})
            continue
        for s in shapes:
            rows.append({**base, "label": s["label"], "shape": s["shape"], "ms_per_step": s["ms_per_step"],
                         "count_per_step": s["count_per_step"], "mean_us": s["mean_us"],
                         "shapes_of_name": len(shapes)})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows


def short_kernel_line(device: dict) -> str | None:
    """`N launches/step under 5 µs: X ms/step (Y% of GPU op time)`; None when the budget has no such figure."""
    s = device.get("short_kernels")
    if not s:
        return None
    return (f"kernels under {s['under_us']:g} µs: {s['count_per_step']:.1f} launches/step, "
            f"{s['ms_per_step']:.3f} ms/step ({100.0 * s['share']:.1f}% of GPU op time)")
