"""Which linear layers each launch shape of a GEMM category runs, for the kernels the launch model cannot time.

A projection to another --tp must keep the bytes of a replicated layer (the DSA indexer's projections, MLA's q_a/kv_a)
and shrink those of a sharded one (q_b, o_proj, the absorbed w_kc/w_vc, lm_head); a category's floor row mixes both.
Here each launch shape (grid, launches per step) of a GEMM kernel is matched to the model's linear layers
(launch_model.linear_layers) by its grid: a layer of n output rows, batched over `experts` heads, run on a tile of
width T, launches experts x ceil(n / T) CTAs, times its split count (at least 2) for a split-K kernel. The tile
width is read from the kernel name where specs/gemm_kernels.toml names the family (cuBLAS nvjet), else each of
launch_model.TILE_WIDTHS is tried. A shape whose grid no layer explains (a persistent grid, e.g. lm_head's) is
matched by its launch count alone. Every layer runs on one shape; among the assignments that explain the most shapes
by grid (then the most by count), a shape's layers are taken where all of them agree on its layers' sharding;
kernels the file names as helpers (the split-K reduce) stream no weights.

`assign(shapes, layers)` is pure: shapes [{kernel, ctas, count}], layers as linear_layers returns them; it returns,
per shape, the list of layer-name sets the best assignments give it (empty: not explained).
"""
from __future__ import annotations

import itertools
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from profattr.limits.specs import load_toml

MAX_LAYERS_PER_SHAPE = 3  # one launch shape may run several layers with the same grid (q_b and w_vc at 128 CTAs)
MAX_NODES = 200_000  # search budget: beyond it the shapes stay unexplained (their row's byte ratio applies)


def _spec() -> Mapping[str, Any]:
    return load_toml("gemm_kernels.toml")


def is_helper(kernel: str) -> bool:
    """Whether the kernel belongs to a GEMM category but streams no weights (cuBLAS's split-K reduce)."""
    return any(re.search(h["pattern"], kernel) for h in _spec().get("helpers", []))


def _tiling(kernel: str, default_tiles: Sequence[int]) -> Tuple[Tuple[int, ...], bool]:
    """(tile widths to try, split-K) of a kernel: the family's tile from the name, else every default width."""
    for fam in _spec().get("families", []):
        if re.search(fam["pattern"], kernel):
            m = re.search(fam["tile_width"], kernel)
            split = bool(fam.get("split_k") and re.search(fam["split_k"], kernel))
            return ((int(m.group(1)),) if m else tuple(default_tiles)), split
    return tuple(default_tiles), False


