"""Why a profiled kernel is slow: one verdict per launch and per kernel family, from Nsight Compute's counters.

`analyse_drill(csv, categories, floors, measured_ms)` is pure: it takes an `NcuCsv` (trace/ncu_csv.py), the category
of each kernel name, the floor bytes per category (limits/kernel_floor.py) and the ms per step each category takes in
the nsys capture, and returns a `DrillAnalysis` whose `to_dict()` is `profattr.drill/1`.

A verdict is one of four, decided in this order from the launch's own numbers (the thresholds below are data):
- memory-bound near peak: DRAM (or, failing that, L1/L2) throughput at or above MEMORY_BOUND_PCT of peak;
- compute-bound: SM throughput at or above COMPUTE_BOUND_PCT of peak, and above the memory throughput;
- too few CTAs for the GPU: neither of the above, and the grid fills less than FEW_WAVES of the CTA slots the GPU
  holds at once (ncu's waves per SM), so SMs sit idle or hold too few warps to hide memory latency;
- latency-bound: neither throughput high although the grid fills the GPU.
A family is the launches of one kernel with one launch shape (grid, block and registers per thread: another Triton
or CUTLASS specialization, or another M of the same GEMM, is another family); its verdict is that of its median
numbers, and its sentence names the shape it is about.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from profattr.run_record import RunRecord, or_empty

SCHEMA = "profattr.drill/1"

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
# SGLang's log line when it runs a Triton kernel without a tuned config for the shape -> taxonomy family
DEFAULT_CONFIG_LINES = {"W8A8 Block FP8 kernel config": "sglang_triton_gemm", "MoE kernel config": "triton_fused_moe"}
_SHAPE = re.compile(r"/((?:[A-Z]=\d+,)+)device_name")
STAT_FIELDS = ("duration_ns", "dram_bytes", "dram_bytes_per_s", "dram_throughput_pct", "sm_throughput_pct",
               "memory_throughput_pct", "achieved_occupancy_pct")


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


def default_configs(run: Optional[RunRecord]) -> Dict[str, list]:
    """taxonomy family -> the shapes SGLang's log says it ran with its default (untuned) Triton config."""
    events = or_empty(run).log_events("default_kernel_config")
    out: Dict[str, list] = {}
    for e in events:
        text = str(e.get("text", "")) if isinstance(e, dict) else str(e)
        for needle, family in DEFAULT_CONFIG_LINES.items():
            if needle in text:
                m = _SHAPE.search(text)
                shape = m.group(1).rstrip(",") if m else "?"
                shapes = out.setdefault(family, [])
                if shape not in shapes:
                    shapes.append(shape)
    return out


def _launch_count(run: RunRecord) -> Optional[int]:
    if run.drill_launch_count is not None:
        return run.drill_launch_count
    cmd = run.profile_command
    for flag, value in zip(cmd, cmd[1:]):
        if flag == "--launch-count" and str(value).isdigit():
            return int(value)
    return None


def drill_info(run: Optional[RunRecord], profiled: int) -> dict:
    """What the drill asked for and what it kept, from its run.json: status, graph mode, regex, launches asked for
    and profiled, ncu's own errors from the server log; `complete` is False when the drill did not finish."""
    if not run:
        return {"run_json": False, "complete": None, "profiled": profiled, "notes": [
            "no run.json beside the CSV: what the drill asked for (kernels, launches, graph mode) is unknown"]}
    status = run.status
    requested = _launch_count(run)
    notes = []
    complete = status == "complete"
    if status == "interrupted":
        notes.append(f"the drill did not finish: run.json status 'interrupted' (stopped by Ctrl-C or a time limit "
                     f"such as `timeout`); ncu kept {profiled} of the {requested or '?'} launches asked for")
    elif status != "complete":
        notes.append(f"the drill did not finish: run.json status {status!r}; ncu kept {profiled} launches")
    elif requested and profiled < requested:
        notes.append(f"ncu profiled {profiled} of the {requested} launches asked for: the window held fewer "
                     "launches of these kernels")
    errors = run.log_events("error")
    failed = [str(e.get("text", "")) for e in errors if isinstance(e, dict) and "Failed to profile" in
              str(e.get("text", ""))]
    for text in failed:
        notes.append("ncu: " + text.replace("==ERROR== ", ""))
    graphs = run.drill_graphs
    if not graphs:
        args = run.server_args
        graphs = ("eager (--disable-cuda-graph)" if "--disable-cuda-graph" in args
                  else "CUDA graphs, kernels profiled as graph nodes (--graph-profiling node)")
    return {"run_json": True, "name": run.name, "status": status, "complete": complete, "of": run.drill_of,
            "graphs": graphs, "kernel_regex": run.drill_kernel_regex, "kernel_base": run.drill_kernel_base,
            "launches_requested": requested, "profiled": profiled, "steps": run.drill_steps,
            "ncu_version": run.ncu_version, "backend": run.backend_sglang, "model": run.model, "notes": notes}


def _peak_bytes_per_s(kernels: Sequence) -> Optional[float]:
    """ncu's own DRAM peak: bytes/s over the share of peak they are (launches above 5 % of peak, median)."""
    peaks = [k.dram_bytes_per_s / (k.dram_throughput_pct / 100.0) for k in kernels if k.dram_throughput_pct >= 5.0]
    return statistics.median(peaks) if peaks else None


