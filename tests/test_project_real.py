"""`profattr project` on the real GLM-5-shaped H200 captures: the full-width TP1 decode projected to TP8 per-rank
shapes on the same GPU, against the TP8 slice captured on one GPU (glm5/glm-tp8slice). The measured side is plain
SQL on the slice's export (tests/independent.py); the projection sees only the TP1 capture and its run.json."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from badinput import assert_one_line_error
from conftest import EXAMPLES
from independent import expected_nvtx_like, sql
from profattr.cli import cli

SOURCE = "glm5/glm-triton-bs1-r1"
SLICE = "glm5/glm-tp8slice"
DECODE = "step[DECODE bs=%]"
# kernel short names of the largest categories, written here from the kernels' names (not from the taxonomy)
CATEGORY_KERNELS = {"gemm.fp8": "name = '_w8a8_block_fp8_matmul'",
                    "moe.gemm": "name = 'fused_moe_kernel'",
                    "gemm.bf16": "(name LIKE 'nvjet_sm90%' OR name = 'splitKreduce_kernel')"}


def _project(path, *args):
    result = CliRunner().invoke(cli, ["project", str(path), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _measured_ms_per_step(path, where: str) -> float:
    """ms per decode step of the kernels `where` selects, inside the step[DECODE] ranges (launch call inside the
    range on the same thread; graph nodes through their cudaGraphLaunch)."""
    steps = expected_nvtx_like(path, DECODE)[0]["steps"]
    rows = sql(path, f"""
        WITH k AS (SELECT s.value AS name, k."end" - k.start AS ns, r.start AS api, r.globalTid AS tid
                   FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                   JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                        AND (r.globalTid & -16777216) = k.globalPid),
             st AS (SELECT n.start AS ss, n."end" AS se, n.globalTid AS stid FROM NVTX_EVENTS n
                    LEFT JOIN StringIds t ON t.id = n.textId
                    WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) LIKE 'step[DECODE bs=%]')
        SELECT sum(ns) FROM k JOIN st ON st.stid = k.tid AND k.api BETWEEN st.ss AND st.se WHERE {where}""")
    return rows[0][0] / steps / 1e6


@pytest.fixture(scope="module")
def tp8(export_example):
    return _project(export_example(SOURCE), "--to", "h200", "--tp", "8", "--interconnect", "none",
                    "--run-json", str(EXAMPLES / f"{SOURCE}.run.json"))


def test_projection_to_itself_gives_the_measured_step(export_example):
    path = export_example(SOURCE)
    got = _project(path, "--to", "h200", "--interconnect", "none", "--run-json", str(EXAMPLES / f"{SOURCE}.run.json"))
    want = expected_nvtx_like(path, DECODE)[0]
    assert got["schema"] == "profattr.project/1"
    # same GPU, same shapes: every launch keeps its duration; the step is the busy time plus the measured idle
    assert got["predicted_ms_per_step"] == pytest.approx(want["mean_step_ms"], rel=0.05)
    assert got["collectives"]["ms"] == 0.0 and not got["host"]["host_bound"]


def test_tp1_projected_to_tp8_shapes_predicts_the_measured_slice(tp8, export_example):
    slice_path = export_example(SLICE)
    measured = expected_nvtx_like(slice_path, DECODE)[0]["step_ms"]
    # the stated accuracy of this model on this pair (README): within 15% of the step
    assert abs(tp8["predicted_ms_per_step"] / measured - 1) < 0.15, (tp8["predicted_ms_per_step"], measured)
    assert tp8["target"]["model"]["tp"] == 8 and tp8["host"]["host_bound"]
    rows = {c["category"]: c for c in tp8["categories"]}
    # within 25% where the model holds; the two it misses (README says why) within the miss it states
    bars = {"gemm.fp8": 0.25, "attention.decode": 0.25, "norm": 0.25, "moe.gemm": 0.40, "gemm.bf16": 0.30}
    for category, bar in bars.items():
        where = {**FP8DG_KERNELS, **CATEGORY_KERNELS}[category]
        want = _measured_ms_per_step(slice_path, where)
        assert abs(rows[category]["projected_ms"] / want - 1) < bar, (category, rows[category]["projected_ms"], want)
    # the Triton block-FP8 GEMM and the fused MoE are matched to the model's layers on a 128-column tile
    assert rows["gemm.fp8"]["launch_model"]["_w8a8_block_fp8_matmul"]["tile_n"] == 128
    assert rows["moe.gemm"]["launch_model"]["fused_moe_kernel"]["tile_n"] == 128


def test_the_projection_reads_nothing_of_the_target_capture(export_example, tmp_path):
    """The predicted side is a function of the source capture and its run.json only."""
    src = export_example(SOURCE)
    a = _project(src, "--to", "h200", "--tp", "8", "--interconnect", "none",
                 "--run-json", str(EXAMPLES / f"{SOURCE}.run.json"))
    assert SLICE.split("/")[1] not in json.dumps(a)


def test_the_projection_to_8_rtx_pro_6000_at_78_layers_adds_collectives(export_example):
    got = _project(export_example(SOURCE), "--to", "rtx-pro-6000-ws", "--tp", "8", "--layers", "78",
                   "--run-json", str(EXAMPLES / f"{SOURCE}.run.json"))
    comm = got["collectives"]
    assert comm["count"] == 2 * 78 + 1 and comm["message_bytes"] == 6144 * 2
    assert got["predicted_ms_per_step"] == pytest.approx(got["gpu_ms"] + comm["ms"] + got["host"]["ms"], rel=1e-12)
    assert got["target"]["layers"] == 78 and got["predicted_ms_per_step"] > 10 * got["capture"]["measured_step_ms"] / 2


def test_unknown_target_lists_the_known_ones(export_example):
    result = CliRunner().invoke(cli, ["project", str(export_example(SOURCE)), "--to", "tpu-v5"])
    assert_one_line_error(result, "unknown hardware 'tpu-v5'", "rtx-pro-6000-ws", "h200")


def test_tp_that_does_not_divide_the_heads(export_example):
    result = CliRunner().invoke(cli, ["project", str(export_example(SOURCE)), "--to", "h200", "--tp", "3",
                                      "--run-json", str(EXAMPLES / f"{SOURCE}.run.json")])
    assert_one_line_error(result, "tp 3 does not divide")


def test_a_run_json_without_the_config(tmp_path, export_example):
    run = json.loads((EXAMPLES / f"{SOURCE}.run.json").read_text())
    run.pop("model_config")
    edited = tmp_path / "edited.run.json"
    edited.write_text(json.dumps(run))
    result = CliRunner().invoke(cli, ["project", str(export_example(SOURCE)), "--to", "h200", "--run-json",
                                      str(edited)])
    assert_one_line_error(result, "records no model_config")


# the second pair, on which nothing was fitted: batch 1 -> batch 4 of one server (dense FP8 GEMMs on DeepGEMM)
BS1, BS4 = "glm5/glm-fp8dg-bs1-r1", "glm5/glm-fp8dg-bs4-r1"
FP8DG_KERNELS = {"gemm.fp8": "name = 'sm90_fp8_gemm_1d2d_impl'",
                 "gemm.bf16": "(name LIKE 'nvjet_sm90%' OR name = 'splitKreduce_kernel')",
                 "moe.gemm": "name = 'fused_moe_kernel'",
                 "attention.decode": "name IN ('flash_fwd_splitkv_mla_fp8_sparse_kernel', 'flash_fwd_mla_combine_kernel')",
                 "norm": "name IN ('FusedAddRMSNormKernel', 'RMSNormKernel', 'vectorized_layer_norm_kernel')"}


def test_batch_1_projected_to_batch_4_predicts_the_five_largest_categories(export_example):
    got = _project(export_example(BS1), "--to", "h200", "--batch", "4", "--interconnect", "none",
                   "--run-json", str(EXAMPLES / f"{BS1}.run.json"))
    assert got["target"]["model"]["batch"] == 4
    rows = {c["category"]: c for c in got["categories"]}
    measured_total = predicted_total = 0.0
    for category, where in FP8DG_KERNELS.items():
        want = _measured_ms_per_step(export_example(BS4), where)
        # weights are read once per step whatever the batch; short-context attention and norms stay latency-bound
        assert rows[category]["projected_ms"] == pytest.approx(want, rel=0.10), category
        measured_total += want
        predicted_total += rows[category]["projected_ms"]
    assert predicted_total == pytest.approx(measured_total, rel=0.05)


def test_replicates_give_a_band(export_example):
    a, b = export_example(SOURCE), export_example("glm5/glm-triton-bs1-r2")
    got = _project(a, "--to", "h200", "--interconnect", "none", "--replicate", str(b))
    band = got["band"]
    assert band["replicates"] == 2 and band["min_ms"] <= got["predicted_ms_per_step"] <= band["max_ms"]
    # the replicate windows differ in the host's idle inside the step: the band spans both measured means
    want = sorted(expected_nvtx_like(p, DECODE)[0]["mean_step_ms"] for p in (a, b))
    assert band["min_ms"] == pytest.approx(want[0], rel=0.05) and band["max_ms"] == pytest.approx(want[1], rel=0.05)


def test_report_to_adds_the_target_section(tmp_path, export_example):
    out = tmp_path / "rep"
    result = CliRunner().invoke(cli, ["report", str(export_example(SOURCE)), "-o", str(out), "--to", "rtx-pro-6000-ws",
                                      "--to-tp", "8", "--to-layers", "78"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "## On the target" in text and "tp 8, 78 layers" in text
    got = _project(export_example(SOURCE), "--to", "rtx-pro-6000-ws", "--tp", "8", "--layers", "78")
    assert f"**{got['predicted_ms_per_step']:.3f} ms per decode step**" in text
