"""`profattr check`: is a capture worth analysing? Each check gives pass / warn / fail (or skip, when it does not
apply to this capture) with one line of explanation.

A capture is a folder or file written by `profattr capture` (NAME.run.json beside NAME.sqlite) or any nsys SQLite
export (then the checks that need run.json, such as the expected backend, are skipped).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from profattr.errors import ProfattrError
from profattr.trace.reader import KERNEL, NVTX, RUNTIME, Export, load_query, open_export

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
SEVERITY = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}

# first-call outliers: a kernel's first run this many times its median, and longer than the median by this much
FIRST_CALL_RATIO = 10.0
FIRST_CALL_MIN_EXCESS_NS = 50_000
FIRST_CALL_MIN_RUNS = 3
# a one-off kernel this long, early in the window (first share of it), also looks like JIT or autotuning
ONE_OFF_MIN_NS = 1_000_000
ONE_OFF_EARLY_SHARE = 0.1
# outliers costing more than this share of all kernel time make the budget wrong, not just noisy
OUTLIER_FAIL_SHARE = 0.01
# profiled / unprofiled ms per token
OVERHEAD_WARN = 1.3
OVERHEAD_FAIL = 3.0


@dataclass
class Finding:
    check: str
    status: str
    message: str
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Capture:
    """What `check` looks at: the SQLite export (None when not exported yet) and run.json (None for a bare export)."""

    sqlite: Path | None
    run: dict | None
    run_path: Path | None


def overall(findings) -> str:
    """The worst status: fail, warn, or pass."""
    worst = max((SEVERITY[f.status] for f in findings), default=0)
    return {0: PASS, 1: WARN, 2: FAIL}[worst]


# --- locating a capture -------------------------------------------------------------------------------------------

def load_run(path: Path) -> dict:
    """A run.json written by `profattr capture`; ProfattrError when it is not one."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProfattrError(f"{path}: not a readable run.json ({exc})") from None
    if not isinstance(run, dict) or not str(run.get("schema", "")).startswith("profattr.run/"):
        raise ProfattrError(f"{path}: not a profattr run file (schema profattr.run/1 expected)")
    return run


def _sqlite_for_run(run_path: Path, run: dict) -> Path:
    name = (run.get("files") or {}).get("sqlite") or run_path.name.replace(".run.json", ".sqlite")
    return run_path.parent / name


def locate(path) -> Capture:
    """Resolve a folder, NAME.run.json, NAME.sqlite or NAME.nsys-rep to the export and run.json."""
    path = Path(path)
    if not path.exists():
        raise ProfattrError(f"{path}: no such file or folder")
    if path.is_dir():
        runs = sorted(path.glob("*.run.json"))
        if len(runs) == 1:
            return locate(runs[0])
        exports = sorted(path.glob("*.sqlite"))
        if not runs and len(exports) == 1:
            return locate(exports[0])
        if not runs and not exports:
            raise ProfattrError(f"{path}: no capture here (no NAME.run.json or NAME.sqlite)")
        names = ", ".join(p.name for p in (runs or exports))
        raise ProfattrError(f"{path} holds several captures ({names}); give one file")
    if path.name.endswith(".run.json"):
        run = load_run(path)
        sqlite = _sqlite_for_run(path, run)
        return Capture(sqlite if sqlite.exists() else None, run, path)
    if path.suffix == ".qdstrm":
        raise ProfattrError(f"{path}: a raw nsys stream, not a report yet; turn it into one with "
                            f"`profattr capture --finish {path.parent}` on a machine with QdstrmImporter")
    if path.suffix in (".nsys-rep", ".qdrep"):
        from profattr.trace.reader import resolve_capture
        path = resolve_capture(path)
    run_path = path.with_name(path.name[: -len(path.suffix)] + ".run.json")
    run = load_run(run_path) if run_path.exists() else None
    return Capture(path, run, run_path if run else None)


# --- the checks ---------------------------------------------------------------------------------------------------

def _get(run: dict | None, *keys, default=None):
    node = run
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _traced_cuda(run: dict | None, export: Export | None = None) -> bool | None:
    """Whether CUDA was traced: from run.json's --trace, else from the capture settings nsys stored; None when
    neither says."""
    trace = _get(run, "capture", "trace")
    if trace:
        return "cuda" in str(trace).split(",")
    if export is not None and export.has("META_DATA_CAPTURE"):
        values = {str(v).lower() for (v,) in export.query(load_query("check_cuda_traced"))}
        if values:
            return "true" in values
    return None


