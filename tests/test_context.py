"""Kernels no rule was written from: the kernel inventories, classification by launch context, the evidence section
of budgets and reports, `classify --explain`, `taxonomy suggest`, and their bad input.

Expected categories come from the inventories' source layout (profattr/taxonomy/inventory/sources.toml), from the
library source files named beside each name below, or from the launching torch operator / NVTX module read in the
test from the trace itself (JSON parsing of the torch trace, SQL on the nsys export), never from profattr's output.
"""
from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from profattr.taxonomy.classify import load_rules
from profattr.taxonomy.ruleset import RuleSet
from profattr.taxonomy.lookup import Inventory

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "profattr" / "taxonomy" / "inventory"
PUBLIC = Path(__file__).parent / "data" / "public" / "hta"
ALEXNET = PUBLIC / "benchmark_result_2869224_1695835535_trace.json.gz"
EAGER = "glm5/glm-triton-eager"
INVENTORY_KEYS = ("name", "category", "family", "library", "version", "source")
# family agreement of the shipped name rules alone (no inventory lookup) on each library's inventory
# (scripts/score-kernel-inventory --no-inventory), a little under what they reach: a rule change that loses ground
# on a library fails here. Libraries of fewer than 40 kernels (DeepGEMM, FlashMLA) are too small for a floor.
FAMILY_FLOOR = {"aten": 0.58, "cublas": 0.97, "cutlass": 0.43, "flashinfer": 0.80, "mamba": 0.93, "nccl": 0.97,
                "sglang": 0.55, "trtllm": 0.73, "vllm": 0.53}
INVENTORIES = sorted(p.stem for p in INVENTORY.glob("*.tsv"))

def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(*args) -> str:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def one_line_error(result, needle: str = "") -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert needle in lines[0], lines[0]
    return lines[0]


def read_inventory(library: str) -> list[dict]:
    lines = [line for line in (INVENTORY / f"{library}.tsv").read_text().splitlines() if line and line[0] != "#"]
    return [dict(zip(INVENTORY_KEYS, row)) for row in csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)]


@pytest.fixture(scope="module")
def rules():
    return load_rules()


# --- the inventories -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("library", INVENTORIES)
def test_inventory_rows_are_well_formed(library, rules):
    rows = read_inventory(library)
    assert rows
    for row in rows:
        assert len(row) == len(INVENTORY_KEYS) and all(row.values()), row
        assert row["library"] == library and row["category"] in rules.categories, row
        assert row["category"] != "unclassified" and ": " in row["source"], row
    assert len({r["name"] for r in rows}) == len(rows)


def _owned(rows, rules):
    """The rows the inventories decide: identifiers with one category over all inventories, not CUB's."""
    return [r for r in rows if rules.inventory.find(r["name"]) is not None]


@pytest.mark.parametrize("library", INVENTORIES)
def test_every_inventoried_kernel_classifies_to_its_category(library, rules):
    """Each kernel a library's source defines lands in the category where that library keeps it: by a library's
    own name rule, or by the inventory where no such rule covers it; a name rule that says otherwise is a
    contradiction to resolve (scripts/score-kernel-inventory --conflicts lists none)."""
    rows = read_inventory(library)
    owned = _owned(rows, rules)
    assert len(owned) >= 0.85 * len(rows)  # few identifiers are shared with another category, or CUB's
    misses = [(r["name"], r["category"], rules.classify(r["name"])) for r in owned
              if rules.classify(r["name"]) != r["category"]]
    assert not misses, misses[:20]


def test_shared_identifiers_are_left_to_the_rules(rules):
    """An identifier two inventories file differently (a bare ``Marlin``: sglang's dense GEMM and vLLM's expert
    GEMM as one mangled name each) is no inventory's to decide."""
    by_name = {}
    for library in INVENTORIES:
        for row in read_inventory(library):
            by_name.setdefault(row["name"], set()).add(row["category"])
    shared = [n for n, cats in by_name.items() if len(cats) > 1 and "::" not in n]
    assert shared
    assert all(rules.inventory.find(n) is None for n in shared)
    assert rules.inventory.find("void cub::DeviceRadixSortOnesweepKernel<int>(int*)") is None


