"""The budget's totals, accumulated window by window: a capture need not be in memory at once.

Every quantity of the budget is a sum, a count, a minimum or a maximum per (device, step), per (device, step,
category) or per (device, kernel/context combination), so windows add up exactly, with one exception: `busy`, the
length of the union of a step's intervals. It is exact too when windows come in start order: each (device, step)
carries the latest end seen so far, and the next window's intervals continue the same running maximum. A window
whose ops start before that group's last start (ops not in start order) makes `in_order` False, and the caller
computes the budget in one window instead.

The exclusive split of busy time among categories (exclusive.py) continues across windows the same way: the
intervals still running at a group's latest start are carried into the next window.

Combinations (demangled name, short name, NVTX context mask) are classified once each, when first met; at the end
they are put in the order one window over all ops gives (sorted), so the results are identical either way.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profattr.attribute.ns_sums import add_ns, checked_ns
from profattr.attribute.exclusive import Exclusive
from profattr.attribute.step_table import CellSums, StepCategories
from profattr.trace.ops import KIND_KERNEL, Ops, memop_name

COMM_PREFIX = "comm."
SHORT_KERNEL_NS = 5000  # a kernel under 5 us: its launch and tail cost about as much as its work


def group_rows(*cols):
    """Distinct rows of the given integer columns (sorted, as a 2-D array) and each row's group index.

    The same result as `np.unique(np.stack(cols, 1), axis=0, return_inverse=True)`, but hash-based: that sorts
    whole rows and dominates the run time on millions of ops.
    """
    n = len(cols[0])
    if n == 0:
        return np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = np.zeros(n, dtype=np.int64)
    for col in cols:
        codes, uniques = pd.factorize(col, sort=True)
        key = key * len(uniques) + codes  # mixed radix: sorted keys = rows in lexicographic order
    group, keys = pd.factorize(key, sort=True)
    first = np.empty(len(keys), dtype=np.int64)
    first[group[::-1]] = np.arange(n - 1, -1, -1)  # first occurrence of each group
    rows = np.stack([np.asarray(col)[first] for col in cols], axis=1)
    return rows, group.astype(np.int64)


def group_pairs(device: np.ndarray, step: np.ndarray):
    """group_rows(device, step), hashing one packed key instead of three columns when both fit 31 bits and are
    not negative (the budget's devices and steps); the same rows and group indices."""
    n = len(device)
    if n == 0 or min(int(device.min()), int(step.min())) < 0 or max(int(device.max()), int(step.max())) > 0x7FFFFFFF:
        return group_rows(device, step)
    key = (device.astype(np.int64) << 32) | step.astype(np.int64)
    group, keys = pd.factorize(key, sort=True)  # packed keys sort as (device, step) rows do
    rows = np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1).astype(np.int64)
    return rows, group.astype(np.int64)


# per combination: what it is and what decided it (taxonomy/contexts.py Decision: evidence, rule, context, conflict)
COMBO_COLUMNS = ["name", "demangled", "category", "family", "evidence", "rule", "context", "conflict"]


def op_names(dem_id: int, short_id: int, strings: dict) -> tuple:
    """(short, demangled) name of an op from its string ids (`strings`: id -> text): a memory op's by its code."""
    if dem_id < 0:
        name = memop_name(int(dem_id))
        return name, name
    demangled = strings.get(int(dem_id)) or strings.get(int(short_id)) or f"<string {dem_id}>"
    return strings.get(int(short_id)) or demangled, demangled


