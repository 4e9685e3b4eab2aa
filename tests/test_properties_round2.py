"""Property tests (hypothesis) of the torch-trace and ncu-CSV readers on REAL inputs reordered, moved and repeated:
what holds for any row order, any time base and any set of repeated rows, not only for the ones someone thought
of. Derandomized (the same examples every run), without hypothesis's example database, its home in a temporary
folder (nothing is written beside the tests).

- torch traces (the committed GLM trace, cut after its fourth decode step): any order of the events, any shift of
  every timestamp, and any events written twice give the budget of the trace as recorded (times within a
  nanosecond per op: microsecond floats), with the repeats counted as skipped, exactly;
- ncu CSVs (the committed drill): any order of the kernel rows, any rows repeated anywhere, a byte-order mark, CRLF
  line ends and ncu's own ==PROF== lines give the same kernels, with the repeats counted, exactly.
"""
from __future__ import annotations

import csv
import io
import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from badinput import REAL_NCU, ncu_rows, trace_doc
from profattr import run_record

EXAMPLES = {"trace_order": 30, "trace_shift": 30, "trace_repeat": 30, "ncu_order": 150, "ncu_repeat": 150,
            "ncu_text": 60}
BASE = dict(derandomize=True, database=None, suppress_health_check=list(HealthCheck), deadline=None)
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="profattr-hypothesis-"))
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
MS_TOLERANCE = 1e-5  # ms: a nanosecond or so per op, from microsecond floats rounded to ns after a shift


def run_settings(name: str):
    return settings(max_examples=EXAMPLES[name], **BASE)


# --- torch traces ------------------------------------------------------------------------------------------------

def _short_trace() -> dict:
    """The real trace cut a little after its fourth decode step (fewer events, the same kinds of them)."""
    doc = trace_doc()
    steps = sorted((e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("step[DECODE")), key=lambda e: e["ts"])
    cut = steps[3]["ts"] + steps[3]["dur"] + 2000.0
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not isinstance(e.get("ts"), (int, float)) or e["ts"] <= cut]
    return doc


SHORT = _short_trace()


def _budget(doc) -> dict:
    from profattr.attribute.budget import compute_budget
    from profattr.trace.kineto import KinetoTrace

    folder = Path(tempfile.mkdtemp(prefix="profattr-prop-"))
    path = folder / "t.json"
    path.write_text(json.dumps(doc))
    try:
        b = compute_budget(KinetoTrace(path)).to_dict()
    finally:
        path.unlink()
        folder.rmdir()
    return b


BASE_BUDGET = None


def _base() -> dict:
    global BASE_BUDGET
    if BASE_BUDGET is None:
        BASE_BUDGET = _budget(SHORT)
    return BASE_BUDGET


def _same_budget(got: dict, want: dict) -> None:
    assert got["steps"]["count"] == want["steps"]["count"] and got["steps"]["source"] == want["steps"]["source"]
    assert [d["device"] for d in got["devices"]] == [d["device"] for d in want["devices"]]
    for g, w in zip(got["devices"], want["devices"]):
        for key in ("steps", "kernels_per_step", "memops_per_step"):
            assert g[key] == w[key], key
        for key in ("step_ms", "mean_step_ms", "busy_ms_per_step", "idle_ms_per_step", "overlap_ms_per_step"):
            assert abs(g[key] - w[key]) <= MS_TOLERANCE * max(1.0, g["kernels_per_step"]), (key, g[key], w[key])
        gc = {c["category"]: c for c in g["categories"]}
        wc = {c["category"]: c for c in w["categories"]}
        assert set(gc) == set(wc)
        for cat, c in wc.items():
            assert gc[cat]["count_per_step"] == c["count_per_step"]
            assert abs(gc[cat]["ms_per_step"] - c["ms_per_step"]) <= MS_TOLERANCE * max(1.0, c["count_per_step"])


def test_the_short_trace_has_steps_and_gpu_work():
    b = _base()
    assert b["steps"]["count"] >= 3 and b["devices"][0]["kernels_per_step"] > 100


