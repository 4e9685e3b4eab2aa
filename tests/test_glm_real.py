"""The GLM-5-shaped SGLang decode captured on the H200 with Nsight Systems 2024.2.3 (examples/h200/glm5/): steps,
kernel totals, the per-family diff of two MoE backends, and the groups of replicate windows.

Expected numbers come from SQL written here or in tests/independent.py, never from profattr's output.
"""
from __future__ import annotations


import pytest

from conftest import GLM_CAPTURES, GLM_GRAPH_CAPTURES
from independent import expected_nvtx_like, sql
from profattr.attribute.budget import compute_budget
from profattr.attribute.diff import compute_diff, group, load_side
from profattr.errors import ProfattrError

DECODE = "step[DECODE bs=%]"
PREFILL = "step[EXTEND %]"


def ranges_like(path, pattern: str) -> int:
    return sql(path, """SELECT count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                        WHERE n.eventType IN (59, 60) AND COALESCE(s.value, n.text) LIKE ?""", (pattern,))[0][0]


def graph_launches(path) -> int:
    return sql(path, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                        WHERE s.value LIKE 'cudaGraphLaunch%'""")[0][0]


@pytest.mark.parametrize("name", GLM_CAPTURES)
def test_steps_are_the_decode_spans_and_kernel_totals_match_sql(name, export_example):
    path = export_example(name)
    budget = compute_budget(path)
    assert budget.steps_source.startswith("nvtx-re:^step\\[DECODE")
    want = expected_nvtx_like(path, DECODE)
    for d in budget.devices:
        w = want[d["device"]]
        assert d["steps"] == w["steps"] == ranges_like(path, DECODE)
        assert d["step_ms"] == pytest.approx(w["step_ms"], rel=1e-9)
        assert d["kernels_per_step"] == pytest.approx(w["kernels_per_step"], rel=1e-9)
        got = {}
        for k in (k for k in d["kernels"] if not k["category"].startswith("memory.")):
            ms, count = got.get(k["name"], (0.0, 0.0))
            got[k["name"]] = (ms + k["ms_per_step"], count + k["count_per_step"])
        assert set(got) == set(w["per_kernel"])
        for kname, (ms, count) in w["per_kernel"].items():
            assert got[kname][0] == pytest.approx(ms, rel=1e-9) and got[kname][1] == pytest.approx(count, rel=1e-9)
    # the prefill span of the window's requests is left out, and said so
    assert sum(budget.steps_excluded.values()) == ranges_like(path, PREFILL)


@pytest.mark.parametrize("name", GLM_GRAPH_CAPTURES)
def test_every_decode_step_is_one_graph_replay(name, export_example):
    path = export_example(name)
    budget = compute_budget(path)
    assert budget.steps_count == graph_launches(path)
    # scheduler.run_batch also holds the prefill: never the step source
    assert "run_batch" not in budget.steps_source


def family_ms(path, name_like: str) -> float:
    """ms per decode step of the kernels whose short name matches, launched inside decode spans (SQL)."""
    want = expected_nvtx_like(path, DECODE)
    dev = next(iter(want.values()))
    return sum(ms for kname, (ms, _c) in dev["per_kernel"].items() if sqlite_like(kname, name_like))


def sqlite_like(text: str, pattern: str) -> bool:
    return bool(sql(":memory:", "SELECT ? LIKE ?", (text, pattern))[0][0])


def test_backend_diff_splits_moe_by_family_and_closes(export_example):
    a, b = export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-cutlass-bs1-r1")
    result = compute_diff(load_side(a), load_side(b), samples=300)
    d = result["devices"][0]
    assert abs(d["closure_ms"]) < 1e-9
    comps = {c["component"]: c for c in d["components"]}
    gemm = comps["category:moe.gemm"]
    # the expert GEMM family changed: Triton's fused_moe_kernel is removed, SGLang's CUTLASS grouped GEMM added
    assert gemm["removed_ms"] == pytest.approx(-family_ms(a, "fused_moe_kernel"), rel=1e-9)
    assert gemm["added_ms"] == pytest.approx(family_ms(b, "device_kernel"), rel=1e-9)
    assert gemm["from_count_ms"] == 0 and gemm["from_duration_ms"] == 0
    for c in comps.values():
        if "added_ms" in c:  # every category's parts close on its change
            parts = c["added_ms"] + c["removed_ms"] + c["from_count_ms"] + c["from_duration_ms"] \
                + c["moved_to_comm_wait_ms"] + c["moved_to_overlap_ms"]
            assert parts == pytest.approx(c["delta_ms_per_step"], abs=1e-12)
    # CUTLASS's grouped-GEMM set-up kernels are new families of moe.permute, not priced at an old mean duration
    permute = comps["category:moe.permute"]
    added = {f["family"] for f in permute["families"] if f["status"] == "added"}
    assert "sglang_cutlass_moe" in added and permute["from_count_ms"] == 0
    assert permute["change"]
    # the expert GEMMs' op time falls by more than the practical threshold, but most of it ran alongside the other
    # stream's work: the step pays only their exclusive change, and the rest is contention
    assert gemm["op_delta_ms_per_step"] < -d["practical_threshold_ms"]
    assert abs(gemm["delta_ms_per_step"]) < d["practical_threshold_ms"] and not gemm["change"]
    assert gemm["delta_ms_per_step"] + gemm["contention_ms_per_step"] == pytest.approx(gemm["op_delta_ms_per_step"],
                                                                                      abs=1e-12)


def test_replicated_backend_swap_keeps_its_verdict_and_replicates_widen_the_interval(export_example):
    tri = [load_side(export_example(f"glm5/glm-triton-bs1-r{r}")) for r in (1, 2)]
    cut = [load_side(export_example(f"glm5/glm-cutlass-bs1-r{r}")) for r in (1, 2)]
    grouped = compute_diff(group(tri), group(cut), samples=400)["devices"][0]
    single = compute_diff(tri[0], cut[0], samples=400)["devices"][0]
    assert abs(grouped["closure_ms"]) < 1e-9
    # the group's step time is the mean of its replicates' median spans
    want_a = sum(expected_nvtx_like(export_example(f"glm5/glm-triton-bs1-r{r}"), DECODE)[0]["step_ms"]
                 for r in (1, 2)) / 2
    assert grouped["step_ms"]["a"] == pytest.approx(want_a, rel=1e-9)
    comps = {c["component"]: c for c in grouped["components"]}
    assert comps["category:moe.permute"]["change"]
    gemm = comps["category:moe.gemm"]  # most of its op time change is contention (see the test above)
    assert gemm["op_delta_ms_per_step"] < -grouped["practical_threshold_ms"] and not gemm["change"]
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(grouped["step_ms"]["ci95"]) > width(single["step_ms"]["ci95"])


def test_skip_steps_leaves_out_the_first_steps(export_example):
    path = export_example("glm5/glm-triton-bs1-r1")
    spans = sql(path, """SELECT n.start, n."end" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                         WHERE n.eventType IN (59, 60) AND COALESCE(s.value, n.text) LIKE 'step[DECODE bs=%]'
                         ORDER BY n.start""")
    budget = compute_budget(path, skip_steps=2)
    assert budget.steps_count == len(spans) - 2
    assert "first 2 step(s) of each thread" in " ".join(budget.steps_excluded)
    with pytest.raises(ProfattrError, match="leaves no step"):
        compute_budget(path, skip_steps=len(spans))
