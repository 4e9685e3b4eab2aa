"""The --mapping fallback on small synthetic captures (tests/synth.py), for what real captures do not show: kernel
names that disagree between the graph capture and its eager twin, an extra kernel, and bad mapping input.

Target: a graph replayed twice (one cudaGraphLaunch per `decode_step`), whose nodes were created before the
profiled window (no NVTX around their creation). Mapping: the same two steps launched eagerly inside
`model.layers.0` / `model.layers.1` ranges. Expected numbers follow from the layout below.
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from profattr.attribute.budget import compute_budget
from profattr.cli import cli
from profattr.errors import ProfattrError
from synth import Builder, gpid, gtid

PID = 7
TID = gtid(PID)
STEP_NS = 10_000
KERNELS = ["attn_kernel", "gemm_kernel", "norm_kernel", "gemm_kernel"]  # layer 0: first two; layer 1: last two
LAYER_OF = [0, 0, 1, 1]
DUR = [40, 30, 20, 10]


def make_graph_capture(path, names_per_step):
    """Two steps; step s replays `names_per_step[s]` from one cudaGraphLaunch."""
    b = Builder(path)
    node = 1000
    for s, names in enumerate(names_per_step):
        base = s * STEP_NS
        b.nvtx(TID, base, base + 5000, "decode_step")
        corr = b.launch(TID, base + 100, base + 110, "cudaGraphLaunch_v10000")
        for i, name in enumerate(names):
            # exec node cloned from a capture-time node created long before the window (no NVTX there)
            node += 1
            b.graph_node(TID, -50_000 + node, node + 500_000)
            b.graph_node(TID, -40_000 + node, node, original=node + 500_000)
            start = base + 200 + i * 100
            b.kernel(gpid(PID), corr, start, start + DUR[i % len(DUR)], name, graph_node=node)
    return b.close()


def make_eager_capture(path, steps=2, nvtx=True):
    b = Builder(path)
    for s in range(steps):
        base = s * STEP_NS
        b.nvtx(TID, base, base + 5000, "decode_step")
        if nvtx:
            for layer in (0, 1):
                b.nvtx(TID, base + 150 + layer * 200, base + 340 + layer * 200, f"model.layers.{layer}")
                # a sub-module range that ends before the layer's second launch
                b.nvtx(TID, base + 160 + layer * 200, base + 220 + layer * 200, f"model.layers.{layer}.attn")
        for i, name in enumerate(KERNELS):
            corr = b.launch(TID, base + 200 + i * 100, base + 210 + i * 100)
            b.kernel(gpid(PID), corr, base + 300 + i * 100, base + 300 + i * 100 + DUR[i], name)
    return b.close()


def layers_of(budget) -> dict:
    return {r["layer"]: r["count_per_step"] for r in budget.to_dict()["devices"][0]["layers"]}


@pytest.fixture
def eager(tmp_path):
    return make_eager_capture(tmp_path / "eager.sqlite")


def test_eager_layers_read_at_launch(eager):
    b = compute_budget(eager, by="layer")
    assert layers_of(b) == {0: 2.0, 1: 2.0}
    rows = b.to_dict()["devices"][0]["layers"]
    assert rows[0]["ms_per_step"] == pytest.approx((DUR[0] + DUR[1]) / 1e6)


def test_graph_without_mapping_is_unplaced_and_says_so(tmp_path):
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, KERNELS])
    data = compute_budget(path, by="layer").to_dict()
    assert data["nvtx_placement"]["unplaced"] == 8
    assert "--mapping" in data["nvtx_placement"]["hint"]
    assert [r["layer"] for r in data["devices"][0]["layers"]] == [None]


def test_mapping_identical_names(tmp_path, eager):
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, KERNELS])
    b = compute_budget(path, by="layer", mapping=eager)
    placement = b.to_dict()["nvtx_placement"]
    assert (placement["mapping"], placement["unplaced"]) == (8, 0)
    assert placement["mapping_capture"]["name_mismatches"] == 0
    assert placement["mapping_capture"]["identical_steps"] == 2
    assert layers_of(b) == {0: 2.0, 1: 2.0}


def test_mapping_counts_a_renamed_kernel(tmp_path, eager):
    renamed = list(KERNELS)
    renamed[2] = "other_kernel"
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, renamed])
    b = compute_budget(path, by="layer", mapping=eager)
    data = b.to_dict()
    placement = data["nvtx_placement"]
    assert placement["mapping_capture"]["name_mismatches"] == 1
    assert placement["mapping_capture"]["identical_steps"] == 1
    assert (placement["mapping"], placement["unplaced"]) == (7, 1)
    # the renamed op is not given the eager op's layer: it stays outside layers (1 op over 2 steps)
    assert layers_of(b) == {0: 2.0, 1: 1.5, None: 0.5}
    assert "1 unplaced" in data["nvtx_context"] and "1 of 8" in data["nvtx_context"]
    # the rows add up to the step's op time
    d = data["devices"][0]
    assert sum(r["ms_per_step"] for r in d["layers"]) == pytest.approx(sum(c["ms_per_step"] for c in d["categories"]))


def test_mapping_aligns_around_an_extra_kernel(tmp_path, eager):
    extra = [KERNELS[0], "extra_kernel"] + KERNELS[1:]
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, extra])
    b = compute_budget(path, by="layer", mapping=eager)
    placement = b.to_dict()["nvtx_placement"]
    assert placement["mapping_capture"]["name_mismatches"] == 1
    assert (placement["mapping"], placement["unplaced"]) == (8, 1)
    # everything after the extra kernel still lands in its own layer
    assert layers_of(b) == {0: 2.0, 1: 2.0, None: 0.5}


def test_mapping_with_fewer_steps_cycles(tmp_path):
    one_step = make_eager_capture(tmp_path / "eager1.sqlite", steps=1)
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, KERNELS])
    b = compute_budget(path, by="layer", mapping=one_step)
    assert b.to_dict()["nvtx_placement"]["unplaced"] == 0
    assert layers_of(b) == {0: 2.0, 1: 2.0}


def test_mapping_without_nvtx_is_refused(tmp_path):
    bare = make_eager_capture(tmp_path / "bare.sqlite", nvtx=False)
    # no NVTX at all: decode_step is missing too, so build one that has only steps
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, KERNELS])
    with pytest.raises(ProfattrError, match="--mapping"):
        compute_budget(path, mapping=_strip_nvtx(bare, tmp_path))


def _strip_nvtx(path, tmp_path):
    import shutil
    import sqlite3

    out = tmp_path / "no_nvtx.sqlite"
    shutil.copyfile(path, out)
    conn = sqlite3.connect(out)
    conn.execute("DELETE FROM NVTX_EVENTS")
    conn.commit()
    conn.close()
    return out


def test_cli_mapping_errors_are_one_line(tmp_path, eager):
    path = make_graph_capture(tmp_path / "graph.sqlite", [KERNELS, KERNELS])
    runner = CliRunner()
    missing = runner.invoke(cli, ["budget", str(path), "--mapping", str(tmp_path / "nope.sqlite")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    bad = runner.invoke(cli, ["budget", str(path), "--layer-range", "layers.(\\d+"])
    assert bad.exit_code == 2 and "--layer-range" in bad.output and "Traceback" not in bad.output
    ok = runner.invoke(cli, ["budget", str(path), "--mapping", str(eager), "--by", "layer"])
    assert ok.exit_code == 0, ok.output
    assert "mapping capture" in ok.output and "note:" not in ok.output


def test_custom_layer_range_named_group(eager):
    b = compute_budget(eager, layer_range=r"layers\.(?P<layer>\d+)\.attn")
    # only the attn sub-ranges count: the first launch of each layer is inside one, the second is not
    assert layers_of(b) == {0: 1.0, 1: 1.0, None: 2.0}
    b = compute_budget(eager, layer_range=r"model\.layers\.\d+$")  # no group: the range text is the label
    assert layers_of(b) == {"model.layers.0": 2.0, "model.layers.1": 2.0}
