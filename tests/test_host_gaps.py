"""What the host did while the GPU idled (report/host_gaps.py): interval arithmetic on hand-made cases, and the
idle gaps and graph-launch overlap of a real GLM-5-shaped capture against SQL and plain Python written here."""
from __future__ import annotations

import bisect
import sqlite3

import numpy as np
import pandas as pd
import pytest

from independent import MEMOPS, NVTX_LIKE_STEPS_CTE, OPS_CTE
from profattr.attribute.budget import compute_budget
from profattr.attribute.steps import Steps
from profattr.report import host_gaps
from profattr.report.launches import launch_stats


def test_idle_intervals_skip_overlapping_ops_and_step_boundaries():
    step = np.array([0, 0, 0, 1, 1])
    start = np.array([0, 5, 20, 100, 130])
    end = np.array([10, 8, 25, 110, 140])  # op 2 sits inside op 1's span: no gap between them
    gs, ge = host_gaps.idle_intervals(step, start, end)
    assert gs.tolist() == [10, 110] and ge.tolist() == [20, 130]  # none across the step boundary 25 -> 100


def test_overlap_with_gaps():
    gs, ge = np.array([10, 50]), np.array([20, 60])
    calls_s, calls_e = np.array([0, 15, 55, 70, 0]), np.array([12, 55, 58, 80, 100])
    got = host_gaps.overlap_ns(gs, ge, calls_s, calls_e)
    assert got.tolist() == [2, 10, 3, 0, 20]
    assert host_gaps.overlap_ns(gs[:0], ge[:0], calls_s, calls_e).tolist() == [0] * 5


def test_only_innermost_ranges_that_do_not_enclose_a_step():
    ranges = pd.DataFrame({"start": [0, 5, 30, 0], "end": [100, 20, 40, 100], "tid": [1, 1, 1, 2],
                           "text": ["outer", "inner", "inner2", "other-thread"]})
    assert host_gaps.leaf_ranges(ranges).tolist() == [False, True, True, True]

    steps = Steps(source="nvtx:other-thread", tid=np.array([2]), start=np.array([0]), end=np.array([100]))
    assert host_gaps.enclosing_steps(ranges, steps).tolist() == [False, False, False, True]


def stats_of(path, windowed: bool, monkeypatch) -> tuple:
    """(launch stats, budget) from all ops at once, or window by window (windows of 89 ops: steps, replays and
    gaps straddle them) as the report reads them."""
    if not windowed:
        budget = compute_budget(path, keep_attribution=True)
        return launch_stats(budget), budget
    from profattr.attribute.budget import ONE_WINDOW, opened
    from profattr.report.window_views import window_views
    from profattr.taxonomy.classify import load_rules

    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "89")
    rules = load_rules(())
    with opened(path) as source:
        budget = compute_budget(source, rules=rules, keep_attribution=ONE_WINDOW)
        return window_views(budget, source, rules).launches, budget


@pytest.mark.parametrize("windowed", [False, True])
def test_real_capture_gaps_and_graph_launch_overlap(export_example, monkeypatch, windowed):
    path = export_example("glm5/glm-triton-bs1-r1")
    stats, budget = stats_of(path, windowed, monkeypatch)
    host = stats[0]["host_in_idle"]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    memops = "".join(sql for t, sql in MEMOPS.items() if t in tables)
    rows = conn.execute("WITH " + OPS_CTE.format(memops=memops) + "," + NVTX_LIKE_STEPS_CTE + """
        SELECT steps.step, ops.s, ops.e FROM ops JOIN steps ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss
        AND steps.se ORDER BY steps.step, ops.s""", {"pattern": "step[DECODE bs=%]"}).fetchall()
    calls = conn.execute("""SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                            ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%'""").fetchall()
    conn.close()
    gaps, last_step, run_end = [], None, None
    for step, s, e in rows:  # plain Python: the gaps between consecutive ops of each step
        if step == last_step and s > run_end:
            gaps.append((run_end, s))
        run_end = e if step != last_step else max(run_end, e)
        last_step = step
    n_steps = len({r[0] for r in rows})
    assert host["idle_ms_per_step"] == pytest.approx(sum(b - a for a, b in gaps) / n_steps / 1e6, rel=1e-9)
    assert host["idle_ms_per_step"] == pytest.approx(budget.devices[0]["idle_ms_per_step"], rel=1e-6)
    starts = [a for a, _ in gaps]
    overlap = 0
    for cs, ce in calls:
        i = max(bisect.bisect_right(starts, cs) - 1, 0)
        while i < len(gaps) and gaps[i][0] < ce:
            overlap += max(0, min(ce, gaps[i][1]) - max(cs, gaps[i][0]))
            i += 1
    graph = next(r for r in host["api"] if r["kind"] == "graph launches")
    assert graph["ms_per_step"] == pytest.approx(overlap / n_steps / 1e6, rel=1e-9)


