"""trace/calls.py: a capture's CUDA calls held whole or spilled to a temporary file a block at a time. Both give the
calls in start order, and for any time range a run of them that holds every call overlapping it; a report's views
of real captures are the same with the calls spilled in small blocks as held whole."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import EXAMPLES
from profattr.trace import calls as call_sets
from profattr.trace.calls import SpilledCalls, WholeCalls
from test_window_views import _read_plain


def _calls(rng, n: int, in_order: bool = True) -> dict:
    start = np.sort(rng.integers(0, 1_000_000, n)) if in_order else rng.integers(0, 1_000_000, n)
    long = rng.random(n) < 0.02  # a few long calls (synchronizations) reaching over many blocks
    end = start + np.where(long, rng.integers(0, 200_000, n), rng.integers(0, 500, n))
    return {"tid": rng.integers(1, 4, n), "start": start, "end": end, "kind": rng.integers(0, 4, n)}


def _overlapping(api: dict, lo: int, hi: int) -> set:
    return {(int(t), int(s), int(e), int(k)) for t, s, e, k in zip(*(api[c] for c in call_sets.COLUMNS))
            if s < hi and e > lo}


@pytest.mark.parametrize("seed", range(4))
def test_spilled_blocks_and_ranges_against_plain_python(seed, monkeypatch):
    monkeypatch.setattr(call_sets, "BLOCK_CALLS", int(np.random.default_rng(seed).integers(1, 60)))
    rng = np.random.default_rng(seed)
    api = _calls(rng, int(rng.integers(0, 900)))
    parts = np.array_split(np.arange(len(api["start"])), int(rng.integers(1, 12)))
    spilled = SpilledCalls.of([{k: v[i] for k, v in api.items()} for i in parts])
    whole = WholeCalls(api)
    try:
        for held in (spilled, whole):
            got = {k: np.concatenate([b[k] for b in held.blocks()] or [np.zeros(0, np.int64)])
                   for k in call_sets.COLUMNS}
            assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in api.items()}
            assert len(held) == len(api["start"])
            assert [held.count(k) for k in range(4)] == [int((api["kind"] == k).sum()) for k in range(4)]
            for lo in rng.integers(-1000, 1_200_000, 40).tolist():
                hi = lo + int(rng.integers(0, 300_000))
                run = held.between(lo, hi)
                assert (np.diff(run["start"]) >= 0).all()  # in start order
                assert _overlapping(run, lo, hi) == _overlapping(api, lo, hi)
    finally:
        spilled.close()
    assert spilled.file.closed


def test_calls_out_of_start_order_are_not_spilled():
    rng = np.random.default_rng(9)
    api = _calls(rng, 50, in_order=False)
    assert SpilledCalls.of([api]) is None
    whole = WholeCalls(api)  # sorted, stable
    order = np.argsort(api["start"], kind="stable")
    assert whole.blocks().__next__()["end"].tolist() == api["end"][order].tolist()


@pytest.mark.parametrize("name", ["sglang-triton-bs1.sqlite", "sglang-triton-bs1-eager.nsys-rep",
                                  "glm5/glm-triton-bs1-r1.sqlite"])
def test_report_views_of_real_captures_with_the_calls_spilled(name, tmp_path, monkeypatch):
    """A report's read of a capture (budget, launch and idle analysis with the host's calls in the gaps, timeline
    step, checks) with every capture's calls spilled in blocks of 97 (the form of a long capture) is the read with
    them held whole; the calls counted against SQL."""
    import sqlite3

    from profattr.report.capture_reads import ReadJob, read_capture
    from profattr.trace.reader import open_export
    from profattr.trace.source import open_trace

    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    path = EXAMPLES / name
    job = ReadJob(given=str(path), path=str(path), run=None, steps="auto", rules=(), force=False, skip_steps=None,
                  mapping=None, by="category", defaults=False, graph_twin=None, host_cycle=False)
    whole = _read_plain(read_capture(job))
    monkeypatch.setattr(call_sets, "WHOLE_ROWS", 0)
    monkeypatch.setattr(call_sets, "BLOCK_CALLS", 97)
    with open_trace(path) as source:
        held = source.host_calls()
        assert isinstance(held, SpilledCalls) and len(held.sizes) > 3
        export = source.path
    conn = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    graph = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                         "WHERE s.value LIKE 'cudaGraphLaunch%'").fetchone()[0]
    conn.close()
    assert held.count(0) == graph and held.file.closed  # closed with its reader
    assert _read_plain(read_capture(job)) == whole
    with open_export(export) as plain_export:
        assert isinstance(plain_export.host_calls(), SpilledCalls)
