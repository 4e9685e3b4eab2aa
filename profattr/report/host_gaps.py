"""What the host was doing while the GPU idled inside a step.

The idle intervals of a device are the gaps between its consecutive GPU ops inside each step (the same gaps whose
sum is the budget's idle time: launches.py). Against them, the time of every host activity that overlaps them:
- CUDA API calls that launch, copy or wait (graph launches, kernel launches, memory calls, synchronizations), on
  any CPU thread, from the reader's `api_calls()`;
- NVTX ranges on any thread (annotations such as SGLang's scheduler spans or torch's record_function): the innermost
  ones (no other range of their thread starts inside them), and none that encloses a whole step.
An activity's figure is the idle time it overlaps, per step: two activities on two threads can overlap the same gap,
so the figures do not add up to the idle time; each says how much of the idle that activity was running through.

Where the capture has CPU samples (nsys --sample), the samples of the step's CPU thread (the one that launches the
step's GPU work) that fall inside that step's gaps, by function: the leaf frame (symbol, module) and, where the
call chain has Python frames, the innermost one. A sample stands for one sampling period of the thread's CPU time,
so a function's share of the idle is its samples times the period over the idle time.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.text import clean

NS_PER_MS = 1e6
TOP = 5
KINDS = ("graph launches", "kernel launches", "memory calls", "synchronizations")


def idle_intervals(step: np.ndarray, start: np.ndarray, end: np.ndarray, with_step: bool = False) -> tuple:
    """(starts, ends) of the idle gaps between consecutive ops of each step, sorted and disjoint; with `with_step`,
    also the step of each gap."""
    if len(start) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return (empty, empty, empty) if with_step else (empty, empty)
    order = np.lexsort((start, step))
    g, s, e = step[order], start[order], end[order]
    same = np.zeros(len(s), dtype=bool)
    same[1:] = g[1:] == g[:-1]
    # the latest end so far within the step: offsets make every later step's values larger, so one running
    # maximum restarts at each step
    origin = int(s.min())
    width = int(e.max()) - origin + 1
    _, group = np.unique(g, return_inverse=True)
    offset = group.reshape(-1).astype(np.int64) * width
    run_max = np.maximum.accumulate(e - origin + offset) - offset + origin
    gap_start, gap_end = run_max[:-1], s[1:]
    keep = same[1:] & (gap_end > gap_start)
    gs, ge = gap_start[keep], gap_end[keep]
    order = np.argsort(gs, kind="stable")
    if with_step:
        return gs[order], ge[order], g[1:][keep][order]
    return gs[order], ge[order]


GAPS_PER_CHUNK = 1 << 16  # gaps measured against the calls at a time: sums stay far inside int64


def overlap_ns(gs: np.ndarray, ge: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval [start, end): its overlap (int64 ns) with the gaps [gs, ge), summed over the gaps (a gap counts
    once however many others overlap it: the gaps of one step are disjoint, those of two overlapping steps are each
    that step's idle). Exact integers; additive over any split of the gaps, so a window of gaps at a time adds up
    to all of them at once."""
    out = np.zeros(len(start), dtype=np.int64)
    if len(gs) == 0 or len(start) == 0:
        return out
    gs, ge = np.asarray(gs, dtype=np.int64), np.asarray(ge, dtype=np.int64)
    order = np.argsort(gs, kind="stable")
    gs, ge = gs[order], ge[order]
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    for lo in range(0, len(gs), GAPS_PER_CHUNK):
        out += _chunk_overlap(gs[lo:lo + GAPS_PER_CHUNK], ge[lo:lo + GAPS_PER_CHUNK], start, end)
    return out


