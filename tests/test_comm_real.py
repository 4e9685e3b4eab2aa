"""Transfer / wait split of collectives on the real 2-rank capture (`wl-graph-grouped-tp2`, NCCL all-reduce inside
the CUDA graph), against arithmetic written here in SQL:

per rank, steps are its thread's `decode_step` ranges in time order; instance (k, j) is the j-th NCCL kernel (GPU
start order) of step k on each rank; transfer = duration of the kernel that started last; on each rank
wait = max(0, duration - transfer); the slowest rank of a step is the one whose late arrivals caused the most
wait. The diff then carries `comm_wait` as its own component and still closes.
"""
from __future__ import annotations

import sqlite3

import pytest
from click.testing import CliRunner

from profattr.attribute.budget import compute_budget
from profattr.attribute.diff import compute_diff, load_side
from profattr.cli import cli

REL = 1e-9  # integer arithmetic on both sides: exact up to float rounding

SPLIT_SQL = """
WITH steps AS (
  SELECT n.start AS ss, n."end" AS se, n.globalTid AS stid,
         row_number() OVER (PARTITION BY n.globalTid ORDER BY n.start) AS k
  FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
  WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) = 'decode_step'
),
coll AS (
  SELECT k.deviceId AS dev, k.start AS s, k."end" - k.start AS dur, st.k AS k,
         row_number() OVER (PARTITION BY k.deviceId, st.k ORDER BY k.start) AS j
  FROM CUPTI_ACTIVITY_KIND_KERNEL k
  JOIN StringIds sn ON sn.id = k.shortName
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid & -16777216) = k.globalPid
  JOIN steps st ON st.stid = r.globalTid AND r.start BETWEEN st.ss AND st.se
  WHERE sn.value LIKE 'ncclDevKernel%'
),
last AS (
  SELECT c.k, c.j, c.dev AS last_dev, c.dur AS transfer
  FROM coll c
  WHERE c.s = (SELECT max(s) FROM coll x WHERE x.k = c.k AND x.j = c.j)
),
split AS (
  SELECT c.dev, c.k, c.j, c.dur, l.last_dev, max(c.dur - l.transfer, 0) AS wait
  FROM coll c JOIN last l ON l.k = c.k AND l.j = c.j
)
"""


def sql_split(path) -> tuple:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    per_dev = conn.execute(SPLIT_SQL + """
        SELECT dev, sum(dur), sum(wait), count(DISTINCT k), count(*) FROM split GROUP BY dev ORDER BY dev""").fetchall()
    # the wait each rank caused per step: others' waits in the instances it arrived last (ties: more last
    # arrivals, then the lower device id)
    caused = conn.execute(SPLIT_SQL + """
        SELECT k, last_dev FROM split GROUP BY k, last_dev
        ORDER BY k, sum(wait) DESC, count(*) DESC, last_dev""").fetchall()
    conn.close()
    slowest = {}
    for k, dev in caused:
        slowest.setdefault(k, dev)  # first row per step
    return per_dev, [slowest[k] for k in sorted(slowest)]


def close(a, b, rel=REL):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


@pytest.fixture(scope="module")
def tp2(export_example):
    path = export_example("wl-graph-grouped-tp2")
    return path, compute_budget(path, keep_attribution=True)


def test_split_matches_sql(tp2):
    path, budget = tp2
    data = budget.to_dict()
    per_dev, slowest = sql_split(path)
    devices = {d["device"]: d for d in data["devices"]}
    assert [row[0] for row in per_dev] == [0, 1]
    for dev, coll_ns, wait_ns, steps, count in per_dev:
        comm = devices[dev]["comm"]
        n = devices[dev]["steps"]
        assert steps == n == 20
        assert close(comm["collective_ms_per_step"], coll_ns / n / 1e6)
        assert close(comm["wait_ms_per_step"], wait_ns / n / 1e6)
        assert close(comm["transfer_ms_per_step"], (coll_ns - wait_ns) / n / 1e6)
        assert comm["instances_per_step"] == count / n == 16  # 2 all-reduces per layer x 8 layers
        assert comm["unmatched_per_step"] == 0
        # the collective time is the comm category of the budget
        cat = next(c for c in devices[dev]["categories"] if c["category"] == "comm.allreduce")
        assert close(cat["ms_per_step"], comm["collective_ms_per_step"])
    assert data["comm"]["slowest_rank_per_step"] == slowest
    for dev in (0, 1):
        share = sum(1 for s in slowest if s == dev) / len(slowest)
        assert close(devices[dev]["comm"]["slowest_rank_share"], share)


