"""What the host was doing while the GPU idled inside a step.

The idle intervals of a device are the gaps between its consecutive GPU ops inside each step (the same gaps whose
sum is the budget's idle time: launches.py). Against them, the time of every host activity that overlaps them:
- CUDA API calls that launch, copy or wait (graph launches, kernel launches, memory calls, synchronizations), on
  any CPU thread, from the reader's `api_calls()`;
- NVTX ranges on any thread (annotations such as SGLang's scheduler spans or torch's record_function): the innermost
  ones (no other range of their thread starts inside them), and none that encloses a whole step.
An activity's figure is the idle time it overlaps, per step: two activities on two threads can overlap the same gap,
so the figures do not add up to the idle time; each says how much of the idle that activity was running through.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profattr.text import clean

NS_PER_MS = 1e6
TOP = 5
KINDS = ("graph launches", "kernel launches", "memory calls", "synchronizations")


def idle_intervals(step: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple:
    """(starts, ends) of the idle gaps between consecutive ops of each step, sorted and disjoint."""
    if len(start) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
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
    return gs[order], ge[order]


def overlap_with(gs: np.ndarray, ge: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval [start, end): its overlap (ns) with the union of the disjoint sorted gaps [gs, ge)."""
    if len(gs) == 0 or len(start) == 0:
        return np.zeros(len(start), dtype=np.float64)
    length = (ge - gs).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(length)])

    def covered(t: np.ndarray) -> np.ndarray:  # total gap time before t
        i = np.searchsorted(gs, t, side="right") - 1
        inside = np.clip(t - gs[np.clip(i, 0, None)], 0, length[np.clip(i, 0, None)])
        return np.where(i >= 0, before[np.clip(i, 0, None)] + inside, 0.0)

    return np.clip(covered(end.astype(np.float64)) - covered(start.astype(np.float64)), 0.0, None)


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


def host_activity(gs, ge, api: dict, ranges: pd.DataFrame | None, steps, n_steps: int) -> dict:
    """{"idle_ms_per_step", "api": [{kind, ms_per_step}], "nvtx": [{text, ms_per_step}]}: the top host activities
    during the idle gaps, per step."""
    n = max(n_steps, 1)
    out = {"idle_ms_per_step": float((ge - gs).sum()) / n / NS_PER_MS, "api": [], "nvtx": []}
    if len(api.get("kind", [])):
        ov = overlap_with(gs, ge, api["start"], api["end"])
        for k, name in enumerate(KINDS):
            ms = float(ov[api["kind"] == k].sum()) / n / NS_PER_MS
            if ms > 0:
                out["api"].append({"kind": name, "ms_per_step": ms})
        out["api"].sort(key=lambda r: -r["ms_per_step"])
    if ranges is not None and len(ranges):
        start = ranges["start"].to_numpy(np.int64)
        end = ranges["end"].to_numpy(np.int64)
        # innermost ranges only (a parent says less than its children), and none around a whole step
        short = leaf_ranges(ranges) & ~enclosing_steps(ranges, steps)
        ov = overlap_with(gs, ge, start[short], end[short])
        frame = pd.DataFrame({"text": ranges["text"].to_numpy()[short], "ns": ov})
        frame = frame[frame["ns"] > 0]
        top = frame.groupby("text", sort=False)["ns"].sum().sort_values(ascending=False).head(TOP)
        out["nvtx"] = [{"text": clean(str(t)), "ms_per_step": float(v) / n / NS_PER_MS} for t, v in top.items()]
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