@pytest.mark.parametrize("library", sorted(FAMILY_FLOOR))
def test_name_rules_alone_keep_their_ground(library, rules):
    """Without the inventory lookup, the name rules on a library's kernels: the ground a release's new kernels,
    which no inventory lists yet, start from."""
    alone = RuleSet(rules.rules, rules.categories, rules.context_rules, Inventory(()))
    rows = read_inventory(library)
    misses = [(r["name"], r["category"], alone.classify(r["name"])) for r in rows
              if alone.classify(r["name"]).split(".")[0] != r["category"].split(".")[0]]
    agreement = 1 - len(misses) / len(rows)
    assert agreement >= FAMILY_FLOOR[library], (library, round(agreement, 4), misses[:30])


# kernels the shipped rules once misfiled, with the category their library's source gives them
NAMED = [
    # sgl-project/sglang python/sglang/jit_kernel/csrc/distributed and kimi_k3/comm/ar_fusion.cuh: push / pull
    # one-shot all-reduce with the residual add and RMSNorm fused in
    ("void (anonymous namespace)::all_reduce_pull_norm_kernel<__nv_bfloat16, 8u, true>(AllReduceParams)",
     "comm.fused_allreduce_norm"),
    ("void (anonymous namespace)::all_reduce_push_norm_cluster_kernel<__nv_bfloat16, 8u>(AllReduceParams)",
     "comm.fused_allreduce_norm"),
    ("all_reduce_push_res_kernel", "comm.fused_allreduce_norm"),
    ("void (anonymous namespace)::all_reduce_1shot_push_kernel<__nv_bfloat16, 8u, true>(PushParams)", "comm.allreduce"),
    ("reduce_scatter_res_kernel", "comm.collective"),
    # vllm-project/vllm csrc/cache_kernels.cu; NVIDIA/TensorRT-LLM unfusedAttentionKernels and mlaKernels.cu
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>"
     "(__nv_bfloat16 const*, __nv_bfloat16 const*, unsigned char*, unsigned char*, long const*)", "attention.kv_write"),
    ("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>"
     "(__nv_bfloat16 const*)", "attention.kv_write"),
    ("void tensorrt_llm::kernels::applyBiasRopeUpdateKVCacheV2<__nv_bfloat16, __nv_bfloat16, false, true>"
     "(tensorrt_llm::kernels::QKVPreprocessingParams<__nv_bfloat16, __nv_bfloat16>)", "attention.kv_write"),
    ("void tensorrt_llm::kernels::applyMLARopeAndAssignQKVKernelGeneration<__nv_bfloat16>(__nv_bfloat16*)",
     "attention.kv_write"),
    # NVIDIA/cutlass gemm/kernel/gemm_grouped.h as the older CUTLASS MoE path instantiates it
    ("void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass::gemm::threadblock::MmaMultistage<"
     "cutlass::gemm::GemmShape<128, 128, 64>, cutlass::bfloat16_t>, (cutlass::gemm::kernel::GroupScheduleMode)0, "
     "false>>(cutlass::gemm::kernel::GemmGrouped<...>::Params)", "moe.gemm"),
    # sgl-project/sglang jit_kernel/csrc/moe (moe_topk_sigmoid.cuh, align_single_token.cuh-style packing)
    ("void moeSigmoid<__nv_bfloat16, 256>(__nv_bfloat16 const*, float*, int)", "moe.routing"),
    ("count_expert_routes", "moe.permute"),
    # state-spaces/mamba csrc/selective_scan and mamba_ssm/ops/triton; Dao-AILab/causal-conv1d
    ("void selective_scan_fwd_kernel<Selective_Scan_fwd_kernel_traits<32, 16, 1, true, true, true, false, true, "
     "c10::BFloat16, float, c10::BFloat16>>(SSMParamsBase)", "ssm.scan"),
    ("_selective_scan_update_kernel", "ssm.scan"),
    ("_chunk_scan_fwd_kernel", "ssm.scan"),
    ("void causal_conv1d_update_kernel<Causal_conv1d_update_kernel_traits<64, 4, c10::BFloat16>>(ConvParamsBase)",
     "ssm.conv"),
    # pytorch/pytorch libkineto CuptiActivity.cpp: the torch profiler's names of memory records
    ("Memcpy DtoD (Device -> Device)", "memory.copy"),
    ("Memcpy HtoD (Pinned -> Device)", "memory.copy"),
    ("Memset (Device)", "memory.set"),
]


