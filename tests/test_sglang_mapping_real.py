"""Real SGLang decode under CUDA graphs, attributed per layer through an eager capture of the same server
(`--disable-cuda-graph --enable-layerwise-nvtx-marker`) given as --mapping. Expected numbers from SQL."""
from __future__ import annotations

import re
import sqlite3
from collections import Counter

import pytest

from conftest import SGLANG_EAGER_CAPTURES
from independent import expected_nvtx
from profattr.attribute.budget import compute_budget

LAYER_RANGE = re.compile(r"'Module': 'model\.model\.layers\.(\d+)'")


def eager_step_name(path) -> str:
    return compute_budget(path).steps_source.split(":", 1)[1]


@pytest.mark.parametrize("name", SGLANG_EAGER_CAPTURES)
def test_eager_sglang_budget_matches_sql(name, export_example):
    path = export_example(name)
    budget = compute_budget(path).to_dict()
    step = budget["steps"]["source"]
    assert step.startswith("nvtx:{'Module': 'model.model'")  # SGLang's own per-forward module range
    exp = expected_nvtx(path, step.split(":", 1)[1])[0]
    d = budget["devices"][0]
    assert d["steps"] == exp["steps"]
    assert d["step_ms"] == pytest.approx(exp["step_ms"], rel=0.005)
    assert d["kernels_per_step"] == pytest.approx(exp["kernels_per_step"], rel=0.005)


def sql_kernels_per_layer(path, step_text: str) -> Counter:
    """Kernels per step in each layer of the eager capture: launch inside a `model.model.layers.N` module range
    (the layer's own range, not its sub-modules') that lies inside a step range."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute("""
        WITH r AS (SELECT n.start, n."end", n.globalTid AS tid, COALESCE(s.value, n.text) AS text
                   FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60)),
             steps AS (SELECT * FROM r WHERE text = ?),
             layers AS (SELECT r.* FROM r JOIN steps ON r.tid = steps.tid AND r.start >= steps.start
                        AND r."end" <= steps."end" WHERE r.text LIKE '%''Module'': ''model.model.layers.%')
        SELECT layers.text, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME c ON c.correlationId = k.correlationId
             AND (c.globalTid & -16777216) = k.globalPid
        JOIN layers ON layers.tid = c.globalTid AND c.start BETWEEN layers.start AND layers."end"
        GROUP BY layers.text""", (step_text,)).fetchall()
    n_steps = conn.execute("""SELECT count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                              WHERE n.eventType IN (59, 60) AND COALESCE(s.value, n.text) = ?""",
                           (step_text,)).fetchone()[0]
    conn.close()
    out: Counter = Counter()
    for text, count in rows:
        m = LAYER_RANGE.search(text)
        if m:  # the layer's own range; its sub-modules' ranges name longer paths
            out[int(m.group(1))] += count
    return Counter({layer: c / n_steps for layer, c in out.items()})


@pytest.mark.parametrize("backend", ["triton", "triton_kernel"])
def test_graph_capture_gets_layers_from_the_eager_twin(backend, export_example):
    graph = export_example(f"sglang-{backend}-bs1")
    eager = export_example(f"sglang-{backend}-bs1-eager")
    budget = compute_budget(graph, mapping=eager, by="layer").to_dict()
    placement = budget["nvtx_placement"]
    graph_ops = placement["mapping"] + placement["unplaced"]
    assert placement["mapping"] >= 0.95 * graph_ops, placement
    expected = sql_kernels_per_layer(eager, eager_step_name(eager))
    assert sorted(expected) == list(range(8))  # the tiny Qwen3-MoE has 8 layers
    got = {row["layer"]: row["count_per_step"] for row in budget["devices"][0]["layers"] if row["layer"] is not None}
    for layer, count in expected.items():
        assert got[layer] == pytest.approx(count, abs=0.5), (layer, got, expected)
    # with the NVTX context lent by the eager twin, the router GEMM inside `mlp.gate` is MoE routing
    cats = {c["category"]: c for c in budget["devices"][0]["categories"]}
    assert cats["moe.routing"]["count_per_step"] >= 8
