"""Kernel rows per launch shape (name, grid, block, registers per thread), checked against the real GLM-5 captures.

Expected numbers come from SQL written here against the exports (the kernels' launch calls inside the decode spans,
as tests/independent.py assigns them), from the raw Nsight Compute CSVs read with the csv module, and from the
torch-profiler trace read with json: never from profattr's own output.
"""
from __future__ import annotations

import csv
import gzip
import json
import sqlite3
import statistics
from collections import Counter, defaultdict

import numpy as np
import pytest

from conftest import EXAMPLES
from independent import MEMOPS, NVTX_LIKE_STEPS_CTE, OPS_CTE, sql
from profattr.attribute.budget import compute_budget
from profattr.report.shapes import shape_rows
from profattr.report.why_slow import analyse_csv
from profattr.trace.kineto import KinetoTrace
from profattr.trace.ops import KIND_KERNEL, pack_block, pack_grid, shape_label, unpack_shape

DECODE = "step[DECODE bs=%]"
# the glm captures whose per-shape rows are checked: batch 1 (committed export) and batch 4 (exported here)
SHAPE_CAPTURES = ["glm5/glm-triton-bs1-r1", "glm5/glm-triton-bs4-r1", "glm5/glm-cutlass-bs1-r1"]

# every kernel whose launch call (on the same thread) lies inside a decode span, with its launch shape
KERNELS_IN_STEPS = "WITH " + NVTX_LIKE_STEPS_CTE + """,
kernels AS (
  SELECT k.start AS s, k."end" AS e, k.deviceId AS dev, sn.value AS name, k.gridX AS gx, k.gridY AS gy,
         k.gridZ AS gz, k.blockX AS bx, k.blockY AS by, k.blockZ AS bz, k.registersPerThread AS regs,
         r.globalTid AS tid, r.start AS api
  FROM CUPTI_ACTIVITY_KIND_KERNEL k
  JOIN StringIds sn ON sn.id = k.shortName
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = k.correlationId AND (r.globalTid & -16777216) = k.globalPid
),
assigned AS (
  SELECT kernels.*, steps.step FROM kernels JOIN steps
    ON steps.stid = kernels.tid AND kernels.api BETWEEN steps.ss AND steps.se
)
"""


def _shape(gx, gy, gz, bx, by, bz, regs) -> tuple:
    return ((gx, gy, gz), (bx, by, bz), regs)


def _budget_shapes(device: dict) -> dict:
    """(short name, grid, block, registers) -> [ms_per_step, count_per_step] summed over the budget's shape rows
    (a short name can have several demangled names)."""
    out: dict = defaultdict(lambda: [0.0, 0.0])
    for r in shape_rows(device):
        if r["shape"] is None:
            continue
        s = r["shape"]
        key = (r["name"], tuple(s["grid"]), tuple(s["block"]), s["registers_per_thread"])
        out[key][0] += r["ms_per_step"]
        out[key][1] += r["count_per_step"]
    return dict(out)


@pytest.fixture(scope="module")
def budgets(export_example):
    cache = {}

    def get(name):
        if name not in cache:
            path = export_example(name)
            cache[name] = (path, compute_budget(path).to_dict())
        return cache[name]

    return get


@pytest.mark.parametrize("name", SHAPE_CAPTURES)
def test_per_shape_launches_and_time_match_sql_group_by(name, budgets):
    path, budget = budgets(name)
    rows = sql(path, KERNELS_IN_STEPS + """
        SELECT dev, name, gx, gy, gz, bx, by, bz, regs, sum(e - s), count(*) FROM assigned
        GROUP BY dev, name, gx, gy, gz, bx, by, bz, regs""", {"pattern": DECODE})
    steps = dict(sql(path, KERNELS_IN_STEPS + "SELECT dev, count(DISTINCT step) FROM assigned GROUP BY dev",
                     {"pattern": DECODE}))
    want: dict = defaultdict(dict)
    for dev, kname, gx, gy, gz, bx, by, bz, regs, ns, count in rows:
        want[dev][(kname, (gx, gy, gz), (bx, by, bz), regs)] = (ns / steps[dev] / 1e6, count / steps[dev])
    assert {d["device"] for d in budget["devices"]} == set(want)
    for d in budget["devices"]:
        assert d["steps"] == steps[d["device"]]
        got = _budget_shapes(d)
        assert set(got) == set(want[d["device"]])
        for key, (ms, count) in want[d["device"]].items():
            assert got[key][0] == pytest.approx(ms, rel=1e-9), key
            assert got[key][1] == pytest.approx(count, rel=1e-9), key
        # the per-name rows are the sums of their shapes (what diff and the ledger read)
        for k in d["kernels"]:
            if k["shapes"]:
                assert sum(s["ms_per_step"] for s in k["shapes"]) == pytest.approx(k["ms_per_step"], rel=1e-9)
                assert sum(s["count_per_step"] for s in k["shapes"]) == pytest.approx(k["count_per_step"],
                                                                                      rel=1e-9)


