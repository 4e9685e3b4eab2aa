"""`profattr gap` end to end: a capture in, a closed waterfall out; bad input gets one clear line.

The synthetic export (tests/synth.py, real nsys 2023.4.4 layout) exists for the TARGET_INFO_GPU override and the
error paths; real captures of the built-in workload, when present under tests/data or examples, are checked too.
"""
from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from conftest import WORKLOAD_CAPTURES
from click.testing import CliRunner

from profattr.cli import cli
from synth import Builder, gpid, gtid

ROOT = Path(__file__).resolve().parent.parent
LLAMA_TINY = dict(model_type="llama", hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=8, intermediate_size=1024, vocab_size=1000)
KERNELS = [("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", 10_000), ("fused_moe_kernel", 30_000),
           ("rmsnorm_kernel", 2_000), ("elementwise_kernel", 1_000)]


def make_capture(path: Path, gpu_name="NVIDIA H200", bandwidth=4_000_000_000_000) -> Path:
    b = Builder(path)
    pid, tid = gpid(100), gtid(100)
    t = 1_000_000
    for _ in range(3):  # three identical bursts of kernels with gaps between them
        for name, dur in KERNELS:
            corr = b.launch(tid, t, t + 500)
            b.kernel(pid, corr, t + 1_000, t + 1_000 + dur, name)
            t += dur + 3_000
    b.conn.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, memoryBandwidth, clockRate, smCount) "
                   "VALUES (1, 0, ?, 150000000000, ?, 1980000000, 132)", (gpu_name, bandwidth))
    return b.close()


@pytest.fixture()
def capture(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA_TINY))
    return make_capture(tmp_path / "cap.sqlite"), cfg


def test_gap_json_closes_and_uses_the_capture_bandwidth(capture):
    cap, cfg = capture
    before = cap.read_bytes()
    result = CliRunner().invoke(cli, ["gap", str(cap), "--model", str(cfg), "--quant", "bf16", "--tp", "1",
                                      "--hardware", "h200", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert cap.read_bytes() == before
    gap = json.loads(result.output)
    assert gap["schema"] == "profattr.gap/1"
    (dev,) = gap["devices"]
    # independent: the whole capture is one step; its span is last end - first start of the GPU work
    conn = sqlite3.connect(f"file:{cap}?mode=ro", uri=True)
    first, last = conn.execute("SELECT MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    bandwidth = conn.execute("SELECT memoryBandwidth FROM TARGET_INFO_GPU WHERE id = 0").fetchone()[0]
    assert dev["measured_step_ms"] == pytest.approx((last - first) / 1e6)
    assert dev["memory_bandwidth_bytes_per_s"] == bandwidth
    assert abs(dev["floor_ms"] + math.fsum(c["ms"] for c in dev["components"]) - dev["measured_step_ms"]) < 1e-9
    # the floor of the tiny llama: every weight read once per token at the capture's own bandwidth
    hidden, layers, vocab, inter = 512, 2, 1000, 1024
    params = layers * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden) + hidden + vocab * hidden + hidden
    kv_and_logits = 1024 * layers * 2 * hidden * 2 + layers * 2 * hidden * 2 + vocab * 4
    expected_floor_ms = (params * 2 + kv_and_logits) / bandwidth * 1e3
    assert dev["floor_ms"] == pytest.approx(expected_floor_ms, rel=1e-9)


def test_gap_table_markdown_chart_and_hardware_from_the_capture(capture, tmp_path):
    cap, cfg = capture
    runner = CliRunner()
    table = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16"])
    assert table.exit_code == 0, table.output
    assert "waterfall (floor -> measured)" in table.output and "measured step" in table.output
    chart = tmp_path / "gap.png"
    md = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16", "--format", "markdown",
                             "--chart", str(chart)])
    assert md.exit_code == 0, md.output
    assert md.output.startswith("## Gap to the hardware limit") and "H200" in md.output
    assert chart.read_bytes()[:4] == b"\x89PNG"
    again = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16", "--chart", str(chart)])
    assert again.exit_code == 2 and "exists; pass --force" in again.output
    forced = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16", "--chart", str(chart),
                                 "--force"])
    assert forced.exit_code == 0, forced.output


