"""The attributed steps of a capture as a Chrome / Perfetto trace (JSON trace event format), to open in
ui.perfetto.dev or chrome://tracing.

Per GPU, two processes:
- `GPU N`: one thread (track) per CUDA stream holding the step's GPU ops as complete events (`ph: "X"`, `ts` and
  `dur` in µs), named by the kernel's short name, with its category, family, step, demangled name, CUDA-graph node
  and launch shape (where recorded) as `args`; a `steps` track with one slice per step (first start to last end of
  its GPU work) and an instant event (`ph: "i"`) at each step's start; an `idle` track with the gaps between the
  step's consecutive ops (the budget's idle time: host_gaps.idle_intervals);
- `GPU N categories`: one track per category holding the same op slices, so a category reads as one row;
and one `host` process with a track per CPU thread: its CUDA API calls that launch, copy or wait (named by kind:
host_gaps.KINDS) and its NVTX ranges (named by their text), those that overlap the exported steps' GPU work.

Events are written as they are formed, a window of steps at a time: the output is never held whole. Strings from the
capture are JSON-escaped (json.dumps), not altered. Times are the capture's own clock (ns), written exactly as µs
with three decimals.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from profattr.arrays import unique
from profattr import __version__
from profattr.attribute.budget import Budget
from profattr.errors import ProfattrError
from profattr.report.host_gaps import idle_intervals

CATEGORY_PID_OFFSET = 1_000_000  # pid of a GPU's categories process: this + the GPU id
HOST_PID = 2_000_000  # the host process (CPU threads keep their thread id, the low 24 bits of nsys' globalTid)
THREAD_BITS = 0xFFFFFF
# the steps and idle tracks of a GPU's process, above any CUDA stream id seen in practice (streams keep their own
# ids as tids; trace viewers want tids that are not negative)
STEPS_TID, IDLE_TID = 2_000_000_001, 2_000_000_002
STEPS_PER_WINDOW = 64


def us(ns: int) -> str:
    """Integer ns as µs, exact: 1234567 -> 1234.567."""
    ns = int(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def parse_step_range(text: str | None) -> tuple | None:
    """`A:B` (both included; either may be left out) -> (A, B or None); None for all steps."""
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        a = int(first) if first.strip() else 0
        b = int(last) if sep and last.strip() else (None if sep else a)
    except ValueError:
        raise ProfattrError(f"--step-range {text!r}: expected FIRST:LAST step numbers (e.g. 2:9, 5:, 3)") from None
    if a < 0 or (b is not None and b < a):
        raise ProfattrError(f"--step-range {text!r}: expected 0 <= FIRST <= LAST")
    return a, b


def selected_steps(budget: Budget, device: int, step_range: tuple | None) -> np.ndarray:
    """The device's step indices (in start order) inside `step_range`."""
    rows = budget.per_step[budget.per_step["device"] == device].sort_values("start_ns")
    steps = rows["step"].to_numpy(np.int64)
    if step_range is not None:
        a, b = step_range
        steps = steps[(steps >= a) & (steps <= (b if b is not None else steps.max(initial=0)))]
    return steps


def _meta(pid: int, tid: int | None, kind: str, name: str, sort: int | None = None) -> list:
    out = [json.dumps({"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}), "name": kind,
                       "args": {"name": name}})]
    if sort is not None:
        what = "thread_sort_index" if tid is not None else "process_sort_index"
        out.append(json.dumps({"ph": "M", "pid": pid, **({"tid": tid} if tid is not None else {}), "name": what,
                               "args": {"sort_index": sort}}))
    return out


def _combo_args(combos) -> list:
    """Per combination: (JSON name, JSON cat, the start of its args object, category) precomputed once."""
    out = []
    for r in combos.itertuples():
        args = (f'"category": {json.dumps(str(r.category))}, "family": {json.dumps(str(r.family))}, '
                f'"demangled": {json.dumps(str(r.demangled))}')
        out.append((json.dumps(str(r.name)), json.dumps(str(r.category)), args, str(r.category)))
    return out


def _shape(grid: int, block: int) -> str:
    if grid < 0 or block < 0:
        return ""
    return (f', "grid": [{grid >> 32}, {(grid >> 16) & 0xFFFF}, {grid & 0xFFFF}], "block": [{block >> 48}, '
            f'{(block >> 32) & 0xFFFF}, {(block >> 16) & 0xFFFF}], "registers_per_thread": {block & 0xFFFF}')


