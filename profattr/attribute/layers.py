"""Per-layer budget: which model layer each GPU op belongs to, read from NVTX at the op's context point.

A layer range is an NVTX range whose text matches the layer pattern (`--layer-range REGEX`). The default pattern
finds `layers.N`, `layers_N`, `layer_N` and `layer.N` anywhere in the text, which covers module paths
(`model.layers.3`, `decoder.layer_12`) and SGLang's layerwise markers, whose text is a dict naming the module path
(`{'Module': 'model.model.layers.3.mlp.experts', ...}`: sglang python/sglang/srt/utils/nvtx_pytorch_hooks.py).
The layer label is the pattern's group `layer` when it has one, else its first group, else the whole range text.

The point at which an op's layer is read is the same point at which the taxonomy's NVTX-context rules are read
(graphs.py): the launch call for eager ops, the node creation at capture time for replayed graph nodes, and the
matched eager op's launch for ops placed through a mapping capture. An op belongs to the outermost layer range open
at that point on that thread: the layer module's own range, not a sub-module's. Sub-module ranges can name another
layer: SGLang names a module shared by all layers (one rotary embedding) by the first path it was found under
(`layers.0.self_attn.rotary_emb`), and it runs inside every layer. Ops in no layer range form the "outside layers"
row (`layer: null`).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.attribute.graphs import STATUS_MAPPING

DEFAULT_LAYER_PATTERN = r"(?<![A-Za-z0-9])layers?[._](?P<layer>\d+)(?!\d)"
NS_PER_MS = 1e6


def compile_layer_pattern(pattern: str | None):
    """The layer regex: the default (Python re: it uses lookaround) when None, else the user's on RE2
    (regexguard.py); a bad regex is the user's error."""
    if pattern is None:
        return re.compile(DEFAULT_LAYER_PATTERN)
    from profattr.regexguard import compile_user

    return compile_user(pattern, "--layer-range")


def _label(match: "re.Match[str]", text: str):
    """Layer label of a matching range text: an int when the captured label is all digits."""
    groups = match.re.groupindex
    if "layer" in groups:
        value = match.group("layer")
    elif match.re.groups:
        value = match.group(1)
    else:
        value = text
    if value is None:
        value = text
    return int(value) if value.isdigit() else value


def layer_label(text: str, regex: "re.Pattern[str]"):
    """Layer label of an NVTX range text under `regex` (see the module docstring), None when it does not match."""
    from profattr.regexguard import capped

    m = regex.search(capped(text)) if isinstance(text, str) else None
    return None if m is None else _label(m, text)


def deepest(range_tid: np.ndarray, range_start: np.ndarray, range_end: np.ndarray,
            tid: np.ndarray, t_ns: np.ndarray, outermost: bool = False) -> np.ndarray:
    """Index of the innermost range that contains each point (same thread, inclusive ends), -1 when none; with
    `outermost`, the outermost one instead (walk the parent links to the top).

    NVTX push/pop ranges nest properly on a thread. The last range starting at or before a point either contains it
    or has already ended; in the second case the answer is among its enclosing ranges, so walk up parent links
    (parents found once with a stack) until a range contains the point. Nesting depth bounds the walk.
    """
    out = np.full(len(t_ns), -1, dtype=np.int64)
    if len(range_start) == 0 or len(t_ns) == 0:
        return out
    for thread in unique(range_tid):
        idx = np.flatnonzero(range_tid == thread)
        idx = idx[np.lexsort((-range_end[idx], range_start[idx]))]  # outer before inner at equal starts
        starts, ends = range_start[idx], range_end[idx]
        parent = np.full(len(idx), -1, dtype=np.int64)
        stack: list = []
        for i in range(len(idx)):
            while stack and ends[stack[-1]] < starts[i]:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        q = np.flatnonzero(tid == thread)
        if len(q) == 0:
            continue
        t = t_ns[q]
        pos = np.searchsorted(starts, t, side="right") - 1
        while True:
            open_ = pos >= 0
            bad = open_.copy()
            bad[open_] = ends[pos[open_]] < t[open_]
            if not bad.any():
                break
            pos[bad] = parent[pos[bad]]
        while outermost:
            up = np.zeros(len(pos), dtype=bool)
            up[pos >= 0] = parent[pos[pos >= 0]] >= 0
            if not up.any():
                break
            pos[up] = parent[pos[up]]
        res = np.full(len(q), -1, dtype=np.int64)
        res[pos >= 0] = idx[pos[pos >= 0]]
        out[q] = res
    return out


