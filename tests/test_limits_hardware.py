"""Hardware presets: every number sourced, all-reduce latency interpolation, capture GPU fields overriding."""
from __future__ import annotations

import shutil
import sqlite3

import pytest

from profattr.errors import ProfattrError
from conftest import EXAMPLES
from profattr.attribute.budget import compute_budget
from profattr.limits.gap import budget_gpus
from profattr.limits.hardware import hardware_presets, load_hardware, match_hardware
from profattr.limits.specs import SPECS_DIR, load_toml


def _numbers(table, path=""):
    """Every (path, value-table) whose value is a number, in a preset."""
    for key, value in table.items():
        here = f"{path}.{key}" if path else key
        if isinstance(value, dict) and "value" in value:
            yield here, value
        elif isinstance(value, dict):
            yield from _numbers(value, here)


@pytest.mark.parametrize("name", sorted(p.name for p in (SPECS_DIR / "hardware").glob("*.toml")))
def test_every_hardware_number_has_a_source(name):
    data = load_toml(f"hardware/{name}")
    numbers = list(_numbers(data))
    assert len(numbers) >= 9
    for path, entry in numbers:
        assert isinstance(entry["value"], (int, float)) and entry["value"] > 0, path
        assert len(entry["source"]) > 10, path
    for impl, table in data["allreduce"].items():
        assert table["source"] and table["points"], impl


def test_required_presets_exist():
    assert {"rtx-pro-6000-ws", "rtx-pro-6000-server", "h200", "h100", "b200"} <= set(hardware_presets())
    assert load_hardware("RTX-PRO-6000").id == "rtx-pro-6000-ws"  # alias, any case
    with pytest.raises(ProfattrError, match="valid: b200, h100, h200"):
        load_hardware("a100")


def test_allreduce_latency_interpolates_clamps_and_says_which_points():
    hw = load_hardware("rtx-pro-6000-ws")
    us, how = hw.allreduce_us("oneshot", 8, 12288)
    assert us == pytest.approx(9.2 + (16.5 - 9.2) * (12288 - 8192) / (32768 - 8192))
    assert "8192 B" in how and "32768 B" in how
    assert hw.allreduce_us("oneshot", 8, 64)[0] == 7.5  # below the smallest measured size: that point
    us_big, how_big = hw.allreduce_us("nccl", 8, 1 << 24)
    assert us_big == 28.0 and "not extrapolated" in how_big
    us2, how2 = hw.allreduce_us("oneshot", 2, 1024)
    assert us2 == 6.1 and "no 2-GPU measurement, 4-GPU points used" in how2
    with pytest.raises(ProfattrError, match="valid: nccl, oneshot"):
        hw.allreduce_us("ring", 8, 1024)


def test_peak_flops_fall_back_to_the_next_supported_format():
    h200 = load_hardware("h200")
    assert h200.peak_flops_per_s("nvfp4") == (1979e12, "fp8")  # no FP4 tensor cores on Hopper
    assert load_hardware("b200").peak_flops_per_s("nvfp4") == (9e15, "fp4")


def test_match_hardware_from_device_names():
    assert match_hardware("NVIDIA H200") == "h200"
    assert match_hardware("NVIDIA H100 80GB HBM3") == "h100"
    assert match_hardware("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "rtx-pro-6000-server"
    assert match_hardware("NVIDIA RTX PRO 6000 Blackwell Workstation Edition") == "rtx-pro-6000-ws"
    assert match_hardware("Tesla T4") is None


def _gpu_capture(path, rows):
    """A copy of a real capture whose TARGET_INFO_GPU holds `rows` (id, name, totalMemory, memoryBandwidth,
    clockRate, smCount), and its budget's GPUs by device id (what gap reads)."""
    shutil.copyfile(EXAMPLES / "sglang-triton-bs1.sqlite", path)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM TARGET_INFO_GPU")
    for row in rows:
        conn.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, memoryBandwidth, clockRate, smCount) "
                     "VALUES (1, ?, ?, ?, ?, ?, ?)", row)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    gpus = budget_gpus(compute_budget(path).to_dict())
    assert path.read_bytes() == before  # read-only
    return gpus


def test_capture_gpu_fields_override_the_preset(tmp_path):
    gpus = _gpu_capture(tmp_path / "cap.sqlite", [
        (0, "NVIDIA H200", 150754820096, 4_800_000_000_000, 1_980_000_000, 132),
        (1, "NVIDIA H200", 150754820096, 4_700_000_000_000, 1_980_000_000, 132)])
    assert gpus[1]["memory_bandwidth_bytes_per_s"] == 4.7e12 and gpus[0]["sm_count"] == 132
    hw = load_hardware("h200").with_capture_gpu(gpus[1])
    assert hw.memory_bandwidth_bytes_per_s.value == 4.7e12
    assert "TARGET_INFO_GPU (device 1: NVIDIA H200)" in hw.memory_bandwidth_bytes_per_s.source
    assert hw.clock_hz.value == 1.98e9
    assert hw.link_bandwidth_bytes_per_s == load_hardware("h200").link_bandwidth_bytes_per_s


def test_capture_without_gpu_rows_keeps_the_preset(tmp_path):
    assert _gpu_capture(tmp_path / "nogpu.sqlite", []) == {}
    partial = _gpu_capture(tmp_path / "zero.sqlite", [(0, "NVIDIA H200", None, 0, None, None)])
    hw = load_hardware("h200").with_capture_gpu(partial[0])
    assert hw.memory_bandwidth_bytes_per_s.value == 4.8e12  # zero / missing fields do not override
