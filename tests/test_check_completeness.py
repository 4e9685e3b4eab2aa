"""`profattr check` on real captures that lost records, recorded no replayed kernels, or opened before the warm-up
was done, and on complete ones; the server-log evidence; A/A pairs. Expected numbers come from SQL or log text read
in the test."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from conftest import EXAMPLES, GLM_CAPTURES, GLM_LOSSY_CAPTURE
from independent import expected_nvtx, sql
from profattr.attribute.diff import compute_diff, load_side
from profattr.check.run import check_capture


def findings(path) -> dict:
    return {f.check: f for f in check_capture(path)[1]}


def run_json_of(export: Path) -> Path:
    return export.with_name(export.stem + ".run.json")


def test_capture_that_lost_most_cuda_activity_fails_loudly(export_example):
    path = export_example(GLM_LOSSY_CAPTURE)
    f = findings(run_json_of(path))
    kernels = sql(path, "SELECT count(*), min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    nvtx = sql(path, "SELECT min(start), max(\"end\") FROM NVTX_EVENTS WHERE eventType IN (59, 60) "
                     "AND \"end\" IS NOT NULL")[0]
    api = sql(path, "SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0]
    memops = sql(path, "SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_MEMCPY")[0]
    assert kernels[0] == 50  # of the 6160 kernels the complete capture of the same decode holds
    window = max(nvtx[1], api[1], kernels[2], memops[1]) - min(nvtx[0], api[0], kernels[1], memops[0])
    gpu = max(kernels[2], memops[1]) - min(kernels[1], memops[0])
    cov = f["window_coverage"]
    assert cov.status == "fail" and cov.data["share"] == pytest.approx(gpu / window, rel=1e-6)
    assert "nsys too old for this CUDA" in cov.message
    assert f["steps_with_gpu_work"].status == "fail"
    assert f["graphs_recorded"].status == "fail" and "no graph launch" in f["graphs_recorded"].message
    assert f["profiler_version"].status == "warn" and "2023.4.4" in f["profiler_version"].message
    assert f["steps"].status == "fail"


@pytest.mark.parametrize("name", GLM_CAPTURES)
def test_complete_captures_pass_the_completeness_checks(name, export_example):
    f = findings(run_json_of(export_example(name)))
    for check in ("kernels", "records", "window_coverage", "steps_with_gpu_work", "graphs_recorded", "backend"):
        assert f[check].status in ("pass", "skip"), (check, f[check].message)


def test_graph_replays_not_traced_fail_with_the_cause(export_example):
    path = export_example("wl-graph-trace-graph")
    launches = sql(path, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                            WHERE s.value LIKE 'cudaGraphLaunch%'""")[0][0]
    f = findings(run_json_of(path))
    assert f["kernels"].status == "fail" and f"{launches} cudaGraphLaunch calls" in f["kernels"].message
    assert "--cuda-graph-trace=node" in f["kernels"].message


def test_unfinished_warm_up_is_found_and_skip_steps_drops_it(export_example):
    path = export_example("wl-eager-cold-window")
    # step spans straight from SQL: decode_step ranges and the GPU work their launches started
    spans = sql(path, """
        WITH steps AS (SELECT n.start ss, n."end" se, n.globalTid tid,
                              row_number() OVER (ORDER BY n.start) AS i
                       FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
                       WHERE n.eventType = 59 AND COALESCE(t.value, n.text) = 'decode_step')
        SELECT steps.i, min(k.start), max(k."end") FROM steps
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = steps.tid AND r.start BETWEEN steps.ss AND steps.se
        JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId
        GROUP BY steps.i ORDER BY steps.i""")
    ms = [(e - s) / 1e6 for _, s, e in spans]
    steady = statistics.median(ms[len(ms) // 2:])
    slow = [m for m in ms[: len(ms) // 2] if m > 1.1 * steady]
    assert slow and ms[0] > 10 * steady  # the first step ran cold: lazy set-up and low clocks
    f = findings(run_json_of(path))["steady_state"]
    assert f.status == "fail"
    dev = f.data["devices"]["0"]
    assert dev["warmup_steps"] == len(slow) and dev["steady_ms"] == pytest.approx(steady, rel=1e-6)
    from profattr.attribute.budget import compute_budget

    kept = compute_budget(path, skip_steps="auto")
    want = expected_nvtx(path, "decode_step")[0]
    assert kept.devices[0]["steps"] == want["steps"] - len(slow)
    assert kept.devices[0]["mean_step_ms"] < 2 * steady < compute_budget(path).devices[0]["mean_step_ms"]
    assert list(kept.steps_excluded.values()) == [len(slow)]


def test_server_log_evidence(export_example):
    path = export_example("glm5/glm-triton-bs1-r1")
    log = gzip.decompress((EXAMPLES / "glm5" / "glm-triton.server.log.gz").read_bytes()).decode()
    shapes = set(re.findall(r"Using default W8A8 Block FP8 kernel config.*?configs/(N=\d+,K=\d+)", log))
    f = findings(run_json_of(path))["server_log"]
    assert f.status == "warn"
    assert f.data["resolved"]["moe_runner_backend"] == "triton"
    assert f.data["resolved"]["fp8_gemm_runner_backend"] == re.search(r"fp8_gemm_runner_backend='(\w+)'", log)[1]
    listed = {x.split(": ", 1)[1].split(",device")[0] for x in f.data["default_kernel_configs"]
              if x.startswith("W8A8")}
    assert listed == shapes and len(shapes) == 9
    assert f.data["in_window"]["error"] == 0  # the /stop_profile 500 is profattr's own request


def test_a_requested_backend_the_server_did_not_resolve_fails(tmp_path, export_example):
    path = export_example("glm5/glm-cutlass-bs1-r1")
    folder = tmp_path / "cap"
    folder.mkdir()
    shutil.copyfile(path, folder / path.name)
    run = json.loads(run_json_of(path).read_text())
    run["backend"]["sglang"] = "deep_gemm"  # as if deep_gemm had been asked for
    run["files"].pop("log", None)
    (folder / run_json_of(path).name).write_text(json.dumps(run))
    f = findings(folder / run_json_of(path).name)["server_log"]
    assert f.status == "fail" and "'deep_gemm' was asked for but the server resolved 'cutlass'" in f.message


def test_a_a_pair_of_launches_calls_nothing_a_change(export_example):
    result = compute_diff(load_side(export_example("wl-graph-grouped-r1")),
                          load_side(export_example("wl-graph-grouped-r2")), samples=500)
    d = result["devices"][0]
    assert not d["step_ms"]["change"] and not [c for c in d["components"] if c["change"]]
    assert "within noise" in result["verdict"]
