"""Running a planned capture: start the target under the profiler, drive it (SGLang: health, warm-up, unprofiled
timing, each profiled window) or wait for it, stop it cleanly, turn what was recorded into each window's capture
(NAME.nsys-rep and NAME.sqlite, or NAME-TP-<rank>.trace.json.gz), check it, and record everything in NAME.run.json
(`profattr.run/1`). `finish` completes a capture that nsys left as NAME.qdstrm on a machine without the importer.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from profattr.capture import environment, proc
from profattr.engines import serverlog
from profattr.tools import nsys as nsys_tool
from profattr.capture import sglang
from profattr.capture.drive import DriveError, drive_sglang
from profattr.capture.outputs import finish_outputs, name_window_outputs, prepare_outputs, write_run
from profattr.capture.plan import SCHEMA, SUFFIXES, Plan, Window, shell_join
from profattr.check import FAIL
from profattr.check.locate import load_run
from profattr.errors import ProfattrError

Echo = Callable[[str], None]
MODEL_CONFIG_MAX_BYTES = 256 * 1024


def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def model_config(model: str | None) -> dict | None:
    """The model folder's config.json (architecture and widths: `gap` and `limit` read it later), or None."""
    if not model:
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        if not path.is_file() or path.stat().st_size > MODEL_CONFIG_MAX_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def initial_run(p: Plan) -> dict:
    """The run dict every window of the session starts from."""
    o = p.options
    gpus, gpu_error = environment.nvidia_smi_gpus()
    profiler = o.profiler
    run = {
        "schema": SCHEMA,
        "name": p.name,
        "status": "running",
        "target": p.target,
        "created_utc": _utc(),
        "profiler": profiler,
        "capture": {"trace": p.trace if profiler == "nsys" else None, "capture_range": p.capture_range,
                    "cuda_graph_trace": o.cuda_graph_trace if profiler == "nsys" and "cuda" in p.trace.split(",")
                    else None, "session": p.session},
        "commands": {"profile": p.profile_cmd, "profile_shell": shell_join(p.profile_cmd), "target": p.target_cmd},
        "nsys": {"path": p.nsys.path, "version": p.nsys.version, "source": p.nsys.source,
                 "importer": p.nsys.importer} if p.nsys else None,
        "ncu": {"path": p.ncu.path, "version": p.ncu.version, "source": p.ncu.source} if p.ncu else None,
        "host": environment.host(),
        "gpus": gpus,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "gpu_probe": gpu_error,
        "packages": environment.package_versions(),
        "tp": o.tp if p.target != "command" else None,
        "backend": None,
        "model": None,
        "model_config": None,
        "server": None,
        "requests": None,
        "window": {"steps_requested": o.steps if p.target != "command" else None},
        "timing": {},
        "workload": None,
        "check": None,
        "files": {"log": p.path("log").name},
        "notes": [],
    }
    if p.target == "sglang":
        run["backend"] = {"requested": o.backend or "auto", "sglang": p.backend_sglang}
        run["model"] = o.model
        run["model_config"] = model_config(o.model)
        run["server"] = {"launcher": sglang.launcher_command(o.launcher), "args": list(o.args), "host": o.host,
                         "port": o.port, "health_timeout_s": o.health_timeout_s}
        prompts = sglang.Requests(o.prompts, o.input_len, o.max_new_tokens, o.prompt_seed)
        run["requests"] = {"input_len": o.input_len, "input": "token ids", "max_new_tokens": o.max_new_tokens,
                           "batch": o.batch, "warmup_rounds": o.warmup, "timed_rounds": o.trials,
                           **prompts.describe(), "body": prompts.bodies(1)[0]}
    elif p.target == "workload":
        run["workload_request"] = {"name": o.workload, "mode": o.mode, "moe_impl": o.moe_impl,
                                   "graph_window": o.graph_window, "batch": o.batch, "steps": o.steps,
                                   "extra_args": list(o.args)}
    return run


def window_run(p: Plan, base: dict, w: Window) -> dict:
    """The run dict of one window: the session's, with this window's name, batch and replicate."""
    run = copy.deepcopy(base)
    run["name"] = w.name
    if run.get("requests"):
        run["requests"]["batch"] = w.batch
    if len(p.windows) > 1:
        run["session"] = {"name": p.name, "windows": [x.name for x in p.windows], "index": w.index,
                          "replicate": w.replicate, "replicates": p.options.repeat,
                          "batches": list(p.options.batch_list),
                          "note": ("windows of one server launch: replicates show window-to-window variance, "
                                   "not launch-to-launch variance")}
    return run


