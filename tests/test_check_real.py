"""`profattr check` and `profattr capture --finish` on the real H200 captures committed in examples/h200/.

Expected numbers come from SQL written here or in tests/independent.py (step spans and counts per device, the first
all-reduce of each rank, the ranks' graph-capture ranges), never from profattr's own output.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ALL_CAPTURES, EXAMPLES, SGLANG_CAPTURES, find_test_nsys
from independent import expected_graph, expected_nvtx
from profattr.check import overall as check_overall
from profattr.check.run import check_capture
from profattr.cli import cli

TP2 = "wl-graph-grouped-tp2"
# the overhead check's thresholds (profiled / unprofiled ms per token)
WARN_ABOVE, FAIL_ABOVE = 1.3, 3.0


def committed_run(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.run.json").read_text())


def capture_folder(tmp_path: Path, name: str, sqlite: Path) -> Path:
    """A capture folder as `profattr capture` leaves it: the committed run.json beside the export."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copyfile(EXAMPLES / f"{name}.run.json", folder / f"{name}.run.json")
    shutil.copyfile(sqlite, folder / f"{name}.sqlite")
    return folder / f"{name}.run.json"


def findings(tmp_path, name, export_example) -> dict:
    _, found = check_capture(capture_folder(tmp_path, name, export_example(name)))
    return {f.check: f for f in found}


def sql(path: Path, query: str, params=()) -> list:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def expected_steps(name: str, path: Path) -> dict:
    if name.endswith("-eager"):  # SGLang without graphs: its own per-forward module range is the step
        return expected_nvtx(path, "{'Module': 'model.model', 'Inputs': [[1], [1]]}")
    return expected_graph(path) if name.startswith("sglang") else expected_nvtx(path, "decode_step")


# --- steps: counted per device ---------------------------------------------------------------------------------------

def test_tp_capture_counts_steps_per_device(tmp_path, export_example):
    path = export_example(TP2)
    per_device = {dev: d["steps"] for dev, d in expected_nvtx(path, "decode_step").items()}
    assert len(per_device) == 2
    f = findings(tmp_path, TP2, export_example)["steps"]
    assert f.status == "pass", f.message
    assert f.data["per_device"] == {str(k): v for k, v in per_device.items()}
    assert f.data["requested"] == committed_run(TP2)["window"]["steps_requested"] == 20
    assert f"{per_device[0]} steps counted on each of 2 devices" in f.message


# --- first calls: the first all-reduce of a TP capture ---------------------------------------------------------------

FIRST_NCCL = """
SELECT k.deviceId, MIN(k.start), k."end" - k.start
FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
WHERE s.value LIKE 'ncclDevKernel_AllReduce%' GROUP BY k.deviceId ORDER BY k.deviceId"""
CAPTURE_ENDS = """
SELECT n.globalTid, n."end" FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
WHERE COALESCE(t.value, n.text) = 'graph_capture' ORDER BY n."end\""""


def test_first_allreduce_of_tp2_is_a_wait_for_the_late_rank(tmp_path, export_example):
    path = export_example(TP2)
    (d0, start0, dur0), (d1, start1, dur1) = sql(path, FIRST_NCCL)
    assert (d0, d1) == (0, 1) and start1 > start0
    wait_ms = (start1 - start0) / 1e6
    # the slow first call on device 0 is almost all wait: it ends when device 1's first call ends
    assert wait_ms > 0.9 * dur0 / 1e6
    # and the late rank was still capturing its CUDA graph: the two capture ranges end `wait` apart
    (_, end_a), (_, end_b) = sql(path, CAPTURE_ENDS)
    assert abs((end_b - end_a) / 1e6 - wait_ms) < 0.1 * wait_ms

    f = findings(tmp_path, TP2, export_example)["first_calls"]
    assert f.status == "fail"  # the wait is 14 % of kernel time: device 0's all-reduce ms/step is 5x device 1's
    assert f.data["worst"][0]["device"] == 0 and f.data["worst"][0]["first_ms"] == pytest.approx(dur0 / 1e6)
    assert f.data["worst_is_wait_for"]["devices"] == [1]
    assert f.data["worst_is_wait_for"]["wait_ms"] == pytest.approx(wait_ms)
    # device 1's own first all-reduce is short: NCCL's first-call set-up is not what device 0 paid for
    assert f.data["worst_is_wait_for"]["late_device_first_ms"] == pytest.approx(dur1 / 1e6) and dur1 < dur0 / 20
    assert "not the collective's set-up" in f.message
    assert f"waited {wait_ms:.2f} ms for device(s) 1" in f.message
    assert "captured inside the window" in f.message and "--graph-window after" in f.message
    assert "warm-up did not cover" not in f.message