class Combos:
    """Distinct (demangled id, short id, context mask) rows met so far, each classified once."""

    def __init__(self, source, patterns, ruleset):
        self.source, self.patterns, self.ruleset = source, list(patterns), ruleset
        self.index: dict = {}
        self.rows: list = []
        self.values: list = []  # COMBO_COLUMNS per registry id

    def ids(self, ops: Ops, mask: np.ndarray) -> np.ndarray:
        """Registry id of each op's combination (new ones are classified)."""
        uniq, local = group_rows(ops.demangled_id, ops.name_id, mask)
        keys = [tuple(int(x) for x in r) for r in uniq]
        new = [k for k in keys if k not in self.index]
        if new:
            strings = self.source.strings([k[0] for k in new] + [k[1] for k in new])
            for k in new:
                self.index[k] = len(self.rows)
                self.rows.append(k)
                self.values.append(self._classify(k, strings))
        reg = np.array([self.index[k] for k in keys], dtype=np.int64)
        return reg[local] if len(local) else np.zeros(0, dtype=np.int64)

    def _classify(self, key, strings) -> tuple:
        dem_id, short_id, m = key
        short, demangled = op_names(dem_id, short_id, strings)
        if dem_id < 0:  # memory op
            return (short, short, "memory.set" if dem_id == -100 else "memory.copy", "cuda_memory", "name", "", "", "")
        contexts = frozenset(p for b, p in enumerate(self.patterns) if (int(m) >> b) & 1)
        d = self.ruleset.decide(demangled, contexts, short=short if short != demangled else None)
        return (short, demangled, d.category, d.family, d.evidence, d.rule.id if d.rule else "",
                d.context.id if d.context else "", d.conflict.id if d.conflict else "")

    def category_of(self, reg: int) -> str:  # noqa: D401 - values: COMBO_COLUMNS
        return self.values[reg][2]

    def finish(self):
        """(final index per registry id, combos frame in final order: the rows sorted, as one window gives)."""
        rows = np.array(self.rows, dtype=np.int64).reshape(-1, 3)
        order = np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0])) if len(rows) else np.zeros(0, dtype=np.int64)
        final = np.empty(len(rows), dtype=np.int64)
        final[order] = np.arange(len(rows))
        combos = pd.DataFrame([self.values[i] for i in order], columns=COMBO_COLUMNS)
        return final, combos


class _Grow:
    """Per (device, step) arrays that grow as pairs are met; pair ids in order of first meeting."""

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.int64)  # device << 32 | step of the pairs met, sorted
        self.key_ids = np.zeros(0, dtype=np.int64)  # pair id of each sorted key
        self.device_of = np.zeros(0, dtype=np.int64)  # per pair id
        self.step_of = np.zeros(0, dtype=np.int64)
        self.cols = {k: np.zeros(0, dtype=np.int64)
                     for k in ("span_start", "span_end", "busy", "op_ns", "kernels", "carry_end", "last_start")}

    @property
    def device(self) -> np.ndarray:
        return self.device_of

    @property
    def step(self) -> np.ndarray:
        return self.step_of

    def ids(self, pairs: np.ndarray) -> np.ndarray:
        """Pair id of each (device, step) row of `pairs` (sorted, distinct: group_rows); new pairs get the next ids
        in their row order. Devices fit 31 bits and steps 32 (Ops.device; a step index)."""
        if len(pairs) == 0:
            return np.zeros(0, dtype=np.int64)
        key = (pairs[:, 0].astype(np.int64) << 32) | pairs[:, 1].astype(np.int64)
        pos = np.searchsorted(self.keys, key)
        known = np.zeros(len(key), dtype=bool)
        inside = pos < len(self.keys)
        known[inside] = self.keys[pos[inside]] == key[inside]
        out = np.empty(len(key), dtype=np.int64)
        out[known] = self.key_ids[pos[known]]
        fresh = int((~known).sum())
        if fresh:
            first = len(self.device_of)
            out[~known] = np.arange(first, first + fresh)
            self.device_of = np.concatenate([self.device_of, pairs[~known, 0].astype(np.int64)])
            self.step_of = np.concatenate([self.step_of, pairs[~known, 1].astype(np.int64)])
            keys = np.concatenate([self.keys, key[~known]])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self.key_ids = np.concatenate([self.key_ids, out[~known]])[order]
            big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
            fill = {"span_start": big, "span_end": small, "carry_end": small, "last_start": small}
            for k, v in self.cols.items():
                self.cols[k] = np.concatenate([v, np.full(fresh, fill.get(k, 0), dtype=np.int64)])
        return out


