"""`profattr capture` without running anything: --dry-run command lines, bad input (one clear line, exit 2), nsys
lookup, and the per-token timing arithmetic. No real nsys needed: where a tool must answer `--version`, a
two-line script does."""
from __future__ import annotations

import json
import shlex
import socket
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profattr.tools import nsys as nsys_tool
from profattr.capture import sglang
from profattr.cli import cli
from profattr.errors import ProfattrError


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def fake_nsys(folder: Path, version: str = "2023.4.4.54-234433681190v0") -> str:
    """A script that answers `--version` like nsys does (and nothing else)."""
    path = folder / "bin" / "nsys"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho 'NVIDIA Nsight Systems version {version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def lines_with(text: str, needle: str) -> list:
    return [ln for ln in text.splitlines() if needle in ln]


# --- dry run ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend, runner", [("cutlass", "flashinfer_cutlass"), ("cutedsl", "flashinfer_cutedsl")])
def test_dry_run_prints_the_commands_a_user_would_type(tmp_path, backend, runner):
    nsys = fake_nsys(tmp_path)
    result = invoke(["capture", "--dry-run", "--nsys", nsys, "--backend", backend, "--model", "M", "--tp", "8",
                     "-o", str(tmp_path / "out"), "--", "--load-format", "dummy"])
    assert result.exit_code == 0, result.output
    profile = shlex.split(lines_with(result.output, " profile ")[0])
    assert profile[:2] == [nsys, "profile"]
    for flag in ("--trace=cuda,nvtx", "--cuda-graph-trace=node", "--trace-fork-before-exec=true",
                 "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--sample=none", "--cpuctxsw=none"):
        assert flag in profile
    server = profile[profile.index("-o") + 2:]
    assert server == [sys.executable, "-m", "sglang.launch_server", "--model-path", "M", "--tp", "8",
                      "--moe-runner-backend", runner, "--host", "127.0.0.1", "--port", "30000",
                      "--load-format", "dummy"]
    start = shlex.split(lines_with(result.output, "/start_profile")[0])
    assert json.loads(start[start.index("-d") + 1]) == {"activities": ["CUDA_PROFILER"], "num_steps": 20}
    generate = shlex.split(lines_with(result.output, "/generate")[0])
    body = json.loads(generate[generate.index("-d") + 1])
    assert body["sampling_params"] == {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
    assert len(body["input_ids"]) == 64 and body["stream"] is True
    assert "curl -s http://127.0.0.1:30000/health" in result.output
    assert lines_with(result.output, "nsys export --type sqlite") or lines_with(result.output, " export --type sqlite")
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_dry_run_workload_uses_torchrun_for_tp(tmp_path):
    nsys = fake_nsys(tmp_path)
    result = invoke(["capture", "--dry-run", "--nsys", nsys, "--workload", "moe-decode", "--mode", "graph",
                     "--moe-impl", "loop", "--graph-window", "before", "--tp", "2", "--steps", "12", "--batch", "4",
                     "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    profile = shlex.split(lines_with(result.output, " profile ")[0])
    target = profile[profile.index("-o") + 2:]
    head = target[:target.index("--nproc-per-node")]
    assert Path(head[0]).name == "torchrun" or head[-2:] == ["-m", "torch.distributed.run"]
    assert target[target.index("--nproc-per-node"):][:4] == ["--nproc-per-node", "2", "-m",
                                                              "profattr.workloads.moe_decode"]
    args = target[target.index("profattr.workloads.moe_decode") + 1:]
    assert args[:10] == ["--mode", "graph", "--moe-impl", "loop", "--graph-window", "before", "--steps", "12",
                         "--batch", "4"]
    assert args[10] == "--meta-out" and args[11].endswith("moe-decode-graph-loop-tp2-bs4.workload.json")


def test_dry_run_works_without_nsys(tmp_path):
    result = invoke(["capture", "--dry-run", "--model", "M", "--backend", "triton", "-o", str(tmp_path)],
                    env={"PROFATTR_NSYS": str(tmp_path / "missing"), "PATH": "/nonexistent",
                         "PROFATTR_CACHE": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "nsys not found here" in result.output and "--moe-runner-backend triton" in result.output


# --- bad input: one line, exit 2 ----------------------------------------------------------------------------------

def test_unknown_backend_lists_valid_ones(tmp_path):
    result = invoke(["capture", "--model", str(tmp_path), "--backend", "cutlas"])
    assert result.exit_code == 2
    assert "unknown backend 'cutlas'" in result.output
    for name in ("cutlass", "cutedsl", "triton", "triton_kernel", "flashinfer_trtllm"):
        assert name in result.output


def test_model_path_missing(tmp_path):
    result = invoke(["capture", "--model", str(tmp_path / "nope"), "--backend", "triton"])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_nsys_missing_says_how_to_get_one(tmp_path):
    result = invoke(["capture", "--model", str(tmp_path), "--backend", "triton"],
                    env={"PROFATTR_NSYS": str(tmp_path / "missing")})
    assert result.exit_code == 2
    assert "scripts/install-nsys" in result.output and "PROFATTR_NSYS" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_nsys_too_old(tmp_path):
    old = fake_nsys(tmp_path, "2021.2.1.58-642947b")
    result = invoke(["capture", "--nsys", old, "--", "true"])
    assert result.exit_code == 2 and "older than 2022.4" in result.output and "scripts/install-nsys" in result.output


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        result = invoke(["capture", "--nsys", fake_nsys(tmp_path), "--model", str(tmp_path), "--backend", "triton",
                         "--port", str(port), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"port {port}" in result.output and "in use" in result.output
    assert not (tmp_path / "out").exists()


def test_existing_capture_needs_force(tmp_path):
    (tmp_path / "mine.sqlite").write_text("x")
    result = invoke(["capture", "--nsys", fake_nsys(tmp_path), "-o", str(tmp_path), "--name", "mine", "--", "true"])
    assert result.exit_code == 2 and "already exists" in result.output and "--force" in result.output
    assert (tmp_path / "mine.sqlite").read_text() == "x"


@pytest.mark.parametrize("args, message", [
    (["--steps", "20", "--max-new-tokens", "22"], "must be at least --steps + 4"),
    (["--", "--port", "1"], "clashes"),
    (["--", "--moe-runner-backend=triton"], "clashes"),
    (["--batch", "0"], "--batch must be at least 1"),
    (["--workload", "moe-decode"], "either --model"),
])
def test_inconsistent_options(tmp_path, args, message):
    result = invoke(["capture", "--dry-run", "--model", str(tmp_path), "--backend", "triton", *args])
    assert result.exit_code == 2 and message in result.output


def test_nothing_to_capture():
    result = invoke(["capture"])
    assert result.exit_code == 2 and "nothing to capture" in result.output


# --- nsys lookup ------------------------------------------------------------------------------------------------

def test_lookup_order_and_explicit_paths_must_work(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cached = fake_nsys(cache / "nsys-trixie")
    env_nsys = fake_nsys(tmp_path / "env")
    monkeypatch.setenv("PROFATTR_CACHE", str(cache))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("PROFATTR_NSYS", raising=False)
    order = [p for p, _ in nsys_tool.candidates()]
    assert order[-1] == cached
    assert nsys_tool.find_nsys().path in order  # found somewhere; the cache is the last resort
    monkeypatch.setenv("PROFATTR_NSYS", env_nsys)
    assert nsys_tool.candidates("/x/nsys")[:2] == [("/x/nsys", "--nsys"), (env_nsys, "$PROFATTR_NSYS")]
    assert nsys_tool.find_nsys().path == env_nsys
    with pytest.raises(ProfattrError, match="--nsys"):
        nsys_tool.find_nsys(str(tmp_path / "none"))  # an explicit path never falls back silently


def test_importer_found_beside_target_folder_through_a_wrapper(tmp_path, monkeypatch):
    monkeypatch.delenv("PROFATTR_QDSTRM_IMPORTER", raising=False)
    base = tmp_path / "tree" / "nsight-systems"
    target, host = base / "target-linux-x64", base / "host-linux-x64"
    target.mkdir(parents=True)
    host.mkdir()
    real = fake_nsys(tmp_path / "unused")
    (target / "nsys").write_text(Path(real).read_text())
    (target / "nsys").chmod(0o755)
    importer = host / "QdstrmImporter"
    importer.write_text("#!/bin/sh\n")
    importer.chmod(0o755)
    wrapper = tmp_path / "bin" / "nsys"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/usr/bin/env bash\nexec "{target / "nsys"}" "$@"\n')
    assert nsys_tool.find_importer(str(target / "nsys")) == str(importer)
    assert nsys_tool.find_importer(str(wrapper)) == str(importer)
    importer.unlink()
    assert nsys_tool.find_importer(str(wrapper)) is None
    monkeypatch.setenv("PROFATTR_QDSTRM_IMPORTER", real)
    assert nsys_tool.find_importer(str(wrapper)) == real


def test_profile_command_flags():
    gpu = nsys_tool.profile_command("nsys", "out/x", ["python", "s.py"])
    assert gpu == ["nsys", "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--trace-fork-before-exec=true",
                   "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--sample=none",
                   "--cpuctxsw=none", "-o", "out/x", "python", "s.py"]
    cpu = nsys_tool.profile_command("nsys", "x", ["a"], trace="nvtx,osrt", capture_range="none")
    assert "--cuda-graph-trace=node" not in cpu and not any(a.startswith("--capture-range") for a in cpu)


def test_parse_version():
    assert nsys_tool.parse_version("NVIDIA Nsight Systems version 2023.4.4.54-234433681190v0") == (2023, 4, 4, 54)
    assert nsys_tool.parse_version("2024.6.1.90-246148126745v0") == (2024, 6, 1, 90)
    assert nsys_tool.parse_version("no version") == ()


# --- SGLang names and timing arithmetic --------------------------------------------------------------------------

def test_backend_names():
    assert sglang.resolve_backend("cutlass") == "flashinfer_cutlass"
    assert sglang.resolve_backend("cutedsl") == "flashinfer_cutedsl"
    assert sglang.resolve_backend("triton_kernel") == "triton_kernel"
    assert sglang.resolve_backend("sglang:cutlass") == "cutlass"  # SGLang's own runner, verbatim
    assert set(sglang.ALIASES.values()) <= set(sglang.MOE_RUNNER_BACKENDS)
    assert set(sglang.BACKEND_FAMILIES) <= set(sglang.MOE_RUNNER_BACKENDS)
    with pytest.raises(ProfattrError, match="unknown backend"):
        sglang.resolve_backend("fast")


def test_stream_ms_per_token_excludes_prefill_and_handles_grouped_events():
    # tokens 1..5 arrive at 100 ms (prefill), then 110, 120, then tokens 4 and 5 together at 140 ms
    r = sglang.StreamResult(sent_s=0.0, times_s=[0.100, 0.110, 0.120, 0.140], tokens=[1, 2, 3, 5])
    assert r.decode_ms_per_token() == pytest.approx(40 / 4)
    assert r.decode_ms_per_token(max_token=3) == pytest.approx(20 / 2)
    assert sglang.StreamResult(sent_s=0.0, times_s=[0.1], tokens=[1]).decode_ms_per_token() is None
    assert sglang.ms_per_token([r, sglang.StreamResult(0.0, [0.0, 0.03], [1, 4])]) == pytest.approx((10 + 10) / 2)
    s = sglang.spread([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)


def test_dry_run_cpu_samples_adds_sampling_flags(tmp_path):
    """--cpu-samples: nsys profile samples the process tree with Python backtrace sampling; with a session window,
    nsys launch samples Python and nsys start the process tree; without it, sampling stays off."""
    nsys = fake_nsys(tmp_path)
    result = invoke(["capture", "--dry-run", "--nsys", nsys, "--cpu-samples", "--trace", "nvtx", "--capture-range",
                     "none", "-o", str(tmp_path / "out"), "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 0, result.output
    profile = shlex.split(lines_with(result.output, " profile ")[0])
    assert "--sample=process-tree" in profile and "--python-sampling=true" in profile
    assert "--sample=none" not in profile and "--cpuctxsw=none" in profile
    assert profile[-3:] == [sys.executable, "-c", "pass"]
    session = invoke(["capture", "--dry-run", "--nsys", nsys, "--cpu-samples", "--model", "M", "--backend", "cutlass",
                      "--capture-range", "session", "-o", str(tmp_path / "out2")])
    assert session.exit_code == 0, session.output
    launch = shlex.split(lines_with(session.output, " launch ")[0])
    start = shlex.split(lines_with(session.output, " start --session")[0])
    assert "--python-sampling=true" in launch and "--sample=process-tree" in start
    plain = invoke(["capture", "--dry-run", "--nsys", nsys, "--trace", "nvtx", "--capture-range", "none", "-o",
                    str(tmp_path / "out3"), "--", sys.executable, "-c", "pass"])
    profile = shlex.split(lines_with(plain.output, " profile ")[0])
    assert "--sample=none" in profile and not any(a.startswith("--python-sampling") for a in profile)
