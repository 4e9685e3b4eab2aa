"""The committed example reports (reports/examples/) are what the code writes now: each is regenerated from the
committed captures with the command scripts/make-example-reports runs, and compared with the committed text file by
file. Only the profattr version is ignored; the charts (PNG, their pixels depend on matplotlib and its fonts) are
compared by name only. A failure means the report changed: read the diff, and when the change is meant, refresh the
examples with scripts/make-example-reports.

The commands run in a folder that mirrors the repository (links to the committed captures under the same relative
paths), so the paths a report prints are the ones the committed report prints, and the exports of .nsys-rep captures
land in that folder, never beside the committed files. The two cheapest cases (the two small SGLang captures, the
workload captures: about 20 s on two cores) run by default; all 31 together took about 4 minutes on two cores with
a warm op-store cache (more on a cold one), so the GLM-5-shaped ones run with PROFATTR_GOLDEN=all.
"""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, require_nsys

EXAMPLES = ROOT / "reports" / "examples"
H, G, N = "examples/h200", "examples/h200/glm5", "examples/h200/glm5-nvfp4"
R, O, F, V = ("reports/examples", "reports/examples/h200-glm5-like", "reports/examples/h200-glm5-like/fp8-gemm-backend",
              "reports/examples/h200-glm5-nvfp4")
VERSION = re.compile(r"\bprofattr \d+\.\d+[\w.+-]*")
ALL = os.environ.get("PROFATTR_GOLDEN", "").lower() == "all"


@dataclass(frozen=True)
class Case:
    """One command of scripts/make-example-reports: its output folder (`-o`) or the file its stdout goes to."""

    output: str
    args: tuple
    stdout: bool = False  # the command's stdout is the output file
    cheap: bool = False
    before: tuple = ()  # commands run first (a ledger to report on)
    may_fail: bool = False  # `|| true` in the script: the output is what it prints either way


def _diffs() -> list:
    out = []
    for b in (1, 4, 8):
        out.append(Case(f"{O}/diff-triton-vs-cutlass-bs{b}.txt", ("diff", "--skip-steps", "auto",
                        f"{G}/glm-triton-bs{b}-r*.nsys-rep", "--", f"{G}/glm-cutlass-bs{b}-r*.nsys-rep"), True))
        out.append(Case(f"{V}/diff-rnd-bs{b}.txt", ("diff", "--skip-steps", "auto", f"{G}/glm-fp8-rnd*-bs{b}-r*.nsys-rep",
                                                     "--", f"{N}/glm-nvfp4-rnd*-bs{b}-r*.nsys-rep"), True))
        out.append(Case(f"{V}/diff-same-bs{b}.txt", ("diff", "--skip-steps", "auto", f"{G}/glm-triton-bs{b}-r?.nsys-rep",
                                                      "--", f"{N}/glm-nvfp4-bs{b}-r?.nsys-rep"), True))
    for b in (1, 4):
        out.append(Case(f"{F}/diff-fp8gemm-triton-vs-deep_gemm-bs{b}.txt", (
            "diff", "--skip-steps", "auto", f"{G}/glm-fp8tr-bs{b}-r?.nsys-rep", "--", f"{G}/glm-fp8dg-bs{b}-r?.nsys-rep"),
            True))
        out.append(Case(f"{F}/diff-moe-triton-vs-deep_gemm-dense-deep_gemm-bs{b}.txt", (
            "diff", "--skip-steps", "auto", f"{G}/glm-fp8dg-bs{b}-r?.nsys-rep", "--", f"{G}/glm-dgdg-bs{b}-r?.nsys-rep"),
            True))
    return out


LEDGER = ("ledger", "add", "--ledger", "campaign.db", f"{G}/glm-fp8tr-bs1-r1.nsys-rep", f"{G}/glm-fp8dg-bs1-r1.nsys-rep",
          f"{G}/glm-dgdg-bs1-r1.nsys-rep", f"{G}/glm-fp8tr-bs4-r1.nsys-rep", f"{G}/glm-fp8dg-bs4-r1.nsys-rep",
          "--label", "1 baseline: Triton GEMMs, bs1", "--label", "2 dense FP8 GEMM on DeepGEMM, bs1",
          "--label", "3 MoE on DeepGEMM too, bs1", "--label", "4 baseline, bs4",
          "--label", "5 dense FP8 GEMM on DeepGEMM, bs4")
