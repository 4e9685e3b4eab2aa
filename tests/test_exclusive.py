"""Exclusive time per category on real captures, against a sweep written here.

The ops and their steps come from SQL on the export (tests/independent.py's step definitions: the launch call inside
the step on the same thread); each op's category is the one the budget gives its kernel (name, demangled name): the
classification is tested elsewhere, the split of busy time among categories is what is tested here. The sweep below
is plain Python with exact fractions: cut the step at every op start and end, share each slice equally among the
categories running in it (each counted once). profattr's integer ns per (step, category) must lie within 1 ns of
that, and per step the categories must add up to the union of the intervals exactly, so exclusive + idle == span.
"""
from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from conftest import GLM_CAPTURES, SGLANG_CAPTURES, SGLANG_EAGER_CAPTURES, WORKLOAD_2024_CAPTURES, WORKLOAD_CAPTURES
from independent import GRAPH_STEPS_CTE, MEMOPS, NVTX_LIKE_STEPS_CTE, NVTX_STEPS_CTE, OPS_CTE, _connect, _tables, sql
from profattr.attribute.budget import _one_window, compute_budget
from profattr.attribute.exclusive import Exclusive
from profattr.taxonomy.classify import load_rules
from profattr.trace.ops import KIND_KERNEL
from profattr.trace.reader import open_export

set_hypothesis_home_dir(tempfile.mkdtemp(prefix="profattr-hypothesis-"))

DECODE = "step[DECODE bs=%]"
# one GPU and two streams (bs4: the shared expert on a second stream), graphs and eager, TP2 with collectives
CAPTURES = (["glm5/glm-triton-bs1-r1", "glm5/glm-triton-bs4-r1", "glm5/glm-cutlass-bs4-r1", "glm5/glm-fp8dg-bs4-r1",
             "glm5/glm-triton-eager"] + SGLANG_CAPTURES[:1] + ["wl-eager-loop", "wl-graph-grouped-tp2"])
# every committed capture with kernel rows (wl-graph-trace-graph has none: `--cuda-graph-trace=graph`)
ALL = (GLM_CAPTURES + SGLANG_CAPTURES + SGLANG_EAGER_CAPTURES + WORKLOAD_CAPTURES
       + [n for n in WORKLOAD_2024_CAPTURES if n != "wl-graph-trace-graph"])


def step_cte(name: str, path):
    """The step definition of the capture family, as tests/test_budget_real.py and test_glm_real.py use it."""
    if name.startswith("glm5/"):
        return NVTX_LIKE_STEPS_CTE, {"pattern": DECODE}
    if name in SGLANG_EAGER_CAPTURES:  # SGLang's per-forward module range, as test_sglang_mapping_real.py takes it
        return NVTX_STEPS_CTE, {"name": compute_budget(path).steps_source.split(":", 1)[1]}
    if name.startswith("sglang-"):
        rows = sql(path, """SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                            JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%'
                            ORDER BY r.globalTid, r.start""")
        gaps = sorted(b[1] - a[1] for a, b in zip(rows, rows[1:]) if a[0] == b[0])
        return GRAPH_STEPS_CTE, {"last_len": int(np.median(gaps))}
    return NVTX_STEPS_CTE, {"name": "decode_step"}


def assigned_ops(path, cte: str, params: dict) -> list:
    """(device, step, start, end, short name, demangled name, kind) of every GPU op launched inside a step."""
    conn = _connect(path)
    memops = "".join(q for t, q in MEMOPS.items() if t in _tables(conn))
    rows = conn.execute("WITH " + OPS_CTE.format(memops=memops) + "," + cte + """
        SELECT ops.dev, steps.step, ops.s, ops.e, ops.name, ops.demangled, ops.kind FROM ops JOIN steps
          ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss AND steps.se""", params).fetchall()
    conn.close()
    return rows


