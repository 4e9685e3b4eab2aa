"""Smoke test of benchmarks/budget_scale.py (the real benchmark runs apart from the suite): it scales a real capture
twice, measures the scan, the fetch methods and profattr, and prints the table with growth exponents."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import EXAMPLES, ROOT


def test_benchmark_script_runs_small(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=os.path.dirname(sys.executable))  # no nsys-ai: keep it short
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "budget_scale.py"),
                           str(EXAMPLES / "sglang-triton-bs1.sqlite"), "--sizes", "6000,12000", "--repeat", "1",
                           "--workdir", str(tmp_path / "work"), "--markdown", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    for row in ("| sql aggregate scan (T) |", "| sql row scan |", "| fetch: sqlite3 |", "| fetch: adbc (Arrow) |", "| profattr budget cold |",
                "| profattr budget warm |", "| profattr diff self warm |", "## Growth exponents"):
        assert row in text, row
    assert "| failed" not in text and "timeout" not in text
    assert not list((tmp_path / "work").glob("*.sqlite")), "scaled captures are removed"
