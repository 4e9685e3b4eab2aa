"""Torch-profiler (Kineto) traces as a capture: real H200 traces of the GLM-5-shaped SGLang decode (the twin of an
nsys capture of the same configuration) and public traces (tests/data/public/hta/SOURCE.md names them). Expected
numbers come from json.load of the same file in the test, or from SQL on the nsys twin."""
from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES, ROOT
from independent import expected_nvtx_like
from profattr.attribute.budget import compute_budget
from profattr.cli import cli

GLM = EXAMPLES / "glm5"
TORCH = [GLM / "glm-triton-torch-r1-TP-0.trace.json.gz", GLM / "glm-triton-torch-r2-TP-0.trace.json.gz"]
PUBLIC = ROOT / "tests" / "data" / "public" / "hta"
PUBLIC_GPU = [PUBLIC / n for n in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz", "triton_example.json.gz",
                                   "benchmark_result_2869224_1695835535_trace.json.gz")]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def kernel_totals(path: Path) -> dict:
    """Per kernel name (as the trace writes it): summed duration in ns (round(us * 1000) per event) and count."""
    out: dict = defaultdict(lambda: [0, 0])
    for e in load(path)["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            out[e["name"]][0] += round(float(e["dur"]) * 1000)
            out[e["name"]][1] += 1
    return dict(out)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("path", TORCH + PUBLIC_GPU, ids=lambda p: p.name)
def test_per_kernel_totals_match_an_independent_json_sum(path):
    want = kernel_totals(path)
    budget = compute_budget(path, steps="whole")
    got: dict = defaultdict(lambda: [0.0, 0.0])
    for d in budget.devices:
        for k in d["kernels"]:
            if not k["category"].startswith("memory."):
                got[k["demangled"]][0] += k["ms_per_step"] * 1e6
                got[k["demangled"]][1] += k["count_per_step"]
    assert set(got) == set(want)
    for name, (ns, count) in want.items():
        assert got[name][0] == pytest.approx(ns, abs=0.5) and got[name][1] == count


def test_torch_trace_and_nsys_export_of_the_same_decode_agree(export_example):
    nsys = compute_budget(export_example("glm5/glm-triton-bs1-r1")).devices[0]
    torch = compute_budget(TORCH[0]).devices[0]
    assert torch["kernels_per_step"] == nsys["kernels_per_step"] == \
        expected_nvtx_like(export_example("glm5/glm-triton-bs1-r1"), "step[DECODE bs=%]")[0]["kernels_per_step"]
    step = nsys["mean_step_ms"]
    cats_t = {c["category"]: c["ms_per_step"] for c in torch["categories"]}
    for c in nsys["categories"]:
        if c["ms_per_step"] < 0.02 * step or c["category"] == "attention.decode":
            continue
        assert cats_t[c["category"]] == pytest.approx(c["ms_per_step"], rel=0.05), c["category"]  # a few percent
    assert {c["category"] for c in nsys["categories"]} == set(cats_t)
    # attention.decode is the exception, and one kernel is why: FlashMLA's sparse decode kernel measures 1.5x longer
    # in the torch trace (CUPTI 13) than in nsys 2024.2.3's (CUPTI 12.5) under CUDA graphs, while its combine kernel
    # agrees; an eager nsys capture measures it as the torch trace does (see the README's evidence section)
    per = lambda d, n: sum(k["ms_per_step"] for k in d["kernels"] if k["name"].startswith(n))  # noqa: E731
    assert per(torch, "flash_fwd_mla_combine") == pytest.approx(per(nsys, "flash_fwd_mla_combine"), rel=0.01)
    assert per(torch, "flash_fwd_splitkv_mla_fp8_sparse") > 1.3 * per(nsys, "flash_fwd_splitkv_mla_fp8_sparse")


def test_decode_steps_come_from_sglang_spans_and_prefill_is_left_out():
    trace = load(TORCH[0])
    decode = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
              and e["name"].startswith("step[DECODE")]
    prefill = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
               and e["name"].startswith("step[EXTEND")]
    budget = compute_budget(TORCH[0])
    assert budget.steps_source.startswith("nvtx-re:^step\\[DECODE") and budget.steps_count == len(decode)
    assert sum(budget.steps_excluded.values()) == len(prefill) == 1
    launches = [e for e in trace["traceEvents"] if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"]
    replayed = {e["args"]["correlation"] for e in launches}
    n_replayed = sum(1 for e in trace["traceEvents"] if e.get("cat") in GPU_CATS
                     and e["args"]["correlation"] in replayed)
    from profattr.trace.source import open_trace

    with open_trace(TORCH[0]) as source:
        ops = source.ops()
    assert int((ops.graph_node >= 0).sum()) == n_replayed


def test_a_folder_of_rank_traces_is_one_capture_with_the_comm_split(tmp_path):
    for n in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        (tmp_path / n).write_bytes((PUBLIC / n).read_bytes())
    budget = compute_budget(tmp_path)
    assert [d["device"] for d in budget.devices] == [0, 1]
    for d in budget.devices:
        comm = d["comm"]
        assert comm["collective_ms_per_step"] == pytest.approx(comm["transfer_ms_per_step"] + comm["wait_ms_per_step"])


def test_cli_commands_accept_traces(tmp_path):
    assert run("budget", TORCH[0], "--format", "json").exit_code == 0
    diff = run("diff", TORCH[0], TORCH[1], "--format", "json", "--samples", "200")
    assert diff.exit_code == 0 and abs(json.loads(diff.output)["devices"][0]["closure_ms"]) < 1e-9
    check = run("check", GLM / "glm-triton-torch-r1.run.json")
    assert "kernels" in check.output and "Traceback" not in check.output
    report = run("report", TORCH[0], TORCH[1], "-o", tmp_path / "rep", "--samples", "100")
    assert report.exit_code == 0, report.output
    assert (tmp_path / "rep" / "report.md").exists()


def one_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.output
    return lines[0]


def test_bad_traces_get_one_clear_line(tmp_path):
    raw = TORCH[0].read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(raw[: len(raw) // 2])
    assert "truncated or damaged gzip" in one_error(run("budget", tmp_path / "cut.json.gz"))
    (tmp_path / "other.json").write_text(json.dumps({"hello": [1, 2, 3]}))
    assert "not a Chrome trace" in one_error(run("budget", tmp_path / "other.json"))
    (tmp_path / "broken.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel",')
    assert "not a readable trace" in one_error(run("budget", tmp_path / "broken.json"))
    assert "without GPU activity" in one_error(run("budget", PUBLIC / "benchmark_result_924719_1679055439_trace.json.gz"))
    trace = load(TORCH[0])
    cpu_only = dict(trace, traceEvents=[e for e in trace["traceEvents"] if e.get("cat") not in GPU_CATS])
    (tmp_path / "cpu.json").write_text(json.dumps(cpu_only))
    assert "ProfilerActivity.CUDA" in one_error(run("budget", tmp_path / "cpu.json"))
    # ranks of different runs mixed: two files claiming the same rank
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.json.gz").write_bytes((PUBLIC / "sampled_rank-0.json.gz").read_bytes())
    (mixed / "b.json.gz").write_bytes((PUBLIC / "sampled_rank-0.json.gz").read_bytes())
    assert "not the ranks of one run" in one_error(run("budget", mixed))


def test_events_missing_fields_are_skipped_and_counted(tmp_path):
    trace = load(TORCH[0])
    kernels = [i for i, e in enumerate(trace["traceEvents"]) if e.get("cat") == "kernel"]
    for i in kernels[:5]:
        del trace["traceEvents"][i]["dur"]
    (tmp_path / "holes.json").write_text(json.dumps(trace))
    from profattr.trace.kineto import KinetoTrace

    t = KinetoTrace(tmp_path / "holes.json")
    assert sum(t.skipped.values()) == 5
    assert len(t.ops().start) == len(kernels) - 5 + sum(1 for e in trace["traceEvents"]
                                                        if e.get("cat") in ("gpu_memcpy", "gpu_memset"))


def test_check_twin_flags_the_lossy_capture_and_passes_the_complete_one(export_example):
    """`profattr check --twin TRACE`: kernels per decode step against a torch-profiler twin of the same decode."""
    full, lossy = export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-triton-nsys2023")
    trace = load(TORCH[0])["traceEvents"]
    steps = [e for e in trace if e.get("cat") == "user_annotation" and e["name"].startswith("step[DECODE")]
    launches = {e["args"]["correlation"]: e["ts"] for e in trace if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    in_step = sum(1 for k in kernels if any(s["ts"] <= launches.get(k["args"]["correlation"], -1) <= s["ts"] + s["dur"]
                                            for s in steps))
    twin_per_step = in_step / len(steps)
    ok = run("check", full, "--twin", TORCH[0], "--format", "json")
    twin = next(f for f in json.loads(ok.output)["findings"] if f["check"] == "twin")
    want = expected_nvtx_like(full, "step[DECODE bs=%]")[0]["kernels_per_step"]
    assert twin["status"] == "pass" and twin["data"]["devices"][0]["kernels_per_step"] == pytest.approx(want)
    assert twin["data"]["devices"][0]["twin_kernels_per_step"] == pytest.approx(twin_per_step)
    bad = run("check", lossy, "--twin", TORCH[0], "--format", "json")
    assert bad.exit_code == 1
    twin = next(f for f in json.loads(bad.output)["findings"] if f["check"] == "twin")
    assert twin["status"] == "fail" and twin["data"]["devices"][0]["relative"] < -0.5
