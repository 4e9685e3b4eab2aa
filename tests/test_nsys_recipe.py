"""The budget packaged as an nsys recipe (nsys_recipes/profattr_budget) runs inside a real `nsys recipe` and agrees
with `profattr budget` on the same capture."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess

import pytest

from conftest import EXAMPLES, IN_CI, ROOT, find_test_nsys
from profattr.attribute.budget import compute_budget

pytestmark = pytest.mark.nsys


def test_recipe_matches_budget(tmp_path):
    nsys = find_test_nsys()
    if nsys is None:
        if IN_CI:
            pytest.fail("no nsys in CI")
        pytest.skip("no nsys")
    for mod in ("psutil", "pyarrow"):
        try:
            __import__(mod)
        except ImportError:
            if IN_CI:
                pytest.fail(f"{mod} missing in CI (pip install -e '.[test]')")
            pytest.skip(f"{mod} missing: nsys recipes need it")
    rep = tmp_path / "sglang-triton-bs1.nsys-rep"
    shutil.copyfile(EXAMPLES / rep.name, rep)
    env = dict(os.environ, NSYS_RECIPE_PATH=str(ROOT / "nsys_recipes"))
    out = tmp_path / "out"
    proc = subprocess.run([nsys, "recipe", "profattr_budget", "--input", str(rep), "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = list(csv.DictReader((out / "devices.csv").open()))
    assert len(rows) == 1
    expected = compute_budget(EXAMPLES / "sglang-triton-bs1.sqlite").devices[0]
    assert float(rows[0]["step_ms"]) == pytest.approx(expected["step_ms"], rel=1e-9)
    assert float(rows[0]["kernels_per_step"]) == pytest.approx(expected["kernels_per_step"], rel=1e-9)
    assert (out / "sglang-triton-bs1.budget.json").exists()