def _chunk_overlap(gs, ge, start, end) -> np.ndarray:
    """overlap_ns for gaps sorted by start, times taken from the chunk's first gap start (small sums).

    F(t), the gap time before t summed over gaps, is the closed gaps' lengths plus (t - gs) of those still open;
    an interval's overlap is F(end) - F(start)."""
    origin = int(gs[0])
    s_gs = gs - origin
    by_end = np.argsort(ge, kind="stable")
    e_ge = ge[by_end] - origin
    length_before = np.concatenate([[0], np.cumsum(e_ge - s_gs[by_end])])  # closed gaps' lengths, by end
    gs_closed = np.concatenate([[0], np.cumsum(s_gs[by_end])])  # closed gaps' starts, by end
    gs_started = np.concatenate([[0], np.cumsum(s_gs)])  # started gaps' starts, by start

    def before(t):
        t = np.clip(t - origin, -1, int(e_ge[-1]) + 1)  # nothing changes outside the chunk's span
        closed = np.searchsorted(e_ge, t, side="right")
        started = np.searchsorted(s_gs, t, side="left")
        open_ = started - closed
        return length_before[closed] + open_ * t - (gs_started[started] - gs_closed[closed])

    return before(end) - before(start)


def enclosing_steps(ranges: pd.DataFrame, steps) -> np.ndarray:
    """Per range: whether it encloses a whole step range on its thread (the step ranges themselves included)."""
    if not len(ranges) or not len(steps):
        return np.zeros(len(ranges), dtype=bool)
    r = pd.DataFrame({"start": ranges["start"].to_numpy(np.int64), "end_r": ranges["end"].to_numpy(np.int64),
                      "tid": ranges["tid"].to_numpy(np.int64), "row": np.arange(len(ranges))}).sort_values("start")
    st = pd.DataFrame({"start": np.asarray(steps.start, dtype=np.int64), "end_s": np.asarray(steps.end, np.int64),
                       "tid": np.asarray(steps.tid, dtype=np.int64)}).sort_values("start")
    # the first step on the same thread that starts at or after the range: the range encloses it if it ends later
    m = pd.merge_asof(r, st, on="start", by="tid", direction="forward")
    out = np.zeros(len(ranges), dtype=bool)
    hit = m["end_s"].notna().to_numpy() & (m["end_s"].to_numpy(np.float64) <= m["end_r"].to_numpy(np.float64))
    out[m["row"].to_numpy()] = hit
    return out