def check_kernels(export: Export, run: dict | None, devices: list, calls: tuple) -> Finding:
    n_kernels = sum(d["kernels"] for d in devices)
    n_calls, n_graph = calls
    if _traced_cuda(run, export) is False:
        return Finding("kernels", SKIP, "CUDA not traced in this capture (nsys --trace without cuda); "
                       "no kernels expected")
    if n_kernels:
        span_ms = (max(d["last_end_ns"] for d in devices) - min(d["first_start_ns"] for d in devices)) / 1e6
        return Finding("kernels", PASS, f"{n_kernels} kernels on {len(devices)} device(s) over {span_ms:.1f} ms",
                       {"kernels": n_kernels, "span_ms": span_ms})
    if n_graph:
        cause = (f"{n_graph} cudaGraphLaunch calls but no kernel rows: captured with --cuda-graph-trace=graph; "
                 "capture again with --cuda-graph-trace=node")
    elif n_calls:
        cause = (f"{n_calls} CUDA API calls but no kernels: the window closed before any GPU work ran "
                 "(too few --steps, or the requests came after the window)")
    else:
        cause = ("no CUDA API calls at all: the window never opened (the target never called cudaProfilerStart, "
                 "e.g. /start_profile did not reach the server) or the target did not use CUDA")
    return Finding("kernels", FAIL, f"window recorded no kernels; {cause}",
                   {"kernels": 0, "runtime_calls": n_calls, "graph_launches": n_graph})


def check_graph_nodes(devices: list, calls: tuple) -> Finding:
    n_graph = calls[1]
    node_kernels = sum(d["graph_node_kernels"] for d in devices)
    if not n_graph:
        return Finding("graph_nodes", SKIP, "no CUDA graph launches in the window (eager execution)")
    if node_kernels:
        return Finding("graph_nodes", PASS, f"{n_graph} graph launches replayed {node_kernels} node-level kernels",
                       {"graph_launches": n_graph, "graph_node_kernels": node_kernels})
    return Finding("graph_nodes", FAIL, f"{n_graph} graph launches but no kernel carries a graphNodeId: replayed "
                   "kernels are missing (captured with --cuda-graph-trace=graph); capture with "
                   "--cuda-graph-trace=node", {"graph_launches": n_graph, "graph_node_kernels": 0})


def check_devices(export: Export, run: dict | None, devices: list) -> Finding:
    seen = [d["deviceId"] for d in devices]
    processes = sum(d["processes"] for d in devices)
    tp = _get(run, "tp")
    if not devices:
        return Finding("devices", SKIP, "no kernels, so no devices to count")
    if not tp:
        listed = len(export.gpus)
        note = f" (the capture describes {listed} GPUs)" if listed > len(seen) else ""
        return Finding("devices", PASS, f"kernels from device(s) {seen} in {processes} process(es){note}; "
                       "no tensor-parallel size recorded to compare with", {"devices": seen})
    if len(seen) >= int(tp):
        return Finding("devices", PASS, f"kernels from all {tp} tensor-parallel device(s) {seen} "
                       f"in {processes} process(es)", {"devices": seen, "tp": tp})
    return Finding("devices", FAIL, f"kernels from {len(seen)} of {tp} tensor-parallel devices {seen}: the other "
                   "ranks were not recorded (nsys needs --trace-fork-before-exec=true, and every rank's process "
                   "must be inside the capture range)", {"devices": seen, "tp": tp})


def moe_families(names: list) -> tuple:
    """({family: ns} of expert GEMM kernels, {family: ns} of all MoE kernels), classified by the taxonomy."""
    from profattr.taxonomy.classify import load_rules

    rules = load_rules()
    gemm_ns: dict = {}
    moe_ns: dict = {}
    for demangled, short, _count, kernel_ns in names:
        rule = rules.match(demangled or short or "", frozenset())
        if rule is None and short and short != demangled:
            rule = rules.match(short, frozenset())
        if rule is None or not rule.family or not str(rule.category).startswith("moe."):
            continue
        moe_ns[rule.family] = moe_ns.get(rule.family, 0) + int(kernel_ns or 0)
        if rule.category == "moe.gemm":
            gemm_ns[rule.family] = gemm_ns.get(rule.family, 0) + int(kernel_ns or 0)
    return gemm_ns, moe_ns


