"""Kernel families of one drill and one sentence per kernel name: what the profiled launches say, shape by shape.

A family is the launches of one kernel with one launch shape (grid, block and registers per thread: another Triton
or CUTLASS specialization, or another M of the same GEMM, is another family); its verdict (attribute/kernel_verdict.py)
is that of its median numbers, and its sentence names the shape it is about. A name's sentence groups its families by
verdict and says what to try (ADVICE, FAMILY_ADVICE).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from profattr.attribute.kernel_verdict import TITLES, Verdict, verdict

# what to try, per verdict; per taxonomy family where the kernel's own knobs are known
ADVICE = {
    "too_few_ctas": "launch more CTAs per call (split-K or smaller tiles for this M) or use a kernel built for "
                    "small M",
    "latency_bound": "keep more bytes in flight per SM (deeper pipelining, more warps per SM) or do the work in "
                     "fewer, larger launches",
    "memory_bound": "bandwidth is the limit: moving fewer bytes (a smaller weight format, fused reads) helps most",
    "compute_bound": "fewer or cheaper instructions (tensor-core paths, lower precision)",
}
FAMILY_ADVICE = {
    ("sglang_triton_gemm", "too_few_ctas"): "tune its Triton config for M=1 or switch SGLang's FP8 GEMM backend "
                                            "(--fp8-gemm-backend)",
    ("sglang_triton_gemm", "latency_bound"): "tune its Triton config for M=1 or switch SGLang's FP8 GEMM backend "
                                             "(--fp8-gemm-backend)",
    ("triton_fused_moe", "too_few_ctas"): "tune the fused-MoE Triton config for this E, N and batch or use another "
                                          "--moe-runner-backend",
    ("triton_fused_moe", "latency_bound"): "tune the fused-MoE Triton config for this E, N and batch or use "
                                           "another --moe-runner-backend",
}
STAT_FIELDS = ("duration_ns", "dram_bytes", "dram_bytes_per_s", "dram_throughput_pct", "sm_throughput_pct",
               "memory_throughput_pct", "achieved_occupancy_pct")


def _stats(values: Sequence[Optional[float]]) -> Optional[dict]:
    """min, median and max; None when a value is missing (a section the report was collected without)."""
    if any(v is None for v in values):
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


@dataclass
class Family:
    """The launches of one kernel name with one launch shape (grid, block, registers per thread)."""

    name: str
    short_name: str
    category: str
    grid: tuple
    block: tuple
    grid_size: int
    block_size: int
    ids: list
    stats: dict  # field -> {min, median, max}
    waves_per_sm: float
    sm_count: int
    registers_per_thread: int
    ctas_per_sm: Optional[int]
    ctas_per_sm_limiter: Optional[str]
    theoretical_occupancy_pct: Optional[float]
    total_ns: float  # summed duration of its launches
    verdict: Verdict
    launch_verdicts: dict  # verdict kind -> launches
    capture: Optional[dict] = None  # {ms_per_step, count_per_step} of the same kernel and shape in the capture

    @property
    def label(self) -> str:
        from profattr.trace.ops import shape_label

        return shape_label({"grid": list(self.grid), "block": list(self.block),
                            "registers_per_thread": self.registers_per_thread})

    @property
    def sentence(self) -> str:
        """One line about this shape: launches, median duration, achieved DRAM bandwidth, the verdict."""
        dur, rate = self.stats["duration_ns"]["median"], self.stats["dram_bytes_per_s"]["median"]
        dram = self.stats["dram_throughput_pct"]["median"]
        text = (f"{self.short_name} {self.label}: {self.launches} launch{'es' if self.launches != 1 else ''}, "
                f"median {dur / 1e3:.1f} µs, DRAM {rate / 1e12:.2f} TB/s ({dram:.1f}% of peak), {self.grid_size} "
                f"CTA{'s' if self.grid_size != 1 else ''} = {self.waves_per_sm:.2f} waves: {self.verdict.title}")
        if self.capture:
            gemms = self.capture.get("gemm") or []
            dims = ("; as GEMM" + ("s " if len(gemms) > 1 else " ")
                    + ", ".join((f"M={g['m']} " if g.get("m") else "") + f"N={g['n']} K={g['k']}" for g in gemms)
                    if gemms else "")
            text += (f" (the capture runs this shape {self.capture['count_per_step']:.1f}x per step, "
                     f"{self.capture['ms_per_step']:.3f} ms{dims})")
        return text

    @property
    def launches(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict:
        return {"name": self.name, "short_name": self.short_name, "category": self.category, "label": self.label,
                "sentence": self.sentence, "capture": self.capture, "grid": list(self.grid),
                "block": list(self.block), "grid_size": self.grid_size, "block_size": self.block_size,
                "launches": self.launches, "ids": list(self.ids), "total_duration_ns": self.total_ns,
                **self.stats, "waves_per_sm": self.waves_per_sm, "sm_count": self.sm_count,
                "registers_per_thread": self.registers_per_thread, "ctas_per_sm": self.ctas_per_sm,
                "ctas_per_sm_limiter": self.ctas_per_sm_limiter,
                "theoretical_occupancy_pct": self.theoretical_occupancy_pct, "verdict": self.verdict.to_dict(),
                "launch_verdicts": dict(self.launch_verdicts)}


def shape_key(short_name: str, grid, block, registers_per_thread) -> tuple:
    """What matches a drilled family to the capture's launches of the same kernel and shape."""
    return (short_name, tuple(int(v) for v in grid), tuple(int(v) for v in block), int(registers_per_thread))


