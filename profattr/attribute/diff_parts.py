"""The parts of a category's change: per kernel family (added, removed, or run in both with a count and a duration
effect), the kernels in A and B, per layer, and which families only one side ran.

A family is the taxonomy's `family` label, else the kernel's name (so a new 2 us set-up kernel is its own family,
never priced at the category's old mean duration). For a category with rows r in A and B:

    delta = sum(added families' B ms) - sum(removed families' A ms)
            + sum over families in both of [(n_B - n_A) * mean_A + n_B * (mean_B - mean_A)]

exactly (mean = ms per step / count per step of that family), so the parts close on the change of the category's
op time; diff.py takes the change of its overlapped time (contention) out of that to reach its component, the change
of its exclusive time.
"""
from __future__ import annotations


def _families(d: dict, cat: str) -> dict:
    out: dict = {}
    for k in d["kernels"]:
        if k["category"] != cat:
            continue
        key = k.get("family") or k["name"]
        row = out.setdefault(key, {"ms": 0.0, "count": 0.0, "names": []})
        row["ms"] += k["ms_per_step"]
        row["count"] += k["count_per_step"]
        if k["name"] not in row["names"]:
            row["names"].append(k["name"])
    return out


def family_split(A: dict, B: dict, cat: str, top: int = 8) -> dict:
    """The category's change (of its summed kernel time) per family, and the totals of each kind of part."""
    fa, fb = _families(A, cat), _families(B, cat)
    rows = []
    totals = {"added_ms": 0.0, "removed_ms": 0.0, "from_count_ms": 0.0, "from_duration_ms": 0.0}
    # in a fixed order: the totals are float sums, and a set's order follows string hashing (it changes per run)
    for fam in sorted(set(fa) | set(fb), key=lambda f: (f is None, str(f))):
        a, b = fa.get(fam), fb.get(fam)
        row = {"family": fam, "a_ms_per_step": a["ms"] if a else 0.0, "b_ms_per_step": b["ms"] if b else 0.0,
               "a_count_per_step": a["count"] if a else 0.0, "b_count_per_step": b["count"] if b else 0.0,
               "kernels": (b or a)["names"][:3]}
        row["delta_ms_per_step"] = row["b_ms_per_step"] - row["a_ms_per_step"]
        if a and b:
            mean_a = a["ms"] / a["count"] if a["count"] else 0.0
            mean_b = b["ms"] / b["count"] if b["count"] else 0.0
            row["status"] = "both"
            row["from_count_ms"] = (b["count"] - a["count"]) * mean_a
            row["from_duration_ms"] = b["count"] * (mean_b - mean_a)
            totals["from_count_ms"] += row["from_count_ms"]
            totals["from_duration_ms"] += row["from_duration_ms"]
        elif b:
            row["status"] = "added"
            totals["added_ms"] += b["ms"]
        else:
            row["status"] = "removed"
            totals["removed_ms"] -= a["ms"]
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r["delta_ms_per_step"]), r["family"]))
    count_delta = sum(r["b_count_per_step"] - r["a_count_per_step"] for r in rows)
    return dict(totals, count_delta_per_step=count_delta, families=rows[:top], families_total=len(rows))


def kernel_rows(A: dict, B: dict, cat: str, top: int = 6) -> dict:
    """The category's kernels in A and B (by name), matched by role: same category; shared names pair up."""
    ka = {k["name"]: k for k in A["kernels"] if k["category"] == cat}
    kb = {k["name"]: k for k in B["kernels"] if k["category"] == cat}
    shared = sorted(set(ka) & set(kb), key=lambda n: (-abs(kb[n]["ms_per_step"] - ka[n]["ms_per_step"]), n))
    only_a = sorted(set(ka) - set(kb), key=lambda n: (-ka[n]["ms_per_step"], n))  # ties by name, not by hash
    only_b = sorted(set(kb) - set(ka), key=lambda n: (-kb[n]["ms_per_step"], n))
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
