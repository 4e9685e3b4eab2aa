"""`profattr export --format perfetto` on a real GLM-5 decode capture, checked against SQL on the export.

The expected numbers come from plain SQL here: GPU ops (kernels, memcpys, memsets) joined to their launch call,
assigned to SGLang's decode ranges step[DECODE bs=N] (numbered in start order from 0) when the launch call starts
inside one on the same thread. The trace is parsed with `json`.
"""
from __future__ import annotations

import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

import badinput
from conftest import EXAMPLES
from independent import sql
from profattr.cli import cli

CAPTURE = EXAMPLES / "glm5" / "glm-triton-bs1-r1.sqlite"  # a CUDA-graph decode replayed over 8 streams
FIRST, LAST = 3, 9  # the step range exported

OPS_IN_STEPS = """
WITH launches AS (
  SELECT correlationId AS corr, globalTid AS tid, start AS api FROM CUPTI_ACTIVITY_KIND_RUNTIME
),
ops AS (
  SELECT k.deviceId AS dev, k.streamId AS stream, k.start AS s, k."end" AS e, sn.value AS name,
         k.gridX AS gx, k.gridY AS gy, k.gridZ AS gz, k.globalPid AS pid, k.correlationId AS corr
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds sn ON sn.id = k.shortName
  UNION ALL
  SELECT deviceId, streamId, start, "end", NULL, -1, -1, -1, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
  UNION ALL
  SELECT deviceId, streamId, start, "end", NULL, -1, -1, -1, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET
),
steps AS (
  SELECT n.start AS ss, n."end" AS se, n.globalTid AS stid, row_number() OVER (ORDER BY n.start) - 1 AS step
  FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
  WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) LIKE 'step[DECODE bs=%]'
)
SELECT ops.dev, ops.stream, ops.s, ops.e, ops.name, ops.gx, ops.gy, ops.gz, steps.step
FROM ops JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = ops.corr AND (r.globalTid & -16777216) = ops.pid
JOIN steps ON steps.stid = r.globalTid AND r.start BETWEEN steps.ss AND steps.se
"""


def ns(value) -> int:
    """A trace time (µs, three decimals) back to integer ns."""
    return int(round(float(value) * 1000))


