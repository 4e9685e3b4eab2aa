"""Shared fixtures: the real H200 captures committed in examples/h200/.

Captures committed as .sqlite are used in place (opened read-only). Captures committed only as .nsys-rep are
exported once per test session with a real Nsight Systems into a temporary folder (never beside the committed
file). Without nsys the tests that need them skip here, and fail in CI (CI=true), where nsys is always installed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
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
# Nsight Systems 2024.2.3 captures of the GLM-5-shaped SGLang decode (examples/h200/glm5/): per MoE runner, batch 1/4/8
# with two replicate windows of one server each (-r1, -r2), the eager twin with layerwise NVTX, the TP8 per-rank slice
GLM_BACKENDS = ["triton", "cutlass"]
GLM_GRAPH_CAPTURES = ([f"glm5/glm-{b}-bs{bs}-r{r}" for b in GLM_BACKENDS for bs in (1, 4, 8) for r in (1, 2)]
                      + ["glm5/glm-deep_gemm-r1", "glm5/glm-deep_gemm-r2"]
                      # a later server session: dense FP8 GEMMs on Triton (fp8tr) or DeepGEMM (fp8dg), and both
                      # GEMM paths on DeepGEMM (dgdg), batch 1 and 4
                      + [f"glm5/glm-{c}-bs{bs}-r{r}" for c in ("fp8tr", "fp8dg", "dgdg") for bs in (1, 4)
                         for r in (1, 2)])
GLM_CAPTURES = GLM_GRAPH_CAPTURES + ["glm5/glm-triton-eager", "glm5/glm-tp8slice"]
# nsys 2023.4.4 on the same decode: its importer kept 50 of the 6160 kernels (the report a user of it gets)
GLM_LOSSY_CAPTURE = "glm5/glm-triton-nsys2023"
# workload captures made with nsys 2024.2.3: an unwarmed window, a graph-level trace, an A/A pair of launches
WORKLOAD_2024_CAPTURES = ["wl-eager-cold-window", "wl-graph-trace-graph", "wl-graph-grouped-r1", "wl-graph-grouped-r2"]


def find_test_nsys():
    """The nsys the product would use, or None."""
    try:
        from profattr.tools.nsys import find_nsys

        return find_nsys().path
    except Exception:
        return None


def require_nsys(purpose: str) -> str:
    """The nsys for a test that needs one to `purpose`: in CI a missing nsys fails the test, elsewhere it skips."""
    nsys = find_test_nsys()
    if nsys is None:
        if IN_CI:
            pytest.fail(f"no nsys found in CI to {purpose} (scripts/install-nsys should have installed one)")
        pytest.skip(f"no nsys here to {purpose} (run scripts/install-nsys)")
    return nsys


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
        nsys = require_nsys("export the committed .nsys-rep")
        copy = export_dir / rep.name
        shutil.copyfile(rep, copy)
        out = export_dir / f"{rep.stem}.sqlite"
        subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(copy)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # run.json (and the server log it names) beside the export, as `profattr capture` leaves them
        run = rep.with_name(rep.stem + ".run.json")
        if run.exists():
            shutil.copyfile(run, export_dir / run.name)
            log = (json.loads(run.read_text()).get("files") or {}).get("log")
            if log and (rep.parent / log).exists() and not (export_dir / log).exists():
                shutil.copyfile(rep.parent / log, export_dir / log)
        cache[name] = out
        return out

    return get


@pytest.fixture(autouse=True)
def _no_result_cache_across_tests(monkeypatch):
    """A budget result kept by one test would answer the same budget in the next, which may be checking that a
    fault it injects into the computation is reported: the result cache is off unless a test turns it on
    (tests/test_result_cache.py does, with a cache folder of its own)."""
    monkeypatch.setenv("PROFATTR_RESULT_CACHE", "0")


@pytest.fixture(autouse=True)
def _no_cache_setting_stays_in_its_test():
    """`--no-cache` sets PROFATTR_NO_CACHE in the process (so that diff's worker processes see it); a CLI test run
    in-process must not leave it set for the tests after it."""
    before = os.environ.get("PROFATTR_NO_CACHE")
    yield
    if before is None:
        os.environ.pop("PROFATTR_NO_CACHE", None)
    else:
        os.environ["PROFATTR_NO_CACHE"] = before


def default_sigint() -> None:
    """preexec_fn of a child process that a test interrupts with SIGINT: Ctrl-C at its default action in the
    child. A test run started in the background by a non-interactive shell (`pytest ... &`) has SIGINT ignored,
    which its children inherit (and keep, as a program started with SIGINT ignored should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
