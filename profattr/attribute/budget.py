"""The per-step time budget: for each GPU, how long a decode step takes and where that time goes.

Definitions (all per device, over the steps that launched work on it):
- span of a step: first start to last end of the GPU work launched in that step;
- `step_ms`: median span; `mean_step_ms`: mean span;
- busy: length of the union of the step's kernel and memory intervals (streams may overlap);
- `idle_ms_per_step` = mean span - mean busy (GPU waiting inside the step: launch gaps, syncs, CPU work);
- `overlap_ms_per_step` = mean summed op time - mean busy (time during which two streams ran at once);
  so `mean_step_ms = sum(category ms) - overlap + idle` holds exactly;
- category / kernel `ms_per_step`: summed durations over the steps, divided by the number of steps.

Optional views: `by="layer"` adds per-layer rows (layers.py); with collectives on two or more GPUs each device gets
a `comm` split into transfer and wait (comm.py); `mapping=CAPTURE` gives replayed graph kernels without a
capture-time NVTX context the context of their matching kernel in an eager capture (mapping.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from profattr.attribute.comm import collective_split
from profattr.attribute.graphs import STATUS_MAPPING, STATUS_NAMES, STATUS_UNPLACED, place_contexts
from profattr.attribute.nvtx import Ranges, enclosed, load_ranges
from profattr.attribute.steps import Steps, find_steps
from profattr.errors import ProfattrError
from profattr.regexguard import MAX_MATCH_CHARS
from profattr.taxonomy.classify import load_rules
from profattr.trace.ops import KIND_KERNEL, Ops, memop_name
from profattr.trace.source import open_trace

SCHEMA = "profattr.budget/1"
NS_PER_MS = 1e6


@dataclass
class Attribution:
    """Everything the budget knows per GPU op, for later stages (diff, layers, comm): parallel arrays."""

    ops: Ops
    step: np.ndarray  # step index per op, -1 outside every step
    combo: np.ndarray  # index into `combos` per op
    combos: pd.DataFrame  # one row per distinct (name, context): name, demangled, category, family
    steps: Steps
    ranges: Ranges
    context_method: str
    ctx_tid: np.ndarray | None = None  # per op: thread and time at which its NVTX context is read
    ctx_ns: np.ndarray | None = None
    status: np.ndarray | None = None  # per op: graphs.STATUS_* (how its context point was found)
    mask: np.ndarray | None = None  # per op: bit b set when an NVTX range matching context pattern b encloses it
    mapping: "Attribution | None" = None  # the eager mapping capture's attribution, when one was given
    mapped: np.ndarray | None = None  # per op: index of its matched op in `mapping.ops`, -1 when none
    mapping_report: dict | None = None
    names: np.ndarray | None = None  # per op: demangled name (filled when a mapping needed it)

    def category(self) -> np.ndarray:
        """Category id per op (object array)."""
        return self.combos["category"].to_numpy()[self.combo]

    def placement(self) -> dict:
        """How the ops inside steps got their NVTX context: op counts per method, plus mapping details."""
        inside = self.step >= 0
        status = self.status[inside] if self.status is not None else np.zeros(int(inside.sum()), dtype=np.int8)
        out = {name: int((status == code).sum()) for code, name in STATUS_NAMES.items()}
        out["mapping_capture"] = self.mapping_report
        unplaced = out["unplaced"]
        out["hint"] = None
        if unplaced and self.mapping_report is None:
            out["hint"] = (f"{unplaced} replayed graph ops have no NVTX context (their graph was captured outside "
                           "the profiled window or without NVTX ranges), so their layer and NVTX-context categories "
                           "are unknown; pass --mapping EAGER_CAPTURE (the same workload captured eagerly, with "
                           "the same NVTX ranges)")
        return out


@dataclass
class Budget:
    path: str
    nsys_version: str | None
    schema_version: str | None
    gpus: list
    steps_source: str
    steps_reason: str
    steps_count: int
    devices: list  # list of dicts, see to_dict()
    per_step: pd.DataFrame  # device, step, start_ns, end_ns, span_ns, busy_ns, op_ns, kernels
    per_step_category: pd.DataFrame  # device, step, category, ns, count
    attribution: Attribution | None = field(default=None, repr=False)
    context_method: str = "launch"
    nvtx_placement: dict | None = None  # ops per context method (Attribution.placement)
    comm: dict | None = None  # ranks, steps compared, slowest rank per step (comm.py); None with < 2 ranks
    per_step_comm: pd.DataFrame | None = None  # device, step, category, collective_ns, wait_ns
    layer_pattern: str | None = None  # set when per-layer rows were computed
    format: str = "nsys"  # the reader: nsys (SQLite export) or torch (torch-profiler trace)
    tool_version: str | None = None
    steps_excluded: dict = field(default_factory=dict)
    skipped_rows: dict = field(default_factory=dict)  # {table: {reason: rows, "rows": total}} (trace/validate.py)

    def to_dict(self) -> dict:
        out = {
            "schema": SCHEMA,
            "capture": {"path": self.path, "format": self.format, "nsys_version": self.nsys_version,
                        "export_schema_version": self.schema_version, "profiler_version": self.tool_version,
                        "gpus": self.gpus},
            "steps": {"source": self.steps_source, "count": self.steps_count, "reason": self.steps_reason,
                      "excluded": self.steps_excluded},
            "nvtx_context": self.context_method,
            "devices": self.devices,
        }
        if self.skipped_rows:
            out["capture"]["skipped_rows"] = self.skipped_rows
        if self.nvtx_placement is not None:
            out["nvtx_placement"] = self.nvtx_placement
        if self.layer_pattern is not None:
            out["layer_pattern"] = self.layer_pattern
        if self.comm is not None:
            out["comm"] = self.comm
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def compute_budget(path, steps: str = "auto", rules: Sequence = (), force: bool = False,
                   keep_attribution: bool = False, mapping=None, by: str = "category",
                   layer_range: str | None = None, skip_steps=None) -> Budget:
    """Read a capture (.sqlite, .nsys-rep exported on demand, or torch-profiler traces) and compute its per-step
    budget.

    `mapping`: an eager capture of the same workload whose NVTX context is lent to replayed graph ops that have
    none (mapping.py). `by="layer"` adds per-layer rows to every device (`layer_range`: the layer regex).
    `skip_steps`: leave out the first N steps of each thread, or "auto" the slow start the steady-state test
    finds (attribute/steady.py); the budget says what it left out.
    """
    if by not in ("category", "layer"):
        raise ProfattrError(f"--by {by!r}: expected category or layer")
    ruleset = load_rules(rules)
    source = None
    if mapping is not None:
        source = _mapping_attribution(mapping, steps, ruleset, force)
    with open_trace(path, force=force) as export:
        budget = budget_of(export, steps, ruleset, mapping=source, skip_steps=skip_steps)
    attribution = budget.attribution
    if by == "layer" or layer_range is not None:
        add_layers(budget, attribution, layer_range)
    if not keep_attribution:
        budget.attribution = None
    return budget


def budget_of(export, steps: str = "auto", ruleset=None, mapping: "Attribution | None" = None,
              skip_steps=None) -> Budget:
    """The budget of an open reader (trace/source.py open_trace), keeping its attribution."""
    attribution = attribute(export, steps, ruleset if ruleset is not None else load_rules(()), mapping=mapping)
    budget = summarize(export, attribution)
    if skip_steps not in (None, 0, "0"):
        leading = _leading_to_skip(budget, skip_steps)
        if leading:
            how = "auto: the slow start the steady-state test found" if skip_steps == "auto" else "--skip-steps"
            attribution = skip_leading_steps(attribution, leading, f"first {leading} step(s) of each thread ({how})")
            budget = summarize(export, attribution)
    claims = getattr(export, "claims", None)
    _require_work(export, budget, attribution, claims)
    budget.attribution = attribution
    if claims is not None:
        budget.skipped_rows = {t: dict(r) for t, r in claims.skipped.items()}
        claims.warn()
    return budget


def _require_work(export, budget: Budget, att: Attribution, claims) -> None:
    """One clear error when there is nothing to budget: no GPU work in the capture, or none inside its steps."""
    if budget.devices:
        return
    damaged = f" (and {claims.total()} damaged row(s) were skipped)" if claims is not None and claims.total() else ""
    if len(att.ops) == 0:
        raise ProfattrError(f"{export.path}: no GPU work in the capture: no kernel, memcpy or memset rows{damaged}; "
                            "capture with `--trace=cuda` (and `--cuda-graph-trace=node`)")
    raise ProfattrError(f"{export.path}: no GPU work in its steps: none of its {len(att.ops)} GPU ops was launched "
                        f"inside one of the {len(att.steps)} steps ({att.steps.source}){damaged}; try --steps whole, "
                        "or --steps nvtx:NAME with a range that encloses the launches")


def _leading_to_skip(budget: Budget, skip_steps) -> int:
    if skip_steps == "auto":
        from profattr.attribute.steady import steady_state

        found = [steady_state(budget.per_step.loc[budget.per_step["device"] == d["device"]]
                              .sort_values("start_ns")["span_ns"].to_numpy()).warmup_steps for d in budget.devices]
        return max(found, default=0)
    try:
        n = int(skip_steps)
    except (TypeError, ValueError):
        raise ProfattrError(f"--skip-steps {skip_steps!r}: expected a number of steps or auto") from None
    if n < 0:
        raise ProfattrError(f"--skip-steps must be 0 or more (got {n})")
    if n >= len(budget.attribution.steps if budget.attribution else []) and n:
        raise ProfattrError(f"--skip-steps {n} leaves no step: the capture has "
                            f"{budget.steps_count} steps")
    return n


def skip_leading_steps(att: Attribution, n: int, what: str) -> Attribution:
    """The attribution without the first `n` steps of each thread (their ops count as outside the steps)."""
    st = att.steps
    keep = np.ones(len(st), dtype=bool)
    for tid in np.unique(st.tid):
        idx = np.flatnonzero(st.tid == tid)
        keep[idx[np.argsort(st.start[idx], kind="stable")][:n]] = False
    remap = np.full(len(st) + 1, -1, dtype=np.int64)
    remap[np.flatnonzero(keep)] = np.arange(int(keep.sum()))
    step = remap[att.step]  # -1 stays -1 (the extra last slot)
    return replace(att, steps=st.keep(keep, what), step=step)


def _mapping_attribution(mapping, steps: str, ruleset, force: bool) -> Attribution:
    """The mapping capture's attribution (its steps: the same NVTX range when one was named, else auto)."""
    with open_trace(mapping, force=force) as export:
        att = attribute(export, steps if steps.startswith("nvtx") else "auto", ruleset)
        if len(att.ranges) == 0:
            raise ProfattrError(f"--mapping {mapping}: this capture has no NVTX ranges, so it cannot lend any; "
                                "give an eager capture of the same workload recorded with NVTX (for SGLang: "
                                "--enable-layerwise-nvtx-marker --disable-cuda-graph)")
        from profattr.attribute.mapping import op_names

        att.names = op_names(export, att.ops)
        att.mapping_report = {"capture": str(mapping)}
    return att


