"""Idle and launch analysis of a budget: how the GPU's idle time inside a step is spread, and how work was launched.

Per device, over the budget's steps:
- launches per step by kind (CUDA-graph launches, kernel launches, memory calls, synchronizations), counted from the
  CUDA API calls on the step's thread (the reader's `api_calls()`);
- GPU ops per step replayed from a CUDA graph (a graph node id) or launched one by one;
- the gaps between consecutive GPU ops of a step (start minus the latest end so far, when positive): their sum is
  the budget's idle time; each gap is charged to the op that ends it (graph-replayed or eager), which separates
  waiting inside a graph replay from waiting on host work between launches;
- of the gaps charged to replayed ops, those before the first node of a replay (the GPU waiting for the replay to
  start: the host's cudaGraphLaunch) apart from those between its nodes, with the share of replays whose launch call
  began only after the GPU had gone idle (the host behind the GPU) and the launch call's host time;
- what the host was doing during those gaps (host_gaps.py: CUDA API calls and NVTX ranges that overlap them, and,
  where the capture has CPU samples, the functions the step's CPU thread was sampled in).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.attribute.budget import Budget
from profattr.report import host_gaps
from profattr.trace.source import open_trace

NS_PER_MS = 1e6
NS_PER_US = 1e3
# a step whose graph-replayed ops are at least this share of its ops runs "graph"; none at all runs "eager"
GRAPH_MODE_SHARE = 0.5


def launch_stats(budget: Budget, source=None) -> list:
    """One dict per device of the budget (see the module docstring); the budget must keep its attribution.
    `source`: the capture's reader, already open (else it is opened again from the budget's path)."""
    att = budget.attribution
    if att is None:
        raise ValueError("launch_stats needs compute_budget(..., keep_attribution=True)")
    if source is None:
        with open_trace(budget.path) as opened:
            return launch_stats(budget, opened)
    api = source.api_calls()
    ranges = source.ranges()
    samples, names, period = _samples(source)
    calls = _calls_per_step(budget, api)
    out = []
    for d in budget.devices:
        device = d["device"]
        steps = budget.per_step.loc[budget.per_step["device"] == device, "step"].to_numpy()
        rows = _device_rows(att, device)
        gaps, largest = _gaps(att.step[rows], att.ops.start[rows], att.ops.end[rows])
        stats = _device_stats(att, rows, gaps, largest, device, steps, calls, d)
        stats.update(_replay_starts(att, rows, gaps, len(steps), api))
        sel = (att.step >= 0) & (att.ops.device == device)
        gs, ge, gap_step = host_gaps.idle_intervals(att.step[sel], att.ops.start[sel], att.ops.end[sel],
                                                    with_step=True)
        stats["host_in_idle"] = host_gaps.host_activity(gs, ge, api, ranges, att.steps, len(steps))
        summary = host_gaps.sample_summary(gs, ge, _step_threads(att, device, gap_step), samples, names, len(steps),
                                           period)
        if summary is not None:  # only captures with CPU samples say anything about them
            stats["host_in_idle"]["cpu_samples"] = summary
        out.append(stats)
    return out


def _samples(source):
    """(CPU samples, {string id: text} of their frames, sampling period ns or None); (None, {}, None) without."""
    samples = source.cpu_samples()
    if samples is None or not len(samples["tid"]):
        return None, {}, None
    ids = unique(np.concatenate([samples[k] for k in ("leaf_symbol", "leaf_module", "py_symbol", "py_module")]))
    return samples, source.strings(ids[ids >= 0]), source.sampling_period_ns()


def _step_threads(att, device: int, gap_step: np.ndarray) -> np.ndarray:
    """The CPU thread of each gap's step: the thread the step was found on (the one that launches its GPU work);
    for a capture taken as one whole step, the thread that launched most of the device's ops."""
    tid = np.asarray(att.steps.tid, dtype=np.int64)
    if att.steps.source != "whole" and len(tid):
        return tid[gap_step]
    ops = att.ops
    launch = ops.launch_tid[(ops.device == device) & ops.launched]
    if not len(launch):
        return np.full(len(gap_step), -1, dtype=np.int64)
    values, counts = np.unique(launch, return_counts=True)
    return np.full(len(gap_step), values[counts.argmax()], dtype=np.int64)


