"""A GEMM's M, N, K from the NVTX range of the linear layer that launched it, where the capture has such ranges.

SGLang's layerwise NVTX markers (`--enable-layerwise-nvtx-marker`) open one range per module call whose text names
the module, its weights' shapes and its inputs' shapes, e.g.
`{'Module': 'model.model.layers.5.self_attn.q_b_proj', 'TrainableParams': {'weight': [16384, 2048], ...},
'Inputs': [[1, 2048]]}`. For a linear layer (a 2-D `weight` [N, K] whose first input ends in K) the GEMM is
M x N x K with M the product of the input's other dimensions. A kernel takes the dims of the innermost such range
open on its launching thread at its context point (its launch call, or its graph node's creation), as its NVTX
context is read (attribute/graphs.py). Expert weights (3-D), other modules and captures without these markers
give none (-1).

M, N and K are packed into one int64 per op: M << 43 | N << 21 | K (M < 2^20, N < 2^22, K < 2^21; -1 otherwise;
M = 0 when only N and K are known: a replayed kernel that borrowed them from an eager capture of the same workload,
whose batch may differ).
"""
from __future__ import annotations

import re

import numpy as np

from profattr.attribute.nvtx import Ranges, innermost

_WEIGHT = re.compile(r"'TrainableParams':\s*\{'weight':\s*\[(\d+),\s*(\d+)\]")
_INPUT = re.compile(r"'Inputs':\s*\[\[([\d,\s]+)\]")
M_MAX, N_MAX, K_MAX = (1 << 20) - 1, (1 << 22) - 1, (1 << 21) - 1


def pack_mnk(m: int, n: int, k: int) -> int:
    if not (0 < m <= M_MAX and 0 < n <= N_MAX and 0 < k <= K_MAX):
        return -1
    return (m << 43) | (n << 21) | k


def without_m(packed: np.ndarray) -> np.ndarray:
    """Packed values with M set to 0 (unknown), -1 kept."""
    packed = np.asarray(packed, dtype=np.int64)
    return np.where(packed >= 0, packed & ((np.int64(1) << 43) - 1), -1)


def unpack_mnk(packed: int) -> dict | None:
    """{"m", "n", "k"} of a packed value (m None when not known), None for -1."""
    packed = int(packed)
    if packed < 0:
        return None
    m = packed >> 43
    return {"m": m or None, "n": (packed >> 21) & N_MAX, "k": packed & K_MAX}


def text_mnk(text: str) -> int:
    """The packed M, N, K a layerwise marker's text names, -1 when it is not a linear layer's."""
    if "'TrainableParams'" not in text:
        return -1
    w, x = _WEIGHT.search(text), _INPUT.search(text)
    if not w or not x:
        return -1
    n, k = int(w.group(1)), int(w.group(2))
    dims = [int(v) for v in x.group(1).replace(" ", "").split(",") if v]
    if not dims or dims[-1] != k:
        return -1
    m = int(np.prod(dims[:-1], dtype=np.int64)) if len(dims) > 1 else 1
    return pack_mnk(m, n, k)


class LinearRanges:
    """The capture's linear-layer ranges (tid, start, end, packed M, N, K), found once; `of(tid, t_ns)` per op."""

    def __init__(self, ranges: Ranges):
        frame = ranges.frame
        if len(frame):
            texts = frame["text"].astype(str)
            candidate = texts.str.contains("'TrainableParams'", regex=False).to_numpy()
        else:
            candidate = np.zeros(0, dtype=bool)
        sel = frame[candidate] if len(frame) else frame
        # few distinct texts (one per module and input shape): parse each once
        codes = {t: text_mnk(t) for t in set(sel["text"].astype(str))} if len(sel) else {}
        mnk = np.array([codes[t] for t in sel["text"].astype(str)], dtype=np.int64) if len(sel) else np.zeros(
            0, dtype=np.int64)
        keep = mnk >= 0
        self.tid = sel["tid"].to_numpy()[keep] if len(sel) else np.zeros(0, dtype=np.int64)
        self.start = sel["start"].to_numpy()[keep] if len(sel) else np.zeros(0, dtype=np.int64)
        self.end = sel["end"].to_numpy()[keep] if len(sel) else np.zeros(0, dtype=np.int64)
        self.mnk = mnk[keep]

    def __len__(self) -> int:
        return len(self.mnk)

    def of(self, tid: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
        """Packed M, N, K per context point (-1: no linear layer's range holds it)."""
        if len(self) == 0:
            return np.full(len(t_ns), -1, dtype=np.int64)
        idx = innermost(self.tid, self.start, self.end, tid, t_ns)
        out = np.full(len(t_ns), -1, dtype=np.int64)
        hit = idx >= 0
        out[hit] = self.mnk[idx[hit]]
        return out