def attribute(export, steps_spec: str, ruleset, mapping: Attribution | None = None) -> Attribution:
    """Link every GPU op to its step and its category (and, with `mapping`, borrow missing NVTX contexts).
    `export` is any reader (trace/source.py open_trace)."""
    ops = export.ops()
    ranges = load_ranges(export)
    steps = find_steps(export, steps_spec, ranges, ops)
    step = steps.assign(ops.launch_tid, ops.launch_ns, ops.launched)
    placement = place_contexts(export, ops, ranges)
    patterns = list(ruleset.context_patterns)
    mask = context_mask(ranges, patterns, placement.tid, placement.t_ns)
    status, method = placement.status, placement.method
    mapped, report, names = None, None, None
    if mapping is not None:
        from profattr.attribute.mapping import match_ops, op_names, steps_by_device

        names = op_names(export, ops)
        result = match_ops(names, steps_by_device(ops, step, steps.start), mapping.names,
                           steps_by_device(mapping.ops, mapping.step, mapping.steps.start),
                           mapping.mapping_report["capture"], len(ops))
        mapped = result.source
        # borrow only where this capture has no context of its own, and the matched op had one in the mapping
        usable = mapped >= 0
        usable[usable] = mapping.status[mapped[usable]] != STATUS_UNPLACED
        take = (status == STATUS_UNPLACED) & usable
        mask[take] = mapping.mask[mapped[take]]
        status = status.copy()
        status[take] = STATUS_MAPPING
        report = result.to_dict()
        inside = step >= 0
        method = (f"mapping capture {result.path}: {int((take & inside).sum())} replayed ops placed by their order "
                  f"within the step, {result.name_mismatches} of {result.ops_compared} ops without a same-named "
                  f"match, {int(((status == STATUS_UNPLACED) & inside).sum())} unplaced")
    combo, combos = classify_masks(export, ops, mask, patterns, ruleset)
    return Attribution(ops=ops, step=step, combo=combo, combos=combos, steps=steps, ranges=ranges,
                       context_method=method, ctx_tid=placement.tid, ctx_ns=placement.t_ns, status=status,
                       mask=mask, mapping=mapping, mapped=mapped, mapping_report=report, names=names)