def check_backend(run: dict | None, names: list) -> Finding:
    from profattr.capture.sglang import BACKEND_FAMILIES

    backend = _get(run, "backend", "sglang")
    if not backend:
        return Finding("backend", SKIP, "no MoE runner backend recorded in run.json")
    if backend not in BACKEND_FAMILIES:
        return Finding("backend", SKIP, f"no kernel fingerprint known for backend {backend!r}")
    if not names:
        return Finding("backend", SKIP, "no kernels to fingerprint")
    try:
        gemm_ns, moe_ns = moe_families(names)
    except ImportError:
        return Finding("backend", SKIP, "kernel taxonomy not available (profattr.taxonomy.classify)")
    gemms, markers = (set(x) for x in BACKEND_FAMILIES[backend])
    # families that only other backends launch: their expert GEMMs, and their marker kernels
    foreign_gemm: dict = {}
    foreign_marker: dict = {}
    for other, (o_gemms, o_markers) in BACKEND_FAMILIES.items():
        for fam in set(o_gemms) - gemms:
            foreign_gemm.setdefault(fam, other)
        for fam in set(o_markers) - markers - gemms:
            foreign_marker.setdefault(fam, other)
    owners = {**foreign_marker, **foreign_gemm}
    foreign = sorted({f for f in gemm_ns if f in foreign_gemm} | {f for f in moe_ns if f in foreign_marker})
    data = {"backend": backend, "gemm_families": sorted(gemms), "marker_families": sorted(markers),
            "moe_gemm_ms": {k: v / 1e6 for k, v in sorted(gemm_ns.items())},
            "moe_ms": {k: v / 1e6 for k, v in sorted(moe_ns.items())}}
    if foreign:
        which = ", ".join(f"{f} ({owners[f]})" for f in foreign)
        return Finding("backend", FAIL, f"MoE kernels of other backends present: {which}; {backend} did not run "
                       "alone (fallback, or a second MoE path)", data)
    present = sorted(gemms & set(gemm_ns))
    if not present:
        seen = ", ".join(sorted(gemm_ns)) or "none the taxonomy knows"
        return Finding("backend", FAIL, f"no expert GEMM of family {'/'.join(sorted(gemms))} ({backend}) in the "
                       f"window (expert GEMM families seen: {seen}): silent fallback, or the runner never ran", data)
    missing = sorted(markers - set(moe_ns))
    if missing:
        return Finding("backend", FAIL, f"expert GEMM {'/'.join(present)} ran, but not the {'/'.join(missing)} "
                       f"kernels that {backend} launches around it: another runner with the same GEMM ran", data)
    ms = sum(gemm_ns[f] for f in present) / 1e6
    return Finding("backend", PASS, f"{backend}: expert GEMM family {'/'.join(present)} present ({ms:.2f} ms), "
                   "no other backend's MoE kernels", data)


def _is_collective(name: str) -> bool:
    """A communication kernel (the taxonomy files it under comm.*): its duration includes waiting for peers."""
    try:
        from profattr.taxonomy.classify import load_rules
    except ImportError:
        return name.startswith(("nccl", "void nccl"))
    return str(load_rules().classify(name or "")).startswith("comm.")


def _late_peer(seq: dict, names: dict, outlier: tuple) -> tuple:
    """For a collective's slow first call: (wait_ns, late devices, the latest device's own first-call ns) when
    another device reached its first call of the same kernel later, so the slow call was this device waiting for
    that rank; (0, [], 0) otherwise."""
    _excess, name_id, dev, first_ns, _med = outlier
    if not _is_collective(names.get(name_id) or ""):
        return 0, [], 0
    same = seq["name"] == name_id
    first: dict = {}  # device -> (start, duration) of its first call of this kernel
    for d, s, du in zip(seq["device"][same].tolist(), seq["start"][same].tolist(), seq["duration"][same].tolist()):
        if d not in first or s < first[d][0]:
            first[d] = (s, du)
    if dev not in first:
        return 0, [], 0
    mine = first[dev][0]
    late = {d: s - mine for d, (s, _du) in first.items() if d != dev and s > mine}
    if not late:
        return 0, [], 0
    latest = max(late, key=late.get)
    wait = min(late[latest], first_ns)
    return wait, sorted(d for d, lag in late.items() if lag >= wait / 2), first[latest][1]


