"""Expected budget numbers computed independently of profattr: plain SQL range joins on the export.

profattr assigns GPU work to steps with sorted-array searches in numpy; here the same definitions are written as
SQL joins (the launch call's start inside the step's interval on the same thread), so an error in either shows up
as a mismatch.
"""
from __future__ import annotations

import sqlite3
import statistics
from collections import defaultdict

# GPU ops (kernels, memcpys, memsets) with their launch call's thread and start.
OPS_CTE = """
ops AS (
  SELECT k.start AS s, k."end" AS e, k.deviceId AS dev, 'K' AS kind, sn.value AS name, dn.value AS demangled,
         r.globalTid AS tid, r.start AS api
  FROM CUPTI_ACTIVITY_KIND_KERNEL k
  JOIN StringIds sn ON sn.id = k.shortName
  JOIN StringIds dn ON dn.id = k.demangledName
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = k.correlationId AND (r.globalTid & -16777216) = k.globalPid
  {memops}
)"""

MEMOPS = {
    "CUPTI_ACTIVITY_KIND_MEMCPY": """
  UNION ALL
  SELECT m.start, m."end", m.deviceId, 'M', 'memcpy', 'memcpy', r.globalTid, r.start
  FROM CUPTI_ACTIVITY_KIND_MEMCPY m
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = m.correlationId AND (r.globalTid & -16777216) = m.globalPid""",
    "CUPTI_ACTIVITY_KIND_MEMSET": """
  UNION ALL
  SELECT m.start, m."end", m.deviceId, 'M', 'memset', 'memset', r.globalTid, r.start
  FROM CUPTI_ACTIVITY_KIND_MEMSET m
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = m.correlationId AND (r.globalTid & -16777216) = m.globalPid""",
}

NVTX_STEPS_CTE = """
steps AS (
  SELECT n.start AS ss, n."end" AS se, n.globalTid AS stid,
         row_number() OVER (ORDER BY n.globalTid, n.start) AS step
  FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
  WHERE n.eventType IN (59, 60) AND COALESCE(t.value, n.text) = :name AND n.endGlobalTid IS NULL
)"""

# graph steps: from one cudaGraphLaunch to the next one on the same thread
GRAPH_STEPS_CTE = """
launches AS (
  SELECT r.start AS ss, r.globalTid AS stid,
         LEAD(r.start) OVER (PARTITION BY r.globalTid ORDER BY r.start) AS next_start
  FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
  WHERE s.value LIKE 'cudaGraphLaunch%'
),
steps AS (
  SELECT ss, COALESCE(next_start - 1, ss + :last_len - 1) AS se, stid,
         row_number() OVER (ORDER BY stid, ss) AS step
  FROM launches
)"""


def _connect(path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _tables(conn) -> set:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def expected_budget(path, step_cte: str, params: dict) -> dict:
    """Per device: median step span (ms), kernels per step, and (ms/step, count/step) per kernel short name and
    per (short, demangled) pair."""
    conn = _connect(path)
    tables = _tables(conn)
    memops = "".join(sql for t, sql in MEMOPS.items() if t in tables)
    sql = ("WITH " + OPS_CTE.format(memops=memops) + "," + step_cte + """,
    assigned AS (
      SELECT ops.*, steps.step FROM ops JOIN steps
        ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss AND steps.se
    )""")
    spans = conn.execute(sql + """
        SELECT dev, step, min(s), max(e), sum(kind = 'K') FROM assigned GROUP BY dev, step""", params).fetchall()
    per_kernel = conn.execute(sql + """
        SELECT dev, name, sum(e - s), count(*) FROM assigned WHERE kind = 'K' GROUP BY dev, name""",
                              params).fetchall()
    per_demangled = conn.execute(sql + """
        SELECT dev, name, demangled, sum(e - s), count(*) FROM assigned WHERE kind = 'K'
        GROUP BY dev, name, demangled""", params).fetchall()
    conn.close()
    out: dict = defaultdict(lambda: {"spans_ns": [], "kernels": 0, "per_kernel": {}})
    for dev, _step, s, e, nk in spans:
        out[dev]["spans_ns"].append(e - s)
        out[dev]["kernels"] += nk
    result = {}
    for dev, d in out.items():
        n = len(d["spans_ns"])
        result[dev] = {"steps": n, "step_ms": statistics.median(d["spans_ns"]) / 1e6,
                       "mean_step_ms": statistics.fmean(d["spans_ns"]) / 1e6,
                       "kernels_per_step": d["kernels"] / n, "per_kernel": {}, "per_demangled": {}}
    for dev, name, ns, count in per_kernel:
        n = result[dev]["steps"]
        result[dev]["per_kernel"][name] = (ns / n / 1e6, count / n)
    for dev, name, demangled, ns, count in per_demangled:
        n = result[dev]["steps"]
        result[dev]["per_demangled"][(name, demangled)] = (ns / n / 1e6, count / n)
    return result


NVTX_LIKE_STEPS_CTE = NVTX_STEPS_CTE.replace("= :name", "LIKE :pattern")


def expected_nvtx(path, name: str) -> dict:
    return expected_budget(path, NVTX_STEPS_CTE, {"name": name})


def expected_nvtx_like(path, pattern: str) -> dict:
    """As expected_nvtx, for every range whose text matches the SQL LIKE pattern (e.g. 'step[DECODE bs=%]')."""
    return expected_budget(path, NVTX_LIKE_STEPS_CTE, {"pattern": pattern})


def expected_graph(path) -> dict:
    conn = _connect(path)
    rows = conn.execute("""
        SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE s.value LIKE 'cudaGraphLaunch%' ORDER BY r.globalTid, r.start""").fetchall()
    conn.close()
    gaps = [b[1] - a[1] for a, b in zip(rows, rows[1:]) if a[0] == b[0]]
    return expected_budget(path, GRAPH_STEPS_CTE, {"last_len": int(statistics.median(gaps))})


def sql(path, query: str, params=()) -> list:
    """Rows of `query` on the export at `path`, opened read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()