def exact_split(intervals) -> tuple:
    """({category: Fraction ns}, union ns) of one step's (start, end, category) intervals: each slice between
    consecutive boundaries shared equally among the distinct categories running in all of it."""
    times = sorted({t for s, e, _ in intervals for t in (s, e)})
    starts = defaultdict(list)
    ends = defaultdict(list)
    for s, e, c in intervals:
        if e > s:
            starts[s].append(c)
            ends[e].append(c)
    running: dict = defaultdict(int)
    shares: dict = defaultdict(Fraction)
    union = 0
    for t, nxt in zip(times, times[1:]):
        for c in ends.get(t, []):
            running[c] -= 1
        for c in starts.get(t, []):
            running[c] += 1
        active = [c for c, n in running.items() if n > 0]
        if active:
            union += nxt - t
            for c in active:
                shares[c] += Fraction(nxt - t, len(active))
    return shares, union


def categories_by_op(path) -> dict:
    """(device, start, end, demangled name) -> category per op, as the budget classified it (an op's category may
    depend on its NVTX context, so it is looked up per op, not per kernel name); memory ops: "memcpy"/"memset"."""
    att = compute_budget(path, keep_attribution=True).attribution
    demangled = att.combos["demangled"].to_numpy()[att.combo]
    cat = att.category()
    out: dict = {}
    for i in range(len(att.ops)):
        name = demangled[i] if att.ops.kind[i] == KIND_KERNEL else ("memset" if cat[i] == "memory.set" else "memcpy")
        key = (int(att.ops.device[i]), int(att.ops.start[i]), int(att.ops.end[i]), name)
        assert out.setdefault(key, cat[i]) == cat[i], key
    return out


def check_capture(path, cte, params, budget) -> None:
    ops = assigned_ops(path, cte, params)
    per = defaultdict(list)
    devices = {d["device"]: d for d in budget.to_dict()["devices"]}
    cats = categories_by_op(path)
    for dev, step, s, e, _name, demangled, _kind in ops:
        per[(dev, step)].append((s, e, cats[(dev, s, e, demangled)]))
    psc = budget.per_step_category.frame()
    ps = budget.per_step.set_index(["device", "start_ns"])
    got_by_step = {k: dict(zip(g["category"], g["exclusive_ns"])) for k, g in psc.groupby(["device", "step"])}
    total_excl = defaultdict(int)
    total_idle = defaultdict(int)
    total_span = defaultdict(int)
    for (dev, _), intervals in per.items():
        first = min(s for s, _, _ in intervals)
        row = ps.loc[(dev, first)]
        step = int(row["step"])
        span = max(e for _, e, _ in intervals) - first
        assert int(row["span_ns"]) == span
        want, union = exact_split(intervals)
        got = got_by_step.get((dev, step), {})
        assert set(c for c, v in got.items() if v) == set(c for c, v in want.items() if v)
        for c, v in want.items():
            assert abs(got.get(c, 0) - v) < 1, (dev, step, c, got.get(c), float(v))
        assert sum(int(v) for v in got.values()) == union == int(row["busy_ns"])
        total_excl[dev] += sum(int(v) for v in got.values())
        total_idle[dev] += span - union
        total_span[dev] += span
    for dev, d in devices.items():
        assert total_excl[dev] + total_idle[dev] == total_span[dev]
        n = d["steps"]
        excl_ms = sum(c["exclusive_ms_per_step"] for c in d["categories"])
        assert excl_ms + d["idle_ms_per_step"] == pytest.approx(total_span[dev] / n / 1e6, rel=1e-12, abs=1e-12)
        assert sum(c["share"] for c in d["categories"]) + d["idle_share"] == pytest.approx(1.0, abs=1e-12)
        for c in d["categories"]:
            assert c["ms_per_step"] - c["exclusive_ms_per_step"] == pytest.approx(c["overlapped_ms_per_step"],
                                                                                    abs=1e-12)
            assert c["overlapped_ms_per_step"] >= -1e-12
        assert sum(c["overlapped_ms_per_step"] for c in d["categories"]) == pytest.approx(
            d["overlap_ms_per_step"], abs=1e-9)


@pytest.mark.parametrize("name", CAPTURES)
def test_exclusive_split_matches_an_independent_sweep(name, export_example):
    path = export_example(name)
    cte, params = step_cte(name, path)
    check_capture(path, cte, params, compute_budget(path))