@pytest.fixture(scope="module")
def sql_ops():
    rows = sql(CAPTURE, OPS_IN_STEPS)
    assert len(rows) > 1000
    return rows


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("perfetto") / "steps.json"
    result = CliRunner().invoke(cli, ["export", str(CAPTURE), "--format", "perfetto", "-o", str(out),
                                      "--step-range", f"{FIRST}:{LAST}"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["displayTimeUnit"] == "ns"
    return data["traceEvents"]


def _process_ids(events) -> dict:
    return {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}


def _stream_slices(events, pid: int) -> list:
    """The complete events of the `stream N` tracks of process `pid`."""
    streams = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
               and e["args"]["name"].startswith("stream ")}
    return [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["tid"] in streams]


def test_ops_of_the_range_are_the_sql_ops(trace, sql_ops):
    """Every GPU op launched in steps FIRST..LAST, on its stream's track, with its step, short name and grid."""
    gpu = _process_ids(trace)["GPU 0"]
    want = {(stream, s): (e, name, (gx, gy, gz), step) for dev, stream, s, e, name, gx, gy, gz, step in sql_ops
            if FIRST <= step <= LAST}
    got = {(ev["tid"], ns(ev["ts"])): ev for ev in _stream_slices(trace, gpu)}
    assert set(got) == set(want)
    for key, (end, name, grid, step) in want.items():
        ev = got[key]
        assert ns(ev["ts"]) + ns(ev["dur"]) == end
        assert ev["args"]["step"] == step and ev["args"]["stream"] == key[0]
        if name is not None:  # a kernel: its short name from the capture, as is, and its launch grid
            assert ev["name"] == name
            assert ev["args"]["grid"] == list(grid)


def test_category_tracks_sum_to_sql_ms_per_step(trace, sql_ops):
    """Per category track of the `GPU 0 categories` process: the sum of slice durations over the range, per step,
    equals the SQL op time per step of the ops of that category (each SQL op takes the category the trace gives
    the op at its (stream, start): the taxonomy names categories, SQL measures them)."""
    pids = _process_ids(trace)
    gpu, cats = pids["GPU 0"], pids["GPU 0 categories"]
    category_of = {(ev["tid"], ns(ev["ts"])): ev["args"]["category"] for ev in _stream_slices(trace, gpu)}
    tracks = {e["tid"]: e["args"]["name"] for e in trace
              if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == cats}
    n_steps = LAST - FIRST + 1
    expected: dict = defaultdict(int)
    for dev, stream, s, e, *_rest, step in sql_ops:
        if FIRST <= step <= LAST:
            expected[category_of[(stream, s)]] += e - s
    got: dict = defaultdict(int)
    for ev in trace:
        if ev["ph"] == "X" and ev["pid"] == cats:
            got[tracks[ev["tid"]]] += ns(ev["dur"])
    assert set(got) == set(expected) and len(got) > 5
    for c in expected:
        assert got[c] / n_steps / 1e6 == pytest.approx(expected[c] / n_steps / 1e6, abs=1e-9), c


def test_idle_slices_sum_to_sql_idle(trace, sql_ops):
    """The idle track holds, per step, the span minus the union of its ops' intervals (computed here by a plain
    sweep over the SQL ops)."""
    gpu = _process_ids(trace)["GPU 0"]
    by_step = defaultdict(list)
    for dev, stream, s, e, *_rest, step in sql_ops:
        if FIRST <= step <= LAST:
            by_step[step].append((s, e))
    expected = {}
    for step, intervals in by_step.items():
        intervals.sort()
        covered, reach = 0, None
        first = intervals[0][0]
        for s, e in intervals:
            if reach is None or s > reach:
                covered += e - s
                reach = e
            elif e > reach:
                covered += e - reach
                reach = e
        expected[step] = (max(e for _, e in intervals) - first) - covered
    tracks = {e["args"]["name"]: e["tid"] for e in trace
              if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == gpu}
    got: dict = defaultdict(int)
    for ev in trace:
        if ev["ph"] == "X" and ev["pid"] == gpu and ev["tid"] == tracks["idle"]:
            assert ev["name"] == "idle"
            got[ev["args"]["step"]] += ns(ev["dur"])
    assert sum(expected.values()) > 0
    assert {k: got.get(k, 0) for k in expected} == expected


def test_step_markers_one_per_step(trace, sql_ops):
    """An instant event per step of the range, at its first GPU op's start; the step slices span its GPU work."""
    first_start = defaultdict(lambda: None)
    last_end = {}
    for dev, stream, s, e, *_rest, step in sql_ops:
        if FIRST <= step <= LAST:
            first_start[step] = s if first_start[step] is None else min(first_start[step], s)
            last_end[step] = max(last_end.get(step, e), e)
    instants = [ev for ev in trace if ev["ph"] == "i"]
    assert len(instants) == LAST - FIRST + 1 == len(first_start)
    assert sorted(ns(ev["ts"]) for ev in instants) == sorted(first_start.values())
    slices = {ev["args"]["step"]: ev for ev in trace if ev["ph"] == "X" and ev.get("cat") == "step"}
    assert set(slices) == set(first_start)
    for step, ev in slices.items():
        assert ns(ev["ts"]) == first_start[step] and ns(ev["ts"]) + ns(ev["dur"]) == last_end[step]


def test_whole_capture_has_every_step(tmp_path, sql_ops):
    """Without --step-range every decode step with GPU work has its marker."""
    out = tmp_path / "all.json"
    result = CliRunner().invoke(cli, ["export", str(CAPTURE), "-o", str(out)])
    assert result.exit_code == 0, result.output
    events = json.loads(out.read_text())["traceEvents"]
    assert sum(ev["ph"] == "i" for ev in events) == len({r[-1] for r in sql_ops})


def test_kernel_names_are_json_escaped_not_altered():
    """A name with quotes, a backslash, a control character and non-ASCII text survives the round trip."""
    from profattr.report.perfetto import _combo_args

    import pandas as pd

    name = 'k<"\\\x07é>'
    combos = pd.DataFrame([{"name": name, "demangled": name, "category": "gemm", "family": "x"}])
    text, cat, args, category = _combo_args(combos)[0]
    assert json.loads(text) == name and json.loads("{" + args + "}")["demangled"] == name


# --- bad input -----------------------------------------------------------------------------------------------------

def test_output_exists_without_force(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("keep")
    badinput.assert_error(badinput.cli("export", CAPTURE, "-o", out), "exists", "--force")
    assert out.read_text() == "keep"


def test_step_range_outside_the_steps(tmp_path):
    badinput.assert_error(badinput.cli("export", CAPTURE, "-o", tmp_path / "t.json", "--step-range", "500:600"),
                          "--step-range")
    badinput.assert_error(badinput.cli("export", CAPTURE, "-o", tmp_path / "t.json", "--step-range", "9:3"),
                          "--step-range")
    assert not (tmp_path / "t.json").exists()


def test_capture_without_gpu_work(tmp_path):
    empty = badinput.sql(badinput.copy_export(tmp_path), "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL",
                         "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    badinput.assert_error(badinput.cli("export", empty, "-o", tmp_path / "t.json"), "no GPU work")
    assert not (tmp_path / "t.json").exists()


def test_host_tracks_hold_the_nvtx_ranges_of_the_steps(trace):
    """The host process holds, per CPU thread, every NVTX range (SQL) that overlaps the exported steps' GPU work,
    at its own start and duration, named by its text."""
    steps = [ev for ev in trace if ev["ph"] == "X" and ev.get("cat") == "step"]
    start = min(ns(ev["ts"]) for ev in steps)
    end = max(ns(ev["ts"]) + ns(ev["dur"]) for ev in steps)
    rows = sql(CAPTURE, """
        SELECT n.globalTid & 16777215, n.start, n."end", COALESCE(t.value, n.text)
        FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
        WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL AND n."end" > ? AND n.start < ?""", (start, end))
    host = _process_ids(trace)["host"]
    got = sorted((ev["tid"], ns(ev["ts"]), ns(ev["ts"]) + ns(ev["dur"]), ev["name"]) for ev in trace
                 if ev["ph"] == "X" and ev["pid"] == host and ev["cat"] == "nvtx")
    assert len(rows) > LAST - FIRST and got == sorted(rows)
    assert any(name.startswith("step[DECODE") for *_rest, name in got)
    assert any(ev["pid"] == host and ev.get("cat") == "cuda_api" for ev in trace)
