"""The built-in MoE decode workload on CPU: the two MoE implementations agree, the parameter counts match an
independent formula and the model's own tensors, the NVTX names carry layer index and block, and tensor parallel
over two ranks decodes the same tokens as one rank."""
from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from profattr.workloads import moe_decode as md  # noqa: E402

TINY = md.PRESETS["tiny"]
REPO = Path(__file__).resolve().parent.parent
FAST = ["--preset", "tiny", "--warmup-steps", "2", "--timed-steps", "2", "--timed-trials", "2"]
META_KEYS = {"schema", "config", "moe_impl", "mode", "graph_window", "batch", "tp", "dtype", "dtype_bytes",
             "device_name", "torch_version", "params", "kv_cache_bytes_per_token", "context_len",
             "ms_per_token_unprofiled", "steps_profiled"}


def expected_params(c) -> dict:
    """Parameter counts written out from the config, independently of the model code."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    attention = c.num_layers * (c.hidden_size * (q + 2 * kv) + q * c.hidden_size)
    norms = (2 * c.num_layers + 1) * c.hidden_size
    router = c.num_layers * c.num_experts * c.hidden_size
    one_expert = 3 * c.moe_intermediate_size * c.hidden_size  # gate, up, down
    experts_total = c.num_layers * c.num_experts * one_expert
    experts_active = c.num_layers * c.top_k * one_expert
    embedding = lm_head = c.vocab_size * c.hidden_size
    return {
        "total": embedding + attention + norms + router + experts_total + lm_head,
        "active_per_token": c.hidden_size + attention + norms + router + experts_active + lm_head,
        "by_component": {"embedding": embedding, "embedding_active_per_token": c.hidden_size,
                         "attention": attention, "norms": norms, "router": router, "experts_total": experts_total,
                         "experts_active_per_token": experts_active, "lm_head": lm_head},
    }


def decode(moe_impl: str, kernel: str, steps: int = 12, batch: int = 3):
    """Tokens [steps, batch] and logits [steps, batch, vocab] of a float32 CPU decode."""
    with torch.no_grad():
        model = md.build_model(TINY, "cpu", torch.float32, moe_impl, kernel, batch=batch, seed=3)
        decoder = md.Decoder(model, md.make_sampler(), batch, seed=3)
        tokens, logits = [], []
        for _ in range(steps):
            logits.append(decoder.step().clone())
            tokens.append(decoder.tokens.clone())
    return torch.stack(tokens), torch.stack(logits)


def test_moe_implementations_agree():
    ref_tokens, ref_logits = decode("loop", "bmm")
    assert len(set(ref_tokens[:, 0].tolist())) > 3  # the decode is not stuck on one token
    for kernel in ("bmm", "grouped_mm"):
        tokens, logits = decode("grouped", kernel)
        assert torch.equal(tokens, ref_tokens), kernel
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)


def test_expert_kernels_agree_with_a_dense_reference():
    gen = torch.Generator().manual_seed(0)
    n, hidden, inter, experts, k = 5, 32, 16, 6, 2
    x = torch.randn(n, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, inter, generator=gen)
    weights, ids = torch.topk(torch.rand(n, experts, generator=gen), k)
    want = torch.zeros(n, hidden)
    for t in range(n):  # token by token, straight from the SwiGLU definition
        for j in range(k):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(w13[e, :inter] @ x[t]) * (w13[e, inter:] @ x[t])
            want[t] += weights[t, j] * (w2[e] @ h)
    for name, kernel in md.EXPERT_KERNELS.items():
        torch.testing.assert_close(kernel(x, w13, w2, weights, ids), want, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("moe_impl", ["loop", "grouped"])
def test_cli_eager_metadata(tmp_path, capsys, moe_impl):
    meta_path = tmp_path / "meta.json"
    rc = md.main(FAST + ["--moe-impl", moe_impl, "--mode", "eager", "--steps", "3", "--batch", "2",
                         "--meta-out", str(meta_path)])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("moe_decode: mode=eager")
    meta = json.loads(meta_path.read_text())
    assert META_KEYS <= set(meta)
    assert meta["schema"] == "profattr.workload/1"
    assert (meta["moe_impl"], meta["mode"], meta["batch"], meta["tp"]) == (moe_impl, "eager", 2, 1)
    assert (meta["dtype"], meta["dtype_bytes"], meta["device_name"]) == ("float32", 4, "cpu")
    assert meta["config"]["hidden_size"] == TINY.hidden_size and meta["context_len"] == TINY.context_len
    assert meta["steps_profiled"] == 3
    timing = meta["ms_per_token_unprofiled"]
    assert timing["trials"] == 2 and timing["min"] <= timing["median"] <= timing["max"] and timing["min"] > 0

    want = expected_params(TINY)
    params = meta["params"]
    assert params["total"] == want["total"]
    assert params["active_per_token"] == want["active_per_token"]
    assert params["per_rank_active"] == want["active_per_token"]  # one rank reads everything
    assert params["by_component"] == want["by_component"]
    model = md.build_model(TINY, "cpu", torch.float32, moe_impl, "bmm")
    assert sum(p.numel() for p in model.parameters()) == want["total"]
    assert meta["kv_cache_bytes_per_token"] == TINY.num_layers * 2 * TINY.num_kv_heads * TINY.head_dim * 4


def test_both_impls_decode_the_same_tokens_from_the_cli(tmp_path):
    finals = []
    for impl in ("loop", "grouped"):
        path = tmp_path / f"{impl}.json"
        assert md.main(FAST + ["--moe-impl", impl, "--steps", "4", "--batch", "3", "--meta-out", str(path)]) == 0
        finals.append(json.loads(path.read_text())["final_tokens"])
    assert finals[0] == finals[1] and len(finals[0]) == 3


def record_ranges(opts):
    """Run the workload with recording push/pop; returns (pushed names, meta). Checks push/pop balance."""
    names, depth = [], [0]

    def push(name):
        names.append(name)
        depth[0] += 1

    def pop():
        depth[0] -= 1
        assert depth[0] >= 0

    meta = md.run(opts, nvtx_hooks=(push, pop))
    assert depth[0] == 0
    return names, meta


def test_nvtx_ranges_name_layers_and_blocks_like_sglang():
    opts = md.RunOptions(config=TINY, moe_impl="grouped", mode="eager", warmup_steps=1, timed_steps=1,
                         timed_trials=1, steps=2)
    names, _ = record_ranges(opts)
    steps = 1 + 1 + 2
    assert names.count("decode_step") == steps
    modules = [ast.literal_eval(n)["Module"] for n in names if n.startswith("{")]
    for layer in range(TINY.num_layers):
        prefix = f"model.model.layers.{layer}"
        for block in ("self_attn", "self_attn.attn", "mlp", "mlp.gate", "mlp.experts", "input_layernorm",
                      "post_attention_layernorm"):
            assert modules.count(f"{prefix}.{block}") == steps, block
    assert modules.count("model.lm_head") == steps and modules.count("model.model.norm") == steps
    gate = next(ast.literal_eval(n) for n in names if "'model.model.layers.1.mlp.gate'" in n)
    assert gate["TrainableParams"] == {"weight": [TINY.num_experts, TINY.hidden_size]}

    plain, _ = record_ranges(md.RunOptions(**{**opts.__dict__, "nvtx_format": "path"}))
    assert "model.model.layers.1.mlp.experts" in plain
    off, _ = record_ranges(md.RunOptions(**{**opts.__dict__, "nvtx_format": "off"}))
    assert set(off) == {"decode_step"}


@pytest.mark.parametrize("window,captures", [("after", 1), ("before", 2)])
def test_graph_mode_control_flow_on_cpu(window, captures):
    opts = md.RunOptions(config=TINY, moe_impl="loop", mode="graph", graph_window=window, warmup_steps=1,
                         timed_steps=1, timed_trials=1, steps=2)
    names, meta = record_ranges(opts)
    assert names.count("graph_capture") == captures
    assert meta["graph_emulated"] and meta["graph_window"] == window
    assert meta["graph_captured_in_window"] is (window == "before")


def test_user_errors_are_one_line(tmp_path, capsys):
    existing = tmp_path / "meta.json"
    existing.write_text("{}")
    assert md.main(FAST + ["--meta-out", str(existing)]) == 2
    assert md.main(FAST + ["--heads", "6", "--kv-heads", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    assert "--force" in err[0] and "--kv-heads" in err[1]
    assert existing.read_text() == "{}"


def test_tensor_parallel_two_ranks_decode_like_one(tmp_path):
    args = [sys.executable, "-m", "profattr.workloads.moe_decode", *FAST, "--steps", "4", "--batch", "3"]
    single = tmp_path / "tp1.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    double = tmp_path / "tp2.json"
    ranks = [subprocess.Popen(args + (["--meta-out", str(double)] if r == 0 else []),
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    assert md.main(FAST + ["--steps", "4", "--batch", "3", "--meta-out", str(single)]) == 0
    for proc in ranks:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    one, two = json.loads(single.read_text()), json.loads(double.read_text())
    assert two["tp"] == 2 and two["final_tokens"] == one["final_tokens"]
    assert two["params"]["total"] == one["params"]["total"]
    # one rank reads half of the attention and active expert weights, all of the rest
    c = one["params"]["by_component"]
    split = c["attention"] + c["experts_active_per_token"]
    assert two["params"]["per_rank_active"] == one["params"]["active_per_token"] - split // 2