@pytest.mark.parametrize("name", [n for n in ALL if n not in CAPTURES])
def test_exclusive_split_on_every_other_capture(name, export_example):
    path = export_example(name)
    cte, params = step_cte(name, path)
    check_capture(path, cte, params, compute_budget(path))


@pytest.mark.parametrize("name", ["glm5/glm-triton-bs4-r1", "wl-graph-grouped-tp2"])
def test_rounding_a_few_rows_at_a_time_matches_the_sweep(name, export_example, monkeypatch):
    """Exclusive.finish rounds runs of whole steps (a long capture's millions of rows are not rounded at once):
    with runs of 3 rows (most steps cut their own runs, some runs hold one step alone) the split still matches the
    sweep written here."""
    from profattr.attribute import exclusive

    monkeypatch.setattr(exclusive, "ROUND_ROWS", 3)
    path = export_example(name)
    cte, params = step_cte(name, path)
    check_capture(path, cte, params, compute_budget(path))


def test_bs4_second_stream_overlaps_the_dense_fp8_gemm(export_example):
    """At batch 4 the shared expert runs on a second stream: part of the dense FP8 GEMM's time is overlapped, and
    its exclusive time is what the step pays for it (SQL: kernels on two streams at once exist)."""
    path = export_example("glm5/glm-triton-bs4-r1")
    streams = sql(path, "SELECT count(DISTINCT streamId) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert streams >= 2
    d = compute_budget(path).to_dict()["devices"][0]
    fp8 = next(c for c in d["categories"] if c["category"] == "gemm.fp8")
    assert 0 < fp8["overlapped_ms_per_step"] < fp8["ms_per_step"]
    assert d["overlap_ms_per_step"] > 0


TORCH = "examples/h200/glm5/glm-triton-torch-r1-TP-0.trace.json.gz"


def test_torch_trace_exclusive_split_matches_an_independent_sweep():
    """A torch-profiler trace: the op intervals and steps from the budget's attribution (the torch reader is tested
    in test_kineto.py), the split from the sweep here."""
    from pathlib import Path

    b = compute_budget(Path(__file__).resolve().parent.parent / TORCH, keep_attribution=True)
    att = b.attribution
    cat = att.category()
    per = defaultdict(list)
    inside = np.flatnonzero(att.step >= 0)
    for i, dev, step, s, e in zip(inside.tolist(), att.ops.device[inside].tolist(), att.step[inside].tolist(),
                                  att.ops.start[inside].tolist(), att.ops.end[inside].tolist()):
        per[(dev, step)].append((s, e, cat[i]))
    got_by_step = {k: dict(zip(g["category"], g["exclusive_ns"]))
                   for k, g in b.per_step_category.frame().groupby(["device", "step"])}
    ps = b.per_step.set_index(["device", "step"])
    overlapped_somewhere = False
    for key, intervals in per.items():
        want, union = exact_split(intervals)
        got = got_by_step[key]
        for c, v in want.items():
            assert abs(got.get(c, 0) - v) < 1
        assert sum(int(v) for v in got.values()) == union == int(ps.loc[key, "busy_ns"])
        overlapped_somewhere |= union < sum(e - s for s, e, _ in intervals)
    assert overlapped_somewhere
    d = b.to_dict()["devices"][0]
    assert (sum(c["exclusive_ms_per_step"] for c in d["categories"]) + d["idle_ms_per_step"]
            == pytest.approx(d["mean_step_ms"], rel=1e-12))


@pytest.mark.parametrize("name", ["glm5/glm-triton-bs4-r1", "wl-graph-grouped-tp2"])
def test_tiny_windows_give_the_same_split(name, export_example, tmp_path, monkeypatch):
    path = export_example(name)
    with open_export(path) as export:
        reference = _one_window(export, "auto", load_rules(()))
    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PROFATTR_NO_CACHE", raising=False)
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "97")
    windowed = compute_budget(path)
    assert json.dumps(windowed.to_dict()) == json.dumps(reference.to_dict())
    cols = ["device", "step", "category", "ns", "exclusive_ns"]
    got, want = windowed.per_step_category.frame(), reference.per_step_category.frame()
    assert (got[cols].to_numpy() == want[cols].to_numpy()).all()