@run_settings("trace_order")
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_any_event_order_gives_the_same_budget(seed):
    doc = dict(SHORT, traceEvents=list(SHORT["traceEvents"]))
    random.Random(seed).shuffle(doc["traceEvents"])
    _same_budget(_budget(doc), _base())


@run_settings("trace_shift")
@given(shift_us=st.integers(-5 * 10 ** 12, 10 ** 12))
def test_any_time_base_gives_the_same_budget(shift_us):
    events = []
    for e in SHORT["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e = dict(e, ts=e["ts"] + shift_us)
        events.append(e)
    _same_budget(_budget(dict(SHORT, traceEvents=events)), _base())


@run_settings("trace_repeat")
@given(seed=st.integers(0, 2 ** 32 - 1), share=st.floats(0.0, 1.0))
def test_repeated_events_are_counted_and_left_out(seed, share):
    rng = random.Random(seed)
    events = list(SHORT["traceEvents"])
    twice = [e for e in events if rng.random() < share]
    for e in twice:
        events.insert(rng.randrange(len(events) + 1), dict(e))
    got = _budget(dict(SHORT, traceEvents=events))
    _same_budget(got, _base())
    gpu_twice = sum(1 for e in twice if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    skipped = (got["capture"].get("skipped_rows") or {}).get("trace events", {})
    assert skipped.get("GPU events repeated exactly (the same event twice)", 0) == gpu_twice


# --- ncu CSVs ----------------------------------------------------------------------------------------------------

ROWS = ncu_rows()
RUN = run_record.load(REAL_NCU.with_name("glm-drill-triton.run.json"))


def _text(rows) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode()


def _kernels(raw: bytes):
    from profattr.trace.ncu_csv import read_ncu_csv

    folder = Path(tempfile.mkdtemp(prefix="profattr-prop-"))
    path = folder / "d.ncu.csv"
    path.write_bytes(raw)
    try:
        ncu = read_ncu_csv(path, run=RUN)
    finally:
        path.unlink()
        folder.rmdir()
    return {k.id: k.to_dict() for k in ncu.kernels}, ncu.skipped_rows


WANT, _ = _kernels(REAL_NCU.read_bytes())


def test_the_drill_has_its_launches():
    assert sorted(WANT) == sorted(int(r[0]) for r in ROWS[2:])


@run_settings("ncu_order")
@given(order=st.permutations(list(range(len(ROWS) - 2))))
def test_any_row_order_gives_the_same_kernels(order):
    got, skipped = _kernels(_text(ROWS[:2] + [ROWS[2 + i] for i in order]))
    assert got == WANT and skipped == 0


@run_settings("ncu_repeat")
@given(picks=st.lists(st.tuples(st.integers(0, len(ROWS) - 3), st.integers(0, 10 ** 6)), max_size=30))
def test_repeated_rows_are_counted_and_left_out(picks):
    data = [list(r) for r in ROWS[2:]]
    for which, where in picks:
        data.insert(where % (len(data) + 1), list(ROWS[2 + which]))
    got, skipped = _kernels(_text(ROWS[:2] + data))
    assert got == WANT and skipped == len(picks)


@run_settings("ncu_text")
@given(bom=st.booleans(), crlf=st.booleans(), prof=st.lists(st.integers(0, len(ROWS)), max_size=4))
def test_byte_order_mark_line_ends_and_ncu_messages_change_nothing(bom, crlf, prof):
    lines = _text(ROWS).decode().splitlines()
    for at in sorted(prof, reverse=True):
        lines.insert(max(at, 1), "==PROF== Disconnected from process 1234")
    raw = ("\r\n" if crlf else "\n").join(lines).encode() + b"\n"
    got, skipped = _kernels((b"\xef\xbb\xbf" if bom else b"") + raw)
    assert got == WANT and skipped == 0


def test_examples():
    assert sum(EXAMPLES.values()) >= 300


@pytest.fixture(autouse=True)
def _quiet_warnings():
    from profattr.errors import reset_warnings

    reset_warnings()
    yield