def _fits(layer: Mapping[str, Any], ctas: int, tiles: Sequence[int], split_k: bool) -> bool:
    for t in tiles:
        base = int(layer["experts"]) * math.ceil(int(layer["n"]) / t)
        if (split_k and ctas % base == 0 and ctas // base >= 2) or (not split_k and ctas == base):
            return True
    return False


def _combos(layers: Sequence[Mapping[str, Any]], count: float) -> List[Tuple[str, ...]]:
    out = []
    for r in range(1, MAX_LAYERS_PER_SHAPE + 1):
        for combo in itertools.combinations(layers, r):
            if abs(sum(float(l["count"]) for l in combo) - count) < 1e-6:
                out.append(tuple(l["name"] for l in combo))
    return out


def assign(shapes: Sequence[Mapping[str, Any]], layers: Sequence[Mapping[str, Any]],
           default_tiles: Sequence[int]) -> List[List[Tuple[str, ...]]]:
    """Per shape ({kernel, ctas, count}): the distinct layer-name sets it runs in the best assignments."""
    options: List[List[Tuple[Tuple[str, ...], int]]] = []  # (layer names, 2 when the grid explains it, else 1)
    for s in shapes:
        tiles, split_k = _tiling(str(s["kernel"]), default_tiles)
        fitting = [l for l in layers if _fits(l, int(s["ctas"]), tiles, split_k)]
        by_grid = _combos(fitting, float(s["count"]))
        options.append([(c, 2) for c in by_grid] or [(c, 1) for c in _combos(layers, float(s["count"]))])
    order = sorted(range(len(shapes)), key=lambda i: len(options[i]))
    best: Dict[str, Any] = {"score": None, "picks": []}
    nodes = 0

    def walk(pos: int, used: frozenset, score: Tuple[int, int], pick: Dict[int, Tuple[str, ...]]) -> None:
        nonlocal nodes
        nodes += 1
        if nodes > MAX_NODES:
            return
        if pos == len(order):
            if best["score"] is None or score > best["score"]:
                best["score"], best["picks"] = score, [dict(pick)]
            elif score == best["score"]:
                best["picks"].append(dict(pick))
            return
        left = order[pos:]
        bound = (score[0] + sum(1 for i in left if any(w == 2 for _, w in options[i])), score[1] + len(left))
        if best["score"] is not None and bound < best["score"]:
            return
        i = order[pos]
        for names, weight in options[i]:
            if used.isdisjoint(names):
                pick[i] = names
                walk(pos + 1, used | set(names), (score[0] + (weight == 2), score[1] + 1), pick)
                del pick[i]
        walk(pos + 1, used, score, pick)

    walk(0, frozenset(), (0, 0), {})
    if nodes > MAX_NODES:
        return [[] for _ in shapes]
    out: List[List[Tuple[str, ...]]] = []
    for i in range(len(shapes)):
        seen = []
        for p in best["picks"]:
            names = p.get(i)
            if names is not None and names not in seen:
                seen.append(names)
        out.append(seen if all(p.get(i) is not None for p in best["picks"]) else [])
    return out


def shape_ratios(kernels: Sequence[Mapping[str, Any]], source_layers: Mapping[str, Mapping[str, Any]],
                 target_layers: Mapping[str, Mapping[str, Any]], bytes_per_param, default_tiles: Sequence[int],
                 ) -> Dict[Tuple[str, int], Dict[str, Any]]:
    """{(kernel, shape index): {"byte_ratio", "layers", "sharded"}} for the launch shapes of one GEMM category's
    kernels (budget kernel rows) that the grids tie to layers whose per-launch byte ratio target/source agrees over
    the best assignments; helpers get byte_ratio None (no weights), launches of layers the target does not run 0.
    `bytes_per_param(spec_side, dtype)`."""
    want = {"bf16"} if all(str(k["category"]).endswith(".bf16") for k in kernels) else {"quant"}
    cands = [l for l in source_layers.values() if l["dtype"] in want and not l["name"].startswith("routed_experts")
             and l["name"] in target_layers]
    rows, out = [], {}
    for k in kernels:
        for i, s in enumerate(k.get("shapes") or []):
            if is_helper(str(k["name"])):
                out[(str(k["name"]), i)] = {"byte_ratio": None, "layers": [], "sharded": None}
                continue
            g = s["shape"]["grid"]
            rows.append({"kernel": str(k["name"]), "index": i, "ctas": int(g[0]) * int(g[1]) * int(g[2]),
                         "count": float(s["count_per_step"])})
    if not rows or not cands:
        return out

    def ratio(names: Tuple[str, ...]) -> float:
        src = sum(source_layers[n]["count"] * _bytes(source_layers[n], bytes_per_param, "source") for n in names)
        tgt = sum(source_layers[n]["count"] * _bytes(target_layers[n], bytes_per_param, "target") for n in names)
        return tgt / src if src > 0 else 1.0

    for row, sets in zip(rows, assign(rows, cands, default_tiles)):
        ratios = sorted({round(ratio(names), 12) for names in sets})
        if sets and len(ratios) == 1:
            out[(row["kernel"], row["index"])] = {
                "byte_ratio": ratios[0], "layers": [list(names) for names in sets],
                "sharded": sorted({bool(source_layers[n]["sharded"]) for names in sets for n in names})}
    return out


def _bytes(layer: Mapping[str, Any], bytes_per_param, side: str) -> float:
    if not layer.get("runs", True):
        return 0.0
    return float(layer["n"]) * float(layer["k"]) * float(layer["experts"]) * bytes_per_param(side, layer["dtype"])
