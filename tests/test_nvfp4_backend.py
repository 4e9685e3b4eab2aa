"""NVFP4 on SM90: dense FP4 GEMMs are W4A16 Marlin kernels, expert GEMMs Marlin MoE kernels; both have the short
name `Marlin`, only the namespace of the demangled name tells them apart. Synthetic exports (tests/synth.py) and a
synthetic torch trace carry the demangled names SGLang 0.5.16's JIT Marlin kernels get:

- python/sglang/jit_kernel/csrc/gemm/marlin/kernel.h: `namespace device::marlin { template <typename scalar_t,
  host::ScalarTypeId w_type_id, ...> __global__ void Marlin(...) }` (dense linears, apply_fp4_marlin_linear);
- python/sglang/jit_kernel/csrc/gemm/marlin_moe/kernel.h: `namespace device::marlin_moe { template <typename
  scalar_t, w_type_id, s_type_id, ...> Marlin }` (the experts);
- the weight ScalarTypeId of FP4 E2M1 (kFE2M1f = ScalarType::float_(2, 1, true, NAN_NONE)) computed below from
  sgl_kernel/scalar_type.hpp's packing: exponent | mantissa << 8 | signed << 16 | bias << 17 |
  finite_values_only << 49 | nan_repr << 50.
"""
from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from synth import Builder, gpid, gtid

from profattr.check.run import check_capture
from profattr.cli import cli

PID = 4242
US = 1_000


def scalar_type_id(exponent, mantissa, signed, bias, finite_values_only, nan_repr) -> int:
    return (exponent | mantissa << 8 | int(signed) << 16 | (bias & 0xFFFFFFFF) << 17 | int(finite_values_only) << 49
            | nan_repr << 50)


FE2M1F = scalar_type_id(2, 1, True, 0, True, 0)  # NAN_NONE
FE4M3FN = scalar_type_id(4, 3, True, 0, True, 2)  # NAN_EXTD_RANGE_MAX_MIN
DENSE = (f"void device::marlin::Marlin<__nv_bfloat16, (long){FE2M1F}, (int)256, (int)1, (int)8, (int)8, (bool)1, "
         "(int)4, (int)1, (bool)0>(const int4 *, const int4 *, int4 *, int4 *, const int4 *, const float *, "
         "const int4 *, const int *, int, int, int, int, int, int *, bool, bool, int)")
EXPERT = (f"void device::marlin_moe::Marlin<__nv_bfloat16, (long){FE2M1F}, (long){FE4M3FN}, (int)256, (int)1, "
          "(int)8, (int)8, (bool)1, (int)4, (int)1, (bool)0>(const int4 *, const int4 *, int4 *, int4 *)")
ATTENTION = "nvjet_sm90_tst_64x8_64x16_2x2_h_bz_TNT"
# per decode step of the GLM-5-shaped NVFP4 model (the recipe's torch trace): 12 dense FP4 GEMMs, 6 expert GEMMs
STEP_KERNELS = [(DENSE, 12, 20), (EXPERT, 6, 40), (ATTENTION, 5, 10)]


def nsys_export(path: Path, steps: int = 4, first_dense_us: int | None = None, expert=EXPERT) -> Path:
    """Decode steps (NVTX `step[DECODE bs=1]` ranges) launching STEP_KERNELS; shortName is the bare `Marlin`."""
    b = Builder(path)
    t = 1_000_000 * US
    first = True
    for _ in range(steps):
        b.nvtx(gtid(PID), t, t + 2_000 * US, "step[DECODE bs=1]")
        k = t + 50 * US
        for demangled, count, us in [(DENSE, 12, 20), (expert, 6, 40), (ATTENTION, 5, 10)]:
            for _ in range(count):
                corr = b.launch(gtid(PID), k - 20 * US, k - 15 * US)
                dur = us * US
                if first and demangled == DENSE and first_dense_us is not None:
                    dur, first = first_dense_us * US, False
                short = "Marlin" if "Marlin" in demangled else demangled
                b.kernel(gpid(PID), corr, k, k + dur, short, demangled=demangled)
                k += dur + 2 * US
        t += 3_000 * US + (first_dense_us or 0) * US
    return b.close()


