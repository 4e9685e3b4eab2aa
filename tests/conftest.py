"""Shared fixtures: the real H200 captures committed in examples/h200/.

Captures committed as .sqlite are used in place (opened read-only). Captures committed only as .nsys-rep are
exported once per test session with a real Nsight Systems into a temporary folder (never beside the committed
file). Without nsys the tests that need them skip here, and fail in CI (CI=true), where nsys is always installed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "h200"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

WORKLOAD_CAPTURES = ["wl-eager-loop", "wl-eager-grouped", "wl-graph-grouped-after", "wl-graph-grouped-before",
                     "wl-graph-loop-before", "wl-graph-grouped-tp2"]
SGLANG_CAPTURES = ["sglang-triton-bs1", "sglang-triton_kernel-bs1", "sglang-triton-bs4", "sglang-triton_kernel-bs4"]
# SGLang without CUDA graphs, with its layerwise NVTX markers: the --mapping captures of the graph ones
SGLANG_EAGER_CAPTURES = ["sglang-triton-bs1-eager", "sglang-triton_kernel-bs1-eager"]
ALL_CAPTURES = WORKLOAD_CAPTURES + SGLANG_CAPTURES + SGLANG_EAGER_CAPTURES


def find_test_nsys():
    """The nsys the product would use, or None."""
    try:
        from profattr.capture.nsys import find_nsys

        return find_nsys().path
    except Exception:
        return None


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def export_example(export_dir):
    """export_example(name) -> path of NAME's SQLite export (committed, or exported once per session)."""
    cache: dict = {}

    def get(name: str) -> Path:
        committed = EXAMPLES / f"{name}.sqlite"
        if committed.exists():
            return committed
        if name in cache:
            return cache[name]
        rep = EXAMPLES / f"{name}.nsys-rep"
        if not rep.exists():
            raise FileNotFoundError(rep)
        nsys = find_test_nsys()
        if nsys is None:
            if IN_CI:
                pytest.fail("no nsys found in CI (scripts/install-nsys should have installed one)")
            pytest.skip("no nsys here to export the committed .nsys-rep (run scripts/install-nsys)")
        copy = export_dir / rep.name
        shutil.copyfile(rep, copy)
        out = export_dir / f"{name}.sqlite"
        subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(copy)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cache[name] = out
        return out

    return get
