"""`profattr capture --server URL`: profiling an SGLang server that is already running, against the stub server
(tests/stub_sglang.py, which follows SGLang 0.5.16's HTTP API, get_server_info and get_model_info included),
started here as a process of its own (profattr never launches it). The server must be left running and
unchanged: no shutdown, no window left open, no request beyond the measured ones."""
from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from badinput import assert_error, assert_one_line_error, cli
from conftest import default_sigint
from profattr.cli import cli as profattr_cli

STUB = Path(__file__).with_name("stub_sglang.py")
ROOT = Path(__file__).resolve().parent.parent
# a served model's config.json, as a real capture recorded it (GLM-5 NVFP4 on H200)
RECORDED = ROOT / "examples/h200/glm5-nvfp4/glm-nvfp4-bs1-r1.run.json"
SGL = dict(steps=5, warmup=1, trials=2, input_len=12, max_new_tokens=16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Server:
    """A stub SGLang server started by the test (as a user's server would have been started beforehand)."""

    def __init__(self, folder: Path, tp: int = 2, backend: str = "flashinfer_cutlass", user=None, events=True,
                 python: str = sys.executable, **env):
        folder.mkdir(parents=True, exist_ok=True)
        self.model = folder / "model"
        self.model.mkdir(exist_ok=True)
        self.config = json.loads(RECORDED.read_text())["model_config"]
        (self.model / "config.json").write_text(json.dumps(self.config))
        self.events = folder / "events.jsonl" if events else None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tp, self.backend = tp, backend
        environment = dict(os.environ, STUB_SGLANG_STARTUP_S="0.2", STUB_SGLANG_STEP_MS="4",
                           STUB_SGLANG_PROFILED_STEP_MS="6")
        environment.update({k: str(v) for k, v in env.items()})
        if self.events:
            environment["STUB_SGLANG_EVENTS"] = str(self.events)
        self.log = open(folder / "server.log", "wb")
        kw = {"user": user} if user is not None else {}
        self.proc = subprocess.Popen([python, str(STUB), "--model-path", str(self.model), "--port",
                                      str(self.port), "--tp", str(tp), "--moe-runner-backend", backend],
                                     env=environment, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, **kw)
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(self.url + "/health", timeout=1) == 200:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, "the stub server did not come up"
            time.sleep(0.1)
        self.ready_events = len(self.read_events())

    def read_events(self) -> list:
        if not self.events or not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines()]

    def since_ready(self) -> list:
        """The events of what profattr did (after the test's own health polls)."""
        return self.read_events()[self.ready_events:]

    def alive_and_healthy(self) -> bool:
        return self.proc.poll() is None and get(self.url + "/health") == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def server(tmp_path):
    made = []

    def start(**kw):
        s = Server(tmp_path / f"server{len(made)}", **kw)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


def capture_args(url: str, out: Path, **kw) -> list:
    o = dict(SGL, **kw)
    args = ["capture", "--server", url, "-o", str(out)] + (["--dry-run"] if o.pop("dry_run", False) else [])
    for key in ("steps", "warmup", "trials", "input_len", "max_new_tokens", "batch", "repeat", "name"):
        if key in o:
            args += ["--" + key.replace("_", "-"), str(o[key])]
    return args


def invoke(args):
    return CliRunner().invoke(profattr_cli, args, catch_exceptions=False)


