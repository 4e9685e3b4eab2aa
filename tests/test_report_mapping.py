"""`profattr report --mapping CAPTURE=EAGER`: a graph capture's replayed kernels borrow NVTX context (here SGLang's
layerwise markers) from its eager twin, so context rules apply in the report too."""
from __future__ import annotations

import re

from click.testing import CliRunner

from conftest import EXAMPLES
from profattr.cli import cli


def test_report_with_mapping(tmp_path, export_example):
    graph = EXAMPLES / "sglang-triton-bs1.sqlite"
    eager = export_example("sglang-triton-bs1-eager")
    out = tmp_path / "rep"
    r = CliRunner().invoke(cli, ["report", str(graph), "-o", str(out), "--mapping", f"{graph.name}={eager}"])
    assert r.exit_code == 0, r.output
    text = (out / "report.md").read_text()
    assert "NVTX context of replayed kernels: mapping capture" in text
    # the router GEMM runs inside SGLang's `mlp.gate` module range: with the eager twin's context it is routing
    # (the report's kernel table lists one row per launch shape: the shape's column sits between name and category)
    assert re.search(r"\| nvjet\\_sm90\\_tst\\_64x8\\_64x16\\_1x1\\_h\\_bz\\_TNT \| grid [^|]* \| moe\.routing \|", text)
    assert f"--mapping {graph.name}=" in text  # the reproducibility command carries it


def test_report_mapping_must_name_a_capture(tmp_path):
    graph = EXAMPLES / "sglang-triton-bs1.sqlite"
    r = CliRunner().invoke(cli, ["report", str(graph), "-o", str(tmp_path / "r"), "--mapping", "other.sqlite=x"])
    assert r.exit_code == 2 and "expected CAPTURE=EAGER_CAPTURE" in r.output
    assert not (tmp_path / "r" / "report.md").exists()
