"""Attribute the step-time difference between two captures, or two groups of replicate captures (B - A), to
categories, kernel families and idle time.

Per device the components add up exactly to the change of `step_ms` (the median step span):

    step_ms = sum(category exclusive ms/step) + idle + (median - mean span)

so   delta(step_ms) = sum(delta category exclusive) + delta(idle) + delta(median - mean).

A category's component is the change of its exclusive time (its part of the busy time, budget.py): its own change.
The change of its overlapped time (its op time that ran alongside other categories, e.g. slowed by work on another
stream) is contention, reported in its row (`contention_ms_per_step`) and in no component: its family parts
(diff_parts.py) describe its op time change (`op_delta_ms_per_step`), so with `moved_to_overlap_ms` (minus the
contention) and `moved_to_comm_wait_ms` they close on its delta. A budget JSON from before exclusive time
has only op time: its components are then the categories' op time and `overlap` (minus the device's overlap).

With collectives on two or more GPUs (budget `comm`), the time a rank spent waiting for the slowest rank is split
out of the comm categories into its own component `comm_wait` (the categories keep their transfer part), so the
components still add up exactly. A side of several replicates is their mean (every budget figure averaged; the
identity above holds for each, so for the mean). Each category's change is split per kernel family into added,
removed, and count and duration effects (diff_parts.py). Intervals and the practical threshold: diff_stats.py.
"""
from __future__ import annotations

import glob
import json
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from profattr import progress
from profattr.attribute.budget import Budget, compute_budget
from profattr.attribute.shapes import mean_shapes
from profattr.attribute.step_table import StepCategories
from profattr.attribute.diff_parts import family_split, fingerprint, kernel_rows, layer_rows
from profattr.attribute.diff_stats import (COMM_WAIT, WINDOWS_FOR_VARIANCE, bootstrap, coverage, is_change, levels,
                                           practical_ms)
from profattr.attribute.verdict import decide
from profattr.errors import ProfattrError
from profattr.attribute.confounds import compare_runs
from profattr.run_record import RunRecord, or_empty
from profattr.trace.reader import run_json_path

SCHEMA = "profattr.diff/1"
BOOTSTRAP_SAMPLES = 2000
SEED = 20261130
GLOB_CHARS = set("*?[")


@dataclass
class Side:
    """One capture's budget, and its per-step tables when computed from a capture (not from JSON); with
    replicates, the group's mean budget and the replicates themselves."""

    path: str
    budget: dict
    per_step: pd.DataFrame | None
    per_step_category: StepCategories | None  # step_table.py
    run: RunRecord | None
    per_step_comm: pd.DataFrame | None = None  # device, step, category, collective_ns, wait_ns
    replicates: list = field(default_factory=list)  # the Sides a group averages ([] for one capture)

    @property
    def members(self) -> list:
        return self.replicates or [self]


def expand(spec) -> list:
    """The captures a diff argument names: the path itself, or every match of a glob pattern (sorted)."""
    text = str(spec)
    if GLOB_CHARS & set(text) and not Path(text).exists():
        found = sorted(glob.glob(text))
        if not found:
            raise ProfattrError(f"{text}: no capture matches this pattern")
        return found
    return [text]


def load_sides(a, b, steps: str = "auto", rules: Sequence = (), mapping_a=None, mapping_b=None,
               by: str = "category", layer_range: str | None = None, skip_steps=None) -> tuple:
    """Both sides of a diff (a path, a glob, or a list of replicate paths each). Captures are read in parallel
    processes when the machine has the cores (each budget is independent); a capture named twice (an A/A diff of a
    file with itself: the noise floor) is read once."""
    group_a = [p for x in (a if isinstance(a, (list, tuple)) else [a]) for p in expand(x)]
    group_b = [p for x in (b if isinstance(b, (list, tuple)) else [b]) for p in expand(x)]
    jobs = [(p, steps, tuple(rules), mapping_a, by, layer_range, skip_steps) for p in group_a]
    jobs += [(p, steps, tuple(rules), mapping_b, by, layer_range, skip_steps) for p in group_b]
    unique: list = []
    slot = []
    for job in jobs:
        k = next((i for i, u in enumerate(unique) if u[1:] == job[1:] and _same_file(u[0], job[0])), None)
        if k is None:
            unique.append(job)
            k = len(unique) - 1
        slot.append(k)
    loaded = None
    if len(unique) > 1 and all(not str(j[0]).endswith(".json") for j in unique) and (os.cpu_count() or 1) >= 2:
        try:
            with ProcessPoolExecutor(max_workers=min(len(unique), os.cpu_count() or 2)) as pool:
                futures = [pool.submit(load_side, *j) for j in unique]
                loaded = [f.result() for f in futures]
        except (OSError, BrokenProcessPool):
            loaded = None  # no worker processes here (sandboxes, limits): read them one after the other
    if loaded is None:
        loaded = [load_side(*j) for j in unique]
    sides = [loaded[k] if jobs[n][0] == unique[k][0] else
             Side(str(jobs[n][0]), loaded[k].budget, loaded[k].per_step, loaded[k].per_step_category, loaded[k].run,
                  loaded[k].per_step_comm) for n, k in enumerate(slot)]
    return group(sides[:len(group_a)]), group(sides[len(group_a):])


