"""Kernel taxonomy: every listed kernel name lands in its stated category; rules files load and fail cleanly; the
committed real captures are covered and their NVTX contexts classify as the workload's source says.

The expected categories come from tests/data/taxonomy/kernel_names.tsv (names read from public sources and
profiles, finer ids mapped to profattr ids by research_category_map.tsv), from tests/data/taxonomy/glm_expected.tsv
(every kernel of the GLM-5-shaped SGLang captures with the category and family read from the code that launches it)
and from SQL on the captures, not from the classifier.
"""
from __future__ import annotations

import csv
import gzip
import json
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ALL_CAPTURES, EXAMPLES, GLM_CAPTURES

from profattr.cli import cli
from profattr.errors import ProfattrError
from profattr.taxonomy import classify as classify_module
from profattr.taxonomy.classify import RULES_DIR, load_rules
from profattr.taxonomy.ruleset import UNCLASSIFIED

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


# --- the committed real captures (examples/h200) -----------------------------------------------------------------

def test_rule_sources_cite_public_material(rules):
    # sources name a repository and path, an issue or PR, or a committed capture; no note outside the repository
    for rule in rules.rules:
        text = f"{rule.source} {rule.note}".lower()
        assert "research" not in text, rule.id


KERNEL_NAME_PAIRS = """
SELECT DISTINCT k.demangledName, k.shortName, d.value, s.value
FROM CUPTI_ACTIVITY_KIND_KERNEL k
LEFT JOIN StringIds d ON d.id = k.demangledName
LEFT JOIN StringIds s ON s.id = k.shortName"""
TOTAL_KERNEL_NS = 'SELECT SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL'
MIN_COVERAGE = 0.95