# --- running ------------------------------------------------------------------------------------------------------

def _start(p: Plan, log) -> subprocess.Popen:
    env = dict(os.environ, **p.env)
    try:
        # own session: a Ctrl-C in the terminal reaches profattr only, which then stops the target in order
        return subprocess.Popen(p.profile_cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    except OSError as exc:
        what = "nsys" if p.options.profiler == "nsys" else "the server"
        raise ProfattrError(f"could not start {what} ({exc}): {shell_join(p.profile_cmd)}") from None


def wait_target(p: Plan, launcher: subprocess.Popen, echo: Echo) -> None:
    """Workload and command targets end by themselves; wait (with --timeout) and report a failing exit."""
    timeout = p.options.timeout_s or float("inf")
    if not proc.wait_exit(launcher, timeout, on_tick=lambda s: echo(f"  still running after {s:.0f} s")):
        raise DriveError(f"the target ran longer than --timeout {timeout:.0f} s", proc.log_tail(p.path("log")))
    code = launcher.returncode
    if code != 0:
        tail = proc.log_tail(p.path("log"), lines=200)
        too_old = nsys_tool.importer_too_old("\n".join(tail), p.window_path(p.windows[0], "qdstrm").name)
        if too_old:  # nsys imported its own stream at exit and could not read it
            raise DriveError(too_old, tail[-5:])
        raise DriveError(f"the target (or nsys) exited with code {code}", tail[-20:])


def wait_for_nsys(launcher: subprocess.Popen, echo: Echo, timeout_s: float = 3600) -> bool:
    """Wait until nsys has written its report and exited. A first Ctrl-C is answered with a note; a second one
    gives up waiting (nsys keeps running in its own session and finishes the file)."""
    interrupts = 0
    while True:
        try:
            return proc.wait_exit(launcher, timeout_s, on_tick=lambda s: echo(f"  nsys still writing after {s:.0f} s"))
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts > 1:
                echo("stopped waiting; nsys keeps writing in the background")
                return False
            echo("waiting for nsys to finish writing the report (Ctrl-C again to stop waiting)")


def _no_report_reason(p: Plan, run: dict) -> str:
    if p.options.profiler == "torch":
        return "SGLang wrote no torch-profiler trace into the output folder (see the server log)"
    if p.options.profiler == "ncu":
        return ("no launch of the chosen kernels ran inside the window (check the kernel regex against the "
                "capture's kernel names, and that the server ran under the same graph mode)")
    if p.capture_range == "cudaProfilerApi":
        if p.target == "sglang":
            if run["window"].get("start_profile_status") != 200:
                return "the profile window was never opened (/start_profile was not reached)"
            return ("/start_profile succeeded but nsys saw no cudaProfilerStart: SGLang calls it in the base GPU's "
                    "scheduler only, which must run CUDA under nsys (--trace with cuda); or record the window "
                    "with --capture-range session")
        return ("the capture window never opened: nothing called cudaProfilerStart (give --capture-range none to "
                "record the whole run of a command that does not)")
    if p.capture_range == "nvtx":
        return f"no NVTX range {p.options.nvtx_capture!r} was recorded, so no window opened"
    return "nsys recorded nothing (see the log)"


def execute(p: Plan, echo: Echo) -> tuple:
    """Run the plan. Returns (run dict of the last window, exit code): 0 ok or needs import, 1 a check failed, 130
    interrupted. Raises ProfattrError (after writing run.json and keeping partial outputs) when the target failed."""
    o = p.options
    if p.target == "sglang" and sglang.port_in_use(o.host, o.port):
        raise ProfattrError(f"port {o.port} on {o.host} is in use (another server?); stop it or pick --port")
    prepare_outputs(p)
    base = initial_run(p)
    runs = {w.name: window_run(p, base, w) for w in p.windows}
    for w in p.windows:
        write_run(p.window_path(w, "run"), runs[w.name])
    started = time.monotonic()
    under = {"nsys": "nsys", "ncu": "Nsight Compute"}.get(o.profiler, "the torch profiler (no nsys)")
    echo(f"starting under {under}: {shell_join(p.target_cmd)}")
    with _sigterm_as_interrupt(), open(p.path("log"), "wb") as log:
        error, interrupted, done = _run_target(p, runs, log, echo)
    duration = round(time.monotonic() - started, 1)
    evidence = serverlog.read_log(p.path("log")) if p.target == "sglang" else None
    if done and o.profiler == "nsys":
        name_window_outputs(p)
    codes, problems = [], []
    for w in p.windows:
        run = runs[w.name]
        run["capture"]["duration_s"] = duration
        if evidence is not None:
            run["server_log"] = serverlog.for_window(evidence, run.get("window", {}))
            _unprofiled_steps(run, p.path("log"))
        if p.target == "workload":
            _attach_workload(p, run)
        run["status"] = "interrupted" if interrupted else "failed" if error else "complete"
        code, problem = _finish_window(p, w, run, done, error, interrupted, echo)
        codes.append(code)
        if problem:
            problems.append(problem)
    where = f"{o.out_dir}/ holds {', '.join(_kept(p))}"
    if error:
        for line in error.details:
            echo(f"  | {line}")
        said = serverlog.server_said(evidence)
        if said:  # what the server itself said before it died (a refused backend, a bad flag): the line to read
            raise ProfattrError(f"{error}; the server said: {said}; {where}")
        raise ProfattrError(f"{error}; {where}")
    if interrupted:
        echo(f"interrupted; {where}")
        return runs[p.windows[-1].name], 130
    if problems:
        raise ProfattrError(f"{problems[0]}; {where}")
    echo(where)
    return runs[p.windows[-1].name], max(codes)


def _kept(p: Plan) -> list:
    names = []
    for f in sorted(p.options.out_dir.iterdir()) if p.options.out_dir.is_dir() else []:
        if any(f.name.startswith(w.name + ".") or f.name.startswith(w.name + "-TP-") for w in p.windows) \
                or f.name == p.path("log").name:
            names.append(f.name)
    return names


def _finish_window(p: Plan, w: Window, run: dict, done: bool, error, interrupted: bool, echo: Echo) -> tuple:
    """Finish one window's files; (exit code, the one-line problem or None)."""
    o = p.options
    problem = None
    if done:
        try:
            finish_outputs(o.out_dir, w.name, run, p.nsys.path if p.nsys else None,
                           p.nsys.importer if p.nsys else None, echo, force=True,
                           ncu_path=p.ncu.path if p.ncu else None)
        except ProfattrError as exc:
            problem = exc.format_message()
            run["notes"].append(f"export failed: {problem}")
    else:
        run["notes"].append(f"nsys was still writing when profattr stopped waiting; once it has exited, run "
                            f"`profattr capture --finish {o.out_dir} --name {w.name}`")
        problem = run["notes"][-1]
    if run["status"] == "needs_import" and (error or interrupted):
        run["status"] = "interrupted" if interrupted else "failed"
    write_run(p.window_path(w, "run"), run)
    if error or interrupted or problem:
        return 2, problem
    recorded = any(p.window_path(w, k).exists() for k in ("report", "qdstrm", "ncu_report")) \
        or run["files"].get("traces")
    if not recorded:
        who = {"nsys": "nsys wrote no report", "torch": "no torch-profiler trace was written",
               "ncu": "ncu wrote no report"}[o.profiler]
        where = f" for window {w.name}" if len(p.windows) > 1 else ""
        return 2, f"{who}{where}: {_no_report_reason(p, run)}"
    if run["status"] == "needs_import":
        echo(f"nsys left {w.name}.qdstrm (no importer here): copy {o.out_dir} to a machine with a full Nsight "
             f"Systems and run `profattr capture --finish {o.out_dir} --name {w.name}`")
        return 0, None
    failed = [f for f in (run["check"] or {}).get("findings", []) if f["status"] == FAIL]
    for f in failed:
        echo(f"check failed ({w.name}): {f['check']}: {f['message']}")
    return (1 if failed else 0), None


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Treat SIGTERM (e.g. from `timeout`) like Ctrl-C while the target runs, so it is stopped in order and what
    was recorded is kept. Only the main thread may set signal handlers."""
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


def _run_target(p: Plan, runs: dict, log, echo: Echo) -> tuple:
    """Start the target, drive or wait for it, stop it, and wait until nsys has written its reports. Returns
    (DriveError or None, interrupted, whether the profiler has exited)."""
    error, interrupted = None, False
    launcher = _start(p, log)
    try:
        if p.target == "sglang":
            drive_sglang(p, launcher, runs, echo)
        else:
            wait_target(p, launcher, echo)
    except DriveError as exc:
        error = exc
    except ProfattrError as exc:  # e.g. the server answered a request with an error
        error = DriveError(exc.format_message(), proc.log_tail(p.path("log")))
    except KeyboardInterrupt:
        interrupted = True
        echo("interrupted: stopping the target and keeping what was recorded")
    finally:
        stopped = proc.stop_target(launcher, target_is_launcher=p.options.profiler == "torch")
        done = wait_for_nsys(launcher, echo)
        for run in runs.values():
            run["capture"]["target_stopped_by"] = stopped
            run["capture"]["nsys_exit_code" if p.options.profiler == "nsys" else "exit_code"] = launcher.returncode
    if error is not None and error.details:
        # read the log again now that the target and nsys have stopped: the lines a dying server wrote last may
        # reach the log file (through nsys) only after the request that failed
        error.details = proc.log_tail(p.path("log"), lines=max(len(error.details), 20)) or error.details
    return error, interrupted, done


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
    """`profattr capture --finish DIR|NAME.qdstrm`: import a .qdstrm left where nsys had no importer, export,
    check, and update (or, for a bare NAME.qdstrm, write) run.json. Returns (run dict, exit code)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".qdstrm":
        run_path = path.with_name(path.name[: -len(".qdstrm")] + ".run.json")
        if not run_path.exists():
            return _finish_bare(path, nsys_explicit, force, echo)
    elif path.is_file() and path.name.endswith(".run.json"):
        run_path = path
    else:
        runs = sorted(path.glob(f"{name}.run.json" if name else "*.run.json")) if path.is_dir() else []
        if not runs and path.is_dir():
            streams = sorted(path.glob(f"{name}.qdstrm" if name else "*.qdstrm"))
            if len(streams) == 1:
                return _finish_bare(streams[0], nsys_explicit, force, echo)
        if len(runs) != 1:
            found = ", ".join(r.name for r in runs) or "none"
            raise ProfattrError(f"{path}: need exactly one NAME.run.json (or one bare NAME.qdstrm) to finish (found "
                                f"{found}); give --name or the file itself")
        run_path = runs[0]
    run = load_run(run_path).raw  # validated; finishing writes it again, with what the finish adds
    name = run_path.name[: -len(".run.json")]
    return _finish_run(run_path, run, name, nsys_explicit, force, echo)


def _finish_bare(qdstrm: Path, nsys_explicit: str | None, force: bool, echo: Echo) -> tuple:
    """A NAME.qdstrm without run.json (recorded by plain `nsys profile`): a minimal run.json says so."""
    name = qdstrm.name[: -len(".qdstrm")]
    run = {"schema": SCHEMA, "name": name, "status": "needs_import", "target": "unknown", "created_utc": _utc(),
           "profiler": "nsys", "capture": {}, "commands": {}, "notes": [
               f"finished from a bare {qdstrm.name}: no run.json recorded how it was captured"],
           "files": {"qdstrm": qdstrm.name}}
    return _finish_run(qdstrm.with_name(name + ".run.json"), run, name, nsys_explicit, force, echo)


def _unprofiled_steps(run: dict, log: Path) -> None:
    """run["timing"]["unprofiled_step"]: the unprofiled decode step at the window's batch from the server's own
    decode lines (serverlog.unprofiled_steps); nothing when the log has none."""
    batch = (run.get("requests") or {}).get("batch")
    timing = run.setdefault("timing", {})
    if not isinstance(batch, int) or batch < 1:
        return
    steps = serverlog.unprofiled_steps(log, batch, timing.get("log_span_bytes"))
    if steps is not None:
        timing["unprofiled_step"] = steps


def _finish_run(run_path: Path, run: dict, name: str, nsys_explicit: str | None, force: bool, echo: Echo) -> tuple:
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
    log = run_path.parent / (run.get("files") or {}).get("log", name + ".log")
    if log.is_file() and run.get("target") == "sglang":  # re-read: what the log says is re-derived each time
        run["server_log"] = serverlog.for_window(serverlog.read_log(log), run.get("window", {}))
        _unprofiled_steps(run, log)
    finish_outputs(run_path.parent, name, run, tool.path, tool.importer, echo, force=force)
    if run.get("status") == "needs_import" and (run_path.parent / (name + SUFFIXES["report"])).exists():
        run["status"] = "complete"
    write_run(run_path, run)
    files = [v if isinstance(v, str) else ", ".join(v) for v in run["files"].values()]
    echo(f"{run_path.parent}/ holds {', '.join(files)}")
    return run, 1 if run.get("check") and run["check"]["status"] == FAIL else 0
