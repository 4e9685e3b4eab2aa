"""A report reads each capture once: its budget, computed with the report's --steps / --rules / --skip-steps, is the
one the launch views, the capture checks and the gap to the hardware limit are computed from.

The expectations are SQL on the committed exports (tests/independent.py): the graph steps SGLang's replays make,
and the kernel time inside the workload's `decode_step` ranges.
"""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import profattr
import profattr.trace.reader as reader
from conftest import EXAMPLES
from independent import expected_graph, expected_nvtx
from profattr.cli import cli

SGLANG = "sglang-triton-bs1"


def _bare_checks_copy(folder, name: str = SGLANG):
    """The committed capture, its server log and its run.json without the findings recorded at capture time (so
    the report computes its checks itself), in `folder`; the export's path there."""
    folder.mkdir(parents=True, exist_ok=True)
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    run.pop("check")
    (folder / f"{name}.run.json").write_text(json.dumps(run))
    for suffix in (".sqlite", ".server.log.gz"):
        (folder / f"{name}{suffix}").symlink_to(EXAMPLES / f"{name}{suffix}")
    return folder / f"{name}.sqlite", run


def _report(args) -> None:
    result = CliRunner().invoke(cli, ["report", *map(str, args)])
    assert result.exit_code == 0, result.output


def _check_rows(details: str) -> dict:
    """check name -> (status, finding) from the "Capture checks" table of details.md (one capture)."""
    section = details.split("## Capture checks", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0] not in ("status", "---"):
            rows[cells[1].strip("`")] = (cells[0].strip("*").lower(), cells[2])
    return rows


@pytest.mark.parametrize("options, skipped", [((), 0), (("--skip-steps", "4"), 4)])
def test_the_reports_checks_count_the_steps_of_its_budgets(tmp_path, options, skipped):
    """With run.json recording no findings, the report's `steps` check counts the steps its budgets use: the graph
    steps (one per cudaGraphLaunch, as SQL finds the replays that launched work) less those --skip-steps leaves
    out; before, the checks computed a budget of their own on the default steps and counted all of them."""
    capture, run = _bare_checks_copy(tmp_path / "cap")
    steps = expected_graph(capture)[0]["steps"]
    requested = run["window"]["steps_requested"]
    out = tmp_path / "report"
    _report([capture, "-o", out, *options])
    details = (out / "details.md").read_text()
    assert "Computed now by `profattr check` on this report's steps and rules" in details
    status, text = _check_rows(details)["steps"]
    assert text.startswith(f"{steps - skipped} steps counted (graph) for {requested} requested")
    assert (f"; {skipped} left out" in text) == bool(skipped)
    budget = (out / "report.md").read_text()
    assert f"median of {steps - skipped} steps" in budget  # the budget the checks counted is the report's


def test_recorded_checks_stand_only_for_the_default_steps_and_rules(tmp_path):
    """run.json records the findings `profattr check` made on the default steps: a report on those shows them as
    recorded; a report with --skip-steps computes them again on its own steps, which count fewer (SQL's graph
    steps less those left out)."""
    recorded = json.loads((EXAMPLES / f"{SGLANG}.run.json").read_text())["check"]["findings"]
    steps = expected_graph(EXAMPLES / f"{SGLANG}.sqlite")[0]["steps"]
    out = tmp_path / "default"
    _report([EXAMPLES / f"{SGLANG}.sqlite", "-o", out])
    details = (out / "details.md").read_text()
    assert "Recorded in run.json by `profattr check` when the capture was made." in details
    assert set(_check_rows(details)) == {f["check"] for f in recorded}
    out = tmp_path / "skipped"
    _report([EXAMPLES / f"{SGLANG}.sqlite", "-o", out, "--skip-steps", "4"])
    details = (out / "details.md").read_text()
    assert ("Computed now by `profattr check` on this report's steps and rules (run.json's were made on the "
            "default steps and rules).") in details
    assert _check_rows(details)["steps"][1].startswith(f"{steps - 4} steps counted (graph)")


def test_the_reports_checks_follow_its_steps_option(tmp_path):
    """--steps whole: one step, the whole capture; the checks say so instead of counting SQL's graph steps."""
    capture, run = _bare_checks_copy(tmp_path / "cap")
    out = tmp_path / "report"
    _report([capture, "-o", out, "--steps", "whole"])
    rows = _check_rows((out / "details.md").read_text())
    assert rows["steps"][1].startswith(f"1 steps counted (whole) for {run['window']['steps_requested']} requested")
    assert rows["steps_with_gpu_work"] == ("skip", "steps are whole: defined by the GPU work")


