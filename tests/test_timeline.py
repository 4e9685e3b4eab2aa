"""`profattr timeline` and the budget's step-to-step distributions, on real GLM-5 decode captures, checked against
SQL on the export: the step drawn by default is the median one, and the distributions' median / p90 / max are numpy
over per-step sums written here in SQL."""
from __future__ import annotations

import json
import re
import struct
from collections import defaultdict

import numpy as np
import pytest
from click.testing import CliRunner

import badinput
from conftest import EXAMPLES
from independent import sql
from profattr.cli import cli

TRITON = EXAMPLES / "glm5" / "glm-triton-bs1-r1.sqlite"
CUTLASS = EXAMPLES / "glm5" / "glm-cutlass-bs1-r1.sqlite"

# GPU ops launched inside SGLang's decode ranges, the ranges numbered in start order from 0
STEP_OPS = """
WITH ops AS (
  SELECT k.start AS s, k."end" AS e, sn.value AS name, k.globalPid AS pid, k.correlationId AS corr
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds sn ON sn.id = k.shortName
  UNION ALL
  SELECT start, "end", NULL, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY
  UNION ALL
  SELECT start, "end", NULL, globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET
),
steps AS (
  SELECT n.start AS ss, n."end" AS se, n.globalTid AS stid, row_number() OVER (ORDER BY n.start) - 1 AS step
  FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
  WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) LIKE 'step[DECODE bs=%]'
),
assigned AS (
  SELECT ops.*, steps.step FROM ops
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = ops.corr AND (r.globalTid & -16777216) = ops.pid
  JOIN steps ON steps.stid = r.globalTid AND r.start BETWEEN steps.ss AND steps.se
)
"""


def sql_spans(path) -> dict:
    """step -> (first start, span ns) of its GPU work."""
    rows = sql(path, STEP_OPS + "SELECT step, min(s), max(e) - min(s) FROM assigned GROUP BY step")
    return {step: (start, span) for step, start, span in rows}