def _calls_per_step(budget: Budget, api: dict) -> np.ndarray | None:
    """Array steps x (graph, kernel, memory, sync, sync_ns) of CUDA API calls; None without recorded calls.

    A call belongs to the step whose interval on its thread holds the call's start (Steps.assign), as GPU work
    belongs to the step of its launch."""
    st = budget.attribution.steps
    n = len(st)
    if n == 0 or not len(api["kind"]):
        return None
    step = st.assign(api["tid"], api["start"])
    ok = step >= 0
    step, kind, dur = step[ok], api["kind"][ok], (api["end"] - api["start"])[ok]
    counts = np.zeros((n, 5), dtype=np.float64)
    for k in range(4):
        counts[:, k] = np.bincount(step[kind == k], minlength=n)[:n]
    counts[:, 4] = np.bincount(step[kind == 3], weights=dur[kind == 3], minlength=n)[:n]
    return counts


def _device_rows(att, device: int) -> np.ndarray:
    """Indices of the device's ops inside steps, in (step, start) order: the order the gaps are taken in."""
    sel = np.flatnonzero((att.step >= 0) & (att.ops.device == device))
    return sel[np.lexsort((att.ops.start[sel], att.step[sel]))]


def _device_stats(att, rows: np.ndarray, gaps: np.ndarray, largest: np.ndarray, device: int, steps: np.ndarray,
                  calls, d: dict) -> dict:
    """`rows` and `gaps`: the device's ops in step order and the gap before each (_device_rows, _gaps)."""
    step, start = att.step[rows], att.ops.start[rows]
    graph = att.ops.graph_node[rows] >= 0
    n_steps = max(len(steps), 1)
    positive = gaps[gaps > 0]
    boundaries = max(len(start) - len(unique(step)), 1)
    per_step_calls = calls[steps].mean(axis=0) if calls is not None and len(steps) else None
    graph_ops = float(graph.sum()) / n_steps
    ops_per_step = float(len(start)) / n_steps
    graph_launches = float(per_step_calls[0]) if per_step_calls is not None else None
    if graph_ops >= GRAPH_MODE_SHARE * ops_per_step and ops_per_step:
        mode = "graph"
    elif graph_ops == 0:
        mode = "eager"
    else:
        mode = "mixed"
    mean_step = d["mean_step_ms"]
    return {
        "device": device,
        "steps": len(steps),
        "mode": mode,
        "ops_per_step": ops_per_step,
        "kernels_per_step": d["kernels_per_step"],
        "graph_ops_per_step": graph_ops,
        "eager_ops_per_step": ops_per_step - graph_ops,
        "graph_launches_per_step": graph_launches,
        "kernel_launches_per_step": float(per_step_calls[1]) if per_step_calls is not None else None,
        "memory_calls_per_step": float(per_step_calls[2]) if per_step_calls is not None else None,
        "sync_calls_per_step": float(per_step_calls[3]) if per_step_calls is not None else None,
        "sync_ms_per_step": float(per_step_calls[4]) / NS_PER_MS if per_step_calls is not None else None,
        "mean_step_ms": mean_step,
        "idle_ms_per_step": d["idle_ms_per_step"],
        "idle_share": d["idle_ms_per_step"] / mean_step if mean_step else 0.0,
        # gaps are charged to the op that ends them: waiting for a replayed node, or for an eager launch
        "idle_before_graph_ops_ms": float(gaps[graph].sum()) / n_steps / NS_PER_MS,
        "idle_before_eager_ops_ms": float(gaps[~graph].sum()) / n_steps / NS_PER_MS,
        "mean_gap_us": float(gaps.sum()) / boundaries / NS_PER_US,
        "median_gap_us": float(np.median(positive)) / NS_PER_US if len(positive) else 0.0,
        "largest_gap_us": float(largest.mean()) / NS_PER_US if len(largest) else 0.0,
        "largest_gap_share_of_idle": float(largest.sum() / gaps.sum()) if gaps.sum() > 0 else 0.0,
    }


