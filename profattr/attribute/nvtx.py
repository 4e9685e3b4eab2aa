"""NVTX ranges (or torch-profiler annotations) of a capture, and the question "which ranges enclose this CPU time on
this thread?".

This is nsys's NVTX GPU projection: GPU work belongs to the ranges open on the launching thread when the launch
call started (inclusive at both ends, as nsys's SQL reports treat it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profattr.arrays import unique
import pandas as pd



@dataclass
class Ranges:
    """Closed NVTX ranges as a DataFrame with columns start, end, tid, text, domain (name or '')."""

    frame: pd.DataFrame

    def __len__(self) -> int:
        return len(self.frame)

    def named(self, pattern: str) -> pd.DataFrame:
        """Ranges whose text equals `pattern`; `text@domain` selects a domain."""
        frame = self.frame
        text, _, domain = pattern.partition("@")
        if domain:
            frame = frame[frame["domain"] == domain]
        return frame[frame["text"] == text]

    def matching(self, regex, domain: str = "") -> pd.DataFrame:
        """Ranges (of `domain` when given) whose text `regex` (compiled: regexguard) finds a match in."""
        from profattr.regexguard import search_mask

        frame = self.frame[self.frame["domain"] == domain] if domain else self.frame
        return frame[search_mask(frame["text"], regex)] if len(frame) else frame


def load_ranges(source) -> Ranges:
    """All closed ranges of the capture's reader (empty frame when it has none)."""
    return Ranges(source.ranges())


def distinct_points(tid: np.ndarray, t_ns: np.ndarray):
    """(tid, t_ns) of the distinct points among the given ones, and each given point's index into them: the replays
    of one CUDA graph share their nodes' capture-time points, so a question asked of every point (enclosed,
    innermost) is asked once per distinct point and spread with the index."""
    if len(t_ns) == 0:
        return tid, t_ns, np.zeros(0, dtype=np.int64)
    t_codes, t_uniq = pd.factorize(t_ns)
    d_codes, d_uniq = pd.factorize(tid)
    width = len(d_uniq)
    index, keys = pd.factorize(t_codes.astype(np.int64) * width + d_codes)
    return np.asarray(d_uniq)[keys % width], np.asarray(t_uniq)[keys // width], index.astype(np.int64)


def enclosed(range_tid: np.ndarray, range_start: np.ndarray, range_end: np.ndarray,
             tid: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Boolean per query point: is (tid, t_ns) inside at least one of the given ranges of the same thread?

    Ranges may nest or overlap: per thread, sort by start and keep the running maximum of the ends; a point is
    covered when the running maximum end of all ranges starting at or before it reaches it.
    """
    out = np.zeros(len(t_ns), dtype=bool)
    if len(range_start) == 0 or len(t_ns) == 0:
        return out
    for thread in unique(range_tid):
        sel = range_tid == thread
        order = np.argsort(range_start[sel], kind="stable")
        starts = range_start[sel][order]
        max_end = np.maximum.accumulate(range_end[sel][order])
        q = np.flatnonzero(tid == thread)
        if len(q) == 0:
            continue
        pos = np.searchsorted(starts, t_ns[q], side="right") - 1
        ok = pos >= 0
        covered = np.zeros(len(q), dtype=bool)
        covered[ok] = max_end[pos[ok]] >= t_ns[q][ok]
        out[q] = covered
    return out


def innermost(range_tid: np.ndarray, range_start: np.ndarray, range_end: np.ndarray,
              tid: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Index (into the given ranges) of the range that holds each point, -1 when none.

    For ranges that do not overlap each other on a thread (decode steps, layers), this is the one range that
    contains the point; where they nest, the latest-starting range that still contains it.
    """
    out = np.full(len(t_ns), -1, dtype=np.int64)
    if len(range_start) == 0 or len(t_ns) == 0:
        return out
    for thread in unique(range_tid):
        idx = np.flatnonzero(range_tid == thread)
        idx = idx[np.argsort(range_start[idx], kind="stable")]
        starts, ends = range_start[idx], range_end[idx]
        q = np.flatnonzero(tid == thread)
        if len(q) == 0:
            continue
        pos = np.searchsorted(starts, t_ns[q], side="right") - 1
        ok = pos >= 0
        hit = np.zeros(len(q), dtype=bool)
        hit[ok] = ends[pos[ok]] >= t_ns[q][ok]
        res = np.full(len(q), -1, dtype=np.int64)
        res[hit] = idx[pos[hit]]
        out[q] = res
    return out