# --- overhead: profiled ms/token measured in the capture -------------------------------------------------------------

@pytest.mark.parametrize("name", SGLANG_CAPTURES + ["wl-eager-grouped", TP2])
def test_overhead_uses_the_median_step_span_per_device(tmp_path, name, export_example):
    path = export_example(name)
    step_ms = {dev: d["step_ms"] for dev, d in expected_steps(name, path).items()}
    unprofiled = committed_run(name)["timing"]["ms_per_token_unprofiled"]
    ratio = max(step_ms.values()) / unprofiled
    f = findings(tmp_path, name, export_example)["overhead"]
    assert f.data["ms_per_token_profiled"] == pytest.approx(max(step_ms.values()), rel=1e-6)
    assert {d["device"]: d["step_ms"] for d in f.data["profiled_per_device"]} == pytest.approx(step_ms, rel=1e-6)
    assert f.data["ratio"] == pytest.approx(ratio, rel=1e-6)
    assert f.status == ("pass" if ratio <= WARN_ABOVE else "warn" if ratio <= FAIL_ABOVE else "fail")
    assert f.data["profiled_source"].startswith("capture: median step span")


def test_sglang_bs4_client_side_figure_is_kept_but_not_used(tmp_path, export_example):
    # 153 ms/token measured by the client: the window's close (nsys flushing) stalled the streamed tokens
    name = "sglang-triton-bs4"
    client = committed_run(name)["timing"]["ms_per_token_profiled_client"]
    assert client > 100
    f = findings(tmp_path, name, export_example)["overhead"]
    assert f.status == "pass" and f.data["ms_per_token_profiled_client"] == client


# --- the committed run.json files carry what --finish records now ----------------------------------------------------

@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_committed_run_timing_and_check_are_current(tmp_path, name, export_example):
    path = export_example(name)
    run = committed_run(name)
    step_ms = {dev: d["step_ms"] for dev, d in expected_steps(name, path).items()}
    timing = run["timing"]
    assert timing["ms_per_token_profiled"] == pytest.approx(max(step_ms.values()), rel=1e-6)
    assert {d["device"]: d["step_ms"] for d in timing["profiled_per_device"]} == pytest.approx(step_ms, rel=1e-6)
    assert timing["profiled_source"].startswith("capture: median step span")
    _, now = check_capture(capture_folder(tmp_path, name, path))
    assert {f["check"]: f["status"] for f in run["check"]["findings"]} == {f.check: f.status for f in now}
    assert run["check"]["status"] == check_overall(now)
    # nothing of the machine that finished them
    changed = json.dumps([run["timing"], run["check"], run["commands"].get("export"), run.get("finished_with")])
    assert not any(p in changed for p in ("/work", "/root", "/tmp", "/home"))