def _replay_starts(att, rows: np.ndarray, gaps: np.ndarray, n_steps: int, api: dict) -> dict:
    """The gaps before the first node of each CUDA-graph replay of the device's steps (`rows`, `gaps` as for
    _device_stats): per step (ms), the median positive one (µs), the share of those replays whose cudaGraphLaunch
    began after the GPU had gone idle, the median wait split into before that call and from the call to the first
    node (µs), and the median host time of those launch calls (µs); the last four None where the launch calls were
    not recorded."""
    ops = att.ops
    empty = {"idle_before_replay_ms": 0.0, "idle_inside_replay_ms": None, "replays_per_step": 0.0,
             "replay_wait_us": 0.0, "replay_host_late_share": None, "replay_before_call_us": None,
             "replay_call_to_node_us": None, "graph_launch_call_us": None}
    graph = ops.graph_node[rows] >= 0
    # a replay is the graph ops of one launch (one correlation id); its first node is its earliest op
    where = np.flatnonzero(graph)
    if not len(where):
        return empty
    _, first_at = np.unique(ops.launch_key[rows][where], return_index=True)
    first = where[first_at]
    wait = gaps[first]
    graph_idle = float(gaps[graph].sum()) / max(n_steps, 1) / NS_PER_MS
    out = dict(empty, idle_before_replay_ms=float(wait.sum()) / max(n_steps, 1) / NS_PER_MS,
               replays_per_step=len(first) / max(n_steps, 1))
    out["idle_inside_replay_ms"] = graph_idle - out["idle_before_replay_ms"]
    waited = first[wait > 0]
    if not len(waited):
        return out
    out["replay_wait_us"] = float(np.median(gaps[waited])) / NS_PER_US
    at = rows[waited]  # the op rows of the replays' first nodes
    launched = ops.launched[at]
    if launched.any():
        idle_from = ops.start[at] - gaps[waited]  # when the GPU went idle before the replay
        late_ns = np.clip(ops.launch_ns[at] - idle_from, 0, None)[launched]
        out["replay_host_late_share"] = float((late_ns > 0).mean())
        # the wait split: before the host called cudaGraphLaunch, and from that call to the first node
        out["replay_before_call_us"] = float(np.median(late_ns)) / NS_PER_US
        out["replay_call_to_node_us"] = float(np.median(gaps[waited][launched] - late_ns)) / NS_PER_US
        out["graph_launch_call_us"] = _launch_call_us(ops.launch_tid[at][launched], ops.launch_ns[at][launched],
                                                      api)
    return out


def _launch_call_us(tid: np.ndarray, launch_ns: np.ndarray, api: dict):
    """Median host duration (µs) of the graph-launch calls that start at (tid, launch_ns); None when none match."""
    graph = api["kind"] == 0
    if not graph.any():
        return None
    calls = pd.DataFrame({"tid": api["tid"][graph], "start": api["start"][graph],
                          "dur": api["end"][graph] - api["start"][graph]}).drop_duplicates(["tid", "start"])
    found = pd.DataFrame({"tid": tid, "start": launch_ns}).merge(calls, on=["tid", "start"], how="inner")
    return float(found["dur"].median()) / NS_PER_US if len(found) else None


def _gaps(step: np.ndarray, start: np.ndarray, end: np.ndarray):
    """(gap before each op in (step, start) order, 0 for a step's first op; largest gap per step)."""
    if len(start) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.lexsort((start, step))
    g, s, e = step[order], start[order], end[order]
    origin = int(s.min())
    width = int(e.max()) - origin + 1
    _, group = np.unique(g, return_inverse=True)
    offset = group.reshape(-1).astype(np.int64) * width  # steps never mix: a later step's values are all larger
    cummax = np.maximum.accumulate(e - origin + offset)
    gaps = np.zeros(len(s), dtype=np.int64)
    same = np.zeros(len(s), dtype=bool)
    same[1:] = g[1:] == g[:-1]
    gaps[1:] = np.clip(s[1:] - origin + offset[1:] - cummax[:-1], 0, None)
    gaps[~same] = 0
    firsts = np.flatnonzero(~same)
    largest = np.maximum.reduceat(gaps, firsts)
    return gaps.astype(np.float64), largest.astype(np.float64)
