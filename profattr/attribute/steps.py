"""Decode steps: which CPU-side interval, on which thread, is one step, and which GPU work belongs to it.

Sources (`--steps`):
- `nvtx:NAME` (or `nvtx:NAME@DOMAIN`): every NVTX range with that text is a step.
- `graph`: every cudaGraphLaunch on a thread opens a step that lasts until that thread's next graph launch, so the
  non-graph kernels launched between replays (sampling, metadata) belong to the step they follow.
- `whole`: the capture is one step.
- `auto`: a repeating NVTX range that encloses most kernel launches (the outermost, e.g. `decode_step`), else graph
  launches, else whole. `Steps.reason` says why.
GPU work belongs to a step through its launch call: the call starts inside the step's interval on the step's thread.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from profattr.attribute.nvtx import Ranges, enclosed, innermost
from profattr.errors import ProfattrError
from profattr.trace.reader import RUNTIME, Export, load_query

STEP_NAME_HINT = re.compile(r"decode|step|forward|iteration|iter\b|batch", re.IGNORECASE)
MIN_COVERAGE = 0.5  # an auto NVTX step candidate must enclose at least this share of launched GPU work


@dataclass
class Steps:
    source: str  # "nvtx:NAME", "graph", "whole"
    tid: np.ndarray  # launching thread of each step (-1 for whole)
    start: np.ndarray
    end: np.ndarray
    reason: str = ""

    def __len__(self) -> int:
        return len(self.start)

    def assign(self, launch_tid: np.ndarray, launch_ns: np.ndarray) -> np.ndarray:
        """Step index per GPU op (-1 when its launch lies in no step)."""
        if self.source == "whole":
            return np.zeros(len(launch_ns), dtype=np.int64)
        return innermost(self.tid, self.start, self.end, launch_tid, launch_ns)


def graph_steps(export: Export) -> Steps | None:
    """Steps from cudaGraphLaunch calls; None when there are fewer than two."""
    if not export.has(RUNTIME):
        return None
    g = export.arrays(load_query("graph_launches"), ["start", "end", "tid", "correlation"])
    if len(g["start"]) < 2:
        return None
    starts, tids = g["start"], g["tid"]
    ends = np.empty_like(starts)
    same_next = np.zeros(len(starts), dtype=bool)
    same_next[:-1] = tids[1:] == tids[:-1]
    ends[:-1] = starts[1:] - 1
    gaps = (starts[1:] - starts[:-1])[same_next[:-1]]
    typical = int(np.median(gaps)) if len(gaps) else 0
    # a thread's last launch: its step lasts one typical step interval (or until the capture ends)
    last = ~same_next
    ends[last] = starts[last] + typical - 1 if typical > 0 else np.iinfo(np.int64).max
    return Steps("graph", tids, starts, ends, reason=f"{len(starts)} cudaGraphLaunch calls")


def nvtx_steps(ranges: Ranges, name: str) -> Steps:
    sel = ranges.named(name)
    if sel.empty:
        raise ProfattrError(f"no NVTX range named {name!r} in this capture; candidates: "
                            f"{', '.join(candidate_names(ranges)) or 'none (no NVTX ranges recorded)'}")
    sel = sel.sort_values(["tid", "start"])
    return Steps(f"nvtx:{name}", sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy(),
                 reason=f"{len(sel)} NVTX ranges named {name!r}")


def candidate_names(ranges: Ranges, limit: int = 12) -> list:
    """Repeating NVTX range names, most frequent first (what a user could pass as `nvtx:NAME`)."""
    if len(ranges) == 0:
        return []
    counts = ranges.frame["text"].value_counts()
    return [str(n) for n in counts[counts >= 2].index[:limit]]


def auto_steps(export: Export, ranges: Ranges, launch_tid: np.ndarray, launch_ns: np.ndarray) -> Steps:
    """Pick the step source as described in the module docstring."""
    launched = launch_ns >= 0
    n_launched = int(launched.sum())
    best = None
    if len(ranges) and n_launched:
        frame = ranges.frame
        counts = frame["text"].value_counts()
        names = [n for n in counts[counts >= 2].index]
        # look at the step-like names first, then the longest-lasting; 40 candidates are plenty
        by_name = frame.groupby("text")
        total = by_name["end"].sum() - by_name["start"].sum()
        mean_len = total / by_name.size()
        rows_of = by_name.indices
        names.sort(key=lambda n: (not STEP_NAME_HINT.search(str(n)), -int(total[n])))
        sel = slice(None) if n_launched == len(launch_ns) else launched  # views, not copies, when possible
        lt, ln = launch_tid[sel], launch_ns[sel]
        tid, start, end = (frame[c].to_numpy() for c in ("tid", "start", "end"))
        for name in names[:40]:
            if best is not None and best[2] == n_launched and mean_len[name] <= best[0][1]:
                continue  # cannot beat a candidate that already encloses everything and lasts longer
            rows = rows_of[name]
            covered = int(enclosed(tid[rows], start[rows], end[rows], lt, ln).sum())
            key = (covered, float(mean_len[name]))
            if covered >= MIN_COVERAGE * n_launched and (best is None or key > best[0]):
                best = (key, name, covered)
    if best is not None:
        steps = nvtx_steps(ranges, best[1])
        steps.reason = (f"NVTX range {best[1]!r} repeats {len(steps)} times and encloses "
                        f"{100.0 * best[2] / n_launched:.1f}% of launched GPU work")
        return steps
    g = graph_steps(export)
    if g is not None:
        g.reason = f"no repeating NVTX range encloses the GPU work; {g.reason}"
        return g
    return whole_steps("no repeating NVTX range and fewer than two CUDA graph launches")


def whole_steps(reason: str = "requested") -> Steps:
    z = np.zeros(1, dtype=np.int64)
    return Steps("whole", z - 1, z, z + np.iinfo(np.int64).max, reason=reason)


def find_steps(export: Export, spec: str, ranges: Ranges, launch_tid: np.ndarray, launch_ns: np.ndarray) -> Steps:
    """Steps for a `--steps` value: auto | whole | graph | nvtx:NAME."""
    if spec == "auto":
        return auto_steps(export, ranges, launch_tid, launch_ns)
    if spec == "whole":
        return whole_steps()
    if spec == "graph":
        g = graph_steps(export)
        if g is None:
            raise ProfattrError("--steps graph: the capture has fewer than two cudaGraphLaunch calls; "
                                "use --steps auto, whole or nvtx:NAME")
        return g
    if spec.startswith("nvtx:") and len(spec) > 5:
        return nvtx_steps(ranges, spec[5:])
    raise ProfattrError(f"--steps {spec!r}: expected auto, whole, graph or nvtx:NAME")
