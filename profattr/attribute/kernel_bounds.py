"""Why a profiled kernel is slow: one verdict per launch and per kernel family, from Nsight Compute's counters.

`analyse_drill(csv, categories, floors, measured_ms)` is pure: it takes an `NcuCsv` (trace/ncu_csv.py), the category
of each kernel name, the floor bytes per category (limits/kernel_floor.py) and the ms per step each category takes in
the nsys capture, and returns a `DrillAnalysis` whose `to_dict()` is `profattr.drill/1`. The verdicts and their
thresholds are in attribute/kernel_verdict.py, the families and per-name sentences in attribute/kernel_families.py;
here are what the drill's run.json says it asked for and kept, and each category's bytes against its floor.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from profattr.attribute.kernel_families import families_of, name_summaries
from profattr.attribute.kernel_verdict import PROJECT_MIN_SHARE, THRESHOLDS, verdict
from profattr.run_record import RunRecord, or_empty

SCHEMA = "profattr.drill/1"

# SGLang's log line when it runs a Triton kernel without a tuned config for the shape -> taxonomy family
DEFAULT_CONFIG_LINES = {"W8A8 Block FP8 kernel config": "sglang_triton_gemm", "MoE kernel config": "triton_fused_moe"}
_SHAPE = re.compile(r"/((?:[A-Z]=\d+,)+)device_name")


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
