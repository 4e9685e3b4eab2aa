"""The host figures a projection carries over (attribute/host_cycle.py), on synthetic exports whose answer is known
by construction, and the projection's own arithmetic on edge cases."""
from __future__ import annotations

import pytest

from synth import Builder, gtid
from profattr.attribute.host_cycle import host_cycle
from profattr.trace.source import open_trace

TID = gtid(7)


def _capture(tmp_path, nvtx: bool):
    b = Builder(tmp_path / ("with-nvtx.sqlite" if nvtx else "without-nvtx.sqlite"))
    for i in range(5):
        t0 = 10_000 + i * 1_000
        if nvtx:
            b.nvtx(TID, t0, t0 + 600, "step[DECODE bs=1]")
        b.launch(TID, t0 + 100, t0 + 250, name="cudaGraphLaunch_v10000")     # lead: 250 ns from the range start
        b.launch(TID, t0 + 500, t0 + 800, name="cudaEventSynchronize_v3020")  # 300 ns waiting per step
        b.launch(TID, t0 + 850, t0 + 860)                                       # not a wait
    return b.close()


def test_host_cycle_is_the_launch_period_less_the_waits(tmp_path):
    with open_trace(_capture(tmp_path, nvtx=True)) as trace:
        got = host_cycle(trace)
    assert got["graph_launches"] == 5
    assert got["period_ms"] == pytest.approx(1_000 / 1e6)
    assert got["sync_ms_per_step"] == pytest.approx(300 / 1e6)
    assert got["host_cycle_ms"] == pytest.approx(700 / 1e6)
    assert got["host_lead_ms"] == pytest.approx(250 / 1e6)
    assert got["launch_call_ms"] == pytest.approx(150 / 1e6)


def test_without_nvtx_there_is_no_lead(tmp_path):
    with open_trace(_capture(tmp_path, nvtx=False)) as trace:
        got = host_cycle(trace)
    assert got["host_cycle_ms"] == pytest.approx(700 / 1e6) and got["host_lead_ms"] is None


def test_an_eager_capture_has_no_host_cycle(tmp_path):
    b = Builder(tmp_path / "eager.sqlite")
    for i in range(3):
        b.launch(TID, 1_000 * i, 1_000 * i + 10)
    with open_trace(b.close()) as trace:
        assert host_cycle(trace) is None


# --- tying GEMM launch shapes to linear layers (limits/layer_match.py), on layer tables written here -------------

def _layer(name, n, k, sharded, experts=1, count=6, tp=1):
    split_n = sharded and name != "o_proj"
    return {"name": name, "n": n // tp if split_n else n, "k": k // tp if sharded and not split_n else k,
            "count": count, "experts": experts, "sharded": sharded, "dtype": "bf16", "runs": True}


def _kernel(name, *shapes):
    return {"name": name, "category": "gemm.bf16",
            "shapes": [{"shape": {"grid": list(g)}, "count_per_step": c} for g, c in shapes]}


LAYERS = [("o_proj", 6144, 16384, True), ("wk", 128, 6144, False), ("weights_proj", 32, 6144, False)]


def _ratios(kernels, tp=8):
    from profattr.limits import layer_match

    src = {name: _layer(name, n, k, sh) for name, n, k, sh in LAYERS}
    tgt = {name: _layer(name, n, k, sh, tp=tp) for name, n, k, sh in LAYERS}
    return layer_match.shape_ratios(kernels, src, tgt, lambda side, dtype: 2.0, (16, 32, 64, 128, 256))


def test_split_k_launches_are_tied_to_the_layers_their_grids_fit():
    kernels = [_kernel("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_splitK_TNT", ((2, 64, 1), 6)),  # 6144/192 = 32 x 4 splits
               _kernel("nvjet_sm90_tss_64x8_64x16_1x1_h_bz_splitK_TNT", ((1, 4, 1), 6)),   # 1 or 2 tiles of 64
               _kernel("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", ((2, 4, 1), 6)),
               _kernel("splitKreduce_kernel", ((4, 1, 1), 6))]
    got = _ratios(kernels)
    # a 128-CTA split-K launch could run wk or weights_proj (one tile, 128 splits) as well, but then one of the two
    # small split-K launches would run nothing: the assignment that ties every launch gives it o_proj
    assert got[("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_splitK_TNT", 0)]["layers"] == [["o_proj"]]
    assert got[("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_splitK_TNT", 0)]["byte_ratio"] == pytest.approx(1 / 8)
    # the small ones run wk and weights_proj in one order or the other: both replicated, so both keep their bytes
    for name in ("nvjet_sm90_tss_64x8_64x16_1x1_h_bz_splitK_TNT", "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"):
        assert sorted(map(tuple, got[(name, 0)]["layers"])) == [("weights_proj",), ("wk",)]
        assert got[(name, 0)]["byte_ratio"] == 1.0 and got[(name, 0)]["sharded"] == [False]
    assert got[("splitKreduce_kernel", 0)]["byte_ratio"] is None  # streams no weights


def test_a_launch_whose_layers_disagree_on_sharding_is_not_tied():
    # one 128-CTA split-K launch and nothing else: o_proj (sharded) and wk (replicated) fit it alike
    got = _ratios([_kernel("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_splitK_TNT", ((2, 64, 1), 6))])
    assert ("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_splitK_TNT", 0) not in got
