"""Running a planned capture: start the target under `nsys profile`, drive it (SGLang: health, warm-up, unprofiled
timing, the `/start_profile` window) or wait for it, stop it cleanly, turn what nsys wrote into NAME.nsys-rep and
NAME.sqlite, check it, and record everything in NAME.run.json (`profattr.run/1`). `finish` completes a capture
that nsys left as NAME.qdstrm on a machine without the importer.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from profattr.capture import environment, lint, proc
from profattr.capture import nsys as nsys_tool
from profattr.capture import sglang
from profattr.capture.plan import SCHEMA, SUFFIXES, Plan, shell_join
from profattr.errors import ProfattrError


# --- outputs ------------------------------------------------------------------------------------------------------

def existing_outputs(p: Plan) -> list:
    return [p.path(k) for k in SUFFIXES if p.path(k).exists()]


def prepare_outputs(p: Plan) -> None:
    """Create the folder; refuse to replace an earlier capture of the same name unless --force (then remove only
    the files a capture of this name writes)."""
    found = existing_outputs(p)
    if found and not p.options.force:
        raise ProfattrError(f"a capture named {p.name} already exists in {p.options.out_dir} "
                            f"({', '.join(f.name for f in found)}); pass --force to replace it or choose --name")
    if p.options.out_dir.exists() and not p.options.out_dir.is_dir():
        raise ProfattrError(f"{p.options.out_dir} exists and is not a folder")
    p.options.out_dir.mkdir(parents=True, exist_ok=True)
    for f in found:
        f.unlink()
    stale = p.path("sqlite").with_name(p.path("sqlite").name + ".partial")  # from an interrupted export
    if stale.exists():
        stale.unlink()


def write_run(path: Path, run: dict) -> None:
    """Write run.json atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(run, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def initial_run(p: Plan) -> dict:
    o = p.options
    gpus, gpu_error = environment.nvidia_smi_gpus()
    run = {
        "schema": SCHEMA,
        "name": p.name,
        "status": "running",
        "target": p.target,
        "created_utc": _utc(),
        "capture": {"trace": p.trace, "capture_range": p.capture_range,
                    "cuda_graph_trace": o.cuda_graph_trace if "cuda" in p.trace.split(",") else None},
        "commands": {"profile": p.profile_cmd, "profile_shell": shell_join(p.profile_cmd), "target": p.target_cmd},
        "nsys": {"path": p.nsys.path, "version": p.nsys.version, "source": p.nsys.source,
                 "importer": p.nsys.importer} if p.nsys else None,
        "host": environment.host(),
        "gpus": gpus,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "gpu_probe": gpu_error,
        "packages": environment.package_versions(),
        "tp": o.tp if p.target != "command" else None,
        "backend": None,
        "model": None,
        "server": None,
        "requests": None,
        "window": {"steps_requested": o.steps if p.target != "command" else None},
        "timing": {},
        "workload": None,
        "check": None,
        "files": {},
        "notes": [],
    }
    if p.target == "sglang":
        run["backend"] = {"requested": o.backend or "auto", "sglang": p.backend_sglang}
        run["model"] = o.model
        run["server"] = {"launcher": sglang.launcher_command(o.launcher), "args": list(o.args), "host": o.host,
                         "port": o.port, "health_timeout_s": o.health_timeout_s}
        run["requests"] = {"input_len": o.input_len, "input": "token ids", "max_new_tokens": o.max_new_tokens,
                           "batch": o.batch, "warmup_rounds": o.warmup, "timed_rounds": o.trials,
                           "body": sglang.generate_body(sglang.prompt_ids(o.input_len), o.max_new_tokens)}
        run["window"].update({"start_profile": sglang.profile_body(o.steps)})
    elif p.target == "workload":
        run["workload_request"] = {"name": o.workload, "mode": o.mode, "moe_impl": o.moe_impl,
                                   "graph_window": o.graph_window, "batch": o.batch, "steps": o.steps,
                                   "extra_args": list(o.args)}
    return run


# --- running ------------------------------------------------------------------------------------------------------

class DriveError(Exception):
    """The target failed in a way the user can act on; the message is one line, `details` are log lines."""

    def __init__(self, message: str, details: list | None = None):
        super().__init__(message)
        self.details = details or []


Echo = Callable[[str], None]

CLIENT_CAVEAT = ("client-side: token arrival times inside the window; they include the stall of nsys flushing its "
                 "buffers at cudaProfilerStop, so ms_per_token_profiled is measured in the capture instead")


def _start(p: Plan, log) -> subprocess.Popen:
    env = dict(os.environ, **p.env)
    try:
        # own session: a Ctrl-C in the terminal reaches profattr only, which then stops the target in order
        return subprocess.Popen(p.profile_cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    except OSError as exc:
        raise ProfattrError(f"could not start nsys ({exc}): {shell_join(p.profile_cmd)}") from None


class _Liveness:
    """Is the profiled target still running? Remembers its process groups once nsys has started it."""

    def __init__(self, launcher: subprocess.Popen):
        self.launcher = launcher
        self.groups: list = []

    def __call__(self) -> bool:
        if self.launcher.poll() is not None:
            return False
        for g in proc.target_groups(self.launcher.pid):
            if g not in self.groups:
                self.groups.append(g)
        if not self.groups:
            return True  # nsys has not started the target yet
        return any(proc.group_alive(g) for g in self.groups)


def drive_sglang(p: Plan, launcher: subprocess.Popen, run: dict, echo: Echo) -> None:
    """Health, warm-up, unprofiled timing, the profile window; fills run["server"], ["timing"], ["window"]."""
    client = sglang.Client(p.options.host, p.options.port)
    alive = _Liveness(launcher)
    _wait_healthy(p, client, alive, launcher, run, echo)
    body = sglang.generate_body(sglang.prompt_ids(p.options.input_len), p.options.max_new_tokens)
    try:
        _time_unprofiled(p, client, body, run, echo)
        _profile_window(p, client, body, run, echo)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused/reset/cut off, bad JSON
        what = "the server exited during the requests" if not alive() else "a request to the server failed"
        raise DriveError(f"{what} ({exc})", proc.log_tail(p.path("log"))) from None


def _wait_healthy(p: Plan, client, alive, launcher, run: dict, echo: Echo) -> None:
    o = p.options
    echo(f"waiting for the server to become healthy (up to {o.health_timeout_s:.0f} s; log: {p.path('log')})")
    try:
        health_s = sglang.wait_healthy(client, alive, o.health_timeout_s,
                                       on_tick=lambda s: echo(f"  not healthy yet after {s:.0f} s"))
    except sglang.ServerExited as exc:
        code = launcher.poll()
        how = f"exited (code {code})" if code is not None else "exited"
        raise DriveError(f"the server {how} after {exc.elapsed_s:.0f} s before it was healthy",
                         proc.log_tail(p.path("log"))) from None
    except sglang.ServerTimeout as exc:
        raise DriveError(f"the server was not healthy after {exc.elapsed_s:.0f} s (--health-timeout "
                         f"{o.health_timeout_s:.0f})", proc.log_tail(p.path("log"))) from None
    run["server"]["healthy_after_s"] = round(health_s, 1)
    echo(f"healthy after {health_s:.0f} s")


def _time_unprofiled(p: Plan, client, body: dict, run: dict, echo: Echo) -> None:
    """Warm-up rounds with the window's shapes, then timed rounds outside the window."""
    o = p.options
    for _ in range(o.warmup):
        sglang.run_concurrent(client, body, o.batch)
    echo(f"warm-up done ({o.warmup} round(s) of {o.batch}); timing {o.trials} unprofiled round(s)")
    rounds = [sglang.ms_per_token(sglang.run_concurrent(client, body, o.batch)) for _ in range(o.trials)]
    unprof = sglang.spread(rounds)
    run["timing"].update({
        "method": ("streamed decode: time from the first to the last streamed token of each request divided by "
                   "the tokens between them (prefill excluded), mean over the concurrent requests; median "
                   "over rounds"),
        "ms_per_token_unprofiled": unprof.get("median"),
        "unprofiled": dict(unprof, rounds_ms_per_token=rounds),
        "measured_where": ("same server, before the window opened (nsys attached, not collecting)"
                           if p.capture_range != "none" else
                           "same server, nsys recording throughout (--capture-range none)"),
    })
    if unprof.get("n"):
        echo(f"unprofiled: {unprof['median']:.3f} ms/token (min {unprof['min']:.3f}, max {unprof['max']:.3f})")


def _profile_window(p: Plan, client, body: dict, run: dict, echo: Echo) -> None:
    """Open the window for `steps` forward steps, decode inside it, and make sure it closed."""
    o = p.options
    status, text = client.call("/start_profile", sglang.profile_body(o.steps))
    run["window"].update({"start_profile_status": status, "start_profile_answer": text.strip()[:200]})
    if status != 200:
        raise DriveError(f"POST /start_profile answered {status}: {text.strip()[:200]}")
    echo(f"window open ({o.steps} steps): {text.strip()}")
    window = sglang.run_concurrent(client, body, o.batch)
    # the window's first step is the prefill of these requests, so decode tokens 1..steps-1 lie inside it. Only a
    # secondary figure: nsys flushes its buffers at cudaProfilerStop while these requests still decode, and that
    # stall lands between streamed tokens; the profiled ms/token proper is measured in the capture (finish_outputs)
    prof = sglang.ms_per_token(window, max_token=max(2, o.steps - 1))
    run["timing"]["ms_per_token_profiled_client"] = prof
    run["timing"]["profiled_client_caveat"] = CLIENT_CAVEAT
    time.sleep(1.0)  # let the scheduler reach num_steps and call cudaProfilerStop
    status, _ = client.call("/stop_profile", {})
    # 500 ("Profiling is not in progress"): num_steps closed the window, as intended
    closed_by = {200: "stop_profile", 500: "num_steps"}.get(status, f"unknown (/stop_profile answered {status})")
    run["window"].update({"closed_by": closed_by, "stop_profile_status": status})
    if status == 200:
        run["notes"].append("the window was still open after the requests; /stop_profile closed it")
    if prof is not None:
        echo(f"profiled (client-side): {prof:.3f} ms/token; window closed by {run['window']['closed_by']}")


def wait_target(p: Plan, launcher: subprocess.Popen, echo: Echo) -> None:
    """Workload and command targets end by themselves; wait (with --timeout) and report a failing exit."""
    timeout = p.options.timeout_s or float("inf")
    if not proc.wait_exit(launcher, timeout, on_tick=lambda s: echo(f"  still running after {s:.0f} s")):
        raise DriveError(f"the target ran longer than --timeout {timeout:.0f} s", proc.log_tail(p.path("log")))
    code = launcher.returncode
    if code != 0:
        tail = proc.log_tail(p.path("log"), lines=200)
        too_old = nsys_tool.importer_too_old("\n".join(tail), p.path("qdstrm").name)
        if too_old:  # nsys imported its own stream at exit and could not read it
            raise DriveError(too_old, tail[-5:])
        raise DriveError(f"the target (or nsys) exited with code {code}", tail[-20:])


def wait_for_nsys(launcher: subprocess.Popen, echo: Echo, timeout_s: float = 3600) -> bool:
    """Wait until nsys has written its report and exited. A first Ctrl-C is answered with a note; a second one
    gives up waiting (nsys keeps running in its own session and finishes the file)."""
    interrupts = 0
    while True:
        try:
            done = proc.wait_exit(launcher, timeout_s, on_tick=lambda s: echo(f"  nsys still writing after {s:.0f} s"))
            return done
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts > 1:
                echo("stopped waiting; nsys keeps writing in the background")
                return False
            echo("waiting for nsys to finish writing the report (Ctrl-C again to stop waiting)")


def finish_outputs(p_dir: Path, name: str, run: dict, nsys_path: str | None, importer: str | None, echo: Echo,
                   force: bool = False) -> None:
    """Turn what nsys left (.nsys-rep or .qdstrm) into an export, run the checks, measure the profiled ms/token in
    the capture, and record it all in `run`. Commands are recorded with file names relative to the capture folder
    (run.json travels with its folder, and the paths of the machine that finished it mean nothing elsewhere)."""
    def f(kind):
        return p_dir / (name + SUFFIXES[kind])

    report, qdstrm, sqlite = f("report"), f("qdstrm"), f("sqlite")
    if not report.exists() and qdstrm.exists():
        if importer:
            echo(f"importing {qdstrm.name} with {nsys_tool.IMPORTER_NAME}")
            run["commands"]["import"] = nsys_tool.import_command(nsys_tool.IMPORTER_NAME, qdstrm.name, report.name)
            nsys_tool.import_qdstrm(qdstrm, importer, report, force=force)
        else:
            run["status"] = "needs_import"
            run["notes"].append(f"nsys here has no importer (host-linux-x64/{nsys_tool.IMPORTER_NAME}) and left "
                                f"{qdstrm.name}; on a machine with a full Nsight Systems, run "
                                f"`profattr capture --finish <this folder>`")
    if report.exists():
        if sqlite.exists() and not force:
            raise ProfattrError(f"{sqlite} exists; pass --force to export it again")
        run["commands"]["export"] = nsys_tool.export_command("nsys", report.name, sqlite.name)
        echo(f"exporting {report.name} to SQLite")
        nsys_tool.export_sqlite(report, sqlite, nsys=nsys_path, force=force)
    if sqlite.exists():
        findings, budget = lint.evaluate(sqlite, run)
        record_profiled_timing(run, budget)
        run["check"] = {"status": lint.overall(findings), "findings": [x.to_dict() for x in findings]}
    run["files"] = {kind: f(kind).name for kind in SUFFIXES if f(kind).exists() or kind == "run"}


def record_profiled_timing(run: dict, budget) -> None:
    """Put the profiled ms/token measured in the capture (median step span, per device) into run["timing"]; a
    client-side figure the target measured stays as ms_per_token_profiled_client."""
    timing = run.setdefault("timing", {})
    if "ms_per_token_profiled" in timing and "profiled_source" not in timing:
        # written before the capture was measured: the SGLang driver's client-side figure
        timing["ms_per_token_profiled_client"] = timing.pop("ms_per_token_profiled")
        timing.setdefault("profiled_client_caveat", CLIENT_CAVEAT)
    measured = lint.profiled_timing(budget)
    if measured:
        timing.update(measured)


def _no_report_reason(p: Plan, run: dict) -> str:
    if p.capture_range == "cudaProfilerApi":
        if p.target == "sglang":
            if run["window"].get("start_profile_status") != 200:
                return "the profile window was never opened (/start_profile was not reached)"
            return ("/start_profile succeeded but nsys saw no cudaProfilerStart: SGLang calls it in the base GPU's "
                    "scheduler only, which must run CUDA under nsys (--trace with cuda)")
        return ("the capture window never opened: nothing called cudaProfilerStart (give --capture-range none to "
                "record the whole run of a command that does not)")
    return "nsys recorded nothing (see the log)"


def execute(p: Plan, echo: Echo) -> tuple:
    """Run the plan. Returns (run dict, exit code): 0 ok or needs import, 1 a check failed, 130 interrupted.
    Raises ProfattrError (after writing run.json and keeping partial outputs) when the target failed."""
    o = p.options
    if p.target == "sglang" and sglang.port_in_use(o.host, o.port):
        raise ProfattrError(f"port {o.port} on {o.host} is in use (another server?); stop it or pick --port")
    prepare_outputs(p)
    run = initial_run(p)
    write_run(p.path("run"), run)
    started = time.monotonic()
    echo(f"starting under nsys: {shell_join(p.target_cmd)}")
    with _sigterm_as_interrupt(), open(p.path("log"), "wb") as log:
        error, interrupted, nsys_done = _run_under_nsys(p, run, log, echo)
    run["capture"]["duration_s"] = round(time.monotonic() - started, 1)
    if p.target == "workload":
        _attach_workload(p, run)
    run["status"] = "interrupted" if interrupted else "failed" if error else "complete"
    export_error = None
    if nsys_done:
        try:
            finish_outputs(o.out_dir, p.name, run, p.nsys.path if p.nsys else None,
                           p.nsys.importer if p.nsys else None, echo, force=True)
        except ProfattrError as exc:
            export_error = exc.format_message()
            run["notes"].append(f"export failed: {export_error}")
    else:
        run["files"] = {k: p.path(k).name for k in SUFFIXES if p.path(k).exists() or k == "run"}
        run["notes"].append(f"nsys was still writing when profattr stopped waiting; once it has exited, run "
                            f"`profattr capture --finish {o.out_dir} --name {p.name}`")
    if run["status"] == "needs_import" and (error or interrupted):
        run["status"] = "interrupted" if interrupted else "failed"
    write_run(p.path("run"), run)
    kept = ", ".join(run["files"].values())
    where = f"{p.options.out_dir}/ holds {kept}"
    if error:
        for line in error.details:
            echo(f"  | {line}")
        raise ProfattrError(f"{error}; {where}")
    if interrupted:
        echo(f"interrupted; {where}")
        return run, 130
    if not nsys_done:
        raise ProfattrError(f"{run['notes'][-1]}; {where}")
    if export_error:
        raise ProfattrError(f"{export_error}; {where}")
    if not any(p.path(k).exists() for k in ("report", "qdstrm")):
        raise ProfattrError(f"nsys wrote no report: {_no_report_reason(p, run)}; {where}")
    if run["status"] == "needs_import":
        echo(f"nsys left {p.path('qdstrm').name} (no importer here): copy {p.options.out_dir} to a machine with "
             f"a full Nsight Systems and run `profattr capture --finish {p.options.out_dir} --name {p.name}`")
        echo(where)
        return run, 0
    echo(where)
    failed = [f for f in (run["check"] or {}).get("findings", []) if f["status"] == lint.FAIL]
    for f in failed:
        echo(f"check failed: {f['check']}: {f['message']}")
    return run, 1 if failed else 0


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Treat SIGTERM (e.g. from `timeout`) like Ctrl-C while nsys runs, so the target is stopped in order and
    what nsys wrote is kept. Only the main thread may set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_under_nsys(p: Plan, run: dict, log, echo: Echo) -> tuple:
    """Start nsys, drive or wait for the target, stop it, and wait until nsys has written its report. Returns
    (DriveError or None, interrupted, whether nsys has exited)."""
    error, interrupted = None, False
    launcher = _start(p, log)
    try:
        if p.target == "sglang":
            drive_sglang(p, launcher, run, echo)
        else:
            wait_target(p, launcher, echo)
    except DriveError as exc:
        error = exc
    except ProfattrError as exc:  # e.g. the server answered a request with an error
        error = DriveError(exc.format_message(), proc.log_tail(p.path("log")))
    except KeyboardInterrupt:
        interrupted = True
        echo("interrupted: stopping the target and keeping what nsys wrote")
    finally:
        run["capture"]["target_stopped_by"] = proc.stop_target(launcher)
        nsys_done = wait_for_nsys(launcher, echo)
        run["capture"]["nsys_exit_code"] = launcher.returncode
    return error, interrupted, nsys_done


def _attach_workload(p: Plan, run: dict) -> None:
    meta_path = p.path("workload")
    if not meta_path.exists():
        return
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        run["notes"].append(f"{meta_path.name} is not valid JSON")
        return
    run["workload"] = meta
    timing = meta.get("ms_per_token_unprofiled")
    value = timing.get("median") if isinstance(timing, dict) else timing
    if isinstance(value, (int, float)):
        run["timing"].update({"ms_per_token_unprofiled": value, "method": "the workload's own timing of "
                              "decode steps before the window (workload.ms_per_token_unprofiled)"})


def finish(path, name: str | None, nsys_explicit: str | None, force: bool, echo: Echo) -> tuple:
    """`profattr capture --finish DIR`: import a .qdstrm left where nsys had no importer, export, check, and update
    run.json. Returns (run dict, exit code)."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".run.json"):
        run_path = path
    else:
        runs = sorted(path.glob(f"{name}.run.json" if name else "*.run.json")) if path.is_dir() else []
        if len(runs) != 1:
            found = ", ".join(r.name for r in runs) or "none"
            raise ProfattrError(f"{path}: need exactly one NAME.run.json to finish (found {found}); "
                                "give --name or the run.json itself")
        run_path = runs[0]
    run = lint.load_run(run_path)
    name = run_path.name[: -len(".run.json")]
    tool = nsys_tool.find_nsys(nsys_explicit)
    if not tool.importer and not (run_path.parent / (name + ".nsys-rep")).exists():
        raise ProfattrError(f"the nsys found ({tool.path}) has no {nsys_tool.IMPORTER_NAME} beside it "
                            "(host-linux-x64/); use a full Nsight Systems install (scripts/install-nsys) "
                            "or set PROFATTR_QDSTRM_IMPORTER")
    run.setdefault("commands", {})
    run.setdefault("notes", [])
    # the tool, not where it lives on this machine: run.json travels with the capture folder
    run["finished_with"] = {"nsys": "nsys", "version": tool.version, "source": tool.source,
                            "importer": nsys_tool.IMPORTER_NAME if tool.importer else None, "finished_utc": _utc()}
    finish_outputs(run_path.parent, name, run, tool.path, tool.importer, echo, force=force)
    if run.get("status") == "needs_import" and (run_path.parent / (name + SUFFIXES["report"])).exists():
        run["status"] = "complete"
    write_run(run_path, run)
    echo(f"{run_path.parent}/ holds {', '.join(run['files'].values())}")
    return run, 1 if run.get("check") and run["check"]["status"] == lint.FAIL else 0
