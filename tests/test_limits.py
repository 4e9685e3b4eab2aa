"""`profattr limit`: model byte counts and the two floors, checked against arithmetic written out here.

Published parameter totals (Llama-3-8B, DeepSeek-V3, Qwen3-30B-A3B) are the independent truth for the config
parser; the GLM-5 floors are checked against the roofline method's own arithmetic (weights-only ~3.2 ms, realistic
7.7-10.2 ms for 8x RTX PRO 6000).
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from profattr.errors import ProfattrError
from profattr.limits.floor import compute_limit
from profattr.limits.hardware import load_hardware
from profattr.limits.model import load_model, spec_from_config

# GLM-5 config fields (GlmMoeDsaConfig defaults), spelled out independently of the preset file
H, L, D, M, E, K, I_MOE, I_DENSE = 6144, 78, 3, 75, 256, 8, 2048, 12288
QL, KVL, ROPE, NOPE, V, NH, VOCAB = 2048, 512, 64, 192, 256, 64, 154880
NVFP4, BF16 = 0.5625, 2.0
RTX_BW = 1.792e12
ETA = 0.893

DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
                   intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
                   num_experts_per_tok=8, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                   kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280,
                   tie_word_embeddings=False, moe_layer_freq=1)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, intermediate_size=6144, vocab_size=151936,
                     tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])
LLAMA3_8B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)


def glm5_params():
    """Per-token parameter counts of GLM-5 by where they live, written out from the config."""
    q_a, kv_a = H * QL, H * (KVL + ROPE)
    attn_sharded = QL * NH * (NOPE + ROPE) + KVL * NH * (NOPE + V) + NH * V * H  # q_b, kv_b, o
    expert = 3 * H * I_MOE
    norms = L * (QL + KVL + 2 * H) + H  # q_a / kv_a layernorms, two per-layer norms, final norm
    return {
        "replicated_bf16": L * (q_a + kv_a) + M * (E * H + E) + norms,  # fused qkv_a, router (+bias), norms
        "sharded_bf16": L * attn_sharded + M * expert + D * 3 * H * I_DENSE + VOCAB * H,  # + shared, dense, head
        "embedding_row": H,
        "routed": M * K * expert,
    }


@pytest.fixture(scope="module")
def glm5_limit():
    hw = load_hardware("rtx-pro-6000-ws")
    spec = load_model("glm-5-nvfp4", tp=8, dsa_runs=hw.dsa_runs)
    return compute_limit(spec, hw)


def test_glm5_weights_only_floor_reproduces_the_seeds_3_2_ms(glm5_limit):
    p = glm5_params()
    # assumptions: routed experts NVFP4 (4.5 bits), every other active weight BF16, each split evenly over 8 GPUs,
    # peak 1.792 TB/s, no KV cache, no communication, no launch cost, DSA indexer not run (SGLang on sm_120)
    bf16_params = p["replicated_bf16"] + p["sharded_bf16"] + p["embedding_row"]
    bytes_per_gpu = (p["routed"] * NVFP4 + bf16_params * BF16) / 8
    expected_ms = bytes_per_gpu / RTX_BW * 1e3
    assert glm5_limit["weights_only_ms"] == pytest.approx(expected_ms, rel=1e-12)
    assert abs(glm5_limit["weights_only_ms"] - 3.2) / 3.2 < 0.10
    ids = {a["id"] for a in glm5_limit["assumptions"] if a["floor"] == "weights_only"}
    assert {"weights_read_once", "ideal_sharding", "peak_bandwidth", "quantization", "dsa_indexer", "no_kv_cache",
            "no_communication", "no_launch_cost", "one_token_per_step"} <= ids
    terms = [t for t in glm5_limit["terms"] if t["floor"] == "weights_only"]
    assert sum(t["ms"] for t in terms) == pytest.approx(glm5_limit["weights_only_ms"], rel=1e-12)


def test_glm5_realistic_floor_is_the_worked_example(glm5_limit):
    p = glm5_params()
    # replicated weights are read whole on every rank; the rest split over 8; 1,024 tokens of BF16 MLA latent
    weight_bytes = (p["replicated_bf16"] + p["embedding_row"]) * BF16 + p["sharded_bf16"] * BF16 / 8 \
        + p["routed"] * NVFP4 / 8
    kv_bytes = 1024 * L * (KVL + ROPE) * BF16
    memory_ms = (weight_bytes + kv_bytes) / (ETA * RTX_BW) * 1e3
    oneshot_us = 9.2 + (16.5 - 9.2) * (12288 - 8192) / (32768 - 8192)  # 12 KB between the 8 KB and 32 KB points
    comm_ms = (2 * L + 1) * oneshot_us / 1e3
    launch_ms = (15.0 + 2000 * 0.58) / 1e3
    assert glm5_limit["realistic_ms"] == pytest.approx(memory_ms + comm_ms + launch_ms, rel=1e-12)
    assert 7.7 <= glm5_limit["realistic_ms"] <= 10.2
    nccl = next(s for s in glm5_limit["sensitivity"] if s["change"].startswith("all-reduce nccl"))
    nccl_us = 24.2 + (24.5 - 24.2) * (12288 - 8192) / (32768 - 8192)
    assert nccl["ms"] == pytest.approx(memory_ms + (2 * L + 1) * nccl_us / 1e3 + launch_ms, rel=1e-12)
    assert 9.7 <= nccl["ms"] <= 10.7  # the research's ~10.2 ms with NCCL


def test_glm5_sensitivity_matches_the_research_table(glm5_limit):
    rows = {s["change"]: s["ms"] for s in glm5_limit["sensitivity"]}
    # roofline research, section 4.3: replication 4.67 ms, plus eta 1.6/1.792: 5.23 ms; indexer: 3.43; no head 3.19
    assert rows["weights sharded as the engine does (replicated weights read on every rank)"] == \
        pytest.approx(4.67, abs=0.01)
    assert rows[f"... and achievable bandwidth ({ETA:.3f} x peak)"] == pytest.approx(5.23, abs=0.01)
    assert rows["DSA indexer runs"] == pytest.approx(3.43, abs=0.01)
    assert rows["lm_head not counted"] == pytest.approx(3.19, abs=0.01)
    assert rows["quantization nvfp4-fp8"] < rows["quantization fp8"] < glm5_limit["weights_only_ms"]
    assert all(s["delta_ms"] == pytest.approx(s["ms"] - glm5_limit[f"{s['floor']}_ms"]) for s in
               glm5_limit["sensitivity"])


def test_published_parameter_totals():
    llama = spec_from_config(LLAMA3_8B, quant="bf16", tp=8)
    assert llama.params_total() == 8_030_261_248  # Meta-Llama-3-8B safetensors total
    ds = spec_from_config(DEEPSEEK_V3, quant="fp8", tp=8)
    assert ds.params_total() == pytest.approx(671e9, rel=0.002)  # 671B main model (MTP excluded)
    # 37B activated counts the embedding table; profattr counts the one row a token reads
    assert ds.params_per_token() + 129280 * 7168 == pytest.approx(37e9, rel=0.02)
    qwen = spec_from_config(QWEN3_30B_A3B, quant="bf16", tp=4)
    assert qwen.params_total() == pytest.approx(30.5e9, rel=0.003)
    assert qwen.params_per_token() + 151936 * 2048 == pytest.approx(3.3e9, rel=0.02)


def test_deepseek_r1_on_b200_matches_the_researchs_0_60_ms():
    # TRT-LLM's min-latency layout: MoE (routed + shared) and dense FFN NVFP4, attention / router / lm_head BF16
    spec = spec_from_config(DEEPSEEK_V3, quant="nvfp4-ffn", tp=8)
    h, layers, moe_layers = 7168, 61, 58
    expert = 3 * h * 2048
    nvfp4 = moe_layers * 8 * expert + moe_layers * expert + 3 * 3 * h * 18432
    attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
    norms = layers * (1536 + 512 + 2 * h) + h
    bf16 = layers * attn + moe_layers * (256 * h + 256) + 129280 * h + h + norms
    expected_ms = (nvfp4 * NVFP4 + bf16 * BF16) / 8 / 8e12 * 1e3
    limit = compute_limit(spec, load_hardware("b200"))
    assert limit["weights_only_ms"] == pytest.approx(expected_ms, rel=1e-12)
    assert limit["weights_only_ms"] == pytest.approx(0.60, abs=0.01)  # roofline research, section 5


def test_gqa_kv_cache_and_sharding_arithmetic():
    tiny = dict(model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
                intermediate_size=2048, vocab_size=32000)
    spec = spec_from_config(tiny, quant="bf16", tp=2, context_len=100)
    assert spec.kv_cache_bytes_per_token == 2 * 4 * 64 * 2 * 8 / 2  # K and V, 4 heads split over 2 ranks
    assert spec.kv_cache_read_bytes == spec.kv_cache_bytes_per_token * 100
    eight = spec_from_config(tiny, quant="bf16", tp=8)
    assert eight.kv_cache_bytes_per_token == 2 * 1 * 64 * 2 * 8  # 4 KV heads on 8 ranks: one whole head each
    by = {g.component: g for g in spec.groups}
    assert by["routed_experts"].params_per_token == 8 * 3 * 1024 * 256 * 8
    assert by["router"].rank_bytes_per_token(2, ideal=False) == 64 * 1024 * 8 * 2  # replicated
    assert by["routed_experts"].rank_bytes_per_token(2, ideal=False) == 8 * 3 * 1024 * 256 * 8 * 2 / 2
    assert spec.allreduce_per_step == 2 * 8 + 1 and spec.allreduce_message_bytes == 1024 * 2


def test_dense_nvfp4_quantizes_linear_layers_but_not_lm_head():
    spec = spec_from_config(LLAMA3_8B, quant="nvfp4", tp=1)
    formats = {g.weight_class: g.dtype for g in spec.groups}
    assert formats["attention"] == formats["dense_mlp"] == "nvfp4"
    assert formats["lm_head"] == formats["embedding"] == "bf16"


def test_bad_model_inputs(tmp_path):
    with pytest.raises(ProfattrError, match="glm-5-nvfp4"):
        load_model("no-such-model", tp=1)
    broken = tmp_path / "config.json"
    broken.write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": 7168}))
    with pytest.raises(ProfattrError, match="missing fields: num_hidden_layers, vocab_size"):
        load_model(str(broken), tp=1, quant="fp8")
    with pytest.raises(ProfattrError, match="--quant is required"):
        load_model(str(broken), tp=1)
    with pytest.raises(ProfattrError, match="tp 3 does not divide num_attention_heads 64"):
        load_model("glm-5-nvfp4", tp=3)
    with pytest.raises(ProfattrError, match="unknown quantization 'int3'; valid: bf16"):
        load_model("glm-5-nvfp4", tp=8, quant="int3")
    unknown = tmp_path / "other.json"
    unknown.write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ProfattrError, match="'mamba' is not supported; supported: glm_moe_dsa"):
        load_model(str(unknown), tp=1, quant="bf16")
    with pytest.raises(ProfattrError, match="missing fields: model_type"):
        spec_from_config({}, quant="bf16", tp=1)


def test_cli_limit_json_and_table(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["limit", "--model", "glm-5-nvfp4", "--hardware", "rtx-pro-6000", "--tp", "8",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "profattr.limit/1"
    assert {"weights_only_ms", "realistic_ms", "terms", "assumptions", "sensitivity"} <= set(data)
    assert all({"term", "ms"} <= set(t) for t in data["terms"])
    realistic = sum(t["ms"] for t in data["terms"] if t["floor"] == "realistic")
    assert realistic == pytest.approx(data["realistic_ms"])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA3_8B))
    table = runner.invoke(cli, ["limit", "-m", str(config), "--quant", "bf16", "-H", "h100", "--tp", "2"])
    assert table.exit_code == 0, table.output
    assert "Weights-only floor" in table.output and "Sensitivity" in table.output
    # 8.03B params less the embedding table, plus one row, BF16 over 2 GPUs at 3.35 TB/s
    expected = (8_030_261_248 - 128256 * 4096 + 4096) * 2 / 2 / 3.35e12 * 1e3
    assert f"Weights-only floor: {expected:.3f} ms/token" in table.output


def test_cli_limit_bad_input():
    runner = CliRunner()
    bad = runner.invoke(cli, ["limit", "-m", "glm-5-nvfp4", "-H", "tpu-v5", "--tp", "8"])
    assert bad.exit_code == 2
    assert "unknown hardware 'tpu-v5'; valid: b200, h100, h200, rtx-5090, rtx-pro-6000-server, rtx-pro-6000-ws" in bad.output
    assert "Traceback" not in bad.output
