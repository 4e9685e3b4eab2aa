"""Exclusive time per category: each step's busy time (the union of its ops' intervals) split among categories.

The rule: cut a step's busy time into elementary slices at every op start and end; a slice is shared equally among
the categories that run in it, each category counted once however many of its own ops overlap there (two GEMMs of
one category on two streams are still that category's time, not twice its share). A category's exclusive time is
the sum of its shares, so over the categories of a step they add up to its busy time, and with idle to its span.
Its overlapped time is its op time minus its exclusive time: the part it ran alongside other work.

Computed in bulk (no loop over ops): per (group, category) the intervals are merged into disjoint segments (a
running maximum of the ends); the segments' starts and ends, sorted per group, give by a cumulative sum the number
of categories running in each slice (k); for each k present, a cumulative sum of the slice lengths with that k
gives each segment its time at k categories, S[k]. A category's exclusive time is sum over k of S[k] / k, kept as
the integers S[k] until the end (so windows add up exactly), then rounded per step to integer ns by largest
remainder so that the step's categories add up to its busy time exactly (each within 1 ns of S/k summed).

Windows (accumulate.StepTotals) come in start order: no later op of a group starts before that group's latest
start so far (its cutoff), so the slices before the cutoff are final. Each window sweeps its ops and the carried
intervals up to the cutoff and carries the rest (clipped to start at the cutoff) to the next window; finish sweeps
what is left. Cutting a slice in two at the cutoff changes no share, so any windowing gives the same integers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profattr.arrays import unique
from profattr.attribute.ns_sums import checked_ns
from profattr.attribute.step_table import CellSums

_EMPTY = np.zeros(0, dtype=np.int64)
ROUND_ROWS = 1 << 18  # (pair, category) cells rounded at once (Exclusive.finish)


def merge_segments(key: np.ndarray, start: np.ndarray, end: np.ndarray):
    """(key, start, end) of the disjoint segments that the intervals of each key cover (touching ones merged),
    sorted by (key, start); zero-length segments are dropped."""
    if len(key) == 0:
        return _EMPTY, _EMPTY, _EMPTY
    order = np.lexsort((start, key))
    k, s, e = key[order], start[order], end[order]
    first = np.r_[True, k[1:] != k[:-1]]
    bounds = np.flatnonzero(first)
    lo = np.repeat(s[bounds], np.diff(np.r_[bounds, len(k)]))  # each key's first start
    width = int((e - lo).max()) + 1 if len(k) else 1
    rank = np.cumsum(first) - 1
    shifted = e - lo + rank * width  # one running maximum never mixes keys
    run = np.maximum.accumulate(shifted)
    prev = np.empty_like(run)
    prev[0] = -1
    prev[1:] = run[:-1]
    opens = first | (s - lo + rank * width > prev)  # a segment opens where an op starts after all earlier ends
    idx = np.flatnonzero(opens)
    seg_end = np.maximum.reduceat(e, idx)
    out_k, out_s = k[idx], s[idx]
    keep = seg_end > out_s
    return out_k[keep], out_s[keep], seg_end[keep]


def solo_ops(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per op, whether it overlaps no other op of its group (its busy time is all its own: k = 1); most ops of a
    one-stream decode, which then need no sweep."""
    if len(start) < 2:
        return np.ones(len(start), dtype=bool)
    if (start[1:] >= start[:-1]).all():  # in start order (a window)
        if (start[1:] >= np.maximum.accumulate(end)[:-1]).all():
            return np.ones(len(start), dtype=bool)  # no op overlaps any other at all (one GPU, one stream)
        order = np.argsort(group, kind="stable")  # keeps the start order, and runs of one step sort in linear time
    else:
        order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    first = np.r_[True, g[1:] != g[:-1]]
    bounds = np.flatnonzero(first)
    lo = np.repeat(s[bounds], np.diff(np.r_[bounds, len(g)]))  # each group's first start
    width = int((e - lo).max()) + 1
    rank = np.cumsum(first) - 1
    run = np.maximum.accumulate(e - lo + rank * width)  # one running maximum of the ends, never mixing groups
    prev = np.empty_like(run)
    prev[0] = -1
    prev[1:] = run[:-1]
    opens = first | (s - lo + rank * width >= prev)  # a cluster of overlapping ops opens here
    cluster = np.cumsum(opens) - 1
    alone = np.bincount(cluster)[cluster] == 1
    out = np.empty(len(g), dtype=bool)
    out[order] = alone
    return out