def category_rows(kernels: Sequence, categories: Mapping[str, str], floors: Mapping[str, Optional[dict]],
                  measured_ms: Mapping[str, float], peak: Optional[float]) -> List[dict]:
    """Per category of the drilled kernels: launches, DRAM bytes, time and bandwidth over the profiled launches,
    and against them the floor bytes per step (weights read once), its time at ncu's peak and at the drilled
    bandwidth, and the ms per step the capture measures."""
    by_cat: Dict[str, list] = {}
    for k in kernels:
        by_cat.setdefault(categories.get(k.name, "unclassified"), []).append(k)
    rows = []
    for cat, ks in by_cat.items():
        nbytes = sum(k.dram_bytes for k in ks)
        ns = sum(k.duration_ns for k in ks)
        rate = nbytes / (ns * 1e-9) if ns else 0.0
        floor = floors.get(cat)
        row = {"category": cat, "launches": len(ks), "dram_bytes": nbytes, "duration_ns": ns,
               "dram_bytes_per_s": rate, "dram_pct_of_peak": 100.0 * rate / peak if peak else None,
               "floor": floor, "measured_ms_per_step": measured_ms.get(cat)}
        if floor:
            share = nbytes / floor["bytes_per_step"]
            row["floor_ms_at_peak"] = floor["bytes_per_step"] / peak * 1e3 if peak else None
            # the category's floor bytes at the bandwidth its profiled launches reached: what the category would
            # take per step if every launch streamed like these (only when they are a fair share of it)
            row["floor_ms_at_drilled_bandwidth"] = (floor["bytes_per_step"] / rate * 1e3
                                                    if rate and share >= PROJECT_MIN_SHARE else None)
            row["drilled_share_of_floor_bytes"] = share
        rows.append(row)
    rows.sort(key=lambda r: -r["duration_ns"])
    return rows


@dataclass
class DrillAnalysis:
    csv: str
    ncu_version: Optional[str]
    info: dict
    kernels: list  # NcuKernel
    verdicts: list  # Verdict per kernel, same order
    categories: dict  # kernel name -> category
    families: list
    names: list  # name_summaries
    category_rows: list
    peak_dram_bytes_per_s: Optional[float]
    sm_clock_hz: Optional[float]
    assumptions: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """`profattr.drill/1`."""
        return {
            "schema": SCHEMA, "csv": self.csv, "ncu_version": self.ncu_version, "drill": self.info,
            "thresholds": THRESHOLDS, "peak_dram_bytes_per_s": self.peak_dram_bytes_per_s,
            "sm_clock_hz": self.sm_clock_hz,
            "kernels": [{**k.to_dict(), "category": self.categories.get(k.name, "unclassified"),
                         "verdict": v.to_dict()} for k, v in zip(self.kernels, self.verdicts)],
            "families": [f.to_dict() for f in self.families],
            "names": self.names, "categories": self.category_rows, "assumptions": self.assumptions,
        }


def analyse_drill(ncu, categories: Mapping[str, str], families: Mapping[str, Optional[str]] = None,
                  floors: Mapping[str, Optional[dict]] = None, measured_ms: Mapping[str, float] = None,
                  assumptions: Sequence[str] = (), capture_kernels: Mapping[str, dict] = None,
                  capture_shapes: Mapping[tuple, dict] = None) -> DrillAnalysis:
    """Verdicts, families, per-name sentences and per-category floor comparison of one drill.

    ncu: an NcuCsv. categories / families: kernel name (as in the CSV) -> taxonomy category / family. floors:
    category -> kernel_floor.category_floor(...) or None. measured_ms: category -> ms per step in the capture;
    capture_kernels: kernel name -> {ms_per_step, count_per_step} in the capture; capture_shapes: the same per
    shape_key (short name, grid, block, registers per thread)."""
    kernels = list(ncu.kernels)
    peak = _peak_bytes_per_s(kernels)
    clocks = [k.sm_clock_hz for k in kernels if k.sm_clock_hz]
    fams = families_of(kernels, categories, capture_shapes)
    names = name_summaries(fams, families or {}, default_configs(ncu.run), capture_kernels)
    notes = list(assumptions)
    notes.append("DRAM bytes: " + kernels[0].dram_bytes_source)
    gpus = or_empty(ncu.run).gpus
    boost = gpus[0].get("clocks_max_sm_mhz") if gpus else None
    if clocks:
        notes.append(f"ncu ran the SMs at {statistics.median(clocks) / 1e9:.2f} GHz (gpc__cycles_elapsed.avg."
                     "per_second; ncu fixes the clocks by default, --clock-control base)"
                     + (f", the GPU boosts to {boost / 1e3:.2f} GHz (run.json): durations here are longer than in "
                        "an nsys capture; shares of peak are what the verdicts use" if boost else ""))
    if peak:
        notes.append(f"DRAM peak {peak / 1e12:.2f} TB/s: ncu's own (bytes/s over the share of peak they are)")
    missing = tuple(ncu.missing_sections)
    if missing:
        notes.append(f"collected without the {', '.join(missing)} section(s): occupancy not reported")
    info = drill_info(ncu.run, len(kernels))
    info["skipped_rows"] = {reason: n for reason, n in ncu.skipped}
    info["missing_sections"] = list(missing)
    return DrillAnalysis(
        csv=str(ncu.path), ncu_version=ncu.ncu_version, info=info, kernels=kernels,
        verdicts=[verdict(k.__dict__) for k in kernels], categories=dict(categories), families=fams, names=names,
        category_rows=category_rows(kernels, categories, floors or {}, measured_ms or {}, peak),
        peak_dram_bytes_per_s=peak, sm_clock_hz=statistics.median(clocks) if clocks else None, assumptions=notes)
