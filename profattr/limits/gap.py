"""The gap between a capture and the hardware's limit: per category, floor vs measured, as a closed waterfall.

`compute_gap(budget, model_spec, hardware_spec)` is pure: it takes a `profattr.budget/1` dict and returns
`profattr.gap/1`. Per device, each budget category rolls up to a floor row (specs/category_floors.toml); a row's
floor is max(bytes it must move / memory bandwidth, FLOPs / peak). The waterfall starts at the sum of the floors
and adds, per row, measured - floor, then minus the time kernels overlapped on other streams, plus the idle time
inside the step; it ends exactly at the measured mean step (`floor_ms + sum(components) == measured_step_ms`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping, Optional

from profattr.limits.hardware import HardwareSpec
from profattr.limits.model import ModelSpec, tensor_category
from profattr.limits.specs import load_toml
from profattr.limits.render import render_gap_markdown  # noqa: F401  (re-exported for the report)

SCHEMA = "profattr.gap/1"
CLOSURE_TOLERANCE_MS = 1e-9
_GPU_FIELDS = {"id": "device", "memoryBandwidth": "memory_bandwidth_bytes_per_s", "smCount": "sm_count",
               "clockRate": "clock_hz", "totalMemory": "memory_bytes"}


def floor_loads(spec: ModelSpec, hw: HardwareSpec) -> Dict[str, Dict[str, float]]:
    """Per floor row: bytes one rank must move per step, FLOPs, and the compute time those FLOPs need at peak."""
    rows: Dict[str, Dict[str, float]] = {}

    def add(row: str, nbytes: float = 0.0, flops: float = 0.0, flops_s: float = 0.0, link_s: float = 0.0) -> None:
        entry = rows.setdefault(row, {"bytes": 0.0, "flops": 0.0, "compute_s": 0.0, "link_s": 0.0})
        entry["bytes"] += nbytes
        entry["flops"] += flops
        entry["compute_s"] += flops_s
        entry["link_s"] += link_s

    split = set(load_toml("category_floors.toml")["precision_split"]["categories"])
    for g in spec.groups:
        flops = g.rank_flops_per_token() * spec.batch
        row = f"{g.category}.{precision_suffix(g.dtype)}" if g.category in split else g.category
        add(row, g.rank_bytes_per_token(spec.tp, ideal=False), flops,
            flops / hw.peak_flops_per_s(g.dtype)[0] if flops else 0.0)
    bf16_peak = hw.peak_flops_per_s("bf16")[0]
    add(tensor_category("kv_cache_read"), spec.kv_cache_read_bytes, spec.attention_flops,
        spec.attention_flops / bf16_peak)
    add(tensor_category("kv_cache_write"), spec.kv_cache_bytes_per_token * spec.batch)
    if spec.indexer_keys_read_bytes:
        add(tensor_category("indexer_keys_read"), spec.indexer_keys_read_bytes)
    add(tensor_category("logits_read"), spec.logits_bytes * spec.batch)
    # ring all-reduce: each rank sends and receives 2(n-1)/n of the message; only the link time is a floor
    link_bytes = spec.allreduce_per_step * spec.allreduce_message_bytes * spec.batch * 2 * (spec.tp - 1) / spec.tp
    add(tensor_category("allreduce_link"), link_s=link_bytes / hw.link_bandwidth_bytes_per_s.value)
    return rows


def precision_suffix(dtype: str) -> str:
    """The taxonomy's precision suffix for the kernels of weights stored as `dtype` (nvfp4 -> fp4)."""
    return str(load_toml("quant.toml")["dtypes"].get(dtype, {}).get("taxonomy", dtype))


def fit_precision_rows(loads: Dict[str, Dict[str, float]], categories: Iterable[str]) -> Dict[str, Dict[str, float]]:
    """`loads` with the precision rows of a split category (gemm.fp8, gemm.bf16) merged back into one (gemm)
    where a measured category of it has no precision suffix (plain `gemm`, `gemm.grouped`)."""
    suffixes = {precision_suffix(d) for d in load_toml("quant.toml")["dtypes"]}
    suffixes |= set(load_toml("quant.toml")["dtypes"])
    out = dict(loads)
    for parent in load_toml("category_floors.toml")["precision_split"]["categories"]:
        under = [c for c in categories if c == parent or c.startswith(parent + ".")]
        if all(c.split(".")[1] in suffixes for c in under if c != parent) and parent not in under:
            continue
        merged = {"bytes": 0.0, "flops": 0.0, "compute_s": 0.0, "link_s": 0.0}
        for key in [k for k in out if k.startswith(parent + ".")]:
            for field, value in out.pop(key).items():
                merged[field] += value
        if any(merged.values()):
            out[parent] = merged
    return out


def row_of(category: str, keys: Iterable[str]) -> str:
    """The floor row a budget category rolls up to: the longest key equal to it or a '.'-prefix of it."""
    best = ""
    for key in keys:
        if (category == key or category.startswith(key + ".")) and len(key) > len(best):
            best = key
    return best or category


def budget_gpus(budget: Mapping[str, Any]) -> Dict[Any, Dict[str, Any]]:
    """The GPUs a budget dict read from its capture (`capture.gpus`), by device id, with the field names
    HardwareSpec.with_capture_gpu reads (device, memory_bandwidth_bytes_per_s, sm_count, clock_hz, memory_bytes)."""
    gpus = {}
    for gpu in (budget.get("capture") or {}).get("gpus") or []:
        row = {_GPU_FIELDS.get(k, k): v for k, v in gpu.items()}
        if "device" in row:
            gpus[row["device"]] = row
    return gpus