def test_finish_on_a_copy_measures_timing_and_records_no_paths(tmp_path, export_example):
    name = "sglang-triton-bs4"
    if find_test_nsys() is None:
        export_example(name)  # skips here (fails in CI) the same way the exports do
    folder = tmp_path / "cap"
    folder.mkdir()
    shutil.copyfile(EXAMPLES / f"{name}.nsys-rep", folder / f"{name}.nsys-rep")
    old = committed_run(name)
    old["timing"]["ms_per_token_profiled"] = old["timing"].pop("ms_per_token_profiled_client")  # as first written
    for key in ("profiled_source", "profiled_per_device", "profiled_client_caveat"):
        old["timing"].pop(key, None)
    (folder / f"{name}.run.json").write_text(json.dumps(old))
    result = CliRunner().invoke(cli, ["capture", "--finish", str(folder)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = json.loads((folder / f"{name}.run.json").read_text())
    step_ms = max(d["step_ms"] for d in expected_graph(folder / f"{name}.sqlite").values())
    assert run["timing"]["ms_per_token_profiled"] == pytest.approx(step_ms, rel=1e-6)
    client = committed_run(name)["timing"]["ms_per_token_profiled_client"]
    assert run["timing"]["ms_per_token_profiled_client"] == client
    assert run["commands"]["export"][0] == "nsys"
    assert run["commands"]["export"][-2:] == [f"{name}.sqlite", f"{name}.nsys-rep"]
    assert run["finished_with"]["nsys"] == "nsys" and run["finished_with"]["version"].startswith("20")
    assert str(tmp_path) not in json.dumps(run) and "/root" not in json.dumps(run["finished_with"])
    overhead = next(f for f in run["check"]["findings"] if f["check"] == "overhead")
    assert overhead["status"] == "pass"


@pytest.mark.parametrize("name", ["sglang-triton-bs1", "wl-graph-grouped-tp2", "wl-eager-loop"])
def test_first_call_figures_are_those_of_the_kernel_rows_in_lexsort_order(name, export_example):
    """The first-call check's figures (check/first_calls.py): per launch configuration its first call (earliest
    start), its calls and the median of the others, and per kernel name and device its first call; from the kernel
    rows as SQL gives them, shuffled (any order), sorted by start, and sorted in parts added one after another (the
    report's windows), against np.lexsort over the nine columns and np.median written here."""
    import numpy as np

    from profattr.check.first_calls import KEY_COLUMNS, FirstCalls

    rows = np.array(sql(export_example(name), 'SELECT deviceId, COALESCE(demangledName, shortName), gridX, gridY, '
                                              'gridZ, blockX, blockY, blockZ, start, "end" - start '
                                              'FROM CUPTI_ACTIVITY_KIND_KERNEL'), dtype=np.int64)
    by = rows[np.lexsort([rows[:, i] for i in (8, 7, 6, 5, 4, 3, 2, 1, 0)])]
    runs = np.flatnonzero(np.r_[True, (by[1:, :8] != by[:-1, :8]).any(axis=1)])
    want = {tuple(by[lo, :8].tolist()): (int(by[lo, 9]), int(by[lo, 8]), hi - lo,
                                         float(np.median(by[lo + 1:hi, 9])) if hi - lo > 1 else None)
            for lo, hi in zip(runs.tolist(), np.r_[runs[1:], len(by)].tolist())}
    first_of: dict = {}
    for r in by.tolist():  # in (configuration, start) order, the earliest start of each name and device
        key = (r[1], r[0])
        if key not in first_of or r[8] < first_of[key][0]:
            first_of[key] = (r[8], r[9])
    shuffled = rows[np.random.default_rng(0).permutation(len(rows))]
    in_order = shuffled[np.argsort(shuffled[:, 8], kind="stable")]
    parts = FirstCalls()
    for part in np.array_split(in_order, 7):
        parts.add(*(part[:, i] for i in range(10)))
    for calls in (FirstCalls.of_configs({c: shuffled[:, i] for i, c in enumerate(KEY_COLUMNS + ["start", "duration"])}),
                  FirstCalls.of_configs({c: in_order[:, i] for i, c in enumerate(KEY_COLUMNS + ["start", "duration"])}),
                  parts):
        got = {k: (v[0], v[1], v[2], v[3].median()) for k, v in calls.configs.items()}
        assert got == want
        assert calls.durations.median() == float(np.median(rows[:, 9])) and calls.total_ns == int(rows[:, 9].sum())
        names = {k[0] for k in first_of}
        assert {n: calls.first_calls_of(n) for n in names} == {
            n: {d: v for (m, d), v in first_of.items() if m == n} for n in names}
