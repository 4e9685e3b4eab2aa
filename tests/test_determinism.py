"""The same inputs give the same bytes: a diff's float totals and its tie orders do not follow Python's string
hashing (which changes from process to process unless PYTHONHASHSEED is set)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import EXAMPLES, ROOT

PAIR = [EXAMPLES / "sglang-triton-bs1.sqlite", EXAMPLES / "sglang-triton_kernel-bs1.sqlite"]


def _diff_json(seed: str, cache) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT), "PROFATTR_CACHE": str(cache)}
    run = subprocess.run([sys.executable, "-m", "profattr", "diff", *map(str, PAIR), "--format", "json"],
                         capture_output=True, env=env, cwd=os.sep, check=True)
    return run.stdout


def test_a_diff_is_the_same_bytes_under_any_string_hashing(tmp_path):
    outputs = {_diff_json(seed, tmp_path / "cache") for seed in ("1", "2", "3", "4")}
    assert len(outputs) == 1
    assert b'"from_count_ms"' in next(iter(outputs))  # the float totals that used to follow the hash order
