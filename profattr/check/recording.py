"""Did the capture record what decode analysis needs: kernels, replayed graph nodes one by one, every
tensor-parallel device, NVTX ranges?"""
from __future__ import annotations

from profattr.check import FAIL, PASS, SKIP, Finding
from profattr.run_record import RunRecord, or_empty


def traced_cuda(run: RunRecord | None, facts) -> bool | None:
    """Whether CUDA was traced: from run.json's --trace, else from the capture's own settings; None when neither
    says (a torch-profiler trace: it says by holding GPU events)."""
    run = or_empty(run)
    if run.capture_trace and run.profiler_used == "nsys":
        return "cuda" in run.capture_trace.split(",")
    return facts.traced_cuda


def check_kernels(run: RunRecord | None, facts) -> Finding:
    devices, (n_calls, n_graph) = facts.devices, facts.calls
    n_kernels = sum(d["kernels"] for d in devices)
    if traced_cuda(run, facts) is False:
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


def check_graph_nodes(facts) -> Finding:
    n_graph = facts.calls[1]
    node_kernels = sum(d["graph_node_kernels"] for d in facts.devices)
    if not n_graph:
        return Finding("graph_nodes", SKIP, "no CUDA graph launches in the window (eager execution)")
    if node_kernels:
        how = "node-level kernels" if facts.format == "nsys" else "kernels (linked by correlation id)"
        return Finding("graph_nodes", PASS, f"{n_graph} graph launches replayed {node_kernels} {how}",
                       {"graph_launches": n_graph, "graph_node_kernels": node_kernels})
    return Finding("graph_nodes", FAIL, f"{n_graph} graph launches but no kernel carries a graphNodeId: replayed "
                   "kernels are missing (captured with --cuda-graph-trace=graph); capture with "
                   "--cuda-graph-trace=node", {"graph_launches": n_graph, "graph_node_kernels": 0})


def check_replay_ids(source) -> Finding | None:
    """Replayed graph ops recorded without a correlationId (newer nsys, graphs built before the capture): how many,
    and how many reached their cudaGraphLaunch by replay order (trace/graph_replays.py). None when there are none."""
    links = source.claims.replay_links
    if links is None:
        return None
    status = PASS if links.linked == links.ops else FAIL
    return Finding("graph_replay_ids", status, links.sentence() + (
        "" if status == PASS else "; capture again with an nsys that records their correlationId, or with the "
        "graphs captured inside the window"), links.to_dict())


def check_devices(run: RunRecord | None, facts, gpus_listed: int) -> Finding:
    seen = [d["deviceId"] for d in facts.devices]
    processes = sum(d["processes"] for d in facts.devices)
    run = or_empty(run)
    tp = run.tp
    if not facts.devices:
        return Finding("devices", SKIP, "no kernels, so no devices to count")
    if not tp:
        note = f" (the capture describes {gpus_listed} GPUs)" if gpus_listed > len(seen) else ""
        return Finding("devices", PASS, f"kernels from device(s) {seen} in {processes} process(es){note}; "
                       "no tensor-parallel size recorded to compare with", {"devices": seen})
    if len(seen) >= int(tp):
        return Finding("devices", PASS, f"kernels from all {tp} tensor-parallel device(s) {seen} "
                       f"in {processes} process(es)", {"devices": seen, "tp": tp})
    how = ("SGLang calls cudaProfilerStart only on its base GPU: record the window with `profattr capture "
           "--capture-range session` (every process), and keep --trace-fork-before-exec=true"
           if run.target == "sglang" and run.capture_range == "cudaProfilerApi" else
           "nsys needs --trace-fork-before-exec=true, and every rank's process must be inside the capture range")
    return Finding("devices", FAIL, f"kernels from {len(seen)} of {tp} tensor-parallel devices {seen}: the other "
                   f"ranks were not recorded; {how}", {"devices": seen, "tp": tp})


def check_nvtx(run: RunRecord | None, facts) -> Finding:
    types = facts.nvtx_types
    if types is None:
        return Finding("nvtx", SKIP, "no NVTX events in the capture" if facts.format == "nsys" else
                       "torch-profiler trace: annotations, not NVTX")
    ranges = types.get(59, 0) + types.get(60, 0)
    if ranges:
        return Finding("nvtx", PASS, f"{ranges} NVTX ranges recorded", {"ranges": ranges})
    if types.get(75) or types.get(76):
        version = or_empty(run).packages.get("nvtx") or "installed"
        return Finding("nvtx", FAIL, f"NVTX domains were created but no range was recorded: the Python nvtx "
                       f"package ({version}) emits ranges this nsys does not record; use nvtx<0.2.12 with nsys "
                       "2023.4, or torch.cuda.nvtx", {"event_types": types})
    return Finding("nvtx", SKIP, "no NVTX ranges or domains in the capture", {"event_types": types})