def _own_layers(att, regex) -> np.ndarray:
    """Layer label (object; None outside every layer range) per op, from the capture's own NVTX ranges."""
    labels = np.full(len(att.ops), None, dtype=object)
    frame = att.ranges.frame
    if not len(frame):
        return labels
    keep, range_labels = [], []
    for i, text in enumerate(frame["text"].to_numpy()):
        label = layer_label(text, regex)
        if label is not None:
            keep.append(i)
            range_labels.append(label)
    if not keep:
        return labels
    keep = np.asarray(keep)
    sel = frame.iloc[keep]
    hit = deepest(sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy(), att.ctx_tid, att.ctx_ns,
                  outermost=True)
    range_labels = np.array(range_labels + [None], dtype=object)  # index -1 -> None
    return range_labels[hit]


def op_layers(att, pattern: str | None = None) -> np.ndarray:
    """Layer label per op (object array; None = outside every layer). Ops placed through a mapping capture take the
    layer of their matched op there."""
    regex = compile_layer_pattern(pattern)
    labels = _own_layers(att, regex)
    if att.mapping is not None and att.mapped is not None:
        take = np.flatnonzero(att.status == STATUS_MAPPING)
        if len(take):
            source_labels = _own_layers(att.mapping, regex)
            labels[take] = source_labels[att.mapped[take]]
    return labels


def _order_key(label):
    return (0, label, "") if isinstance(label, int) else (1, 0, str(label))


def layer_rows(att, labels: np.ndarray, category: np.ndarray, steps_per_device: dict) -> dict:
    """device -> [{"layer", "ms_per_step", "count_per_step", "categories": [...]}] over ops inside steps.

    Layers with integer labels come first in numeric order, then named ones, then the `layer: None` row, so the
    rows add up to all op time of the step (the sum of the budget's categories).
    """
    inside = att.step >= 0
    inside_labels = labels[inside]
    # labels can mix int, str and None: group on a string key per distinct label, and keep the labels themselves
    keys = np.array(["none" if x is None else f"{type(x).__name__}:{x}" for x in inside_labels], dtype=object)
    label_of_key = dict(zip(keys.tolist(), inside_labels.tolist()))
    frame = pd.DataFrame({"device": att.ops.device[inside], "dur": att.ops.duration_ns[inside],
                          "category": category[inside], "key": keys})
    out: dict = {}
    for device, dframe in frame.groupby("device", sort=True):
        n = steps_per_device[int(device)]
        rows = []
        for key, lframe in dframe.groupby("key", sort=False):
            label = label_of_key[key]
            cats = (lframe.groupby("category")["dur"].agg(ns="sum", count="size").reset_index()
                    .sort_values("ns", ascending=False))
            rows.append({"layer": label, "ms_per_step": float(lframe["dur"].sum()) / n / NS_PER_MS,
                         "count_per_step": len(lframe) / n,
                         "categories": [{"category": c.category, "ms_per_step": c.ns / n / NS_PER_MS,
                                         "count_per_step": c.count / n} for c in cats.itertuples()]})
        named = sorted((r for r in rows if r["layer"] is not None), key=lambda r: _order_key(r["layer"]))
        out[int(device)] = named + [r for r in rows if r["layer"] is None]
    return out