def test_gap_bad_input(tmp_path, capture):
    cap, cfg = capture
    runner = CliRunner()
    no_model = runner.invoke(cli, ["gap", str(cap), "-H", "h200"])
    assert no_model.exit_code == 2 and "cap.run.json not found; pass --model" in no_model.output
    odd = make_capture(tmp_path / "odd.sqlite", gpu_name="Tesla T4")
    unknown_gpu = runner.invoke(cli, ["gap", str(odd), "-m", str(cfg), "--quant", "bf16"])
    assert unknown_gpu.exit_code == 2
    assert "cannot tell the hardware from the capture (GPUs: Tesla T4); pass --hardware" in unknown_gpu.output
    bad_tp = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16", "--tp", "3", "-H", "h200"])
    assert bad_tp.exit_code == 2 and "tp 3 does not divide num_attention_heads 8" in bad_tp.output
    run_json = tmp_path / "cap.run.json"
    run_json.write_text(json.dumps({"schema": "profattr.run/1"}))
    no_workload = runner.invoke(cli, ["gap", str(cap), "-H", "h200"])
    assert no_workload.exit_code == 2 and "records neither a `workload` nor the model" in no_workload.output
    assert all("Traceback" not in r.output for r in (no_model, unknown_gpu, bad_tp, no_workload))


def test_served_capture_takes_tp_and_context_from_its_run_json(capture, tmp_path):
    cap, cfg = capture
    (tmp_path / "cap.run.json").write_text(json.dumps({
        "schema": "profattr.run/1", "tp": 2, "model": "/models/tiny", "workload": None,
        "requests": {"input_len": 100, "max_new_tokens": 64}}))
    runner = CliRunner()
    result = runner.invoke(cli, ["gap", str(cap), "-m", str(cfg), "--quant", "bf16", "--format", "json"])
    assert result.exit_code == 0, result.output
    model = json.loads(result.output)["model"]
    assert model["tp"] == 2 and model["context_len"] == 100 + 64 // 2
    no_model = runner.invoke(cli, ["gap", str(cap)])
    assert no_model.exit_code == 2 and "(it served /models/tiny); pass --model" in no_model.output


def test_run_json_is_found_beside_a_dotted_capture_name():
    from profattr.trace.reader import run_json_path

    assert run_json_path(Path("d/h200.eager.sqlite")) == Path("d/h200.eager.run.json")
    assert run_json_path(Path("d/x.nsys-rep")) == Path("d/x.run.json")


@pytest.mark.parametrize("name", WORKLOAD_CAPTURES)
def test_waterfall_closes_on_real_workload_captures(name, export_example, tmp_path):
    # the committed run.json sits beside the committed capture; the export may live elsewhere: pass it explicitly
    sqlite_path = export_example(name)
    run_json = ROOT / "examples" / "h200" / f"{name}.run.json"
    result = CliRunner().invoke(cli, ["gap", str(sqlite_path), "--run-json", str(run_json), "--format", "json"])
    assert result.exit_code == 0, result.output
    gap = json.loads(result.output)
    conn = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    bandwidth = dict(conn.execute("SELECT id, memoryBandwidth FROM TARGET_INFO_GPU"))
    for dev in gap["devices"]:
        assert abs(dev["floor_ms"] + math.fsum(c["ms"] for c in dev["components"]) - dev["measured_step_ms"]) < 1e-9
        assert 0 < dev["floor_ms"] < dev["measured_step_ms"]
        if bandwidth.get(dev["device"]):
            assert dev["memory_bandwidth_bytes_per_s"] == bandwidth[dev["device"]]