# --- any interval set: the split adds up, windows or not -------------------------------------------------------------

interval = st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 400), st.integers(0, 120))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(interval, min_size=1, max_size=40), windows=st.integers(1, 6))
def test_any_interval_set_splits_exactly(ops, windows):
    g = np.array([o[0] for o in ops], dtype=np.int64)
    c = np.array([o[1] for o in ops], dtype=np.int64)
    s = np.array([o[2] for o in ops], dtype=np.int64)
    e = s + np.array([o[3] for o in ops], dtype=np.int64)
    order = np.argsort(s, kind="stable")  # windows come in start order
    g, c, s, e = g[order], c[order], s[order], e[order]
    ex = Exclusive()
    cutoff = np.full(4, np.iinfo(np.int64).min)
    for idx in np.array_split(np.arange(len(ops)), windows):
        if len(idx):
            np.maximum.at(cutoff, g[idx], s[idx])
            ex.add(g[idx], c[idx], s[idx], e[idx], cutoff.copy(), 5)
    pg, pc, ns = ex.finish(5)
    got = {(int(a), int(b)): int(v) for a, b, v in zip(pg, pc, ns)}
    for group in set(g.tolist()):
        m = g == group
        want, union = exact_split(list(zip(s[m].tolist(), e[m].tolist(), c[m].tolist())))
        assert sum(v for (a, _), v in got.items() if a == group) == union
        for cat in set(want) | {b for (a, b) in got if a == group}:
            assert abs(got.get((group, cat), 0) - want.get(cat, 0)) < 1


# --- the diff: a category's own change (exclusive) and its contention (overlapped) -------------------------------------

def test_diff_components_are_exclusive_changes_and_close_exactly(export_example):
    """Triton vs CUTLASS MoE at batch 4 (the shared expert on a second stream): each category's component is the
    change of its exclusive time, its contention the change of its overlapped time; the components add up to the
    step change exactly, and the bootstrap's per-step columns are the same exclusive times."""
    from profattr.attribute.diff import compute_diff, group, load_side
    from profattr.attribute.diff_stats import step_matrix

    sa = group([load_side(export_example(f"glm5/glm-triton-bs4-r{r}")) for r in (1, 2)])
    sb = group([load_side(export_example(f"glm5/glm-cutlass-bs4-r{r}")) for r in (1, 2)])
    result = compute_diff(sa, sb, samples=200)
    d = result["devices"][0]
    names = [c["component"] for c in d["components"]]
    assert "overlap" not in names
    total = sum(c["delta_ms_per_step"] for c in d["components"])
    assert total == pytest.approx(d["step_ms"]["delta"], abs=1e-12)
    assert abs(d["closure_ms"]) < 1e-12
    A, B = sa.budget["devices"][0], sb.budget["devices"][0]
    cats_a = {c["category"]: c for c in A["categories"]}
    cats_b = {c["category"]: c for c in B["categories"]}
    contended = 0
    for c in d["components"]:
        if not c["component"].startswith("category:"):
            continue
        cat = c["component"].split(":", 1)[1]
        a, b = cats_a.get(cat, {}), cats_b.get(cat, {})
        excl = b.get("exclusive_ms_per_step", 0.0) - a.get("exclusive_ms_per_step", 0.0)
        over = b.get("overlapped_ms_per_step", 0.0) - a.get("overlapped_ms_per_step", 0.0)
        op = b.get("ms_per_step", 0.0) - a.get("ms_per_step", 0.0)
        assert c["delta_ms_per_step"] == pytest.approx(excl, abs=1e-12)
        assert c["contention_ms_per_step"] == pytest.approx(over, abs=1e-12)
        assert c["op_delta_ms_per_step"] == pytest.approx(op, abs=1e-12)
        assert excl + over == pytest.approx(op, abs=1e-12)
        parts = ("added_ms", "removed_ms", "from_count_ms", "from_duration_ms", "moved_to_comm_wait_ms",
                 "moved_to_overlap_ms")
        assert sum(c[k] for k in parts) == pytest.approx(c["delta_ms_per_step"], abs=1e-9)
        contended += abs(over) > 1e-3
    assert contended  # at batch 4 some categories' overlapped time changes with the MoE backend
    # the per-step matrix of each replicate: its category columns average to the replicate's exclusive time
    for side in sa.members + sb.members:
        m = step_matrix(side, 0, names)
        dev = side.budget["devices"][0]
        for j, name in enumerate(names):
            if name.startswith("category:"):
                cat = name.split(":", 1)[1]
                want = next((c["exclusive_ms_per_step"] for c in dev["categories"] if c["category"] == cat), 0.0)
                assert m[:, j].mean() == pytest.approx(want, abs=1e-12)
        # the step's exclusive columns plus idle are each step's span
        idle = names.index("idle")
        cols = [j for j, n in enumerate(names) if n.startswith("category:")]
        assert np.allclose(m[:, cols].sum(axis=1) + m[:, idle], m[:, -1], rtol=0, atol=1e-12)