def assert_failed_run(proc, *needles) -> None:
    """A failure after the progress lines of a started capture: exit 2, no traceback, exactly one `error: ` line,
    the last one, holding each needle."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err and b"Traceback" not in proc.stdout
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err[-2000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])


def trace_events(path: Path) -> list:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


# --- the flow ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attached")
    srv = Server(folder / "server", tp=2)
    out = folder / "out"
    try:
        result = invoke(capture_args(srv.url, out, batch="1,2"))
        alive = srv.alive_and_healthy()
        events = srv.since_ready()
    finally:
        srv.stop()
    return {"srv": srv, "out": out, "result": result, "alive": alive, "events": events,
            "names": ["sglang-flashinfer_cutlass-tp2-bs1", "sglang-flashinfer_cutlass-tp2-bs2"]}


def test_attached_windows_leave_the_server_running_and_unchanged(attached):
    events, srv = attached["events"], attached["srv"]
    assert attached["alive"], "the server must keep running after the capture"
    kinds = [e["event"] for e in events]
    assert "shutdown" not in kinds and "launch" not in kinds
    # only reads, the measured requests, and one window per batch that closed by itself
    assert kinds.count("server_info") == 1 and kinds.count("model_info") == 1
    per_batch = (SGL["warmup"] + SGL["trials"] + 1)  # warm-up, timed rounds, the window's round
    assert kinds.count("generate") == per_batch * (1 + 2)
    starts = [e for e in events if e["event"] == "start_profile"]
    stops = [e for e in events if e["event"] == "stop_profile"]
    assert [s["body"]["profile_id"] for s in starts] == attached["names"]
    assert all(s["body"]["activities"] == ["CPU", "GPU"] and s["body"]["num_steps"] == SGL["steps"]
               and s["body"]["output_dir"] == str(attached["out"].resolve()) for s in starts)
    assert len(stops) == len(starts) and all(s["reason"] == "num_steps" for s in stops)
    assert srv.proc.returncode is not None  # stopped by the test, not before


def test_attached_run_json_records_what_the_server_says(attached):
    srv = attached["srv"]
    for name, batch in zip(attached["names"], (1, 2)):
        run = json.loads((attached["out"] / f"{name}.run.json").read_text())
        assert run["schema"] == "profattr.run/1" and run["status"] == "complete" and run["profiler"] == "torch"
        assert run["server"]["attached"] is True and run["server"]["url"] == srv.url
        assert run["server"]["sglang_version"] == "0.5.16"
        assert run["server"]["server_info_endpoint"] == "/get_server_info"
        assert run["server"]["server_info"]["tp_size"] == srv.tp
        assert run["server"]["model_info"]["model_path"] == str(srv.model)
        assert run["model"] == str(srv.model) and run["model_config"] == srv.config and run["tp"] == srv.tp
        assert run["model_config_source"] == str(srv.model / "config.json")
        assert run["backend"]["sglang"] == srv.backend
        assert run["server_log"]["source"] == "server_info"
        assert run["server_log"]["resolved"]["moe_runner_backend"] == srv.backend
        assert run["requests"]["batch"] == batch
        assert isinstance(run["timing"]["ms_per_token_unprofiled"], float)
        assert "unprofiled_step" not in run["timing"] and "unprofiled_step_note" in run["timing"]
        assert any("attached to a running server" in n for n in run["notes"])
        traces = [f"{name}-TP-{r}.trace.json.gz" for r in range(srv.tp)]
        assert run["files"]["traces"] == traces


def test_attached_check_counts_the_traces_and_skips_what_it_cannot_know(attached):
    for name in attached["names"]:
        run = json.loads((attached["out"] / f"{name}.run.json").read_text())
        findings = {f["check"]: f for f in run["check"]["findings"]}
        kernels = sum(1 for t in run["files"]["traces"] for e in trace_events(attached["out"] / t)
                      if e.get("cat") == "kernel")
        assert findings["kernels"]["status"] == "pass" and findings["kernels"]["data"]["kernels"] == kernels
        assert kernels == SGL["steps"] * attached["srv"].tp
        assert findings["devices"]["status"] == "pass" and findings["steps"]["status"] == "pass"
        for check in ("graphs_recorded", "profiler_version", "server_log"):
            assert findings[check]["status"] == "skip" and "capture --server" in findings[check]["message"]
        # the stub's one kernel is no CUTLASS grouped GEMM: the backend check sees that, as for a launched capture
        assert {c for c, f in findings.items() if f["status"] == "fail"} == {"backend"}
    assert attached["result"].exit_code == 1


def test_attached_captures_work_downstream(attached, tmp_path):
    out = attached["out"]
    a, b = (out / f"{n}-TP-0.trace.json.gz" for n in attached["names"])
    steps = sum(1 for e in trace_events(a) if e.get("cat") == "user_annotation"
                and e["name"].startswith("step[DECODE"))
    budget = cli("budget", a, "--format", "json")
    assert budget.returncode == 0, budget.stderr
    assert json.loads(budget.stdout)["steps"]["count"] == steps
    gap = cli("gap", a, "--run-json", out / f"{attached['names'][0]}.run.json", "-H", "h200", "--format", "json")
    assert gap.returncode == 0, gap.stderr
    model = json.loads(gap.stdout)["model"]
    assert model["tp"] == attached["srv"].tp and model["name"] == attached["srv"].config["model_type"]
    assert "model_config" in model["source"]
    assert cli("diff", a, b).returncode == 0
    ledger = tmp_path / "ledger.sqlite"
    assert cli("ledger", "add", "--ledger", ledger, a, b).returncode == 0
    report = cli("report", "-o", tmp_path / "report", a, b)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "report.md").exists()
    check = cli("check", out / f"{attached['names'][0]}.run.json")
    assert check.returncode == 1 and b"capture --server" in check.stdout


# --- bad input: one clear line, exit 2, the server never left profiling ---------------------------------------------

@pytest.mark.parametrize("url, needle", [
    ("127.0.0.1:30000", "expected http://HOST:PORT"),
    ("https://127.0.0.1:30000", "expected http://HOST:PORT"),
    ("http://127.0.0.1:70000", "not a URL"),
    ("http://127.0.0.1", "needs a host and a port"),
    ("http://127.0.0.1:30000/generate", "root only"),
])
def test_attach_malformed_url(tmp_path, url, needle):
    assert_one_line_error(invoke(capture_args(url, tmp_path / "out")), needle)
    assert not (tmp_path / "out").exists()


def test_attach_nothing_listening(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    assert_error(cli(*capture_args(url, tmp_path / "out")), "nothing answers", url)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("with_health", [False, True])
def test_attach_a_server_that_is_not_sglang(tmp_path, with_health):
    """A plain HTTP server (http.server): 404 to /health; with a file named health it answers 200 there, yet has
    no server-info endpoint."""
    root = tmp_path / "www"
    root.mkdir()
    if with_health:
        (root / "health").write_text("ok")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        result = cli(*capture_args(f"http://127.0.0.1:{port}", tmp_path / "out"))
        if with_health:
            assert_error(result, "no SGLang server-info endpoint", "/get_server_info 404")
        else:
            assert_error(result, "answered 404 to GET /health", "not an SGLang server")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not (tmp_path / "out").exists()


def test_attach_a_server_already_profiling(server, tmp_path):
    srv = server()
    assert post(srv.url + "/start_profile", {"activities": ["CUDA_PROFILER"]}) == 200  # someone else's profile
    result = cli(*capture_args(srv.url, tmp_path / "out"))
    assert_failed_run(result, "refused to open window", "already in progress", "left it as it was")
    kinds = [e["event"] for e in srv.since_ready()]
    assert "stop_profile" not in kinds  # profattr did not stop the other profile ...
    assert post(srv.url + "/stop_profile", {}) == 200  # ... which is still in progress
    assert srv.alive_and_healthy()
    run = json.loads(next((tmp_path / "out").glob("*.run.json")).read_text())
    assert run["status"] == "failed" and run["window"]["start_profile_status"] == 500


def test_attach_a_server_that_dies_in_the_window(server, tmp_path):
    srv = server(STUB_SGLANG_CRASH_IN_WINDOW_STEPS=2)
    result = cli(*capture_args(srv.url, tmp_path / "out"))
    assert_failed_run(result, f"the server at {srv.url} stopped answering")
    assert srv.proc.wait(timeout=10) == 4  # it died by itself (the simulated CUDA error), not by profattr
    run = json.loads(next((tmp_path / "out").glob("*.run.json")).read_text())
    assert run["status"] == "failed" and run["window"]["start_profile_status"] == 200


def test_attach_ctrl_c_stops_the_profiler_and_leaves_the_server(server, tmp_path):
    # slow profiled steps: the window stays open long enough to interrupt inside it
    srv = server(STUB_SGLANG_PROFILED_STEP_MS=300)
    import profattr

    env = dict(os.environ, PYTHONPATH=str(Path(profattr.__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-m", "profattr",
                             *capture_args(srv.url, tmp_path / "out", steps=30, max_new_tokens=40)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while not any(e["event"] == "start_profile" for e in srv.since_ready()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    kinds = [(e["event"], e.get("reason")) for e in srv.since_ready()]
    assert ("stop_profile", "stop_profile") in kinds  # profattr's /stop_profile, before num_steps was reached
    assert ("stop_profile", "num_steps") not in kinds
    assert srv.alive_and_healthy() and ("shutdown", None) not in kinds
    run = json.loads(next((tmp_path / "out").glob("*.run.json")).read_text())
    assert run["status"] == "interrupted" and run["window"]["stop_profile_status"] == 200


def test_attach_output_folder_under_a_regular_file(server, tmp_path):
    """As root, chmod does not stop profattr from writing: a path under a regular file cannot be created by
    anyone."""
    srv = server()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(invoke(capture_args(srv.url, blocker / "out")), "cannot create the output folder",
                          str(blocker / "out"))
    assert "start_profile" not in [e["event"] for e in srv.since_ready()]
    assert srv.alive_and_healthy()


def test_attach_output_folder_the_server_cannot_write(server, tmp_path, monkeypatch):
    """The server runs as another user (nobody) who cannot write -o (tmp_path is 0700, profattr's user's): its
    traces never arrive, and profattr names the folder. chmod cannot make the case for root, who writes anyway,
    and a server of the same user as profattr could write -o: so the test runs the server as nobody, with a
    Python that nobody can run (the system one), and needs root to do so."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root and a system Python to run the server as another user")
    from profattr.capture import drive

    monkeypatch.setattr(drive, "TRACE_WAIT_S", 3)
    srv = server(user=65534, events=False, python=python)
    out = tmp_path / "out"
    result = invoke(capture_args(srv.url, out))
    assert result.exit_code == 2, result.output
    assert "no torch-profiler trace" in result.stderr and str(out.resolve()) in result.stderr
    assert "Traceback" not in result.output
    assert srv.alive_and_healthy()
    run = json.loads(next(out.glob("*.run.json")).read_text())
    assert run["status"] == "failed" and run["window"]["closed_by"] == "num_steps"
    assert b"could not export the trace" in (tmp_path / "server0" / "server.log").read_bytes()


