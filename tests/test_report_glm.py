"""`profattr report` over the GLM-5-shaped captures: the batch sweep, diffs within a batch size, the bottleneck
line that ties the dense FP8 GEMMs to SGLang's default-config warning, and layers under CUDA graphs.

Expected numbers come from SQL over the exports (tests/independent.py), the run.json files and the server logs."""
from __future__ import annotations

import gzip
import json
import re
import shutil

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from independent import expected_nvtx_like
from profattr.cli import cli

NAMES = ["glm5/glm-triton-bs1-r1", "glm5/glm-cutlass-bs1-r1", "glm5/glm-triton-bs4-r1", "glm5/glm-cutlass-bs4-r1"]


def section(text: str, heading: str) -> str:
    return text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def glm_report(export_example, tmp_path_factory):
    paths = [export_example(n) for n in NAMES]
    eager = export_example("glm5/glm-triton-eager")
    out = tmp_path_factory.mktemp("glm-report")
    result = CliRunner().invoke(cli, ["report", *map(str, paths), "-o", str(out), "--samples", "200",
                                      "--mapping", f"{paths[0]}={eager}"])
    assert result.exit_code == 0, result.output
    return paths, (out / "report.md").read_text(encoding="utf-8")


def test_batch_sweep_rows_follow_the_captures(glm_report):
    paths, text = glm_report
    sweep = section(text, "## Batch sweep")
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")
            for line in sweep.splitlines() if line.startswith("| ") and not line.startswith("| capture")}
    for path, name in zip(paths, NAMES):
        run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
        batch = run["requests"]["batch"]
        mean = expected_nvtx_like(path, "step[DECODE bs=%]")[0]["mean_step_ms"]
        label = name.split("glm-", 1)[1].rsplit("-r1", 1)[0]
        cells = rows[label]
        assert int(cells[2]) == batch
        assert float(cells[3]) == pytest.approx(mean, abs=6e-4)
        assert float(cells[4]) == pytest.approx(mean / batch, abs=6e-4)
        assert int(cells[5]) == pytest.approx(1e3 * batch / mean, abs=1)


def test_diffs_compare_within_a_batch_size(glm_report):
    _, text = glm_report
    headings = [line for line in text.splitlines() if line.startswith("### ") and " vs " in line]
    assert headings == ["### `cutlass-bs1` vs `triton-bs1`", "### `cutlass-bs4` vs `triton-bs4`"]


def test_first_bottleneck_names_the_default_fp8_config(glm_report):
    _, text = glm_report
    with gzip.open(EXAMPLES / "glm5/glm-triton.server.log.gz", "rt", errors="replace") as fh:
        shapes = set(re.findall(r"Using default W8A8 Block FP8 kernel config.*?Config file not found at \S*/"
                                r"(N=\d+,K=\d+)", fh.read()))
    first = next(line for line in section(text, "## Bottlenecks, ranked").splitlines() if line.startswith("1. "))
    assert first.startswith("1. **gemm.fp8 ") and "in 4 captures" in first
    # the one-line list keeps the numbers; the tie to the server's warning is in the full reasoning further down
    detail = next(line for line in section(text, "## Bottlenecks in detail").splitlines() if line.startswith("1. "))
    assert detail.startswith("1. **gemm.fp8 ")
    assert f"no tuned config on this GPU for {len(shapes)} of its shapes" in detail and len(shapes) == 9


def test_layers_under_graphs_through_the_eager_twin(glm_report):
    _, text = glm_report
    budget = section(text, "## Per-step budget")
    first = budget.split("### ", 2)[1]
    layers = [line for line in first.splitlines() if re.match(r"\| layer \d", line)]
    assert [line.split(" | ")[0] for line in layers] == [f"| layer {i}" for i in range(6)]
    assert "By model layer" not in budget.split("### ", 2)[2]  # the other captures had no mapping