def test_budget_json_from_before_exclusive_time_diffs_with_overlap(export_example, tmp_path):
    """A budget JSON without exclusive fields (as written before them): the diff keeps the old split (categories'
    op time, overlap), which closes too."""
    from profattr.attribute.diff import compute_diff, load_side

    d = compute_budget(export_example("glm5/glm-triton-bs4-r1")).to_dict()
    for dev in d["devices"]:
        dev.pop("idle_share")
        for c in dev["categories"]:
            for k in ("exclusive_ms_per_step", "overlapped_ms_per_step", "share"):
                c.pop(k)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    new = tmp_path / "new.json"
    new.write_text(compute_budget(export_example("glm5/glm-cutlass-bs4-r1")).to_json())
    result = compute_diff(load_side(old), load_side(new), samples=0)
    dev = result["devices"][0]
    assert "overlap" in {c["component"] for c in dev["components"]}
    assert abs(dev["closure_ms"]) < 1e-9


# --- one share everywhere --------------------------------------------------------------------------------------------

def _md_shares(text: str, after: str) -> dict:
    """category -> share cell of the first category table (exclusive ms | share | ...) after the line `after`."""
    lines = text.split(after, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| category | exclusive ms/step"))
    out = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out[cells[0].replace("\\", "").strip("*").strip("`")] = cells[2]  # a category is a code span
    return out


def test_budget_and_report_print_the_same_shares_and_they_add_up(export_example, tmp_path):
    from click.testing import CliRunner

    from profattr.cli import cli

    path = export_example("glm5/glm-triton-bs4-r1")
    runner = CliRunner()
    budget = json.loads(runner.invoke(cli, ["budget", str(path), "--format", "json"]).stdout)
    d = budget["devices"][0]
    md = runner.invoke(cli, ["budget", str(path), "--format", "markdown"]).stdout
    table = runner.invoke(cli, ["budget", str(path)]).stdout
    result = runner.invoke(cli, ["report", str(path), "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    in_budget = _md_shares(md, "### GPU 0")
    in_report = _md_shares(report, "## Per-step budget")
    assert in_budget == in_report
    want = {c["category"]: f"{100.0 * c['share']:.1f}%" for c in d["categories"]}
    want["idle (inside steps)"] = f"{100.0 * d['idle_share']:.1f}%"
    want["mean step"] = "100.0%"
    assert in_budget == want
    for c in d["categories"]:  # the text table: exclusive ms, then the same share
        row = next(line for line in table.splitlines() if line.split()[:1] == [c["category"]])
        assert row.split()[2] == want[c["category"]]
    # exclusive times and idle make the mean step; the shares 100 % (each printed to 0.1 %)
    assert sum(c["share"] for c in d["categories"]) + d["idle_share"] == pytest.approx(1.0, abs=1e-12)
    printed = sum(float(v.rstrip("%")) for k, v in in_budget.items() if k != "mean step")
    assert printed == pytest.approx(100.0, abs=0.05 * len(in_budget))
    # and the old op-time shares would not have: the overlap of the second stream
    assert sum(c["ms_per_step"] for c in d["categories"]) + d["idle_ms_per_step"] > 1.1 * d["mean_step_ms"]
