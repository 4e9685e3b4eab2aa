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
from profattr.attribute.nvtx import innermost
from profattr.regexguard import MAX_MATCH_CHARS
from profattr.text import clean

NS_PER_MS = 1e6
MAX_MASK_BITS = 62
_MODULE = re.compile(r"""['"]Module['"]\s*:\s*['"]([^'"]+)['"]""")
_DIGITS = re.compile(r"\.\d+(?=\.|$)")
TORCH_OPS_ABSENT = "absent: the trace records no cpu_op events; name rules and NVTX ranges decide"
TORCH_OPS_NOT_TORCH = "not a torch trace"


def torch_ops_frame(export):
    """The reader's torch operators (start, end, tid, text), or None when it has none."""
    getter = getattr(export, "torch_ops", None)
    frame = getter() if getter is not None else None
    return frame if frame is not None and len(frame) else None


def launch_ops(export, ops) -> np.ndarray:
    """Per op, the text of the innermost torch operator around its launch call ('' where none)."""
    frame = torch_ops_frame(export)
    out = np.full(len(ops), "", dtype=object)
    if frame is None or not len(ops):
        return out
    found = ops.launched & (ops.launch_tid >= 0)
    idx = np.flatnonzero(found)
    if len(idx):
        which = innermost(frame["tid"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy(),
                          ops.launch_tid[idx], ops.launch_ns[idx])
        texts = frame["text"].to_numpy()
        hit = which >= 0
        out[idx[hit]] = texts[which[hit]]
    return out


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


def module_path(text: str) -> str:
    """An NVTX range text as a module path with layer numbers folded (model.layers.N.mlp.experts)."""
    found = _MODULE.search(text or "")
    path = found.group(1) if found else (text or "")
    return _DIGITS.sub(".N", path)


def evidence_report(export, att, steps_per_device: dict, limit: int = 50) -> dict:
    """Per device: {'evidence': {...}, 'unknowns': [...], 'conflicts': [...]} (see module docstring)."""
    ops, combos = att.ops, att.combos
    inside = att.step >= 0
    if not len(ops) or "evidence" not in combos:
        return {}
    evidence = combos["evidence"].to_numpy().astype(object)[att.combo]
    if att.status is not None:
        replayed = np.isin(att.status, (STATUS_CREATION, STATUS_MAPPING))
        evidence = np.where(replayed & (evidence == "context:nvtx_module"), "context:graph_capture_nvtx", evidence)
    ns = (ops.end - ops.start).astype(np.int64)
    names = combos["name"].to_numpy().astype(object)[att.combo]
    categories = combos["category"].to_numpy().astype(object)[att.combo]
    conflict = combos["conflict"].to_numpy().astype(object)[att.combo]
    context_id = combos["context"].to_numpy().astype(object)[att.combo]
    rule_id = combos["rule"].to_numpy().astype(object)[att.combo]
    listed = inside & ((evidence == "none") | np.char.startswith(evidence.astype(str), "context:") | (conflict != ""))
    torch_names = launch_ops(export, ops) if listed.any() else np.full(len(ops), "", dtype=object)
    modules = op_modules(att, listed)
    torch_state = TORCH_OPS_NOT_TORCH if getattr(export, "format", "") != "torch" else (
        "present" if torch_ops_frame(export) is not None else TORCH_OPS_ABSENT)
    out = {}
    for device in np.unique(ops.device[inside]):
        sel = inside & (ops.device == device)
        total = float(ns[sel].sum())
        n = steps_per_device.get(int(device), 1) or 1
        shares = {kind: float(ns[sel & (evidence == kind)].sum()) / total if total else 0.0
                  for kind in ("name", "context:torch_op", "context:nvtx_module", "context:graph_capture_nvtx",
                               "none")}
        unknowns, conflicts = [], []
        rows = sel & listed
        keys = Counter()
        for i in np.flatnonzero(rows):
            keys[(names[i], categories[i], evidence[i], rule_id[i], context_id[i], conflict[i])] += int(ns[i])
        for (name, category, ev, rid, cid, conf), key_ns in keys.most_common():
            pick = rows & (names == name) & (evidence == ev) & (conflict == conf)
            row = {"name": clean(name), "category": category, "evidence": ev,
                   "ms_per_step": key_ns / n / NS_PER_MS, "share": key_ns / total if total else 0.0,
                   "context": {"nvtx_module": _most(modules[pick]), "torch_op": _most(torch_names[pick])},
                   "rule": rid or None, "context_rule": cid or None}
            if conf:
                conflicts.append({**row, "contradicted_by": conf})
            else:
                unknowns.append(row)
        out[int(device)] = {
            "evidence": {"shares": shares, "name_share": shares["name"],
                         "context_share": sum(v for k, v in shares.items() if k.startswith("context:")),
                         "none_share": shares["none"], "torch_ops": torch_state},
            "unknowns": unknowns[:limit], "unknowns_total": len(unknowns),
            "conflicts": conflicts[:limit],
        }
    return out


def op_modules(att, listed: np.ndarray) -> np.ndarray:
    """Module path of the innermost NVTX range around each listed op's context point ('' where none)."""
    out = np.full(len(att.ops), "", dtype=object)
    frame = att.ranges.frame if att.ranges is not None else None
    idx = np.flatnonzero(listed & (att.ctx_ns >= 0)) if att.ctx_ns is not None else np.zeros(0, dtype=np.int64)
    if frame is None or not len(frame) or not len(idx):
        return out
    which = innermost(frame["tid"].to_numpy(), frame["start"].to_numpy(), frame["end"].to_numpy(),
                      att.ctx_tid[idx], att.ctx_ns[idx])
    texts = frame["text"].astype(str).to_numpy()
    hit = which >= 0
    out[idx[hit]] = [module_path(t) for t in texts[which[hit]]]
    return out


def _most(values: np.ndarray):
    kept = [v for v in values.tolist() if v]
    return clean(Counter(kept).most_common(1)[0][0]) if kept else None