def _ro(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_taxonomy_covers_each_committed_capture(name, rules, export_example):
    """At least 95 % of the kernel time of every committed capture is classified by name alone (no NVTX context);
    the unclassified time is summed in SQL over the (demangled, short) name pairs the rules leave unclassified."""
    conn = _ro(export_example(name))
    try:
        pairs = conn.execute(KERNEL_NAME_PAIRS).fetchall()
        left = [(dem_id, short_id) for dem_id, short_id, dem, short in pairs
                if rules.match(dem or short or "", frozenset(), short=short) is None]
        total_ns = conn.execute(TOTAL_KERNEL_NS).fetchone()[0]
        unclassified_ns = 0
        if left:
            values = ", ".join("(?, ?)" for _ in left)
            unclassified_ns = conn.execute(
                f'SELECT COALESCE(SUM("end" - start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL '
                f"WHERE (demangledName, shortName) IN (VALUES {values})",
                [i for pair in left for i in pair]).fetchone()[0]
    finally:
        conn.close()
    assert total_ns > 0
    coverage = 1 - unclassified_ns / total_ns
    assert coverage >= MIN_COVERAGE, f"{name}: {coverage:.1%} of kernel time classified"


LAUNCHES = """
SELECT d.value, s.value, r.globalTid, r.start
FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid & -16777216) = k.globalPid
JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName
ORDER BY r.start"""
RANGES = """
SELECT n.globalTid, n.start, n."end", COALESCE(t.value, n.text)
FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId
WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL ORDER BY n.start"""


def _launch_contexts(path) -> list:
    """(short name, demangled name, [texts of the NVTX ranges enclosing the launch on its thread]) per kernel."""
    conn = _ro(path)
    try:
        launches = conn.execute(LAUNCHES).fetchall()
        ranges = conn.execute(RANGES).fetchall()
    finally:
        conn.close()
    out, active, i = [], {}, 0
    for dem, short, tid, t in launches:  # sweep in time order: open ranges that started, drop ones that ended
        while i < len(ranges) and ranges[i][1] <= t:
            rtid, start, end, text = ranges[i]
            active.setdefault(rtid, []).append((end, text))
            i += 1
        mine = active.get(tid, [])
        mine[:] = [(end, text) for end, text in mine if end >= t]
        out.append((short, dem, [text for _end, text in mine if text]))
    return out


def _module(texts) -> str:
    """The innermost module path of the workload's NVTX text ({'Module': 'model.model.layers.3.mlp.topk', ...})."""
    found = [m.group(1) for m in (re.search(r"'Module': '([^']+)'", t) for t in texts) if m]
    return max(found, key=len) if found else ""


def test_nvtx_contexts_on_the_eager_workload_capture(rules, export_example):
    """What each module of profattr.workloads.moe_decode runs, as its source says: TopK = softmax, top-k (with its
    sort), renormalisation; rotary_emb = cos/sin index_select and rotate-half arithmetic; attn = KV-cache scatter_
    and SDPA; embed_tokens = the embedding lookup. The NVTX module ranges around each launch come from SQL."""
    seen: dict = {}
    for short, dem, texts in _launch_contexts(export_example("wl-eager-grouped")):
        module = re.sub(r"layers\.\d+", "layers.N", _module(texts))
        category = rules.classify(dem, rules.contexts_for(texts), short=short)
        seen.setdefault(module, {}).setdefault(short, set()).add(category)
    topk = seen["model.model.layers.N.mlp.topk"]
    assert {"gatherTopK", "bitonicSortKVInPlace", "softmax_warp_forward"} <= set(topk)
    assert set().union(*topk.values()) == {"moe.routing"}
    rope = seen["model.model.layers.N.self_attn.rotary_emb"]
    assert "indexSelectSmallIndex" in rope and set().union(*rope.values()) == {"attention.rope"}
    attn = seen["model.model.layers.N.self_attn.attn"]
    assert attn["_scatter_gather_elementwise_kernel"] == {"attention.kv_write"}
    assert set().union(*attn.values()) == {"attention.kv_write", "attention.decode"}
    assert seen["model.model.embed_tokens"] == {"indexSelectSmallIndex": {"embedding"}}
    experts = seen["model.model.layers.N.mlp.experts"]
    assert experts["indexSelectSmallIndex"] == {"moe.permute"} and experts["reduce_kernel"] == {"moe.finalize"}


def test_sglang_captures_name_their_kernels(rules, export_example):
    """Kernels that only the SGLang 0.5.16 captures show, by name alone."""
    names = {}
    for capture in ("sglang-triton-bs1", "sglang-triton_kernel-bs1"):
        conn = _ro(export_example(capture))
        try:
            for _d, _s, dem, short in conn.execute(KERNEL_NAME_PAIRS):
                names[short] = rules.classify(dem, short=short)
        finally:
            conn.close()
    assert names["_router_triton_kernel"] == "moe.routing"
    assert names["get_num_kv_splits_triton"] == "attention.other"
    assert names["fused_rope_store_kernel"] == "attention.kv_write"
    assert names["DeviceScanKernel"] == names["DeviceScanInitKernel"] == "other"
    assert names["_reduce"] == "moe.finalize"
    assert names["_matmul_ogs_NNN_fp32xbf16xbf16_16x256x64x4"] == "moe.gemm"


# --- the GLM-5-shaped SGLang decode (examples/h200/glm5): MLA + DSA indexer, 256 experts, FP8 block-quantized ------

GLM_EXPECTED_ROWS = _read_tsv(DATA / "glm_expected.tsv")
GLM_EXPECTED = [(re.compile(pattern), category, re.compile(family)) for pattern, category, family, _source
                in GLM_EXPECTED_ROWS]
KERNEL_NS_BY_NAME = """
SELECT d.value, s.value, SUM(k."end" - k.start)
FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName
GROUP BY k.demangledName, k.shortName"""
MIN_GLM_SHARE = 0.99


def _glm_expected_row(demangled: str):
    """Index of the first glm_expected.tsv row whose pattern matches the demangled name, or None."""
    return next((i for i, (rx, _c, _f) in enumerate(GLM_EXPECTED) if rx.search(demangled)), None)


def _kernel_ns_by_name(path) -> tuple:
    """([(demangled, short, kernel ns)], total kernel ns) of the export at PATH, both from SQL."""
    conn = _ro(path)
    try:
        rows = conn.execute(KERNEL_NS_BY_NAME).fetchall()
        total_ns = conn.execute(TOTAL_KERNEL_NS).fetchone()[0]
    finally:
        conn.close()
    return rows, total_ns


def test_glm_expected_table_is_well_formed(rules):
    assert len(GLM_EXPECTED_ROWS) >= 40
    for pattern, category, family, source in GLM_EXPECTED_ROWS:
        assert category in rules.categories and category != UNCLASSIFIED, pattern
        assert source, pattern
        re.compile(pattern)
        re.compile(family)


@pytest.mark.parametrize("name", GLM_CAPTURES)
def test_glm_capture_time_lands_in_the_expected_family(name, rules, export_example):
    """Per (demangled, short) name pair the kernel time comes from SQL; at least 99 % of it must be classified and at
    least 99 % must land in the category and family glm_expected.tsv gives for that name. Every kernel name of the
    capture must have a row there."""
    rows, total_ns = _kernel_ns_by_name(export_example(name))
    assert total_ns > 0 and sum(ns for *_names, ns in rows) == total_ns
    classified_ns = expected_ns = 0
    missing, wrong = [], []
    for demangled, short, ns in rows:
        rule = rules.match(demangled, frozenset(), short=short)
        if rule is not None:
            classified_ns += ns
        index = _glm_expected_row(demangled)
        if index is None:
            missing.append(short)
            continue
        _rx, category, family = GLM_EXPECTED[index]
        if rule is not None and rule.category == category and family.fullmatch(rule.family):
            expected_ns += ns
        else:
            wrong.append((short, rule.id if rule else None, ns))
    assert not missing, f"{name}: kernels without a row in glm_expected.tsv: {sorted(set(missing))}"
    assert classified_ns / total_ns >= MIN_GLM_SHARE, f"{name}: {classified_ns / total_ns:.2%} classified"
    share = expected_ns / total_ns
    assert share >= MIN_GLM_SHARE, f"{name}: {share:.2%} in the expected family; elsewhere: {wrong}"


def test_glm_expected_rows_are_all_seen(export_example):
    """No row of glm_expected.tsv is dead: each one names a kernel that some GLM capture runs."""
    used = set()
    for name in GLM_CAPTURES:
        rows, _total = _kernel_ns_by_name(export_example(name))
        used.update(_glm_expected_row(demangled) for demangled, _short, _ns in rows)
    unused = [GLM_EXPECTED_ROWS[i][0] for i in range(len(GLM_EXPECTED_ROWS)) if i not in used]
    assert not unused, unused


# the six names the issue lists as misfiled before (issue #9 item 4), each read back from a capture that runs it
GLM_MISFILED = [
    ("glm5/glm-cutlass-bs1-r1", "get_group_gemm_starts", "moe.permute", "sglang_cutlass_moe", "(?i)moe"),
    ("glm5/glm-cutlass-bs4-r1", "apply_shuffle_mul_sum_kernel", "moe.finalize", "sglang_cutlass_moe", "(?i)moe"),
    ("glm5/glm-cutlass-bs8-r1", "shuffleRowsKernel", "moe.permute", "sglang_cutlass_moe", "(?i)moe"),
    ("glm5/glm-triton-bs1-r1", "topk_main_kernel", "attention.indexer", "sglang_dsa_indexer", "(?i)indexer"),
    ("glm5/glm-triton-eager", "fused_store_indexer_cache", "attention.indexer", "sglang_dsa_indexer", "(?i)indexer"),
    ("glm5/glm-deep_gemm-r1", "silu_mul_quant_varlen_kernel", "moe.activation", "sglang_moe_activation", "(?i)moe"),
]


@pytest.mark.parametrize("capture,short,category,family,context", GLM_MISFILED,
                         ids=[row[1] for row in GLM_MISFILED])
def test_glm_formerly_misfiled_kernels(rules, export_example, capture, short, category, family, context):
    conn = _ro(export_example(capture))
    try:
        names = [d for (d,) in conn.execute(
            "SELECT DISTINCT d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName "
            "JOIN StringIds s ON s.id = k.shortName WHERE s.value = ?", (short,))]
    finally:
        conn.close()
    assert names, f"{capture} runs no {short}"
    # the NVTX range the kernel runs in (the MoE block or the DSA indexer) must not pull it elsewhere either
    ranges = {"(?i)moe": ["model.model.layers.3.mlp", "model.model.layers.3.mlp.experts"],
              "(?i)indexer": ["model.model.layers.3.self_attn", "model.model.layers.3.self_attn.indexer"]}[context]
    for demangled in names:
        for contexts in (frozenset(), rules.contexts_for(ranges)):
            rule = rules.match(demangled, contexts, short=short)
            assert rule is not None and (rule.category, rule.family) == (category, family), (demangled, rule)
    assert rules.classify("void get_group_gemm_starts<cutlass::float_e4m3_t, cutlass::bfloat16_t, float>(int *)") \
        != "gemm.fp8"


def test_glm_eager_nvtx_ranges_agree_with_the_source(rules, export_example):
    """What each module of SGLang's GlmMoeDsaForCausalLM runs, from the layerwise NVTX ranges of the eager twin: the
    MoE block is all moe.* (the shared JIT SiLU*mul and the per-token-group FP8 quant are refiled there, as the Triton
    runner calls them between the expert GEMMs), the gate GEMMs (router_gemm_kernel, the prefill cuBLAS fallback) are
    routing, the shared expert stays dense, the DSA indexer's own kernels are attention.indexer while its wq_b/wk/
    weights_proj projections stay dense GEMMs."""
    seen: dict = {}
    for short, dem, texts in _launch_contexts(export_example("glm5/glm-triton-eager")):
        module = re.sub(r"layers\.\d+", "layers.N", _module(texts))
        rule = rules.match(dem, rules.contexts_for(texts), short=short)
        assert rule is not None, (module, dem)
        seen.setdefault(module, {}).setdefault(short, set()).add(rule.category)

    def categories(module: str) -> set:
        """Categories of the kernels launched inside MODULE or its submodules."""
        return set().union(*(c for m, kernels in seen.items() if m == module or m.startswith(module + ".")
                             for c in kernels.values()))

    layer = "model.model.layers.N."
    experts = seen[layer + "mlp.experts"]
    assert experts["fused_moe_kernel"] == {"moe.gemm"}
    assert experts["act_and_mul_kernel"] == {"moe.activation"}
    assert experts["per_token_group_quant_8bit_v2_kernel"] == {"moe.quant"}
    assert experts["moe_align_block_size_kernel"] == experts["count_and_sort_expert_tokens_kernel"] == {"moe.permute"}
    assert experts["triton_per_fused_copy__mul_sum_0"] == {"moe.finalize"}
    assert categories(layer + "mlp.experts") == {"moe.gemm", "moe.activation", "moe.quant", "moe.permute",
                                                  "moe.finalize"}
    gate = seen[layer + "mlp.gate"]
    assert {"router_gemm_kernel", "nvjet_sm90_tss_64x32_64x16_4x2_h_bz_splitK_TNT", "splitKreduce_kernel"} <= set(gate)
    assert categories(layer + "mlp.gate") == {"moe.routing"}
    assert seen[layer + "mlp.topk"] == {"_router_triton_kernel": {"moe.routing"}}
    assert categories(layer + "mlp.shared_experts") == {"gemm.fp8", "quant", "activation"}
    assert categories(layer + "mlp.gate_up_proj") | categories(layer + "mlp.down_proj") == {"gemm.fp8", "quant"}
    assert categories(layer + "mlp.act_fn") == {"activation"}

    indexer = seen[layer + "self_attn.indexer"]
    for kernel in ("sm90_fp8_paged_mqa_logits", "fast_hadamard_transform_kernel", "_act_quant_kernel",
                   "fused_store_indexer_cache", "topk_main_kernel"):
        assert indexer[kernel] == {"attention.indexer"}, kernel
    assert indexer["nvjet_sm90_tss_64x8_64x16_1x1_h_bz_splitK_TNT"] == {"gemm.bf16"}  # weights_proj
    assert categories(layer + "self_attn.indexer.wq_b") | categories(layer + "self_attn.indexer.wk") == \
        {"gemm.fp8", "quant"}
    assert seen[layer + "self_attn.indexer.k_norm"]["vectorized_layer_norm_kernel"] == {"norm"}
    assert categories(layer + "self_attn.indexer.rotary_emb") == categories(layer + "self_attn.rotary_emb") == \
        {"attention.rope"}
    attn = seen[layer + "self_attn.attn_mqa"]
    assert attn["flash_fwd_splitkv_mla_fp8_sparse_kernel"] == attn["flash_fwd_mla_combine_kernel"] == \
        {"attention.decode"}
    assert attn["_quantize_k_cache_fast_kernel"] == attn["set_mla_kv_buffer_kernel"] == {"attention.kv_write"}
    assert attn["concat_mla_absorb_q_kernel"] == {"attention.other"}


def test_glm_torch_profiler_and_ncu_names_classify(rules):
    """The torch-profiler twin spells names the c++filt way ((anonymous namespace), <true, 1>); the ncu drills drop
    namespaces. Both must classify as the nsys spelling does."""
    with gzip.open(EXAMPLES / "glm5" / "glm-triton-torch-r1-TP-0.trace.json.gz", "rt") as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("cat") == "kernel"]
    total_us = sum(e["dur"] for e in events)
    classified_us = sum(e["dur"] for e in events if rules.match(e["name"]) is not None)
    assert events and classified_us / total_us >= MIN_GLM_SHARE
    names = {e["name"] for e in events}

    def categories(needle: str) -> set:
        return {rules.classify(n) for n in names if needle in n}

    assert categories("::topk_main_kernel<") == categories("::topk_plan(") == {"attention.indexer"}
    assert categories("::fused_store_indexer_cache<") == {"attention.indexer"}
    assert categories("::act_and_mul_kernel<") == {"activation"}
    assert categories("::fused_rope_kernel<") == {"attention.rope"}
    assert categories("flash_fwd_splitkv_mla_fp8_sparse_kernel") == {"attention.decode"}
    for drill in ("glm-drill-cutlass", "glm-drill-triton", "glm-drill-triton-moe"):
        with open(EXAMPLES / "glm5" / f"{drill}.ncu.csv", newline="", encoding="utf-8") as handle:
            names = {row["Kernel Name"] for row in csv.DictReader(handle) if row["Kernel Name"]}
        assert names and all(rules.match(n) is not None for n in names), (drill, names)