def check_first_calls(export: Export, devices: list, run: dict | None = None) -> Finding:
    if not devices:
        return Finding("first_calls", SKIP, "no kernels")
    key_cols = ["device", "name", "gx", "gy", "gz", "bx", "by", "bz"]
    seq = export.arrays(load_query("check_kernel_sequence"), key_cols + ["start", "duration"])
    if not len(seq["start"]):
        return Finding("first_calls", SKIP, "no kernels")
    total_ns = int(seq["duration"].sum())
    key = np.stack([seq[c] for c in key_cols], axis=1)
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1)])
    ends = np.r_[starts[1:], len(key)]
    window_start = {d["deviceId"]: d["first_start_ns"] for d in devices}
    window_len = {d["deviceId"]: max(1, d["last_end_ns"] - d["first_start_ns"]) for d in devices}
    median_all = float(np.median(seq["duration"]))
    outliers = []
    for s, e in zip(starts, ends):
        durations = seq["duration"][s:e]
        first = int(durations[0])
        dev = int(seq["device"][s])
        if e - s >= FIRST_CALL_MIN_RUNS:
            med = float(np.median(durations[1:]))
            if first > FIRST_CALL_RATIO * med and first - med > FIRST_CALL_MIN_EXCESS_NS:
                outliers.append((first - med, int(seq["name"][s]), dev, first, med))
        elif e - s == 1:
            early = (int(seq["start"][s]) - window_start[dev]) <= ONE_OFF_EARLY_SHARE * window_len[dev]
            if early and first >= ONE_OFF_MIN_NS and first > FIRST_CALL_RATIO * median_all:
                outliers.append((first - median_all, int(seq["name"][s]), dev, first, median_all))
    if not outliers:
        return Finding("first_calls", PASS, "no first-call outliers (JIT, autotuning) inside the window")
    outliers.sort(reverse=True)
    excess = sum(o[0] for o in outliers)
    share = excess / max(1, total_ns)
    names = export.strings(o[1] for o in outliers)
    worst = outliers[0]
    name = _short(names.get(worst[1], f"<string {worst[1]}>"))
    wait_ns, late, late_own_ns = _late_peer(seq, names, worst)
    data = {"outliers": len(outliers), "excess_ms": excess / 1e6, "share_of_kernel_time": share,
            "worst": [{"name": names.get(o[1]), "device": o[2], "first_ms": o[3] / 1e6, "median_ms": o[4] / 1e6}
                      for o in outliers[:3]]}
    status = FAIL if share > OUTLIER_FAIL_SHARE else WARN
    head = (f"{len(outliers)} kernel(s) ran much longer on their first call ({excess / 1e6:.2f} ms extra, "
            f"{share:.1%} of kernel time)")
    if wait_ns >= worst[0] / 2:
        # a collective's first call that spans another rank's late arrival: the ranks entered the window out of
        # step; the kernel itself was not slow, and only this device's budget counts the wait as communication
        data["worst_is_wait_for"] = {"devices": late, "wait_ms": wait_ns / 1e6,
                                     "late_device_first_ms": late_own_ns / 1e6}
        peers = ", ".join(str(d) for d in late)
        why = ("; the CUDA graph was captured inside the window (graph_captured_in_window), so the ranks "
               "finished capturing at different times" if _get(run, "workload", "graph_captured_in_window")
               else "")
        return Finding("first_calls", status, f"{head}; worst: the first {name} on device {worst[2]} took "
                       f"{worst[3] / 1e6:.3f} ms (median {worst[4] / 1e6:.3f}) because it waited "
                       f"{wait_ns / 1e6:.2f} ms for device(s) {peers} to reach the same collective (whose own first "
                       f"call took {late_own_ns / 1e6:.3f} ms, so it is not the collective's set-up): the ranks "
                       f"entered the window out of step{why}. Device {worst[2]}'s budget counts the wait as "
                       "communication; open the window once every rank is ready (e.g. --graph-window after)",
                       data)
    return Finding("first_calls", status, f"{head}; worst: {name} {worst[3] / 1e6:.3f} ms vs median "
                   f"{worst[4] / 1e6:.3f} ms: warm-up did not cover the window's shapes", data)


