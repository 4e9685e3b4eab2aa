"""Attribute the step-time difference between two captures (B - A) to categories, kernels and idle time.

Per device the components add up exactly to the change of `step_ms` (the median step span):

    step_ms = sum(category ms/step) - overlap + idle + (median - mean span)

so   delta(step_ms) = sum(delta category) - delta(overlap) + delta(idle) + delta(median - mean).

With collectives on two or more GPUs (budget `comm`), the time a rank spent waiting for the slowest rank is split
out of the comm categories into its own component `comm_wait` (the categories keep their transfer part), so the
components still add up exactly.

Each category's change is further split into a count part and a duration part:
    delta = (count_B - count_A) * mean_duration_A + count_B * (mean_duration_B - mean_duration_A).
Uncertainty: a bootstrap over steps (A's and B's steps resampled independently) gives a 95 % interval for the
total and for every component; a component whose interval contains 0 is marked noise.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from profattr.attribute.budget import NS_PER_MS, Budget, compute_budget
from profattr.errors import ProfattrError
from profattr.trace.reader import run_json_path

SCHEMA = "profattr.diff/1"
BOOTSTRAP_SAMPLES = 2000
SEED = 20261130


@dataclass
class Side:
    """One capture's budget, and its per-step tables when computed from a capture (not from JSON)."""

    path: str
    budget: dict
    per_step: pd.DataFrame | None
    per_step_category: pd.DataFrame | None
    run: dict | None
    per_step_comm: pd.DataFrame | None = None  # device, step, category, collective_ns, wait_ns


COMM_WAIT = "comm_wait"


def load_sides(a, b, steps: str = "auto", rules: Sequence = (), mapping_a=None, mapping_b=None,
               by: str = "category", layer_range: str | None = None, skip_steps=None) -> tuple:
    """Both sides of a diff; two captures are read in two processes at once when the machine has the cores
    (each budget is independent, so the diff costs about one budget's wall time)."""
    args_a = (a, steps, tuple(rules), mapping_a, by, layer_range, skip_steps)
    args_b = (b, steps, tuple(rules), mapping_b, by, layer_range, skip_steps)
    both_captures = not str(a).endswith(".json") and not str(b).endswith(".json")
    if both_captures and (os.cpu_count() or 1) >= 2:
        try:
            with ProcessPoolExecutor(max_workers=2) as pool:
                fa, fb = pool.submit(load_side, *args_a), pool.submit(load_side, *args_b)
                return fa.result(), fb.result()
        except (OSError, BrokenProcessPool):
            pass  # no worker processes here (sandboxes, limits): read them one after the other
    return load_side(*args_a), load_side(*args_b)


def load_side(path, steps: str = "auto", rules: Sequence = (), mapping=None, by: str = "category",
              layer_range: str | None = None, skip_steps=None) -> Side:
    """A capture (.sqlite / .nsys-rep) or a budget JSON file written by `profattr budget --format json`.

    `mapping`: an eager capture lending NVTX context to the capture's replayed graph ops; `by="layer"` /
    `layer_range`: per-layer rows (both as in budget.compute_budget).
    """
    p = Path(path)
    run = _run_json(p)
    if mapping is not None and p.suffix == ".json":
        raise ProfattrError(f"{p}: --mapping applies to captures, not to budget JSON files")
    if p.suffix == ".json":
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


def _run_json(p: Path) -> dict | None:
    from profattr import inputs

    cand = run_json_path(p)
    if inputs.is_regular_file(cand):
        try:
            run = json.loads(inputs.read_text(cand, "a run.json"))
        except (ProfattrError, ValueError, RecursionError):
            return None
        return run if isinstance(run, dict) else None
    return None


