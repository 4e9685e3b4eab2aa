"""`profattr gap` on a served GLM-5-shaped capture with no model flags: the model, its quantization, the KV cache
dtype, the batch and the context all come from the run.json that `profattr capture` wrote.

The expected floor bytes are counted here from the config.json in run.json (GLM-5's MLA + DSA + MoE shapes, FP8
block weights with one FP32 scale per 128x128 block, BF16 lm_head/embedding/norms/router/indexer weights_proj,
FlashMLA's 656-byte FP8 KV row); the bandwidth is read by
SQL from the capture's TARGET_INFO_GPU.
"""
from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from profattr.cli import cli

CAPTURES = ["glm5/glm-triton-bs1-r1", "glm5/glm-cutlass-bs4-r1", "glm5/glm-triton-bs8-r1"]


def fp8_block(out_features: int, in_features: int, block: int = 128) -> int:
    """Stored bytes of one FP8 weight of 128x128 blocks: 1 B per weight + one FP32 scale per block."""
    return out_features * in_features + -(-out_features // block) * -(-in_features // block) * 4


def expected_bytes(run: dict) -> dict:
    """Bytes one rank must read per decode step, by floor row, counted from config.json (tp 1)."""
    c = run["model_config"]
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, q_lora, kv_lora = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    dense = c["first_k_dense_replace"]
    moe = layers - dense
    batch = run["requests"]["batch"]
    context = run["requests"]["input_len"] + run["requests"]["max_new_tokens"] // 2
    bf16 = 2
    inter, moe_inter = c["intermediate_size"], c["moe_intermediate_size"]
    attention = (fp8_block(q_lora, h) + fp8_block(heads * (nope + rope), q_lora) + fp8_block(kv_lora + rope, h)
                 + fp8_block(heads * (nope + v), kv_lora) + fp8_block(h, heads * v)) * layers
    dense_mlp = (2 * fp8_block(inter, h) + fp8_block(h, inter)) * dense
    expert = 2 * fp8_block(moe_inter, h) + fp8_block(h, moe_inter)
    shared_inter = moe_inter * c["n_shared_experts"]
    shared = (2 * fp8_block(shared_inter, h) + fp8_block(h, shared_inter)) * moe
    routed = expert * c["num_experts_per_tok"] * moe
    lm_head = vocab * h
    idx_heads, idx_dim = c["index_n_heads"], c["index_head_dim"]
    # wq_b and wk FP8; weights_proj (a BF16 GEMM in SGLang) and the k_norm weight and bias BF16
    indexer_weights = (fp8_block(idx_heads * idx_dim, q_lora) + fp8_block(idx_dim, h)
                       + (h * idx_heads + 2 * idx_dim) * bf16) * layers
    kv_row = kv_lora * 1 + (kv_lora // 128) * 4 + rope * bf16  # FlashMLA FP8: 656 B
    attended = min(context, c["index_topk"])
    return {
        # FP8 projections and MLPs run as FP8 GEMMs, the BF16 lm_head as a BF16 GEMM: one floor row each
        "gemm.fp8": attention + dense_mlp + shared,
        "gemm.bf16": lm_head * bf16,
        "moe.gemm": routed,
        "attention.decode": kv_row * layers * attended * batch,
        "attention.indexer": indexer_weights + context * layers * (idx_dim + 4) * batch,
        "kv_row": kv_row,
    }


def bandwidth(path) -> float:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return float(conn.execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU WHERE id = 0").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("name", CAPTURES)
def test_gap_takes_the_model_from_run_json(name, export_example):
    path = export_example(name)
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    result = CliRunner().invoke(cli, ["gap", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    gap = json.loads(result.output)
    want = expected_bytes(run)
    assert gap["model"]["quant"] == "fp8"
    assert gap["model"]["batch"] == run["requests"]["batch"]
    device = gap["devices"][0]
    assert device["memory_bandwidth_bytes_per_s"] == bandwidth(path)
    rows = {c["category"]: c for c in device["categories"]}
    for category in ("gemm.fp8", "gemm.bf16", "moe.gemm", "attention.decode", "attention.indexer"):
        assert rows[category]["floor_bytes"] == pytest.approx(want[category], rel=1e-12), category
        # at these batches every weight row is memory bound: floor = bytes / bandwidth
        if category != "attention.decode":
            assert rows[category]["floor_ms"] == pytest.approx(want[category] / bandwidth(path) * 1e3, rel=1e-9)
    assert any(f"{want['kv_row'] * run['model_config']['num_hidden_layers']} B per token" in a
               for a in gap["assumptions"])


def _bad_run(tmp_path, name, export_example, change) -> tuple:
    path = export_example(name)
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    change(run)
    target = tmp_path / "edited.run.json"
    target.write_text(json.dumps(run))
    return path, target


def test_unknown_architecture_is_named_with_the_known_ones(tmp_path, export_example):
    path, run = _bad_run(tmp_path, CAPTURES[0], export_example,
                         lambda r: r["model_config"].update(model_type="mamba2_hybrid"))
    result = CliRunner().invoke(cli, ["gap", str(path), "--run-json", str(run)])
    assert result.exit_code != 0
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "'mamba2_hybrid' is not supported" in line and "glm_moe_dsa" in line and "llama" in line


def test_a_run_json_without_the_model_asks_for_model_flags(tmp_path, export_example):
    path, run = _bad_run(tmp_path, CAPTURES[0], export_example, lambda r: r.pop("model_config"))
    result = CliRunner().invoke(cli, ["gap", str(path), "--run-json", str(run)])
    assert result.exit_code != 0 and "pass --model" in result.output and "Traceback" not in result.output


def test_an_unmodelled_quantization_asks_for_quant(tmp_path, export_example):
    path, run = _bad_run(tmp_path, CAPTURES[0], export_example,
                         lambda r: r["model_config"].update(quantization_config={"quant_method": "awq"}))
    result = CliRunner().invoke(cli, ["gap", str(path), "--run-json", str(run)])
    assert result.exit_code != 0 and "awq" in result.output and "--quant" in result.output


def test_kv_dtype_flag_overrides_the_server_argument(export_example):
    path = export_example(CAPTURES[0])
    run = json.loads((EXAMPLES / f"{CAPTURES[0]}.run.json").read_text())
    result = CliRunner().invoke(cli, ["gap", str(path), "--format", "json", "--kv-dtype", "bf16"])
    assert result.exit_code == 0, result.output
    c = run["model_config"]
    row_bf16 = (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2 * c["num_hidden_layers"]
    assert any(f"{row_bf16} B per token" in a for a in json.loads(result.output)["assumptions"])
