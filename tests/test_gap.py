"""`compute_gap` on hand-made budgets: category floors against arithmetic written out here, exact closure."""
from __future__ import annotations

import copy
import math
import re

import pytest

from profattr.limits.gap import SCHEMA, compute_gap, render_gap_markdown, row_of
from profattr.limits.hardware import load_hardware
from profattr.limits.model import spec_from_config
from profattr.limits.workload import spec_from_workload

# a Qwen3-MoE shaped like the tiny SGLang test model: 8 layers, 64 experts, top-8, 16 heads / 4 KV heads
TINY = dict(model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
            intermediate_size=2048, vocab_size=32000)
H200_BW = 4.8e12
CATEGORIES = {"gemm.bf16": 0.30, "moe.gemm": 0.50, "moe.routing": 0.05, "attention.decode": 0.12,
              "comm.allreduce": 0.20, "norm": 0.04, "elementwise": 0.03, "memory.copy": 0.01, "unclassified": 0.02}
OVERLAP, IDLE = 0.05, 0.40


def budget(devices=(0, 1), gpus=()):
    total = sum(CATEGORIES.values())
    return {
        "schema": "profattr.budget/1",
        "capture": {"path": "x.sqlite", "nsys_version": "2023.4.4", "gpus": list(gpus)},
        "steps": {"source": "nvtx:decode_step", "count": 20},
        "devices": [{
            "device": d, "step_ms": 1.6, "mean_step_ms": total - OVERLAP + IDLE, "busy_ms_per_step": total - OVERLAP,
            "idle_ms_per_step": IDLE, "overlap_ms_per_step": OVERLAP, "kernels_per_step": 120,
            "categories": [{"category": c, "ms_per_step": ms, "count_per_step": 8} for c, ms in CATEGORIES.items()],
            "kernels": [], "unclassified_share": 0.02 / total} for d in devices],
    }


def expected_floor_ms():
    """Per-rank floors of TINY at tp 2, 100 cached tokens, BF16, H200 peak bandwidth, written out."""
    hidden, layers, hd, vocab = 1024, 8, 64, 32000
    q = o = hidden * 16 * hd
    k = v = hidden * 4 * hd
    gemm_params = layers * (q + k + v + o) / 2 + vocab * hidden / 2  # heads and vocabulary split over 2 ranks
    experts = layers * 8 * 3 * hidden * 256 / 2
    router = layers * 64 * hidden  # replicated
    norm = layers * (2 * hidden + 2 * hd) + hidden  # replicated
    kv_bytes_per_token = layers * 2 * 2 * hd * 2  # 2 of 4 KV heads per rank, K and V, BF16
    ms = lambda nbytes: nbytes / H200_BW * 1e3  # noqa: E731
    link_s = (2 * layers + 1) * hidden * 2 * 2 * (2 - 1) / 2 / 450e9
    return {"gemm.bf16": ms(gemm_params * 2), "moe.gemm": ms(experts * 2), "moe.routing": ms(router * 2),
            "norm": ms(norm * 2), "embedding": ms(hidden * 2), "attention.decode": ms(100 * kv_bytes_per_token),
            "attention.kv_write": ms(kv_bytes_per_token), "sampling": ms(vocab * 4), "comm": link_s * 1e3}


@pytest.fixture(scope="module")
def tiny_spec():
    return spec_from_config(TINY, quant="bf16", tp=2, context_len=100)


def test_precision_rows_merge_when_a_gemm_category_has_no_precision(tiny_spec):
    split = compute_gap(budget(), tiny_spec, load_hardware("h200"))
    plain = budget()
    for d in plain["devices"]:
        d["categories"].append({"category": "gemm", "ms_per_step": 0.0, "count_per_step": 1})
    merged = compute_gap(plain, tiny_spec, load_hardware("h200"))
    for a, b in zip(split["devices"], merged["devices"]):
        rows_a = {r["category"]: r for r in a["categories"]}
        rows_b = {r["category"]: r for r in b["categories"]}
        assert "gemm" not in rows_a and "gemm.bf16" not in rows_b
        assert rows_b["gemm"]["floor_bytes"] == rows_a["gemm.bf16"]["floor_bytes"]
        assert rows_b["gemm"]["measured_ms"] == rows_a["gemm.bf16"]["measured_ms"]
        assert b["floor_ms"] == pytest.approx(a["floor_ms"], rel=1e-12)


def closure(dev):
    return dev["floor_ms"] + math.fsum(c["ms"] for c in dev["components"]) - dev["measured_step_ms"]


