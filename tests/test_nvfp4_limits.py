"""Floors from the quantization a config.json records: the GLM-5-shaped NVFP4 config (ModelOpt, group 16, attention,
router and lm_head ignored) priced module by module, with no --quant.

The expected bytes are counted here from the config's architecture fields: every linear module of GLM-5's MLA +
DSA + MoE layout with its shape, the modules the ignore globs match kept BF16 (2 B per weight), every other one
NVFP4 at 0.5 B per weight + one FP8 scale (1 B) per 16 weights + one FP32 global scale (4 B) per tensor.
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from badinput import assert_one_line_error, snapshot
from conftest import EXAMPLES
from profattr.cli import cli

DATA = Path(__file__).parent / "data" / "nvfp4"
CONFIG = DATA / "glm5-like-nvfp4-config.json"
FP8_CAPTURE = "glm5/glm-triton-bs1-r1"


def nvfp4_bytes(out_features: int, in_features: int, group: int = 16) -> float:
    n = out_features * in_features
    return 0.5 * n + n / group * 1 + 4


def glm_linears(c: dict) -> list:
    """(path, weight class, out, in, share of it a token reads) of every linear of the GLM-5-shaped config."""
    h, heads, q_lora, kv_lora = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    idx_heads, idx_dim = c["index_n_heads"], c["index_head_dim"]
    experts, top_k = c["n_routed_experts"], c["num_experts_per_tok"]
    out = []
    for i in range(c["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn"
        out += [(f"{a}.q_a_proj", "attention", q_lora, h, 1),
                (f"{a}.q_b_proj", "attention", heads * (nope + rope), q_lora, 1),
                (f"{a}.kv_a_proj_with_mqa", "attention", kv_lora + rope, h, 1),
                (f"{a}.kv_b_proj", "attention", heads * (nope + v), kv_lora, 1),
                (f"{a}.o_proj", "attention", h, heads * v, 1),
                (f"{a}.indexer.wq_b", "indexer", idx_heads * idx_dim, q_lora, 1),
                (f"{a}.indexer.wk", "indexer", idx_dim, h, 1),
                (f"{a}.indexer.weights_proj", "indexer", idx_heads, h, 1)]
        m = f"model.layers.{i}.mlp"
        if i < c["first_k_dense_replace"]:
            f = c["intermediate_size"]
            out += [(f"{m}.gate_proj", "dense_mlp", f, h, 1), (f"{m}.up_proj", "dense_mlp", f, h, 1),
                    (f"{m}.down_proj", "dense_mlp", h, f, 1)]
        else:
            f = c["moe_intermediate_size"]
            s = f * c["n_shared_experts"]
            out += [(f"{m}.shared_experts.gate_proj", "shared_experts", s, h, 1),
                    (f"{m}.shared_experts.up_proj", "shared_experts", s, h, 1),
                    (f"{m}.shared_experts.down_proj", "shared_experts", h, s, 1)]
            for j in range(experts):
                e = f"{m}.experts.{j}"
                out += [(f"{e}.gate_proj", "routed_experts", f, h, top_k / experts),
                        (f"{e}.up_proj", "routed_experts", f, h, top_k / experts),
                        (f"{e}.down_proj", "routed_experts", h, f, top_k / experts)]
    return out


def expected_weight_bytes(c: dict) -> dict:
    """{(weight class, dtype): bytes a token reads} for the linears; BF16 for ignored ones and for the indexer's
    weights_proj, which SGLang builds without a quant config; plus the indexer's BF16 k_norm (weight and bias)."""
    ignore = c["quantization_config"]["ignore"]
    got: dict = {("indexer", "bf16"): 2 * c["index_head_dim"] * 2 * c["num_hidden_layers"]}
    for path, cls, o, i, share in glm_linears(c):
        ignored = any(fnmatch.fnmatchcase(path, p) for p in ignore) or path.endswith("indexer.weights_proj")
        key = (cls, "bf16" if ignored else "nvfp4")
        got[key] = got.get(key, 0.0) + (o * i * 2 if ignored else nvfp4_bytes(o, i)) * share
    return got


