"""What a diff establishes: one verdict (`regression`, `improvement`, `within noise`, `not comparable`), the reason
for it, and the regression gate (`diff --fail-on`) that CI runs on it.

A difference is established only by a valid comparison: at least `min_windows` windows per side (default
WINDOWS_FOR_VARIANCE: below that the interval holds the steps' variation, not the windows'), no confound between the
runs (confounds.py: they differ in something besides what the comparison changes), and per-step data (intervals).
A comparison with too few windows is `within noise`, with the reason "not established": what it measured may be a
difference between two windows rather than between the two configurations, and it must never read as a regression.
A confounded comparison, or one without intervals, is `not comparable`.
"""
from __future__ import annotations

import re

from profattr.attribute.diff_stats import WINDOWS_FOR_VARIANCE
from profattr.errors import ProfattrError

REGRESSION, IMPROVEMENT, NOISE, NOT_COMPARABLE = "regression", "improvement", "within noise", "not comparable"


def validity(result: dict, min_windows: int = WINDOWS_FOR_VARIANCE) -> dict:
    """{valid, min_windows, reasons}: whether the comparison can establish a change, and what stops it."""
    reasons = []
    confounds = [c for c in result.get("confounds") or [] if c.get("kind") == "confound"]
    if confounds:
        reasons.append("the runs also differ in " + "; ".join(f"{c['what']} ({c['a']} → {c['b']})"
                                                              for c in confounds[:3])
                       + (f" and {len(confounds) - 3} more" if len(confounds) > 3 else ""))
    if any(d["step_ms"].get("ci95") is None for d in result["devices"]):
        reasons.append("no per-step data (budget JSON input): no interval")
    windows = [result["a"]["levels"]["windows"], result["b"]["levels"]["windows"]]
    few = min(windows) < min_windows
    if few:
        reasons.append(f"not established: {windows[0]} and {windows[1]} window(s) per side, fewer than "
                       f"{min_windows}, too few for the interval to cover window-to-window variance")
    return {"valid": not reasons, "min_windows": min_windows, "reasons": reasons,
            "too_few_windows": few, "comparable": not reasons or (few and len(reasons) == 1)}


def decide(result: dict, min_windows: int = WINDOWS_FOR_VARIANCE) -> None:
    """Set `validity`, `verdict`, `verdict_reason` and every step and component's `established` in a diff."""
    v = validity(result, min_windows)
    result["validity"] = v
    for d in result["devices"]:
        d["step_ms"]["established"] = bool(v["valid"] and d["step_ms"].get("change"))
        for c in d["components"]:
            c["established"] = bool(v["valid"] and c.get("change"))
    if not v["comparable"]:
        result["verdict"] = NOT_COMPARABLE
        result["verdict_reason"] = "; ".join(v["reasons"])
        return
    if not v["valid"]:
        result["verdict"] = NOISE
        result["verdict_reason"] = v["reasons"][0]
        return
    slower = [d for d in result["devices"] if d["step_ms"]["established"] and d["step_ms"]["delta"] > 0]
    faster = [d for d in result["devices"] if d["step_ms"]["established"] and d["step_ms"]["delta"] < 0]
    cover = result.get("interval") or {}
    missing = "; the interval does not cover " + "; ".join(cover["missing"]) if cover.get("missing") else ""
    if slower or faster:
        d = (slower or faster)[0]
        s = d["step_ms"]
        result["verdict"] = REGRESSION if slower else IMPROVEMENT
        result["verdict_reason"] = (f"GPU {d['device']}: step {s['delta']:+.3f} ms, 95% interval "
                                    f"[{s['ci95'][0]:+.3f}, {s['ci95'][1]:+.3f}] excludes 0{missing}")
    else:
        result["verdict"] = NOISE
        result["verdict_reason"] = "the step change is inside its interval or under the practical threshold" + missing


# --- the regression gate ------------------------------------------------------------------------------------------

PCT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")


def parse_fail_on(specs) -> list:
    """`--fail-on` values: `5%` (the step, relative to A) or `COMPONENT=MS` (`category:gemm.fp8=0.05`, `idle=0.1`,
    `step=0.2`), as dicts {component, pct | ms, text}."""
    rules = []
    for spec in specs or ():
        text = str(spec).strip()
        m = PCT.match(text)
        if m:
            rules.append({"component": "step", "pct": float(m.group(1)), "text": text})
            continue
        name, sep, value = text.rpartition("=")
        try:
            ms = float(value)
        except ValueError:
            ms = None
        if not sep or not name.strip() or ms is None or ms < 0:
            raise ProfattrError(f"--fail-on {text!r}: not a threshold; give the step's slowdown as a percentage "
                                "(--fail-on 5%) or a component and ms per step (--fail-on category:gemm.fp8=0.05)")
        rules.append({"component": name.strip(), "ms": ms, "text": text})
    return rules


def gate(result: dict, rules: list) -> tuple:
    """(failures, notes): one line per threshold a valid comparison exceeds (slower by more than it, interval
    excluding 0), and lines saying why the gate could not fail (invalid comparison, unknown component)."""
    failures, notes = [], []
    v = result.get("validity") or {}
    if not v.get("valid"):
        notes.append("regression gate not applied: " + "; ".join(v.get("reasons") or ["comparison not valid"]))
        return failures, notes
    cover = result.get("interval") or {}
    caveat = (" (the interval does not cover " + "; ".join(cover["missing"]) + ")") if cover.get("missing") else ""
    for rule in rules:
        for d in result["devices"]:
            if rule["component"] == "step":
                s = d["step_ms"]
                delta, ci, a = s["delta"], s.get("ci95"), s["a"]
                limit = rule["pct"] / 100.0 * a if "pct" in rule else rule["ms"]
            else:
                c = next((c for c in d["components"] if c["component"] == rule["component"]), None)
                if c is None:
                    notes.append(f"--fail-on {rule['text']}: GPU {d['device']} has no component "
                                 f"{rule['component']!r} (components are category:<id>, idle, overlap, comm_wait)")
                    continue
                delta, ci = c["delta_ms_per_step"], c.get("ci95")
                limit = rule["ms"]
            if delta > limit and ci is not None and ci[0] > 0.0:
                failures.append(f"regression: GPU {d['device']} {rule['component']} {delta:+.3f} ms/step, over "
                                f"--fail-on {rule['text']} ({limit:.3f} ms), 95% interval [{ci[0]:+.3f}, "
                                f"{ci[1]:+.3f}]{caveat}")
    return failures, notes
