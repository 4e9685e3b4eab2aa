"""What per-node graph tracing costs a CUDA-graph launch, set against a twin traced at graph level: real GLM-5-shaped
NVFP4 captures of one configuration on the H200, one per tracing mode. Expected figures come from SQL and numpy
written here."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from independent import sql
from profattr.attribute.graph_launch import costs_of, tracing_cost
from profattr.cli import cli

NODE = "glm5-nvfp4/glm-nvfp4-bs1-r2"
GRAPH = "glm5-nvfp4/glm-nvfp4-graphtrace-bs1"


def by_hand(path) -> dict:
    """Median call time, call-to-GPU time and GPU idle before each launch's first GPU work, from the export's rows.
    A launch's GPU work is that of its process with its correlationId (each process numbers its own calls)."""
    tables = {r[0] for r in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    launches = sql(path, """SELECT r.start, r."end", r.correlationId, r.globalTid >> 24
                            FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                            JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%'""")
    first, device = {}, {}
    kinds = ["CUPTI_ACTIVITY_KIND_KERNEL"] + (["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"]
                                              if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables else [])
    intervals = {}
    for t in kinds + [x for x in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if x in tables]:
        for start, end, corr, process, dev in sql(path, f'SELECT start, "end", correlationId, globalPid >> 24, '
                                                        f'deviceId FROM {t}'):
            intervals.setdefault(dev, []).append((start, end))
            if t in kinds:
                key = (process, corr)
                first[key] = min(first.get(key, start), start)
                device[key] = min(device.get(key, dev), dev)
    waits = []
    for _s, _e, corr, process in launches:
        g, on = first[(process, corr)], intervals[device[(process, corr)]]
        if any(s < g < e for s, e in on):
            waits.append(0.0)
        else:
            waits.append(g - max(e for s, e in on if e <= g))
    return {"call_us": np.median([(e - s) / 1e3 for s, e, _, _ in launches]),
            "call_to_gpu_us": np.median([(first[(p, c)] - s) / 1e3 for s, _e, c, p in launches]),
            "wait_us": np.median(waits) / 1e3, "launches": len(launches)}


# TWO_RANKS: two processes (tensor parallel 2), whose graph launches share correlationIds with the other rank's kernels
TWO_RANKS = "wl-graph-grouped-tp2"


@pytest.mark.parametrize("name, tracing", [(NODE, "node"), (GRAPH, "graph"), (TWO_RANKS, "node")])
def test_launch_costs_match_the_rows(name, tracing, export_example):
    path = export_example(name)
    want, got = by_hand(path), costs_of(path)
    assert got["tracing"] == tracing and got["launches"] == want["launches"]
    for key in ("call_us", "call_to_gpu_us", "wait_us"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key


@pytest.mark.parametrize("window_ops", [None, "97"])
def test_launch_costs_from_the_op_store_and_from_sql_match_the_rows(window_ops, export_example, monkeypatch,
                                                                    tmp_path):
    """The per-node capture's launch costs read from its op store (a window of rows at a time: 97 rows cut the
    capture into about 60 windows) and from SQL alone: both what the rows say."""
    from profattr.attribute.graph_launch import launch_costs
    from profattr.trace.cache import StoreSource, store_or_export
    from profattr.trace.source import open_trace

    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    if window_ops:
        monkeypatch.setenv("PROFATTR_WINDOW_OPS", window_ops)
    path = export_example(NODE)
    want = by_hand(path)
    with open_trace(path) as export:
        from_sql = launch_costs(export)
        store = store_or_export(export)
        assert isinstance(store, StoreSource)
        if window_ops:
            assert len(store.store.bounds()) > 50
        from_store = launch_costs(store)
        store.close()
    for got in (from_sql, from_store):
        assert got["tracing"] == "node" and got["launches"] == want["launches"]
        for key in ("call_us", "call_to_gpu_us", "wait_us"):
            assert got[key] == pytest.approx(want[key], rel=1e-9), key
    assert from_store == from_sql


def test_per_node_tracing_inflates_the_launch_and_most_of_the_wait(export_example):
    node, graph = by_hand(export_example(NODE)), by_hand(export_example(GRAPH))
    assert node["call_us"] > 3 * graph["call_us"]  # the rows: about 400 µs against 80 µs per launch
    cost = tracing_cost(costs_of(export_example(NODE)), costs_of(export_example(GRAPH)))
    assert cost["call_us_added"] == pytest.approx(node["call_us"] - graph["call_us"], rel=1e-9)
    assert cost["profiler_share_of_wait"] == pytest.approx(1 - graph["wait_us"] / node["wait_us"], rel=1e-9)
    assert cost["confirmed"] == bool(graph["wait_us"] >= 0.5 * node["wait_us"])


def test_check_twin_and_report_graph_twin_say_what_tracing_costs(export_example, tmp_path):
    node, graph = export_example(NODE), export_example(GRAPH)
    result = CliRunner().invoke(cli, ["check", str(node), "--twin", str(graph), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    f = next(x for x in json.loads(result.output)["findings"] if x["check"] == "graph_tracing")
    assert f["status"] == "warn" and "per-node graph tracing adds" in f["message"]
    out = tmp_path / "r"
    result = CliRunner().invoke(cli, ["report", str(node), "-o", str(out), "--graph-twin", f"{node.name}={graph}",
                                      "--samples", "200"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "per-node graph tracing adds" in text
    bad = CliRunner().invoke(cli, ["report", str(node), "-o", str(tmp_path / "r2"), "--graph-twin",
                                   f"{node.name}={node}"])
    assert bad.exit_code == 2 and "traced at graph level" in bad.output