def limit_json(*args) -> dict:
    result = CliRunner().invoke(cli, ["limit", "--model", str(CONFIG), "-H", "h200", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_limit_prices_the_config_json_quantization_module_by_module():
    c = json.loads(CONFIG.read_text())
    want = expected_weight_bytes(c)
    limit = limit_json()
    got: dict = {}
    for w in limit["model"]["weights"]:
        key = (w["weight_class"], w["dtype"])
        got[key] = got.get(key, 0.0) + w["bytes_per_token"]
    for key, nbytes in want.items():
        assert got[key] == pytest.approx(nbytes, rel=1e-12), key
    # attention, the indexer's wq_b/wk and the router are ignored: no NVFP4 attention at all
    assert ("attention", "nvfp4") not in got and ("indexer", "nvfp4") not in got
    assert got[("lm_head", "bf16")] == c["vocab_size"] * c["hidden_size"] * 2
    assert limit["model"]["quantization"] == ("quantization from config.json quantization_config "
                                              "(modelopt NVFP4, group 16, 3 ignore patterns)")
    quant_text = [a["text"] for a in limit["assumptions"] if a["id"] == "quantization"][0]
    assert quant_text.startswith("quantization from config.json quantization_config")


def test_quant_still_overrides_and_says_so():
    limit = limit_json("--quant", "nvfp4-all")
    assert limit["model"]["quantization"] == "--quant preset nvfp4-all"
    assert {w["dtype"] for w in limit["model"]["weights"] if w["weight_class"] == "attention"} == {"nvfp4"}


def _nvfp4_run(tmp_path: Path) -> Path:
    """The FP8 capture's run.json with the NVFP4 config in place of its config.json."""
    run = json.loads((EXAMPLES / f"{FP8_CAPTURE}.run.json").read_text())
    run["model_config"] = json.loads(CONFIG.read_text())
    path = tmp_path / "nvfp4.run.json"
    path.write_text(json.dumps(run))
    return path


def test_gap_has_an_fp4_gemm_floor_row_from_the_recorded_config(tmp_path, export_example):
    capture = export_example(FP8_CAPTURE)
    c = json.loads(CONFIG.read_text())
    want = expected_weight_bytes(c)
    result = CliRunner().invoke(cli, ["gap", str(capture), "--run-json", str(_nvfp4_run(tmp_path)),
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    gap = json.loads(result.stdout)
    assert gap["model"]["quantization"].startswith("quantization from config.json quantization_config (modelopt "
                                                   "NVFP4, group 16")
    rows = {r["category"]: r for r in gap["devices"][0]["categories"]}
    fp4 = want[("dense_mlp", "nvfp4")] + want[("shared_experts", "nvfp4")]
    assert rows["gemm.fp4"]["floor_bytes"] == pytest.approx(fp4, rel=1e-12)
    assert rows["moe.gemm"]["floor_bytes"] == pytest.approx(want[("routed_experts", "nvfp4")], rel=1e-12)
    # BF16: the ignored attention projections and lm_head
    assert rows["gemm.bf16"]["floor_bytes"] == pytest.approx(want[("attention", "bf16")]
                                                             + c["vocab_size"] * c["hidden_size"] * 2, rel=1e-12)
    assert "gemm.fp4" in {x["component"] for x in gap["devices"][0]["components"]}
    table = CliRunner().invoke(cli, ["gap", str(capture), "--run-json", str(_nvfp4_run(tmp_path))])
    assert table.exit_code == 0 and "quantization: quantization from config.json quantization_config" in table.stdout


# --- bad input ------------------------------------------------------------------------------------------------------

def _config_with(tmp_path: Path, **quantization) -> Path:
    c = json.loads(CONFIG.read_text())
    c["quantization_config"] = {**c["quantization_config"], **quantization}
    c["quantization_config"] = {k: v for k, v in c["quantization_config"].items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(c))
    return path


@pytest.mark.parametrize("change, needles", [
    ({"quant_algo": "NVFP5"}, ("quant_algo 'NVFP5' is not known", "NVFP4", "FP8")),
    ({"group_size": None}, ("NVFP4 needs a positive group_size", "None")),
    ({"group_size": 0}, ("NVFP4 needs a positive group_size", "got 0")),
])
def test_bad_quantization_config_is_one_line_and_writes_nothing(tmp_path, change, needles):
    path = _config_with(tmp_path, **change)
    out = tmp_path / "limit.json"
    before = snapshot(tmp_path)
    result = CliRunner().invoke(cli, ["limit", "--model", str(path), "-H", "h200", "-o", str(out)])
    assert_one_line_error(result, *needles)
    assert snapshot(tmp_path) == before


def test_an_ignore_pattern_matching_no_module_is_a_warning(tmp_path):
    path = _config_with(tmp_path, ignore=["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate",
                                          "model.decoder.*.fc1"])
    result = CliRunner().invoke(cli, ["limit", "--model", str(path), "-H", "h200", "--format", "json"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "'model.decoder.*.fc1'" in warnings[0]
    assert json.loads(result.stdout)["model"]["quantization"].endswith("4 ignore patterns)")


NESTED = {"producer": {"name": "modelopt"},
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                           "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]}}
COMPRESSED = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"],
                                            "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                        "group_size": 16, "symmetric": True},
                                            "input_activations": {"num_bits": 4, "type": "float"}}},
              "ignore": ["lm_head", "re:model\\.layers\\.\\d+\\.self_attn.*", "re:.*mlp\\.gate$"],
              "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}


@pytest.mark.parametrize("form, method", [(NESTED, "modelopt NVFP4"), (COMPRESSED, "compressed-tensors NVFP4")])
def test_other_config_forms_price_the_same_weights_and_state_the_kv_cache(tmp_path, form, method):
    c = json.loads(CONFIG.read_text())
    want = expected_weight_bytes(c)
    c["quantization_config"] = form
    path = tmp_path / "config.json"
    path.write_text(json.dumps(c))
    result = CliRunner().invoke(cli, ["limit", "--model", str(path), "-H", "h200", "--format", "json"])
    assert result.exit_code == 0, result.output
    limit = json.loads(result.stdout)
    got: dict = {}
    for w in limit["model"]["weights"]:
        got[(w["weight_class"], w["dtype"])] = got.get((w["weight_class"], w["dtype"]), 0.0) + w["bytes_per_token"]
    for key, nbytes in want.items():
        assert got[key] == pytest.approx(nbytes, rel=1e-12), key
    assert limit["model"]["quantization"] == (f"quantization from config.json quantization_config ({method}, "
                                              "group 16, 3 ignore patterns, KV cache fp8)")
    # the KV cache the config states (FP8, FlashMLA's 656-byte row per layer) without --kv-dtype
    assert limit["model"]["kv_cache_bytes_per_token"] == 656 * c["num_hidden_layers"]


def test_fp8_block_config_counts_one_fp32_scale_per_block(tmp_path):
    c = json.loads(CONFIG.read_text())
    c["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(c))
    result = CliRunner().invoke(cli, ["limit", "--model", str(path), "-H", "h200", "--format", "json"])
    assert result.exit_code == 0, result.output
    weights = json.loads(result.stdout)["model"]["weights"]
    dense = [w for w in weights if w["component"] == "dense_mlp"]
    h, f, layers = c["hidden_size"], c["intermediate_size"], c["first_k_dense_replace"]
    scales = (2 * (-(-f // 128)) * (-(-h // 128)) + (-(-h // 128)) * (-(-f // 128))) * 4
    assert [w["dtype"] for w in dense] == ["fp8"]
    assert dense[0]["bytes_per_token"] == (3 * h * f + scales) * layers


@pytest.mark.parametrize("quantization, needles", [
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int",
                                                                            "strategy": "group", "group_size": 0}}}},
     ("config_groups.g.weights", "strategy group needs a positive group_size", "got 0")),
    ({"quant_method": "awq", "bits": 4}, ("quant_method 'awq' is not known", "modelopt", "compressed-tensors")),
    ({"quant_method": "fp8", "weight_block_size": [128]}, ("weight_block_size must be two positive integers",)),
])
def test_other_bad_quantization_forms_are_one_line(tmp_path, quantization, needles):
    c = json.loads(CONFIG.read_text())
    c["quantization_config"] = quantization
    path = tmp_path / "config.json"
    path.write_text(json.dumps(c))
    assert_one_line_error(CliRunner().invoke(cli, ["limit", "--model", str(path), "-H", "h200"]), *needles)


def test_gap_quant_overrides_the_recorded_config_without_model(tmp_path, export_example):
    capture = export_example(FP8_CAPTURE)
    result = CliRunner().invoke(cli, ["gap", str(capture), "--run-json", str(_nvfp4_run(tmp_path)),
                                      "--quant", "bf16", "--format", "json"])
    assert result.exit_code == 0, result.output
    gap = json.loads(result.stdout)
    assert gap["model"]["quantization"] == "--quant preset bf16 (overrides the config.json quantization_config)"
    assert {w["dtype"] for w in gap["model"]["weights"]} == {"bf16"}
    bad = CliRunner().invoke(cli, ["gap", str(capture), "--run-json", str(_nvfp4_run(tmp_path)), "--quant", "int3"])
    assert_one_line_error(bad, "unknown quantization 'int3'")
