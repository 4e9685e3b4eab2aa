"""Kernel taxonomy: every name the research lists lands in its stated category; rules files load and fail cleanly.

The expected categories come from the kernel-taxonomy research (tests/data/taxonomy/kernel_names.tsv, with the
research's ids mapped to profattr ids by research_category_map.tsv), not from the classifier.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from profattr.errors import ProfattrError
from profattr.taxonomy import classify as classify_module
from profattr.taxonomy.classify import RULES_DIR, UNCLASSIFIED, load_rules

DATA = Path(__file__).parent / "data" / "taxonomy"

# the category ids other parts of profattr rely on
REQUIRED_CATEGORIES = {
    "gemm.fp4", "gemm.fp8", "gemm.bf16", "moe.routing", "moe.permute", "moe.gemm", "moe.finalize",
    "attention.decode", "attention.indexer", "attention.kv_write", "attention.rope", "comm.allreduce",
    "comm.collective", "norm", "activation", "quant", "sampling", "embedding", "memory.copy", "memory.set",
    "elementwise", "other", "unclassified",
}
MOE_RANGE = "model.layers.3.mlp.experts"
NVJET_BF16 = "nvjet_sm90_tst_64x8_64x16_2x2_h_bz_TNT"


def _read_tsv(path: Path) -> list[list[str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        rows.append(line.split("\t"))
    return rows


RESEARCH_MAP = {row[0]: row[1] for row in _read_tsv(DATA / "research_category_map.tsv")}
NAME_ROWS = _read_tsv(DATA / "kernel_names.tsv")


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def _expected(category: str, rules) -> str:
    return category if category in rules.categories else RESEARCH_MAP[category]


@pytest.mark.parametrize("section,expected,name,nvtx", NAME_ROWS,
                         ids=[f"{row[0]}:{i}:{row[2][:40]}" for i, row in enumerate(NAME_ROWS)])
def test_listed_name_lands_in_its_category(rules, section, expected, name, nvtx):
    contexts = rules.contexts_for(nvtx.split(" > ") if nvtx else [])
    assert rules.classify(name, contexts) == _expected(expected, rules), (section, name, nvtx)


def test_name_list_covers_every_section_and_the_h200_names():
    sections = {row[0] for row in NAME_ROWS}
    for section in ["2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13",
                    "2.14", "2.15", "2.16", "2.17", "2.18", "3", "4", "h200"]:
        assert section in sections
    h200 = "\n".join(row[2] for row in NAME_ROWS if row[0] == "h200")
    for name in ["nvjet_sm90_", "sm90_xmma_", "pytorch_flash::flash_fwd_kernel", "flash_fwd_splitkv_kernel",
                 "cudnn_generated_fort_native_sdpa_sm90", "fmha_cutlassF", "cunn_SoftMaxForward",
                 "vectorized_elementwise_kernel", "at::native::elementwise_kernel", "reduce_kernel",
                 "index_elementwise_kernel", "indexSelectLargeIndex", "gatherTopK", "sbtopk", "radixSort",
                 "CatArrayBatchedCopy", "RowwiseMomentsCUDAKernel", "_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1",
                 "_fwd_kernel_stage2", "FusedAddRMSNormKernel", "RMSNormKernel", "rmsnorm", "apply_rotary_pos_emb",
                 "rotary_embedding_kernel", "BatchQKApplyRotaryPosIdsCosSinCache", "store_kvcache", "set_kv_buffer",
                 "fused_moe_kernel", "moe_align_block_size_kernel", "count_and_sort_expert_tokens_kernel",
                 "moe_sum_reduce", "_moe_sum_reduce_kernel", "act_and_mul_kernel", "silu_and_mul", "_matmul_ogs",
                 "_topk_forward", "_combined_routing", "_finalize_matmul", "_sum_bitmatrix_rows",
                 "_routing_compute_indx", "argmax", "multinomial", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                 "ncclKernel_AllReduce_RING_LL_Sum_bfloat16", "cross_device_reduce_1stage", "cross_device_reduce_2stage"]:
        assert name in h200, name


def test_research_map_targets_are_categories(rules):
    for research_id, ours in RESEARCH_MAP.items():
        assert ours in rules.categories, research_id
    for row in NAME_ROWS:
        assert row[1] in rules.categories or row[1] in RESEARCH_MAP, row


def test_categories_file_lists_the_required_ids_with_descriptions(rules):
    assert REQUIRED_CATEGORIES <= set(rules.categories)
    for category in rules.categories.values():
        assert category.description, category.id
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)?", category.id)


def test_shipped_rules_are_sourced_and_unique(rules):
    ids = [r.id for r in rules.rules]
    assert len(ids) == len(set(ids))
    for rule in rules.rules:
        assert rule.family and rule.source, rule.id
        assert rule.evidence in ("observed", "source", "derived"), rule.id
        assert rule.category in rules.categories and rule.category != UNCLASSIFIED, rule.id
        assert rule.origin.startswith(str(RULES_DIR)), rule.id
    assert {p.name for p in RULES_DIR.glob("*.toml")} >= {"categories.toml", "nccl.toml", "cublas.toml",
                                                          "cutlass.toml", "cute_dsl.toml", "flashinfer.toml",
                                                          "sglang.toml", "triton.toml", "deepgemm.toml",
                                                          "flashmla.toml", "flash_attention.toml", "trtllm.toml",
                                                          "pytorch.toml"}


def test_context_rules_come_before_plain_rules(rules):
    has_context = [r.nvtx is not None for r in rules.rules]
    first_plain = has_context.index(False)
    assert any(has_context) and not any(has_context[first_plain:])
    assert len(rules.context_patterns) == len(set(rules.context_patterns)) >= 4


def test_nvtx_context_refiles_a_cublas_gemm(rules):
    assert rules.classify(NVJET_BF16) == "gemm.bf16"
    moe = rules.contexts_for(["model.layers.3.mlp", MOE_RANGE])
    assert rules.classify(NVJET_BF16, moe) == "moe.gemm"
    router = rules.contexts_for(["model.layers.3.mlp", "model.layers.3.mlp.gate"])
    assert rules.classify(NVJET_BF16, router) == "moe.routing"
    # gate_up_proj is not the router, a shared expert is a dense GEMM
    assert rules.classify(NVJET_BF16, rules.contexts_for(["model.layers.1.mlp.gate_up_proj"])) == "gemm.bf16"
    assert rules.classify(NVJET_BF16, rules.contexts_for(["model.layers.3.mlp.shared_experts"])) == "gemm.bf16"
    rule = rules.match(NVJET_BF16, moe)
    assert (rule.id, rule.family, rule.category) == ("cublas.nvjet.moe", "cublas_nvjet", "moe.gemm")
    # a context nobody asked for changes nothing; a kernel with a specific rule keeps it inside the MoE range
    assert rules.classify(NVJET_BF16, frozenset({"no such pattern"})) == "gemm.bf16"
    assert rules.classify("router_gemm_kernel<bf16,128,8,16,256,7168>", moe) == "moe.routing"
    assert rules.match("count_and_sort_expert_tokens_kernel", moe).family == "triton_fused_moe"


def test_short_name_is_the_fallback(rules):
    assert rules.classify("void unknown_namespace::thing<1>(int)") == UNCLASSIFIED
    assert rules.classify("void unknown_namespace::thing<1>(int)", short="fused_moe_kernel") == "moe.gemm"
    # the demangled name wins when it matches
    assert rules.classify(NVJET_BF16, short="fused_moe_kernel") == "gemm.bf16"


def test_classify_many_keeps_order_and_matches_each_name_once(rules, monkeypatch):
    names = ["fused_moe_kernel", NVJET_BF16, "fused_moe_kernel", "nothing_known", NVJET_BF16]
    fresh = load_rules()
    calls = []
    original = fresh._first
    monkeypatch.setattr(fresh, "_first", lambda name, ctx: calls.append(name) or original(name, ctx))
    assert fresh.classify_many(names) == ["moe.gemm", "gemm.bf16", "moe.gemm", UNCLASSIFIED, "gemm.bf16"]
    assert sorted(calls) == sorted(set(names))


def _write(tmp_path: Path, text: str, name: str = "user.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_user_rule_overrides_a_shipped_rule(tmp_path):
    path = _write(tmp_path, """
