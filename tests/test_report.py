"""`profattr report` end to end on the committed SGLang H200 captures (triton vs triton_kernel MoE runners, batch 1).

Numbers in the report are checked against SQL written here: steps are cut at cudaGraphLaunch calls (each lasts until
the next launch on its thread, the last one for the median interval), GPU work belongs to the step its launch call
started in. The synthetic exports (tests/synth.py) are only for escaping and the output-folder rules.
"""
from __future__ import annotations

import re
import sqlite3
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from synth import Builder, gpid, gtid

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "h200"
TRITON = EXAMPLES / "sglang-triton-bs1.sqlite"
TRITON_KERNEL = EXAMPLES / "sglang-triton_kernel-bs1.sqlite"
SAMPLES = "200"  # bootstrap samples: enough for the interval to exist, few enough to stay fast

# report.md in reading order (analysis first, Reproducibility last); details.md holds the long reproducibility part
SECTIONS = ["# Decode step report: `triton` vs `triton_kernel`", "## Summary", "## Bottlenecks, ranked",
            "## Per-step budget", "## Top kernels", "## Categories per capture", "## Idle time and launches",
            "## Differences against `triton`", "### `triton_kernel` vs `triton`", "## Bottlenecks in detail",
            "## Reproducibility"]
DETAILS = ["## Reproducibility", "## Capture checks", "## Gap to the hardware limit"]