@pytest.mark.parametrize("name", SHAPE_CAPTURES)
def test_lm_head_launch_is_its_own_shape_row(name, budgets):
    """The longest nvjet launch of each step (SGLang's logits projection) has a shape no other launch in the steps
    has: its row holds exactly one launch per step, and its mean duration is that of those launches."""
    path, budget = budgets(name)
    longest = sql(path, KERNELS_IN_STEPS + """
        SELECT dev, name, gx, gy, gz, bx, by, bz, regs, e - s FROM (
          SELECT *, row_number() OVER (PARTITION BY dev, step ORDER BY e - s DESC) AS rn
          FROM assigned WHERE name LIKE 'nvjet%') WHERE rn = 1""", {"pattern": DECODE})
    by_dev = defaultdict(list)
    for dev, kname, gx, gy, gz, bx, by, bz, regs, dur in longest:
        by_dev[dev].append(((kname, (gx, gy, gz), (bx, by, bz), regs), dur))
    for d in budget["devices"]:
        picks = by_dev[d["device"]]
        assert len(picks) == d["steps"]
        keys = {k for k, _ in picks}
        assert len(keys) == 1  # one launch shape in every step
        key = keys.pop()
        kname, grid, block, regs = key
        rows = [r for r in shape_rows(d) if r["name"] == kname and r["shape"]
                and (tuple(r["shape"]["grid"]), tuple(r["shape"]["block"]), r["shape"]["registers_per_thread"])
                == (grid, block, regs)]
        assert len(rows) == 1
        row = rows[0]
        assert row["count_per_step"] == pytest.approx(1.0, rel=1e-12)
        assert row["mean_us"] == pytest.approx(statistics.fmean(dur for _, dur in picks) / 1e3, rel=1e-9)
        assert row["label"] == f"grid {grid[0]}x{grid[1]}x{grid[2]} block {block[0]} regs {regs}"
        # the same name runs other, short shapes: the per-name mean hides the lm_head
        name_row = next(k for k in d["kernels"] if k["name"] == kname)
        assert len(name_row["shapes"]) >= 2
        assert row["mean_us"] > 10 * min(s["mean_us"] for s in name_row["shapes"])


