"""Driving an SGLang server through its profiled windows: health, then per batch size a warm-up and unprofiled
timing rounds, then each window of that batch (nsys's cudaProfilerApi range, an nsys session start/stop, or a
torch-profiler trace). Everything measured goes into the windows' run dicts.
"""
from __future__ import annotations

import http.client
import subprocess
import time
from typing import Callable

from profattr.tools import nsys as nsys_tool
from profattr.capture import proc, sglang
from profattr.capture.plan import Plan, Window, window_body

Echo = Callable[[str], None]
REPORT_WAIT_S = 180  # after `nsys stop`, the window's report is written while the server keeps running
TRACE_WAIT_S = 180  # SGLang exports the torch trace after the window's last step
LOG_FLUSH_S = 1.0
CLIENT_CAVEAT = ("client-side: token arrival times inside the window; they include the stall of nsys flushing its "
                 "buffers at cudaProfilerStop, so ms_per_token_profiled is measured in the capture instead")


class DriveError(Exception):
    """The target failed in a way the user can act on; the message is one line, `details` are log lines."""

    def __init__(self, message: str, details: list | None = None):
        super().__init__(message)
        self.details = details or []


class Liveness:
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


def drive_sglang(p: Plan, launcher: subprocess.Popen, runs: dict, echo: Echo, clock=time.time) -> None:
    """Health, then per batch: warm-up, unprofiled timing, its windows. `runs` maps window name -> run dict."""
    client = sglang.Client(p.options.host, p.options.port)
    alive = Liveness(launcher)
    health_s = _wait_healthy(p, client, alive, launcher, echo)
    for run in runs.values():
        run["server"]["healthy_after_s"] = round(health_s, 1)
    requests = sglang.Requests(p.options.prompts, p.options.input_len, p.options.max_new_tokens,
                               p.options.prompt_seed)
    try:
        for batch in p.options.batch_list:
            windows = [w for w in p.windows if w.batch == batch]
            timing = time_unprofiled(p, client, requests, batch, echo)
            for w in windows:
                runs[w.name]["timing"].update(timing)
                profile_window(p, client, requests, w, runs[w.name], echo, clock)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused/reset/cut off, bad JSON
        what = "the server exited during the requests" if not alive() else "a request to the server failed"
        raise DriveError(f"{what} ({exc})", proc.log_tail(p.path("log"))) from None


def _wait_healthy(p: Plan, client, alive, launcher, echo: Echo) -> float:
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
    echo(f"healthy after {health_s:.0f} s")
    return health_s


def time_unprofiled(p: Plan, client, requests, batch: int, echo: Echo) -> dict:
    """Warm-up rounds with the window's shapes, then timed rounds outside any window; the timing entries. The
    log's size before and after the timed rounds is kept, so that the server's own decode log lines of those rounds
    (one per --decode-log-interval steps, with its decode throughput) give the unprofiled time of a step."""
    o = p.options
    for _ in range(o.warmup):
        sglang.run_concurrent(client, requests.bodies(batch))
    echo(f"batch {batch}: warm-up done ({o.warmup} round(s)); timing {o.trials} unprofiled round(s)")
    log_from = _log_size(p)
    rounds = [sglang.ms_per_token(sglang.run_concurrent(client, requests.bodies(batch))) for _ in range(o.trials)]
    time.sleep(LOG_FLUSH_S)  # the server's last decode lines of these rounds reach the log (through nsys) late
    log_to = _log_size(p)
    unprof = sglang.spread(rounds)
    if unprof.get("n"):
        echo(f"batch {batch}: unprofiled {unprof['median']:.3f} ms/token (min {unprof['min']:.3f}, "
             f"max {unprof['max']:.3f})")
    return {
        "method": ("streamed decode: time from the first to the last streamed token of each request divided by "
                   "the tokens between them (prefill excluded), mean over the concurrent requests; median "
                   "over rounds"),
        "ms_per_token_unprofiled": unprof.get("median"),
        "unprofiled": dict(unprof, rounds_ms_per_token=rounds),
        "measured_where": ("same server, before the window opened (profiler attached, not collecting)"
                           if p.capture_range != "none" else
                           "same server, nsys recording throughout (--capture-range none)"),
        "log_span_bytes": [log_from, log_to] if log_from is not None and log_to is not None else None,
    }


def _log_size(p: Plan) -> int | None:
    try:
        return p.path("log").stat().st_size
    except OSError:
        return None