def test_the_reports_gap_measures_the_categories_of_its_rules(tmp_path, export_example):
    """A --rules file that puts every kernel in `other`: the gap's `other` row measures all the kernel time of a
    step, as SQL sums it inside the workload's `decode_step` ranges."""
    path = export_example("wl-eager-loop")
    rules = tmp_path / "all-other.toml"
    rules.write_text("[[rule]]\nid = 'everything'\ncategory = 'other'\npattern = '.'\n")
    want = expected_nvtx(path, "decode_step")[0]
    kernel_ms = sum(ms for ms, _count in want["per_kernel"].values())
    out = tmp_path / "report"
    _report([path, "-o", out, "--rules", rules])
    gap = (out / "details.md").read_text().split("## Gap to the hardware limit", 1)[1]
    table = gap.split("| category | measured ms |", 1)[1].split("\n\n", 1)[0]
    measured = {k: float(v) for k, v in re.findall(r"^\| `?([\w.]+)`? \| ([\d.]+) \|", table, re.MULTILINE)}
    assert measured["other"] == pytest.approx(kernel_ms, abs=5e-4)  # shown to 3 decimals
    for category in ("moe.gemm", "gemm.bf16", "norm", "attention.decode"):  # rows of the model's floor only now
        assert measured[category] == 0.0


class _Opens:
    """Counts, per capture file, the reader's opens (trace/reader.py connect_read_only) and every other SQLite
    connection to it (a second path to the data, around the reader), in this process and in the worker processes a
    report reads its captures in (forked: they count with the same functions, into the same file)."""

    def __init__(self, monkeypatch, log):
        self.log = log
        self._inside = False
        connect, read_only = sqlite3.connect, reader.connect_read_only

        def note(kind, key) -> None:
            with open(log, "a") as fh:
                fh.write(f"{kind}\t{key}\n")

        def counted_read_only(path, head):
            note("reader", path.resolve())
            self._inside = True
            try:
                return read_only(path, head)
            finally:
                self._inside = False

        def counted_connect(database, *args, **kwargs):
            text = str(database)
            if not self._inside and text.startswith("file:"):
                note("other", text.split("?", 1)[0])
            return connect(database, *args, **kwargs)

        monkeypatch.setattr(reader, "connect_read_only", counted_read_only)
        monkeypatch.setattr(sqlite3, "connect", counted_connect)

    def _counts(self, kind: str) -> dict:
        out: dict = {}
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        for k, key in (line.split("\t", 1) for line in lines):
            if k == kind:
                key = Path(key) if kind == "reader" else key
                out[key] = out.get(key, 0) + 1
        return out

    @property
    def reader(self) -> dict:
        return self._counts("reader")

    @property
    def other(self) -> dict:
        return self._counts("other")


@pytest.mark.parametrize("via", ["cli", "api"])
def test_a_report_opens_each_capture_once(tmp_path, monkeypatch, export_example, via):
    """Two SGLang captures (one whose checks are computed now) and a workload capture (whose gap is computed):
    the report opens each export once, and nothing reads them around the reader."""
    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    bare, _ = _bare_checks_copy(tmp_path / "cap")
    captures = [bare, EXAMPLES / "sglang-triton_kernel-bs1.sqlite", export_example("wl-eager-loop")]
    for c in captures:  # the op store built first: building it reads the export on a second connection, once ever
        profattr.open(c).budget()
    opens = _Opens(monkeypatch, tmp_path / "opens.log")
    out = tmp_path / "report"
    if via == "cli":
        _report([*captures, "-o", out])
    else:
        profattr.report(captures, out)
    details = (out / "details.md").read_text()
    assert "Computed now by `profattr check`" in details and "Measured " in details  # checks and a gap ran
    assert opens.reader == {c.resolve(): 1 for c in captures}
    assert opens.other == {}


def test_a_report_projected_to_another_gpu_opens_its_first_capture_once(tmp_path, monkeypatch, export_example):
    """`report --to`: the projection is made from the report's own budget of the first capture (the same steps,
    rules and skipped steps), without opening it again (it was opened twice)."""
    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    capture = export_example("glm5/glm-triton-bs1-r1")
    profattr.open(capture).budget()  # the op store built first (once ever, on a connection of its own)
    opens = _Opens(monkeypatch, tmp_path / "opens.log")
    out = tmp_path / "report"
    _report([capture, "-o", out, "--to", "rtx-pro-6000-ws", "--to-tp", "8"])
    assert opens.reader == {capture.resolve(): 1}
    assert opens.other == {}
    assert "## On the target" in (out / "report.md").read_text()
