"""The GLM-5-shaped NVFP4 decode on the H200 (examples/h200/glm5-nvfp4/: SGLang 0.5.16, ModelOpt NVFP4 with attention,
router and lm_head BF16, `--quantization modelopt_fp4 --moe-runner-backend marlin --fp4-gemm-backend marlin`, CUDA
graphs at batch 1/4/8 and the eager twin with layerwise NVTX): dense FP4 GEMMs are W4A16 Marlin kernels in
`gemm.fp4`, the expert GEMMs Marlin MoE kernels in `moe.gemm`.

Expected numbers come from SQL on the exports, the config.json that run.json recorded, and the launching source
(tests/data/nvfp4/glm_nvfp4_expected.tsv, then tests/data/taxonomy/glm_expected.tsv), never from profattr's output.
"""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from profattr.cli import cli
from profattr.taxonomy.classify import load_rules
from test_nvfp4_limits import expected_weight_bytes

DATA = Path(__file__).parent / "data"
FOLDER = EXAMPLES / "glm5-nvfp4"
CAPTURES = sorted(f"glm5-nvfp4/{p.name[:-len('.nsys-rep')]}" for p in FOLDER.glob("*.nsys-rep"))
GRAPH = [c for c in CAPTURES if re.search(r"/glm-nvfp4-bs\d-r\d$", c)]
EAGER = "glm5-nvfp4/glm-nvfp4-eager"
MIN_SHARE = 0.99


def _rows(path: Path) -> list:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


EXPECTED = [(re.compile(p), c, re.compile(f)) for p, c, f, _source in
            _rows(DATA / "nvfp4" / "glm_nvfp4_expected.tsv") + _rows(DATA / "taxonomy" / "glm_expected.tsv")]
KERNEL_NS_BY_NAME = """
SELECT d.value, s.value, SUM(k."end" - k.start)
FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName
GROUP BY k.demangledName, k.shortName"""


def _query(path, sql, params=()):
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_the_captures_are_there():
    assert len(CAPTURES) >= 7 and len(GRAPH) == 6 and EAGER in CAPTURES


@pytest.mark.parametrize("name", CAPTURES)
def test_nvfp4_capture_time_lands_in_the_family_its_source_gives(name, export_example):
    rules = load_rules()
    rows = _query(export_example(name), KERNEL_NS_BY_NAME)
    total = sum(ns for *_n, ns in rows)
    expected_ns, missing, wrong = 0, [], []
    for demangled, short, ns in rows:
        row = next((r for r in EXPECTED if r[0].search(demangled)), None)
        if row is None:
            missing.append(short)
            continue
        rule = rules.match(demangled, frozenset(), short=short)
        if rule is not None and rule.category == row[1] and row[2].fullmatch(rule.family):
            expected_ns += ns
        else:
            wrong.append((short, rule.id if rule else None, ns))
    assert not missing, f"{name}: kernels without an expected row: {sorted(set(missing))}"
    assert expected_ns / total >= MIN_SHARE, f"{name}: {expected_ns / total:.2%}; elsewhere: {wrong}"
    # the dense FP4 GEMMs are outside moe.gemm, and they are a real share of the decode
    dense = sum(ns for d, _s, ns in rows if "device::marlin::Marlin<" in d)
    assert dense / total > 0.05


def _budget(path) -> dict:
    result = CliRunner().invoke(cli, ["budget", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", GRAPH + [EAGER])
def test_marlin_launches_per_step_are_the_models_fp4_linears(name, export_example):
    """Per decode step, from the config: the 3 dense layers (first_k_dense_replace) run gate_up and down, the 3 MoE
    layers their shared expert's gate_up and down (SGLang fuses gate and up): 12 dense FP4 GEMMs; the 3 MoE layers
    run the routed experts' two grouped GEMMs: 6 Marlin MoE launches."""
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    c = run["model_config"]
    dense_layers = c["first_k_dense_replace"]
    moe_layers = c["num_hidden_layers"] - dense_layers
    d = _budget(export_example(name))["devices"][0]
    cats = {x["category"]: x for x in d["categories"]}
    assert cats["gemm.fp4"]["count_per_step"] == pytest.approx(2 * dense_layers + 2 * moe_layers * c["n_shared_experts"])
    assert cats["moe.gemm"]["count_per_step"] == pytest.approx(2 * moe_layers)
    rows = {(r["category"], r["weight_dtype"], r["math"]) for r in d["gemm_precision"]}
    assert ("gemm.fp4", "fp4", "W4A16: unpacked to BF16 in the kernel") in rows
    assert ("moe.gemm", "fp4", "W4A16: unpacked to BF16 in the kernel") in rows


# every Marlin launch of the eager twin with the module ranges (SGLang --enable-layerwise-nvtx-marker) around it
MODULES_OF_MARLIN = """
SELECT k.correlationId, d.value, n.text
FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds d ON d.id = k.demangledName
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND n."end" >= r."end"
WHERE d.value LIKE '%marlin%' AND n.eventType = 59"""


def test_eager_twin_runs_dense_marlin_in_dense_modules_and_marlin_moe_in_the_experts(export_example):
    by_launch: dict = {}
    for corr, demangled, text in _query(export_example(EAGER), MODULES_OF_MARLIN):
        module = re.search(r"'Module': '([^']+)'", text or "")
        if module:
            by_launch.setdefault((corr, demangled), []).append(module.group(1))
    assert by_launch
    for (_corr, demangled), modules in by_launch.items():
        innermost = max(modules, key=len)
        if "marlin_moe::" in demangled:
            assert re.search(r"\.layers\.[3-5]\.mlp\.experts$", innermost), innermost
        else:
            assert re.search(r"\.layers\.[0-2]\.mlp\.(gate_up|down)_proj$|\.layers\.[3-5]\.mlp\.shared_experts\."
                             r"(gate_up|down)_proj$", innermost), innermost


def test_gap_prices_the_recorded_nvfp4_config_with_no_flags(export_example):
    name = GRAPH[0]
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    c = run["model_config"]
    want = expected_weight_bytes(c)
    result = CliRunner().invoke(cli, ["gap", str(export_example(name)), "--format", "json"])
    assert result.exit_code == 0, result.output
    gap = json.loads(result.stdout)
    assert gap["model"]["quantization"].startswith("quantization from config.json quantization_config (modelopt "
                                                   "NVFP4, group 16, 3 ignore patterns")
    rows = {r["category"]: r for r in gap["devices"][0]["categories"]}
    fp4 = want[("dense_mlp", "nvfp4")] + want[("shared_experts", "nvfp4")]
    assert rows["gemm.fp4"]["floor_bytes"] == pytest.approx(fp4, rel=1e-12)
    assert rows["moe.gemm"]["floor_bytes"] == pytest.approx(want[("routed_experts", "nvfp4")], rel=1e-12)
    assert rows["gemm.fp4"]["measured_ms"] > rows["gemm.fp4"]["floor_ms"] > 0
    assert "gemm.fp4" in {x["component"] for x in gap["devices"][0]["components"]}


def test_check_names_the_marlin_backends_the_server_resolved(export_example, tmp_path):
    from profattr.check.run import check_capture

    _, findings = check_capture(export_example(GRAPH[0]))
    f = {x.check: x for x in findings}["fp4_backend"]
    assert f.status == "pass", f.message
    for words in ("--fp4-gemm-backend marlin (server: marlin)", "--moe-runner-backend marlin (server: marlin)",
                  "quant=modelopt_fp4, quant_algo=NVFP4", "marlin_dense (W4A16: unpacked to BF16 in the kernel"):
        assert words in f.message