def test_attach_dry_run_contacts_nothing(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a dry run must not need the server
    result = invoke(capture_args(url, tmp_path / "out", batch="1,4", repeat=2, dry_run=True))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"curl -s {url}/get_server_info" in lines
    starts = [line for line in lines if "/start_profile" in line]
    assert len(starts) == 4 and all('"activities":["CPU","GPU"]' in line for line in starts)
    assert not (tmp_path / "out").exists()


def test_served_model_config_from_the_hub_cache(tmp_path, monkeypatch):
    """A server started with a Hugging Face id: its config.json is read from this host's hub cache (the newest
    snapshot); an id with no snapshot here gives none, and so does a folder without config.json."""
    from profattr.capture.attach import served_model_config

    config = json.loads(RECORDED.read_text())["model_config"]
    snapshots = tmp_path / "hub" / "models--zai-org--GLM-5" / "snapshots"
    old, new = snapshots / "aaa", snapshots / "bbb"
    for folder, cfg in ((old, {"model_type": "old"}), (new, config)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(cfg))
    os.utime(old / "config.json", (1, 1))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    got, where = served_model_config("zai-org/GLM-5")
    assert got == config and "bbb" in where
    assert served_model_config("zai-org/absent") == (None, None)
    (tmp_path / "empty").mkdir()
    assert served_model_config(str(tmp_path / "empty")) == (None, None)


def test_attach_does_not_replace_an_earlier_capture_without_force(server, tmp_path):
    srv = server(tp=1)
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "mine.run.json"
    earlier.write_text("{}")
    assert_one_line_error(invoke(capture_args(srv.url, out, name="mine")), "already exists", "--force")
    assert earlier.read_text() == "{}"
    assert "start_profile" not in [e["event"] for e in srv.since_ready()]
    result = invoke(capture_args(srv.url, out, name="mine") + ["--force"])
    assert result.exit_code == 1, result.output  # the stub's kernel is no CUTLASS GEMM: the backend check fails
    assert json.loads(earlier.read_text())["server"]["attached"] is True
    assert (out / "mine-TP-0.trace.json.gz").exists()


def test_stub_answers_a_second_start_as_sglang_does(server):
    """The stand-in follows profiler_manager.py: a start without start_step while a profile runs is answered 200
    (the profile in progress goes on with its own settings); with start_step it fails with 500. This is why the
    window's /start_profile carries start_step (capture/sglang.py torch_profile_body)."""
    srv = server()
    assert post(srv.url + "/start_profile", {"activities": ["CUDA_PROFILER"]}) == 200
    assert post(srv.url + "/start_profile", {"activities": ["CPU", "GPU"], "output_dir": "/nonexistent"}) == 200
    assert post(srv.url + "/start_profile", {"activities": ["CPU", "GPU"], "start_step": 1}) == 500
    kinds = [e["event"] for e in srv.since_ready()]
    assert kinds.count("start_profile") == 1 and "start_profile_restarted" in kinds
    assert post(srv.url + "/stop_profile", {}) == 200