def compute_diff(a: Side, b: Side, samples: int = BOOTSTRAP_SAMPLES, changed: str | None = None) -> dict:
    """The diff dict (`profattr.diff/1`). `changed` names the category family the user changed between the two
    captures (e.g. `moe`); by default `moe` when the two run.json files name different backends."""
    devices_a = [d["device"] for d in a.budget["devices"]]
    devices_b = [d["device"] for d in b.budget["devices"]]
    for side, devices in ((a, devices_a), (b, devices_b)):
        if not devices:
            raise ProfattrError(f"{side.path}: no GPU work in its steps; nothing to compare")
    # match devices by id; when the two captures used different ids, by order
    pairs = ([(d, d) for d in devices_a if d in devices_b] if set(devices_a) & set(devices_b)
             else list(zip(devices_a, devices_b)))
    rng = np.random.default_rng(SEED)
    out_devices = []
    for da, db in pairs:
        out_devices.append(_device_diff(a, b, da, db, rng, samples))
    result = {
        "schema": SCHEMA,
        "a": {"path": a.path, "steps": a.budget["steps"], "backend": (a.run or {}).get("backend")},
        "b": {"path": b.path, "steps": b.budget["steps"], "backend": (b.run or {}).get("backend")},
        "devices": out_devices,
    }
    if changed is None and a.run and b.run and a.run.get("backend") != b.run.get("backend"):
        changed = "moe"
    result["changed"] = changed
    result["warnings"] = same_kernel_warnings(result, changed) if changed else []
    result["verdict"] = verdict(result)
    return result


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


def _components_from_budget(d: dict) -> dict:
    """Component values (ms/step) whose sum is step_ms."""
    comp = {f"category:{c['category']}": c["ms_per_step"] for c in d["categories"]}
    comm = d.get("comm")
    if comm:
        for c in comm["by_category"]:
            comp[f"category:{c['category']}"] = comp.get(f"category:{c['category']}", 0.0) - c["wait_ms_per_step"]
        comp[COMM_WAIT] = comm["wait_ms_per_step"]
    comp["idle"] = d["idle_ms_per_step"]
    comp["overlap"] = -d["overlap_ms_per_step"]
    comp["step_variability"] = d["step_ms"] - d["mean_step_ms"]
    return comp


def _device_diff(a: Side, b: Side, da: int, db: int, rng, samples: int) -> dict:
    A = next(d for d in a.budget["devices"] if d["device"] == da)
    B = next(d for d in b.budget["devices"] if d["device"] == db)
    ca, cb = _components_from_budget(A), _components_from_budget(B)
    names = sorted(set(ca) | set(cb), key=lambda n: -abs(cb.get(n, 0.0) - ca.get(n, 0.0)))
    delta_step = B["step_ms"] - A["step_ms"]
    cats_a, cats_b = _transfer_categories(A), _transfer_categories(B)
    boot = _bootstrap(a, b, da, db, rng, samples)
    components = []
    for name in names:
        delta = cb.get(name, 0.0) - ca.get(name, 0.0)
        row = {"component": name, "a_ms_per_step": ca.get(name, 0.0), "b_ms_per_step": cb.get(name, 0.0),
               "delta_ms_per_step": delta}
        if name.startswith("category:"):
            cat = name.split(":", 1)[1]
            row.update(_count_duration_split(cats_a.get(cat), cats_b.get(cat)))
            row["kernels"] = _kernel_rows(A, B, cat)
        ci = boot.get(name) if boot else None
        row["ci95"] = ci
        row["noise"] = bool(ci is not None and ci[0] <= 0.0 <= ci[1])
        components.append(row)
    total_ci = boot.get("step_ms") if boot else None
    return {
        "device": da if da == db else f"{da}->{db}",
        "step_ms": {"a": A["step_ms"], "b": B["step_ms"], "delta": delta_step, "ci95": total_ci,
                    "relative": delta_step / A["step_ms"] if A["step_ms"] else None},
        "kernels_per_step": {"a": A["kernels_per_step"], "b": B["kernels_per_step"]},
        "components": components,
        "closure_ms": delta_step - sum(c["delta_ms_per_step"] for c in components),
        "fingerprint": fingerprint(A, B),
        "layers": layer_rows(A, B),
        "bootstrap": {"samples": samples if boot else 0,
                      "note": None if boot else "budget JSON input: no per-step data, no intervals"},
    }


def _transfer_categories(d: dict) -> dict:
    """category -> budget category row, with comm categories reduced to their transfer part (see comm_wait)."""
    cats = {c["category"]: dict(c) for c in d["categories"]}
    for c in (d.get("comm") or {}).get("by_category", []):
        if c["category"] in cats:
            cats[c["category"]]["ms_per_step"] -= c["wait_ms_per_step"]
    return cats


