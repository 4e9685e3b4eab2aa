"""`profattr diff` on real H200 captures, against deltas computed from SQL (tests/independent.py)."""
from __future__ import annotations

from collections import defaultdict

import pytest

from independent import expected_graph, expected_nvtx
from profattr.attribute.diff import compute_diff, load_side
from profattr.taxonomy.classify import load_rules


def sql_category_ms(expected_device: dict) -> dict:
    """ms/step per category from the SQL per-kernel sums, classified by name without NVTX context
    (demangled name first, then the short name, as nsys names them)."""
    rules = load_rules()
    out = defaultdict(float)
    for (short, demangled), (ms, _count) in expected_device["per_demangled"].items():
        rule = rules.match(demangled) or rules.match(short)
        out[rule.category if rule else "unclassified"] += ms
    return out


@pytest.fixture(scope="module")
def sglang_pair(export_example):
    a, b = export_example("sglang-triton-bs1"), export_example("sglang-triton_kernel-bs1")
    return a, b, compute_diff(load_side(a), load_side(b), samples=500)


def test_sglang_backends_delta_matches_sql(sglang_pair):
    a, b, diff = sglang_pair
    ea, eb = expected_graph(a)[0], expected_graph(b)[0]
    d = diff["devices"][0]
    assert d["step_ms"]["delta"] == pytest.approx(eb["step_ms"] - ea["step_ms"], rel=1e-3, abs=1e-6)
    # components add up to the measured delta (the bar is 1 %; by construction it is exact)
    total = sum(c["delta_ms_per_step"] for c in d["components"])
    assert total == pytest.approx(d["step_ms"]["delta"], rel=0.01, abs=1e-9)
    lo, hi = d["step_ms"]["ci95"]
    assert lo <= d["step_ms"]["delta"] <= hi
    # SGLang has no NVTX here, so categories follow names alone: compare every category's op time change with SQL
    # (its component is the change of its exclusive time; with its contention that is its op time change)
    ca, cb = sql_category_ms(ea), sql_category_ms(eb)
    comps = {c["component"]: c for c in d["components"]}
    for cat in set(ca) | set(cb):
        want = cb.get(cat, 0.0) - ca.get(cat, 0.0)
        c = comps[f"category:{cat}"]
        assert c["op_delta_ms_per_step"] == pytest.approx(want, rel=0.005, abs=1e-6), cat
        assert c["delta_ms_per_step"] + c["contention_ms_per_step"] == pytest.approx(c["op_delta_ms_per_step"],
                                                                                  abs=1e-12)


def test_sglang_backends_fingerprint_and_verdict(sglang_pair):
    _a, _b, diff = sglang_pair
    d = diff["devices"][0]
    fp = d["fingerprint"]["moe.gemm"]
    assert fp["only_a"] == ["triton_fused_moe"] and fp["only_b"] == ["triton_kernels_matmul_ogs"]
    assert not diff["warnings"]  # the backends really ran different MoE kernels
    # one row per role: the expert-GEMM row names the kernels that replaced each other
    gemm = next(c for c in d["components"] if c["component"] == "category:moe.gemm")
    assert [k["name"] for k in gemm["kernels"]["only_a"]] == ["fused_moe_kernel"]
    assert all(k["name"].startswith("_matmul_ogs") for k in gemm["kernels"]["only_b"])
    assert "ms/step" in diff["summary"]
    # one window per side: the interval covers steps only, so the comparison establishes nothing
    assert diff["verdict"] == "within noise" and diff["interval"]["covers_window_variance"] is False


def test_same_backend_warns(export_example):
    """triton at batch 1 vs batch 4: the MoE kernels are the same, so a claimed MoE change is flagged."""
    a, b = export_example("sglang-triton-bs1"), export_example("sglang-triton-bs4")
    diff = compute_diff(load_side(a), load_side(b), samples=200, changed="moe")
    assert diff["warnings"] and "same in A and B" in diff["warnings"][0]


def test_more_small_kernels_show_as_idle(export_example):
    """The per-expert loop launches ~5x the kernels of the grouped experts: in eager mode the extra time is the
    GPU waiting for launches (idle), not kernel time."""
    a, b = export_example("wl-eager-grouped"), export_example("wl-eager-loop")
    diff = compute_diff(load_side(a), load_side(b), samples=300)
    d = diff["devices"][0]
    ea, eb = expected_nvtx(a, "decode_step")[0], expected_nvtx(b, "decode_step")[0]
    assert d["step_ms"]["delta"] == pytest.approx(eb["step_ms"] - ea["step_ms"], rel=1e-3)
    assert d["kernels_per_step"]["b"] > 4 * d["kernels_per_step"]["a"]
    comps = sorted(d["components"], key=lambda c: -c["delta_ms_per_step"])
    assert comps[0]["component"] == "idle"
    assert comps[0]["delta_ms_per_step"] > 0.7 * d["step_ms"]["delta"]
    assert sum(c["delta_ms_per_step"] for c in d["components"]) == pytest.approx(d["step_ms"]["delta"], rel=0.01)