def test_measured_split(tp2):
    """What this capture shows: rank 0 spends most of its all-reduce time waiting for rank 1."""
    devices = {d["device"]: d["comm"] for d in tp2[1].to_dict()["devices"]}
    assert devices[0]["wait_ms_per_step"] > 0.5 * devices[0]["collective_ms_per_step"]
    assert devices[1]["wait_ms_per_step"] < 0.1 * devices[1]["collective_ms_per_step"]
    # both ranks move the same data: their transfer parts agree
    assert close(devices[0]["transfer_ms_per_step"], devices[1]["transfer_ms_per_step"], rel=0.05)


def test_diff_comm_wait_component_closes(export_example):
    eager = load_side(export_example("wl-eager-grouped"))
    tp2 = load_side(export_example("wl-graph-grouped-tp2"))
    result = compute_diff(eager, tp2, samples=200)
    d = result["devices"][0]
    comps = {c["component"]: c for c in d["components"]}
    budget0 = tp2.budget["devices"][0]
    assert close(comps["comm_wait"]["b_ms_per_step"], budget0["comm"]["wait_ms_per_step"])
    assert close(comps["category:comm.allreduce"]["b_ms_per_step"], budget0["comm"]["transfer_ms_per_step"])
    assert abs(d["closure_ms"]) < 1e-9
    assert comps["comm_wait"]["ci95"] is not None
    # the comm category's parts (families added / removed, count and duration effects of shared ones) describe its
    # whole kernel time; its wait went to comm_wait, so with that part they close on the transfer component
    c = comps["category:comm.allreduce"]
    parts = ("added_ms", "removed_ms", "from_count_ms", "from_duration_ms", "moved_to_comm_wait_ms")
    assert close(sum(c[k] for k in parts), c["delta_ms_per_step"], rel=1e-9)


def test_budget_json_side_keeps_split(tp2, tmp_path):
    path, budget = tp2
    out = tmp_path / "tp2.json"
    out.write_text(budget.to_json())
    side = load_side(out)
    result = compute_diff(side, side, samples=0)
    assert all(abs(d["closure_ms"]) < 1e-9 for d in result["devices"])
    assert {c["component"] for c in result["devices"][0]["components"]} >= {"comm_wait", "category:comm.allreduce"}


def test_cli_renders_comm(tp2):
    path = str(tp2[0])
    runner = CliRunner()
    table = runner.invoke(cli, ["budget", path])
    assert table.exit_code == 0, table.output
    assert table.output.count("wait for slower ranks") == 2
    md = runner.invoke(cli, ["budget", path, "--format", "markdown"])
    assert md.exit_code == 0 and "wait for slower ranks" in md.output


def test_single_gpu_has_no_comm(export_example):
    data = compute_budget(export_example("wl-eager-grouped")).to_dict()
    assert "comm" not in data and "comm" not in data["devices"][0]


def test_caused_wait_and_the_report_tp_section(tp2, tmp_path):
    """With two ranks, the wait a rank caused is the other rank's wait (SQL above); the report names that rank."""
    path, budget = tp2
    per_dev, _ = sql_split(path)
    wait = {dev: wait_ns / steps / 1e6 for dev, _c, wait_ns, steps, _n in per_dev}
    devices = {d["device"]: d["comm"] for d in budget.to_dict()["devices"]}
    assert close(devices[1]["caused_wait_ms_per_step"], wait[0]) and close(devices[0]["caused_wait_ms_per_step"],
                                                                           wait[1])
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(path), "-o", str(out), "--samples", "50"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    tp = text.split("## Tensor parallelism\n", 1)[1].split("\n## ", 1)[0]
    waited_for = max(wait, key=lambda d: wait[1 - d])  # the rank whose partner waits more
    assert f"GPU {waited_for} is the rank the others wait for: they spend {wait[1 - waited_for]:.3f} ms/step" in tp
