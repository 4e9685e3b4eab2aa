"""Hardware specs (specs/hardware/*.toml): bandwidth, peak FLOPs, interconnect, all-reduce and launch costs.

Every number carries its source. For a capture, the GPU's own TARGET_INFO_GPU fields (memory bandwidth, SM count,
clock) override the preset (`HardwareSpec.with_capture_gpu`, given a GPU a budget read: gap.budget_gpus).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from profattr.errors import ProfattrError
from profattr.limits.specs import load_toml, preset_ids

# lower-precision formats fall back to the next format the GPU has tensor cores for
_FLOPS_FALLBACK = {"nvfp4": ("fp4", "fp8", "bf16"), "fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"),
                   "bf16": ("bf16",), "fp32": ("bf16",)}


@dataclass(frozen=True)
class Sourced:
    """A number and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class AllReduceModel:
    """Small-message all-reduce latency: measured (gpus, bytes, us) points, interpolated in message size."""

    points: Tuple[Tuple[int, int, float], ...]
    source: str

    def latency_us(self, gpus: int, message_bytes: int) -> Tuple[float, str]:
        """Latency of one all-reduce over `gpus` ranks, and how it was obtained (which points, any stand-in)."""
        counts = sorted({p[0] for p in self.points})
        used = min(counts, key=lambda n: (abs(math.log(n / gpus)), -n))
        note = "" if used == gpus else f"; no {gpus}-GPU measurement, {used}-GPU points used"
        pts = sorted((b, us) for n, b, us in self.points if n == used)
        sizes = [b for b, _ in pts]
        if message_bytes <= sizes[0]:
            return pts[0][1], f"{pts[0][1]:g} us measured at {sizes[0]} B{note}"
        if message_bytes >= sizes[-1]:
            return pts[-1][1], f"{pts[-1][1]:g} us measured at {sizes[-1]} B (not extrapolated){note}"
        i = bisect.bisect_left(sizes, message_bytes)
        (b0, u0), (b1, u1) = pts[i - 1], pts[i]
        us = u0 + (u1 - u0) * (message_bytes - b0) / (b1 - b0)
        return us, f"interpolated between {u0:g} us at {b0} B and {u1:g} us at {b1} B{note}"


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU model's numbers, each with its source."""

    id: str
    name: str
    device_names: Tuple[str, ...]
    dsa_runs: bool
    memory_bandwidth_bytes_per_s: Sourced
    achievable_bandwidth_fraction: Sourced
    flops_per_s: Dict[str, Sourced]
    interconnect: str
    link_bandwidth_bytes_per_s: Sourced
    allreduce: Dict[str, AllReduceModel]
    kernel_launch_us: Sourced
    graph_launch_us: Sourced
    graph_node_us: Sourced
    sm_count: Optional[Sourced] = None
    clock_hz: Optional[Sourced] = None
    memory_bytes: Optional[Sourced] = None

    def peak_flops_per_s(self, dtype: str) -> Tuple[float, str]:
        """Dense tensor-core peak for weights stored as `dtype`, and the format it was taken for."""
        for fmt in _FLOPS_FALLBACK.get(dtype, ("bf16",)):
            if fmt in self.flops_per_s:
                return self.flops_per_s[fmt].value, fmt
        raise ProfattrError(f"hardware {self.id} lists no peak FLOPs for {dtype}")

    def allreduce_us(self, impl: str, gpus: int, message_bytes: int) -> Tuple[float, str]:
        """Latency of one all-reduce with implementation `impl` (nccl, oneshot)."""
        if impl not in self.allreduce:
            valid = ", ".join(sorted(self.allreduce))
            raise ProfattrError(f"unknown all-reduce {impl!r} for {self.id}; valid: {valid}")
        return self.allreduce[impl].latency_us(gpus, message_bytes)

    def with_capture_gpu(self, gpu: Dict[str, Any]) -> "HardwareSpec":
        """This spec with the capture's own TARGET_INFO_GPU fields in place of the preset's, where present."""
        where = f"capture TARGET_INFO_GPU (device {gpu.get('device')}: {gpu.get('name')})"
        changes: Dict[str, Any] = {}
        for key in ("memory_bandwidth_bytes_per_s", "sm_count", "clock_hz", "memory_bytes"):
            value = gpu.get(key)
            if isinstance(value, (int, float)) and value > 0:
                changes[key] = Sourced(float(value), where)
        return replace(self, **changes)


def _sourced(entry: Optional[Dict[str, Any]]) -> Optional[Sourced]:
    return Sourced(float(entry["value"]), str(entry["source"])) if entry else None


def hardware_presets() -> List[str]:
    """Ids of the shipped hardware presets."""
    return sorted({load_toml(f"hardware/{f}")["id"] for f in preset_ids("hardware").values()})


def load_hardware(name: str) -> HardwareSpec:
    """HardwareSpec of preset `name` (an id or alias, case-insensitive)."""
    presets = preset_ids("hardware")
    if name.lower() not in presets:
        raise ProfattrError(f"unknown hardware {name!r}; valid: {', '.join(hardware_presets())}")
    data = load_toml(f"hardware/{presets[name.lower()]}")
    allreduce = {
        impl: AllReduceModel(tuple((int(p["gpus"]), int(p["bytes"]), float(p["us"])) for p in table["points"]),
                             table["source"])
        for impl, table in data.get("allreduce", {}).items()
    }
    launch = data["launch"]
    return HardwareSpec(
        id=data["id"], name=data["name"], device_names=tuple(data.get("device_names", ())),
        dsa_runs=bool(data.get("dsa_runs", True)),
        memory_bandwidth_bytes_per_s=_sourced(data["memory_bandwidth_bytes_per_s"]),
        achievable_bandwidth_fraction=_sourced(data["achievable_bandwidth_fraction"]),
        flops_per_s={k: _sourced(v) for k, v in data["flops_per_s"].items()},
        interconnect=data["interconnect"]["kind"],
        link_bandwidth_bytes_per_s=_sourced(data["interconnect"]["link_bandwidth_bytes_per_s"]),
        allreduce=allreduce, kernel_launch_us=_sourced(launch["kernel_launch_us"]),
        graph_launch_us=_sourced(launch["graph_launch_us"]), graph_node_us=_sourced(launch["graph_node_us"]),
        sm_count=_sourced(data.get("sm_count")), memory_bytes=_sourced(data.get("memory_bytes")),
        clock_hz=_sourced(data.get("clock_hz")),
    )


def match_hardware(device_name: str) -> Optional[str]:
    """Id of the preset whose device names occur in `device_name` (longest match), or None."""
    best: Tuple[int, Optional[str]] = (0, None)
    for hw_id in hardware_presets():
        for pattern in load_hardware(hw_id).device_names:
            if pattern.lower() in device_name.lower() and len(pattern) > best[0]:
                best = (len(pattern), hw_id)
    return best[1]
