"""The Nsight Compute drill of both Marlin kernels of the NVFP4 decode: the dense FP4 GEMM and the expert GEMM
share the short name `Marlin`; only the namespace of the demangled name (read here from the CSV) tells them apart."""
from __future__ import annotations

import csv
import json

from click.testing import CliRunner

from conftest import EXAMPLES
from profattr.cli import cli

DRILL = EXAMPLES / "glm5-nvfp4" / "glm-drill-nvfp4.ncu.csv"


def test_drill_report_tells_dense_from_expert_marlin_with_the_capture(export_example):
    rows = list(csv.reader(DRILL.open()))
    col = rows[0].index("Kernel Name")
    names = {r[col] for r in rows[1:] if len(r) == len(rows[0]) and r[col]}
    want = {n: "moe.gemm" if "marlin_moe::" in n else "gemm.fp4" for n in names}
    assert set(want.values()) == {"gemm.fp4", "moe.gemm"}  # the drill holds both kernels
    capture = export_example("glm5-nvfp4/glm-nvfp4-rnd-bs1-r1")  # its budget has both under the short name Marlin
    for args in ([], ["--capture", str(capture)]):
        result = CliRunner().invoke(cli, ["drill-report", str(DRILL), *args, "--format", "json"])
        assert result.exit_code == 0, result.output
        got = {f["name"]: f["category"] for f in json.loads(result.output)["families"]}
        assert got == want, args