VARIANCE = [f"{G}/glm-{c}-r*.nsys-rep" for c in ("triton-bs1", "fp8tr-bs1", "triton-bs4", "fp8tr-bs4", "cutlass-bs*",
                                                 "deep_gemm", "fp8dg-bs*", "dgdg-bs*", "triton-bs8")]

CASES = [
    Case(f"{R}/h200-workload", ("report", f"{H}/wl-eager-loop.nsys-rep", f"{H}/wl-eager-grouped.nsys-rep",
                                f"{H}/wl-graph-grouped-before.nsys-rep", f"{H}/wl-graph-loop-before.nsys-rep",
                                "-o", f"{R}/h200-workload", "--force"), cheap=True),
    Case(f"{R}/h200-sglang", ("report", f"{H}/sglang-triton-bs1.sqlite", f"{H}/sglang-triton_kernel-bs1.sqlite",
                              "-o", f"{R}/h200-sglang", "--force"), cheap=True),
    Case(O, ("report", "-o", O, "--skip-steps", "auto", "--force",
             *[f"{G}/glm-{c}-r1.nsys-rep" for c in ("triton-bs1", "cutlass-bs1")], f"{G}/glm-deep_gemm-r1.nsys-rep",
             *[f"{G}/glm-{c}-r1.nsys-rep" for c in ("triton-bs4", "cutlass-bs4", "triton-bs8", "cutlass-bs8")],
             "--mapping", f"{G}/glm-triton-bs1-r1.nsys-rep={G}/glm-triton-eager.nsys-rep",
             "--drill", f"{G}/glm-triton-bs1-r1.nsys-rep={G}/glm-drill-triton.ncu.csv",
             "--drill", f"{G}/glm-triton-bs1-r1.nsys-rep={G}/glm-drill-triton-moe.ncu.csv")),
    Case(f"{O}/diff-triton-vs-deep_gemm-bs1.txt", ("diff", "--skip-steps", "auto", f"{G}/glm-triton-bs1-r*.nsys-rep",
                                                   "--", f"{G}/glm-deep_gemm-r*.nsys-rep"), True),
    Case(f"{O}/diff-aa-triton-bs1.txt", ("diff", "--skip-steps", "auto", f"{G}/glm-triton-bs1-r1.nsys-rep",
                                         f"{G}/glm-triton-bs1-r2.nsys-rep"), True),
    Case(f"{O}/gap-triton-bs1.txt", ("gap", f"{G}/glm-triton-bs1-r1.nsys-rep"), True),
    Case(f"{O}/variance.txt", ("variance", "--skip-steps", "auto", "-o", f"{O}/variance.txt", "--force", *VARIANCE)),
    Case(F, ("report", "-o", F, "--skip-steps", "auto", "--force", "--labels",
             "triton-bs1,deep_gemm-bs1,all-deep_gemm-bs1,triton-bs4,deep_gemm-bs4,all-deep_gemm-bs4",
             *[f"{G}/glm-{c}-bs{b}-r?.nsys-rep" for b in (1, 4) for c in ("fp8tr", "fp8dg", "dgdg")],
             "--drill", f"{G}/glm-fp8dg-bs1-r1.nsys-rep={G}/glm-drill-fp8dg.ncu.csv")),
    Case(f"{F}/gap-deep_gemm-bs1.txt", ("gap", f"{G}/glm-fp8dg-bs1-r1.nsys-rep"), True),
    Case(f"{O}/campaign", ("report", "--ledger", "campaign.db", "-o", f"{O}/campaign", "--force"), before=(LEDGER,)),
    Case(V, ("report", "--skip-steps", "auto", f"{G}/glm-fp8-rnd*-bs1-r*.nsys-rep", f"{N}/glm-nvfp4-rnd*-bs1-r*.nsys-rep",
             f"{G}/glm-fp8-rnd*-bs4-r*.nsys-rep", f"{N}/glm-nvfp4-rnd*-bs4-r*.nsys-rep",
             "--labels", "fp8-bs1,nvfp4-bs1,fp8-bs4,nvfp4-bs4",
             "--drill", f"{N}/glm-nvfp4-rnd-bs1-r1.nsys-rep={N}/glm-drill-nvfp4.ncu.csv", "-o", V, "--force")),
    Case(f"{V}/gap-nvfp4.txt", ("gap", f"{N}/glm-nvfp4-rnd-bs1-r1.nsys-rep"), True),
    Case(f"{V}/gap-fp8.txt", ("gap", f"{G}/glm-fp8-rnd-bs1-r1.nsys-rep"), True),
    Case(f"{V}/variance-nvfp4.txt", ("variance", "--skip-steps", "auto", f"{N}/glm-nvfp4-rnd*-bs*-r*.nsys-rep"), True),
    Case(f"{V}/variance-fp8.txt", ("variance", "--skip-steps", "auto", f"{G}/glm-fp8-rnd*-bs*-r*.nsys-rep"), True),
    Case(f"{V}/drill-nvfp4.txt", ("drill-report", f"{N}/glm-drill-nvfp4.ncu.csv", "--capture",
                                  f"{N}/glm-nvfp4-rnd-bs1-r1.nsys-rep"), True),
    *[Case(f"{V}/twin-bs{b}.txt", ("check", f"{N}/glm-nvfp4-bs{b}-r2.nsys-rep", "--twin",
                                   f"{N}/glm-nvfp4-graphtrace-bs{b}.nsys-rep"), True, may_fail=True) for b in (1, 4)],
    *_diffs(),
]