def context_mask(ranges: Ranges, patterns: Sequence[str], ctx_tid, ctx_ns) -> np.ndarray:
    """Per op, bit b set when an NVTX range whose text matches patterns[b] encloses its context point."""
    mask = np.zeros(len(ctx_ns), dtype=np.int64)
    frame = ranges.frame
    texts = frame["text"].astype(str).str.slice(0, MAX_MATCH_CHARS) if len(frame) else None  # regexguard.py
    for bit, pattern in enumerate(patterns):
        sel = frame[texts.str.contains(pattern, regex=True)] if len(frame) else frame
        if len(sel):
            hit = enclosed(sel["tid"].to_numpy(), sel["start"].to_numpy(), sel["end"].to_numpy(), ctx_tid, ctx_ns)
            mask |= hit.astype(np.int64) << bit
    return mask


def classify_masks(export, ops: Ops, mask: np.ndarray, patterns: Sequence[str], ruleset):
    """(combo per op, combos frame) from each op's context bits (see context_mask)."""
    uniq, combo = group_rows(ops.demangled_id, ops.name_id, mask)
    strings = export.strings(np.concatenate([uniq[:, 0], uniq[:, 1]]))
    rows = []
    for dem_id, short_id, m in uniq:
        if dem_id < 0:  # memory op
            name = memop_name(int(dem_id))
            rows.append((name, name, "memory.set" if dem_id == -100 else "memory.copy", "cuda_memory"))
            continue
        demangled = strings.get(int(dem_id)) or strings.get(int(short_id)) or f"<string {dem_id}>"
        short = strings.get(int(short_id)) or demangled
        contexts = frozenset(p for b, p in enumerate(patterns) if (int(m) >> b) & 1)
        rule = ruleset.match(demangled, contexts)
        if rule is None and short != demangled:
            rule = ruleset.match(short, contexts)
        rows.append((short, demangled, rule.category if rule else "unclassified",
                     (rule.family or "") if rule else ""))
    combos = pd.DataFrame(rows, columns=["name", "demangled", "category", "family"])
    return combo, combos


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