def test_category_floors_and_exact_closure(tiny_spec):
    gap = compute_gap(budget(), tiny_spec, load_hardware("h200"))
    assert gap["schema"] == SCHEMA == "profattr.gap/1"
    expected = expected_floor_ms()
    for dev in gap["devices"]:
        assert dev["measured_step_ms"] == pytest.approx(sum(CATEGORIES.values()) - OVERLAP + IDLE, abs=1e-12)
        assert abs(closure(dev)) < 1e-12
        assert sum(c["ms"] for c in dev["components"]) + dev["floor_ms"] == pytest.approx(dev["measured_step_ms"],
                                                                                          abs=1e-12)
        rows = {r["category"]: r for r in dev["categories"]}
        for row, floor_ms in expected.items():
            assert rows[row]["floor_ms"] == pytest.approx(floor_ms, rel=1e-12), row
        assert dev["floor_ms"] == pytest.approx(sum(expected.values()), rel=1e-12)
        assert rows["gemm.bf16"]["measured_ms"] == 0.30  # its own precision row: every weight is BF16
        assert rows["moe.gemm"]["efficiency_pct"] == pytest.approx(100 * expected["moe.gemm"] / 0.50)
        assert rows["elementwise"]["floor_ms"] == 0 and rows["elementwise"]["bound"] == "none"
        assert rows["comm"]["bound"] == "link"
        assert rows["embedding"]["measured_ms"] == 0 and "below its floor" in rows["embedding"]["note"]
        names = [c["component"] for c in dev["components"]]
        assert names[-1].startswith("idle") and dev["components"][-1]["ms"] == IDLE
        assert {"component": "overlap (kernels running concurrently)", "ms": -OVERLAP} in dev["components"]


def test_capture_bandwidth_replaces_the_preset_per_device(tiny_spec):
    gpus = [{"id": 1, "name": "NVIDIA H200", "memoryBandwidth": 4_000_000_000_000, "smCount": 132}]
    gap = compute_gap(budget(gpus=gpus), tiny_spec, load_hardware("h200"))
    dev0, dev1 = gap["devices"]
    assert dev0["memory_bandwidth_bytes_per_s"] == 4.8e12 and dev1["memory_bandwidth_bytes_per_s"] == 4.0e12
    row0 = {r["category"]: r for r in dev0["categories"]}["moe.gemm"]
    row1 = {r["category"]: r for r in dev1["categories"]}["moe.gemm"]
    assert row1["floor_ms"] == pytest.approx(row0["floor_ms"] * 4.8 / 4.0, rel=1e-12)
    assert "TARGET_INFO_GPU" in gap["hardware"]["by_device"]["1"]["source"]
    assert abs(closure(dev1)) < 1e-12
    # explicit rows (as read by the SQL query) take precedence over the budget's copy
    explicit = compute_gap(budget(gpus=gpus), tiny_spec, load_hardware("h200"),
                           capture_gpus={0: {"device": 0, "memory_bandwidth_bytes_per_s": 2.4e12}})
    row = {r["category"]: r for r in explicit["devices"][0]["categories"]}["moe.gemm"]
    assert row["floor_ms"] == pytest.approx(row0["floor_ms"] * 2, rel=1e-12)


def test_achievable_bandwidth_fraction_raises_memory_floors(tiny_spec):
    peak = compute_gap(budget(), tiny_spec, load_hardware("h200"))["devices"][0]
    eta = compute_gap(budget(), tiny_spec, load_hardware("h200"), bandwidth_fraction=0.8)["devices"][0]
    rows_p = {r["category"]: r for r in peak["categories"]}
    rows_e = {r["category"]: r for r in eta["categories"]}
    assert rows_e["moe.gemm"]["floor_ms"] == pytest.approx(rows_p["moe.gemm"]["floor_ms"] / 0.8)
    assert rows_e["comm"]["floor_ms"] == rows_p["comm"]["floor_ms"]  # link time does not depend on memory
    assert abs(closure(eta)) < 1e-12


def test_inconsistent_budget_still_closes_and_says_so(tiny_spec):
    broken = budget(devices=(0,))
    broken["devices"][0]["categories"] = broken["devices"][0]["categories"][:-2]  # 0.03 ms of kernels missing
    dev = compute_gap(broken, tiny_spec, load_hardware("h200"))["devices"][0]
    extra = [c for c in dev["components"] if c["component"].startswith("unattributed")]
    assert len(extra) == 1 and extra[0]["ms"] == pytest.approx(0.03)
    assert abs(closure(dev)) < 1e-12


def test_row_rollup_uses_the_longest_prefix():
    keys = ["gemm", "moe.gemm", "moe.routing", "attention.decode", "comm"]
    assert row_of("gemm.fp4", keys) == "gemm"
    assert row_of("moe.gemm.fp4", keys) == "moe.gemm"
    assert row_of("moe.permute", keys) == "moe.permute"
    assert row_of("comm.allreduce", keys) == "comm"
    assert row_of("gemmx", keys) == "gemmx"


