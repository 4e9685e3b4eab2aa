"""`profattr check` on small exports with the real nsys 2023.4.4 table layout (tests/synth.py), one edge case each:
graph replays without node-level kernels, missing ranks, first-call outliers, a backend that fell back, profiler
overhead, steps. The CPU capture checks against a real nsys export live in test_capture.py."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from synth import Builder, gpid, gtid

from profattr.check.run import check_capture
from profattr.cli import cli

PID = 4242
MS = 1_000_000


def invoke(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def write_run(path: Path, **fields) -> Path:
    run = {"schema": "profattr.run/1", "name": path.name, "status": "complete", "target": "sglang",
           "capture": {"trace": "cuda,nvtx"}, "files": {"sqlite": path.name + ".sqlite"}}
    run.update(fields)
    out = path.with_name(path.name + ".run.json")
    out.write_text(json.dumps(run))
    return out


def graph_capture(path: Path, steps: int = 4, kernels_per_step=("fused_moe_kernel", "nvjet_sm90_tst_64x8_h_bz_TNT"),
                  node_level: bool = True, devices=(0,), first_ms: float | None = None,
                  kernel_ms: float = 0.1) -> Path:
    """`steps` cudaGraphLaunch replays per device (one process per device), each replaying `kernels_per_step`
    kernels of `kernel_ms`; `first_ms` makes the very first kernel that long (a JIT/autotune call)."""
    b = Builder(path)
    for dev in devices:
        pid = PID + dev
        t = 1_000 * MS
        for step in range(steps):
            corr = b.launch(gtid(pid), t, t + 10_000, name="cudaGraphLaunch_v10000")
            k0 = t + 20_000
            for i, name in enumerate(kernels_per_step):
                dur = int(kernel_ms * MS)
                if first_ms is not None and step == 0 and i == 0:
                    dur = int(first_ms * MS)
                node = (step << 32) + i if node_level else None
                b.kernel(gpid(pid), corr, k0, k0 + dur, name, device=dev, graph_node=node if node_level else None)
                k0 += dur + 5_000
            t += 2 * MS
    return b.close()


def findings_of(path) -> dict:
    _, findings = check_capture(path)
    return {f.check: f for f in findings}


def test_graph_launches_without_kernels_fail_with_the_cause(tmp_path):
    b = Builder(tmp_path / "g.sqlite")
    for i in range(3):
        b.launch(gtid(PID), i * MS, i * MS + 10_000, name="cudaGraphLaunch_v10000")
    b.close()
    result = invoke(["check", str(tmp_path / "g.sqlite"), "--format", "json"])
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["status"] == "fail"
    kernels = next(f for f in out["findings"] if f["check"] == "kernels")
    assert kernels["status"] == "fail" and "--cuda-graph-trace=graph" in kernels["message"]
    assert kernels["data"]["graph_launches"] == 3


def test_no_cuda_calls_means_the_window_never_opened(tmp_path):
    Builder(tmp_path / "empty.sqlite").close()  # the tables, no rows
    f = findings_of(tmp_path / "empty.sqlite")["kernels"]
    assert f.status == "fail" and "never opened" in f.message


def test_graph_replays_need_node_level_kernels(tmp_path):
    assert findings_of(graph_capture(tmp_path / "node.sqlite"))["graph_nodes"].status == "pass"
    # kernels exist, but none carries a graphNodeId: the replays were not traced per node
    f = findings_of(graph_capture(tmp_path / "flat.sqlite", node_level=False))["graph_nodes"]
    assert f.status == "fail" and "graphNodeId" in f.message


def test_every_tensor_parallel_device_must_be_present(tmp_path):
    one = graph_capture(tmp_path / "one.sqlite", devices=(0,))
    write_run(tmp_path / "one", tp=2)
    f = findings_of(tmp_path / "one.run.json")["devices"]
    assert f.status == "fail" and "1 of 2" in f.message
    two = graph_capture(tmp_path / "two.sqlite", devices=(0, 1))
    write_run(tmp_path / "two", tp=2)
    f = findings_of(tmp_path / "two.run.json")["devices"]
    assert f.status == "pass" and f.data["devices"] == [0, 1]
    assert one.exists() and two.exists()


def test_first_call_outlier(tmp_path):
    # the first fused_moe_kernel takes 5 ms, the other three 0.1 ms: 4.9 ms extra of ~5.7 ms kernel time
    f = findings_of(graph_capture(tmp_path / "jit.sqlite", first_ms=5.0))["first_calls"]
    assert f.status == "fail" and "fused_moe_kernel" in f.message
    assert f.data["excess_ms"] == pytest.approx(4.9, rel=1e-6)
    assert findings_of(graph_capture(tmp_path / "warm.sqlite"))["first_calls"].status == "pass"


def test_a_first_call_with_another_launch_shape_is_no_outlier(tmp_path):
    # a 0.5 ms first call of a 0.02 ms kernel: an outlier with the decode grid; with a grid of its own (a
    # prefill-shaped call) it is the only call of its shape, and shorter than a long one-off
    path = graph_capture(tmp_path / "pre.sqlite", first_ms=0.5, kernel_ms=0.02)
    assert findings_of(path)["first_calls"].status == "fail"
    conn = sqlite3.connect(path)
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 64 WHERE start = (SELECT MIN(start) FROM "
                 "CUPTI_ACTIVITY_KIND_KERNEL)")
    conn.commit()
    conn.close()
    assert findings_of(path)["first_calls"].status == "pass"


@pytest.mark.parametrize("backend, names, status, words", [
    ("triton", ("fused_moe_kernel", "moe_align_block_size_kernel"), "pass", "triton_fused_moe"),
    ("triton", ("fused_moe_kernel", "_matmul_ogs_NNT_bf16xbf16xbf16_64x64x64x1"), "fail", "triton_kernel"),
    ("triton_kernel", ("_p_matmul_ogs_NNT_bf16xbf16xbf16_128x64x64x1",), "pass", "triton_kernels_matmul_ogs"),
    ("triton_kernel", ("nvjet_sm90_tst_64x8_h_bz_TNT",), "fail", "no expert GEMM"),
    ("flashinfer_cutlass",
     ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<x>>>",
      "void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<x>"), "pass", "cutlass_grouped_gemm"),
    ("flashinfer_cutlass",
     ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<x>>>",),
     "fail", "flashinfer_cutlass_moe"),
])
def test_backend_fingerprint(tmp_path, backend, names, status, words):
    graph_capture(tmp_path / "b.sqlite", kernels_per_step=names)
    write_run(tmp_path / "b", backend={"requested": backend, "sglang": backend})
    f = findings_of(tmp_path / "b.run.json")["backend"]
    assert f.status == status and words in f.message


# graph_capture's step: two 0.1 ms kernels 5 us apart, so the span of a step (first start to last end) is 0.205 ms
STEP_SPAN_MS = 0.205


@pytest.mark.parametrize("ratio, status", [(1.2, "pass"), (2.3, "warn"), (4.5, "fail")])
def test_profiler_overhead_is_measured_in_the_capture(tmp_path, ratio, status):
    graph_capture(tmp_path / "o.sqlite")
    # a client-side figure (the window's close stalls the streamed tokens) is kept, but not used
    write_run(tmp_path / "o", timing={"ms_per_token_unprofiled": STEP_SPAN_MS / ratio,
                                      "ms_per_token_profiled": 150.0})
    f = findings_of(tmp_path / "o.run.json")["overhead"]
    assert f.status == status and f.data["ratio"] == pytest.approx(ratio)
    assert f.data["ms_per_token_profiled"] == pytest.approx(STEP_SPAN_MS)
    assert f.data["ms_per_token_profiled_client"] == 150.0
    assert f.data["profiled_source"].startswith("capture: median step span (graph steps)")
    assert "median step span in the capture" in f.message


def test_profiler_overhead_slowest_device_of_a_tp_capture(tmp_path):
    # device 1's kernels take twice as long: its median span sets ms/token
    path = tmp_path / "tp.sqlite"
    b = Builder(path)
    for dev, kernel_ms in ((0, 0.1), (1, 0.2)):
        t = 1_000 * MS
        for step in range(4):
            corr = b.launch(gtid(PID + dev), t, t + 10_000, name="cudaGraphLaunch_v10000")
            k0 = t + 20_000
            for i in range(2):
                b.kernel(gpid(PID + dev), corr, k0, k0 + int(kernel_ms * MS), "fused_moe_kernel", device=dev,
                         graph_node=(step << 32) + i)
                k0 += int(kernel_ms * MS) + 5_000
            t += 2 * MS
    b.close()
    write_run(tmp_path / "tp", tp=2, timing={"ms_per_token_unprofiled": 0.4})
    f = findings_of(tmp_path / "tp.run.json")["overhead"]
    assert [d["step_ms"] for d in f.data["profiled_per_device"]] == pytest.approx([0.205, 0.405])
    assert f.data["ms_per_token_profiled"] == pytest.approx(0.405) and f.status == "pass"
    assert "slowest of 2 devices" in f.message and "device 1" in f.data["profiled_source"]


def test_profiler_overhead_falls_back_to_the_client_without_steps(tmp_path):
    # CUDA traced, but no kernel in the window: no step to measure, so the client-side figure is all there is
    Builder(tmp_path / "e.sqlite").close()
    write_run(tmp_path / "e", timing={"ms_per_token_unprofiled": 1.0, "ms_per_token_profiled_client": 2.0})
    f = findings_of(tmp_path / "e.run.json")["overhead"]
    assert f.status == "warn" and f.data["profiled_source"] == "client-side" and "client-side" in f.message


def test_steps_counted_against_requested(tmp_path):
    # 6 graph replays; the budget counts them as steps (a replay lasts until the next one)
    graph_capture(tmp_path / "s.sqlite", steps=6)
    write_run(tmp_path / "s", window={"steps_requested": 7})  # SGLang's window: 1 prefill + 6 decode steps
    f = findings_of(tmp_path / "s.run.json")["steps"]
    assert f.status == "pass" and f.data["counted"] == 6 and f.data["requested"] == 7
    write_run(tmp_path / "s", window={"steps_requested": 20})
    assert findings_of(tmp_path / "s.run.json")["steps"].status == "warn"


def test_table_format_and_exit_codes(tmp_path):
    graph_capture(tmp_path / "ok.sqlite")
    result = invoke(["check", str(tmp_path / "ok.sqlite")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "FINDING"] and lines[-1] == "overall: pass"
    assert any(ln.startswith("pass") and " kernels " in ln for ln in lines)


def test_locating_captures(tmp_path):
    (tmp_path / "x.qdstrm").write_bytes(b"raw")
    result = invoke(["check", str(tmp_path / "x.qdstrm")])
    assert result.exit_code == 2 and "--finish" in result.output
    graph_capture(tmp_path / "a.sqlite")
    graph_capture(tmp_path / "b.sqlite")
    write_run(tmp_path / "a")
    write_run(tmp_path / "b")
    result = invoke(["check", str(tmp_path)])
    assert result.exit_code == 2 and "several captures" in result.output
    assert invoke(["check", str(tmp_path / "a.run.json")]).exit_code == 0
    result = invoke(["check", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such file" in result.output