def sweep(group: np.ndarray, cat: np.ndarray, start: np.ndarray, end: np.ndarray, n_cats: int):
    """(group, category, k, ns) rows: per (group, category) the time it ran while k categories ran (S[k])."""
    n_cats = max(int(n_cats), 1)
    key, a, b = merge_segments(group * n_cats + cat, start, end)
    n = len(key)
    if n == 0:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY
    g = key // n_cats
    t = np.concatenate([a, b])
    delta = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])
    gg = np.concatenate([g, g])
    order = np.lexsort((t, gg))
    pos = np.empty(2 * n, dtype=np.int64)
    pos[order] = np.arange(2 * n)
    ts = t[order]
    k_after = np.cumsum(delta[order])  # categories running in the slice that starts at each event
    length = np.zeros(2 * n, dtype=np.int64)
    length[:-1] = ts[1:] - ts[:-1]
    length[k_after <= 0] = 0  # between groups (and at a group's end) nothing runs
    ia, ib = pos[:n], pos[n:]
    rows_g, rows_c, rows_k, rows_ns = [], [], [], []
    for k in unique(k_after[k_after > 0]).tolist():
        prefix = np.zeros(2 * n + 1, dtype=np.int64)
        np.cumsum(np.where(k_after == k, length, 0), out=prefix[1:])
        ns = prefix[ib] - prefix[ia]
        hit = ns > 0
        rows_g.append(g[hit])
        rows_c.append(key[hit] % n_cats)
        rows_k.append(np.full(int(hit.sum()), k, dtype=np.int64))
        rows_ns.append(ns[hit])
    if not rows_g:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY
    return tuple(np.concatenate(x) for x in (rows_g, rows_c, rows_k, rows_ns))


