"""The host figures a projection carries over (attribute/host_cycle.py), on synthetic exports whose answer is known
by construction, and the projection's own arithmetic on edge cases."""
from __future__ import annotations

import pytest

from synth import Builder, gtid
from profattr.attribute.host_cycle import host_cycle
from profattr.trace.source import open_trace

TID = gtid(7)


def _capture(tmp_path, nvtx: bool):
    b = Builder(tmp_path / ("with-nvtx.sqlite" if nvtx else "without-nvtx.sqlite"))
    for i in range(5):
        t0 = 10_000 + i * 1_000
        if nvtx:
            b.nvtx(TID, t0, t0 + 600, "step[DECODE bs=1]")
        b.launch(TID, t0 + 100, t0 + 250, name="cudaGraphLaunch_v10000")     # lead: 250 ns from the range start
        b.launch(TID, t0 + 500, t0 + 800, name="cudaEventSynchronize_v3020")  # 300 ns waiting per step
        b.launch(TID, t0 + 850, t0 + 860)                                       # not a wait
    return b.close()


def test_host_cycle_is_the_launch_period_less_the_waits(tmp_path):
    with open_trace(_capture(tmp_path, nvtx=True)) as trace:
        got = host_cycle(trace)
    assert got["graph_launches"] == 5
    assert got["period_ms"] == pytest.approx(1_000 / 1e6)
    assert got["sync_ms_per_step"] == pytest.approx(300 / 1e6)
    assert got["host_cycle_ms"] == pytest.approx(700 / 1e6)
    assert got["host_lead_ms"] == pytest.approx(250 / 1e6)
    assert got["launch_call_ms"] == pytest.approx(150 / 1e6)


def test_without_nvtx_there_is_no_lead(tmp_path):
    with open_trace(_capture(tmp_path, nvtx=False)) as trace:
        got = host_cycle(trace)
    assert got["host_cycle_ms"] == pytest.approx(700 / 1e6) and got["host_lead_ms"] is None


def test_an_eager_capture_has_no_host_cycle(tmp_path):
    b = Builder(tmp_path / "eager.sqlite")
    for i in range(3):
        b.launch(TID, 1_000 * i, 1_000 * i + 10)
    with open_trace(b.close()) as trace:
        assert host_cycle(trace) is None