def test_a_glob_is_a_replicate_group(export_example, tmp_path):
    caps = tmp_path / "caps"
    caps.mkdir()
    members = {}
    for b in ("triton", "cutlass"):
        members[b] = []
        for r in (1, 2):
            name = f"glm-{b}-bs1-r{r}"
            src = export_example(f"glm5/{name}")
            shutil.copyfile(src, caps / src.name)
            shutil.copyfile(EXAMPLES / "glm5" / f"{name}.run.json", caps / f"{name}.run.json")
            members[b].append(caps / src.name)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(caps / "glm-triton-bs1-r?.sqlite"),
                                      str(caps / "glm-cutlass-bs1-r?.sqlite"), "-o", str(out), "--samples", "200"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    summary = section(text, "## Summary")
    for label, paths in members.items():
        row = next(line for line in summary.splitlines() if line.startswith(f"| `{label}` |"))
        means = [expected_nvtx_like(p, "step[DECODE bs=%]")[0]["mean_step_ms"] for p in paths]
        assert float(row.split(" | ")[3]) == pytest.approx(sum(means) / 2, abs=6e-4)
        assert int(row.split(" | ")[1]) == sum(expected_nvtx_like(p, "step[DECODE bs=%]")[0]["steps"] for p in paths)
    assert "### `cutlass` vs `triton`" in text
    assert "2 replicates (" in (out / "details.md").read_text(encoding="utf-8")  # the run facts moved there


def test_skipped_steps_are_left_out_and_kept_in_the_command(export_example, tmp_path):
    path = export_example("glm5/glm-triton-bs1-r1")
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(path), "-o", str(out), "--samples", "50", "--skip-steps", "3"])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    steps = expected_nvtx_like(path, "step[DECODE bs=%]")[0]["steps"]
    row = next(line for line in section(text, "## Summary").splitlines() if line.startswith("| `glm-triton-bs1-r1` |"))
    assert int(row.split(" | ")[1]) == steps - 3
    command = section(text, "## Reproducibility")
    assert "--skip-steps 3" in command and f"-o {out}" in command


def test_fp8_gemm_backend_pair_in_the_sweep_and_a_drill_joins_its_replicate_group(export_example, tmp_path):
    caps = tmp_path / "caps"
    caps.mkdir()
    for name in ("glm-fp8tr-bs1-r1", "glm-fp8dg-bs1-r1", "glm-fp8dg-bs1-r2", "glm-fp8tr-bs4-r1"):
        shutil.copyfile(export_example(f"glm5/{name}"), caps / f"{name}.sqlite")
        shutil.copyfile(EXAMPLES / "glm5" / f"{name}.run.json", caps / f"{name}.run.json")
    drill = EXAMPLES / "glm5" / "glm-drill-fp8dg.ncu.csv"
    out = tmp_path / "report"
    args = ["report", str(caps / "glm-fp8tr-bs1-r1.sqlite"), str(caps / "glm-fp8dg-bs1-r?.sqlite"),
            str(caps / "glm-fp8tr-bs4-r1.sqlite"), "-o", str(out), "--samples", "50",
            "--drill", f"{caps / 'glm-fp8dg-bs1-r1.sqlite'}={drill}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text(encoding="utf-8")
    sweep = section(text, "## Batch sweep")
    header = next(line for line in sweep.splitlines() if line.startswith("| capture"))
    assert header.split(" | ")[2] == "FP8 GEMM backend"
    for name in ("glm-fp8tr-bs1-r1", "glm-fp8tr-bs4-r1"):
        resolved = json.loads((EXAMPLES / "glm5" / f"{name}.run.json").read_text())["server_log"]["resolved"]
        label = name.replace("glm-", "").rsplit("-r1", 1)[0]
        row = next(line for line in sweep.splitlines() if line.startswith(f"| `{label}"))
        cell = row.split(" | ")[2]
        assert cell.strip("`") == resolved["fp8_gemm_runner_backend"] and "\\" not in cell  # code, not escapes
    assert "### glm-drill-fp8dg.ncu.csv" in text  # attached to the glob group that holds the named capture
    bad = CliRunner().invoke(cli, args[:-1] + [f"nowhere.sqlite={drill}", "--force"])
    assert bad.exit_code == 2 and "nowhere.sqlite is none of the report's captures" in bad.output