def _spans_and_busy(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int):
    """Per group: first start, last end, and the length of the union of its intervals.

    Vectorised: sort by (group, start), running maximum of the ends; working arrays are reused in place because
    this runs over millions of ops.
    """
    if len(start) == 0:
        z = np.zeros(n_groups, dtype=np.int64)
        return z, z.copy(), z.copy()
    origin = int(start.min())
    width = int(end.max()) - origin + 1
    order = np.lexsort((start, group))
    g = group[order]
    bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    s = start[order]
    span_start = s[bounds]
    e = end[order]
    span_end = np.maximum.reduceat(e, bounds)
    del order
    # shift each group above the previous one so a single running maximum never mixes groups
    offset = (g * width) - origin
    s += offset
    e += offset
    del offset
    prev = np.maximum.accumulate(e)
    prev[1:] = prev[:-1].copy()
    prev[0] = s[0] - 1
    np.maximum(s, prev, out=s)
    del prev
    e -= s
    np.clip(e, 0, None, out=e)
    busy = np.bincount(g, weights=e, minlength=n_groups).round().astype(np.int64)
    return span_start, span_end, busy


def _sum_count(key: np.ndarray, weights: np.ndarray, size: int):
    """Per key in range(size): summed weights (ns, int64) and counts."""
    return (np.bincount(key, weights=weights, minlength=size).round().astype(np.int64),
            np.bincount(key, minlength=size).astype(np.int64))