def leaf_ranges(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: no other range of its thread starts inside it (the innermost of nested push/pop ranges)."""
    tid = ranges["tid"].to_numpy(np.int64)
    start = ranges["start"].to_numpy(np.int64)
    end = ranges["end"].to_numpy(np.int64)
    order = np.lexsort((start, tid))
    leaf = np.ones(len(order), dtype=bool)
    same = tid[order][1:] == tid[order][:-1]
    leaf[:-1] = ~(same & (start[order][1:] < end[order][:-1]))
    out = np.empty(len(order), dtype=bool)
    out[order] = leaf
    return out


class _Sorted:
    """Intervals sorted by start, with the running maximum of their ends: the ones that can overlap a time range
    are one slice (those that start before its end, from the first whose running end passes its start)."""

    def __init__(self, start: np.ndarray, end: np.ndarray):
        start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
        if len(start) < 2 or bool((start[1:] >= start[:-1]).all()):  # in start order already: no copies
            self.order = None
            self.start, self.end = start, end
        else:
            self.order = np.argsort(start, kind="stable")
            self.start, self.end = start[self.order], end[self.order]
        self.reach = np.maximum.accumulate(self.end) if len(self.end) else self.end

    def original(self, at: slice) -> np.ndarray:
        """The given positions of the sorted intervals `at`."""
        return np.arange(at.start, at.stop) if self.order is None else self.order[at]

    def sorted(self, values: np.ndarray) -> np.ndarray:
        """Per-interval values in the sorted order."""
        return values if self.order is None else values[self.order]

    def around(self, lo: int, hi: int) -> slice:
        return slice(int(np.searchsorted(self.reach, lo, side="right")), int(np.searchsorted(self.start, hi)))


class HostCalls:
    """A capture's host activity: its CUDA API calls (those of any time range, in start order: trace/calls.py), and
    its innermost NVTX ranges that enclose no step, sorted once (host_activity's figures); `tally()` sums what
    overlaps one device's idle gaps, a set of gaps at a time."""

    def __init__(self, api, ranges: pd.DataFrame | None, steps):
        """`api`: the reader's host_calls() (trace/calls.py: the calls of any time range, in start order)."""
        self.api = api if len(api) else None
        self.ranges, self.short = None, None
        if ranges is not None and len(ranges):
            # innermost ranges only (a parent says less than its children), and none around a whole step
            self.short = np.flatnonzero(leaf_ranges(ranges) & ~enclosing_steps(ranges, steps))
            self.texts = ranges["text"].to_numpy()[self.short]
            self.ranges = _Sorted(ranges["start"].to_numpy(np.int64)[self.short],
                                  ranges["end"].to_numpy(np.int64)[self.short])

    def tally(self) -> "HostTally":
        return HostTally(self)


class HostTally:
    """The idle time and what overlapped it, summed over the sets of gaps added (exact integers in ns)."""

    def __init__(self, calls: HostCalls):
        self.calls = calls
        self.idle_ns = 0
        self.kind_ns = np.zeros(len(KINDS), dtype=np.int64)
        self.range_ns = np.zeros(len(calls.short) if calls.short is not None else 0, dtype=np.int64)

    def add(self, gs: np.ndarray, ge: np.ndarray) -> "HostTally":
        if not len(gs):
            return self
        self.idle_ns += int((ge - gs).sum())
        lo, hi = int(gs.min()), int(ge.max())
        c = self.calls
        if c.api is not None:  # the calls of the gaps' time, in start order: the ones that can overlap them
            near = c.api.between(lo, hi)
            calls = _Sorted(near["start"], near["end"])
            at = calls.around(lo, hi)
            ov = overlap_ns(gs, ge, calls.start[at], calls.end[at])
            kind = near["kind"][at]
            for k in range(len(KINDS)):
                self.kind_ns[k] += int(ov[kind == k].sum())
        if c.ranges is not None:
            at = c.ranges.around(lo, hi)
            ov = overlap_ns(gs, ge, c.ranges.start[at], c.ranges.end[at])
            np.add.at(self.range_ns, c.ranges.original(at), ov)
        return self

    def result(self, n_steps: int) -> dict:
        """{"idle_ms_per_step", "api": [{kind, ms_per_step}], "nvtx": [{text, ms_per_step}]}: the top host
        activities during the idle gaps, per step."""
        n = max(n_steps, 1)
        out = {"idle_ms_per_step": float(self.idle_ns) / n / NS_PER_MS, "api": [], "nvtx": []}
        c = self.calls
        if c.api is not None:
            for k, name in enumerate(KINDS):
                ms = float(self.kind_ns[k]) / n / NS_PER_MS
                if ms > 0:
                    out["api"].append({"kind": name, "ms_per_step": ms})
            out["api"].sort(key=lambda r: -r["ms_per_step"])
        if c.ranges is not None:
            frame = pd.DataFrame({"text": c.texts, "ns": self.range_ns.astype(np.float64)})
            frame = frame[frame["ns"] > 0]
            top = frame.groupby("text", sort=False)["ns"].sum().sort_values(ascending=False).head(TOP)
            out["nvtx"] = [{"text": clean(str(t)), "ms_per_step": float(v) / n / NS_PER_MS} for t, v in top.items()]
        return out


def host_activity(gs, ge, api, ranges: pd.DataFrame | None, steps, n_steps: int) -> dict:
    """HostTally.result of the gaps [gs, ge) all at once (`api`: a trace/calls.py ApiCalls)."""
    return HostCalls(api, ranges, steps).tally().add(gs, ge).result(n_steps)


def in_gaps(gs: np.ndarray, ge: np.ndarray, gap_tid: np.ndarray, tid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per sample (tid, t): it lies inside a gap [gs, ge) of the disjoint sorted gaps, on that gap's thread
    (`gap_tid` None: on any thread)."""
    if len(gs) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(gs, t, side="right") - 1
    j = np.clip(i, 0, None)
    inside = (i >= 0) & (t < ge[j])
    return inside if gap_tid is None else inside & (tid == gap_tid[j])


def sample_period(tid: np.ndarray, t: np.ndarray) -> float | None:
    """The sampling period (ns) estimated from the samples: the median spacing of a thread's consecutive samples
    (a busy thread is sampled once a period); None with fewer than two on one thread."""
    order = np.lexsort((t, tid))
    same = tid[order][1:] == tid[order][:-1]
    spacing = np.diff(t[order])[same]
    spacing = spacing[spacing > 0]
    return float(np.median(spacing)) if len(spacing) else None


def split_frame(symbol: str, module: str) -> tuple:
    """(function, file name) of a frame: a perf-map name 'py::function:file' split, else the symbol and the last
    part of the module's path."""
    if symbol.startswith("py::"):
        name, _, source = symbol[4:].rpartition(":")
        if name:
            symbol, module = name, source
    return symbol, os.path.basename(module.rstrip("/")) or module


def sample_summary(gs, ge, gap_tid, samples: dict | None, names: dict, n_steps: int,
                   period_ns: float | None = None) -> dict | None:
    """samples_in_gaps of the gaps [gs, ge) (disjoint, sorted), each on its thread `gap_tid`."""
    if samples is None or not len(samples["tid"]):
        return None
    inside = in_gaps(gs, ge, gap_tid, samples["tid"], samples["start"])
    return samples_in_gaps(inside, set(unique(gap_tid).tolist()), samples, names, n_steps, period_ns,
                           int((ge - gs).sum()))


def samples_in_gaps(inside: np.ndarray, gap_threads: set, samples: dict | None, names: dict, n_steps: int,
                    period_ns: float | None, idle_ns: int) -> dict | None:
    """{"samples_per_step", "period_ms", "share_of_idle", "functions": [{function, module, python, samples_per_step,
    share_of_idle}]}: the samples inside the gaps (`inside`, per sample: in a gap, on that gap's thread), the top
    functions first; None without samples. `names`: StringIds id -> text; `period_ns`: the capture's sampling
    period (else estimated from the samples of `gap_threads`); `idle_ns`: the gaps' total time."""
    if samples is None or not len(samples["tid"]):
        return None
    n = max(n_steps, 1)
    if period_ns is None:
        threads = np.isin(samples["tid"], np.array(sorted(gap_threads), dtype=np.int64))
        period_ns = sample_period(samples["tid"][threads], samples["start"][threads])
    idle = float(idle_ns)

    def share(count):
        return count * period_ns / idle if period_ns and idle > 0 else None

    out = {"samples_per_step": float(inside.sum()) / n, "period_ms": period_ns / NS_PER_MS if period_ns else None,
           "share_of_idle": share(float(inside.sum())), "functions": []}
    if not inside.any():
        return out
    keys = np.stack([samples[k][inside] for k in ("leaf_symbol", "leaf_module", "py_symbol", "py_module")])
    uniq, counts = np.unique(keys, axis=1, return_counts=True)
    for k in np.argsort(-counts, kind="stable")[:TOP]:
        symbol, module, py_symbol, py_module = (int(v) for v in uniq[:, k])
        function, file = split_frame(clean(names.get(symbol, "[unknown]")), clean(names.get(module, "")))
        python = None
        if py_symbol >= 0:
            py_function, py_file = split_frame(clean(names.get(py_symbol, "")), clean(names.get(py_module, "")))
            python = f"{py_function} ({py_file})" if py_file else py_function
        out["functions"].append({"function": function, "module": file, "python": python,
                                 "samples_per_step": float(counts[k]) / n, "share_of_idle": share(float(counts[k]))})
    return out


MODULE = re.compile(r"'Module': '([^']+)'")  # SGLang's layerwise markers: a dict of the module, params and inputs


def label(text: str, width: int = 60) -> str:
    """A short name for an NVTX range: the module of a layerwise marker, else the text cut to `width`."""
    m = MODULE.search(text)
    text = m.group(1) if m else text
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(h: dict) -> str:
    """One line: the host activities that overlapped most of the idle time (raw text)."""
    idle = h.get("idle_ms_per_step") or 0.0
    parts = [f"{r['kind']} {r['ms_per_step']:.3f} ms" for r in h.get("api", [])[:3]]
    parts += [f"NVTX {label(r['text'])!r} {r['ms_per_step']:.3f} ms" for r in h.get("nvtx", [])[:3]]
    if not parts or idle <= 0:
        return ""
    return f"while the GPU idled ({idle:.3f} ms/step) the host ran: " + ", ".join(parts)