def families_of(kernels: Sequence, categories: Mapping[str, str],
                capture_shapes: Mapping[tuple, dict] = None) -> List[Family]:
    """Kernel families (one per kernel and launch shape), largest summed duration first. capture_shapes:
    shape_key -> {ms_per_step, count_per_step} of that kernel and shape in the nsys capture."""
    groups: Dict[tuple, list] = {}
    for k in kernels:
        groups.setdefault((k.name, k.grid, k.block, k.registers_per_thread), []).append(k)
    out = []
    for (name, grid, block, _), ks in groups.items():
        stats = {f: _stats([getattr(k, f) for k in ks]) for f in STAT_FIELDS}
        first = ks[0]
        numbers = {f: stats[f]["median"] if stats[f] else None for f in STAT_FIELDS}
        numbers.update(grid_size=first.grid_size, sm_count=first.sm_count,
                       waves_per_sm=statistics.median(k.waves_per_sm for k in ks), ctas_per_sm=first.ctas_per_sm,
                       ctas_per_sm_limiter=first.ctas_per_sm_limiter,
                       theoretical_occupancy_pct=first.theoretical_occupancy_pct)
        launch_verdicts: Dict[str, int] = {}
        for k in ks:
            kind = verdict(k.__dict__).kind
            launch_verdicts[kind] = launch_verdicts.get(kind, 0) + 1
        fam = Family(name=name, short_name=first.short_name, category=categories.get(name, "unclassified"),
                     grid=grid, block=block, grid_size=first.grid_size, block_size=first.block_size,
                     ids=[k.id for k in ks], stats=stats, waves_per_sm=numbers["waves_per_sm"],
                     sm_count=first.sm_count, registers_per_thread=first.registers_per_thread,
                     ctas_per_sm=first.ctas_per_sm, ctas_per_sm_limiter=first.ctas_per_sm_limiter,
                     theoretical_occupancy_pct=first.theoretical_occupancy_pct,
                     total_ns=sum(k.duration_ns for k in ks), verdict=verdict(numbers),
                     launch_verdicts=launch_verdicts,
                     capture=(capture_shapes or {}).get(shape_key(first.short_name, grid, block,
                                                                  first.registers_per_thread)))
        out.append(fam)
    return sorted(out, key=lambda f: -f.total_ns)


def _range(lo: float, hi: float, fmt: str) -> str:
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}-{b}"


