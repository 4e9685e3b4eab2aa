"""`profattr capture` with a real Nsight Systems: a CPU command (cpu_smoke), the full SGLang flow against the stub
server (tests/stub_sglang.py, launched under nsys), the .qdstrm path of a target-only nsys and `--finish`.

Expected numbers come from outside profattr: the SQL below on the export, the ranges cpu_smoke says it emitted,
the requests the stub logged, the step times the stub was told to take, and `nsys --version`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import default_sigint
from profattr.tools import nsys as nsys_tool
from profattr.cli import cli
from profattr.errors import ProfattrError

STUB = Path(__file__).with_name("stub_sglang.py")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def real_nsys() -> nsys_tool.Nsys:
    """The nsys the product would use; skip without one, except in CI, where a missing nsys is a failure."""
    try:
        return nsys_tool.find_nsys()
    except ProfattrError as exc:
        if IN_CI:
            pytest.fail(f"CI must have a real nsys (scripts/install-nsys): {exc.format_message()}")
        pytest.skip(f"no nsys here: {exc.format_message()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def query(db: Path, sql: str, params=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


# NVTX push/pop ranges by name, straight from the export
RANGES_BY_NAME = """
SELECT COALESCE(s.value, n.text) AS name, COUNT(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
WHERE n.eventType = 59 GROUP BY name"""
# push/pop ranges with their text (nsys keeps a message in `text`, or in StringIds via `textId`)
NAMED = """(SELECT n.rowid AS id, n.start, n."end", n.globalTid, COALESCE(s.value, n.text) AS name
            FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59)"""
# ranges named like ?1 lying inside a range named like ?2 on the same thread
NESTED = f"""
SELECT COUNT(DISTINCT i.id) FROM {NAMED} i JOIN {NAMED} o
  ON i.globalTid = o.globalTid AND i.start >= o.start AND i."end" <= o."end" AND i.id != o.id
WHERE i.name LIKE ? AND o.name LIKE ?"""


# --- a real CPU capture: profattr capture -- python -m profattr.workloads.cpu_smoke -------------------------------

@pytest.fixture(scope="module")
def cpu_capture(tmp_path_factory):
    tool = real_nsys()
    out = tmp_path_factory.mktemp("cpu")
    meta = out / "emitted.json"
    result = invoke(["capture", "-o", str(out), "--name", "smoke", "--trace", "nvtx", "--capture-range", "none",
                     "--", sys.executable, "-m", "profattr.workloads.cpu_smoke", "--steps", "7", "--layers", "3",
                     "--meta-out", str(meta)])
    return {"out": out, "result": result, "emitted": json.loads(meta.read_text()), "nsys": tool}


@pytest.mark.nsys
def test_cpu_capture_writes_report_export_and_run(cpu_capture):
    out, result = cpu_capture["out"], cpu_capture["result"]
    assert result.exit_code == 0, result.output
    for suffix in (".nsys-rep", ".sqlite", ".run.json", ".log"):
        assert (out / f"smoke{suffix}").stat().st_size > 0
    assert not list(out.glob("*.partial"))


@pytest.mark.nsys
def test_cpu_capture_records_every_nvtx_range_the_program_emitted(cpu_capture):
    db = cpu_capture["out"] / "smoke.sqlite"
    recorded = dict(query(db, RANGES_BY_NAME))
    assert recorded == cpu_capture["emitted"]["ranges"]  # 7 steps x 3 layers x (attention, mlp)
    assert recorded["smoke_step"] == 7 and recorded["attention"] == 21
    # nesting survives: every layer range inside a step, every block inside a layer
    assert query(db, NESTED, ("layer_%", "smoke_step"))[0][0] == 21
    assert query(db, NESTED, ("mlp", "layer_%"))[0][0] == 21


@pytest.mark.nsys
def test_cpu_capture_run_json_records_what_ran(cpu_capture):
    out = cpu_capture["out"]
    run = json.loads((out / "smoke.run.json").read_text())
    assert run["schema"] == "profattr.run/1" and run["status"] == "complete" and run["target"] == "command"
    assert run["commands"]["target"] == [sys.executable, "-m", "profattr.workloads.cpu_smoke", "--steps", "7",
                                         "--layers", "3", "--meta-out", str(out / "emitted.json")]
    profile = run["commands"]["profile"]
    assert profile[1] == "profile" and "--trace=nvtx" in profile and "--sample=none" in profile
    assert not any(a.startswith("--capture-range") for a in profile)
    assert profile[-len(run["commands"]["target"]):] == run["commands"]["target"]
    version = subprocess.run([cpu_capture["nsys"].path, "--version"], capture_output=True, text=True).stdout
    assert run["nsys"]["version"] in version
    from importlib.metadata import version as dist_version
    assert run["packages"]["nvtx"] == dist_version("nvtx")
    assert set(run["files"].values()) == {"smoke.nsys-rep", "smoke.sqlite", "smoke.run.json", "smoke.log"}
    statuses = {f["check"]: f["status"] for f in run["check"]["findings"]}
    assert statuses["kernels"] == "skip" and statuses["nvtx"] == "pass"


@pytest.mark.nsys
def test_cpu_capture_refuses_to_overwrite_without_force(cpu_capture):
    out = cpu_capture["out"]
    before = (out / "smoke.sqlite").stat().st_mtime_ns
    result = invoke(["capture", "-o", str(out), "--name", "smoke", "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output and "smoke.sqlite" in result.output
    assert (out / "smoke.sqlite").stat().st_mtime_ns == before


@pytest.mark.nsys
def test_window_that_never_opens_is_a_clear_error(tmp_path):
    real_nsys()
    result = invoke(["capture", "-o", str(tmp_path), "--name", "nowin", "--",
                     sys.executable, "-m", "profattr.workloads.cpu_smoke", "--steps", "2"])
    assert result.exit_code == 2
    assert "nsys wrote no report" in result.output and "cudaProfilerStart" in result.output
    run = json.loads((tmp_path / "nowin.run.json").read_text())
    assert run["status"] == "complete" and "report" not in run["files"]


# --- the SGLang flow against the stub server, under a real nsys -----------------------------------------------------
# The stub (tests/stub_sglang.py) follows SGLang 0.5.16: python/sglang/launch_server.py (command line),
# python/sglang/srt/entrypoints/http_server.py (/health, /generate with server-sent events, plain-text
# /start_profile and /stop_profile), python/sglang/srt/managers/tokenizer_control_mixin.py (a failed profile
# request is a 500), python/sglang/srt/managers/scheduler_components/profiler_manager.py (num_steps closes the
# window by itself) and python/sglang/srt/managers/tokenizer_manager.py (cumulative streamed output_ids, meta_info).

STEP_MS, PROFILED_STEP_MS = 4.0, 8.0
SGL = dict(steps=5, batch=2, warmup=1, trials=3, input_len=12, max_new_tokens=16)


def stub_env(events: Path, **extra) -> dict:
    env = {"STUB_SGLANG_EVENTS": str(events), "STUB_SGLANG_STEP_MS": str(STEP_MS),
           "STUB_SGLANG_PROFILED_STEP_MS": str(PROFILED_STEP_MS), "STUB_SGLANG_STARTUP_S": "0.3"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def stub_args(out: Path, model: Path, port: int, name: str = "stub", **kw) -> list:
    o = dict(SGL, **kw)
    return ["capture", "-o", str(out), "--name", name, "--model", str(model), "--backend", "cutlass", "--tp", "2",
            "--port", str(port), "--launcher", f"{sys.executable} {STUB}", "--trace", "nvtx",
            "--capture-range", "none", "--steps", str(o["steps"]), "--batch", str(o["batch"]),
            "--warmup", str(o["warmup"]), "--trials", str(o["trials"]), "--input-len", str(o["input_len"]),
            "--max-new-tokens", str(o["max_new_tokens"]), "--health-timeout", str(o.get("health_timeout", 60)),
            "--", "--load-format", "dummy", "--skip-tokenizer-init"]


def events_of(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def stub_capture(tmp_path_factory):
    real_nsys()
    out = tmp_path_factory.mktemp("stub")
    model = out / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    events = out / "events.jsonl"
    result = invoke(stub_args(out, model, free_port()), env=stub_env(events))
    run = json.loads((out / "stub.run.json").read_text())
    return {"out": out, "model": model, "result": result, "run": run, "events": events_of(events)}


@pytest.mark.nsys
def test_stub_flow_completes_and_checks(stub_capture):
    result, run = stub_capture["result"], stub_capture["run"]
    assert result.exit_code == 0, result.output
    assert run["status"] == "complete"
    assert {"stub.nsys-rep", "stub.sqlite", "stub.run.json", "stub.log"} <= set(run["files"].values())
    assert "overhead" in result.output  # the check table is printed


@pytest.mark.nsys
def test_stub_server_got_the_command_line(stub_capture):
    launch = [e for e in stub_capture["events"] if e["event"] == "launch"]
    assert len(launch) == 1
    assert launch[0]["argv"][:6] == ["--model-path", str(stub_capture["model"]), "--tp", "2",
                                     "--moe-runner-backend", "flashinfer_cutlass"]
    assert launch[0]["extra"] == ["--load-format", "dummy", "--skip-tokenizer-init"]
    run = stub_capture["run"]
    assert run["backend"] == {"requested": "cutlass", "sglang": "flashinfer_cutlass"}
    assert run["tp"] == 2 and run["model"] == str(stub_capture["model"])
    assert run["server"]["args"] == ["--load-format", "dummy", "--skip-tokenizer-init"]


@pytest.mark.nsys
def test_stub_requests_follow_the_protocol(stub_capture):
    ev = stub_capture["events"]
    gens = [e for e in ev if e["event"] == "generate"]
    # warm-up, timed rounds and the window round, each with `batch` concurrent streams
    assert len(gens) == (SGL["warmup"] + SGL["trials"] + 1) * SGL["batch"]
    for g in gens:
        assert g["prompt_tokens"] == SGL["input_len"] and g["stream"] is True
        assert g["sampling_params"] == {"max_new_tokens": SGL["max_new_tokens"], "temperature": 0, "ignore_eos": True}
    starts = [e for e in ev if e["event"] == "start_profile"]
    assert [s["body"] for s in starts] == [{"activities": ["CUDA_PROFILER"], "num_steps": SGL["steps"]}]
    order = [e["event"] for e in ev if e["event"] in ("generate", "start_profile")]
    assert order.index("start_profile") == (SGL["warmup"] + SGL["trials"]) * SGL["batch"]
    assert [e["reason"] for e in ev if e["event"] == "stop_profile"] == ["num_steps"]
    assert [e["signal"] for e in ev if e["event"] == "shutdown"] == ["SIGINT"]  # stopped cleanly
    window = stub_capture["run"]["window"]
    assert window["closed_by"] == "num_steps" and window["start_profile_answer"] == "Start profiling."


@pytest.mark.nsys
def test_stub_window_holds_the_requested_steps(stub_capture):
    db = stub_capture["out"] / "stub.sqlite"
    assert query(db, f"SELECT COUNT(*) FROM {NAMED} WHERE name = 'stub_profile_window'") == [(1,)]
    assert query(db, NESTED, ("stub_forward_step", "stub_profile_window"))[0][0] == SGL["steps"]


@pytest.mark.nsys
def test_stub_timing_is_recorded_as_measured(stub_capture):
    # what the run recorded follows from the rounds it recorded (no bounds on wall-clock time: the machine is shared)
    timing = stub_capture["run"]["timing"]
    rounds = timing["unprofiled"]["rounds_ms_per_token"]
    assert len(rounds) == timing["unprofiled"]["n"] == SGL["trials"]
    assert timing["ms_per_token_unprofiled"] == statistics.median(rounds)
    assert timing["unprofiled"]["min"] == min(rounds) and timing["unprofiled"]["max"] == max(rounds)
    # client-side only: this capture traces no CUDA, so there are no GPU steps to measure it in
    assert timing["ms_per_token_profiled_client"] > 0
    assert "ms_per_token_profiled" not in timing and "cudaProfilerStop" in timing["profiled_client_caveat"]
    overhead = next(f for f in stub_capture["run"]["check"]["findings"] if f["check"] == "overhead")
    ratio = timing["ms_per_token_profiled_client"] / timing["ms_per_token_unprofiled"]
    assert overhead["data"]["ratio"] == pytest.approx(ratio)
    assert overhead["status"] == ("pass" if ratio <= 1.3 else "warn" if ratio <= 3.0 else "fail")
    assert overhead["data"]["profiled_source"] == "client-side"


class ScriptedClient:
    """Answers generate_stream with token arrival times from a script (an injected clock), not a server."""

    def __init__(self, per_token_ms):
        self.per_token_ms = list(per_token_ms)
        self.timeout_s = 5
        self.calls = 0

    def generate_stream(self, body, first_token=None, timeout_s=None):
        from profattr.capture.sglang import StreamResult

        step = self.per_token_ms[self.calls % len(self.per_token_ms)] / 1e3
        self.calls += 1
        n = body["sampling_params"]["max_new_tokens"]
        r = StreamResult(sent_s=0.0, times_s=[0.05 + i * step for i in range(n)], tokens=list(range(1, n + 1)))
        if first_token is not None:
            first_token.set()
        return r


def test_unprofiled_timing_arithmetic_with_an_injected_clock(tmp_path):
    from profattr.capture import plan as capture_plan
    from profattr.capture.drive import time_unprofiled

    p = capture_plan.plan(capture_plan.Options(out_dir=tmp_path, model=str(tmp_path), backend="triton", warmup=2,
                                               trials=3, dry_run=True, nsys="/nonexistent"))
    client = ScriptedClient([9.0, 9.0, 4.0, 6.0, 5.0])  # two warm-up rounds, then three timed ones
    from profattr.capture.sglang import Requests

    timing = time_unprofiled(p, client, Requests("same", 1, 16), 1, lambda m: None)
    assert timing["unprofiled"]["rounds_ms_per_token"] == pytest.approx([4.0, 6.0, 5.0])
    assert timing["ms_per_token_unprofiled"] == pytest.approx(5.0)
    assert client.calls == 5


@pytest.mark.nsys
def test_server_exiting_early_is_reported_with_its_log(tmp_path):
    real_nsys()
    events = tmp_path / "events.jsonl"
    args = stub_args(tmp_path, tmp_path, free_port(), name="crash")
    args[args.index("--capture-range") + 1] = "cudaProfilerApi"  # nothing recorded: nsys writes no report
    result = invoke(args, env=stub_env(events, STUB_SGLANG_CRASH_AFTER_S=0.2))
    assert result.exit_code == 2
    assert "exited (code 3)" in result.output and "before it was healthy" in result.output
    assert "CUDA error: out of memory (simulated)" in result.output  # the server's last log lines
    assert "crash.log" in result.output
    assert json.loads((tmp_path / "crash.run.json").read_text())["status"] == "failed"


@pytest.mark.nsys
def test_server_dying_mid_window_keeps_what_nsys_wrote(tmp_path):
    real_nsys()
    events = tmp_path / "events.jsonl"
    args = stub_args(tmp_path, tmp_path, free_port(), name="midway")
    result = invoke(args, env=stub_env(events, STUB_SGLANG_CRASH_IN_WINDOW_STEPS=3))
    assert result.exit_code == 2, result.output
    assert "illegal memory access was encountered (simulated)" in result.output  # the server's last log lines
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "midway.log" in error[0], result.output
    run = json.loads((tmp_path / "midway.run.json").read_text())
    assert run["status"] == "failed"
    # nsys wrote its report when the target died; it is kept, exported and named in the error
    assert (tmp_path / "midway.nsys-rep").exists() and "midway.nsys-rep" in error[0]
    started = [e for e in events_of(events) if e["event"] == "start_profile"]
    assert len(started) == 1


@pytest.mark.nsys
def test_server_never_healthy_times_out_and_is_stopped(tmp_path):
    real_nsys()
    events = tmp_path / "events.jsonl"
    # long enough for the stub to have logged its start under nsys on a busy machine, far short of its 120 s
    args = stub_args(tmp_path, tmp_path, free_port(), name="slow", health_timeout=10)
    args[args.index("--capture-range") + 1] = "cudaProfilerApi"
    result = invoke(args, env=stub_env(events, STUB_SGLANG_STARTUP_S=120))
    assert result.exit_code == 2
    assert "not healthy after" in result.output and "--health-timeout 10" in result.output
    assert "Uvicorn running" in result.output
    assert [e["signal"] for e in events_of(events) if e["event"] == "shutdown"] == ["SIGINT"]


@pytest.mark.nsys
def test_ctrl_c_keeps_and_exports_what_nsys_wrote(tmp_path):
    real_nsys()
    events = tmp_path / "events.jsonl"
    args = stub_args(tmp_path, tmp_path, free_port(), name="intr")
    env = dict(os.environ, **stub_env(events, STUB_SGLANG_STARTUP_S=120))
    proc = subprocess.Popen([sys.executable, "-m", "profattr", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while not any(e["event"] == "health" for e in events_of(events)) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "interrupted" in output and "intr.nsys-rep" in output and "intr.sqlite" in output
    run = json.loads((tmp_path / "intr.run.json").read_text())
    assert run["status"] == "interrupted" and run["capture"]["target_stopped_by"] == "SIGINT"
    assert query(tmp_path / "intr.sqlite", "SELECT COUNT(*) FROM StringIds")[0][0] > 0


# --- a target-only nsys leaves a .qdstrm; --finish imports, exports and checks it ----------------------------------

def target_only_copy(tool: nsys_tool.Nsys, dest: Path) -> str | None:
    """A copy of the target half of `tool` (hard links where possible) with no host-linux-x64 beside it."""
    real = Path(os.path.realpath(tool.path))
    candidates = [real] + [Path(p) for p in nsys_tool._script_targets(tool.path)]
    target = next((c.parent for c in candidates if c.parent.name.startswith("target-linux")), None)
    if target is None:
        return None
    copy = dest / target.name
    try:
        subprocess.run(["cp", "-al", str(target), str(copy)], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError):
        shutil.copytree(target, copy, symlinks=True)
    return str(copy / "nsys")


@pytest.mark.nsys
def test_qdstrm_capture_then_finish(tmp_path):
    tool = real_nsys()
    if not tool.importer:
        pytest.skip("this nsys has no importer to finish with")
    target_nsys = target_only_copy(tool, tmp_path)
    if target_nsys is None:
        pytest.skip("this nsys install has no target-linux-x64 folder to copy")
    assert nsys_tool.find_importer(target_nsys) is None
    out = tmp_path / "cap"
    result = invoke(["capture", "-o", str(out), "--nsys", target_nsys, "--trace", "nvtx", "--capture-range", "none",
                     "--", sys.executable, "-m", "profattr.workloads.cpu_smoke", "--steps", "4"])
    assert result.exit_code == 0, result.output
    assert (out / "cpu_smoke.qdstrm").exists() and not (out / "cpu_smoke.nsys-rep").exists()
    assert "--finish" in result.output
    run = json.loads((out / "cpu_smoke.run.json").read_text())
    assert run["status"] == "needs_import" and run["nsys"]["importer"] is None
    unfinished = invoke(["check", str(out)])
    assert unfinished.exit_code == 2 and "--finish" in unfinished.output

    finished = invoke(["capture", "--finish", str(out)])
    assert finished.exit_code == 0, finished.output
    run = json.loads((out / "cpu_smoke.run.json").read_text())
    assert run["status"] == "complete"
    # file names relative to the capture folder, the tool by name and version: nothing of this machine's paths
    assert run["commands"]["import"] == ["QdstrmImporter", "-i", "cpu_smoke.qdstrm", "-o", "cpu_smoke.nsys-rep"]
    assert run["commands"]["export"][0] == "nsys" and run["commands"]["export"][-2:] == ["cpu_smoke.sqlite",
                                                                                         "cpu_smoke.nsys-rep"]
    finished = run["finished_with"]
    assert finished["nsys"] == "nsys" and finished["version"] == tool.version
    assert finished["importer"] == "QdstrmImporter" and str(tmp_path) not in json.dumps(run["finished_with"])
    assert dict(query(out / "cpu_smoke.sqlite", RANGES_BY_NAME))["smoke_step"] == 4
    assert invoke(["check", str(out)]).exit_code == 0
    again = invoke(["capture", "--finish", str(out)])
    assert again.exit_code == 2 and "--force" in again.output

    # a bare NAME.qdstrm (plain `nsys profile` on a machine without the importer) finishes without a run.json
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(out / "cpu_smoke.qdstrm", bare / "plain.qdstrm")
    finished = invoke(["capture", "--finish", str(bare / "plain.qdstrm")])
    assert finished.exit_code == 0, finished.output
    run = json.loads((bare / "plain.run.json").read_text())
    assert run["status"] == "complete" and any("bare plain.qdstrm" in n for n in run["notes"])
    assert dict(query(bare / "plain.sqlite", RANGES_BY_NAME))["smoke_step"] == 4


# --- an nsys too old for the traced CUDA runtime ---------------------------------------------------------------------

def fake_tool(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


FAKE_VERSION = ('if [ "$1" = "--version" ]; then echo "NVIDIA Nsight Systems version 2023.4.4.54-234433681190v0"; '
                'exit 0; fi\n')
# what QdstrmImporter of nsys 2023.4.4 printed for a CUDA 13 stream with torch._grouped_mm launches in the window
UNKNOWN_API = "Importer error: Unknown runtime API function index: 412"


def test_importer_too_old_for_the_cuda_runtime_is_one_line_and_keeps_the_stream(tmp_path):
    importer = fake_tool(tmp_path / "QdstrmImporter", f'echo "{UNKNOWN_API}" >&2\nexit 1\n')
    nsys = fake_tool(tmp_path / "nsys", FAKE_VERSION)
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "wl.qdstrm").write_bytes(b"raw stream")
    run = {"schema": "profattr.run/1", "name": "wl", "status": "needs_import", "target": "workload",
           "commands": {}, "notes": [], "files": {"qdstrm": "wl.qdstrm", "run": "wl.run.json"}}
    (cap / "wl.run.json").write_text(json.dumps(run))
    result = invoke(["capture", "--finish", str(cap), "--nsys", nsys], env={"PROFATTR_QDSTRM_IMPORTER": importer})
    assert result.exit_code == 2
    errors = [ln for ln in result.output.strip().splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output
    message = errors[0]
    assert "Unknown runtime API function index: 412" in message and "too old for the CUDA runtime" in message
    assert "newer Nsight Systems" in message and "--grouped-kernel bmm" in message and "wl.qdstrm is kept" in message
    assert (cap / "wl.qdstrm").read_bytes() == b"raw stream" and not list(cap.glob("*.nsys-rep"))
    assert json.loads((cap / "wl.run.json").read_text()) == run  # nothing half-written


def test_nsys_profile_failing_on_its_own_import_says_why(tmp_path):
    # a full nsys imports its stream when the target exits; when that import fails, nsys exits non-zero
    nsys = fake_tool(tmp_path / "nsys", FAKE_VERSION + f'echo "{UNKNOWN_API}"\nexit 1\n')
    out = tmp_path / "out"
    result = invoke(["capture", "-o", str(out), "--name", "old", "--nsys", nsys, "--trace", "nvtx",
                     "--capture-range", "none", "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 2
    error = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "too old for the CUDA runtime" in error[0] and "old.qdstrm is kept" in error[0]


# --- several windows from one server: batch sizes x replicates ----------------------------------------------------

@pytest.mark.nsys
@pytest.mark.parametrize("mode", ["nvtx", "session"])
def test_stub_windows_per_batch_and_replicate(tmp_path, mode):
    real_nsys()
    events = tmp_path / "events.jsonl"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["StubForCausalLM"], "hidden_size": 8}))
    args = stub_args(tmp_path, model, free_port(), name="win", batch="1,2")
    i = args.index("--capture-range")
    args[i + 1] = mode
    if mode == "nvtx":
        args[i + 2:i + 2] = ["--nvtx-capture", "stub_profile_window"]
    args[args.index("--") : args.index("--")] = ["--repeat", "2"]
    result = invoke(args, env=stub_env(events))
    # exit 1 only for the overhead check: with no CUDA traced, it compares client-side token times, and a window
    # that ends while nsys writes a report is slowed by it
    failed = [ln for ln in result.output.splitlines() if ln.startswith("capture: check failed")]
    assert result.exit_code == 0 or (result.exit_code == 1 and failed
                                     and all(": overhead:" in ln for ln in failed)), result.output
    names = ["win-bs1-r1", "win-bs1-r2", "win-bs2-r1", "win-bs2-r2"]
    ev = events_of(events)
    gens = [e for e in ev if e["event"] == "generate"]
    # per batch: warm-up and timed rounds, then one round per replicate window
    assert len(gens) == sum((SGL["warmup"] + SGL["trials"] + 2) * b for b in (1, 2))
    assert len([e for e in ev if e["event"] == "start_profile"]) == (4 if mode == "nvtx" else 0)
    assert [e["signal"] for e in ev if e["event"] == "shutdown"] == ["SIGINT"]
    assert not list(tmp_path.glob("win.[0-9]*"))  # nsys's numbered reports were given their window names
    for index, name in enumerate(names, start=1):
        run = json.loads((tmp_path / f"{name}.run.json").read_text())
        assert run["status"] == "complete" and run["name"] == name
        assert run["requests"]["batch"] == int(name[6])
        assert run["session"]["index"] == index and run["session"]["windows"] == names
        assert run["files"]["log"] == "win.log" and run["model_config"]["hidden_size"] == 8
        db = tmp_path / f"{name}.sqlite"
        if mode == "nvtx":
            # each report holds exactly its own window and that window's steps
            assert query(db, f"SELECT COUNT(*) FROM {NAMED} WHERE name = 'stub_profile_window'") == [(1,)]
            assert query(db, NESTED, ("stub_forward_step", "stub_profile_window"))[0][0] == SGL["steps"]
        else:
            # nsys start/stop around the window's requests: no profile window, the requests' steps
            assert query(db, f"SELECT COUNT(*) FROM {NAMED} WHERE name = 'stub_profile_window'") == [(0,)]
            assert query(db, f"SELECT COUNT(*) FROM {NAMED} WHERE name = 'stub_forward_step'")[0][0] >= \
                SGL["max_new_tokens"] - 1


# --- the torch profiler through SGLang's /start_profile (the stub writes traces as profiler_manager.py does) --------

@pytest.mark.parametrize("tp", [1, 2])
def test_stub_torch_profiler_windows_write_traces_that_read(tmp_path, tp):
    events = tmp_path / "events.jsonl"
    args = stub_args(tmp_path, tmp_path, free_port(), name="tw", batch="1,2")
    i = args.index("--trace")
    del args[i:i + 2]
    i = args.index("--capture-range")
    del args[i:i + 2]
    args[args.index("--tp") + 1] = str(tp)
    args[args.index("--"):args.index("--")] = ["--profiler", "torch"]
    result = invoke(args, env=stub_env(events))
    assert result.exit_code in (0, 1), result.output
    starts = [e["body"] for e in events_of(events) if e["event"] == "start_profile"]
    assert [b["activities"] for b in starts] == [["CPU", "GPU"], ["CPU", "GPU"]]
    assert [b["profile_id"] for b in starts] == ["tw-bs1", "tw-bs2"]
    assert all(b["output_dir"] == str(tmp_path.resolve()) and b["with_stack"] is False for b in starts)
    for name, batch in (("tw-bs1", 1), ("tw-bs2", 2)):
        run = json.loads((tmp_path / f"{name}.run.json").read_text())
        assert run["profiler"] == "torch" and run["files"]["traces"] == [f"{name}-TP-{r}.trace.json.gz"
                                                                          for r in range(tp)]
        assert run["server_log"]["resolved"]["moe_runner_backend"] == "flashinfer_cutlass"
        findings = {f["check"]: f for f in run["check"]["findings"]}
        assert findings["kernels"]["status"] == "pass"
        # the stub traced one kernel per step of the window, on every rank
        assert findings["kernels"]["data"]["kernels"] == SGL["steps"] * tp
        assert findings["devices"]["status"] == "pass"
    assert not list(tmp_path.glob("*.nsys-rep")) and not list(tmp_path.glob("*.qdstrm"))


def test_log_tail_shows_a_redrawn_progress_bar_once(tmp_path):
    """nsys redraws "Processing N events: [...]" with carriage returns after a target died: the tail shows its last
    drawing as one line, so the server's own last lines stay in it."""
    from profattr.capture.proc import log_tail

    log = tmp_path / "x.log"
    bar = "".join(f"\rProcessing 12518 events: [{'=' * (i // 2)}{i}%]" for i in range(101))
    log.write_bytes(b"server: Scheduler hit an exception: CUDA error (simulated)\n" + bar.encode() + b"\nGenerated x.nsys-rep\n")
    tail = log_tail(log, lines=3)
    assert tail[0] == "server: Scheduler hit an exception: CUDA error (simulated)"
    assert tail[1].startswith("Processing 12518 events:") and tail[1].endswith("100%]")
    assert tail[2] == "Generated x.nsys-rep"