def sum_solo(g, c, ns):
    """(g, c, k = 1, ns) rows of ops that ran alone, summed per (g, c) by hashing (no sort of the ops)."""
    if len(g) == 0:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY
    codes, uniq = pd.factorize(g)
    n_c = int(c.max()) + 1
    key = codes.astype(np.int64) * n_c + c
    size = len(uniq) * n_c
    count = np.bincount(key, minlength=size)
    total = np.bincount(key, weights=ns, minlength=size)  # exact: integer sums far below 2**53
    hit = np.flatnonzero(count)
    return (np.asarray(uniq, dtype=np.int64)[hit // n_c], hit % n_c, np.ones(len(hit), dtype=np.int64),
            checked_ns(total[hit], "exclusive times"))


def sum_rows(g, c, k, ns):
    """The (g, c, k, ns) rows with equal (g, c, k) summed (exact integers), sorted."""
    if len(g) == 0:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY
    n_c, n_k = int(c.max()) + 1, int(k.max()) + 1
    key = (g * n_c + c) * n_k + k  # pair ids, categories and k are small: one int64 key, sorted once
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return g[order][first], c[order][first], k[order][first], np.add.reduceat(ns[order], first)


class Exclusive:
    """The exclusive split accumulated over windows in start order (see the module docstring). The time of each
    (pair, category) that ran alone (k = 1: nearly all of a one-stream decode) is summed into a pairs x categories
    matrix; only the rows at k >= 2 are kept as rows, so a long capture's millions of cells are not held as rows."""

    def __init__(self, pairs: int = 0):
        """`pairs`: how many (device, step) pairs to expect (CellSums)."""
        self.carry = [_EMPTY] * 4  # gid, category id, start, end of the intervals still running at the cutoff
        self.alone = CellSums(("ns",), pairs)  # S[1] per (pair id, category id)
        self.parts: list = []  # per window: its (g, c, k, ns) rows at k >= 2, summed

    def add(self, gid: np.ndarray, cat: np.ndarray, start: np.ndarray, end: np.ndarray, cutoff: np.ndarray,
            n_cats: int) -> None:
        """One window's ops (their pair id, category id, start, end); `cutoff`: per pair id, the latest start of
        that pair so far (this window included)."""
        cg, cc, cs, ce = self.carry
        take = np.isin(cg, gid)
        g = np.concatenate([cg[take], gid])
        c = np.concatenate([cc[take], cat])
        s = np.concatenate([cs[take], start])
        e = np.concatenate([ce[take], end])
        cut = cutoff[g]
        self._sweep(g, c, s, np.minimum(e, cut), n_cats)
        later = e > cut
        self.carry = [np.concatenate([cg[~take], g[later]]), np.concatenate([cc[~take], c[later]]),
                      np.concatenate([cs[~take], np.maximum(s[later], cut[later])]),
                      np.concatenate([ce[~take], e[later]])]

    def _sweep(self, g, c, s, e, n_cats) -> None:
        ok = e > s
        if not ok.any():
            return
        g, c, s, e = g[ok], c[ok], s[ok], e[ok]
        alone = solo_ops(g, s, e)
        rows = [sum_solo(g[alone], c[alone], (e - s)[alone])]
        if not alone.all():
            rest = ~alone
            rows.append(sweep(g[rest], c[rest], s[rest], e[rest], n_cats))
        rg, rc, rk, rns = sum_rows(*(np.concatenate([r[i] for r in rows]) for i in range(4)))
        one = rk == 1
        self.alone.add(rg[one], rc[one], {"ns": rns[one]}, int(g.max()) + 1, max(int(n_cats), int(c.max()) + 1))
        if not one.all():
            self.parts.append((rg[~one], rc[~one], rk[~one], rns[~one]))

    def finish(self, n_cats: int, tie=None):
        """(pair id, category id, exclusive ns) per pair and category with time, rounded per pair so that each
        pair's rows add up to its union length (busy). `tie`: per category id, its rank among the names (equal
        remainders go to the lower rank, so the result does not depend on the order categories were met in)."""
        out = list(self.finish_runs(n_cats, tie))
        if not out:
            return _EMPTY, _EMPTY, _EMPTY
        return tuple(np.concatenate([part[i] for part in out]) for i in range(3))

    def finish_runs(self, n_cats: int, tie=None):
        """finish's rows, a run of whole pairs at a time (each pair's rounding is its own): the (g, c, k, ns) rows,
        the rounding's temporaries and the caller's are then a run's, not those of every step and category."""
        cg, cc, cs, ce = self.carry
        self._sweep(cg, cc, cs, ce, n_cats)
        self.carry = [_EMPTY] * 4
        alone = self.alone.cells["ns"]
        parts, self.parts = self.parts, []
        if parts:
            pg, pc, pk, pns = sum_rows(*(np.concatenate([p[i] for p in parts]) for i in range(4)))
        else:
            pg = pc = pk = pns = _EMPTY
        del parts
        run = max(1, ROUND_ROWS // max(alone.shape[1], 1))  # pairs per run
        n_pairs = max(len(alone), int(pg.max()) + 1 if len(pg) else 0)
        for lo in range(0, n_pairs, run):
            hi = min(lo + run, n_pairs)
            block = alone[lo:hi]
            row, col = np.nonzero(block)
            a, b = np.searchsorted(pg, [lo, hi])  # the run's rows at k >= 2
            g, c, k, ns = sum_rows(np.concatenate([row + lo, pg[a:b]]), np.concatenate([col, pc[a:b]]),
                                   np.concatenate([np.ones(len(row), dtype=np.int64), pk[a:b]]),
                                   np.concatenate([block[row, col], pns[a:b]]))
            if len(g):
                yield round_shares(g, c, k, ns, tie)
        self.alone = CellSums(("ns",))


def round_shares(g, c, k, ns, tie=None):
    """Integer ns per (g, c) from rows of time `ns` shared among `k` categories (sum of ns / k), rounded by largest
    remainder within each g so that the g's values add up to sum of ns / k over its rows (an integer: every slice
    of k categories is counted once for each of them)."""
    q, r = np.divmod(ns, k)
    pair = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (c[1:] != c[:-1])])
    pg, pc = g[pair], c[pair]
    whole = np.add.reduceat(q, pair)
    frac = np.add.reduceat(r / k, pair)
    carry = np.floor(frac)
    base = whole + carry.astype(np.int64)
    rest = frac - carry
    # each g's total: sum over its k of (sum over categories of ns at k) / k, exact
    order = np.lexsort((k, g))
    gs, ks, nss = g[order], k[order], ns[order]
    first = np.flatnonzero(np.r_[True, (gs[1:] != gs[:-1]) | (ks[1:] != ks[:-1])])
    per_gk = np.add.reduceat(nss, first) // ks[first]
    groups, inv = np.unique(gs[first], return_inverse=True)
    total = checked_ns(np.bincount(inv.reshape(-1), weights=per_gk, minlength=len(groups)), "exclusive times")
    gi = np.searchsorted(groups, pg)
    short = total - checked_ns(np.bincount(gi, weights=base, minlength=len(groups)), "exclusive times")
    # hand the missing ns, one each, to the rows with the largest remainders (ties: lower `tie` rank); a float
    # sum of remainders just above a whole number could leave one ns too many: taken from the smallest remainders
    rank_order = np.lexsort((pc if tie is None else np.asarray(tie)[pc], -rest, gi))
    sorted_gi = gi[rank_order]
    starts = np.searchsorted(sorted_gi, np.arange(len(groups)))
    ends = np.searchsorted(sorted_gi, np.arange(len(groups)), side="right")
    rank = np.empty(len(pg), dtype=np.int64)
    rank[rank_order] = np.arange(len(pg)) - starts[sorted_gi]
    from_end = (ends - starts)[gi] - 1 - rank
    need = short[gi]
    return pg, pc, base + (rank < need).astype(np.int64) - (from_end < -need).astype(np.int64)