def name_summaries(families: Sequence[Family], family_of: Mapping[str, Optional[str]],
                   default_configs: Mapping[str, list], capture_kernels: Mapping[str, dict] = None) -> List[dict]:
    """Per kernel name: its families grouped by verdict (launches, share of the name's profiled time, CTA and DRAM
    ranges) and one sentence that states them, largest verdict first; names by profiled time, largest first.
    capture_kernels: kernel name -> {ms_per_step, count_per_step} of the same kernel in the nsys capture."""
    capture_kernels = capture_kernels or {}
    by_name: Dict[str, List[Family]] = {}
    for f in families:
        by_name.setdefault(f.name, []).append(f)
    out = []
    for name, fams in by_name.items():
        total = sum(f.total_ns for f in fams)
        groups = []
        for kind in dict.fromkeys(f.verdict.kind for f in fams):
            fs = [f for f in fams if f.verdict.kind == kind]
            ns = sum(f.total_ns for f in fs)
            groups.append({
                "verdict": kind, "title": TITLES[kind], "launches": sum(f.launches for f in fs),
                "families": len(fs), "share_of_time": ns / total if total else 0.0, "duration_ns": ns,
                "ctas": [min(f.grid_size for f in fs), max(f.grid_size for f in fs)],
                "dram_pct": [min(f.stats["dram_throughput_pct"]["min"] for f in fs),
                             max(f.stats["dram_throughput_pct"]["max"] for f in fs)],
                "sm_pct": [min(f.stats["sm_throughput_pct"]["min"] for f in fs),
                           max(f.stats["sm_throughput_pct"]["max"] for f in fs)]})
        groups.sort(key=lambda g: -g["duration_ns"])
        first = fams[0]
        family = family_of.get(name)
        main = groups[0]
        launches = sum(f.launches for f in fams)
        grids = _range(main["ctas"][0], main["ctas"][1], "d")
        dram = _range(main["dram_pct"][0], main["dram_pct"][1], ".1f")
        seen = capture_kernels.get(name)
        facts = []
        if main["launches"] != launches:
            facts.append(f"{100 * main['share_of_time']:.0f}% of their time")
        elif seen:
            facts.append(f"{launches} launch{'es' if launches != 1 else ''} profiled")
        one = fams[0].capture if len(fams) == 1 else None  # the one drilled shape, as the capture runs it
        if seen and one and abs(one["count_per_step"] - seen["count_per_step"]) > 1e-9:
            facts.append(f"the capture runs this shape {one['count_per_step']:.1f}x per step, "
                         f"{one['ms_per_step']:.3f} ms (the name with its other shapes: {seen['count_per_step']:.1f}x, "
                         f"{seen['ms_per_step']:.3f} ms)")
        elif seen:
            facts.append(f"the capture runs it {seen['count_per_step']:.1f}x per step, {seen['ms_per_step']:.3f} ms")
        part = (f" in {main['launches']} of its {launches} profiled launches" if main["launches"] != launches
                else "") + (f" ({'; '.join(facts)})" if facts else "")
        mixed = {}
        for f in fams:
            if f.verdict.kind == main["verdict"] and len(f.launch_verdicts) > 1:
                for kind, count in f.launch_verdicts.items():
                    mixed[kind] = mixed.get(kind, 0) + count
        mix = (" (by its median; launch by launch: "
               + ", ".join(f"{c} {TITLES[k]}" for k, c in sorted(mixed.items(), key=lambda kv: -kv[1])) + ")"
               if mixed else "")
        advice = FAMILY_ADVICE.get((family, main["verdict"]), ADVICE[main["verdict"]])
        what = f"{first.short_name} ({first.label})" if len(fams) == 1 else first.short_name
        sentence = (f"{what} runs grid{'s' if main['ctas'][0] != main['ctas'][1] else ''} of {grids} "
                    f"CTAs on a {first.sm_count}-SM GPU at {dram}% of DRAM peak{part}: {main['title']}{mix}; "
                    f"{advice}")
        shapes = default_configs.get(family) if family else None
        if shapes:
            sentence += (f" (SGLang's log: no tuned config for {len(shapes)} shape{'s' if len(shapes) > 1 else ''} "
                         f"on this GPU, e.g. {', '.join(shapes[:2])}, so it ran its default)")
        others = [f"{g['launches']} launch{'es' if g['launches'] > 1 else ''} {g['title']} "
                  f"({_range(g['ctas'][0], g['ctas'][1], 'd')} CTAs, DRAM "
                  f"{_range(g['dram_pct'][0], g['dram_pct'][1], '.1f')}%)" for g in groups[1:]]
        if others:
            sentence += "; the rest: " + ", ".join(others)
        out.append({"name": name, "short_name": first.short_name, "category": first.category, "family": family,
                    "launches": launches, "duration_ns": total, "verdicts": groups,
                    "shapes": [{"label": f.label, "verdict": f.verdict.kind, "sentence": f.sentence} for f in fams],
                    "capture_ms_per_step": seen["ms_per_step"] if seen else None,
                    "capture_count_per_step": seen["count_per_step"] if seen else None, "sentence": sentence})
    out.sort(key=lambda s: -s["duration_ns"])
    return out
