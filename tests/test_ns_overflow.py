"""Sums of nanoseconds that do not fit 64 bits: a synthetic capture (real layout, invented rows) whose overlapping
kernels on several streams sum to more than 2**63 ns in one step. Every timestamp fits int64; only the sums do not."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from profattr.attribute.budget import compute_budget
from profattr.errors import ProfattrError
from synth import Builder, gpid, gtid

LIMIT_NS = 1 << 62  # profattr keeps times within 2**62 ns of 0 (trace/validate.py)


def _capture(path, duration_ns=None):
    """One step and eight kernels, kernel i on its own stream from i * 0.075 * 2**62 ns to near 2**62 (or for
    `duration_ns`): the starts are spread, so the capture's time range is wide enough to hold every end."""
    b = Builder(path)
    T, P = gtid(5), gpid(5)
    b.nvtx(T, 0, LIMIT_NS - 10, "decode_step")
    for i in range(8):
        t = 10_000 + i * (LIMIT_NS // 40 * 3)
        c = b.launch(T, t - 5_000, t - 4_000)
        b.kernel(P, c, t, LIMIT_NS - 1_000 - i if duration_ns is None else t + duration_ns, f"kernel_{i}",
                 stream=7 + i)
    return b.close()


def test_summed_durations_beyond_int64_raise_a_clear_error(tmp_path):
    path = _capture(tmp_path / "wide.sqlite")
    # independent: the kernels' summed durations, as exact integers from SQL's own rows
    import sqlite3
    durations = [e - s for s, e in sqlite3.connect(path).execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')]
    assert max(s for s in durations) < 2 ** 63 <= sum(durations)
    with pytest.raises(ProfattrError, match="2\\*\\*63"):
        compute_budget(path)


def test_the_cli_says_so_in_one_line(tmp_path):
    path = _capture(tmp_path / "wide.sqlite")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PROFATTR_CACHE=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "profattr", "budget", str(path), "--format", "json"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "2**63" in lines[0], run.stderr


def test_sums_just_below_the_limit_still_add_up(tmp_path):
    """Eight kernels of 2**59 ns sum to 2**62 ns: below the limit, the budget is made and adds up."""
    path = _capture(tmp_path / "short.sqlite", 1 << 59)
    import sqlite3
    total_ns = sum(e - s for s, e in sqlite3.connect(path).execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL'))
    assert total_ns < 2 ** 63
    d = compute_budget(path).devices[0]
    assert d["steps"] == 1
    total_ms = sum(c["ms_per_step"] for c in d["categories"])
    assert total_ms == pytest.approx(total_ns / 1e6, rel=1e-9)