def _ro(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def expected_graph_steps(path) -> dict:
    """Independent numbers for a capture stepped by CUDA graph launches (one GPU): steps, kernels per step,
    kernel-launch API calls per step, median step span (ms)."""
    conn = _ro(path)
    launches = conn.execute("""
        SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE s.value LIKE 'cudaGraphLaunch%' ORDER BY r.globalTid, r.start""").fetchall()
    intervals = [b[1] - a[1] for a, b in zip(launches, launches[1:]) if a[0] == b[0]]
    typical = int(statistics.median(intervals))
    steps = []
    for i, (tid, start) in enumerate(launches):
        nxt = launches[i + 1] if i + 1 < len(launches) and launches[i + 1][0] == tid else None
        steps.append((i, tid, start, (nxt[1] - 1) if nxt else start + typical - 1))
    values = ",".join(f"({i}, {tid}, {s}, {e})" for i, tid, s, e in steps)
    ops = f"""
        WITH steps(step, tid, ss, se) AS (VALUES {values}),
        ops AS (
          SELECT k.start AS s, k."end" AS e, 1 AS is_kernel, k.correlationId AS corr, k.globalPid AS pid
          FROM CUPTI_ACTIVITY_KIND_KERNEL k
          UNION ALL SELECT m.start, m."end", 0, m.correlationId, m.globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY m
          UNION ALL SELECT m.start, m."end", 0, m.correlationId, m.globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET m
        ),
        placed AS (
          SELECT st.step, ops.s, ops.e, ops.is_kernel FROM ops
          JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = ops.corr AND (r.globalTid & -16777216) = ops.pid
          JOIN steps st ON st.tid = r.globalTid AND r.start BETWEEN st.ss AND st.se
        )"""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_MEMSET" not in tables:
        ops = ops.replace('UNION ALL SELECT m.start, m."end", 0, m.correlationId, m.globalPid FROM '
                          'CUPTI_ACTIVITY_KIND_MEMSET m', "")
    per_step = conn.execute(ops + " SELECT step, max(e) - min(s), sum(is_kernel) FROM placed GROUP BY step").fetchall()
    launch_calls = conn.execute(f"""
        WITH steps(step, tid, ss, se) AS (VALUES {values})
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        JOIN steps st ON st.tid = r.globalTid AND r.start BETWEEN st.ss AND st.se
        WHERE s.value LIKE 'cudaLaunchKernel%' OR s.value LIKE 'cuLaunchKernel%'""").fetchone()[0]
    conn.close()
    n = len(per_step)
    return {"steps": n, "kernels_per_step": sum(r[2] for r in per_step) / n,
            "kernel_launches_per_step": launch_calls / n,
            "step_ms": statistics.median(r[1] for r in per_step) / 1e6}


def table_rows(text: str, header_start: str) -> list:
    """Rows (lists of cells) of the first markdown table whose header starts with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def row_for(rows: list, label: str) -> list:
    return next(r for r in rows if r[0] == label)


@pytest.fixture(scope="module")
def sglang_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "sglang"
    result = CliRunner().invoke(cli, ["report", str(TRITON), str(TRITON_KERNEL), "-o", str(out),
                                      "--samples", SAMPLES])
    assert result.exit_code == 0, result.output
    return out, (out / "report.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def expected():
    return {"`triton`": expected_graph_steps(TRITON), "`triton_kernel`": expected_graph_steps(TRITON_KERNEL)}


def test_report_has_every_section_and_chart(sglang_report):
    out, text = sglang_report
    lines = text.splitlines()
    assert [h for h in lines if h in SECTIONS] == SECTIONS  # each once, in this order
    assert "[details.md](details.md)" in text
    details = (out / "details.md").read_text(encoding="utf-8")
    assert [h for h in details.splitlines() if h in DETAILS] == DETAILS
    for png in ("categories.png", "launches.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text
    # SGLang captures have no workload spec: the gap section says so instead of inventing a model
    assert "records neither the built-in workload nor the served model" in details


def test_kernels_and_step_time_per_capture_match_sql(sglang_report, expected):
    _, text = sglang_report
    summary = table_rows(text, "| capture | steps | step ms (median)")
    launches = table_rows(text, "| capture | mode | graph launches/step")
    for label, exp in expected.items():
        row = row_for(summary, label)
        assert int(row[1]) == exp["steps"]
        assert abs(float(row[2]) - exp["step_ms"]) <= 5e-4 + 1e-9, (label, row[2], exp["step_ms"])
        assert abs(float(row[7]) - exp["kernels_per_step"]) <= 0.05 + 1e-9, (label, row[7], exp["kernels_per_step"])
        launch_row = row_for(launches, label)
        assert launch_row[1] == "graph"
        assert abs(float(launch_row[3]) - exp["kernel_launches_per_step"]) <= 0.05 + 1e-9
        assert abs(float(launch_row[6]) - exp["kernels_per_step"]) <= 0.05 + 1e-9


def test_step_delta_matches_sql(sglang_report, expected):
    _, text = sglang_report
    want = expected["`triton_kernel`"]["step_ms"] - expected["`triton`"]["step_ms"]
    m = re.search(r"\*\*GPU 0\*\*: ([\d.]+) → ([\d.]+) ms/step \(\*\*([+-][\d.]+) ms\*\*", text)
    assert m, "diff headline missing"
    assert abs(float(m.group(3)) - want) <= 5e-4 + 1e-9
    assert abs(float(m.group(1)) - expected["`triton`"]["step_ms"]) <= 5e-4 + 1e-9
    # the explanation states the same change in words, with the right direction
    direction = "slower" if want > 0 else "faster"
    m2 = re.search(rf"`triton_kernel` is {direction} than `triton` by ([\d.]+) ms/step", text)
    assert m2 and abs(float(m2.group(1)) - abs(want)) <= 5e-4 + 1e-9


def test_report_ranks_bottlenecks_from_the_numbers(sglang_report):
    _, text = sglang_report
    section = text.split("## Bottlenecks, ranked", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^(\d+)\. \*\*(.+?)\*\* \(.+?; ([\d.]+) ms/step", section, flags=re.M)
    assert len(items) >= 3
    ms = [float(x[2]) for x in items]
    assert ms == sorted(ms, reverse=True)
    assert [int(x[0]) for x in items] == list(range(1, len(items) + 1))


def test_existing_report_is_not_overwritten_without_force(sglang_report):
    out, text = sglang_report
    before = (out / "report.md").read_bytes()
    result = CliRunner().invoke(cli, ["report", str(TRITON), str(TRITON_KERNEL), "-o", str(out)])
    assert result.exit_code == 2
    assert "exists" in result.output and "--force" in result.output
    assert "Traceback" not in result.output
    assert (out / "report.md").read_bytes() == before


# --- synthetic exports: escaping and the output folder ----------------------------------------------------------------

EVIL = "evil|kernel<img src=x onerror=alert(1)>*bold*_x_`tick`[link](http://e.x)#h"


def make_capture(path: Path, names, duration_ns: int = 5_000, steps: int = 4) -> Path:
    """`steps` NVTX decode steps on one thread, each launching the kernels `names` one after another."""
    b = Builder(path)
    pid, tid = gpid(7), gtid(7)
    t = 1_000_000
    for _ in range(steps):
        step_start = t
        for name in names:
            corr = b.launch(tid, t, t + 1_000)
            b.kernel(pid, corr, t + 2_000, t + 2_000 + duration_ns, name)
            t += duration_ns + 4_000
        b.nvtx(tid, step_start, t, "decode_step")
        t += 20_000
    return b.close()


@pytest.fixture(scope="module")
def evil_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    a = make_capture(d / "a.sqlite", [EVIL, "plain_kernel"])
    b = make_capture(d / "b.sqlite", ["<script>x</script>" + EVIL, "plain_kernel"], duration_ns=7_000)
    return a, b


@pytest.fixture(scope="module")
def evil_report(evil_pair, tmp_path_factory):
    """The report of the two synthetic captures, written with --force over a folder holding a stray chart; and the
    result of the same command without --force."""
    a, b = evil_pair
    out = tmp_path_factory.mktemp("evil") / "r"
    out.mkdir()
    (out / "categories.png").write_bytes(b"not mine")
    args = ["report", str(a), str(b), "-o", str(out), "--samples", "50", "--labels", "base<b>,new*$x$*"]
    blocked = CliRunner().invoke(cli, args)
    stray = (out / "categories.png").read_bytes()
    forced = CliRunner().invoke(cli, args + ["--force"])
    assert forced.exit_code == 0, forced.output
    return out, blocked, stray


CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")  # an inline code span: a run of n backticks .. n


def outside_code(text: str) -> str:
    """The markdown with fenced code blocks and inline code spans taken out: what a renderer reads as markup."""
    prose = re.sub(r"^(`{3,})sh\n.*?\n\1$", "", text, flags=re.S | re.M)
    return CODE_SPAN.sub("", prose)


def test_capture_strings_are_escaped(evil_report):
    out, _, _ = evil_report
    for name in ("report.md", "details.md"):
        text = (out / name).read_text(encoding="utf-8")
        # fenced code blocks (the report's own command line) and code spans (identifiers) show text literally;
        # everything else must be escaped
        prose = outside_code(text)
        assert "`" not in prose  # every fence and code span was closed where it should be
        for raw in ("<img", "<script>", "<b>", "*bold*", "[link](", "`tick`", "*$x$*"):
            assert raw not in prose, raw  # none of the names' markup survives outside code
    text = (out / "report.md").read_text(encoding="utf-8")
    prose = outside_code(text)
    assert "evil" in prose and "&lt;script&gt;" in prose and "kernel&lt;img" in prose  # the name is there, escaped
    assert "`base<b>`" in text and "`new*$x$*`" in text  # the labels, as code
    # a kernel name in a table: code spans split at its `|` (escaped between them), a longer fence around a backtick
    assert "| `evil`\\|``kernel<img src=x onerror=alert(1)>*bold*_x_`tick`[link](http://e.x)#h`` |" in text
    # every table row keeps its column count: the `|` in the kernel name cannot split a cell
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(-+:?\|)+$", lines[i + 1]):
            width = len(re.split(r"(?<!\\)\|", line))
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                assert len(re.split(r"(?<!\\)\|", row)) == width, row


def test_stray_chart_blocks_the_report_until_force(evil_report):
    out, blocked, stray = evil_report
    assert blocked.exit_code == 2 and "categories.png exists" in blocked.output
    assert "Traceback" not in blocked.output
    assert stray == b"not mine"  # untouched without --force
    assert (out / "categories.png").read_bytes()[:4] == b"\x89PNG"  # replaced with --force
    assert (out / "launches.png").read_bytes()[:4] == b"\x89PNG"


def test_labels_must_match_the_captures(evil_pair, tmp_path):
    a, b = evil_pair
    result = CliRunner().invoke(cli, ["report", str(a), str(b), "-o", str(tmp_path / "r"), "--labels", "only-one"])
    assert result.exit_code == 2
    assert "--labels gives 1 label(s) for 2 capture(s)" in result.output


# --- explanations follow the numbers -------------------------------------------------------------------------------

def _diff_device(kernel: float, idle: float, ka=100.0, kb=100.0, ci=None, warnings=()):
    delta = kernel + idle
    return {"devices": [{"device": 0, "step_ms": {"a": 2.0, "b": 2.0 + delta, "delta": delta, "ci95": ci,
                                                  "relative": delta / 2.0},
                         "kernels_per_step": {"a": ka, "b": kb},
                         "components": [
                             {"component": "category:moe.gemm", "a_ms_per_step": 1.0, "b_ms_per_step": 1.0 + kernel,
                              "delta_ms_per_step": kernel, "ci95": None, "noise": False, "from_count_ms": 0.0,
                              "from_duration_ms": kernel, "count_delta_per_step": 0.0, "kernels": {}},
                             {"component": "idle", "a_ms_per_step": 1.0, "b_ms_per_step": 1.0 + idle,
                              "delta_ms_per_step": idle, "ci95": None, "noise": False}]}],
            "a": {"steps": {"source": "graph"}}, "b": {"steps": {"source": "graph"}},
            "warnings": list(warnings), "verdict": ""}


def test_kernel_vs_idle_sentence_follows_the_sign_of_the_step_change():
    from profattr.report.markdown import diff_explanation

    grew = " ".join(diff_explanation(_diff_device(kernel=0.5, idle=-0.2), "A", "B"))
    assert "`B` is slower than `A` by 0.300 ms/step" in grew  # the labels are code spans
    assert "the step grew by 0.300 ms, less than the kernel time" in grew.replace("\\", "")
    shrank = " ".join(diff_explanation(_diff_device(kernel=0.2, idle=-3.0), "A", "B"))
    assert "`B` is faster than `A` by 2.800 ms/step" in shrank
    assert "grew" not in shrank
    assert "gain is in launch/host time, not in kernels" in shrank


def test_wrong_premise_and_noise_are_said_plainly():
    from profattr.report.markdown import diff_explanation

    warning = "GPU 0: the moe kernels are the same in A and B (triton_fused_moe)"
    lines = diff_explanation(_diff_device(kernel=0.001, idle=0.0, ci=[-0.01, 0.02], warnings=[warning]), "A", "B")
    assert lines[0].startswith("**The premise of this comparison is wrong:**")
    assert "within noise" in " ".join(lines)


def test_launch_bound_reason_needs_many_small_gaps():
    from profattr.report.bottlenecks import idle_reason

    stats = {"mode": "eager", "idle_share": 0.8, "idle_ms_per_step": 8.0, "ops_per_step": 340.0,
             "median_gap_us": 17.0, "largest_gap_us": 90.0, "largest_gap_share_of_idle": 0.01,
             "sync_calls_per_step": 0.0, "graph_launches_per_step": 0.0}
    assert "launch-bound" in idle_reason(stats)
    one_gap = dict(stats, largest_gap_us=6000.0, largest_gap_share_of_idle=0.75, sync_calls_per_step=1.0)
    assert "launch-bound" not in idle_reason(one_gap)
    assert "6000 µs" in idle_reason(one_gap)
    assert idle_reason(dict(stats, idle_share=0.05)) is None


def test_a_capture_is_named_by_path_file_name_or_its_replicate_glob():
    from profattr.report.commands import _named_capture

    given = ["caps/a.sqlite", "caps/b-r?.sqlite"]
    assert _named_capture("caps/a.sqlite", given) == ["caps/a.sqlite"]
    assert _named_capture("a.sqlite", given) == ["caps/a.sqlite"]
    assert _named_capture("caps/b-r2.sqlite", given) == ["caps/b-r?.sqlite"]
    assert _named_capture("caps/c.sqlite", given) == []
