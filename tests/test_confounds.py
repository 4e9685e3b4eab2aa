"""What else differs between two runs (attribute/confounds.py), on the committed GLM-5-shaped run.json files and
edited copies of them; and the diff CLI saying it."""
from __future__ import annotations

import copy
import json

from click.testing import CliRunner

from conftest import EXAMPLES
from profattr.attribute import confounds
from profattr.cli import cli
from profattr.run_record import RunRecord, validate


def run(name: str) -> dict:
    return json.loads((EXAMPLES / f"glm5/{name}.run.json").read_text())


def compare_runs(a, b) -> list:
    """confounds.compare_runs of two parsed (and edited) run.json dicts, validated as a file would be."""
    return confounds.compare_runs(*(None if r is None else RunRecord(validate(r, "run.json")) for r in (a, b)))


def test_backend_pair_differs_only_in_what_was_changed():
    a, b = run("glm-triton-bs1-r1"), run("glm-cutlass-bs1-r1")
    args_a, args_b = a["server_log"]["server_args"], b["server_log"]["server_args"]
    changed_args = {k for k in args_a if args_a[k] != args_b.get(k)}
    got = compare_runs(a, b)
    assert {d["what"] for d in got if d["kind"] == "intended"} == {f"server argument {k}" for k in changed_args}
    assert changed_args == {"moe_runner_backend"}
    assert not [d for d in got if d["kind"] == "confound"]


def test_batch_sweep_is_a_confound_of_a_backend_diff():
    got = compare_runs(run("glm-triton-bs1-r1"), run("glm-triton-bs8-r1"))
    assert [(d["what"], d["a"], d["b"]) for d in got if d["kind"] == "confound"] == [("requests batch", 1, 8)]


def test_versions_clocks_and_a_silently_resolved_backend_are_confounds():
    a = run("glm-triton-bs1-r1")
    b = copy.deepcopy(a)
    b["packages"]["sglang"] = "0.5.17"
    b["gpus"][0]["clocks_max_sm_mhz"] = 1755
    b["server_log"]["resolved"]["fp8_gemm_runner_backend"] = "deep_gemm"  # same flag, another backend resolved
    got = {d["what"]: d for d in compare_runs(a, b)}
    assert got["sglang version"]["kind"] == "confound" and got["sglang version"]["b"] == "0.5.17"
    assert got["GPU 0 clocks_max_sm_mhz"]["a"] == a["gpus"][0]["clocks_max_sm_mhz"]
    resolved = got["backend SGLang resolved: fp8_gemm_runner_backend"]
    assert resolved["kind"] == "confound" and (resolved["a"], resolved["b"]) == ("triton", "deep_gemm")


def test_unknown_side_is_no_difference():
    a = run("glm-triton-bs1-r1")
    b = copy.deepcopy(a)
    del b["packages"]
    b["gpus"] = []
    assert compare_runs(a, b) == [] and compare_runs(a, None) == []


def test_diff_cli_warns_about_a_confound(export_example):
    a, b = export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-triton-bs8-r1")
    result = CliRunner().invoke(cli, ["diff", str(a), str(b), "--samples", "50"])
    assert result.exit_code == 0, result.output
    assert "WARNING: also differs (part of the step difference may come from it): requests batch 1 → 8" \
        in result.output
    out = CliRunner().invoke(cli, ["diff", str(a), str(b), "--samples", "50", "--format", "json"])
    assert {"kind": "confound", "what": "requests batch", "a": 1, "b": 8} in json.loads(out.output)["confounds"]


def test_one_model_in_two_weight_formats_is_the_intended_change():
    fp8, nvfp4 = run("glm-fp8-rnd-bs1-r1"), run("../glm5-nvfp4/glm-nvfp4-rnd-bs1-r1")
    # the two config.json files differ in quantization_config alone (checked here, not by profattr)
    keys = set(fp8["model_config"]) | set(nvfp4["model_config"])
    assert {k for k in keys if fp8["model_config"].get(k) != nvfp4["model_config"].get(k)} == {"quantization_config"}
    diffs = compare_runs(fp8, nvfp4)
    assert not [d for d in diffs if d["what"] == "model"]
    quant = [d for d in diffs if d["what"].startswith("model weights' quantization")]
    assert quant and quant[0]["kind"] == "intended" and quant[0]["b"] == "modelopt NVFP4"
    other = copy.deepcopy(nvfp4)
    other["model_config"]["num_hidden_layers"] = 7  # another model, not another format of the same one
    assert [d for d in compare_runs(fp8, other) if d["what"] == "model" and d["kind"] == "confound"]