def events(budget: Budget, step_range: tuple | None = None, api: dict | None = None):
    """The trace's events, one JSON object (text) at a time; `api`: the reader's api_calls() for the host tracks
    (None: the NVTX ranges alone)."""
    att = budget.attribution
    if att is None:
        raise ValueError("perfetto events need compute_budget(..., keep_attribution=True)")
    ops = att.ops
    combos = _combo_args(att.combos)
    categories = sorted(set(att.combos["category"].astype(str)))
    cat_tid = {c: k + 1 for k, c in enumerate(categories)}
    written, windows = 0, []
    for d in budget.devices:
        device = int(d["device"])
        steps = selected_steps(budget, device, step_range)
        if not len(steps):
            continue
        written += len(steps)
        pid, cpid = device, CATEGORY_PID_OFFSET + device
        sel = np.flatnonzero((ops.device == device) & np.isin(att.step, steps))
        yield from _meta(pid, None, "process_name", f"GPU {device}", 2 * device)
        yield from _meta(cpid, None, "process_name", f"GPU {device} categories", 2 * device + 1)
        yield from _meta(pid, STEPS_TID, "thread_name", "steps", 0)
        yield from _meta(pid, IDLE_TID, "thread_name", "idle", 1)
        for k, s in enumerate(unique(ops.stream[sel])):
            yield from _meta(pid, int(s), "thread_name", f"stream {int(s)}", k + 2)
        for c in sorted({str(att.combos["category"].iat[i]) for i in unique(att.combo[sel])}):
            yield from _meta(cpid, cat_tid[c], "thread_name", c, cat_tid[c])
        rows = budget.per_step.set_index(["device", "step"])
        chosen = rows.loc[[(device, int(k)) for k in steps]]
        windows.append((int(chosen["start_ns"].min()), int(chosen["end_ns"].max())))
        for w in range(0, len(steps), STEPS_PER_WINDOW):
            window = steps[w:w + STEPS_PER_WINDOW]
            yield from _step_events(rows, device, window)
            idx = sel[np.isin(att.step[sel], window)]
            idx = idx[np.argsort(ops.start[idx], kind="stable")]
            yield from _op_events(att, idx, pid, cpid, combos, cat_tid)
            gs, ge, gstep = idle_intervals(att.step[idx], ops.start[idx], ops.end[idx], with_step=True)
            for s, e, k in zip(gs.tolist(), ge.tolist(), gstep.tolist()):
                yield (f'{{"name": "idle", "cat": "idle", "ph": "X", "ts": {us(s)}, "dur": {us(e - s)}, '
                       f'"pid": {pid}, "tid": {IDLE_TID}, "args": {{"step": {k}}}}}')
    if not written:
        raise ProfattrError("--step-range selects none of the capture's steps; see `profattr budget` for how many "
                            "it has")
    yield from _host_events(att.ranges.frame, api, min(w[0] for w in windows), max(w[1] for w in windows))


def _host_events(ranges, api: dict | None, start_ns: int, end_ns: int):
    """The host process: per CPU thread, the API calls and NVTX ranges overlapping [start_ns, end_ns)."""
    from profattr.report.host_gaps import KINDS

    parts = []  # (tid, start, end, JSON name, cat)
    if api is not None and len(api["kind"]):
        sel = (api["end"] > start_ns) & (api["start"] < end_ns)
        names = [json.dumps(k) for k in KINDS]
        parts += [(t, s, e, names[k], '"cuda_api"') for t, s, e, k in
                  zip(api["tid"][sel].tolist(), api["start"][sel].tolist(), api["end"][sel].tolist(),
                      api["kind"][sel].tolist())]
    if ranges is not None and len(ranges):
        r_start, r_end = ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64)
        sel = (r_end > start_ns) & (r_start < end_ns)
        parts += [(t, s, e, json.dumps(str(x)), '"nvtx"') for t, s, e, x in
                  zip(ranges["tid"].to_numpy(np.int64)[sel].tolist(), r_start[sel].tolist(), r_end[sel].tolist(),
                      ranges["text"].to_numpy()[sel])]
    if not parts:
        return
    yield from _meta(HOST_PID, None, "process_name", "host", -1)
    for t in sorted({p[0] for p in parts}):
        yield from _meta(HOST_PID, t & THREAD_BITS, "thread_name", f"thread {t & THREAD_BITS}")
    for t, s, e, name, cat in parts:
        yield (f'{{"name": {name}, "cat": {cat}, "ph": "X", "ts": {us(s)}, "dur": {us(e - s)}, '
               f'"pid": {HOST_PID}, "tid": {t & THREAD_BITS}}}')


def _step_events(rows, device: int, window: Sequence[int]):
    for k in window:
        r = rows.loc[(device, int(k))]
        start, end = int(r["start_ns"]), int(r["end_ns"])
        args = (f'{{"step": {int(k)}, "span_ms": {(end - start) / 1e6!r}, "busy_ms": {int(r["busy_ns"]) / 1e6!r}, '
                f'"kernels": {int(r["kernels"])}}}')
        yield (f'{{"name": "step {int(k)}", "cat": "step", "ph": "X", "ts": {us(start)}, "dur": {us(end - start)}, '
               f'"pid": {device}, "tid": {STEPS_TID}, "args": {args}}}')
        yield (f'{{"name": "step {int(k)}", "cat": "step", "ph": "i", "s": "p", "ts": {us(start)}, '
               f'"pid": {device}, "tid": {STEPS_TID}}}')


def _op_events(att, idx: np.ndarray, pid: int, cpid: int, combos: list, cat_tid: dict):
    ops = att.ops
    cols = zip(ops.start[idx].tolist(), ops.end[idx].tolist(), ops.stream[idx].tolist(), att.combo[idx].tolist(),
               att.step[idx].tolist(), ops.graph_node[idx].tolist(), ops.grid[idx].tolist(), ops.block[idx].tolist())
    for start, end, stream, combo, step, node, grid, block in cols:
        name, cat, args, category = combos[combo]
        body = (f'"name": {name}, "cat": {cat}, "ph": "X", "ts": {us(start)}, "dur": {us(end - start)}, '
                f'"args": {{{args}, "step": {step}, "stream": {stream}'
                + (f', "graph_node": {node}' if node >= 0 else "") + _shape(grid, block) + "}")
        yield f'{{{body}, "pid": {pid}, "tid": {stream}}}'
        yield f'{{{body}, "pid": {cpid}, "tid": {cat_tid[category]}}}'


def write_trace(budget: Budget, fh, step_range: tuple | None = None, api: dict | None = None) -> int:
    """Write the trace to the text file `fh` (`api`: as for events); returns the number of events."""
    other = json.dumps({"profattr": __version__, "capture": budget.path, "steps": budget.steps_source,
                        "time": "the capture's clock; ts and dur in microseconds"})
    fh.write('{"displayTimeUnit": "ns", "otherData": ' + other + ', "traceEvents": [\n')
    n = 0
    for event in events(budget, step_range, api):
        fh.write((",\n" if n else "") + event)
        n += 1
    fh.write("\n]}\n")
    return n