def _count_duration_split(ca: dict | None, cb: dict | None) -> dict:
    n_a = ca["count_per_step"] if ca else 0.0
    n_b = cb["count_per_step"] if cb else 0.0
    mean_a = (ca["ms_per_step"] / n_a) if ca and n_a else 0.0
    mean_b = (cb["ms_per_step"] / n_b) if cb and n_b else 0.0
    if not ca:  # new category in B: all of it is "count"
        return {"count_delta_per_step": n_b, "from_count_ms": cb["ms_per_step"], "from_duration_ms": 0.0}
    if not cb:
        return {"count_delta_per_step": -n_a, "from_count_ms": -ca["ms_per_step"], "from_duration_ms": 0.0}
    return {"count_delta_per_step": n_b - n_a, "from_count_ms": (n_b - n_a) * mean_a,
            "from_duration_ms": n_b * (mean_b - mean_a)}


def _kernel_rows(A: dict, B: dict, cat: str, top: int = 6) -> dict:
    """The category's kernels in A and B (by name), matched by role: same category; shared names pair up."""
    ka = {k["name"]: k for k in A["kernels"] if k["category"] == cat}
    kb = {k["name"]: k for k in B["kernels"] if k["category"] == cat}
    shared = sorted(set(ka) & set(kb), key=lambda n: -abs(kb[n]["ms_per_step"] - ka[n]["ms_per_step"]))
    only_a = sorted(set(ka) - set(kb), key=lambda n: -ka[n]["ms_per_step"])
    only_b = sorted(set(kb) - set(ka), key=lambda n: -kb[n]["ms_per_step"])
    return {
        "shared": [{"name": n, "a_ms_per_step": ka[n]["ms_per_step"], "b_ms_per_step": kb[n]["ms_per_step"],
                    "a_count_per_step": ka[n]["count_per_step"], "b_count_per_step": kb[n]["count_per_step"]}
                   for n in shared[:top]],
        "only_a": [{"name": n, "ms_per_step": ka[n]["ms_per_step"], "count_per_step": ka[n]["count_per_step"]}
                   for n in only_a[:top]],
        "only_b": [{"name": n, "ms_per_step": kb[n]["ms_per_step"], "count_per_step": kb[n]["count_per_step"]}
                   for n in only_b[:top]],
    }


def layer_rows(A: dict, B: dict) -> list | None:
    """Per layer (budgets made with by="layer" on both sides): A and B ms and ops per step, and the change.

    Informational: the rows add up to the change of summed op time, not of the step (idle and overlap are not per
    layer); None when either budget has no layers.
    """
    if A.get("layers") is None or B.get("layers") is None:
        return None
    la = {r["layer"]: r for r in A["layers"]}
    lb = {r["layer"]: r for r in B["layers"]}
    order = [r["layer"] for r in B["layers"]] + [r["layer"] for r in A["layers"] if r["layer"] not in lb]
    rows = []
    for layer in order:
        ra, rb = la.get(layer), lb.get(layer)
        a_ms = ra["ms_per_step"] if ra else 0.0
        b_ms = rb["ms_per_step"] if rb else 0.0
        rows.append({"layer": layer, "a_ms_per_step": a_ms, "b_ms_per_step": b_ms, "delta_ms_per_step": b_ms - a_ms,
                     "a_count_per_step": ra["count_per_step"] if ra else 0.0,
                     "b_count_per_step": rb["count_per_step"] if rb else 0.0})
    return rows


def fingerprint(A: dict, B: dict) -> dict:
    """Per category: kernel families (taxonomy `family`, else the kernel name) only in A, only in B, in both."""
    def fams(d):
        out: dict = {}
        for k in d["kernels"]:
            out.setdefault(k["category"], set()).add(k.get("family") or k["name"])
        return out
    fa, fb = fams(A), fams(B)
    result = {}
    for cat in sorted(set(fa) | set(fb)):
        sa, sb = fa.get(cat, set()), fb.get(cat, set())
        result[cat] = {"only_a": sorted(sa - sb), "only_b": sorted(sb - sa), "both": sorted(sa & sb)}
    return result


