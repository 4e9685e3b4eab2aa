"""Decode steps: which CPU-side interval, on which thread, is one step, and which GPU work belongs to it.

Sources (`--steps`):
- `nvtx:NAME` (or `nvtx:NAME@DOMAIN`): every NVTX range (or torch-profiler annotation) with that text is a step;
- `nvtx-re:REGEX`: every range whose text matches REGEX (e.g. `nvtx-re:^step\\[DECODE` for SGLang's decode spans of
  every batch size);
- `graph`: every cudaGraphLaunch on a thread opens a step that lasts until that thread's next graph launch, so the
  non-graph kernels launched between replays (sampling, metadata) belong to the step they follow;
- `whole`: the capture is one step;
- `auto`, in this order: SGLang's decode spans (`step[DECODE bs=N]`, any N), with its prefill spans
  (`step[EXTEND ...]`) left out and counted; torch's `ProfilerStep#N`; a repeating step-like NVTX range that
  encloses most launched work and whose instances are alike (the same number of graph launches, about the same
  number of ops: an instance unlike the others, such as a scheduler iteration that ran a prefill, is left out and
  counted, and a range with many such instances is not a step); CUDA graph launches; else the whole capture.
`Steps.reason` says which and why; `Steps.excluded` counts what was left out.
GPU work belongs to a step through its launch call: the call starts inside the step's interval on the step's thread.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from profattr.attribute.nvtx import Ranges, enclosed, innermost
from profattr.errors import ProfattrError
from profattr.trace.ops import Ops

STEP_NAME_HINT = re.compile(r"decode|step|forward|iteration|iter\b|batch", re.IGNORECASE)
DECODE_SPAN = re.compile(r"^step\[DECODE bs=\d+\]$")  # SGLang's per-forward span (profile_utils.build_step_span_name)
PREFILL_SPAN = re.compile(r"^step\[(EXTEND|PREFILL|MIXED|SPLIT_PREFILL|IDLE|TARGET_VERIFY|DRAFT_EXTEND)\b")
PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")  # torch.profiler's schedule steps
MIN_COVERAGE = 0.5  # an auto NVTX step candidate must enclose at least this share of launched GPU work
MAX_ODD_SHARE = 0.25  # a candidate with more instances unlike the others than this is not a step
OPS_TOLERANCE = 0.1  # an instance is "alike" when its op count is within 10% of the most common count
MAX_CANDIDATES = 40


@dataclass
class Steps:
    source: str  # "nvtx:NAME", "nvtx-re:REGEX", "graph", "whole"
    tid: np.ndarray  # launching thread of each step (-1 for whole)
    start: np.ndarray
    end: np.ndarray
    reason: str = ""
    excluded: dict = field(default_factory=dict)  # what was left out: {"what": count}

    def __len__(self) -> int:
        return len(self.start)

    def assign(self, launch_tid: np.ndarray, launch_ns: np.ndarray, launched: np.ndarray | None = None) -> np.ndarray:
        """Step index per GPU op (-1 when its launch lies in no step, or was not recorded)."""
        if self.source == "whole":
            return np.zeros(len(launch_ns), dtype=np.int64)
        out = innermost(self.tid, self.start, self.end, launch_tid, launch_ns)
        if launched is not None:
            out[~launched] = -1
        return out

    def keep(self, mask: np.ndarray, what: str) -> "Steps":
        """These steps without the ones where `mask` is False (counted in `excluded` under `what`)."""
        dropped = int((~mask).sum())
        excluded = dict(self.excluded)
        if dropped:
            excluded[what] = excluded.get(what, 0) + dropped
        return Steps(self.source, self.tid[mask], self.start[mask], self.end[mask], self.reason, excluded)


def _from_frame(sel, source: str, reason: str) -> Steps:
    sel = sel.sort_values(["tid", "start"])
    return Steps(source, sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy(), reason=reason)


def graph_steps(source) -> Steps | None:
    """Steps from cudaGraphLaunch calls; None when there are fewer than two."""
    g = source.graph_launches()
    if g is None or len(g["start"]) < 2:
        return None
    order = np.lexsort((g["start"], g["tid"]))
    starts, tids = g["start"][order], g["tid"][order]
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
    return _from_frame(sel, f"nvtx:{name}", f"{len(sel)} NVTX ranges named {name!r}")


def regex_steps(ranges: Ranges, pattern: str) -> Steps:
    from profattr.regexguard import compile_user

    text, _, domain = pattern.partition("@")
    regex = compile_user(text, f"--steps nvtx-re:{pattern}")
    sel = ranges.matching(regex, domain) if len(ranges) else ranges.frame
    if sel.empty:
        raise ProfattrError(f"no NVTX range matches {pattern!r} in this capture; candidates: "
                            f"{', '.join(candidate_names(ranges)) or 'none (no NVTX ranges recorded)'}")
    return _from_frame(sel, f"nvtx-re:{pattern}", f"{len(sel)} NVTX ranges matching {pattern!r}")


def candidate_names(ranges: Ranges, limit: int = 12) -> list:
    """Repeating NVTX range names, most frequent first (what a user could pass as `nvtx:NAME`)."""
    if len(ranges) == 0:
        return []
    counts = ranges.frame["text"].value_counts()
    return [str(n) for n in counts[counts >= 2].index[:limit]]


def _matching(ranges: Ranges, pattern: re.Pattern):
    frame = ranges.frame
    if not len(frame):
        return frame
    texts = frame["text"].astype(str)
    return frame[texts.str.match(pattern.pattern)]


def _span_steps(ranges: Ranges, ops) -> Steps | None:
    """SGLang's decode spans, or torch's ProfilerStep ranges, that hold launched work; None when there are none."""
    decode = _matching(ranges, DECODE_SPAN)
    if len(decode) >= 2:
        steps = _from_frame(decode, "nvtx-re:" + DECODE_SPAN.pattern,
                            f"SGLang's decode spans step[DECODE bs=N]: {len(decode)} of them")
        prefill = _matching(ranges, PREFILL_SPAN)
        if len(prefill):
            steps.excluded["prefill or other non-decode spans (step[EXTEND ...] etc.)"] = len(prefill)
            steps.reason += f"; {len(prefill)} prefill/extend span(s) left out"
        return steps
    prof = _matching(ranges, PROFILER_STEP)
    if len(prof) >= 2:
        return _from_frame(prof, "nvtx-re:" + PROFILER_STEP.pattern,
                           f"torch profiler steps ProfilerStep#N: {len(prof)} of them")
    return None


def _alike(counts: np.ndarray, graph_launch_step: np.ndarray | None, n: int) -> np.ndarray:
    """Per instance (of n, with `counts` ops each): is it like the others (graph launches and op count)?"""
    ok = counts > 0
    if ok.any():
        values, freq = np.unique(counts[ok], return_counts=True)
        mode = values[np.argmax(freq)]
        ok &= np.abs(counts - mode) <= OPS_TOLERANCE * mode
    if graph_launch_step is not None:
        per = np.bincount(graph_launch_step[graph_launch_step >= 0], minlength=n)
        if per.any():
            values, freq = np.unique(per, return_counts=True)
            ok &= per == values[np.argmax(freq)]
    return ok


def launch_windows(ops):
    """(launch_tid, launch_ns, launched) per window of ops: one window for in-memory Ops, several for an op store
    (trace/store.py), so that choosing steps never needs every op in memory at once."""
    if isinstance(ops, Ops):
        return [(ops.launch_tid, ops.launch_ns, ops.launched)]
    return ops.launch_windows()


def _launched_points(tid, t_ns, launched):
    if launched.all():
        return tid, t_ns  # views, not copies, when possible
    return tid[launched], t_ns[launched]


def auto_steps(source, ranges: Ranges, ops) -> Steps:
    """Pick the step source as described in the module docstring. `ops`: Ops, or an op store (launch_windows)."""
    spans = _span_steps(ranges, ops)
    if spans is not None:
        return spans
    n_launched = sum(int(launched.sum()) for _, _, launched in launch_windows(ops))
    graphs = source.graph_launches()
    best = None
    if len(ranges) and n_launched:
        frame = ranges.frame
        counts = frame["text"].value_counts()
        names = [n for n in counts[counts >= 2].index]
        by_name = frame.groupby("text")
        total = by_name["end"].sum() - by_name["start"].sum()
        mean_len = total / by_name.size()
        rows_of = by_name.indices
        # look at the step-like names first, then the longest-lasting
        names.sort(key=lambda n: (not STEP_NAME_HINT.search(str(n)), -int(total[n])))
        names = names[:MAX_CANDIDATES]
        tid, start, end = (frame[c].to_numpy() for c in ("tid", "start", "end"))
        covered_by = dict.fromkeys(names, 0)
        # coverage of every candidate, window by window (one pass over the ops); the choice below is the same as
        # testing the candidates one after the other
        for lt, ln, launched in launch_windows(ops):
            lt, ln = _launched_points(lt, ln, launched)
            for name in names:
                rows = rows_of[name]
                covered_by[name] += int(enclosed(tid[rows], start[rows], end[rows], lt, ln).sum())
        for name in names:
            if best is not None and best[2] == n_launched and mean_len[name] <= best[0][1]:
                continue  # cannot beat a candidate that already encloses everything and lasts longer
            covered = covered_by[name]
            key = (covered, float(mean_len[name]))
            if covered >= MIN_COVERAGE * n_launched and (best is None or key > best[0]):
                best = (key, name, covered)
    if best is not None:
        steps = nvtx_steps(ranges, best[1])
        per_instance = np.zeros(len(steps), dtype=np.int64)
        for lt, ln, launched in launch_windows(ops):
            index = steps.assign(lt, ln, launched)
            per_instance += np.bincount(index[index >= 0], minlength=len(steps))
        gl = steps.assign(graphs["tid"], graphs["start"]) if graphs is not None and len(graphs["start"]) else None
        ok = _alike(per_instance, gl, len(steps))
        odd = int((~ok).sum())
        if odd <= MAX_ODD_SHARE * len(steps) and ok.any():
            covered = 100.0 * best[2] / n_launched
            steps = steps.keep(ok, f"{best[1]!r} instances unlike the others (prefill or other work)")
            steps.reason = (f"NVTX range {best[1]!r} repeats {len(steps) + odd} times and encloses {covered:.1f}% "
                            "of launched GPU work" + (f"; {odd} instance(s) unlike the others (another number of "
                                                      "ops or graph launches: prefill or other work) left out"
                                                      if odd else ""))
            return steps
        rejected = f"NVTX range {best[1]!r}: {odd} of {len(steps)} instances unlike the others (not decode steps)"
    else:
        rejected = "no repeating NVTX range encloses the GPU work"
    g = graph_steps(source)
    if g is not None:
        g.reason = f"{rejected}; {g.reason}"
        return g
    return whole_steps(f"{rejected}, and fewer than two CUDA graph launches")


def whole_steps(reason: str = "requested") -> Steps:
    z = np.zeros(1, dtype=np.int64)
    return Steps("whole", z - 1, z, z + np.iinfo(np.int64).max, reason=reason)


def find_steps(source, spec: str, ranges: Ranges, ops) -> Steps:
    """Steps for a `--steps` value: auto | whole | graph | nvtx:NAME | nvtx-re:REGEX."""
    if spec == "auto":
        return auto_steps(source, ranges, ops)
    if spec == "whole":
        return whole_steps()
    if spec == "graph":
        g = graph_steps(source)
        if g is None:
            raise ProfattrError("--steps graph: the capture has fewer than two cudaGraphLaunch calls; "
                                "use --steps auto, whole or nvtx:NAME")
        return g
    if spec.startswith("nvtx-re:") and len(spec) > 8:
        return regex_steps(ranges, spec[8:])
    if spec.startswith("nvtx:") and len(spec) > 5:
        return nvtx_steps(ranges, spec[5:])
    raise ProfattrError(f"--steps {spec!r}: expected auto, whole, graph, nvtx:NAME or nvtx-re:REGEX")
