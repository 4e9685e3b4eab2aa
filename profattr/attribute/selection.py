"""Which kernels of a budget deserve a closer look: the top kernel families of the decode step.

A family is the taxonomy's `family` label within a category (`triton_fused_moe` in moe.gemm, say), else the kernel's
own name. Families are ranked by their ms per step on the device that spends the most; each family contributes the
kernel names that make up at least `cover` of its time (at most `max_names`), so a regex of those names profiles
what matters and nothing else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    category: str
    family: str
    ms_per_step: float
    share_of_step: float
    names: tuple  # kernel short names, largest first
    launches_per_step: float


def top_families(budget: dict, top: int = 4, cover: float = 0.9, max_names: int = 4,
                 device: int | None = None) -> list:
    """The `top` families of `budget` (a profattr.budget/1 dict) on `device` (default: the slowest device)."""
    devices = budget.get("devices") or []
    if not devices:
        return []
    d = (next((x for x in devices if x["device"] == device), None) if device is not None
         else max(devices, key=lambda x: x["step_ms"]))
    if d is None:
        return []
    groups: dict = {}
    for k in d["kernels"]:
        if k["category"].startswith("memory."):
            continue
        key = (k["category"], k.get("family") or k["name"])
        groups.setdefault(key, []).append(k)
    ranked = sorted(groups.items(), key=lambda kv: -sum(k["ms_per_step"] for k in kv[1]))[:max(top, 0)]
    out = []
    for (category, family), kernels in ranked:
        kernels.sort(key=lambda k: -k["ms_per_step"])
        total = sum(k["ms_per_step"] for k in kernels)
        names, acc, launches = [], 0.0, 0.0
        for k in kernels:
            if k["name"] not in names:
                names.append(k["name"])
            acc += k["ms_per_step"]
            launches += k["count_per_step"]
            if acc >= cover * total or len(names) >= max_names:
                break
        out.append(Family(category, family, total, total / d["mean_step_ms"] if d["mean_step_ms"] else 0.0,
                          tuple(names), launches))
    return out


def launch_count(families: list, steps: int) -> int:
    """Launches that cover `steps` decode steps of every chosen kernel."""
    return max(1, int(math.ceil(sum(f.launches_per_step for f in families) * steps)))