def profiled_timing(budget) -> dict:
    """Profiled ms/token measured in the capture: the median step span per device (at batch B one step decodes one
    token of each request, so it is the per-request ms/token) and the slowest device's, with where it came from.
    Empty when there is no budget."""
    if budget is None or not budget.devices:
        return {}
    per_device = [{"device": int(d["device"]), "step_ms": float(d["step_ms"]), "steps": int(d["steps"])}
                  for d in budget.devices]
    slowest = max(per_device, key=lambda d: d["step_ms"])
    return {"ms_per_token_profiled": slowest["step_ms"],
            "profiled_source": (f"capture: median step span ({budget.steps_source} steps), slowest of "
                                f"{len(per_device)} device(s): device {slowest['device']}"),
            "profiled_per_device": per_device}


def _client_profiled(run: dict | None):
    """The client-side profiled ms/token of a run, if it recorded one (older runs kept it under
    ms_per_token_profiled without a profiled_source)."""
    value = _get(run, "timing", "ms_per_token_profiled_client")
    if value is None and not _get(run, "timing", "profiled_source"):
        value = _get(run, "timing", "ms_per_token_profiled")
    return value


def check_overhead(run: dict | None, budget=None) -> Finding:
    unprof = _get(run, "timing", "ms_per_token_unprofiled")
    measured = profiled_timing(budget)
    client = _client_profiled(run)
    if measured:
        prof, source = measured["ms_per_token_profiled"], "median step span in the capture"
    else:
        # no steps in the capture: fall back to what the target measured around the window
        prof = _get(run, "timing", "ms_per_token_profiled") if _get(run, "timing", "profiled_source") else client
        source = "client-side"
    if not unprof or not prof:
        return Finding("overhead", SKIP, "profiled and unprofiled ms/token not both recorded in run.json")
    ratio = prof / unprof
    data = {"ms_per_token_unprofiled": unprof, "ms_per_token_profiled": prof, "ratio": ratio,
            "profiled_source": measured.get("profiled_source", source)}
    if measured:
        data["profiled_per_device"] = measured["profiled_per_device"]
    if client is not None:
        data["ms_per_token_profiled_client"] = client
    where = source if len(measured.get("profiled_per_device", [])) < 2 else (
        f"{source}, slowest of {len(measured['profiled_per_device'])} devices")
    text = f"{prof:.3f} ms/token under nsys ({where}) vs {unprof:.3f} unprofiled ({ratio:.2f}x)"
    if ratio <= OVERHEAD_WARN:
        return Finding("overhead", PASS, text, data)
    if ratio <= OVERHEAD_FAIL:
        return Finding("overhead", WARN, f"{text}: compare shares of the step, not absolute ms", data)
    return Finding("overhead", FAIL, f"{text}: the profiler dominates the step; absolute times are not "
                   "representative (fewer traced APIs, or --cuda-graph-trace=node overhead)", data)


def load_budget(sqlite: Path, devices: list) -> tuple:
    """(Budget or None, why not): the attribute stage's per-step budget (steps and step times)."""
    if not devices:
        return None, "no kernels, so no steps to count"
    try:
        from profattr.attribute.budget import compute_budget
    except ImportError:
        return None, "budget module not available (profattr.attribute.budget)"
    try:
        return compute_budget(sqlite, steps="auto"), None
    except ProfattrError as exc:
        return None, f"steps could not be counted: {exc.format_message()}"


def check_steps(run: dict | None, budget, why_not: str | None, devices: list | None = None) -> Finding:
    """Steps counted per device (each tensor-parallel rank runs every step) against the steps requested."""
    requested = _get(run, "window", "steps_requested")
    if not requested:
        return Finding("steps", SKIP, "no requested step count in run.json")
    if budget is None:
        return Finding("steps", SKIP, why_not or "no budget")
    requested = int(requested)
    per_device = {int(d["device"]): int(d["steps"]) for d in budget.devices}
    for d in devices or []:  # a device with kernels but no step
        per_device.setdefault(int(d["deviceId"]), 0)
    counts = sorted(set(per_device.values())) or [0]
    counted = counts[0]
    data = {"requested": requested, "counted": counted, "per_device": {str(k): v for k, v in per_device.items()},
            "source": budget.steps_source}
    if len(per_device) <= 1:
        text = f"{counted} steps counted ({budget.steps_source}) for {requested} requested"
    elif len(counts) == 1:
        text = (f"{counted} steps counted on each of {len(per_device)} devices ({budget.steps_source}) for "
                f"{requested} requested")
    else:
        listed = ", ".join(f"device {k}: {v}" for k, v in sorted(per_device.items()))
        text = f"steps counted ({budget.steps_source}) per device differ ({listed}) for {requested} requested"
    if counted == 0:
        return Finding("steps", FAIL, f"{text}: no decode step found in the window"
                       + (" on some device" if len(per_device) > 1 else ""), data)
    # SGLang counts the prefill of the window's requests as a step; it is no graph replay
    if all(requested - 2 <= v <= requested for v in per_device.values()):
        return Finding("steps", PASS, text, data)
    reason = getattr(budget, "steps_reason", "") or ""
    return Finding("steps", WARN, f"{text}: the window held other work than the requested decode steps"
                   + (f" ({reason})" if reason else ""), data)