def _committed_text(case: Case) -> dict:
    """relative path -> committed text of the case's output (a report's folder: the markdown it writes, not the
    hand-written README.md, a subfolder's or the .txt files other commands write beside it)."""
    path = ROOT / case.output
    if not path.is_dir():
        return {case.output: path.read_text(encoding="utf-8")}
    return {f"{case.output}/{p.name}": p.read_text(encoding="utf-8") for p in sorted(path.iterdir())
            if p.is_file() and p.suffix == ".md" and p.name != "README.md"}


def _pngs(folder: Path) -> list:
    return sorted(p.name for p in folder.glob("*.png")) if folder.is_dir() else []


def test_every_committed_example_has_a_case():
    produced = {name for case in CASES for name in _committed_text(case)}
    committed = {str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*") if p.suffix in (".md", ".txt")
                 and p.name != "README.md"}
    assert committed == produced, sorted(committed ^ produced)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """A folder with the repository's examples/ linked file by file (exports land here)."""
    require_nsys("export the committed .nsys-rep captures")
    base = tmp_path_factory.mktemp("golden")
    for path in (ROOT / "examples").rglob("*"):
        if path.is_file():  # committed .sqlite exports included: some reports read them
            link = base / path.relative_to(ROOT)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    return base


def _profattr(args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PROFATTR_PROGRESS="0")
    env.pop("PROFATTR_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "profattr", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=1800)


def _normal(text: str) -> str:
    return VERSION.sub("profattr <version>", text)


@pytest.mark.nsys
@pytest.mark.parametrize("case", [pytest.param(c, id=c.output.replace("reports/examples/", ""),
                                               marks=() if c.cheap or ALL else pytest.mark.skip(
                                                   reason="minutes on two cores: PROFATTR_GOLDEN=all runs it"))
                                  for c in CASES])
def test_the_committed_report_is_what_the_code_writes(mirror, case):
    for before in case.before:
        done = _profattr(before, mirror)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    out = mirror / case.output
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _profattr(case.args, mirror)
    assert done.returncode == 0 or case.may_fail, done.stderr.decode(errors="replace")[-2000:]
    if case.stdout:
        out.write_bytes(done.stdout)
    for name, want in _committed_text(case).items():
        got = (mirror / name).read_text(encoding="utf-8")
        if _normal(got) != _normal(want):
            diff = difflib.unified_diff(_normal(want).splitlines(), _normal(got).splitlines(), "committed", "now",
                                        lineterm="", n=1)
            pytest.fail(f"{name} differs from what the code writes now (refresh with scripts/make-example-reports "
                        "when the change is meant):\n" + "\n".join(list(diff)[:60]))
    assert _pngs(out) == _pngs(ROOT / case.output)
