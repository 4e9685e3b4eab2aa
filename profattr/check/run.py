"""Run every check on one capture, in a fixed order, reading it once."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from profattr.check import SKIP, backend, completeness, recording, timing
from profattr.check.facts import OpFacts, gather
from profattr.check.locate import Capture, locate
from profattr.errors import ProfattrError
from profattr.run_record import RunRecord
from profattr.trace.ops import Ops
from profattr.trace.source import open_trace


def _empty_ops() -> Ops:
    z = np.zeros(0, dtype=np.int64)
    return Ops(start=z, end=z, device=z.astype(np.int32), launch_key=z, name_id=z.astype(np.int32),
               demangled_id=z.astype(np.int32), graph_node=z, stream=z.astype(np.int32), kind=z.astype(np.int8),
               launch_tid=z, launch_ns=z)


def _budget(source) -> tuple:
    """(Budget or None, ops, why not)."""
    from profattr.attribute.budget import compute_budget

    try:  # steps without GPU work are a finding here, not an error
        budget = compute_budget(source, keep_attribution=True, require_work=False)
    except ProfattrError as exc:
        try:
            ops = source.ops()
        except ProfattrError:
            ops = _empty_ops()
        return None, ops, f"steps could not be counted: {exc.format_message()}"
    return budget, budget.attribution.ops, None


def evaluate(path, run: RunRecord | None = None, twin=None) -> tuple:
    """(findings, budget or None): all checks on one capture (and its run.json, when there is one), with the
    per-step budget they used. `twin`: another capture of the same decode (eager or torch profiler) to compare
    kernels per step with."""
    from profattr.attribute.budget import opened

    with opened(path) as source:  # the op store where there is one: the checks read its columns, not SQL again
        budget, ops, why_not = _budget(source)
        findings = _checks(source, run, budget, ops, why_not)
    if twin is not None:
        findings.append(_twin_finding(path, budget, twin))
    return findings, budget


def evaluate_budget(source, budget, run: RunRecord | None = None, op_facts: OpFacts | None = None) -> list:
    """All checks on a capture already open as `source`, with the budget its caller computed from it: the checks
    that count steps count the caller's steps, so a report's checks and budgets agree. The ops are the budget's
    attribution's, or `op_facts`, their facts summed by the caller (a window at a time)."""
    if op_facts is None and budget.attribution is None:
        raise ValueError("evaluate_budget needs compute_budget(..., keep_attribution=True) or op_facts")
    return _checks(source, run, budget, op_facts if op_facts is not None else OpFacts.of(budget.attribution.ops),
                   None)


def _checks(source, run: RunRecord | None, budget, ops, why_not) -> list:
    """The findings, in their fixed order, from an open reader, its ops (or their facts.OpFacts) and its budget
    (None: `why_not` says why)."""
    ops = ops if isinstance(ops, OpFacts) else OpFacts.of(ops)
    facts = gather(source, ops)
    cuda = recording.traced_cuda(run, facts) is not False
    findings = [recording.check_kernels(run, facts)]
    if cuda:
        findings.append(recording.check_graph_nodes(facts))
        replay_ids = recording.check_replay_ids(source)  # only when replayed ops lack a correlationId
        if replay_ids is not None:
            findings.append(replay_ids)
        findings += [recording.check_devices(run, facts, len(source.gpus)),
                     completeness.check_records(source),
                     completeness.check_window_coverage(ops, source),
                     completeness.check_steps_with_work(budget),
                     completeness.check_graphs_recorded(run, facts),
                     completeness.check_profiler_version(run, source, facts),
                     backend.check_backend(run, facts.names),
                     backend.check_server_log(run),
                     timing.check_first_calls(source, facts.devices, run, ops.first_calls),
                     timing.check_steady_state(budget)]
    fp4 = backend.check_fp4_backend(run, facts.names) if cuda else None
    if fp4 is not None and fp4.status != SKIP:  # listed only for captures with FP4 work or an FP4 backend
        findings.insert(findings.index(next(f for f in findings if f.check == "server_log")) + 1, fp4)
    findings.append(timing.check_overhead(run, budget))
    if cuda:
        findings.append(timing.check_steps(run, budget, why_not, facts.devices))
    findings.append(recording.check_nvtx(run, facts))
    return findings


def _twin_finding(path, budget, twin):
    """Against a twin of the same decode: kernels per step (an eager or torch-profiler twin), or, for a twin
    traced at graph level (nsys --cuda-graph-trace=graph), what per-node graph tracing costs each launch."""
    from profattr.attribute.budget import compute_budget
    from profattr.attribute.graph_launch import launch_costs

    with open_trace(twin) as source:
        twin_costs = launch_costs(source)
    if twin_costs is not None and twin_costs["tracing"] == "graph":
        with open_trace(path) as source:
            mine = launch_costs(source)
        return completeness.check_graph_tracing(mine, twin_costs, str(twin))
    return (completeness.check_twin(budget, compute_budget(twin), str(twin)) if budget is not None
            else completeness.check_twin(None, None, str(twin)))


def run_checks(path, run: RunRecord | None = None) -> list:
    return evaluate(path, run)[0]


def check_capture(path, twin=None) -> tuple:
    """(Capture, findings) for a capture path; ProfattrError when there is nothing to check yet."""
    cap = located(path)
    return cap, evaluate(cap.path, fresh_server_log(cap), twin=Path(twin) if twin else None)[0]


def located(path) -> Capture:
    """The capture and run.json at `path` (locate.py); ProfattrError when there is nothing to check yet."""
    cap: Capture = locate(path)
    if cap.path is None:
        status = cap.run.status if cap.run is not None else None
        if status == "needs_import":
            raise ProfattrError(f"{cap.run_path}: the capture is a raw .qdstrm stream not yet turned into a report; "
                                f"run `profattr capture --finish {cap.run_path.parent}` where QdstrmImporter exists")
        raise ProfattrError(f"{cap.run_path}: no SQLite export or trace beside it (status {status!r}); nothing to "
                            "check")
    return cap


def fresh_server_log(cap: Capture) -> RunRecord | None:
    """run.json with its server-log evidence read again from the log beside it (what the log says is re-derived
    each time: the reading improves, the log does not change)."""
    run = cap.run
    log = run.log_file if run is not None else None
    if not run or run.target != "sglang" or not log or cap.run_path is None:
        return run
    path = cap.run_path.parent / log
    if not path.is_file():
        return run
    from profattr.engines import serverlog

    evidence = serverlog.read_log(path)
    if not evidence:
        return run
    run = run.replaced(server_log=serverlog.for_window(evidence, run.window))
    batch = run.batch
    if not run.has("timing.unprofiled_step") and batch is not None:
        # a capture made before the timing rounds' span was recorded: every clean decode line at its batch
        steps = serverlog.unprofiled_steps(path, batch, run.log_span_bytes)
        if steps is not None:
            run = run.replaced(timing=dict(run.timing, unprofiled_step=steps))
    return run