def check_nvtx(export: Export, run: dict | None) -> Finding:
    if not export.has(NVTX):
        return Finding("nvtx", SKIP, "no NVTX events in the capture")
    types = dict(export.query(load_query("check_nvtx_event_types")))
    ranges = types.get(59, 0) + types.get(60, 0)
    if ranges:
        return Finding("nvtx", PASS, f"{ranges} NVTX ranges recorded", {"ranges": ranges})
    if types.get(75) or types.get(76):
        version = _get(run, "packages", "nvtx") or "installed"
        return Finding("nvtx", FAIL, f"NVTX domains were created but no range was recorded: the Python nvtx "
                       f"package ({version}) emits ranges this nsys ({export.nsys_version}) does not record; "
                       "use nvtx<0.2.12 with nsys 2023.4", {"event_types": types})
    return Finding("nvtx", SKIP, "no NVTX ranges or domains in the capture", {"event_types": types})


def _devices(export: Export) -> list:
    if not export.has(KERNEL):
        return []
    graph = export.column_or(KERNEL, "graphNodeId", "k")
    cols = ["deviceId", "processes", "kernels", "graph_node_kernels", "first_start_ns", "last_end_ns", "kernel_ns"]
    return [dict(zip(cols, row)) for row in export.query(load_query("check_kernel_devices", graph_node_id=graph))]


def evaluate(sqlite, run: dict | None = None) -> tuple:
    """(findings, budget or None): all checks on one export (and its run.json, when there is one), in a fixed
    order, with the per-step budget they used."""
    with open_export(sqlite) as export:
        devices = _devices(export)
        calls = tuple(export.query(load_query("check_runtime_calls"))[0]) if export.has(RUNTIME) else (0, 0)
        names = export.query(load_query("check_kernel_names")) if export.has(KERNEL) else []
        cuda = _traced_cuda(run, export) is not False
        budget, why_not = load_budget(Path(sqlite), devices) if cuda else (None, "CUDA not traced")
        findings = [check_kernels(export, run, devices, calls)]
        if cuda:
            findings += [check_graph_nodes(devices, calls), check_devices(export, run, devices),
                         check_backend(run, names), check_first_calls(export, devices, run)]
        findings += [check_overhead(run, budget)]
        if cuda:
            findings.append(check_steps(run, budget, why_not, devices))
        findings.append(check_nvtx(export, run))
    return findings, budget


def run_checks(sqlite, run: dict | None = None) -> list:
    """All checks on one export (and its run.json, when there is one); returns Findings in a fixed order."""
    return evaluate(sqlite, run)[0]


def check_capture(path) -> tuple:
    """(Capture, findings) for a capture path; ProfattrError when there is nothing to check yet."""
    cap = locate(path)
    if cap.sqlite is None:
        status = _get(cap.run, "status")
        if status == "needs_import":
            raise ProfattrError(f"{cap.run_path}: the capture is a raw .qdstrm stream not yet turned into a report; "
                                f"run `profattr capture --finish {cap.run_path.parent}` where QdstrmImporter exists")
        raise ProfattrError(f"{cap.run_path}: no SQLite export beside it (status {status!r}); nothing to check")
    return cap, run_checks(cap.sqlite, cap.run)


def render_table(findings) -> str:
    """Plain-text table: status, check, one line each, and the overall status last."""
    width = max([len(f.check) for f in findings] + [5])
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  FINDING"]
    lines += [f"{f.status:<6}  {f.check:<{width}}  {f.message}" for f in findings]
    lines.append(f"overall: {overall(findings)}")
    return "\n".join(lines)


def to_json(findings, capture: Capture | None = None) -> dict:
    return {"schema": "profattr.check/1",
            "capture": {"sqlite": str(capture.sqlite) if capture and capture.sqlite else None,
                        "run": str(capture.run_path) if capture and capture.run_path else None},
            "status": overall(findings), "findings": [f.to_dict() for f in findings]}
