"""Launch context of GPU ops, and what decided each op's category: the evidence section of a budget.

Two launch contexts feed classification (taxonomy/contexts.py): the NVTX ranges around the launch (or, for a
CUDA-graph replay, around the node's capture), as context bits computed by budget.context_mask, and, in torch
traces, the innermost torch operator (``cpu_op``) around the launch call: ``torch_op_bits`` adds one bit per
torch_op context rule. ``evidence_report`` then says, per device, how much op time came from name rules, from
context, or from nothing, lists every kernel no certain name rule covered (with its time share and its context),
and lists the name rules that a strong context contradicts.
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

from profattr.attribute.graphs import STATUS_CREATION, STATUS_MAPPING
from profattr.attribute.layers import deepest
from profattr.regexguard import MAX_MATCH_CHARS
from profattr.text import clean

NS_PER_MS = 1e6
MAX_MASK_BITS = 62
_MODULE = re.compile(r"""['"]Module['"]\s*:\s*['"]([^'"]+)['"]""")
_DIGITS = re.compile(r"\.\d+(?=\.|$)")
TORCH_OPS_ABSENT = "absent: the trace records no cpu_op events; name rules and NVTX ranges decide"
TORCH_OPS_NOT_TORCH = "not a torch trace"
FRAMES_ABSENT = "absent: the trace records no Python stacks (profile with_stack=True); operators and NVTX decide"


def innermost_nested(range_tid, range_start, range_end, tid, t_ns) -> np.ndarray:
    """Index of the innermost range that holds each point (-1: none), for ranges that nest (torch operators,
    NVTX module ranges): layers.deepest, which walks a finished child's parents up to a range that holds it."""
    return deepest(range_tid, range_start, range_end, tid, t_ns)


def torch_ops_frame(export):
    """The reader's torch operators (start, end, tid, text), or None when it has none."""
    frame = export.torch_ops()
    return frame if frame is not None and len(frame) else None


def launch_ops(export, ops) -> np.ndarray:
    """Per op, the text of the innermost torch operator around its launch call ('' where none, and for the kernels
    of a CUDA-graph replay)."""
    frame = torch_ops_frame(export)
    out = np.full(len(ops), "", dtype=object)
    if frame is None or not len(ops):
        return out
    # a CUDA-graph replay's kernels share one launch call: the operator around it did not launch them one by one
    found = ops.launched & (ops.launch_tid >= 0) & (ops.graph_node < 0)
    idx = np.flatnonzero(found)
    if len(idx):
        which = innermost_nested(frame["tid"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy(),
                                 ops.launch_tid[idx], ops.launch_ns[idx])
        texts = frame["text"].to_numpy()
        hit = which >= 0
        out[idx[hit]] = texts[which[hit]]
    return out


def python_frames_frame(export):
    """The reader's Python frames (start, end, tid, text), or None when it recorded none (no with_stack)."""
    frame = export.python_frames()
    return frame if frame is not None and len(frame) else None


def launch_stack_bits(export, ops, ruleset, n_patterns: int):
    """(keys, mask): the python_frame context keys and, per op, a bit for each whose pattern some frame of the
    launch's Python stack (a python_function event around the launch call, same thread) matches; bits start
    past ``n_patterns``. CUDA-graph replays take none."""
    from profattr.attribute.nvtx import enclosed

    rules = ruleset.python_frame_rules
    mask = np.zeros(len(ops), dtype=np.int64)
    frame = python_frames_frame(export) if rules else None
    if frame is None or not len(ops):
        return [], mask
    rules = rules[:max(0, MAX_MASK_BITS - n_patterns)]
    found = ops.launched & (ops.launch_tid >= 0) & (ops.graph_node < 0)
    idx = np.flatnonzero(found)
    uniq, inverse = np.unique(frame["text"].astype(str).to_numpy(), return_inverse=True)
    for bit, rule in enumerate(rules):
        sel = np.array([bool(rule.regex.search(u[:MAX_MATCH_CHARS])) for u in uniq], dtype=bool)[inverse]
        if sel.any() and len(idx):
            hit = enclosed(frame["tid"].to_numpy()[sel], frame["start"].to_numpy()[sel], frame["end"].to_numpy()[sel],
                           ops.launch_tid[idx], ops.launch_ns[idx])
            mask[idx[hit]] |= np.int64(1) << (n_patterns + bit)
    return [r.key for r in rules], mask


def torch_op_bits(export, ops, ruleset, n_patterns: int):
    """(keys, mask): the torch_op context keys and, per op, their bits shifted past ``n_patterns`` NVTX bits."""
    rules = ruleset.torch_op_rules
    mask = np.zeros(len(ops), dtype=np.int64)
    if not rules or torch_ops_frame(export) is None:
        return [], mask
    if n_patterns + len(rules) > MAX_MASK_BITS:
        rules = rules[:max(0, MAX_MASK_BITS - n_patterns)]
    names = launch_ops(export, ops)
    uniq, inverse = np.unique(names.astype(str), return_inverse=True)
    for bit, rule in enumerate(rules):
        hit = np.array([bool(u) and bool(rule.regex.search(u[:MAX_MATCH_CHARS])) for u in uniq], dtype=bool)
        if hit.any():
            mask |= hit[inverse].astype(np.int64) << (n_patterns + bit)
    return [r.key for r in rules], mask


def warn_unmatched_contexts(export, ruleset) -> None:
    """A warning for each user context rule whose pattern matches no NVTX range (nvtx_module) or no torch operator
    (torch_op) of the capture: a pattern that never matches decides nothing."""
    from profattr.errors import warn

    user = [c for c in ruleset.context_rules if c.user]
    if not user:
        return
    frames = {"nvtx_module": export.ranges(), "torch_op": torch_ops_frame(export),
              "python_frame": python_frames_frame(export)}
    for c in user:
        frame = frames[c.kind]
        texts = [] if frame is None or not len(frame) else frame["text"].astype(str).unique().tolist()
        if not any(c.regex.search(t[:MAX_MATCH_CHARS]) for t in texts):
            what = {"nvtx_module": "NVTX range", "torch_op": "torch operator (cpu_op event)",
                    "python_frame": "Python frame (python_function event)"}[c.kind]
            warn(f"{c.origin}: context '{c.id}' matches no {what} of {export.path}; it decides nothing here "
                 "(check its pattern)")


def module_path(text: str) -> str:
    """An NVTX range text as a module path with layer numbers folded (model.layers.N.mlp.experts)."""
    found = _MODULE.search(text or "")
    path = found.group(1) if found else (text or "")
    return _DIGITS.sub(".N", path)


class ContextTexts:
    """For the ops no certain name rule covers: the NVTX module and torch operator around their launches, per
    combination (the budget's kernel rows), and the op time of CUDA-graph replays placed at their capture.
    Fed window by window (windows.py) or at once (budget.summarize); ``finish`` maps registry ids to rows."""

    def __init__(self, export):
        self.export = export
        self.modules: Counter = Counter()  # (combo id, module path) -> ns
        self.torch: Counter = Counter()  # (combo id, operator) -> ns
        self.replay_ns: Counter = Counter()  # (device, combo id) -> ns of ops placed at their graph capture
        self.torch_state = TORCH_OPS_NOT_TORCH if export.format != "torch" else (
            "present" if torch_ops_frame(export) is not None else TORCH_OPS_ABSENT)
        self.frames_state = TORCH_OPS_NOT_TORCH if export.format != "torch" else (
            "present" if python_frames_frame(export) is not None else FRAMES_ABSENT)

    def add(self, ops, combo_ids, evidence, conflict, ranges, ctx_tid, ctx_ns, status, inside) -> None:
        """One window: ``combo_ids`` per op; ``evidence`` / ``conflict`` per combo id (indexable arrays)."""
        if not len(ops):
            return
        # decided per combination (a few hundred), then looked up per op: not a string test per op
        ev = np.asarray(evidence, dtype=object)
        conf = np.asarray(conflict, dtype=object)
        by_module = ev == "context:nvtx_module"
        unsure = (ev == "none") | np.array([str(e).startswith("context:") for e in ev], dtype=bool) | (conf != "")
        ns = (ops.end - ops.start).astype(np.int64)
        if status is not None:
            replayed = inside & np.isin(status, (STATUS_CREATION, STATUS_MAPPING)) & by_module[combo_ids]
            for (device, cid), v in _sums(ops.device[replayed], combo_ids[replayed], ns[replayed]).items():
                self.replay_ns[(device, cid)] += v
        listed = inside & unsure[combo_ids]
        idx = np.flatnonzero(listed)
        if not len(idx):
            return
        modules = _innermost_text(ranges.frame if ranges is not None else None, ctx_tid[idx], ctx_ns[idx])
        for cid, text, v in zip(combo_ids[idx], modules, ns[idx]):
            if text:
                self.modules[(int(cid), module_path(text))] += int(v)
        if self.torch_state == "present":
            names = launch_ops(self.export, ops)[idx]
            for cid, text, v in zip(combo_ids[idx], names, ns[idx]):
                if text:
                    self.torch[(int(cid), text)] += int(v)

    def finish(self, final=None) -> dict:
        """{'texts': {row: {'nvtx_module', 'torch_op'}}, 'replay_ns': {(device, row): ns}, 'torch_ops': state}."""
        remap = (lambda c: int(final[c])) if final is not None else int
        best: dict = {}
        for kind, counter in (("nvtx_module", self.modules), ("torch_op", self.torch)):
            for (cid, text), v in counter.items():
                row = best.setdefault(remap(cid), {"nvtx_module": None, "torch_op": None, "_ns": {}})
                if v > row["_ns"].get(kind, -1):
                    row[kind], row["_ns"][kind] = clean(text), v
        texts = {k: {"nvtx_module": v["nvtx_module"], "torch_op": v["torch_op"]} for k, v in best.items()}
        replay = Counter()
        for (device, cid), v in self.replay_ns.items():
            replay[(int(device), remap(cid))] += v
        return {"texts": texts, "replay_ns": dict(replay), "torch_ops": self.torch_state,
                "python_frames": self.frames_state}


def evidence_block(rows, device: int, steps: int, total_ns: float, summary: dict | None, limit: int = 50) -> dict:
    """A device's evidence section from its kernel combinations ``rows`` (combos frame rows with ``combo``, ``ns``):
    time shares by evidence, the kernels no certain name rule covers, and the contradicted name rules."""
    summary = summary or {"texts": {}, "replay_ns": {}, "torch_ops": TORCH_OPS_NOT_TORCH,
                          "python_frames": TORCH_OPS_NOT_TORCH}
    shares = dict.fromkeys(("name", "context:torch_op", "context:python_frame", "context:nvtx_module",
                            "context:graph_capture_nvtx", "none"), 0.0)
    listed: dict = {}
    n = steps or 1
    for r in rows.itertuples():
        ns = float(r.ns)
        replay = float(summary["replay_ns"].get((device, int(r.combo)), 0)) if r.evidence == "context:nvtx_module" else 0.0
        shares[r.evidence if r.evidence in shares else "name"] += ns - replay
        shares["context:graph_capture_nvtx"] += replay
        if r.evidence == "name" and not r.conflict:
            continue
        key = (r.name, r.category, r.evidence, r.rule, r.context, r.conflict)
        entry = listed.setdefault(key, {"ns": 0.0, "context": {"nvtx_module": None, "torch_op": None}, "_best": -1.0})
        entry["ns"] += ns
        if ns > entry["_best"]:
            entry["_best"] = ns
            entry["context"] = summary["texts"].get(int(r.combo), entry["context"])
    total = total_ns or 1.0
    shares = {k: v / total for k, v in shares.items()}
    unknowns, conflicts = [], []
    for (name, category, ev, rid, cid, conf), entry in sorted(listed.items(), key=lambda kv: -kv[1]["ns"]):
        row = {"name": clean(name), "category": category, "evidence": ev, "ms_per_step": entry["ns"] / n / NS_PER_MS,
               "share": entry["ns"] / total, "context": entry["context"], "rule": rid or None,
               "context_rule": cid or None}
        (conflicts if conf else unknowns).append({**row, "contradicted_by": conf} if conf else row)
    return {"evidence": {"shares": shares, "name_share": shares["name"],
                         "context_share": sum(v for k, v in shares.items() if k.startswith("context:")),
                         "none_share": shares["none"], "torch_ops": summary["torch_ops"],
                         "python_frames": summary["python_frames"]},
            "unknowns": unknowns[:limit], "unknowns_total": len(unknowns), "conflicts": conflicts[:limit]}


def _sums(device, cid, ns) -> dict:
    out: Counter = Counter()
    for d, c, v in zip(device.tolist(), cid.tolist(), ns.tolist()):
        out[(d, c)] += v
    return out


def _innermost_text(frame, tid, t_ns) -> np.ndarray:
    out = np.full(len(t_ns), "", dtype=object)
    if frame is None or not len(frame) or not len(t_ns):
        return out
    ok = t_ns >= 0
    which = innermost_nested(frame["tid"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy(), tid[ok],
                             t_ns[ok])
    texts = frame["text"].astype(str).to_numpy()
    sub = np.full(int(ok.sum()), "", dtype=object)
    hit = which >= 0
    sub[hit] = texts[which[hit]]
    out[ok] = sub
    return out


def op_modules(att, listed: np.ndarray) -> np.ndarray:
    """Module path of the innermost NVTX range around each listed op's context point ('' where none)."""
    out = np.full(len(att.ops), "", dtype=object)
    if att.ctx_ns is None:
        return out
    idx = np.flatnonzero(listed)
    texts = _innermost_text(att.ranges.frame if att.ranges is not None else None, att.ctx_tid[idx], att.ctx_ns[idx])
    out[idx] = [module_path(t) if t else "" for t in texts]
    return out
