"""Did the profiler keep everything it saw? A capture can look complete and not be: Nsight Systems 2023.4.4 on a
CUDA 13 stack kept 50 of the 6,160 kernels of a GLM-5-shaped decode (and no graph launch), while every NVTX step
range was recorded and its importer only said "Errors occurred while processing the raw events".

- records: gaps in the correlation ids of each process's recorded CUDA calls far larger than the usual gap (dropped
  records);
- window_coverage: GPU activity that starts late or stops long before the window's other records (NVTX, CUDA calls)
  end;
- steps_with_gpu_work: step ranges that launched no GPU work at all;
- graphs_recorded: the server log says decode ran under CUDA graphs, but the capture holds no graph launch;
- profiler_version: an nsys known to lose records on the capture's CUDA driver; nsys's own warnings;
- twin: kernels per step against an eager or torch-profiler twin of the same decode, when one is given.
Each says the likely cause (old nsys for this CUDA, buffer loss, window closed early) and what to do.
"""
from __future__ import annotations

from profattr.check import FAIL, PASS, SKIP, WARN, Finding
from profattr.check.correlation_ids import CorrelationIds
from profattr.run_record import RunRecord, or_empty
from profattr.tools.nsys import parse_version

COVERAGE_FAIL = 0.5  # GPU activity covering less than half of the window's records
COVERAGE_WARN = 0.75
EMPTY_STEPS_FAIL = 0.25  # share of step ranges without GPU work
TWIN_TOLERANCE = 0.05  # kernels per step may differ this much from the twin
LOST_IDS_FAIL = 0.5  # correlation ids missing in big gaps, as a share of the id span
# Nsight Systems releases seen losing records on a CUDA driver this new or newer (CUDA version as 1000 * major)
LOSSY = [((2023, 4), 13000, "nsys 2023.4.4 kept 1% of a CUDA 13 decode's activity (50 of 6,160 kernels) here")]
CAUSE = ("records were lost: an nsys too old for this CUDA (use 2024.2.3 or newer: scripts/install-nsys), a CUPTI "
         "buffer that overflowed (--cuda-flush-interval), or a window closed early")


def check_records(source) -> Finding:
    gaps = source.fold_api_keys(CorrelationIds).result()
    if not gaps["processes"]:
        return Finding("records", SKIP, "too few CUDA calls to check their correlation ids")
    lost = gaps["ids_in_big_gaps"] / gaps["span"] if gaps["span"] else 0.0
    data = dict(gaps, lost_share=lost)
    if not gaps["big_gaps"]:
        return Finding("records", PASS, f"correlation ids of the recorded CUDA calls run without big gaps (largest "
                       f"{gaps['largest_gap']}, usual {gaps['usual_gap']})", data)
    status = FAIL if lost > LOST_IDS_FAIL else WARN
    return Finding("records", status, f"{gaps['big_gaps']} gap(s) in the correlation ids of the recorded CUDA calls, "
                   f"{gaps['ids_in_big_gaps']} ids ({lost:.0%} of the span; largest gap {gaps['largest_gap']}, usual "
                   f"{gaps['usual_gap']}): {CAUSE}", data)


def check_window_coverage(ops, source) -> Finding:
    """GPU activity against the span of the window's other records (CUDA calls and NVTX ranges). `ops`: the
    capture's ops, or their facts.OpFacts."""
    from profattr.check.facts import OpFacts

    facts = ops if isinstance(ops, OpFacts) else OpFacts.of(ops)
    if not facts.n_ops:
        return Finding("window_coverage", SKIP, "no GPU work")
    r0, r1 = source.record_span()
    if r0 is None:
        return Finding("window_coverage", SKIP, "no NVTX ranges or CUDA calls to compare the GPU work with")
    g0, g1 = facts.first_ns, facts.last_ns
    w0, w1 = min(int(r0), g0), max(int(r1), g1)
    window_ms, gpu_ms = (w1 - w0) / 1e6, (g1 - g0) / 1e6
    share = gpu_ms / window_ms if window_ms > 0 else 1.0
    data = {"window_ms": window_ms, "gpu_ms": gpu_ms, "share": share, "gpu_starts_at_ms": (g0 - w0) / 1e6,
            "gpu_ends_before_end_ms": (w1 - g1) / 1e6}
    text = (f"GPU work spans {gpu_ms:.1f} ms of the window's {window_ms:.1f} ms of records ({share:.0%}; it starts "
            f"at {data['gpu_starts_at_ms']:.1f} ms and stops {data['gpu_ends_before_end_ms']:.1f} ms before the end)")
    if share >= COVERAGE_WARN:
        return Finding("window_coverage", PASS, text, data)
    return Finding("window_coverage", FAIL if share < COVERAGE_FAIL else WARN, f"{text}: {CAUSE}", data)