[[category]]
id = "gemm.custom"
description = "a user's own GEMM bucket"

[[rule]]
id = "cublas.nvjet.bf16"
category = "gemm.fp8"
pattern = '^nvjet_sm90_tst_'

[[rule]]
id = "mine.fused_moe"
category = "gemm.custom"
pattern = 'fused_moe_kernel'
family = "my_backend"
""")
    rules = load_rules([path])
    rule = rules.match(NVJET_BF16)
    assert (rule.id, rule.category, rule.user) == ("cublas.nvjet.bf16", "gemm.fp8", True)
    assert [r.id for r in rules.rules].count("cublas.nvjet.bf16") == 1
    assert rules.match("fused_moe_kernel").family == "my_backend"
    assert rules.classify("fused_moe_kernel") == "gemm.custom"
    # shipped rules still apply to everything else
    assert rules.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "comm.allreduce"
    assert load_rules().classify("fused_moe_kernel") == "moe.gemm"


def test_bad_regex_names_file_and_line(tmp_path):
    path = _write(tmp_path, """# my rules
[[rule]]
id = "ok"
category = "norm"
pattern = 'my_norm'

[[rule]]
id = "broken"
category = "norm"
pattern = 'my_(norm'
""")
    with pytest.raises(ProfattrError) as info:
        load_rules([path])
    message = info.value.format_message()
    assert f"{path}:10:" in message and "broken" in message and "\n" not in message


def test_bad_nvtx_regex_names_file_and_line(tmp_path):
    path = _write(tmp_path, "[[rule]]\nid = 'x'\ncategory = 'norm'\npattern = 'a'\nnvtx = '(?<'\n")
    with pytest.raises(ProfattrError, match=re.escape(f"{path}:5:")):
        load_rules([path])


@pytest.mark.parametrize("text,line,needle", [
    ("[[rule]]\nid = 'x'\ncategory = norm\npattern = 'a'\n", 3, "invalid TOML"),
    ("[[rule]]\nid = 'x'\ncategory = 'norm'\npattern = 'a\n", 4, "invalid TOML"),
    ("[[rule]]\nid = 'x'\ncategory = 'no.such'\npattern = 'a'\n", 3, "unknown category"),
    ("[[rule]]\nid = 'x'\ncategory = 'norm'\npatern = 'a'\n", 4, "unknown key"),
    ("[[rule]]\nid = 'x'\ncategory = 'norm'\n", 1, "'pattern' is required"),
    ("[[rule]]\nid = 'x'\ncategory = 'norm'\npattern = 'a'\npriority = 'high'\n", 5, "priority"),
    ("\n[[rule]]\nid = 'x'\ncategory = 'norm'\npattern = 'a'\n[[rule]]\nid = 'x'\ncategory = 'norm'\npattern = 'b'\n",
     6, "already defined"),
])
def test_bad_rules_file_names_file_and_line(tmp_path, text, line, needle):
    path = _write(tmp_path, text)
    with pytest.raises(ProfattrError) as info:
        load_rules([path])
    message = info.value.format_message()
    assert message.startswith(f"{path}:{line}:") and needle in message


def test_missing_rules_file(tmp_path):
    with pytest.raises(ProfattrError, match="cannot read rules file"):
        load_rules([tmp_path / "absent.toml"])


def test_cli_bad_regex_is_one_line_exit_2(tmp_path):
    path = _write(tmp_path, "[[rule]]\nid = 'broken'\ncategory = 'norm'\npattern = '(('\n")
    result = CliRunner().invoke(cli, ["classify", "--rules", str(path), "fused_moe_kernel"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"{path}:4:" in lines[0]
    assert "Traceback" not in result.output


def test_cli_reads_stdin_and_writes_json_in_input_order():
    names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "mystery_kernel", "_fwd_grouped_kernel_stage1",
             "[CUDA memcpy Device-to-Device]", "fused_moe_kernel"]
    result = CliRunner().invoke(cli, ["classify", "-", "--format", "json"], input="\n".join(names) + "\n\n")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == names
    assert [r["category"] for r in rows] == ["comm.allreduce", UNCLASSIFIED, "attention.decode", "memory.copy",
                                            "moe.gemm"]
    assert rows[1]["family"] is None and rows[1]["rule"] is None
    assert rows[0]["family"] == "nccl" and rows[0]["rule"] == "nccl.allreduce"


def test_cli_table_and_nvtx_option():
    result = CliRunner().invoke(cli, ["classify", NVJET_BF16, "--nvtx", MOE_RANGE])
    assert result.exit_code == 0, result.output
    header, row = result.output.strip().splitlines()
    assert header.split() == ["category", "family", "rule", "name"]
    assert row.split() == ["moe.gemm", "cublas_nvjet", "cublas.nvjet.moe", NVJET_BF16]


def test_shipped_rules_are_parsed_once():
    assert load_rules().rules == load_rules().rules
    assert classify_module._shipped.cache_info().hits >= 1
