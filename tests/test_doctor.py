"""`profattr doctor`: the real few-second capture of cpu_smoke (with a real nsys), and what it says when pieces are
missing."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from profattr.capture import doctor, environment
from profattr.tools import nsys as nsys_tool
from profattr.cli import cli
from profattr.errors import ProfattrError


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def by_check(output: str) -> dict:
    return {f["check"]: f for f in json.loads(output)["findings"]}


@pytest.mark.nsys
def test_doctor_real_capture_counts_the_ranges():
    try:
        tool = nsys_tool.find_nsys()
    except ProfattrError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must have a real nsys: {exc.format_message()}")
        pytest.skip(exc.format_message())
    result = invoke(["doctor", "--format", "json"])
    found = by_check(result.output)
    nsys_version = subprocess.run([tool.path, "--version"], capture_output=True, text=True).stdout
    assert found["nsys"]["data"]["version"] in nsys_version
    capture = found["capture"]
    assert capture["status"] == "pass", capture
    # cpu_smoke --steps 20 --layers 2: 20 steps + 40 layers + 80 blocks
    assert capture["data"]["ranges_emitted"] == 20 * (1 + 2 * 3)
    assert capture["data"]["ranges_recorded"] == capture["data"]["ranges_emitted"]
    assert found["nvtx"]["data"]["version"] == version("nvtx")
    assert result.exit_code == (1 if any(f["status"] == "fail" for f in found.values()) else 0)


def test_doctor_without_nsys_says_how_to_get_it(tmp_path):
    result = invoke(["doctor", "--skip-capture", "--format", "json"],
                    env={"PROFATTR_NSYS": str(tmp_path / "missing")})
    assert result.exit_code == 1
    found = by_check(result.output)
    assert found["nsys"]["status"] == "fail" and "scripts/install-nsys" in found["nsys"]["message"]
    assert found["importer"]["status"] == "skip" and found["capture"]["status"] == "skip"


def test_doctor_table_lists_every_piece():
    result = invoke(["doctor", "--skip-capture"])
    names = [ln.split()[1] for ln in result.output.strip().splitlines()[1:-1]]
    assert names == ["nsys", "importer", "nvtx", "capture", "gpu", "torch", "sglang", "flashinfer", "triton"]


@pytest.mark.parametrize("installed, status", [("0.2.11", "pass"), ("0.2.12", "warn"), ("0.2.17", "warn"),
                                               (None, "fail")])
def test_nvtx_versions_that_nsys_2023_records(installed, status):
    f = doctor.check_nvtx_package({"nvtx": installed})
    assert f.status == status
    if status != "pass":
        assert "nvtx<0.2.12" in f.message


def test_gpu_probe_reads_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 580.159, 143771, 00000000:18:00.0, GPU-abc'\n"
                   "echo '1, NVIDIA H200, 580.159, 143771, 00000000:2A:00.0, GPU-def'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    gpus, error = environment.nvidia_smi_gpus()
    assert error is None
    assert gpus[1] == {"index": 1, "name": "NVIDIA H200", "driver_version": "580.159", "memory_total_mib": 143771,
                       "pci_bus_id": "00000000:2A:00.0", "uuid": "GPU-def"}
    f = doctor.check_gpu()
    assert f.status == "pass" and "2 GPU(s): NVIDIA H200; driver 580.159" in f.message
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert doctor.check_gpu().status == "warn"