def _step_matrix(side: Side, device: int, names: list) -> np.ndarray | None:
    """Steps x components matrix (ms), plus span (last column) and op time, for bootstrapping."""
    ps, psc = side.per_step, side.per_step_category
    if ps is None or psc is None:
        return None
    steps = ps[ps["device"] == device].set_index("step")
    if steps.empty:
        return None
    cat = psc[psc["device"] == device].pivot_table(index="step", columns="category", values="ns",
                                                   aggfunc="sum", fill_value=0)
    cat = cat.reindex(steps.index, fill_value=0)
    wait = None
    d = next((x for x in side.budget["devices"] if x["device"] == device), {})
    if d.get("comm") and side.per_step_comm is None:
        return None  # the comm_wait split needs per-step waits; without them no interval is better than a wrong one
    if side.per_step_comm is not None:
        pc = side.per_step_comm[side.per_step_comm["device"] == device]
        if len(pc):
            wait = pc.pivot_table(index="step", columns="category", values="wait_ns", aggfunc="sum",
                                  fill_value=0).reindex(steps.index, fill_value=0)
    cols = []
    for name in names:
        if name.startswith("category:"):
            c = name.split(":", 1)[1]
            col = cat[c].to_numpy(dtype=float) if c in cat.columns else np.zeros(len(steps))
            if wait is not None and c in wait.columns:
                col = col - wait[c].to_numpy(dtype=float)
            cols.append(col)
        elif name == COMM_WAIT:
            cols.append(wait.to_numpy(dtype=float).sum(axis=1) if wait is not None else np.zeros(len(steps)))
        elif name == "idle":
            cols.append((steps["span_ns"] - steps["busy_ns"]).to_numpy(dtype=float))
        elif name == "overlap":
            cols.append(-(steps["op_ns"] - steps["busy_ns"]).to_numpy(dtype=float))
        else:  # step_variability is computed from the span column
            cols.append(np.zeros(len(steps)))
    cols.append(steps["span_ns"].to_numpy(dtype=float))
    return np.stack(cols, axis=1) / NS_PER_MS


def _bootstrap(a: Side, b: Side, da: int, db: int, rng, samples: int) -> dict | None:
    A = next(d for d in a.budget["devices"] if d["device"] == da)
    B = next(d for d in b.budget["devices"] if d["device"] == db)
    names = sorted(set(_components_from_budget(A)) | set(_components_from_budget(B)))
    ma, mb = _step_matrix(a, da, names), _step_matrix(b, db, names)
    if ma is None or mb is None or len(ma) < 2 or len(mb) < 2:
        return None
    ia = rng.integers(0, len(ma), size=(samples, len(ma)))
    ib = rng.integers(0, len(mb), size=(samples, len(mb)))
    out = {}
    span_a, span_b = ma[:, -1][ia], mb[:, -1][ib]  # samples x steps
    med = np.median(span_b, axis=1) - np.median(span_a, axis=1)
    out["step_ms"] = _ci(med)
    for j, name in enumerate(names):
        if name == "step_variability":
            v = (np.median(span_b, axis=1) - span_b.mean(axis=1)) - (np.median(span_a, axis=1) - span_a.mean(axis=1))
        else:
            v = mb[:, j][ib].mean(axis=1) - ma[:, j][ia].mean(axis=1)
        out[name] = _ci(v)
    return out


def _ci(values: np.ndarray) -> list:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def verdict(result: dict) -> str:
    """One line: how much slower or faster B is, whether that is beyond noise, and the largest causes."""
    parts = []
    for d in result["devices"]:
        s = d["step_ms"]
        rel = f" ({100.0 * s['relative']:+.1f}%)" if s.get("relative") is not None else ""
        ci = s.get("ci95")
        sig = ""
        if ci is not None:
            sig = " within noise" if ci[0] <= 0.0 <= ci[1] else ""
        real = [c for c in d["components"] if not c["noise"] and abs(c["delta_ms_per_step"]) > 1e-6
                and c["component"] != "step_variability"]
        real.sort(key=lambda c: -abs(c["delta_ms_per_step"]))
        causes = ", ".join(f"{c['component']} {c['delta_ms_per_step']:+.3f} ms" for c in real[:3])
        parts.append(f"GPU {d['device']}: B {s['delta']:+.3f} ms/step{rel} vs A{sig}"
                     + (f"; mostly {causes}" if causes and not sig else ""))
    return "; ".join(parts)
