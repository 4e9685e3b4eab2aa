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
    """Median call time, call-to-GPU time and GPU idle before each launch's first GPU work, from the export's rows."""
    tables = {r[0] for r in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    launches = sql(path, """SELECT r.start, r."end", r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                            JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%'""")
    first = {}
    kinds = ["CUPTI_ACTIVITY_KIND_KERNEL"] + (["CUPTI_ACTIVITY_KIND_GRAPH_TRACE"]
                                              if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables else [])
    intervals = []
    for t in kinds + [x for x in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if x in tables]:
        for start, end, corr in sql(path, f'SELECT start, "end", correlationId FROM {t}'):
            intervals.append((start, end))
            if t in kinds:
                first[corr] = min(first.get(corr, start), start)
    waits = []
    for _s, _e, corr in launches:
        g = first[corr]
        if any(s < g < e for s, e in intervals):
            waits.append(0.0)
        else:
            waits.append(g - max(e for s, e in intervals if e <= g))
    return {"call_us": np.median([(e - s) / 1e3 for s, e, _ in launches]),
            "call_to_gpu_us": np.median([(first[c] - s) / 1e3 for s, _e, c in launches]),
            "wait_us": np.median(waits) / 1e3, "launches": len(launches)}


@pytest.mark.parametrize("name, tracing", [(NODE, "node"), (GRAPH, "graph")])
def test_launch_costs_match_the_rows(name, tracing, export_example):
    path = export_example(name)
    want, got = by_hand(path), costs_of(path)
    assert got["tracing"] == tracing and got["launches"] == want["launches"]
    for key in ("call_us", "call_to_gpu_us", "wait_us"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key


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