def profile_window(p: Plan, client, requests, w: Window, run: dict, echo: Echo, clock=time.time) -> None:
    """Open one window, decode `w.batch` requests inside it, make sure it closed and its output was written."""
    o = p.options
    window = run["window"]
    window["opened_utc_s"] = clock()
    if p.capture_range == "session":
        # the window is the requests' whole decode: their prefill, then one step per token after the first
        window["steps_requested"] = o.max_new_tokens
        window["steps_note"] = "session window: the requests' prefill and all their decode steps"
        nsys_tool.session_call(nsys_tool.start_command(p.profile_cmd[0], p.session, p.nsys_output(w),
                                                       cpu_samples=p.options.cpu_samples))
        echo(f"window {w.name} open (nsys session)")
        results = sglang.run_concurrent(client, requests.bodies(w.batch))
        nsys_tool.session_call(nsys_tool.stop_command(p.profile_cmd[0], p.session))
        window["closed_utc_s"] = clock()
        window["closed_by"] = "nsys stop"
        run["timing"]["ms_per_token_profiled_client"] = sglang.ms_per_token(results)
        _wait_for_output(p, w, run, echo)
        return
    req = window_body(p, w)

    def open_window():
        status, text = client.call("/start_profile", req)
        window.update({"start_profile": req, "start_profile_status": status,
                       "start_profile_answer": text.strip()[:200]})
        if status != 200:
            raise DriveError(f"POST /start_profile answered {status}: {text.strip()[:200]}")
        echo(f"window {w.name} open ({o.steps} steps): {text.strip()}")

    if o.profiler == "ncu":
        # decode steps only: the window opens once every request has its first token (its prefill is done)
        window["opens"] = "after the requests' prefill"
        results = sglang.run_concurrent(client, requests.bodies(w.batch), after_first_token=open_window)
        if "start_profile_status" not in window:
            raise DriveError("the window's requests failed before their first token")
    else:
        open_window()
        results = sglang.run_concurrent(client, requests.bodies(w.batch))
    # the window's first step is the prefill of these requests, so decode tokens 1..steps-1 lie inside it. Only a
    # secondary figure: a profiler flushing its buffers at the window's end stalls the streamed tokens; the
    # profiled ms/token proper is measured in the capture
    prof = sglang.ms_per_token(results, max_token=max(2, o.steps - 1))
    run["timing"]["ms_per_token_profiled_client"] = prof
    run["timing"]["profiled_client_caveat"] = CLIENT_CAVEAT
    time.sleep(1.0)  # let the scheduler reach num_steps and stop the profiler
    status, _ = client.call("/stop_profile", {})
    window["closed_utc_s"] = clock()
    # 500 ("Profiling is not in progress"): num_steps closed the window, as intended
    window["closed_by"] = {200: "stop_profile", 500: "num_steps"}.get(status,
                                                                      f"unknown (/stop_profile answered {status})")
    window["stop_profile_status"] = status
    if status == 200:
        run["notes"].append("the window was still open after the requests; /stop_profile closed it")
    if prof is not None:
        echo(f"window {w.name}: profiled (client-side) {prof:.3f} ms/token; closed by {window['closed_by']}")
    _wait_for_output(p, w, run, echo)


def _wait_for_output(p: Plan, w: Window, run: dict, echo: Echo) -> None:
    """Wait until the window's report or trace exists (the profiler writes it while the server keeps running),
    so that the next window's timing is not disturbed by the writing; note it when it never came."""
    o = p.options
    if p.capture_range == "none":
        return
    if o.profiler == "torch":
        deadline = time.monotonic() + TRACE_WAIT_S
        sizes = None
        while time.monotonic() < deadline:
            files = sglang.trace_files(o.out_dir, w.name)
            now = [f.stat().st_size for f in files]
            if len(files) >= o.tp and now == sizes and all(now):
                run["window"]["trace_files"] = [f.name for f in files]
                return
            sizes = now
            time.sleep(1.0)
        run["notes"].append(f"SGLang wrote {len(sglang.trace_files(o.out_dir, w.name))} of {o.tp} torch traces "
                            f"within {TRACE_WAIT_S} s of the window's end")
        echo(f"window {w.name}: torch trace(s) missing after {TRACE_WAIT_S} s")
        return
    if p.capture_range != "session":
        return  # under one `nsys profile`, nsys writes the reports of all windows when the target exits
    base = p.nsys_output(w)
    deadline = time.monotonic() + REPORT_WAIT_S
    while time.monotonic() < deadline:
        if any(base.with_name(base.name + s).exists() for s in (".nsys-rep", ".qdstrm")):
            return
        time.sleep(0.5)
    run["notes"].append(f"nsys had not written {base.name}.nsys-rep or .qdstrm {REPORT_WAIT_S} s after the window")
    echo(f"window {w.name}: no report from nsys yet after {REPORT_WAIT_S} s")

