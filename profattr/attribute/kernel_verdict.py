"""The verdict on one profiled kernel launch (or on a family's median numbers), from Nsight Compute's counters, and
the thresholds it is decided by (data: THRESHOLDS, with the reason for each, goes into `profattr.drill/1`).

A verdict is one of four, decided in this order from the launch's own numbers:
- memory-bound near peak: DRAM (or, failing that, L1/L2) throughput at or above MEMORY_BOUND_PCT of peak;
- compute-bound: SM throughput at or above COMPUTE_BOUND_PCT of peak, and above the memory throughput;
- too few CTAs for the GPU: neither of the above, and the grid fills less than FEW_WAVES of the CTA slots the GPU
  holds at once (ncu's waves per SM), so SMs sit idle or hold too few warps to hide memory latency;
- latency-bound: neither throughput high although the grid fills the GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

MEMORY_BOUND_PCT = 60.0  # ncu's SOLBottleneck rule: under 60 % of peak on memory and compute "typically indicate
#                          latency issues"; at or above it, memory bandwidth is what ends the kernel
COMPUTE_BOUND_PCT = 60.0  # the same line of the same rule, for the SM pipelines
FEW_WAVES = 0.5  # under half the GPU's CTA slots filled: at least half its capacity idles (ncu's own Small Grid
#                  message fires below 1.0, which also flags grids that leave only a few of 132 SMs empty)
PROJECT_MIN_SHARE = 0.2  # the profiled launches must move at least this share of a category's floor bytes for
#                          their bandwidth to stand for the category's (a few small launches say little of the rest)
BORDERLINE_POINTS = 5.0  # a deciding throughput within this many points of its line is called borderline
BORDERLINE_WAVES = 0.05  # ... and waves per SM this close to FEW_WAVES (a few CTAs more or less cross it)
THRESHOLDS = {
    "memory_bound_pct": {"value": MEMORY_BOUND_PCT, "reason": "Nsight Compute's SOLBottleneck rule: memory and "
                         "compute throughput both under 60% of peak typically indicate latency issues"},
    "compute_bound_pct": {"value": COMPUTE_BOUND_PCT, "reason": "the same 60% line of the same rule, for the SMs"},
    "few_waves": {"value": FEW_WAVES, "reason": "a grid that fills under half of the CTA slots the GPU holds at once "
                  "(waves per SM) leaves at least half its capacity idle"},
    "project_min_share": {"value": PROJECT_MIN_SHARE, "reason": "the profiled launches must move at least this "
                          "share of a category's floor bytes for their bandwidth to stand for the whole category"},
    "borderline_points": {"value": BORDERLINE_POINTS, "reason": "a throughput this close to its line could fall "
                          "on either side of it in another run"},
    "borderline_waves": {"value": BORDERLINE_WAVES, "reason": "waves per SM this close to the few-waves line are a "
                         "few CTAs away from the other side of it"},
}
TITLES = {"memory_bound": "memory-bound near peak", "compute_bound": "compute-bound",
          "too_few_ctas": "too few CTAs for the GPU", "latency_bound": "latency-bound"}


@dataclass(frozen=True)
class Verdict:
    kind: str  # memory_bound | compute_bound | too_few_ctas | latency_bound
    title: str
    reason: str  # the numbers behind it
    borderline: bool  # a deciding throughput lies within BORDERLINE_POINTS of its line

    def to_dict(self) -> dict:
        return {"kind": self.kind, "title": self.title, "reason": self.reason, "borderline": self.borderline}


def verdict(n: Mapping) -> Verdict:
    """The verdict of one launch (or a family's medians): `n` holds dram_throughput_pct, sm_throughput_pct,
    memory_throughput_pct, waves_per_sm, grid_size, sm_count, achieved_occupancy_pct and optionally
    theoretical_occupancy_pct, ctas_per_sm, ctas_per_sm_limiter, dram_bytes_per_s."""
    dram, sm, mem = n["dram_throughput_pct"], n["sm_throughput_pct"], n["memory_throughput_pct"]
    ctas, sms, waves = n["grid_size"], n["sm_count"], n["waves_per_sm"]
    occ = (f"{n['achieved_occupancy_pct']:.1f}% achieved occupancy" if n.get("achieved_occupancy_pct") is not None
           else "occupancy not recorded (no Occupancy section)")
    if n.get("achieved_occupancy_pct") is not None and n.get("theoretical_occupancy_pct") is not None:
        occ += f" of {n['theoretical_occupancy_pct']:.1f}% theoretical"

    def near(value: float, line: float) -> bool:
        return abs(value - line) < BORDERLINE_POINTS

    if max(dram, mem) >= MEMORY_BOUND_PCT and max(dram, mem) >= sm:
        rate = n.get("dram_bytes_per_s")
        unit = (f"DRAM at {dram:.1f}% of peak" + (f" ({rate / 1e12:.2f} TB/s)" if rate else "")
                if dram >= MEMORY_BOUND_PCT else f"L1/L2 at {mem:.1f}% of peak (DRAM {dram:.1f}%)")
        return Verdict("memory_bound", TITLES["memory_bound"],
                       f"{unit}, SM {sm:.1f}%: memory bandwidth ends the kernel",
                       near(max(dram, mem), MEMORY_BOUND_PCT))
    if sm >= COMPUTE_BOUND_PCT:
        return Verdict("compute_bound", TITLES["compute_bound"],
                       f"SM throughput {sm:.1f}% of peak, DRAM {dram:.1f}%: the SM pipelines are the limit",
                       near(sm, COMPUTE_BOUND_PCT))
    busy = max(dram, mem, sm)
    line = near(busy, MEMORY_BOUND_PCT) or abs(waves - FEW_WAVES) < BORDERLINE_WAVES
    if waves < FEW_WAVES:
        slots = n.get("ctas_per_sm")
        holds = (f": the GPU holds {slots * sms} at once ({slots} per SM, limited by {n.get('ctas_per_sm_limiter')})"
                 if slots else "")
        idle = f"; {sms - ctas} of {sms} SMs get no CTA" if ctas < sms else ""
        text = (f"{ctas} CTA{'s' if ctas != 1 else ''} on {sms} SMs fill {waves:.2f} waves{holds}{idle}; DRAM "
                f"{dram:.1f}% and SM {sm:.1f}% of peak, {occ}")
        return Verdict("too_few_ctas", TITLES["too_few_ctas"], text, line)
    return Verdict("latency_bound", TITLES["latency_bound"],
                   f"{ctas} CTAs fill {waves:.2f} waves of {sms} SMs, yet DRAM runs at {dram:.1f}% and the SMs at "
                   f"{sm:.1f}% of peak (both under {MEMORY_BOUND_PCT:.0f}%), {occ}: warps wait on latency, not "
                   "bandwidth", line)