def test_markdown_escapes_capture_strings(tiny_spec):
    evil = copy.deepcopy(budget(devices=(0,)))
    evil["devices"][0]["device"] = "<img src=x>|1"
    evil["devices"][0]["categories"].append({"category": "<script>alert(1)</script>|x", "ms_per_step": 0.0,
                                             "count_per_step": 1})
    md = render_gap_markdown(compute_gap(evil, tiny_spec, load_hardware("h200")))
    outside_code = re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", "", md)  # code spans show their text literally
    assert "<script>" not in outside_code and "<img" not in outside_code and "`" not in outside_code
    assert "&lt;img" in md and "| `<script>alert(1)</script>`\\|`x` |" in md  # a category: code, split at `|`
    table_lines = [line for line in md.splitlines() if "script" in line]
    assert table_lines and all(line.count("|") - line.count("\\|") == 7 for line in table_lines)
    assert "## Gap to the hardware limit" in md and "Waterfall from floor to measured" in md


def test_waterfall_chart_is_a_png(tiny_spec, tmp_path):
    from profattr.limits.chart import write_gap_chart

    out = write_gap_chart(compute_gap(budget(), tiny_spec, load_hardware("h200")), tmp_path / "gap.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def workload_record(tp=2, batch=1):
    """A `profattr.workload/1` record of the built-in workload, counts written out from its config."""
    c = dict(hidden_size=256, num_layers=2, num_experts=8, top_k=2, moe_intermediate_size=512, num_heads=4,
             num_kv_heads=2, head_dim=64, vocab_size=1000, context_len=64)
    h, layers, hd = c["hidden_size"], c["num_layers"], c["head_dim"]
    q, kv = c["num_heads"] * hd, c["num_kv_heads"] * hd
    attention = layers * (h * (q + 2 * kv) + q * h)
    norms = (2 * layers + 1) * h
    router = layers * c["num_experts"] * h
    expert = 3 * c["moe_intermediate_size"] * h
    experts_active = layers * c["top_k"] * expert
    table = c["vocab_size"] * h
    kv_per_token = layers * 2 * kv * 2
    return {
        "schema": "profattr.workload/1", "workload": "moe_decode", "moe_impl": "grouped", "mode": "graph",
        "config": c, "tp": tp, "batch": batch, "dtype": "bfloat16", "dtype_bytes": 2, "context_len": 64,
        "params": {"total": 0, "active_per_token": h + attention + norms + router + experts_active + table,
                   # split over ranks: attention and experts; replicated: embedding row, norms, router, lm_head
                   "per_rank_active": h + attention // tp + norms + router + experts_active // tp + table,
                   "by_component": {"embedding": table, "embedding_active_per_token": h, "attention": attention,
                                    "norms": norms, "router": router, "experts_total": layers * 8 * expert,
                                    "experts_active_per_token": experts_active, "lm_head": table}},
        "kv_cache_bytes_per_token": kv_per_token,
        "kv_cache_bytes_read_per_step": batch * 64 * kv_per_token,
    }


def test_workload_spec_from_run_json_record():
    record = workload_record(tp=2)
    spec = spec_from_workload(record)
    assert not [n for n in spec.notes if "differ" in n]  # per-rank sum agrees with params.per_rank_active
    assert sum(g.rank_bytes_per_token(2, ideal=False) for g in spec.groups) == \
        record["params"]["per_rank_active"] * 2
    gap = compute_gap(budget(devices=(0, 1)), spec, load_hardware("h200"))
    rows = {r["category"]: r for r in gap["devices"][1]["categories"]}
    ms = lambda nbytes: nbytes / H200_BW * 1e3  # noqa: E731
    by = record["params"]["by_component"]
    assert rows["moe.gemm"]["floor_ms"] == pytest.approx(ms(by["experts_active_per_token"] / 2 * 2))
    assert rows["gemm.bf16"]["floor_ms"] == pytest.approx(ms((by["attention"] / 2 + by["lm_head"]) * 2))
    assert rows["moe.routing"]["floor_ms"] == pytest.approx(ms(by["router"] * 2))
    assert rows["embedding"]["floor_ms"] == pytest.approx(ms(256 * 2))  # one row per token
    assert rows["attention.decode"]["floor_bytes"] == 64 * record["kv_cache_bytes_per_token"] / 2
    # two all-reduces per layer of hidden x 2 bytes; ring: 2(n-1)/n of it over the 450 GB/s NVLink direction
    assert rows["comm"]["floor_ms"] == pytest.approx(2 * 2 * 256 * 2 * 2 * (2 - 1) / 2 / 450e9 * 1e3)
    assert all(abs(closure(d)) < 1e-12 for d in gap["devices"])


def test_workload_spec_flags_counts_that_disagree_and_missing_fields():
    record = workload_record(tp=1)
    record["params"]["per_rank_active"] += 1000
    assert any("differ from params.per_rank_active" in n for n in spec_from_workload(record).notes)
    with pytest.raises(Exception, match="missing fields: dtype_bytes, tp"):
        spec_from_workload({"params": {"by_component": {}}})