def median_step(spans: dict) -> int:
    """The step whose span is the median: the lower middle of the steps sorted by span (then start)."""
    ordered = sorted(spans, key=lambda k: (spans[k][1], spans[k][0]))
    return ordered[(len(ordered) - 1) // 2]


def png_size(path) -> tuple:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def drawn(output: str) -> list:
    return [int(m) for m in re.findall(r"GPU \d+: step (\d+) ", output)]


def test_timeline_draws_the_median_step(tmp_path):
    out = tmp_path / "step.png"
    result = CliRunner().invoke(cli, ["timeline", str(TRITON), "-o", str(out)])
    assert result.exit_code == 0, result.output
    spans = sql_spans(TRITON)
    assert drawn(result.output) == [median_step(spans)]
    assert f"{spans[median_step(spans)][1] / 1e6:.3f} ms span" in result.output
    width, height = png_size(out)
    assert 800 <= width <= 4000 and 300 <= height <= 4000


def test_timeline_of_a_named_step(tmp_path):
    out = tmp_path / "step.png"
    result = CliRunner().invoke(cli, ["timeline", str(TRITON), "-o", str(out), "--step", "3"])
    assert result.exit_code == 0, result.output
    assert drawn(result.output) == [3]
    assert f"{sql_spans(TRITON)[3][1] / 1e6:.3f} ms span" in result.output


def test_two_captures_one_above_the_other(tmp_path):
    out = tmp_path / "two.png"
    one = tmp_path / "one.png"
    result = CliRunner().invoke(cli, ["timeline", str(TRITON), str(CUTLASS), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert drawn(result.output) == [median_step(sql_spans(TRITON)), median_step(sql_spans(CUTLASS))]
    assert CliRunner().invoke(cli, ["timeline", str(TRITON), "-o", str(one)]).exit_code == 0
    assert png_size(out)[1] > 1.5 * png_size(one)[1]  # two rows of lanes


def test_report_has_the_timeline_and_the_spread(tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(TRITON), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "![timeline of the median step](timeline.png)" in text and "## Step-to-step spread" in text
    assert f"GPU 0: step {median_step(sql_spans(TRITON))} " in text
    for name in ("timeline.png", "distributions.png"):
        png_size(out / name)


# --- distributions -------------------------------------------------------------------------------------------------

def _spread(values) -> tuple:
    v = np.asarray(values, dtype=np.float64)
    return np.median(v) / 1e6, np.percentile(v, 90) / 1e6, v.max() / 1e6


@pytest.fixture(scope="module")
def budget_json(tmp_path_factory):
    result = CliRunner().invoke(cli, ["budget", str(TRITON), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_step_distribution_is_numpy_over_sql_spans(budget_json):
    spans = sql_spans(TRITON)
    dist = budget_json["devices"][0]["distributions"]
    assert dist["steps"] == len(spans)
    med, p90, mx = _spread([spans[k][1] for k in sorted(spans)])
    assert (dist["step"]["median_ms"], dist["step"]["p90_ms"], dist["step"]["max_ms"]) == pytest.approx(
        (med, p90, mx), abs=1e-9)
    # the slow first step of the window is the outlier and the warm-up step
    slowest = max(spans, key=lambda k: spans[k][1])
    assert slowest in dist["step"]["outlier_steps"] and dist["step"]["warmup_steps"] == [min(spans)]


def exclusive_per_step(ops) -> dict:
    """{step: {category: exclusive ns}} by the definition, swept here in plain Python with exact fractions: cut the
    step's time at every op start and end; each slice is shared equally among the categories running in it."""
    from fractions import Fraction

    by_step = defaultdict(list)
    for step, s, e, category in ops:
        by_step[step].append((s, e, category))
    out = {}
    for step, items in by_step.items():
        cuts = sorted({t for s, e, _ in items for t in (s, e)})
        share: dict = defaultdict(Fraction)
        for a, b in zip(cuts, cuts[1:]):
            running = {c for s, e, c in items if s <= a and e >= b}
            for c in running:
                share[c] += Fraction(b - a, len(running))
        out[step] = share
    return out


def test_category_distributions_are_numpy_over_sql_exclusive_time(budget_json, tmp_path):
    """Per category: one value per step, its exclusive time in that step swept from the SQL ops (0 where it did
    not run); which category an op belongs to is the taxonomy's word, read from the Perfetto export at the op's
    (stream, start); the times are SQL's."""
    trace = tmp_path / "t.json"
    assert CliRunner().invoke(cli, ["export", str(TRITON), "-o", str(trace)]).exit_code == 0
    events = json.loads(trace.read_text())["traceEvents"]
    streams = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
               and e["args"]["name"].startswith("stream ")}
    category_of = {(e["tid"], round(float(e["ts"]) * 1000)): e["args"]["category"] for e in events
                   if e["ph"] == "X" and e["pid"] == 0 and e["tid"] in streams}
    rows = sql(TRITON, STEP_OPS.replace("SELECT k.start AS s,", "SELECT k.streamId AS stream, k.start AS s,")
               .replace('SELECT start, "end", NULL,', 'SELECT streamId, start, "end", NULL,')  # memcpy, memset
               + "SELECT step, s, e, stream FROM assigned")
    assert len(rows) == len(category_of)
    exclusive = exclusive_per_step([(step, s, e, category_of[(stream, s)]) for step, s, e, stream in rows])
    steps = sorted(sql_spans(TRITON))
    checked = 0
    for row in budget_json["devices"][0]["distributions"]["categories"]:
        values = [float(exclusive[k].get(row["category"], 0)) for k in steps]
        # integer ns per step (largest remainder): each within 1 ns of the exact share
        assert (row["median_ms"], row["p90_ms"], row["max_ms"]) == pytest.approx(_spread(values), abs=2e-6), row
        checked += 1
    assert checked >= 10


def test_kernel_distributions_with_the_attribution():
    """The largest kernels' spread (where every op is read at once): numpy over SQL per-step sums by short name."""
    from profattr.attribute.budget import compute_budget

    budget = compute_budget(TRITON, keep_attribution=True)
    kernels = budget.devices[0]["distributions"]["kernels"]
    assert len(kernels) == 5
    steps = sorted(sql_spans(TRITON))
    for row in kernels:
        rows = sql(TRITON, STEP_OPS + "SELECT step, sum(e - s) FROM assigned WHERE name = ? GROUP BY step",
                   (row["name"],))
        per = dict.fromkeys(steps, 0)
        per.update(dict(rows))
        assert (row["median_ms"], row["p90_ms"], row["max_ms"]) == pytest.approx(
            _spread([per[k] for k in steps]), abs=1e-9), row["name"]


def test_outlier_rule_on_edge_series():
    from profattr.attribute.distributions import spread

    steps = np.arange(6)
    flat = spread(np.full(6, 1000), steps)
    assert flat["outlier_steps"] == [] and flat["median_ms"] == flat["max_ms"] == 0.001
    one = spread(np.array([100, 101, 99, 100, 400, 100]), steps)
    assert one["outlier_steps"] == [4] and one["outliers"] == 1
    assert spread(np.zeros(0), np.zeros(0, dtype=np.int64))["outliers"] == 0


# --- bad input -----------------------------------------------------------------------------------------------------

def test_unknown_step(tmp_path):
    proc = badinput.cli("timeline", TRITON, "-o", tmp_path / "t.png", "--step", "99")
    badinput.assert_error(proc, "--step 99", "0 to 18")
    badinput.assert_error(badinput.cli("timeline", TRITON, "-o", tmp_path / "t.png", "--step", "middle"), "--step")
    assert not (tmp_path / "t.png").exists()


def test_timeline_output_exists_without_force(tmp_path):
    out = tmp_path / "t.png"
    out.write_bytes(b"keep")
    badinput.assert_error(badinput.cli("timeline", TRITON, "-o", out), "exists", "--force")
    assert out.read_bytes() == b"keep"


def test_timeline_of_a_capture_without_gpu_work(tmp_path):
    empty = badinput.sql(badinput.copy_export(tmp_path), "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL",
                         "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    badinput.assert_error(badinput.cli("timeline", empty, "-o", tmp_path / "t.png"), "no GPU work")
    assert not (tmp_path / "t.png").exists()