@pytest.mark.parametrize("name", SHAPE_CAPTURES)
def test_short_kernel_statistics_match_sql(name, budgets, export_example):
    path, budget = budgets(name)
    short = dict((dev, (ns or 0, n)) for dev, ns, n in sql(path, KERNELS_IN_STEPS + """
        SELECT dev, sum(CASE WHEN e - s < 5000 THEN e - s END), sum(e - s < 5000) FROM assigned GROUP BY dev""",
                                                         {"pattern": DECODE}))
    tables = {r[0] for r in sql(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    memops = "".join(q for t, q in MEMOPS.items() if t in tables)
    total = dict(sql(path, "WITH " + OPS_CTE.format(memops=memops) + "," + NVTX_LIKE_STEPS_CTE + """
        SELECT dev, sum(e - s) FROM ops JOIN steps ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss AND steps.se
        GROUP BY dev""", {"pattern": DECODE}))
    for d in budget["devices"]:
        ns, n = short[d["device"]]
        s = d["short_kernels"]
        assert s["under_us"] == 5.0
        assert n > 0
        assert s["count_per_step"] == pytest.approx(n / d["steps"], rel=1e-12)
        assert s["ms_per_step"] == pytest.approx(ns / d["steps"] / 1e6, rel=1e-9)
        assert s["share"] == pytest.approx(ns / total[d["device"]], rel=1e-9)


def test_triton_fp8_gemm_rows_per_grid_match_sql_at_batch_1_and_4(budgets):
    """_w8a8_block_fp8_matmul: one name, several grids; the same grid at batch 4 and batch 1 are separate rows, and
    each is what SQL says for that grid."""
    for name in ("glm5/glm-triton-bs1-r1", "glm5/glm-triton-bs4-r1"):
        path, budget = budgets(name)
        d = budget["devices"][0]
        k = next(k for k in d["kernels"] if k["name"] == "_w8a8_block_fp8_matmul")
        grids = {tuple(s["shape"]["grid"]) for s in k["shapes"]}
        assert len(grids) >= 4
        rows = sql(path, KERNELS_IN_STEPS + """
            SELECT gx, gy, gz, bx, by, bz, regs, avg(e - s) FROM assigned WHERE name = '_w8a8_block_fp8_matmul'
            GROUP BY gx, gy, gz, bx, by, bz, regs""", {"pattern": DECODE})
        got = {(tuple(s["shape"]["grid"]), tuple(s["shape"]["block"]), s["shape"]["registers_per_thread"]):
               s["mean_us"] for s in k["shapes"]}
        assert got == pytest.approx({_shape(*r[:7]): r[7] / 1e3 for r in rows}, rel=1e-9)


def test_replicates_mean_budget_averages_each_shape(budgets, export_example):
    """diff's mean budget of two replicate windows: each shape's launches and ms per step are the mean of what SQL
    gives for it in each window (a shape missing from a window counts 0 there), and so are the short kernels."""
    from profattr.attribute.diff import group, load_side

    names = ["glm5/glm-triton-bs1-r1", "glm5/glm-triton-bs1-r2"]
    mean = group([load_side(export_example(n)) for n in names]).budget["devices"][0]
    want: dict = defaultdict(lambda: [0.0, 0.0])
    short_ms = 0.0
    for n in names:
        path = export_example(n)
        rows = sql(path, KERNELS_IN_STEPS + """
            SELECT name, gx, gy, gz, bx, by, bz, regs, sum(e - s), count(*) FROM assigned
            GROUP BY name, gx, gy, gz, bx, by, bz, regs""", {"pattern": DECODE})
        steps = sql(path, KERNELS_IN_STEPS + "SELECT count(DISTINCT step) FROM assigned", {"pattern": DECODE})[0][0]
        for kname, gx, gy, gz, bx, by, bz, regs, ns, count in rows:
            key = (kname, (gx, gy, gz), (bx, by, bz), regs)
            want[key][0] += ns / steps / 1e6 / len(names)
            want[key][1] += count / steps / len(names)
        short_ns = sql(path, KERNELS_IN_STEPS + "SELECT sum(CASE WHEN e - s < 5000 THEN e - s END) FROM assigned",
                       {"pattern": DECODE})[0][0]
        short_ms += short_ns / steps / 1e6 / len(names)
    got = _budget_shapes(mean)
    assert set(got) == set(want)
    for key, (ms, count) in want.items():
        assert got[key] == pytest.approx([ms, count], rel=1e-9), key
    assert mean["short_kernels"]["ms_per_step"] == pytest.approx(short_ms, rel=1e-9)


@pytest.mark.parametrize("name", ["glm5/glm-triton-bs1-r1", "glm5/glm-triton-bs4-r1"])
def test_lm_head_gets_its_own_efficiency_against_its_weight_bytes(name, budgets, tmp_path):
    """The report's gap gives the logits projection's shape its own efficiency: the lm_head weights of the model
    run.json recorded (vocab x hidden, bf16) at the GPU's DRAM bandwidth the export records, over the mean duration
    SQL gives for the longest nvjet launch of each step."""
    from click.testing import CliRunner

    from profattr import run_record
    from profattr.cli import cli
    from profattr.report.collect import capture_gap
    from profattr.trace.reader import run_json_path

    path, budget = budgets(name)
    run = json.loads(run_json_path(path).read_text())
    config = run["model_config"]
    weight_bytes = config["vocab_size"] * config["hidden_size"] * 2  # bf16, not tied, one rank (tp 1)
    bandwidth = sql(path, "SELECT memoryBandwidth FROM TARGET_INFO_GPU WHERE id = 0")[0][0]
    durations = [r[0] for r in sql(path, KERNELS_IN_STEPS + """
        SELECT e - s FROM (SELECT *, row_number() OVER (PARTITION BY dev, step ORDER BY e - s DESC) AS rn
                           FROM assigned WHERE name LIKE 'nvjet%') WHERE rn = 1""", {"pattern": DECODE})]
    gap, note = capture_gap(budget, run_record.load(run_json_path(path)), str(run_json_path(path)), None)
    assert note is None
    lm = gap["devices"][0]["lm_head"]
    assert lm["weight_bytes"] == pytest.approx(weight_bytes, rel=1e-12)
    assert lm["mean_us"] == pytest.approx(statistics.fmean(durations) / 1e3, rel=1e-9)
    want = 100.0 * (weight_bytes / bandwidth) / (statistics.fmean(durations) * 1e-9)
    assert lm["efficiency_pct"] == pytest.approx(want, rel=1e-9)
    assert 50.0 < lm["efficiency_pct"] < 100.0
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert f"{lm['efficiency_pct']:.1f}% of its limit" in text and "Logits projection (`lm_head`)" in text


def _linear_mnk(text: str):
    """(M, N, K) of a layerwise marker's text read as the Python literal it is; None unless a linear layer's."""
    import ast

    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    weight = (d.get("TrainableParams") or {}).get("weight")
    inputs = d.get("Inputs") or []
    if not isinstance(weight, list) or len(weight) != 2 or not inputs or not inputs[0]:
        return None
    n, k = weight
    if inputs[0][-1] != k:
        return None
    m = 1
    for v in inputs[0][:-1]:
        m *= v
    return (m, n, k)


def _eager_expected(path):
    """(steps, {(name, grid, block, registers, (M, N, K) or None): [ms_per_step, count_per_step]}) of the eager
    capture's decode steps, each kernel taking the innermost linear-layer range open at its launch call."""
    rows = sql(path, KERNELS_IN_STEPS + """,
        lin AS (
          SELECT n.globalTid AS ltid, n.start AS ls, n."end" AS le, COALESCE(t.value, n.text) AS txt
          FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
          WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) LIKE '%''TrainableParams''%')
        SELECT a.dev, a.name, a.gx, a.gy, a.gz, a.bx, a.by, a.bz, a.regs, a.e - a.s, a.step,
               (SELECT group_concat(txt, char(1)) FROM (SELECT txt FROM lin WHERE lin.ltid = a.tid
                                                         AND a.api BETWEEN lin.ls AND lin.le ORDER BY lin.ls DESC))
        FROM assigned a""", {"pattern": DECODE})
    steps = len({r[10] for r in rows})
    want: dict = defaultdict(lambda: [0.0, 0.0])
    for dev, kname, gx, gy, gz, bx, by, bz, regs, dur, _step, texts in rows:
        mnk = next((x for x in (_linear_mnk(t) for t in (texts or "").split("\x01") if t) if x), None)
        want[(kname, (gx, gy, gz), (bx, by, bz), regs, mnk)][0] += dur / steps / 1e6
        want[(kname, (gx, gy, gz), (bx, by, bz), regs, mnk)][1] += 1 / steps
    return steps, dict(want)


def test_eager_capture_splits_gemm_shapes_by_the_m_n_k_of_their_linear_layer(export_example):
    """In the eager twin (layerwise NVTX markers), a GEMM launched inside a linear layer's range carries that
    layer's M, N, K: each (name, grid, block, registers, M, N, K) row is what SQL gives when every kernel takes the
    innermost linear-layer range open on its launching thread."""
    path = export_example("glm5/glm-triton-eager")
    budget = compute_budget(path).to_dict()
    assert budget["steps"]["source"].startswith("nvtx-re:^step\\[DECODE")
    steps, want = _eager_expected(path)
    got: dict = defaultdict(lambda: [0.0, 0.0])
    d = budget["devices"][0]
    assert d["steps"] == steps
    for r in shape_rows(d):
        if r["shape"] is None:
            continue
        s = r["shape"]
        g = s.get("gemm")
        key = (r["name"], tuple(s["grid"]), tuple(s["block"]), s["registers_per_thread"],
               (g["m"], g["n"], g["k"]) if g else None)
        got[key][0] += r["ms_per_step"]
        got[key][1] += r["count_per_step"]
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    # the Triton FP8 GEMM's grid of 48 CTAs is three GEMMs (N=6144 with K=16384, 12288, 2048): three rows
    k48 = {key[4] for key in want if key[0] == "_w8a8_block_fp8_matmul" and key[1] == (48, 1, 1)}
    assert len(k48) >= 2 and all(x is not None and x[1] == 6144 for x in k48)


def test_graph_capture_with_mapping_borrows_n_and_k_but_not_m(export_example):
    """With --mapping EAGER, a replayed GEMM takes the N and K of the linear layer its matched eager op ran in; M is
    left unknown (the eager twin's batch need not be the capture's). Per (name, grid, block, registers) the rows
    still add up to SQL's, and every N, K is one the eager capture's SQL gives that shape."""
    eager = export_example("glm5/glm-triton-eager")
    _, in_eager = _eager_expected(eager)
    path = export_example("glm5/glm-triton-bs4-r1")
    budget = compute_budget(path, mapping=eager).to_dict()
    d = budget["devices"][0]
    nk_of: dict = defaultdict(set)
    for key in in_eager:
        if key[4] is not None:
            nk_of[key[0]].add(key[4][1:])
    named = 0
    for r in shape_rows(d):
        g = (r["shape"] or {}).get("gemm")
        if g:
            named += 1
            assert g["m"] is None and (g["n"], g["k"]) in nk_of[r["name"]]
            assert r["label"].endswith(f" N={g['n']} K={g['k']}") and " M=" not in r["label"]
    assert named >= 5
    rows = sql(path, KERNELS_IN_STEPS + """
        SELECT name, gx, gy, gz, bx, by, bz, regs, count(*) FROM assigned GROUP BY name, gx, gy, gz, bx, by, bz, regs""",
               {"pattern": DECODE})
    got = _budget_shapes(d)
    assert {_k[0:1] + _shape(*_k[1:8]) for _k in rows} == {(k[0], k[1], k[2], k[3]) for k in got}
    for r in rows:
        assert got[(r[0],) + _shape(*r[1:8])][1] == pytest.approx(r[8] / d["steps"], rel=1e-9)


def test_drilled_shape_names_the_gemms_the_eager_capture_ran_with_it(export_example):
    path = export_example("glm5/glm-triton-eager")
    _, want = _eager_expected(path)
    a = analyse_csv(EXAMPLES / "glm5" / "glm-drill-triton.ncu.csv", compute_budget(path).to_dict()).to_dict()
    fams = [f for f in a["families"] if f["short_name"] == "_w8a8_block_fp8_matmul"]
    assert fams
    for f in fams:
        key = (f["short_name"], tuple(f["grid"]), tuple(f["block"]), f["registers_per_thread"])
        dims = sorted(k[4] for k in want if k[:4] == key and k[4] is not None)
        assert sorted((g["m"], g["n"], g["k"]) for g in f["capture"]["gemm"]) == dims
        assert f["capture"]["count_per_step"] == pytest.approx(sum(v[1] for k, v in want.items() if k[:4] == key),
                                                               rel=1e-9)
        for m, n, k in dims:
            assert f"M={m} N={n} K={k}" in f["sentence"]


# --- Nsight Compute drills -----------------------------------------------------------------------------------------

DRILLS = sorted(p.name for p in (EXAMPLES / "glm5").glob("glm-drill-*.ncu.csv"))
TIME_UNITS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}


def _raw_families(path) -> dict:
    """(kernel name, grid, block, registers) -> durations (ns) of its launches, straight from the raw CSV."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {n: i for i, n in enumerate(header)}
    scale = TIME_UNITS[units[col["gpu__time_duration.sum"]].strip().lower()]

    def num(row, name):
        return float(row[col[name]].replace(",", ""))

    out = defaultdict(list)
    for r in data:
        key = (r[col["Kernel Name"]].strip(),
               tuple(int(num(r, f"launch__grid_dim_{a}")) for a in "xyz"),
               tuple(int(num(r, f"launch__block_dim_{a}")) for a in "xyz"),
               int(num(r, "launch__registers_per_thread")))
        out[key].append(num(r, "gpu__time_duration.sum") * scale)
    return out


@pytest.mark.parametrize("drill", DRILLS)
def test_ncu_families_are_the_csv_grouped_by_launch_shape(drill):
    path = EXAMPLES / "glm5" / drill
    want = _raw_families(path)
    a = analyse_csv(path).to_dict()
    got = {(f["name"], tuple(f["grid"]), tuple(f["block"]), f["registers_per_thread"]): f for f in a["families"]}
    assert set(got) == set(want)
    for key, durations in want.items():
        f = got[key]
        assert f["launches"] == len(durations)
        assert f["total_duration_ns"] == pytest.approx(sum(durations), rel=1e-9)
        assert f["duration_ns"]["median"] == pytest.approx(statistics.median(durations), rel=1e-9)
        grid, block, regs = key[1], key[2], key[3]
        # the family's verdict sentence names the shape it is about
        assert f["label"] in f["sentence"] and f["verdict"]["title"] in f["sentence"]
        shown = "x".join(str(v) for v in (block if block[2] != 1 else block[:2] if block[1] != 1 else block[:1]))
        assert f["label"] == f"grid {grid[0]}x{grid[1]}x{grid[2]} block {shown} regs {regs}"
    # every name with several shapes lists one line per shape
    for n in a["names"]:
        shapes = [k for k in want if k[0] == n["name"]]
        assert len(n["shapes"]) == len(shapes)


def test_triton_drill_shows_each_gemm_shape_with_its_bandwidth():
    """The Triton FP8 GEMM drill: one family per grid, each with its own duration and DRAM bandwidth, so the grids
    that fill few SMs stand apart from the one that fills most of them."""
    path = EXAMPLES / "glm5" / "glm-drill-triton.ncu.csv"
    a = analyse_csv(path).to_dict()
    fams = [f for f in a["families"] if f["short_name"] == "_w8a8_block_fp8_matmul"]
    raw = {k: v for k, v in _raw_families(path).items() if k[0] == "_w8a8_block_fp8_matmul"}
    assert len(fams) == len(raw) >= 4
    verdicts = {tuple(f["grid"]): f["verdict"]["kind"] for f in fams}
    assert len(set(verdicts.values())) >= 2  # not one verdict for the whole name
    for f in fams:
        assert f"{f['dram_bytes_per_s']['median'] / 1e12:.2f} TB/s" in f["sentence"]


# --- torch-profiler traces -----------------------------------------------------------------------------------------

def test_torch_trace_kernels_carry_their_launch_shape():
    path = EXAMPLES / "glm5" / "glm-triton-torch-r1-TP-0.trace.json.gz"
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    want = Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = e["args"]
            want[(e["name"], tuple(a["grid"]), tuple(a["block"]), a["registers per thread"])] += 1
    trace = KinetoTrace(path)
    ops = trace.ops()
    kern = ops.kind == KIND_KERNEL
    names = trace.strings(np.unique(ops.demangled_id[kern]))
    got = Counter()
    for dem, g, b in zip(ops.demangled_id[kern], ops.grid[kern], ops.block[kern]):
        s = unpack_shape(g, b)
        got[(names[int(dem)], tuple(s["grid"]), tuple(s["block"]), s["registers_per_thread"])] += 1
    assert got == want


# --- edge cases ----------------------------------------------------------------------------------------------------

def test_shapes_that_do_not_fit_their_bits_are_unknown_not_wrapped():
    grid = pack_grid([2, 1 << 31, 3, 7], [66, 1, 1 << 16, 1], [1, 1, 1, -1])
    block = pack_block([384, 1 << 15, 128, 32], [1, 1, 1, 1], [1, 1, 1, 1], [168, 32, 255, -1])
    assert grid.tolist()[1:] == [-1, -1, -1] and block.tolist()[1] == -1 and block.tolist()[3] == -1
    assert unpack_shape(grid[0], block[0]) == {"grid": [2, 66, 1], "block": [384, 1, 1], "registers_per_thread": 168}
    assert unpack_shape(grid[1], block[0]) is None
    assert shape_label(None) == "shape not recorded"
    assert shape_label(unpack_shape(pack_grid(8, 4, 1), pack_block(128, 2, 1, 40))) == "grid 8x4x1 block 128x2 regs 40"


# --- the ledger ----------------------------------------------------------------------------------------------------

def test_a_ledger_made_before_shapes_gets_their_tables_on_its_next_add(tmp_path):
    from click.testing import CliRunner

    from profattr.cli import cli

    def ok(*args):
        result = CliRunner().invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.stdout

    first, second = EXAMPLES / "glm5" / "glm-triton-bs1-r1.sqlite", EXAMPLES / "glm5" / "glm-cutlass-bs1-r1.sqlite"
    db = tmp_path / "ledger.db"
    ok("ledger", "add", first, "--ledger", db)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE kernel_shapes")
    conn.execute("DROP TABLE short_kernels")
    conn.commit()
    conn.close()
    old = json.loads(ok("ledger", "show", "1", "--ledger", db, "--format", "json"))["budget"]
    assert all(k["shapes"] == [] for d in old["devices"] for k in d["kernels"])  # nothing recorded, nothing made up
    assert all("short_kernels" not in d for d in old["devices"])
    ok("ledger", "add", second, "--ledger", db)
    new = json.loads(ok("ledger", "show", "2", "--ledger", db, "--format", "json"))["budget"]
    want = compute_budget(second).to_dict()
    for got, d in zip(new["devices"], want["devices"]):
        assert [[s["label"] for s in k["shapes"]] for k in got["kernels"]] == [
            [s["label"] for s in k["shapes"]] for k in d["kernels"]]
        assert got["short_kernels"] == pytest.approx(d["short_kernels"], rel=1e-12)


def test_a_shape_beyond_its_bits_is_not_recorded_and_split_from_the_known_ones(tmp_path):
    """Synthetic export: one kernel name launched with a normal shape, a grid beyond 2^31 CTAs and negative registers:
    the two damaged launches form one 'shape not recorded' row, the normal ones their own row; the name's totals
    keep every launch."""
    from synth import Builder, gpid, gtid

    b = Builder(tmp_path / "c.sqlite")
    T, P = gtid(5), gpid(5)
    corr = []
    for i in range(2):
        t = i * 1000
        b.nvtx(T, t, t + 900, "decode_step")
        for j in range(3):
            c = b.launch(T, t + 10 + 10 * j, t + 15 + 10 * j)
            b.kernel(P, c, t + 100 + 100 * j, t + 150 + 100 * j, "gemm_kernel")
            corr.append(c)
    path = b.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 4294967296 WHERE correlationId = ?", (corr[1],))
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET registersPerThread = -5 WHERE correlationId = ?", (corr[4],))
    conn.commit()
    conn.close()
    d = compute_budget(path, steps="nvtx:decode_step").to_dict()["devices"][0]
    k = next(k for k in d["kernels"] if k["name"] == "gemm_kernel")
    assert k["count_per_step"] == 3.0
    by_label = {s["label"]: s for s in k["shapes"]}
    assert set(by_label) == {"grid 1x1x1 block 128 regs 32", "shape not recorded"}
    assert by_label["shape not recorded"]["shape"] is None and by_label["shape not recorded"]["count_per_step"] == 1.0
    assert by_label["grid 1x1x1 block 128 regs 32"]["count_per_step"] == 2.0


def test_budget_csv_lists_each_shape_after_its_kernel_and_the_short_kernels(budgets):
    from click.testing import CliRunner

    from profattr.cli import cli

    path, budget = budgets("glm5/glm-triton-bs1-r1")
    result = CliRunner().invoke(cli, ["budget", str(path), "--format", "csv"])
    assert result.exit_code == 0, result.output
    table = [r for r in csv.reader(result.stdout.splitlines()) if r]
    rows = table[1:]
    assert all(len(r) == len(table[0]) for r in rows)
    d = budget["devices"][0]
    want = [(k["demangled"], None) for k in d["kernels"]]
    got = []
    for r in rows:
        if r[1] == "kernel":
            got.append((r[3], None))
            shapes = []
        elif r[1] == "kernel_shape":
            shapes.append((r[3], float(r[4]), float(r[5])))
            got[-1] = (got[-1][0], shapes)
    by_name = {k["demangled"]: k for k in d["kernels"]}
    assert [g[0] for g in got] == [w[0] for w in want]
    for name, shapes in got:
        k = by_name[name]
        assert [s[0] for s in shapes or []] == [f"{name} [{s['label']}]" for s in k["shapes"]]
        if shapes:
            assert sum(s[1] for s in shapes) == pytest.approx(k["ms_per_step"], rel=1e-9)
    short = next(r for r in rows if r[1] == "short_kernels")
    assert float(short[4]) == pytest.approx(d["short_kernels"]["ms_per_step"], rel=1e-12)
