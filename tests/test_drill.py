"""Nsight Compute drills on the committed H200 captures: the raw CSV that `profattr drill` wrote (ncu 2025.3.1, SGLang
0.5.16 serving a GLM-5-shaped FP8 model in eager mode), read back without ncu, a verdict per kernel, `profattr
drill-report`, the report's "Why the top kernels are slow", and what bad input gets: one `error:` line, exit 2.

Every metric profattr reads is checked against a parser written here (python csv, the units converted by a table
written out below); verdicts against rules written from the raw numbers.
"""
from __future__ import annotations

import csv
import glob
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from badinput import assert_one_line_error
from profattr.trace.ncu_csv import read_ncu_csv

ROOT = Path(__file__).resolve().parent.parent
GLM = ROOT / "examples" / "h200" / "glm5"
DRILLS = ["glm-drill-triton", "glm-drill-triton-moe", "glm-drill-cutlass", "glm-drill-fp8dg"]
SAMPLES = "200"

# the units these CSVs use, to the unit the reader's field is named for; anything else fails the test loudly
NS_PER = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}
BYTES_PER_S = {"byte/s": 1.0, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
HZ = {"hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9}
LIMIT_NAMES = {"blocks": "blocks", "registers": "registers", "shared_mem": "shared memory", "warps": "warps",
               "barriers": "barriers"}


def raw_rows(path):
    """(units by column, one dict per kernel row) of an ncu raw CSV."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, units = rows[0], rows[1]
    return dict(zip(header, units)), [dict(zip(header, r)) for r in rows[2:]]


def num(text: str) -> float:
    return float(text.replace(",", ""))


def expected_kernels(path) -> list:
    """Every field profattr's reader returns, computed here from the raw CSV."""
    units, rows = raw_rows(path)
    out = []
    for r in rows:
        duration_ns = num(r["gpu__time_duration.sum"]) * NS_PER[units["gpu__time_duration.sum"]]
        rate = num(r["dram__bytes.sum.per_second"]) * BYTES_PER_S[units["dram__bytes.sum.per_second"]]
        assert units["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
        limits = {k: num(r[f"launch__occupancy_limit_{k}"])
                  for k in ("blocks", "registers", "shared_mem", "warps", "barriers")}
        out.append({
            "id": int(r["ID"]), "name": r["Kernel Name"],
            "grid": tuple(int(r[f"launch__grid_dim_{a}"]) for a in "xyz"),
            "block": tuple(int(r[f"launch__block_dim_{a}"]) for a in "xyz"),
            "grid_size": int(num(r["launch__grid_size"])), "block_size": int(num(r["launch__block_size"])),
            "duration_ns": duration_ns, "dram_bytes_per_s": rate, "dram_bytes": rate * duration_ns * 1e-9,
            "dram_throughput_pct": num(r["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"]),
            "sm_throughput_pct": num(r["sm__throughput.avg.pct_of_peak_sustained_elapsed"]),
            "memory_throughput_pct": num(r["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"]),
            "achieved_occupancy_pct": num(r["sm__warps_active.avg.pct_of_peak_sustained_active"]),
            "theoretical_occupancy_pct": num(r["sm__maximum_warps_per_active_cycle_pct"]),
            "waves_per_sm": num(r["launch__waves_per_multiprocessor"]),
            "registers_per_thread": int(num(r["launch__registers_per_thread"])),
            "sm_count": int(num(r["device__attribute_multiprocessor_count"])),
            "cluster_size": int(num(r["launch__cluster_size"])),
            "sm_clock_hz": (num(r["gpc__cycles_elapsed.avg.per_second"])
                            * HZ[units["gpc__cycles_elapsed.avg.per_second"]]),
            "ctas_per_sm": int(min(limits.values())),
            "ctas_per_sm_limiter": " and ".join(LIMIT_NAMES[k] for k, v in limits.items() if v == min(limits.values())),
            "device": r["Device"], "stream": r["Stream"],
        })
    return out


# short names as the nsys capture records them
SHORT = {"_w8a8_block_fp8_matmul": "_w8a8_block_fp8_matmul", "fused_moe_kernel": "fused_moe_kernel"}


def expected_short(name: str) -> str:
    if name.startswith("void device_kernel<"):
        return "device_kernel"
    if name.startswith("void sm90_fp8_gemm_1d2d_impl<"):  # DeepGEMM's JIT kernel, templated on its tile shape
        return "sm90_fp8_gemm_1d2d_impl"
    return SHORT.get(name, name)


@pytest.mark.parametrize("drill", DRILLS)
def test_reader_matches_an_independent_parse(drill):
    path = GLM / f"{drill}.ncu.csv"
    got = read_ncu_csv(path)
    want = expected_kernels(path)
    assert len(got.kernels) == len(want) > 0
    assert got.ncu_version == json.loads((GLM / f"{drill}.run.json").read_text())["ncu"]["version"] == "2025.3.1.0"
    for k, w in zip(got.kernels, want):
        assert k.short_name == expected_short(w["name"])
        assert k.dram_bytes_source == "dram__bytes.sum.per_second x gpu__time_duration.sum"
        for field, value in w.items():
            g = getattr(k, field)
            if isinstance(value, float):
                assert g == pytest.approx(value, rel=1e-12), (drill, k.id, field)
            else:
                assert g == value, (drill, k.id, field, g, value)


def test_the_dense_fp8_gemm_launches_as_ncu_recorded_them():
    """The first decode step's Triton FP8 block GEMMs (two layers' worth; the drill stopped after 15 launches)."""
    k = {x.id: x for x in read_ncu_csv(GLM / "glm-drill-triton.ncu.csv").kernels}
    assert sorted(k) == list(range(15))
    fp8 = [i for i in k if k[i].name == "_w8a8_block_fp8_matmul"]
    assert fp8 == [0, 1, 2, 3, 7, 8, 9, 10, 11, 12, 13]
    assert [k[i].grid_size for i in fp8] == [21, 128, 32, 1, 48, 192, 48, 21, 128, 32, 1]
    assert k[0].duration_ns == pytest.approx(35_488) and k[8].duration_ns == pytest.approx(109_952)
    assert k[0].dram_throughput_pct == pytest.approx(9.464039) and k[8].dram_throughput_pct == pytest.approx(29.03072)
    assert k[0].dram_bytes == pytest.approx(0.455019e12 * 35.488e-6)  # 16.1 MB: N=2624 x K=6144 FP8 weights
    assert all(k[i].block == (128, 1, 1) and k[i].registers_per_thread == 190 for i in fp8)
    assert all(x.sm_count == 132 for x in k.values())


def drill_json(*args) -> dict:
    result = CliRunner().invoke(cli, ["drill-report", *map(str, args), "--format", "json", "--accept-partial"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_dense_fp8_gemm_verdict_follows_its_grid_and_dram_throughput():
    data = drill_json(GLM / "glm-drill-triton.ncu.csv")
    assert data["schema"] == "profattr.drill/1"
    units, rows = raw_rows(GLM / "glm-drill-triton.ncu.csv")
    raw = {int(r["ID"]): r for r in rows}
    too_few = []
    for k in data["kernels"]:
        if k["name"] != "_w8a8_block_fp8_matmul":
            continue
        r = raw[k["id"]]
        ctas = int(r["launch__grid_size"])
        sms = int(r["device__attribute_multiprocessor_count"])
        dram = num(r["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"])
        sm = num(r["sm__throughput.avg.pct_of_peak_sustained_elapsed"])
        # the rule, from the raw numbers: at 60% of DRAM peak or more it is memory-bound; below it (and with the
        # SMs below it too), a grid smaller than the SM count leaves SMs idle; a grid that covers them is latency
        if dram >= 60:
            want = "memory_bound"
        elif sm >= 60:
            want = "compute_bound"
        elif ctas < sms:
            want = "too_few_ctas"
            too_few.append((ctas, dram))
        else:
            want = "latency_bound"
        assert k["verdict"]["kind"] == want, (k["id"], ctas, dram, k["verdict"])
    assert len(too_few) == 10
    name = next(n for n in data["names"] if n["name"] == "_w8a8_block_fp8_matmul")
    assert name["category"] == "gemm.fp8" and name["verdicts"][0]["verdict"] == "too_few_ctas"
    lo, hi = min(c for c, _ in too_few), max(c for c, _ in too_few)
    dlo, dhi = min(d for _, d in too_few), max(d for _, d in too_few)
    assert f"runs grids of {lo}-{hi} CTAs on a 132-SM GPU at {dlo:.1f}-{dhi:.1f}% of DRAM peak" in name["sentence"]
    assert (lo, hi) == (1, 128)
    assert "too few CTAs for the GPU" in name["sentence"] and "--fp8-gemm-backend" in name["sentence"]
    # SGLang's log in run.json: it ran its default config for the W8A8 shapes
    assert "no tuned config for 9 shapes" in name["sentence"] and "N=2624,K=6144" in name["sentence"]


def test_family_stats_are_min_median_max_of_the_launches():
    data = drill_json(GLM / "glm-drill-triton-moe.ncu.csv")
    fams = {f["grid_size"]: f for f in data["families"]}
    assert set(fams) == {256, 384}
    by_grid: dict = {}
    for w in expected_kernels(GLM / "glm-drill-triton-moe.ncu.csv"):
        by_grid.setdefault(w["grid_size"], []).append(w)
    for grid, ws in by_grid.items():
        d = sorted(w["duration_ns"] for w in ws)
        assert fams[grid]["duration_ns"] == pytest.approx({"min": d[0], "median": (d[0] + d[1]) / 2, "max": d[1]})
        assert fams[grid]["launches"] == len(ws) == 2
    assert fams[256]["verdict"]["kind"] == "memory_bound"  # 72.5-72.9 % of DRAM peak
    assert fams[384]["verdict"]["kind"] == "latency_bound" and fams[384]["verdict"]["borderline"]  # 57.7-57.9 %


def test_moe_bytes_against_the_experts_one_token_reads():
    """3 MoE layers x 8 experts x (gate, up, down) of 6144 x 2048 FP8 weights, each with one FP32 scale per
    128 x 128 block (quantization_config weight_block_size): the routed-expert floor."""
    run = json.loads((GLM / "glm-drill-cutlass.run.json").read_text())
    cfg = run["model_config"]
    moe_layers = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    matrices = moe_layers * cfg["num_experts_per_tok"] * 3
    bh, bw = cfg["quantization_config"]["weight_block_size"]
    scales = matrices * (cfg["hidden_size"] // bh) * (cfg["moe_intermediate_size"] // bw) * 4
    floor = matrices * cfg["hidden_size"] * cfg["moe_intermediate_size"] + scales
    data = drill_json(GLM / "glm-drill-cutlass.ncu.csv")
    row = next(r for r in data["categories"] if r["category"] == "moe.gemm")
    assert row["floor"]["bytes_per_step"] == floor == 905_969_664 + 221_184
    want = sum(w["dram_bytes"] for w in expected_kernels(GLM / "glm-drill-cutlass.ncu.csv"))
    assert row["dram_bytes"] == pytest.approx(want, rel=1e-12)
    assert row["launches"] == 4 and row["drilled_share_of_floor_bytes"] == pytest.approx(want / floor)
    rate = want / (sum(w["duration_ns"] for w in expected_kernels(GLM / "glm-drill-cutlass.ncu.csv")) * 1e-9)
    assert row["floor_ms_at_drilled_bandwidth"] == pytest.approx(floor / rate * 1e3)


def test_drill_report_table_and_markdown():
    result = CliRunner().invoke(cli, ["drill-report", str(GLM / "glm-drill-cutlass.ncu.csv")])
    assert result.exit_code == 0, result.output
    assert "device_kernel" in result.stdout and "memory-bound near peak" in result.stdout
    assert "eager (--disable-cuda-graph)" in result.stdout and "4 launches profiled of 4 asked for" in result.stdout
    md = CliRunner().invoke(cli, ["drill-report", str(GLM / "glm-drill-cutlass.ncu.csv"), "--format", "markdown"])
    assert md.exit_code == 0 and "| `device_kernel` | `moe.gemm` | 132x1x1 | 132 |" in md.stdout


# --- the report ------------------------------------------------------------------------------------------------------

def test_report_says_why_the_top_kernels_are_slow(export_example, tmp_path):
    triton, cutlass = export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-cutlass-bs1-r1")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(triton), str(cutlass), "-o", str(out), "--samples", SAMPLES,
                                      "--drill", str(GLM / "glm-drill-triton.ncu.csv"),
                                      "--drill", str(GLM / "glm-drill-cutlass.ncu.csv")])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "## Why the top kernels are slow" in text.splitlines()
    assert text.index("## Bottlenecks, ranked") < text.index("## Why the top kernels are slow")
    # the drills' verdicts are in each bottleneck's full reasoning (the ranked list keeps one line per bottleneck)
    ranked = text.split("## Bottlenecks in detail", 1)[1].split("\n## ", 1)[0]
    fp8 = next(line for line in ranked.splitlines() if "**gemm.fp8" in line and "(`triton`;" in line)
    assert "runs grids of 1-128 CTAs on a 132-SM GPU at 0.5-20.5% of DRAM peak" in fp8
    assert "too few CTAs for the GPU" in fp8
    # one line per category across captures: the cutlass drill's verdict joins the moe.gemm line
    moe = next(line for line in ranked.splitlines() if "**moe.gemm" in line)
    assert "in cutlass, ncu drill glm-drill-cutlass.ncu.csv" in moe and "memory-bound near peak" in moe
    why = text.split("## Why the top kernels are slow", 1)[1].split("\n## ", 1)[0]
    assert "the drill did not finish" in why and "ncu kept 15 of the 48 launches asked for" in why
    assert "--drill " in text  # the command line shown under Reproducibility names the drills


def test_report_finds_a_drill_beside_its_capture(export_example, tmp_path):
    src = export_example("glm5/glm-cutlass-bs1-r1")
    for f in (src, src.with_name("glm-cutlass-bs1-r1.run.json")):
        shutil.copyfile(f, tmp_path / f.name)
    for suffix in (".ncu.csv", ".run.json"):  # its run.json says it drilled glm-cutlass-bs1-r1
        shutil.copyfile(GLM / f"glm-drill-cutlass{suffix}", tmp_path / f"glm-drill-cutlass{suffix}")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(tmp_path / src.name), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "### glm-drill-cutlass.ncu.csv" in text and "found beside the capture" in text


# --- bad input: one line, exit 2, no traceback ------------------------------------------------------------------------



def report(path, *extra):
    return CliRunner().invoke(cli, ["drill-report", str(path), *extra])


def copy_without(tmp_path, drop, with_run=True) -> Path:
    units, rows = raw_rows(GLM / "glm-drill-triton.ncu.csv")
    header = [c for c in units if c not in drop]
    out = tmp_path / "glm-drill-triton.ncu.csv"
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        w.writerow([units[c] for c in header])
        for r in rows:
            w.writerow([r[c] for c in header])
    if with_run:
        shutil.copyfile(GLM / "glm-drill-triton.run.json", tmp_path / "glm-drill-triton.run.json")
    return out


def test_missing_columns_are_named_with_the_ncu_version(tmp_path):
    path = copy_without(tmp_path, {"gpu__time_duration.sum", "launch__waves_per_multiprocessor"})
    assert_one_line_error(report(path), "gpu__time_duration.sum", "launch__waves_per_multiprocessor",
                          "ncu 2025.3.1.0", "SpeedOfLight, MemoryWorkloadAnalysis, LaunchStats, Occupancy")


def test_missing_columns_without_run_json(tmp_path):
    # (Occupancy's columns are optional since a report collected without that section is read: a SpeedOfLight one)
    path = copy_without(tmp_path, {"sm__throughput.avg.pct_of_peak_sustained_elapsed"}, with_run=False)
    assert_one_line_error(report(path), "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                          "ncu version is not recorded")


def test_empty_csv(tmp_path):
    (tmp_path / "x.ncu.csv").write_text("")
    assert_one_line_error(report(tmp_path / "x.ncu.csv"), "empty")


def test_not_a_csv(tmp_path):
    (tmp_path / "x.ncu.csv").write_text("hello, world\nnot ncu\n")
    assert_one_line_error(report(tmp_path / "x.ncu.csv"), "not an ncu raw CSV")
    shutil.copyfile(GLM / "glm-drill-triton.ncu-rep", tmp_path / "y.ncu.csv")
    assert_one_line_error(report(tmp_path / "y.ncu.csv"), "binary file")


def test_truncated_csv(tmp_path):
    text = (GLM / "glm-drill-triton.ncu.csv").read_text()
    cut = text.index('","', len(text) - 2000) + 1  # between two fields of the last row
    (tmp_path / "a.ncu.csv").write_text(text[:cut] + "\n")
    assert_one_line_error(report(tmp_path / "a.ncu.csv"), "row 17 has", "truncated")
    inside = text.index('"', len(text) // 2) + 2  # inside a quoted field
    (tmp_path / "b.ncu.csv").write_text(text[:inside])
    assert_one_line_error(report(tmp_path / "b.ncu.csv"), "truncated")
    (tmp_path / "c.ncu.csv").write_text(text.splitlines()[0] + "\n")
    assert_one_line_error(report(tmp_path / "c.ncu.csv"), "no units row")


def test_zero_kernel_rows_name_the_regex_and_the_captures_top_kernels(tmp_path, export_example):
    lines = (GLM / "glm-drill-triton.ncu.csv").read_text().splitlines(keepends=True)
    (tmp_path / "glm-drill-triton.ncu.csv").write_text("".join(lines[:2]))
    shutil.copyfile(GLM / "glm-drill-triton.run.json", tmp_path / "glm-drill-triton.run.json")
    assert_one_line_error(report(tmp_path / "glm-drill-triton.ncu.csv"), "no kernel was profiled",
                          "'_w8a8_block_fp8_matmul|fused_moe_kernel|nvjet' matched no launch")
    capture = export_example("glm5/glm-triton-eager")
    assert_one_line_error(report(tmp_path / "glm-drill-triton.ncu.csv", "--capture", capture),
                          "the capture's top kernels are _w8a8_block_fp8_matmul")


def test_drill_without_ncu_says_where_to_get_it(tmp_path):
    result = CliRunner().invoke(cli, ["drill", str(GLM / "glm-triton-eager.run.json")],
                                env={"PROFATTR_NCU": "/nonexistent", "PATH": str(tmp_path)})
    assert_one_line_error(result, "/nonexistent", "install Nsight Compute", "developer.nvidia.com/nsight-compute")


@pytest.mark.skipif(bool(glob.glob("/usr/local/cuda*/bin/ncu") + glob.glob("/opt/nvidia/nsight-compute/*/ncu")),
                    reason="an ncu is installed here")
def test_drill_with_no_ncu_anywhere(tmp_path):
    result = CliRunner().invoke(cli, ["drill", str(GLM / "glm-triton-eager.run.json")],
                                env={"PROFATTR_NCU": None, "PATH": str(tmp_path)})
    assert_one_line_error(result, "ncu (Nsight Compute CLI) not found", "install Nsight Compute")


def test_a_drill_that_timed_out_reports_what_it_kept():
    result = report(GLM / "glm-drill-triton.ncu.csv")
    assert_one_line_error(result, "did not finish", "status 'interrupted'", "15 of the 48 launches")
    launches = re.findall(r"^  (\d+) +(\S+)", result.stdout.split("launches:", 1)[1].split("\n\n", 1)[0], re.M)
    assert [int(i) for i, _ in launches] == list(range(15))
    assert 'Failed to profile "nvjet_sm90_tst_256x8_64x6_2x1..."' in result.stdout  # ncu's own error, server log
    assert report(GLM / "glm-drill-triton.ncu.csv", "--accept-partial").exit_code == 0


def test_units_are_converted_by_the_units_row(tmp_path):
    """The same CSV with durations in msecond, DRAM rate in Gbyte/s and byte counts in Mbyte reads the same."""
    units, rows = raw_rows(GLM / "glm-drill-triton-moe.ncu.csv")
    header = list(units) + ["dram__bytes_read.sum", "dram__bytes_write.sum"]
    want = expected_kernels(GLM / "glm-drill-triton-moe.ncu.csv")
    out = tmp_path / "scaled.ncu.csv"
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        w.writerow([{"gpu__time_duration.sum": "msecond", "dram__bytes.sum.per_second": "Gbyte/s"}.get(c, units.get(c))
                    for c in header[:-2]] + ["Mbyte", "Mbyte"])
        for r, k in zip(rows, want):
            r = dict(r, **{"gpu__time_duration.sum": repr(k["duration_ns"] / 1e6),
                           "dram__bytes.sum.per_second": repr(k["dram_bytes_per_s"] / 1e9)})
            w.writerow([r[c] for c in header[:-2]] + [repr(0.75 * k["dram_bytes"] / 1e6),
                                                      repr(0.25 * k["dram_bytes"] / 1e6)])
    got = read_ncu_csv(out).kernels
    for k, w in zip(got, want):
        assert k.duration_ns == pytest.approx(w["duration_ns"], rel=1e-12)
        assert k.dram_bytes_per_s == pytest.approx(w["dram_bytes_per_s"], rel=1e-12)
        assert k.dram_bytes == pytest.approx(w["dram_bytes"], rel=1e-12)
        assert k.dram_bytes_source == "dram__bytes_read.sum + dram__bytes_write.sum"


def test_deep_gemm_dense_fp8_gemm_fills_the_gpu_and_moves_bytes_faster():
    """The dense FP8 GEMM backend pair, drilled: DeepGEMM's persistent kernel runs one CTA per SM (132) where
    Triton's runs 1-128 CTAs, and its launches move DRAM bytes 2.7x as fast (raw CSV sums written here). The
    DeepGEMM drill was cut short by a time limit: it says so and keeps the launches ncu finished."""
    dg, tr = GLM / "glm-drill-fp8dg.ncu.csv", GLM / "glm-drill-triton.ncu.csv"
    assert json.loads((GLM / "glm-drill-fp8dg.run.json").read_text())["status"] == "interrupted"
    _, rows = raw_rows(dg)
    assert {int(r["launch__grid_size"]) for r in rows} == {132}

    def rate(path, short):
        kernels = [w for w in expected_kernels(path) if expected_short(w["name"]) == short]
        return sum(w["dram_bytes"] for w in kernels) / sum(w["duration_ns"] for w in kernels) * 1e9, len(kernels)

    dg_rate, dg_n = rate(dg, "sm90_fp8_gemm_1d2d_impl")
    tr_rate, _ = rate(tr, "_w8a8_block_fp8_matmul")
    assert dg_n == len(rows) == 19 and dg_rate > 2.5 * tr_rate  # 2.22 vs 0.81 TB/s
    data = drill_json(dg)
    row = next(r for r in data["categories"] if r["category"] == "gemm.fp8")
    assert row["launches"] == dg_n
    assert row["dram_bytes"] / row["duration_ns"] * 1e9 == pytest.approx(dg_rate, rel=1e-9)