@pytest.mark.parametrize("name,expected", NAMED, ids=[n[:40] for n, _ in NAMED])
def test_named_kernels_land_in_their_source_category(rules, name, expected):
    assert rules.classify(name) == expected


# --- torch-operator context (public torch trace) ----------------------------------------------------------------------

def _trace_events(path: Path) -> list:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _launching_ops(path: Path, kernel_word: str) -> Counter:
    """Per kernel whose name holds `kernel_word`: the innermost cpu_op around its launch call (same pid/tid)."""
    events = [e for e in _trace_events(path) if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    found = Counter()
    for k in events:
        if k.get("cat") != "kernel" or kernel_word not in k["name"]:
            continue
        call = launches[k["args"]["correlation"]]
        around = [o for o in ops if o["pid"] == call["pid"] and o["tid"] == call["tid"]
                  and o["ts"] <= call["ts"] and call["ts"] <= o["ts"] + o["dur"]]
        found[max(around, key=lambda o: o["ts"])["name"] if around else None] += 1
    return found


def test_the_launching_torch_op_decides_a_kernel_no_rule_names():
    launched_by = _launching_ops(ALEXNET, "globalKernel")
    assert set(launched_by) == {"aten::addmm"}  # cuBLASLt's epilogue kernel, launched by the linear layers' addmm
    budget = json.loads(ok("budget", ALEXNET, "--format", "json"))
    (device,) = budget["devices"]
    rows = [u for u in device["unknowns"] if "globalKernel" in u["name"]]
    assert rows and all(u["evidence"] == "context:torch_op" for u in rows)
    assert all(u["category"].startswith("gemm.") and u["context"]["torch_op"] == "aten::addmm" for u in rows)
    assert device["evidence"]["torch_ops"] == "present"
    assert device["evidence"]["shares"]["context:torch_op"] > 0


def test_a_trace_without_cpu_ops_falls_back_to_name_rules(tmp_path):
    events = _trace_events(ALEXNET)
    with gzip.open(ALEXNET, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in events if e.get("cat") != "cpu_op"]
    bare = tmp_path / "no_cpu_ops.trace.json.gz"
    with gzip.open(bare, "wt") as f:
        json.dump(doc, f)
    full = json.loads(ok("budget", ALEXNET, "--format", "json"))["devices"][0]
    budget = json.loads(ok("budget", bare, "--format", "json"))["devices"][0]
    assert budget["evidence"]["torch_ops"].startswith("absent")
    assert budget["evidence"]["shares"]["context:torch_op"] == 0
    # nothing is lost: the same kernels and time; only what the operator decided is now listed as unknown
    assert sum(k["ms_per_step"] for k in budget["kernels"]) == pytest.approx(sum(k["ms_per_step"] for k in full["kernels"]))
    assert any("globalKernel" in u["name"] and u["evidence"] == "none" for u in budget["unknowns"])
    assert "torch operators absent" in ok("budget", bare)


@pytest.mark.parametrize("trace", sorted(p.name for p in PUBLIC.glob("*.json.gz") if "cupti_profiler" not in p.name
                                         and "924719" not in p.name))
def test_every_unknown_of_a_public_trace_is_listed_with_its_context(trace):
    budget = json.loads(ok("budget", PUBLIC / trace, "--format", "json"))
    for d in budget["devices"]:
        ev = d["evidence"]
        assert sum(ev["shares"].values()) == pytest.approx(1.0)
        assert ev["none_share"] == pytest.approx(d["unclassified_share"], abs=1e-9)
        unknown = {k["name"] for k in d["kernels"] if k["category"] == "unclassified"}
        listed = {u["name"] for u in d["unknowns"] if u["evidence"] == "none"}
        assert unknown == listed, (unknown, listed)
        assert sum(u["share"] for u in d["unknowns"] if u["evidence"] == "none") == pytest.approx(ev["none_share"])
        for u in d["unknowns"]:
            assert u["context"]["torch_op"] or u["context"]["nvtx_module"], u


# --- NVTX module context (the eager GLM-5 twin) ----------------------------------------------------------------------

def _innermost_ranges(db: Path, kernel_like: str) -> Counter:
    """Per launch of kernels named like `kernel_like`: the text of the innermost NVTX range around its launch call."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("""
            WITH launches AS (
                SELECT r.globalTid AS tid, r.start AS t
                FROM CUPTI_ACTIVITY_KIND_KERNEL k
                JOIN StringIds s ON s.id = k.demangledName
                JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                WHERE s.value LIKE ?)
            SELECT (SELECT COALESCE(n.text, ns.value) FROM NVTX_EVENTS n LEFT JOIN StringIds ns ON ns.id = n.textId
                    WHERE n.globalTid = l.tid AND n.start <= l.t AND n.end >= l.t AND n.end IS NOT NULL
                    ORDER BY n.start DESC LIMIT 1)
            FROM launches l""", (kernel_like,)).fetchall()
    finally:
        conn.close()
    return Counter(r[0] for r in rows)


def _weak_rule(tmp_path, category: str, strength: str) -> Path:
    path = tmp_path / f"{category}-{strength}.toml"
    path.write_text(f"""
[[rule]]
id = "test.moe_align"
category = "{category}"
pattern = 'moe_align_block_size_kernel'
strength = "{strength}"
""")
    return path


def test_the_module_range_overrules_a_weak_name_rule(export_example, tmp_path):
    db = export_example(EAGER)
    around = _innermost_ranges(db, "%moe_align_block_size_kernel%")
    assert around and all(".mlp.experts'" in text for text in around)  # launched inside FusedMoE (mlp.experts)
    # a weak guess of the wrong family: the experts module decides, refining elementwise to the MoE bookkeeping kind
    rules = _weak_rule(tmp_path, "elementwise", "weak")
    budget = json.loads(ok("budget", db, "--rules", rules, "--format", "json"))
    (row,) = [u for u in budget["devices"][0]["unknowns"] if "moe_align_block_size" in u["name"]]
    assert row["category"] == "moe.permute" and row["evidence"] == "context:nvtx_module"
    assert row["context_rule"] == "nvtx.moe_experts" and row["context"]["nvtx_module"].endswith(".mlp.experts")
    assert budget["devices"][0]["evidence"]["shares"]["context:nvtx_module"] > 0


def test_a_certain_rule_that_the_module_contradicts_is_reported(export_example, tmp_path):
    db = export_example(EAGER)
    rules = _weak_rule(tmp_path, "comm.allreduce", "strong")
    budget = json.loads(ok("budget", db, "--rules", rules, "--format", "json"))
    (conflict,) = [c for c in budget["devices"][0]["conflicts"] if "moe_align_block_size" in c["name"]]
    assert conflict["category"] == "comm.allreduce" and conflict["contradicted_by"] == "nvtx.moe_experts"
    assert conflict["rule"] == "test.moe_align"
    text = ok("budget", db, "--rules", rules)
    assert any(line.strip().startswith("conflict:") and "moe_align_block_size" in line for line in text.splitlines())
    ok("report", db, "--rules", rules, "-o", tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "conflict:" in report and "evidence: name rules" in report


def test_committed_capture_lists_every_unclassified_kernel(export_example):
    for name in ("sglang-triton-bs1", EAGER):
        budget = json.loads(ok("budget", export_example(name), "--format", "json"))
        for d in budget["devices"]:
            assert d["evidence"]["none_share"] == pytest.approx(d["unclassified_share"], abs=1e-9)
            unknown = {k["name"] for k in d["kernels"] if k["category"] == "unclassified"}
            assert unknown <= {u["name"] for u in d["unknowns"]}


# --- classify --explain, taxonomy suggest ----------------------------------------------------------------------------

def test_explain_names_the_deciding_rule_and_the_others(rules):
    name = "void (anonymous namespace)::all_reduce_pull_norm_kernel<__nv_bfloat16, 8u, true>(AllReduceParams)"
    rows = json.loads(ok("classify", "--explain", "--format", "json", name, "unheard_of_kernel",
                         "--nvtx", "{'Module': 'model.model.layers.3.mlp.experts'}"))
    first, second = rows
    assert first["evidence"] == "name" and first["category"] == "comm.fused_allreduce_norm"
    assert first["conflict"] == "nvtx.moe_experts"  # an all-reduce inside the experts module
    assert {"generic.norm", "conventions.allreduce"} <= {a["rule"] for a in first["also_matched"]}
    assert second["evidence"] == "context:nvtx_module" and second["category"] == "moe.permute"
    text = ok("classify", "--explain", "unheard_of_kernel", "--torch-op", "sgl_kernel::moe_align_block_size")
    assert "decided by context:torch_op rule torch_op.moe_permute" in text


def test_explain_a_capture_kernel_in_its_own_context():
    text = ok("classify", "--capture", ALEXNET, "--kernel", "globalKernel")
    assert "launched by aten::addmm" in text and "context:torch_op rule torch_op.gemm" in text
    one_line_error(run("classify", "--capture", ALEXNET), "--kernel")
    one_line_error(run("classify", "--capture", ALEXNET, "--kernel", "no_kernel_is_named_so"), "no kernel matches")


def test_suggest_round_trip_classifies_the_unknowns(tmp_path):
    before = json.loads(ok("budget", ALEXNET, "--format", "json"))["devices"][0]
    unknown = {u["name"] for u in before["unknowns"]}
    assert before["evidence"]["none_share"] > 0 and unknown
    drafted = tmp_path / "suggested.toml"
    ok("taxonomy", "suggest", ALEXNET, "-o", drafted)
    text = drafted.read_text()
    assert text.count("[[rule]]") == len(unknown) and text.count("# review:") == len(unknown)
    after = json.loads(ok("budget", ALEXNET, "--rules", drafted, "--format", "json"))["devices"][0]
    assert after["unclassified_share"] == 0 and after["evidence"]["none_share"] == 0
    assert {k["name"] for k in after["kernels"] if k["family"] == "suggested"} == unknown
    one_line_error(run("taxonomy", "suggest", ALEXNET, "-o", drafted), "--force")  # never replaced silently


def test_an_edited_suggestion_that_is_invalid_is_one_line(tmp_path):
    drafted = tmp_path / "suggested.toml"
    ok("taxonomy", "suggest", ALEXNET, "-o", drafted)
    text = drafted.read_text()
    bad_category = tmp_path / "bad_category.toml"
    bad_category.write_text(text.replace('category = "other"', 'category = "other.not_a_category"', 1))
    one_line_error(run("budget", ALEXNET, "--rules", bad_category), "unknown category 'other.not_a_category'")
    broken = tmp_path / "broken.toml"
    broken.write_text(text.replace('evidence = "user"', 'evidence = "user', 1))
    one_line_error(run("budget", ALEXNET, "--rules", broken), "invalid TOML")
    bad_context = tmp_path / "bad_context.toml"
    bad_context.write_text('[[context]]\nid = "x"\nkind = "stack_frame"\npattern = "a"\ncategory = "other"\n')
    one_line_error(run("classify", "x", "--rules", bad_context), "kind must be one of")


def test_a_context_rule_that_never_matches_is_a_warning(tmp_path):
    rules = tmp_path / "never.toml"
    rules.write_text('[[context]]\nid = "my.never"\nkind = "nvtx_module"\npattern = "no_such_module"\n'
                     'category = "moe.gemm"\n')
    result = CliRunner().invoke(cli, ["budget", str(ALEXNET), "--rules", str(rules)])
    assert result.exit_code == 0, result.output
    assert "warning: " in result.stderr and "my.never" in result.stderr and "matches no NVTX range" in result.stderr


def test_innermost_nested_skips_finished_children():
    import numpy as np

    from profattr.attribute.context import innermost_nested

    # thread 1: parent [0, 100] with children [10, 20] and [30, 40], grandchild [32, 35]; thread 2: [0, 5]
    tid = np.array([1, 1, 1, 1, 2])
    start = np.array([0, 10, 30, 32, 0])
    end = np.array([100, 20, 40, 35, 5])
    points = np.array([15, 25, 33, 38, 101, 3, 3])
    threads = np.array([1, 1, 1, 1, 1, 2, 3])
    assert innermost_nested(tid, start, end, threads, points).tolist() == [1, 0, 3, 2, -1, 4, -1]


def test_shipped_context_rules_are_complete_and_on_python_re(rules):
    import re

    assert all(isinstance(c.regex, re.Pattern) for c in rules.context_rules)  # reviewed; a user's go to RE2
    assert {c.kind for c in rules.context_rules} == {"torch_op", "python_frame", "nvtx_module"}
    assert all(c.source and c.category in rules.categories for c in rules.context_rules)


def _with_stack(tmp_path, kernel_word: str, frame: str) -> Path:
    """The AlexNet trace with one Python frame `frame` around each launch of the kernels named `kernel_word`, as
    torch's with_stack profiling records python_function events (no public trace here was recorded with stacks)."""
    with gzip.open(ALEXNET, "rt") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X"
                and e.get("cat") in ("cuda_runtime", "cuda_driver")}
    added = []
    for k in events:
        if k.get("ph") == "X" and k.get("cat") == "kernel" and kernel_word in k["name"]:
            call = launches[k["args"]["correlation"]]
            added.append({"ph": "X", "cat": "python_function", "name": frame, "pid": call["pid"], "tid": call["tid"],
                          "ts": call["ts"] - 1, "dur": call["dur"] + 2, "args": {}})
    assert added
    doc["traceEvents"] = events + added
    path = tmp_path / "with_stack.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def test_a_python_frame_of_the_launch_stack_decides(tmp_path):
    frame = "sglang/srt/layers/moe/fused_moe_triton/fused_moe.py(1520): fused_experts_impl"
    traced = _with_stack(tmp_path, "fft2d_c2r", frame)
    device = json.loads(ok("budget", traced, "--format", "json"))["devices"][0]
    (row,) = [u for u in device["unknowns"] if "fft2d_c2r" in u["name"]]
    # the frame is SGLang's fused-MoE runner (python/sglang/srt/layers/moe/fused_moe_triton): MoE work
    assert row["evidence"] == "context:python_frame" and row["category"].startswith("moe.")
    assert row["context_rule"] == "python_frame.moe" and device["evidence"]["python_frames"] == "present"
    assert device["evidence"]["shares"]["context:python_frame"] > 0
    plain = json.loads(ok("budget", ALEXNET, "--format", "json"))["devices"][0]["evidence"]
    assert plain["python_frames"].startswith("absent") and plain["shares"]["context:python_frame"] == 0
    text = ok("classify", "--explain", "unheard_of_kernel", "--python-frame", frame)
    assert "context:python_frame rule python_frame.moe" in text


def test_explain_names_what_each_inventory_says():
    """`classify --explain --format json` lists every inventory row of the kernel's identifier, as the TSV holds it,
    and says which rule decided: the inventory's own where no library rule covers the kernel."""
    name = "_count_routed_per_rank_kernel"
    rows = [r for lib in INVENTORIES for r in read_inventory(lib) if r["name"] == name]
    assert rows
    out = json.loads(ok("classify", "--explain", "--format", "json", name))[0]
    assert [(e["library"], e["category"], e["source"]) for e in out["inventory"]] == \
        [(r["library"], r["category"], r["source"]) for r in rows]
    assert out["rule"] == f"inventory.{rows[0]['library']}" and out["category"] == rows[0]["category"]
    text = ok("classify", "--explain", name)
    assert f"inventory: {name} in {rows[0]['library']} {rows[0]['version']} ({rows[0]['source']})" in text
