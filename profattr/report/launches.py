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

LaunchTally sums these a window of ops at a time (the report reads the op store's windows: window_views.py);
launch_stats gives it the budget's attribution, all ops at once. Every figure is a sum, a count, a maximum or an
exact median over the windows, so the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profattr.arrays import Median, unique, value_counts
from profattr.attribute.budget import Budget
from profattr.report import host_gaps
from profattr.trace.source import open_trace

NS_PER_MS = 1e6
NS_PER_US = 1e3
# a step whose graph-replayed ops are at least this share of its ops runs "graph"; none at all runs "eager"
GRAPH_MODE_SHARE = 0.5


def launch_stats(budget: Budget, source=None) -> list:
    """One dict per device of the budget (see the module docstring), from its attribution (all ops at once).
    `source`: the capture's reader, already open (else it is opened again from the budget's path)."""
    att = budget.attribution
    if att is None:
        raise ValueError("launch_stats needs compute_budget(..., keep_attribution=True)")
    if source is None:
        with open_trace(budget.path) as opened:
            return launch_stats(budget, opened)
    tally = LaunchTally(budget, source, att.steps)
    tally.add(att.ops, att.step)
    return tally.finish()


class LaunchTally:
    """launch_stats summed a window of ops at a time (`add`: the ops in the reader's row order, windows in start
    order, with each op's budget step) and finished once: every figure is a sum, a count, a maximum or an exact
    median (arrays.Median) over the windows, so any split of the ops into such windows gives the same stats."""

    def __init__(self, budget: Budget, source, steps, api=None, ranges=None):
        """`steps`: the budget's; `api`, `ranges`: the reader's host_calls() and ranges(), when already read."""
        api = source.host_calls() if api is None else api
        self.budget, self.steps = budget, steps
        self.shared = _Shared(budget, steps, *_samples(source), _calls_per_step(steps, api),
                              host_gaps.HostCalls(api, source.ranges() if ranges is None else ranges, steps),
                              _graph_calls(api))
        self.devices = {int(d["device"]): _DeviceTally(self.shared, int(d["device"])) for d in budget.devices}

    def add(self, ops, step: np.ndarray) -> None:
        inside = step >= 0
        for device, tally in self.devices.items():
            tally.add(ops, step, np.flatnonzero(inside & (ops.device == device)))
            if _whole(self.steps):  # the gaps' thread: the one that launched most of the device's ops
                tally.count_launchers(ops.launch_tid[(ops.device == device) & ops.launched])

    def finish(self) -> list:
        return [self.devices[int(d["device"])].finish(d) for d in self.budget.devices]


def _samples(source):
    """(CPU samples, {string id: text} of their frames, sampling period ns or None); (None, {}, None) without."""
    samples = source.cpu_samples()
    if samples is None or not len(samples["tid"]):
        return None, {}, None
    ids = unique(np.concatenate([samples[k] for k in ("leaf_symbol", "leaf_module", "py_symbol", "py_module")]))
    return samples, source.strings(ids[ids >= 0]), source.sampling_period_ns()


def _whole(steps) -> bool:
    """The capture is one whole step (no step's thread to charge its gaps to)."""
    return steps.source == "whole" or not len(steps.tid)


def _graph_calls(api):
    """The graph-launch calls (of the reader's host_calls()), one per (thread, start), with their host duration;
    None when none were recorded."""
    if not api.count(0):
        return None
    parts = []
    for block in api.blocks():
        graph = block["kind"] == 0
        parts.append(pd.DataFrame({"tid": block["tid"][graph], "start": block["start"][graph],
                                   "dur": block["end"][graph] - block["start"][graph]}))
    return pd.concat(parts, ignore_index=True).drop_duplicates(["tid", "start"])


@dataclass
class _Shared:
    """What every device's tally reads (held by LaunchTally, not by a tally that points back at it)."""

    budget: Budget
    steps: object  # attribute/steps.py Steps
    samples: dict | None
    names: dict
    period: float | None
    calls: np.ndarray | None  # _calls_per_step
    host: host_gaps.HostCalls
    graph_calls: pd.DataFrame | None


class _DeviceTally:
    """One device's part of LaunchTally: its ops inside steps in (step, start) order, a window at a time; the
    latest end so far of each step carries over to the next window, so the gaps are those of all ops at once."""

    def __init__(self, parent: _Shared, device: int):
        self.parent, self.device = parent, device
        n = len(parent.steps)
        self.run_end = np.zeros(n, dtype=np.int64)  # per step: the latest end of its ops so far
        self.seen = np.zeros(n, dtype=bool)  # per step: it has ops on this device
        self.largest = np.zeros(n, dtype=np.int64)  # per step: its largest gap
        self.rows = self.graph_rows = self.gap_graph_ns = self.gap_eager_ns = 0
        self.positive = Median()  # the positive gaps
        self.replay_keys = np.zeros(0, dtype=np.int64)  # launch keys of the replays met so far (sorted)
        self.replays = self.replay_wait_ns = self.waited_launched = self.late = 0
        self.waits, self.late_ns, self.call_to_node, self.call_ns = Median(), Median(), Median(), Median()
        self.host = parent.host.tally()
        self.launchers: dict = {}  # launching thread -> ops ("whole" steps: the gaps' thread)
        self.gap_tids: set = set()  # the gaps' threads
        self.had_gaps = False
        samples = parent.samples
        self.in_gap = np.zeros(len(samples["tid"]) if samples is not None else 0, dtype=bool)

    def count_launchers(self, tids: np.ndarray) -> None:
        for t, c in zip(*(x.tolist() for x in value_counts(tids))):
            self.launchers[t] = self.launchers.get(t, 0) + c

    def add(self, ops, step: np.ndarray, sel: np.ndarray) -> None:
        if not len(sel):
            return
        rows = sel[np.lexsort((ops.start[sel], step[sel]))]
        g, s, e = step[rows], ops.start[rows], ops.end[rows]
        prev, has_prev = self._previous_ends(g, e)
        gaps = np.where(has_prev, np.clip(s - prev, 0, None), 0)
        graph = ops.graph_node[rows] >= 0
        self.rows += len(rows)
        self.graph_rows += int(graph.sum())
        self.gap_graph_ns += int(gaps[graph].sum())
        self.gap_eager_ns += int(gaps[~graph].sum())
        self.positive.add(gaps[gaps > 0])
        firsts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # each step's run (the rows are in step order)
        here = g[firsts]
        self.largest[here] = np.maximum(self.largest[here], np.maximum.reduceat(gaps, firsts))
        self._replays(ops, rows, gaps, graph)
        keep = has_prev & (s > prev)  # the idle intervals: from the latest end so far to the next start
        order = np.argsort(prev[keep], kind="stable")
        gs, ge, gap_step = prev[keep][order], s[keep][order], g[keep][order]
        self.host.add(gs, ge)
        self._samples_in(gs, ge, gap_step)

    def _previous_ends(self, g: np.ndarray, e: np.ndarray) -> tuple:
        """Per op (in (step, start) order): the latest end of its step's earlier ops, here or in earlier windows,
        and whether it has any; the steps' latest ends are then carried on."""
        n = len(g)
        first = np.ones(n, dtype=bool)
        first[1:] = g[1:] != g[:-1]
        # a running maximum restarting at each step: offsets make every later step's values larger
        origin = int(e.min())
        width = int(e.max()) - origin + 1
        offset = (np.cumsum(first) - 1) * width
        running = np.maximum.accumulate((e - origin) + offset) - offset + origin
        within = np.empty(n, dtype=np.int64)
        within[1:] = running[:-1]
        carried = self.seen[g]
        carry = self.run_end[g]
        prev = np.where(first, carry, np.where(carried, np.maximum(within, carry), within))
        has_prev = ~first | carried
        last = np.concatenate([np.flatnonzero(first)[1:], [n]]) - 1  # each step's last op here
        gl = g[last]
        self.run_end[gl] = np.where(self.seen[gl], np.maximum(self.run_end[gl], running[last]), running[last])
        self.seen[gl] = True
        return prev, has_prev

    def _replays(self, ops, rows: np.ndarray, gaps: np.ndarray, graph: np.ndarray) -> None:
        """The gaps before the first node of each CUDA-graph replay (a replay: the graph ops of one launch, its
        first node its earliest op; a replay met in an earlier window is not new here)."""
        where = np.flatnonzero(graph)
        if not len(where):
            return
        keys = ops.launch_key[rows][where]
        uniq, first_at = np.unique(keys, return_index=True)
        new = ~np.isin(uniq, self.replay_keys, assume_unique=True)
        self.replay_keys = np.union1d(self.replay_keys, uniq)
        first = where[first_at[new]]
        wait = gaps[first]
        self.replays += len(first)
        self.replay_wait_ns += int(wait.sum())
        waited = first[wait > 0]
        if not len(waited):
            return
        self.waits.add(gaps[waited])
        at = rows[waited]  # the op rows of the replays' first nodes
        launched = ops.launched[at]
        if not launched.any():
            return
        self.waited_launched += int(launched.sum())
        idle_from = ops.start[at] - gaps[waited]  # when the GPU went idle before the replay
        late_ns = np.clip(ops.launch_ns[at] - idle_from, 0, None)[launched]
        self.late += int((late_ns > 0).sum())
        self.late_ns.add(late_ns)
        self.call_to_node.add(gaps[waited][launched] - late_ns)
        calls = self.parent.graph_calls
        if calls is not None:
            found = pd.DataFrame({"tid": ops.launch_tid[at][launched], "start": ops.launch_ns[at][launched]}).merge(
                calls, on=["tid", "start"], how="inner")
            self.call_ns.add(found["dur"].to_numpy(np.int64))

    def _samples_in(self, gs, ge, gap_step) -> None:
        """Mark the CPU samples inside these gaps on the gap's thread: the thread the gap's step was found on; for
        a capture taken as one whole step, the thread that launched most of the device's ops, known only at the
        end (the samples inside the gaps on any thread are marked, and kept to that thread then)."""
        samples, steps = self.parent.samples, self.parent.steps
        if not len(gs):
            return
        self.had_gaps = True
        if samples is None:
            return
        if _whole(steps):
            self.in_gap |= host_gaps.in_gaps(gs, ge, None, samples["tid"], samples["start"])
            return
        gap_tid = np.asarray(steps.tid, dtype=np.int64)[gap_step]
        self.gap_tids.update(unique(gap_tid).tolist())
        self.in_gap |= host_gaps.in_gaps(gs, ge, gap_tid, samples["tid"], samples["start"])

    def _sample_summary(self, n_steps: int):
        p = self.parent
        if p.samples is None:
            return None
        inside, threads = self.in_gap, self.gap_tids
        if _whole(p.steps):
            launcher = max(self.launchers.items(), key=lambda kv: (kv[1], -kv[0]))[0] if self.launchers else -1
            inside = inside & (p.samples["tid"] == launcher)
            threads = {launcher} if self.had_gaps else set()
        return host_gaps.samples_in_gaps(inside, threads, p.samples, p.names, n_steps, p.period, self.host.idle_ns)

    def _device_stats(self, steps: np.ndarray, d: dict) -> dict:
        n_steps = max(len(steps), 1)
        boundaries = max(self.rows - int(self.seen.sum()), 1)
        calls = self.parent.calls
        per_step_calls = calls[steps].mean(axis=0) if calls is not None and len(steps) else None
        graph_ops = float(self.graph_rows) / n_steps
        ops_per_step = float(self.rows) / n_steps
        graph_launches = float(per_step_calls[0]) if per_step_calls is not None else None
        if graph_ops >= GRAPH_MODE_SHARE * ops_per_step and ops_per_step:
            mode = "graph"
        elif graph_ops == 0:
            mode = "eager"
        else:
            mode = "mixed"
        mean_step = d["mean_step_ms"]
        gap_ns = self.gap_graph_ns + self.gap_eager_ns
        with_ops = int(self.seen.sum())
        largest_ns = int(self.largest[self.seen].sum())
        median_gap = self.positive.median()
        return {
            "device": self.device,
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
            "idle_before_graph_ops_ms": float(self.gap_graph_ns) / n_steps / NS_PER_MS,
            "idle_before_eager_ops_ms": float(self.gap_eager_ns) / n_steps / NS_PER_MS,
            "mean_gap_us": float(gap_ns) / boundaries / NS_PER_US,
            "median_gap_us": median_gap / NS_PER_US if median_gap is not None else 0.0,
            "largest_gap_us": float(largest_ns) / with_ops / NS_PER_US if with_ops else 0.0,
            "largest_gap_share_of_idle": float(largest_ns) / float(gap_ns) if gap_ns > 0 else 0.0,
        }

    def _replay_stats(self, n_steps: int) -> dict:
        """Per step (ms), the gaps before the first node of each CUDA-graph replay, and those between its nodes;
        the median positive one (µs), the share of those replays whose cudaGraphLaunch began after the GPU had
        gone idle, the median wait split into before that call and from the call to the first node (µs), and the
        median host time of those launch calls (µs); the last four None where the launch calls were not
        recorded."""
        out = {"idle_before_replay_ms": 0.0, "idle_inside_replay_ms": None, "replays_per_step": 0.0,
               "replay_wait_us": 0.0, "replay_host_late_share": None, "replay_before_call_us": None,
               "replay_call_to_node_us": None, "graph_launch_call_us": None}
        if not self.graph_rows:
            return out
        n = max(n_steps, 1)
        out["idle_before_replay_ms"] = float(self.replay_wait_ns) / n / NS_PER_MS
        out["replays_per_step"] = self.replays / n
        out["idle_inside_replay_ms"] = float(self.gap_graph_ns) / n / NS_PER_MS - out["idle_before_replay_ms"]
        if not len(self.waits):
            return out
        out["replay_wait_us"] = self.waits.median() / NS_PER_US
        if not self.waited_launched:
            return out
        out["replay_host_late_share"] = float(self.late) / self.waited_launched
        # the wait split: before the host called cudaGraphLaunch, and from that call to the first node
        out["replay_before_call_us"] = self.late_ns.median() / NS_PER_US
        out["replay_call_to_node_us"] = self.call_to_node.median() / NS_PER_US
        found = self.call_ns.median()
        out["graph_launch_call_us"] = found / NS_PER_US if found is not None else None
        return out

    def finish(self, d: dict) -> dict:
        p = self.parent
        budget = p.budget
        steps = budget.per_step.loc[budget.per_step["device"] == self.device, "step"].to_numpy()
        stats = self._device_stats(steps, d)
        stats.update(self._replay_stats(len(steps)))
        stats["host_in_idle"] = self.host.result(len(steps))
        summary = self._sample_summary(len(steps))
        if summary is not None:  # only captures with CPU samples say anything about them
            stats["host_in_idle"]["cpu_samples"] = summary
        return stats


def _calls_per_step(st, api) -> np.ndarray | None:
    """Array steps x (graph, kernel, memory, sync, sync_ns) of CUDA API calls (the reader's host_calls(), a block at
    a time); None without recorded calls.

    A call belongs to the step whose interval on its thread holds the call's start (Steps.assign), as GPU work
    belongs to the step of its launch (`st`: the budget's steps)."""
    n = len(st)
    if n == 0 or not len(api):
        return None
    counts = np.zeros((n, 5), dtype=np.float64)  # integers, and sums of integer ns far below 2**53: exact
    for block in api.blocks():
        step = st.assign(block["tid"], block["start"])
        ok = step >= 0
        step, kind, dur = step[ok], block["kind"][ok], (block["end"] - block["start"])[ok]
        for k in range(4):
            counts[:, k] += np.bincount(step[kind == k], minlength=n)[:n]
        counts[:, 4] += np.bincount(step[kind == 3], weights=dur[kind == 3], minlength=n)[:n]
    return counts


