"""Idle and launch analysis of a budget: how the GPU's idle time inside a step is spread, and how work was launched.

Per device, over the budget's steps:
- launches per step by kind (CUDA-graph launches, kernel launches, memory calls, synchronizations), counted from the
  CUDA API calls on the step's thread (the reader's `api_calls()`);
- GPU ops per step replayed from a CUDA graph (a graph node id) or launched one by one;
- the gaps between consecutive GPU ops of a step (start minus the latest end so far, when positive): their sum is
  the budget's idle time; each gap is charged to the op that ends it (graph-replayed or eager), which separates
  waiting inside a graph replay from waiting on host work between launches;
- what the host was doing during those gaps (host_gaps.py: CUDA API calls and NVTX ranges that overlap them).
"""
from __future__ import annotations

import numpy as np

from profattr.attribute.budget import Budget
from profattr.report import host_gaps
from profattr.trace.source import open_trace

NS_PER_MS = 1e6
NS_PER_US = 1e3
# a step whose graph-replayed ops are at least this share of its ops runs "graph"; none at all runs "eager"
GRAPH_MODE_SHARE = 0.5


def launch_stats(budget: Budget) -> list:
    """One dict per device of the budget (see the module docstring); the budget must keep its attribution."""
    att = budget.attribution
    if att is None:
        raise ValueError("launch_stats needs compute_budget(..., keep_attribution=True)")
    with open_trace(budget.path) as source:
        api = source.api_calls()
        ranges = source.ranges()
    calls = _calls_per_step(budget, api)
    out = []
    for d in budget.devices:
        device = d["device"]
        steps = budget.per_step.loc[budget.per_step["device"] == device, "step"].to_numpy()
        stats = _device_stats(att, device, steps, calls, d)
        sel = (att.step >= 0) & (att.ops.device == device)
        gs, ge = host_gaps.idle_intervals(att.step[sel], att.ops.start[sel], att.ops.end[sel])
        stats["host_in_idle"] = host_gaps.host_activity(gs, ge, api, ranges, att.steps, len(steps))
        out.append(stats)
    return out


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


def _device_stats(att, device: int, steps: np.ndarray, calls, d: dict) -> dict:
    ops = att.ops
    sel = (att.step >= 0) & (ops.device == device)
    step, start, end = att.step[sel], ops.start[sel], ops.end[sel]
    graph = ops.graph_node[sel] >= 0
    n_steps = max(len(steps), 1)
    gaps, largest = _gaps(step, start, end)
    order_graph = graph[np.lexsort((start, step))]
    positive = gaps[gaps > 0]
    boundaries = max(len(start) - len(np.unique(step)), 1)
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
        "idle_before_graph_ops_ms": float(gaps[order_graph].sum()) / n_steps / NS_PER_MS,
        "idle_before_eager_ops_ms": float(gaps[~order_graph].sum()) / n_steps / NS_PER_MS,
        "mean_gap_us": float(gaps.sum()) / boundaries / NS_PER_US,
        "median_gap_us": float(np.median(positive)) / NS_PER_US if len(positive) else 0.0,
        "largest_gap_us": float(largest.mean()) / NS_PER_US if len(largest) else 0.0,
        "largest_gap_share_of_idle": float(largest.sum() / gaps.sum()) if gaps.sum() > 0 else 0.0,
    }


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