class StepTotals:
    """The budget's totals over the windows added so far (see the module docstring)."""

    def __init__(self, step_categories: bool = True, pairs: int = 0):
        """`pairs`: how many (device, step) pairs to expect (the steps: one device's), so that the per (pair,
        category) matrices are allocated once (step_table.CellSums)."""
        self.step_categories = step_categories  # False: no op time and count per (step, category)
        self.pairs = _Grow()
        self.cat_ids: dict = {}  # category name -> id in order of first appearance
        self.cells = CellSums(rows=pairs if step_categories else 0)  # op time and count per (pair id, category id)
        self.combo_parts: list = []  # per window: (device, registry combo, ns, count)
        self.outside: dict = {}  # device -> [ns, count]
        self.status = np.zeros(4, dtype=np.int64)
        self.comm: list = []  # per window: comm ops inside steps
        self.exclusive = Exclusive(pairs)  # the busy time split among categories (exclusive.py)
        self.short: dict = {}  # device -> [ns, count] of kernels inside steps shorter than SHORT_KERNEL_NS
        self.in_order = True

    def add(self, ops: Ops, step: np.ndarray, combo: np.ndarray, combos: Combos | None, status: np.ndarray | None,
            categories: np.ndarray | None = None, gemm: np.ndarray | None = None) -> None:
        """One window: its ops, their step (-1 outside), registry combination and placement status.
        `categories` (per registry id) replaces `combos` when the combinations are final already; `gemm`: each
        op's packed M, N, K (attribute/gemm_dims.py; -1 or None: unknown)."""
        inside = step >= 0
        out_dev = ops.device[~inside]
        if len(out_dev):
            out_dur = ops.end[~inside] - ops.start[~inside]
            devs, codes = np.unique(out_dev, return_inverse=True)
            ns = checked_ns(np.bincount(codes.reshape(-1), weights=out_dur, minlength=len(devs)))
            cnt = np.bincount(codes.reshape(-1), minlength=len(devs))
            for d, a, c in zip(devs.tolist(), ns.tolist(), cnt.tolist()):
                acc = self.outside.setdefault(d, [0, 0])
                acc[0] += a
                acc[1] += c
        if status is not None:
            self.status += np.bincount(status[inside].astype(np.int64), minlength=4)[:4]
        if not inside.any():
            return
        sel = slice(None) if inside.all() else inside
        dev, stp, start, end = ops.device[sel], step[sel], ops.start[sel], ops.end[sel]
        reg = combo[sel]
        dur = end - start
        local_pairs, group = group_pairs(dev, stp)
        gid = self.pairs.ids(local_pairs)
        n_groups = len(local_pairs)
        self._spans_and_busy(gid, group, start, end, n_groups)
        cols = self.pairs.cols
        add_ns(cols["op_ns"], gid, checked_ns(np.bincount(group, weights=dur, minlength=n_groups)))
        cols["kernels"][gid] += np.bincount(group, weights=ops.kind[sel] == KIND_KERNEL,
                                            minlength=n_groups).astype(np.int64)
        cat_names = categories if categories is not None else np.array(
            [combos.category_of(i) for i in range(len(combos.rows))], dtype=object)
        cat_of_reg = np.array([self.cat_ids.setdefault(c, len(self.cat_ids)) for c in cat_names], dtype=np.int64)
        cat = cat_of_reg[reg] if len(cat_of_reg) else np.zeros(len(reg), dtype=np.int64)
        self.exclusive.add(gid[group], cat, start, end, cols["last_start"], len(self.cat_ids))
        if self.step_categories:
            self._add_categories(gid, group, n_groups, cat, dur)
        # per (device, combination, launch shape): kernel rows per name and per shape (budget.assemble)
        mnk = gemm[sel] if gemm is not None else np.full(len(dev), -1, dtype=np.int64)
        dc, dc_group = group_rows(dev, reg, ops.grid[sel], ops.block[sel], mnk)
        ns = checked_ns(np.bincount(dc_group, weights=dur, minlength=len(dc)))
        count = np.bincount(dc_group, minlength=len(dc))
        self.combo_parts.append((dc[:, 0], dc[:, 1], ns, count, dc[:, 2], dc[:, 3], dc[:, 4]))
        self._add_short(dev, dur, ops.kind[sel] == KIND_KERNEL)
        # collectives (for the transfer / wait split, comm.py): few ops, kept whole
        is_comm = np.array([str(c).startswith(COMM_PREFIX) for c in cat_names], dtype=bool)
        if is_comm.any():
            pick = is_comm[reg]
            if pick.any():
                self.comm.append({"device": dev[pick], "stream": ops.stream[sel][pick], "start": start[pick],
                                  "end": end[pick], "step": stp[pick], "reg": reg[pick]})

    def _add_short(self, dev, dur, is_kernel) -> None:
        """Per device: kernels shorter than SHORT_KERNEL_NS and their summed time (launch-bound work)."""
        short = is_kernel & (dur < SHORT_KERNEL_NS)
        if not short.any():
            return
        devs, codes = np.unique(dev[short], return_inverse=True)
        ns = checked_ns(np.bincount(codes.reshape(-1), weights=dur[short], minlength=len(devs)))
        cnt = np.bincount(codes.reshape(-1), minlength=len(devs))
        for d, a, c in zip(devs.tolist(), ns.tolist(), cnt.tolist()):
            acc = self.short.setdefault(d, [0, 0])
            acc[0] += a
            acc[1] += c

    def _add_categories(self, gid, group, n_groups, cat, dur) -> None:
        """Per (step, category) sums of one window: `cat`, the category id of each op."""
        n_cats = max(len(self.cat_ids), 1)
        key = group * n_cats + cat
        ns = checked_ns(np.bincount(key, weights=dur, minlength=n_groups * n_cats))
        count = np.bincount(key, minlength=n_groups * n_cats)
        hit = np.flatnonzero(count)
        g_idx, c_idx = np.divmod(hit, n_cats)
        self.cells.add(gid[g_idx], c_idx, {"ns": ns[hit], "count": count[hit]}, len(self.pairs.device_of),
                       len(self.cat_ids))

    def _spans_and_busy(self, gid, group, start, end, n_groups) -> None:
        """First start, last end, and the union length of each group, continued from earlier windows.

        Sort by (group, start) and take the running maximum of the ends; each group is shifted above the previous
        one so that a single running maximum never mixes groups, and starts from the group's carried end."""
        cols = self.pairs.cols
        order = np.lexsort((start, group))
        g = group[order]
        bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        s = start[order]
        e = end[order]
        first_start = s[bounds]
        last_start = np.maximum.reduceat(s, bounds)
        last_end = np.maximum.reduceat(e, bounds)
        carry = cols["carry_end"][gid]
        had = carry != np.iinfo(np.int64).min
        if (cols["last_start"][gid][had] > first_start[had]).any():
            self.in_order = False
        cols["span_start"][gid] = np.minimum(cols["span_start"][gid], first_start)
        cols["span_end"][gid] = np.maximum(cols["span_end"][gid], last_end)
        cols["last_start"][gid] = np.maximum(cols["last_start"][gid], last_start)
        cols["carry_end"][gid] = np.maximum(carry, last_end)
        origin = int(s.min())
        top = int(e.max())
        if had.any():
            origin = min(origin, int(carry[had].min()))
            top = max(top, int(carry[had].max()))
        width = top - origin + 1
        offset = (g * width) - origin
        s = s + offset
        e = e + offset
        # what each group starts from: its carried end, else nothing (below all its starts)
        start_from = np.where(had, carry, origin) + (np.arange(n_groups) * width) - origin
        prev = np.maximum.accumulate(e)
        prev[1:] = prev[:-1].copy()
        prev[0] = s[0] - 1
        np.maximum(prev, start_from[g], out=prev)
        np.maximum(s, prev, out=s)
        del prev
        e -= s
        np.clip(e, 0, None, out=e)
        add_ns(cols["busy"], gid, checked_ns(np.bincount(g, weights=e, minlength=n_groups), "busy times"))

    def finish(self, final: np.ndarray, combos: pd.DataFrame):
        """(per_step, step table, per_combo, outside) as summarize builds them from one window; `final` maps
        registry combinations to rows of `combos`. The step table (step_table.StepCategories) holds the exclusive
        split always, and op time and counts when the totals were made with `step_categories`."""
        p = self.pairs
        dev = p.device.astype(np.int32)
        stp = p.step.astype(np.int64)
        order = np.lexsort((stp, dev))  # (device, step) sorted, as group_rows gives
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        c = {k: v[order] for k, v in p.cols.items()}
        n_groups = len(order)
        dev64 = dev.astype(np.int64)  # group_rows stacks (int32 device, int64 step) into int64 rows
        per_step = pd.DataFrame({
            "device": dev64[order] if n_groups else [], "step": stp[order] if n_groups else [],
            "start_ns": c["span_start"], "end_ns": c["span_end"], "span_ns": c["span_end"] - c["span_start"],
            "busy_ns": c["busy"], "op_ns": c["op_ns"], "kernels": c["kernels"],
        })
        table = self._step_table(order, rank, dev64[order], stp[order], combos)
        per_combo = self._per_combo(final)
        outside = {d: (ns_, cnt) for d, (ns_, cnt) in self.outside.items()}
        return per_step, table, per_combo, outside

    def _step_table(self, order, rank, dev_sorted, step_sorted, combos: pd.DataFrame) -> StepCategories:
        """The step table: rows in (device, step) order (`order`: pair id per row, `rank`: row per pair id),
        categories in the order of their first appearance in the final combos (pd.factorize, as summarize)."""
        _, cat_names = pd.factorize(combos["category"].to_numpy())
        code_of = {name: i for i, name in enumerate(cat_names)}
        column = np.array([code_of.get(name, 0) for name in self.cat_ids], dtype=np.int64)
        n_cols = len(cat_names)
        sums = self.cells.finish(order, column, n_cols) if self.step_categories else {}
        exclusive = np.zeros((len(order), n_cols), dtype=np.int64)
        has = np.zeros((len(order), n_cols), dtype=bool)
        names = list(self.cat_ids)
        tie = np.argsort(np.argsort(np.array(names, dtype=object), kind="stable"), kind="stable")  # rank by name
        for gid, cat, ns in self.exclusive.finish_runs(len(names), tie):  # a run of pairs at a time
            exclusive[rank[gid], column[cat]] = ns
            has[rank[gid], column[cat]] = True
        return StepCategories(device=dev_sorted, step=step_sorted, categories=[str(x) for x in cat_names],
                              ns=sums.get("ns"), count=sums.get("count"), exclusive_ns=exclusive, has_exclusive=has)

    def _per_combo(self, final: np.ndarray) -> pd.DataFrame:
        """device, combo, grid, block, gemm, ns, count: one row per (device, final combination, launch shape)."""
        parts = self.combo_parts
        if parts:
            cdev = np.concatenate([x[0] for x in parts]).astype(np.int32)
            creg = np.concatenate([final[x[1]] for x in parts])
            cns = np.concatenate([x[2] for x in parts])
            ccnt = np.concatenate([x[3] for x in parts])
            cgrid = np.concatenate([x[4] for x in parts])
            cblock = np.concatenate([x[5] for x in parts])
            cgemm = np.concatenate([x[6] for x in parts])
        else:
            cdev = np.zeros(0, dtype=np.int32)
            creg = cns = ccnt = cgrid = cblock = cgemm = np.zeros(0, dtype=np.int64)
        keys, group = group_rows(cdev, creg, cgrid, cblock, cgemm)
        ns = checked_ns(np.bincount(group, weights=cns, minlength=len(keys)))
        count = np.bincount(group, weights=ccnt, minlength=len(keys)).round().astype(np.int64)
        keep = count > 0
        return pd.DataFrame({"device": keys[keep, 0].astype(np.int32), "combo": keys[keep, 1], "grid": keys[keep, 2],
                             "block": keys[keep, 3], "gemm": keys[keep, 4], "ns": ns[keep], "count": count[keep]})

    def comm_ops(self, category_of_reg: np.ndarray):
        """(ops, step, category) holding the collectives inside steps and one stand-in op (no category) per
        (device, step) with work, which is all comm.collective_split reads; None without collectives."""
        if not self.comm:
            return None
        parts = {k: np.concatenate([w[k] for w in self.comm]) for k in self.comm[0]}
        dev = np.concatenate([parts["device"], self.pairs.device.astype(np.int32)])
        n = len(dev)
        zeros = np.zeros(n, dtype=np.int64)
        n_stand = len(self.pairs.device)
        start = np.concatenate([parts["start"], zeros[:n_stand]])
        ops = Ops(start=start, end=np.concatenate([parts["end"], zeros[:n_stand]]), device=dev, launch_key=zeros,
                  name_id=zeros.astype(np.int32), demangled_id=zeros.astype(np.int32), graph_node=zeros - 1,
                  stream=np.concatenate([parts["stream"], np.zeros(n_stand, dtype=np.int32)]),
                  kind=np.zeros(n, dtype=np.int8), launch_tid=zeros, launch_ns=zeros, launched=np.ones(n, bool))
        step = np.concatenate([parts["step"], self.pairs.step.astype(np.int64)])
        category = np.concatenate([category_of_reg[parts["reg"]], np.full(n_stand, "", dtype=object)])
        return ops, step, category