# every GPU op with its launch call: correlation id, graph node (NULL outside graphs), launch call start and end
REPLAY_OPS_SQL = """
WITH ops AS (
  SELECT k.start AS s, k."end" AS e, k.correlationId AS corr, k.graphNodeId AS node, r.globalTid AS tid,
         r.start AS api, r."end" AS api_end
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = k.correlationId AND (r.globalTid & -16777216) = k.globalPid
  UNION ALL
  SELECT m.start, m."end", m.correlationId, m.graphNodeId, r.globalTid, r.start, r."end"
  FROM CUPTI_ACTIVITY_KIND_MEMSET m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = m.correlationId AND (r.globalTid & -16777216) = m.globalPid
  UNION ALL
  SELECT m.start, m."end", m.correlationId, m.graphNodeId, r.globalTid, r.start, r."end"
  FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = m.correlationId AND (r.globalTid & -16777216) = m.globalPid
), """ + NVTX_LIKE_STEPS_CTE.strip() + """
SELECT steps.step, ops.s, ops.e, ops.corr, ops.node, ops.api, ops.api_end FROM ops JOIN steps
  ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss AND steps.se ORDER BY steps.step, ops.s"""


@pytest.mark.parametrize("windowed", [False, True])
@pytest.mark.parametrize("name", ["glm5/glm-fp8dg-bs1-r1", "glm5/glm-fp8tr-bs1-r1"])
def test_wait_before_each_graph_replay_matches_sql(export_example, monkeypatch, name, windowed):
    """The GPU's wait before each replay's first node, and how much of it came before the host's cudaGraphLaunch:
    plain Python over the ops of each step in time order (DeepGEMM dense GEMMs: the GPU outruns the host; Triton:
    the host is ahead)."""
    path = export_example(name)
    stats = stats_of(path, windowed, monkeypatch)[0][0]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute(REPLAY_OPS_SQL, {"pattern": "step[DECODE bs=%]"}).fetchall()
    conn.close()
    waits, before_call, call_to_node, calls, seen, last_step, run_end = [], [], [], [], set(), None, None
    for step, s, e, corr, node, api, api_end in rows:
        gap = s - run_end if step == last_step and s > run_end else 0
        if node is not None and corr not in seen:  # the first node of a replay
            seen.add(corr)
            waits.append(gap)
            if gap > 0:
                before_call.append(max(api - (s - gap), 0))
                call_to_node.append(gap - before_call[-1])
                calls.append(api_end - api)
        run_end = e if step != last_step else max(run_end, e)
        last_step = step
    n_steps = len({r[0] for r in rows})
    assert stats["replays_per_step"] == pytest.approx(len(waits) / n_steps)
    assert stats["idle_before_replay_ms"] == pytest.approx(sum(waits) / n_steps / 1e6, rel=1e-9)
    positive = [w for w in waits if w > 0]
    assert stats["replay_wait_us"] == pytest.approx(float(np.median(positive)) / 1e3, rel=1e-9)
    assert stats["replay_before_call_us"] == pytest.approx(float(np.median(before_call)) / 1e3, rel=1e-9)
    assert stats["replay_call_to_node_us"] == pytest.approx(float(np.median(call_to_node)) / 1e3, rel=1e-9)
    assert stats["replay_host_late_share"] == pytest.approx(sum(b > 0 for b in before_call) / len(before_call))
    assert stats["graph_launch_call_us"] == pytest.approx(float(np.median(calls)) / 1e3, rel=1e-9)
    assert stats["idle_inside_replay_ms"] == pytest.approx(stats["idle_before_graph_ops_ms"]
                                                           - stats["idle_before_replay_ms"], abs=1e-12)
    if "fp8dg" in name:  # the GPU idles for the launch: most of the step's idle, in every replay
        assert stats["idle_before_replay_ms"] > 0.5 * stats["idle_ms_per_step"] and len(positive) == len(waits)


def test_replay_wait_reason_names_the_larger_part():
    from profattr.report.bottlenecks import idle_reason

    base = {"idle_share": 0.3, "idle_ms_per_step": 0.6, "mode": "graph", "graph_launches_per_step": 1.0,
            "graph_ops_per_step": 290.0, "eager_ops_per_step": 9.0, "idle_before_eager_ops_ms": 0.05,
            "idle_before_graph_ops_ms": 0.55, "idle_before_replay_ms": 0.5, "replay_wait_us": 500.0,
            "median_gap_us": 0.3, "largest_gap_us": 510.0, "graph_launch_call_us": 470.0}
    launch = idle_reason(dict(base, replay_before_call_us=40.0, replay_call_to_node_us=460.0))
    assert "the graph launch holds the GPU back" in launch and "40 µs before the host called" in launch
    host = idle_reason(dict(base, replay_before_call_us=400.0, replay_call_to_node_us=100.0))
    assert "the host is behind the GPU" in host
    unknown = idle_reason(dict(base, replay_before_call_us=None, replay_call_to_node_us=None))
    assert "launch calls were not recorded" in unknown
    inside = idle_reason(dict(base, idle_before_replay_ms=0.1))  # most of it between nodes: the older reading
    assert "0.450 ms/step of idle falls between replayed nodes" in inside