def check_steps_with_work(budget) -> Finding:
    if budget is None:
        return Finding("steps_with_gpu_work", SKIP, "no budget")
    if budget.steps_source in ("whole", "graph"):
        return Finding("steps_with_gpu_work", SKIP, f"steps are {budget.steps_source}: defined by the GPU work")
    total = budget.steps_count
    with_work = int(budget.per_step["step"].nunique()) if len(budget.per_step) else 0
    empty = total - with_work
    data = {"steps": total, "with_gpu_work": with_work, "empty": empty}
    text = f"{with_work} of {total} step ranges ({budget.steps_source}) launched GPU work"
    if not empty:
        return Finding("steps_with_gpu_work", PASS, text, data)
    status = FAIL if empty > EMPTY_STEPS_FAIL * total else WARN
    return Finding("steps_with_gpu_work", status, f"{text}; {empty} launched nothing: {CAUSE}", data)


def check_graphs_recorded(run: RunRecord | None, facts) -> Finding:
    run = or_empty(run)
    if run.server_attached:
        return Finding("graphs_recorded", SKIP, "an attached server's log is not read (capture --server): which "
                       "decode CUDA graphs it captured is not known, only its setting disable_cuda_graph="
                       f"{run.logged_server_args.get('disable_cuda_graph')}",
                       {"graph_launches": facts.calls[1]})
    used = run.cuda_graph
    if not run.has("server_log.cuda_graph"):
        return Finding("graphs_recorded", SKIP, "no server log evidence of CUDA-graph use")
    n_graph = facts.calls[1]
    if not used.get("decode"):
        if n_graph:
            return Finding("graphs_recorded", WARN, f"the server log says decode ran without CUDA graphs, yet the "
                           f"capture holds {n_graph} graph launches", {"graph_launches": n_graph})
        return Finding("graphs_recorded", PASS, "eager decode (the server log says CUDA graphs were off)")
    sizes = used.get("batch_sizes") or []
    if n_graph:
        return Finding("graphs_recorded", PASS, f"the server captured decode graphs for batch sizes {sizes}; the "
                       f"capture holds {n_graph} graph launches", {"graph_launches": n_graph, "batch_sizes": sizes})
    return Finding("graphs_recorded", FAIL, f"the server captured decode CUDA graphs (batch sizes {sizes}), but the "
                   f"capture holds no graph launch: {CAUSE}", {"graph_launches": 0, "batch_sizes": sizes})


def _cuda_version(run: RunRecord | None, source) -> int | None:
    """The CUDA driver's version as 1000 * major + 10 * minor (13000 for 13.0), when recorded."""
    tables = source.nsys_tables()
    if tables is not None and tables.has("TARGET_INFO_SYSTEM_ENV"):
        rows = tables.query("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CudaDriverVersion'")
        for (value,) in rows:
            try:
                return int(value)
            except (TypeError, ValueError):
                pass
    return or_empty(run).cuda_driver_version