def _same_file(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or os.path.samefile(a, b)
    except OSError:
        return False


def load_side(path, steps: str = "auto", rules: Sequence = (), mapping=None, by: str = "category",
              layer_range: str | None = None, skip_steps=None) -> Side:
    """A capture (.sqlite / .nsys-rep / torch traces) or a budget JSON file written by `profattr budget --format
    json`. `mapping`, `by`, `layer_range`, `skip_steps`: as in budget.compute_budget."""
    p = Path(path)
    run = _run_json(p)
    if mapping is not None and p.suffix == ".json" and not p.name.endswith(".trace.json"):
        raise ProfattrError(f"{p}: --mapping applies to captures, not to budget JSON files")
    if p.suffix == ".json" and p.is_file() and _is_budget_json(p):
        from profattr import inputs

        text = inputs.read_text(p, "a capture or a budget JSON (`profattr budget --format json`)")
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ProfattrError(f"{p}: not a readable budget JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != "profattr.budget/1":
            schema = data.get("schema") if isinstance(data, dict) else None
            raise ProfattrError(f"{p}: not a profattr budget (schema {schema!r}); write one with "
                                "`profattr budget CAPTURE --format json`")
        return Side(str(p), data, None, None, run)
    b: Budget = compute_budget(p, steps=steps, rules=rules, mapping=mapping, by=by, layer_range=layer_range,
                               skip_steps=skip_steps)
    return Side(str(p), b.to_dict(), b.per_step, b.per_step_category, run, b.per_step_comm)


def _is_budget_json(p: Path) -> bool:
    """A budget JSON (written by `profattr budget --format json`), as opposed to a torch-profiler trace."""
    with p.open("rb") as fh:
        head = fh.read(4096)
    if b'"traceEvents"' in head:
        return False
    if b'"schema"' in head and b"profattr.budget/" not in head:
        raise ProfattrError(f"{p}: not a profattr budget; write one with `profattr budget CAPTURE --format json`")
    return True


def _run_json(p: Path) -> RunRecord | None:
    """The run.json beside a capture (validated: one that cannot be trusted is an error), or None."""
    from profattr import run_record

    return run_record.optional(run_json_path(p))


def group(sides: list) -> Side:
    """One side from replicates: itself for one capture, else their mean budget (devices all of them ran)."""
    if len(sides) == 1:
        return sides[0]
    budgets = [s.budget for s in sides]
    common = set.intersection(*[{d["device"] for d in b["devices"]} for b in budgets])
    devices = [_mean_device([next(d for d in b["devices"] if d["device"] == dev) for b in budgets])
               for dev in sorted(common)]
    first = budgets[0]
    merged = dict(first, devices=devices,
                  capture=dict(first["capture"], path=[s.path for s in sides]),
                  steps=dict(first["steps"], count=sum(b["steps"]["count"] for b in budgets),
                             replicates=len(sides)))
    return Side(f"{len(sides)} replicates: " + ", ".join(Path(s.path).name for s in sides), merged, None, None,
                sides[0].run, replicates=list(sides))


SCALARS = ("step_ms", "mean_step_ms", "busy_ms_per_step", "idle_ms_per_step", "overlap_ms_per_step",
           "kernels_per_step", "memops_per_step", "unclassified_share")


EXCLUSIVE_FIELDS = ("exclusive_ms_per_step", "overlapped_ms_per_step", "share")


def _mean_rows(rows_per_replicate: list, key, fields=("ms_per_step", "count_per_step")) -> list:
    n = len(rows_per_replicate)
    acc: dict = {}
    order: list = []
    for rows in rows_per_replicate:
        for r in rows:
            k = key(r)
            if k not in acc:
                acc[k] = dict(r, **{f: 0.0 for f in fields})
                order.append(k)
            for f in fields:
                acc[k][f] += r[f] / n
    return sorted((acc[k] for k in order), key=lambda r: -r[fields[0]])


def _mean_device(ds: list) -> dict:
    n = len(ds)
    out = {"device": ds[0]["device"], "steps": sum(d["steps"] for d in ds), "replicates": n}
    for f in SCALARS:
        out[f] = sum(d[f] for d in ds) / n
    if all("idle_share" in d for d in ds):
        out["idle_share"] = sum(d["idle_share"] for d in ds) / n
    fields = ("ms_per_step", "count_per_step")
    if all(f in c for d in ds for c in d["categories"] for f in EXCLUSIVE_FIELDS):
        fields += EXCLUSIVE_FIELDS
    out["categories"] = _mean_rows([d["categories"] for d in ds], lambda r: r["category"], fields)
    out["kernels"] = _mean_rows([d["kernels"] for d in ds], lambda r: (r["name"], r["demangled"], r["category"],
                                                                        r.get("family")))
    short = mean_shapes(ds, out["kernels"])  # each kernel row's launch shapes, and the short kernels, too
    if short is not None:
        out["short_kernels"] = short
    if all(d.get("comm") for d in ds):
        comm = {f: sum(d["comm"][f] for d in ds) / n
                for f in ("collective_ms_per_step", "transfer_ms_per_step", "wait_ms_per_step")}
        comm["by_category"] = _mean_rows([d["comm"]["by_category"] for d in ds], lambda r: r["category"],
                                         ("collective_ms_per_step", "wait_ms_per_step"))
        out["comm"] = comm
    if all(d.get("layers") is not None for d in ds):
        out["layers"] = _mean_rows([d["layers"] for d in ds], lambda r: r["layer"])
    return out


def compute_diff(a: Side, b: Side, samples: int = BOOTSTRAP_SAMPLES, changed: str | None = None,
                 min_windows: int = WINDOWS_FOR_VARIANCE) -> dict:
    """The diff dict (`profattr.diff/1`). `changed` names the category family the user changed between the two
    sides (e.g. `moe`); by default `moe` when the two run.json files name different backends. `min_windows`: the
    windows per side below which no change is established (verdict.py)."""
    devices_a = [d["device"] for d in a.budget["devices"]]
    devices_b = [d["device"] for d in b.budget["devices"]]
    for side, devices in ((a, devices_a), (b, devices_b)):
        if not devices:
            raise ProfattrError(f"{side.path}: no GPU work in its steps; nothing to compare")
    # match devices by id; when the two captures used different ids, by order
    pairs = ([(d, d) for d in devices_a if d in devices_b] if set(devices_a) & set(devices_b)
             else list(zip(devices_a, devices_b)))
    rng = np.random.default_rng(SEED)
    out_devices = [_device_diff(a, b, da, db, rng, samples) for da, db in pairs]
    result = {
        "schema": SCHEMA,
        "a": {"path": a.path, "steps": a.budget["steps"], "backend": or_empty(a.run).recorded("backend"),
              "replicates": len(a.members), "levels": levels(a.members)},
        "b": {"path": b.path, "steps": b.budget["steps"], "backend": or_empty(b.run).recorded("backend"),
              "replicates": len(b.members), "levels": levels(b.members)},
        "devices": out_devices,
    }
    result["interval"] = coverage(result["a"]["levels"], result["b"]["levels"])
    if changed is None and a.run and b.run and a.run.recorded("backend") != b.run.recorded("backend"):
        changed = "moe"
    result["changed"] = changed
    result["warnings"] = (backend_warnings(result, a.run, b.run)
                          + (same_kernel_warnings(result, changed) if changed else []))
    result["confounds"] = compare_runs(a.run, b.run)
    decide(result, min_windows)
    result["summary"] = summary(result)
    return result


BACKEND_KEYS = (("moe_runner_backend", "MoE runner"), ("fp4_gemm_runner_backend", "FP4 GEMM backend"),
                ("fp8_gemm_runner_backend", "FP8 GEMM backend"))
BACKEND_CATEGORIES = ("moe.gemm", "gemm.")  # the kernels a backend choice switches: expert and dense GEMMs


def _backends(run: RunRecord | None) -> dict:
    """{server arg: backend} a side ran with: what the server resolved (its log), else what was asked for."""
    run = or_empty(run)
    resolved = run.resolved
    out = {k: resolved.get(k) for k, _ in BACKEND_KEYS if resolved.get(k)}
    if "moe_runner_backend" not in out and run.backend_sglang:
        out["moe_runner_backend"] = run.backend_sglang
    return out


def backend_warnings(result: dict, run_a: RunRecord | None, run_b: RunRecord | None) -> list:
    """First of all: two sides that name different backends but ran the same expert and dense GEMM kernel
    families are not a backend comparison (a refused or `auto`-resolved backend, or one that falls back)."""
    ba, bb = _backends(run_a), _backends(run_b)
    differ = [(label, ba[k], bb[k]) for k, label in BACKEND_KEYS if k in ba and k in bb and ba[k] != bb[k]]
    if not differ:
        return []
    out = []
    for d in result["devices"]:
        cats = {c: f for c, f in d["fingerprint"].items() if c.startswith(BACKEND_CATEGORIES)}
        if cats and all(not f["only_a"] and not f["only_b"] for f in cats.values()):
            fams = sorted({x for f in cats.values() for x in f["both"]})
            names = "; ".join(f"{label} {x} in A, {y} in B" for label, x, y in differ)
            out.append(f"not a backend comparison: the runs name different backends ({names}) but GPU {d['device']} "
                       f"ran the same MoE and GEMM kernels in both ({', '.join(fams[:6])}"
                       f"{'...' if len(fams) > 6 else ''}); the backends resolved to the same kernels")
    return out


def same_kernel_warnings(result: dict, changed: str) -> list:
    """A loud warning when the categories the user changed ran the very same kernel families in A and B."""
    warnings = []
    for d in result["devices"]:
        cats = {c: f for c, f in d["fingerprint"].items() if c == changed or c.startswith(changed + ".")}
        if cats and all(not f["only_a"] and not f["only_b"] for f in cats.values()):
            fams = sorted({x for f in cats.values() for x in f["both"]})
            warnings.append(f"GPU {d['device']}: the {changed} kernels are the same in A and B "
                            f"({', '.join(fams[:4])}{'...' if len(fams) > 4 else ''}): the change did not switch "
                            f"{changed} kernels, so a {changed} difference is not the cause")
    return warnings


def has_exclusive(d: dict) -> bool:
    """Whether a device budget has exclusive time per category (budgets from before it have only op time)."""
    return all("exclusive_ms_per_step" in c for c in d["categories"])


def components_of(d: dict, exclusive: bool | None = None) -> dict:
    """Component values (ms/step) whose sum is step_ms: categories' exclusive time (`exclusive`, by default when
    the budget has it), else their op time and minus the overlap."""
    exclusive = has_exclusive(d) if exclusive is None else exclusive
    key = "exclusive_ms_per_step" if exclusive else "ms_per_step"
    comp = {f"category:{c['category']}": c[key] for c in d["categories"]}
    comm = d.get("comm")
    if comm:
        for c in comm["by_category"]:
            comp[f"category:{c['category']}"] = comp.get(f"category:{c['category']}", 0.0) - c["wait_ms_per_step"]
        comp[COMM_WAIT] = comm["wait_ms_per_step"]
    comp["idle"] = d["idle_ms_per_step"]
    if not exclusive:
        comp["overlap"] = -d["overlap_ms_per_step"]
    comp["step_variability"] = d["step_ms"] - d["mean_step_ms"]
    return comp


def _op_of(d: dict, cat: str) -> float:
    return next((c["ms_per_step"] for c in d["categories"] if c["category"] == cat), 0.0)


def _overlapped_of(d: dict, cat: str) -> float:
    return next((c.get("overlapped_ms_per_step", 0.0) for c in d["categories"] if c["category"] == cat), 0.0)


def _wait_of(d: dict, cat: str) -> float:
    return next((c["wait_ms_per_step"] for c in (d.get("comm") or {}).get("by_category", [])
                 if c["category"] == cat), 0.0)


def _device_diff(a: Side, b: Side, da: int, db: int, rng, samples: int) -> dict:
    A = next(d for d in a.budget["devices"] if d["device"] == da)
    B = next(d for d in b.budget["devices"] if d["device"] == db)
    exclusive = has_exclusive(A) and has_exclusive(B)  # both sides split the same way, or neither
    ca, cb = components_of(A, exclusive), components_of(B, exclusive)
    names = sorted(set(ca) | set(cb), key=lambda n: (-abs(cb.get(n, 0.0) - ca.get(n, 0.0)), n))
    delta_step = B["step_ms"] - A["step_ms"]
    threshold = practical_ms(A["step_ms"])
    with progress.stage(f"bootstrap, {samples} resamples"):
        boot = bootstrap(a.members, b.members, da, db, sorted(names), rng, samples)
    components = []
    for name in names:
        delta = cb.get(name, 0.0) - ca.get(name, 0.0)
        row = {"component": name, "a_ms_per_step": ca.get(name, 0.0), "b_ms_per_step": cb.get(name, 0.0),
               "delta_ms_per_step": delta}
        if name.startswith("category:"):
            cat = name.split(":", 1)[1]
            split = family_split(A, B, cat)
            # a comm category's component is its transfer part: the change of its wait went to comm_wait
            split["moved_to_comm_wait_ms"] = -(_wait_of(B, cat) - _wait_of(A, cat))
            if exclusive:  # the change of its time run alongside other categories: contention, not its own
                split["contention_ms_per_step"] = _overlapped_of(B, cat) - _overlapped_of(A, cat)
                split["op_delta_ms_per_step"] = _op_of(B, cat) - _op_of(A, cat)
                split["moved_to_overlap_ms"] = -split["contention_ms_per_step"]  # with the family parts: delta
            row.update(split)
            row["kernels"] = kernel_rows(A, B, cat)
        ci = boot.get(name) if boot else None
        row["ci95"] = ci
        row["change"] = is_change(delta, ci, threshold) and name != "step_variability"
        row["noise"] = not row["change"]
        components.append(row)
    total_ci = boot.get("step_ms") if boot else None
    return {
        "device": da if da == db else f"{da}->{db}",
        "step_ms": {"a": A["step_ms"], "b": B["step_ms"], "delta": delta_step, "ci95": total_ci,
                    "relative": delta_step / A["step_ms"] if A["step_ms"] else None,
                    "change": is_change(delta_step, total_ci, threshold)},
        "practical_threshold_ms": threshold,
        "kernels_per_step": {"a": A["kernels_per_step"], "b": B["kernels_per_step"]},
        "components": components,
        "closure_ms": delta_step - sum(c["delta_ms_per_step"] for c in components),
        "fingerprint": fingerprint(A, B),
        "layers": layer_rows(A, B),
        "bootstrap": {"samples": samples if boot else 0, "replicates": [len(a.members), len(b.members)],
                      "note": None if boot else "budget JSON input: no per-step data, no intervals"},
    }


def summary(result: dict) -> str:
    """One line: how much slower or faster B is, whether that is an established change, and the largest causes."""
    parts = []
    valid = (result.get("validity") or {}).get("valid", True)
    for d in result["devices"]:
        s = d["step_ms"]
        rel = f" ({100.0 * s['relative']:+.1f}%)" if s.get("relative") is not None else ""
        if not valid and s.get("change"):
            sig = ", not established"
        else:
            sig = "" if s.get("change", True) else " within noise"
        real = [c for c in d["components"] if c["change"]]
        real.sort(key=lambda c: -abs(c["delta_ms_per_step"]))
        causes = ", ".join(f"{c['component']} {c['delta_ms_per_step']:+.3f} ms" for c in real[:3])
        parts.append(f"GPU {d['device']}: B {s['delta']:+.3f} ms/step{rel} vs A{sig}"
                     + (f"; mostly {causes}" if causes and not sig else
                        f"; largest components {causes}" if causes and valid is False and s.get("change") else
                        f", though these components did change: {causes}" if causes else ""))
    return "; ".join(parts)