def _device_gap(device: Mapping[str, Any], loads: Dict[str, Dict[str, float]], hw: HardwareSpec,
                bandwidth_bytes_per_s: float) -> Dict[str, Any]:
    measured: Dict[str, float] = {}
    for cat in device.get("categories", []):
        row = row_of(cat["category"], loads)
        measured[row] = measured.get(row, 0.0) + float(cat["ms_per_step"])
    rows = []
    for row in sorted(set(measured) | set(loads)):
        load = loads.get(row, {"bytes": 0.0, "flops": 0.0, "compute_s": 0.0, "link_s": 0.0})
        memory_ms = load["bytes"] / bandwidth_bytes_per_s * 1e3
        compute_ms = load["compute_s"] * 1e3
        link_ms = load["link_s"] * 1e3
        floor_ms = max(memory_ms, compute_ms, link_ms)
        bound = "none" if floor_ms == 0 else ("link" if floor_ms == link_ms else
                                               "memory" if floor_ms == memory_ms else "compute")
        got = measured.get(row, 0.0)
        rows.append({"category": row, "measured_ms": got, "floor_ms": floor_ms, "floor_bytes": load["bytes"],
                     "floor_flops": load["flops"], "bound": bound,
                     "efficiency_pct": 100.0 * floor_ms / got if got > 0 and floor_ms > 0 else None,
                     "above_floor_ms": got - floor_ms,
                     "note": ("measured below its floor: its kernels are probably classified under another "
                              "category" if got < floor_ms else "")})
    rows.sort(key=lambda r: -r["measured_ms"])
    measured_step = float(device.get("mean_step_ms", device.get("step_ms", 0.0)))
    floor_total = math.fsum(r["floor_ms"] for r in rows)
    components = [{"component": r["category"], "ms": r["above_floor_ms"]} for r in
                  sorted(rows, key=lambda r: -r["above_floor_ms"]) if r["above_floor_ms"] != 0.0]
    overlap = float(device.get("overlap_ms_per_step", 0.0))
    if overlap:
        components.append({"component": "overlap (kernels running concurrently)", "ms": -overlap})
    components.append({"component": "idle (GPU waiting inside the step)",
                       "ms": float(device.get("idle_ms_per_step", 0.0))})
    residual = measured_step - math.fsum([floor_total] + [c["ms"] for c in components])
    if abs(residual) > CLOSURE_TOLERANCE_MS:
        # the budget's own numbers do not add up (e.g. categories missing from the dict): say so, keep closure
        components.append({"component": "unattributed (budget does not add up)", "ms": residual})
    return {
        "device": device.get("device"),
        "measured_step_ms": measured_step,
        "median_step_ms": device.get("step_ms"),
        "floor_ms": floor_total,
        "efficiency_pct": 100.0 * floor_total / measured_step if measured_step > 0 else None,
        "memory_bandwidth_bytes_per_s": bandwidth_bytes_per_s,
        "bandwidth_source": hw.memory_bandwidth_bytes_per_s.source,
        "categories": rows,
        "components": components,
    }


def compute_gap(budget: Mapping[str, Any], model_spec: ModelSpec, hardware_spec: HardwareSpec, *,
                capture_gpus: Optional[Mapping[Any, Mapping[str, Any]]] = None,
                bandwidth_fraction: float = 1.0) -> Dict[str, Any]:
    """`profattr.gap/1` for a budget dict: per device, category floors vs measured and the closed waterfall.

    capture_gpus: the capture's GPUs by device id, as budget_gpus gives them; default: the budget's own
    capture.gpus (budget_gpus). Their memory bandwidth replaces the preset's for that device.
    bandwidth_fraction: 1.0 compares against peak bandwidth; the preset's achievable fraction is the other choice.
    """
    gpus = dict(capture_gpus) if capture_gpus is not None else budget_gpus(budget)
    devices = []
    hardware_used = {}
    for device in budget.get("devices", []):
        gpu = gpus.get(device.get("device"))
        hw = hardware_spec.with_capture_gpu(dict(gpu)) if gpu else hardware_spec
        loads = fit_precision_rows(floor_loads(model_spec, hw),
                                   [str(c["category"]) for c in device.get("categories", [])])
        bandwidth = hw.memory_bandwidth_bytes_per_s.value * bandwidth_fraction
        devices.append(_device_gap(device, loads, hw, bandwidth))
        hardware_used[str(device.get("device"))] = {
            "memory_bandwidth_bytes_per_s": hw.memory_bandwidth_bytes_per_s.value,
            "source": hw.memory_bandwidth_bytes_per_s.source,
            "sm_count": hw.sm_count.value if hw.sm_count else None,
            "clock_hz": hw.clock_hz.value if hw.clock_hz else None}
    assumptions = [
        "a category's floor is max(bytes it must move / memory bandwidth, FLOPs / dense peak); communication's "
        "floor is its all-reduce payload over the GPU link",
        f"memory bandwidth: {'peak' if bandwidth_fraction == 1.0 else f'{bandwidth_fraction:.3f} x peak'}; "
        "a capture's own TARGET_INFO_GPU bandwidth replaces the preset's",
        f"weights split over {model_spec.tp} ranks as the engine does; every rank reads its share each step",
        f"KV cache at {model_spec.context_len} tokens ({model_spec.kv_cache_bytes_per_token:.0f} B per token "
        "per rank)",
        "category -> bytes mapping: profattr/limits/specs/category_floors.toml",
        *model_spec.notes,
    ]
    capture = budget.get("capture") or {}
    return {
        "schema": SCHEMA,
        "capture": {"path": capture.get("path"), "steps": budget.get("steps")},
        "model": model_spec.describe(),
        "hardware": {"id": hardware_spec.id, "name": hardware_spec.name, "by_device": hardware_used},
        "assumptions": assumptions,
        "devices": devices,
    }