def check_profiler_version(run: RunRecord | None, source, facts) -> Finding:
    if source.format != "nsys":
        if or_empty(run).server_attached:
            return Finding("profiler_version", SKIP, f"{source.tool_version}, inside the running server (capture "
                           "--server): its profiler against the CUDA driver is not checked (no nsys recorded it)")
        return Finding("profiler_version", SKIP, f"{source.tool_version}")
    # the nsys that recorded (run.json); an export only names the nsys that exported it
    recorded = or_empty(run).nsys_version
    shown = recorded or source.nsys_version
    version = parse_version(shown or "")
    cuda = _cuda_version(run, source)
    warnings = [text for sev, text in facts.diagnostics]
    data = {"nsys": shown, "recorded_by": "run.json" if recorded else "export (the exporting nsys)",
            "cuda_driver": cuda, "nsys_warnings": warnings}
    for below, cuda_at_least, seen in LOSSY:
        if version and tuple(version[:2]) <= below and cuda is not None and cuda >= cuda_at_least:
            return Finding("profiler_version", WARN, f"recorded with nsys {shown} on a CUDA {cuda // 1000} driver: "
                           f"{seen}; re-capture with nsys 2024.2.3 or newer (scripts/install-nsys)", data)
    driver = [w for w in warnings if "not supported by this build" in w]
    note = f"; nsys said: {driver[0]}" if driver else ""
    return Finding("profiler_version", PASS, f"nsys {shown}"
                   + (f" on a CUDA {cuda // 1000}.{cuda % 1000 // 10} driver" if cuda else "") + note, data)


def check_twin(budget, twin_budget, twin_path: str | None) -> Finding:
    if budget is None:
        return Finding("twin", SKIP, "this capture has no steps to compare with a twin")
    if twin_budget is None:
        return Finding("twin", SKIP, "no twin capture given (--twin: an eager or torch-profiler capture of the same "
                       "decode)")
    rows = []
    status = PASS
    mine = {d["device"]: d for d in budget.devices}
    common = set(mine) & {t["device"] for t in twin_budget.devices}
    for t in twin_budget.devices:
        # with no step work on any device (records lost), every twin device counts as 0 kernels per step here
        d = mine.get(t["device"]) if mine else {"kernels_per_step": 0.0}
        if d is None or (mine and t["device"] not in common):
            continue
        rel = (d["kernels_per_step"] - t["kernels_per_step"]) / t["kernels_per_step"] if t["kernels_per_step"] else 0
        rows.append({"device": t["device"], "kernels_per_step": d["kernels_per_step"],
                     "twin_kernels_per_step": t["kernels_per_step"], "relative": rel})
        if abs(rel) > TWIN_TOLERANCE:
            status = FAIL
    if not rows:
        return Finding("twin", SKIP, f"{twin_path}: no device in common with this capture")
    worst = max(rows, key=lambda r: abs(r["relative"]))
    text = (f"{worst['kernels_per_step']:.1f} kernels per step vs {worst['twin_kernels_per_step']:.1f} in the twin "
            f"{twin_path} ({worst['relative']:+.1%})")
    if status == FAIL:
        text += f": more than {TWIN_TOLERANCE:.0%} apart; one of the two lost records or ran other work"
    return Finding("twin", status, text, {"devices": rows})



GRAPH_TRACING_WARN_US = 50.0  # per-node tracing adding more than this to each graph launch is worth a warning


def check_graph_tracing(mine: dict | None, twin: dict, twin_path: str) -> Finding:
    """This capture (graphs traced per node) against a graph-level twin: the launch cost per-node tracing adds,
    and whether the GPU's wait before replays survives without it (attribute/graph_launch.py)."""
    from profattr.attribute.graph_launch import describe, tracing_cost

    cost = tracing_cost(mine, twin)
    if cost is None:
        how = (mine or {}).get("tracing")
        return Finding("graph_tracing", SKIP, f"{twin_path} is a graph-level twin, but this capture's graphs are "
                       f"{'not traced per node' if how else 'not launched'}: nothing to set against it")
    status = WARN if cost["call_us_added"] > GRAPH_TRACING_WARN_US or cost.get("confirmed") is False else PASS
    return Finding("graph_tracing", status, describe(cost), dict(cost, twin=twin_path))