def torch_trace(path: Path, steps: int = 3) -> Path:
    """The same step as a torch-profiler trace: kernel names there are demangled, with c++filt's `562...l`."""
    events, corr, ts = [], 100, 1000.0
    dense = DENSE.replace(f"(long){FE2M1F}", f"{FE2M1F}l")
    expert = EXPERT.replace(f"(long){FE2M1F}", f"{FE2M1F}l").replace(f"(long){FE4M3FN}", f"{FE4M3FN}l")
    for _ in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "pid": 7, "tid": 7,
                       "ts": ts, "dur": 2000.0, "args": {}})
        k = ts + 50.0
        for name, count, us in [(dense, 12, 20), (expert, 6, 40), (ATTENTION, 5, 10)]:
            for _ in range(count):
                corr += 1
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                               "ts": k - 20.0, "dur": 5.0, "args": {"correlation": corr, "cbid": 211}})
                events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": k, "dur": float(us),
                               "args": {"device": 0, "stream": 7, "correlation": corr, "grid": [1, 1, 1],
                                        "block": [256, 1, 1]}})
                k += us + 2.0
        ts += 3000.0
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
             "traceEvents": events}
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)
    return path


def budget_json(path) -> dict:
    result = CliRunner().invoke(cli, ["budget", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def per_name_ms(db: Path) -> dict:
    """Kernel ms per demangled name, by SQL on the export (independent of profattr)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                            "ON s.id = k.demangledName GROUP BY s.value").fetchall()
    finally:
        conn.close()
    return {name: ns / 1e6 for name, ns in rows}


@pytest.mark.parametrize("make", ["nsys", "torch"])
def test_dense_fp4_marlin_is_gemm_fp4_and_expert_marlin_stays_moe_gemm(tmp_path, make):
    path = nsys_export(tmp_path / "nvfp4.sqlite") if make == "nsys" else torch_trace(tmp_path / "nvfp4.trace.json.gz")
    d = budget_json(path)["devices"][0]
    cats = {c["category"]: c for c in d["categories"]}
    assert cats["gemm.fp4"]["count_per_step"] == 12 and cats["moe.gemm"]["count_per_step"] == 6
    assert cats["gemm.fp4"]["ms_per_step"] == pytest.approx(12 * 0.020, rel=1e-9)
    kernels = {k["demangled"]: k for k in d["kernels"]}
    dense = next(k for n, k in kernels.items() if "marlin::Marlin" in n and "marlin_moe" not in n)
    expert = next(k for n, k in kernels.items() if "marlin_moe::Marlin" in n)
    assert (dense["category"], dense["family"]) == ("gemm.fp4", "marlin_dense")
    assert (expert["category"], expert["family"]) == ("moe.gemm", "marlin")
    for k in (dense, expert):
        assert (k["weight_dtype"], k["math"]) == ("fp4", "W4A16: unpacked to BF16 in the kernel")
    rows = {(r["category"], r["weight_dtype"], r["math"]) for r in d["gemm_precision"]}
    assert ("gemm.fp4", "fp4", "W4A16: unpacked to BF16 in the kernel") in rows
    assert ("gemm.bf16", "bf16", "BF16 tensor cores") in rows
    table = CliRunner().invoke(cli, ["budget", str(path)])
    assert "weights fp4; W4A16: unpacked to BF16 in the kernel" in table.stdout


def test_time_lands_in_the_family_the_launching_source_gives(tmp_path):
    db = nsys_export(tmp_path / "nvfp4.sqlite")
    ms = per_name_ms(db)
    steps = 4
    want = {"gemm.fp4": ms[DENSE] / steps, "moe.gemm": ms[EXPERT] / steps}
    got = {c["category"]: c["ms_per_step"] for c in budget_json(db)["devices"][0]["categories"]}
    for cat, value in want.items():
        assert got[cat] == pytest.approx(value, rel=1e-9), cat


def test_native_fp4_names_from_sources_are_gemm_fp4():
    from profattr.taxonomy.classify import load_rules

    rules = load_rules()
    native = {
        # flashinfer include/flashinfer/gemm/fp4_gemm_template_sm120.h (mm_fp4, CUTLASS, SM120)
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
        "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120TmaWarpSpecializedBlockScaled<3, 2>, "
        "cute::tuple<cutlass::float_e2m1_t, cutlass::float_ue4m3_t>>>>(T1::Params)": "cutlass_gemm",
        # flashinfer mm_fp4(backend='trtllm') dense cubins (SM100)
        "gemm_Bfloat16_E2m1E2m1_Fp32_t128x128x128_s3_et128x128_m128x128x64_cga1x1x1_16dp256b_TN_transOut_schedS_sm100f":
            "trtllm_gen_gemm",
        # flashinfer/gemm/kernels/dense_blockscaled_gemm_sm100.py (CuTe DSL)
        "kernel_cutlass_kernel_flashinfergemmkernelsdense_blockscaled_gemm_sm100Sm100BlockScaledPersistentDenseGemm"
        "Kernel_object_at_": "cute_dsl_gemm",
    }
    for name, family in native.items():
        rule = rules.match(name)
        assert (rule.category, rule.family, rule.weight_dtype, rule.math) == \
            ("gemm.fp4", family, "fp4", "native FP4 tensor cores"), name
    # an expert FP4 grouped GEMM stays an expert GEMM
    grouped = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<"
               "cute::tuple<long, long, long>>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
               "MainloopSm120ArrayTmaWarpSpecializedBlockScaled<2, 3>, cute::tuple<cutlass::float_e2m1_t>>>>")
    assert rules.match(grouped).category == "moe.gemm" and rules.match(grouped).math == "native FP4 tensor cores"


# --- check: the backend the server really ran ----------------------------------------------------------------------

def write_run(capture: Path, **fields) -> Path:
    run = {"schema": "profattr.run/1", "name": capture.stem, "status": "complete", "target": "sglang",
           "capture": {"trace": "cuda,nvtx"}, "files": {"sqlite": capture.name}}
    run.update(fields)
    out = capture.with_name(capture.stem + ".run.json")
    out.write_text(json.dumps(run))
    return out


def findings_of(path) -> dict:
    _, findings = check_capture(path)
    return {f.check: f for f in findings}


SERVER_LOG = {"server_args": {"moe_runner_backend": "marlin", "fp4_gemm_runner_backend": "marlin"},
              "resolved": {"moe_runner_backend": "marlin", "fp4_gemm_runner_backend": "marlin"},
              "loaded_quant": {"quant": "modelopt_fp4", "quant_algo": "NVFP4"},
              "counts": {}, "in_window": {}, "events": {}}


def test_check_names_the_fp4_backend_asked_resolved_and_seen(tmp_path):
    db = nsys_export(tmp_path / "nvfp4.sqlite")
    write_run(db, backend={"requested": "marlin", "sglang": "marlin"}, server_log=SERVER_LOG,
              server={"args": ["--quantization", "modelopt_fp4", "--fp4-gemm-backend", "marlin"]})
    found = findings_of(tmp_path / "nvfp4.run.json")
    f = found["fp4_backend"]
    assert f.status == "pass", f.message
    for words in ("--fp4-gemm-backend marlin", "quant=modelopt_fp4, quant_algo=NVFP4", "marlin_dense",
                  "W4A16: unpacked to BF16 in the kernel"):
        assert words in f.message
    assert found["backend"].status == "pass"  # the expert Marlin is the marlin runner's GEMM family


def test_check_fails_when_the_fp4_backend_asked_for_did_not_run(tmp_path):
    db = nsys_export(tmp_path / "nvfp4.sqlite")
    log = dict(SERVER_LOG, resolved={"moe_runner_backend": "marlin", "fp4_gemm_runner_backend": "flashinfer_cutlass"})
    write_run(db, backend={"requested": "marlin", "sglang": "marlin"}, server_log=log,
              server={"args": ["--fp4-gemm-backend", "flashinfer_cutlass"]})
    f = findings_of(tmp_path / "nvfp4.run.json")["fp4_backend"]
    assert f.status == "fail" and "cutlass_gemm" in f.message and "marlin_dense" in f.message


def test_a_first_marlin_launch_orders_of_magnitude_slower_is_flagged(tmp_path):
    db = nsys_export(tmp_path / "cold.sqlite", first_dense_us=50_000)  # 50 ms against 20 us
    f = findings_of(db)["first_calls"]
    assert f.status == "fail"
    assert "Marlin" in f.message and "compiling" in f.message and f.data["jit_module"] == "marlin"
    assert f.data["excess_ms"] == pytest.approx(50.0 - 0.020, rel=1e-6)
    assert findings_of(nsys_export(tmp_path / "warm.sqlite"))["first_calls"].status == "pass"


# --- diff: two backends named, the same kernels run ----------------------------------------------------------------

def test_diff_of_two_backend_names_that_ran_the_same_kernels_says_so_first(tmp_path):
    a = nsys_export(tmp_path / "a.sqlite")
    b = nsys_export(tmp_path / "b.sqlite")
    write_run(a, backend={"requested": "marlin", "sglang": "marlin"}, server_log=SERVER_LOG)
    auto = dict(SERVER_LOG, resolved={"moe_runner_backend": "auto", "fp4_gemm_runner_backend": "auto"})
    write_run(b, backend={"requested": "auto", "sglang": "auto"}, server_log=auto)
    result = CliRunner().invoke(cli, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("WARNING: not a backend comparison") and "marlin in A, auto in B" in first
    assert "marlin_dense" in first
    data = json.loads(CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "json"]).stdout)
    assert data["warnings"][0].startswith("not a backend comparison")
    # different expert GEMMs: a real backend comparison, no such warning
    c = nsys_export(tmp_path / "c.sqlite", expert="void fused_moe_kernel(int)")
    write_run(c, backend={"requested": "triton", "sglang": "triton"},
              server_log=dict(SERVER_LOG, resolved={"moe_runner_backend": "triton"}))
    other = CliRunner().invoke(cli, ["diff", str(a), str(c)])
    assert "not a backend comparison" not in other.stdout


# --- capture: a server that refuses the backend ---------------------------------------------------------------------

REFUSAL = ("Current platform does not support NVFP4 quantization with the selected MoE backend. Please use "
           "Blackwell and above, or use moe_runner_backend=marlin on SM80+.")


@pytest.mark.nsys
def test_a_server_refusing_the_moe_backend_gives_one_line_with_what_it_said(tmp_path):
    from test_capture import free_port, invoke, real_nsys, stub_args, stub_env

    real_nsys()
    args = stub_args(tmp_path, tmp_path, free_port(), name="refused")
    args[args.index("--backend") + 1] = "flashinfer_cutedsl"
    args[args.index("--capture-range") + 1] = "cudaProfilerApi"  # nothing recorded: nsys writes no report
    result = invoke(args, env=stub_env(tmp_path / "events.jsonl", STUB_SGLANG_REFUSE=REFUSAL))
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    # one error line; the server's own traceback only in the echoed log tail (`capture:   | ...`), none of ours
    assert len(errors) == 1 and not any(line.startswith("Traceback") for line in result.stderr.splitlines())
    assert "exited (code 1)" in errors[0] and "before it was healthy" in errors[0]
    assert f"the server said: ValueError: {REFUSAL}" in errors[0]
    assert json.loads((tmp_path / "refused.run.json").read_text())["status"] == "failed"


def test_report_states_precision_and_math_and_puts_the_backend_line_first_in_its_diff(tmp_path):
    a = nsys_export(tmp_path / "a.sqlite")
    b = nsys_export(tmp_path / "b.sqlite")
    write_run(a, backend={"requested": "marlin", "sglang": "marlin"}, server_log=SERVER_LOG)
    write_run(b, backend={"requested": "auto", "sglang": "auto"},
              server_log=dict(SERVER_LOG, resolved={"moe_runner_backend": "auto"}))
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "| gemm.fp4 | fp4 | W4A16: unpacked to BF16 in the kernel |" in text
    pair = text[text.index("\n### `b` vs `a`"):]  # the diff section's block for this pair of captures (labels as code spans)
    lines = [line for line in pair.splitlines()[2:] if line.strip()]
    assert lines[0].startswith("- **The premise of this comparison is wrong:** not a backend comparison"), lines[:2]
