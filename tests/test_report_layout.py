"""The layout of the README's main report (three GLM-5-shaped captures): an expert reads the answer first.

report.md stays under 500 lines, opens with the Summary, the ranked bottlenecks (one line each) and the waterfall,
and keeps Reproducibility last, its long part in details.md; identifiers are code spans, never backslash escapes.
The step times of the Summary come from SQL over the exports (tests/independent.py)."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from independent import expected_nvtx_like
from profattr.cli import cli

NAMES = ["glm5/glm-triton-bs1-r1", "glm5/glm-cutlass-bs1-r1", "glm5/glm-deep_gemm-r1"]
LABELS = ["triton-bs1", "cutlass-bs1", "deep_gemm"]  # what the report calls them (file names, common parts dropped)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
MAX_LINES = 500
MAX_WORDS = 60


def outside_code(text: str) -> str:
    text = re.sub(r"^(`{3,})\w*\n.*?\n\1$", "", text, flags=re.S | re.M)
    return CODE_SPAN.sub("", text)


def section(text: str, heading: str) -> str:
    return text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def main_report(tmp_path_factory):
    paths = [EXAMPLES / f"{n}.sqlite" for n in NAMES]
    out = tmp_path_factory.mktemp("main-report")
    result = CliRunner().invoke(cli, ["report", *map(str, paths), "-o", str(out), "--force"])
    assert result.exit_code == 0, result.output
    return paths, (out / "report.md").read_text(encoding="utf-8"), (out / "details.md").read_text(encoding="utf-8")


def test_main_report_is_short_and_reads_answer_first(main_report):
    _, text, details = main_report
    lines = text.splitlines()
    assert len(lines) < MAX_LINES
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:3] == ["## Summary", "## Bottlenecks, ranked", "## From the floor to the measured step"]
    assert headings[-1] == "## Reproducibility"  # after every analysis section
    assert "[details.md](details.md)" in section(text, "## Reproducibility")
    for heading in ("## Reproducibility", "## Capture checks", "## Gap to the hardware limit"):
        assert heading in details.splitlines()
    for label in LABELS:  # each capture's run facts, checks and gap tables are in the details file
        assert details.count(f"### `{label}`") == 3, label


def test_identifiers_are_code_spans_not_escapes(main_report):
    _, text, details = main_report
    for doc in (text, details):
        prose = outside_code(doc)
        assert not re.findall(r"\\[_\-*]", prose), re.findall(r".{20}\\[_\-*].{20}", prose)[:5]
        assert "`" not in prose  # every code span closed
    for label in LABELS:
        assert f"`{label}`" in text and label not in outside_code(text).replace("-", " ").split(), label
    assert f"# Decode step report: {' vs '.join(f'`{x}`' for x in LABELS)}" in text.splitlines()


def test_each_ranked_bottleneck_is_one_short_line(main_report):
    _, text, _ = main_report
    ranked = [line for line in section(text, "## Bottlenecks, ranked").splitlines() if re.match(r"\d+\. ", line)]
    detail = [line for line in section(text, "## Bottlenecks in detail").splitlines() if re.match(r"\d+\. ", line)]
    assert len(ranked) >= 3 and len(detail) == len(ranked)
    for short, full in zip(ranked, detail):
        assert len(short.split()) <= MAX_WORDS, short
        assert short.split(":", 1)[0].split(" (")[0] == full.split(":", 1)[0].split(" (")[0]  # the same title
        assert len(full.split()) >= len(short.split()) - 5  # the whole reasoning is there


def test_summary_states_the_measured_step_and_the_floor(main_report):
    paths, text, _ = main_report
    summary = section(text, "## Summary")
    bullets = [line for line in summary.splitlines() if line.startswith("- **")]
    assert 3 <= len(bullets) <= 6
    step = next(b for b in bullets if b.startswith("- **Decode step**"))
    for path, label in zip(paths, LABELS):
        mean = expected_nvtx_like(path, "step[DECODE bs=%]")[0]["mean_step_ms"]
        m = re.search(rf"`{re.escape(label)}` ([\d.]+) ms", step)
        assert m and float(m.group(1)) == pytest.approx(mean, abs=6e-4), (label, mean)
    assert any(b.startswith("- **Gap to the floor**") for b in bullets)
    assert any(b.startswith("- **What limits it**") for b in bullets)


def test_waterfall_columns_add_up_from_floor_to_measured(main_report):
    paths, text, _ = main_report
    water = section(text, "## From the floor to the measured step")
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in water.splitlines()
            if line.startswith("| ") and not line.startswith("| component")]
    header = next(line for line in water.splitlines() if line.startswith("| component"))
    assert [c.strip() for c in header.strip("|").split(" | ")][1:] == [f"`{x}`" for x in LABELS]
    for col, path in enumerate(paths, 1):
        floor = float(rows[0][col])
        parts = sum(float(r[col]) for r in rows[1:-1] if r[col])
        measured = float(rows[-1][col].strip("*"))
        assert floor + parts == pytest.approx(measured, abs=5e-4 * len(rows))
        assert measured == pytest.approx(expected_nvtx_like(path, "step[DECODE bs=%]")[0]["mean_step_ms"], abs=6e-4)


# --- the escaping rules on edge cases (synthetic strings) -------------------------------------------------------------

def test_identifiers_become_code_spans_that_nothing_inside_can_break():
    from profattr.text import md_escape, md_name

    assert md_name("x`y") == "``x`y``"  # a longer fence than the backtick run inside
    assert md_name("`a`") == "`` `a` ``"  # padded: a span may not start or end with its own fence
    assert md_name("a|b") == "`a`\\|`b`"  # the pipe outside the spans, escaped: a table cell stays one cell
    assert not re.search(r"[\x00-\x1f\x7f]", md_name("ab\x1b[31mc\x07\nd"))  # control characters stripped
    assert md_escape("run deep_gemm's kernels") == "run `deep_gemm`'s kernels"
    assert md_escape("NVTX 'scheduler.run_batch', 0.003 ms") == "NVTX '`scheduler.run_batch`', 0.003 ms"
    # a word with `*` is a name (a glob, say): code; other markup is escaped, HTML cannot open
    assert md_escape("a *b* [c](d) $x$ <i>") == "a `*b*` \\[c\\](d) \\$x\\$ &lt;i&gt;"


def test_line_start_markup_is_neutralised_without_backslashes():
    from profattr.text import md_escape

    assert md_escape("- x") == "&#45; x" and md_escape("# x") == "&#35; x" and md_escape("1. x") == "1&#46; x"
    assert md_escape("---") == "&#45;--"  # a setext underline / thematic break
    for text in ("-0.009 ms", "0.1.0", "#3 of 5", "2024.2.3"):  # no markup here: left as is
        assert md_escape(text) == text
