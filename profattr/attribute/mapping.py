"""Borrow NVTX context from an eager "mapping" capture for replayed graph kernels that have none.

When a CUDA graph was captured before the profiled window opened, its replayed kernels carry no NVTX context
(graphs.py marks them unplaced). An eager capture of the same workload (`--mapping CAPTURE`) launches the same
kernels in the same order, each inside its module's NVTX ranges. Matching is per device and per step:

- steps are taken in time order on each device; step k of the target is matched with step k of the mapping capture
  (cycling when the mapping has fewer steps), or with any mapping step whose op names are identical;
- inside a step, ops are ordered by GPU start (then stream, then end) and paired position by position when the two
  name sequences agree; when they do not, the longest common subsequences of names are paired
  (difflib.SequenceMatcher) and every other target op counts as a name mismatch and stays unmatched.

Names are compared by demangled kernel name (memory ops by their kind), never by StringIds ids, which differ between
captures.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from profattr.trace.ops import Ops, memop_name



@dataclass
class Mapping:
    """Per target op the index of its matched mapping-capture op (-1 when none), and what the matching found."""

    source: np.ndarray  # int64 per target op
    path: str
    steps_matched: int  # (device, step) pairs of the target that found a mapping step
    steps_unmatched: int  # target steps on a device the mapping capture has no steps for
    ops_compared: int  # target ops inside steps
    name_mismatches: int  # target ops inside steps left without a same-named counterpart
    identical_steps: int  # target steps whose name sequence equals the mapping step's exactly

    def to_dict(self) -> dict:
        return {"capture": self.path, "steps_matched": self.steps_matched, "steps_unmatched": self.steps_unmatched,
                "ops_compared": self.ops_compared, "name_mismatches": self.name_mismatches,
                "identical_steps": self.identical_steps}


def op_names(export, ops: Ops) -> np.ndarray:
    """Demangled name per op (object array); memory ops get their display name ("[CUDA memset]" ...)."""
    ids = ops.demangled_id
    uniq, inverse = np.unique(ids, return_inverse=True)
    strings = export.strings([int(i) for i in uniq if i >= 0])
    names = np.array([memop_name(int(i)) if i < 0 else (strings.get(int(i)) or f"<string {i}>") for i in uniq],
                     dtype=object)
    return names[inverse.reshape(-1)]


def steps_by_device(ops: Ops, step: np.ndarray, step_start: np.ndarray) -> dict:
    """device -> list of (step id, op indices in GPU order), steps in time order of their CPU interval."""
    out: dict = {}
    inside = np.flatnonzero(step >= 0)
    if len(inside) == 0:
        return out
    # GPU order inside a step: start, then stream, then end (a stable, capture-independent key)
    order = inside[np.lexsort((ops.end[inside], ops.stream[inside], ops.start[inside], step[inside],
                               ops.device[inside]))]
    dev, stp = ops.device[order], step[order]
    cut = np.flatnonzero((dev[1:] != dev[:-1]) | (stp[1:] != stp[:-1])) + 1
    for chunk in np.split(order, cut):
        d, s = int(ops.device[chunk[0]]), int(step[chunk[0]])
        out.setdefault(d, []).append((s, chunk))
    for d in out:
        out[d].sort(key=lambda item: (int(step_start[item[0]]), item[0]))
    return out


def _pair_devices(target_devices, source_devices) -> dict:
    """Target device -> mapping device: by id when the captures share ids, else by order."""
    source_devices = sorted(source_devices)
    if set(target_devices) & set(source_devices):
        return {d: d for d in target_devices if d in source_devices}
    return dict(zip(sorted(target_devices), source_devices))


def match_ops(target_names: np.ndarray, target_groups: dict, source_names: np.ndarray, source_groups: dict,
              path: str, n_ops: int) -> Mapping:
    """Pair target ops with mapping ops step by step (see the module docstring).

    `*_groups` come from steps_by_device; `*_names` are op_names of each capture; `n_ops` is the target's op count.
    """
    source = np.full(n_ops, -1, dtype=np.int64)
    pairs = _pair_devices(list(target_groups), list(source_groups))
    steps_matched = steps_unmatched = compared = mismatches = identical = 0
    # codes shared by both captures, so that sequences compare as integer tuples
    codes: dict = {}

    def encode(names) -> tuple:
        return tuple(codes.setdefault(n, len(codes)) for n in names)

    for device, t_steps in target_groups.items():
        s_steps = source_groups.get(pairs.get(device, -1), [])
        n_here = sum(len(idx) for _, idx in t_steps)
        compared += n_here
        if not s_steps:
            steps_unmatched += len(t_steps)
            mismatches += n_here
            continue
        s_seqs = [encode(source_names[idx]) for _, idx in s_steps]
        first_with: dict = {}
        for k, seq in enumerate(s_seqs):
            first_with.setdefault(seq, k)
        for k, (_, t_idx) in enumerate(t_steps):
            steps_matched += 1
            t_seq = encode(target_names[t_idx])
            cand = k % len(s_steps)
            if s_seqs[cand] != t_seq and t_seq in first_with:
                cand = first_with[t_seq]
            s_idx, s_seq = s_steps[cand][1], s_seqs[cand]
            if s_seq == t_seq:
                source[t_idx] = s_idx
                identical += 1
                continue
            matcher = difflib.SequenceMatcher(a=t_seq, b=s_seq, autojunk=False)
            paired = 0
            for block in matcher.get_matching_blocks():
                if block.size:
                    source[t_idx[block.a:block.a + block.size]] = s_idx[block.b:block.b + block.size]
                    paired += block.size
            mismatches += len(t_idx) - paired
    return Mapping(source=source, path=path, steps_matched=steps_matched, steps_unmatched=steps_unmatched,
                   ops_compared=compared, name_mismatches=mismatches, identical_steps=identical)