def summarize(export, att: Attribution) -> Budget:
    ops, step = att.ops, att.step
    inside = step >= 0
    # usually every op is inside a step: then work on views, not copies, of the op arrays
    sel = slice(None) if inside.all() else inside
    dev = ops.device[sel]
    start, end = ops.start[sel], ops.end[sel]
    dur = end - start
    combo = att.combo[sel]
    # one group per (device, step)
    pairs, group = group_rows(dev, step[sel])
    n_groups = len(pairs)
    span_start, span_end, busy = _spans_and_busy(group, start, end, n_groups)
    del start, end
    op_ns, _ = _sum_count(group, dur, n_groups)
    per_step = pd.DataFrame({
        "device": pairs[:, 0] if n_groups else [], "step": pairs[:, 1] if n_groups else [],
        "start_ns": span_start, "end_ns": span_end, "span_ns": span_end - span_start, "busy_ns": busy,
        "op_ns": op_ns,
        "kernels": np.bincount(group, weights=ops.kind[sel] == KIND_KERNEL, minlength=n_groups).astype(np.int64),
    })
    # per (device, step, category) and per (device, combo): integer keys and bincount, no frame of all ops
    cat_codes, cat_names = pd.factorize(att.combos["category"].to_numpy())
    n_cats = max(len(cat_names), 1)
    ns, count = _sum_count(group * n_cats + cat_codes[combo], dur, n_groups * n_cats)
    g_idx, c_idx = np.divmod(np.flatnonzero(count), n_cats)
    per_step_category = pd.DataFrame({"device": pairs[g_idx, 0] if n_groups else [],
                                      "step": pairs[g_idx, 1] if n_groups else [],
                                      "category": np.asarray(cat_names, dtype=object)[c_idx],
                                      "ns": ns[count > 0], "count": count[count > 0]})
    devices_all, dev_idx = np.unique(dev, return_inverse=True)
    n_combos = len(att.combos)
    ns, count = _sum_count(dev_idx.reshape(-1) * n_combos + combo, dur, len(devices_all) * n_combos)
    d_idx, k_idx = np.divmod(np.flatnonzero(count), n_combos)
    per_combo = pd.DataFrame({"device": devices_all[d_idx], "combo": k_idx, "ns": ns[count > 0],
                              "count": count[count > 0]})
    del dur, combo, group

    # work outside every step, per device (reported so nothing silently disappears)
    outside = pd.DataFrame({"device": ops.device[~inside], "dur": ops.duration_ns[~inside]})
    outside = outside.groupby("device")["dur"].agg(ns="sum", count="size")

    devices = []
    for device in sorted(set(per_step["device"].tolist())):
        d_steps = per_step[per_step["device"] == device]
        n = len(d_steps)
        combos = per_combo[per_combo["device"] == device].merge(att.combos, left_on="combo", right_index=True)
        total_op_ns = float(combos["ns"].sum())
        kernels = (combos.groupby(["name", "demangled", "category", "family"], sort=False)[["ns", "count"]]
                   .sum().reset_index().sort_values("ns", ascending=False))
        cats = (combos.groupby("category")[["ns", "count"]].sum().reset_index()
                .sort_values("ns", ascending=False))
        uncl_ns = float(cats.loc[cats["category"] == "unclassified", "ns"].sum())
        mean_span = float(d_steps["span_ns"].mean()) / NS_PER_MS
        mean_busy = float(d_steps["busy_ns"].mean()) / NS_PER_MS
        kernel_only = kernels[~kernels["category"].str.startswith("memory.")]
        devices.append({
            "device": int(device),
            "steps": n,
            "step_ms": float(np.median(d_steps["span_ns"].to_numpy())) / NS_PER_MS,
            "mean_step_ms": mean_span,
            "busy_ms_per_step": mean_busy,
            "idle_ms_per_step": mean_span - mean_busy,
            "overlap_ms_per_step": total_op_ns / n / NS_PER_MS - mean_busy,
            "kernels_per_step": float(kernel_only["count"].sum()) / n,
            "memops_per_step": float(kernels["count"].sum() - kernel_only["count"].sum()) / n,
            "categories": [{"category": r.category, "ms_per_step": r.ns / n / NS_PER_MS,
                            "count_per_step": r.count / n} for r in cats.itertuples()],
            "kernels": [{"name": r.name, "demangled": r.demangled, "category": r.category, "family": r.family,
                         "ms_per_step": r.ns / n / NS_PER_MS, "count_per_step": r.count / n}
                        for r in kernels.itertuples()],
            "unclassified_share": uncl_ns / total_op_ns if total_op_ns else 0.0,
            "outside_steps": {"ops": int(outside["count"].get(device, 0)),
                              "ms": float(outside["ns"].get(device, 0)) / NS_PER_MS},
        })
    budget = Budget(path=str(export.path), nsys_version=export.nsys_version,
                    schema_version=export.schema_version, gpus=export.gpus, steps_source=att.steps.source,
                    steps_reason=att.steps.reason, steps_count=len(att.steps), devices=devices, per_step=per_step,
                    format=export.format, tool_version=export.tool_version, steps_excluded=dict(att.steps.excluded),
                    per_step_category=per_step_category, context_method=att.context_method,
                    nvtx_placement=att.placement() if att.status is not None else None)
    add_comm(budget, att)
    return budget


def _steps_per_device(budget: Budget) -> dict:
    return {d["device"]: d["steps"] for d in budget.devices}


def add_comm(budget: Budget, att: Attribution) -> None:
    """Per device `comm` (transfer / wait split of collectives) when two or more GPUs run collectives."""
    split = collective_split(att.ops, att.step, att.steps.start, att.category(), _steps_per_device(budget))
    if split is None:
        return
    per_device, summary, frame = split
    for d in budget.devices:
        if d["device"] in per_device:
            d["comm"] = per_device[d["device"]]
    budget.comm = summary
    budget.per_step_comm = frame


def add_layers(budget: Budget, att: Attribution, layer_range: str | None = None) -> None:
    """Per device `layers` rows (layers.py); ops in no layer range form the `layer: None` row."""
    from profattr.attribute.layers import DEFAULT_LAYER_PATTERN, layer_rows, op_layers

    labels = op_layers(att, layer_range)
    rows = layer_rows(att, labels, att.category(), _steps_per_device(budget))
    for d in budget.devices:
        d["layers"] = rows.get(d["device"], [])
    budget.layer_pattern = layer_range if layer_range is not None else DEFAULT_LAYER_PATTERN
