"""Profiling an SGLang server that is already running (`profattr capture --server http://HOST:PORT`): no launch,
no restart, no shutdown. Nsight Systems cannot attach to a running CUDA process, so each window is SGLang's own
torch profiler, opened with `/start_profile` (activities CPU and GPU, `num_steps`, `output_dir` an absolute folder
on this host, `profile_id` the window's name); the server writes OUTPUT_DIR/NAME-TP-<rank>.trace.json.gz itself,
so it must run on this host (or see this folder under the same path).

What the server says about itself comes from SGLang 0.5.16's python/sglang/srt/entrypoints/http_server.py:
`GET /health` (200 when up, 503 while starting), `GET /get_server_info` (newer servers: `/server_info`):
dataclasses.asdict(ServerArgs) merged with the scheduler's info, `internal_states` and `version`;
`GET /get_model_info` (or `/model_info`): model_path, tokenizer_path, is_generation, weight_version.

The server is left as it was: the only requests are the reads above, the measured ones (warm-up, timing, each
window's), and each window's /start_profile and /stop_profile; a window that profattr opened is stopped on every
way out (an error, the server dying, Ctrl-C or SIGTERM). A /start_profile that fails (SGLang answers 500 when a
profile is already in progress) opened nothing, so nothing is stopped: someone else's profile is not ours.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import threading
import time
import urllib.error
from dataclasses import replace
from typing import Callable
from pathlib import Path
from urllib.parse import urlsplit

from profattr.capture import drive, sglang
from profattr.engines import serverlog
from profattr.capture.drive import DriveError
from profattr.capture.outputs import finish_outputs, prepare_outputs, write_run
from profattr.capture.plan import HF_REPO_ID, WINDOW_MARGIN_TOKENS, Options, Plan, _default_name, windows_of
from profattr.capture.run import _sigterm_as_interrupt, initial_run, model_config, window_run
from profattr.check import FAIL
from profattr.errors import ProfattrError
from profattr.text import clean_tree

Echo = Callable[[str], None]
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")
MODEL_INFO_PATHS = ("/get_model_info", "/model_info")
NET_ERRORS = (OSError, urllib.error.URLError, http.client.HTTPException)
PROBE_TIMEOUT_S = 30
ATTACHED_NOTE = ("attached to a running server (capture --server): its log is not profattr's to read, so the "
                 "unprofiled decode step from the server's decode log lines is not measured (the streamed ms/token "
                 "is), and the checks that read the log are skipped; packages are this host's, the server's SGLang "
                 "version is server.sglang_version")


def parse_server_url(url: str) -> tuple:
    """(host, port) of `http://HOST:PORT`; ProfattrError for anything else."""
    what = f"--server {url!r}"
    try:
        parts = urlsplit(str(url).strip())
        port = parts.port
    except ValueError as exc:
        raise ProfattrError(f"{what}: not a URL ({exc}); give http://HOST:PORT, e.g. http://127.0.0.1:30000") \
            from None
    if parts.scheme != "http":
        raise ProfattrError(f"{what}: expected http://HOST:PORT (SGLang serves plain HTTP), e.g. "
                            "http://127.0.0.1:30000")
    if not parts.hostname or port is None:
        raise ProfattrError(f"{what}: needs a host and a port, e.g. http://127.0.0.1:30000")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ProfattrError(f"{what}: give the server's root only (http://HOST:PORT), without a path, query or "
                            "credentials")
    return parts.hostname, port


def _get_json(client, paths: tuple) -> tuple:
    """(path, parsed JSON dict) of the first path that answers 200 with a JSON object; (None, statuses)."""
    statuses = {}
    for path in paths:
        status, text = client.call(path, timeout_s=PROBE_TIMEOUT_S)
        statuses[path] = status
        if status != 200:
            continue
        try:
            data = json.loads(text)
        except ValueError:
            statuses[path] = "200, not JSON"
            continue
        if isinstance(data, dict):
            return path, data
        statuses[path] = "200, not a JSON object"
    return None, statuses


def probe(client, url: str, health_timeout_s: float, echo: Echo) -> dict:
    """Is an SGLang server up at `url`? Its server arguments, model info and version; ProfattrError otherwise."""
    try:
        status, _ = client.call("/health", timeout_s=PROBE_TIMEOUT_S)
        if status == 503:  # starting: wait as a launched capture does
            echo(f"{url} is starting (GET /health answered 503); waiting up to {health_timeout_s:.0f} s")
            try:
                sglang.wait_healthy(client, lambda: True, health_timeout_s)
            except sglang.ServerTimeout as exc:
                raise ProfattrError(f"{url} was not healthy after {exc.elapsed_s:.0f} s (GET /health answered 503; "
                                    "--health-timeout); wait until the server is up") from None
            status = 200
        if status != 200:
            raise ProfattrError(f"{url} answered {status} to GET /health: not an SGLang server (SGLang answers 200 "
                                "when up, 503 while starting); check the URL")
        info_path, info = _get_json(client, SERVER_INFO_PATHS)
        if info_path is None:
            said = ", ".join(f"{p} {s}" for p, s in info.items())
            raise ProfattrError(f"{url} is up but has no SGLang server-info endpoint ({said}): not an SGLang "
                                "server, or one older than 0.5; check the URL")
        if not isinstance(info.get("model_path"), str) or not info["model_path"]:
            raise ProfattrError(f"{url}{info_path} answered JSON without a model_path: not SGLang's server info; "
                                "check the URL")
        model_path, model_info = _get_json(client, MODEL_INFO_PATHS)
    except NET_ERRORS as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ProfattrError(f"nothing answers as an HTTP server at {url} ({reason}); start the SGLang server "
                            "there or give the URL it listens on") from None
    return {"server_info": info, "server_info_endpoint": info_path,
            "model_info": model_info if model_path else None, "model_info_endpoint": model_path}


def _check_options(o: Options) -> None:
    for value in o.batch_list:
        if value < 1:
            raise ProfattrError(f"--batch must be at least 1 (got {value})")
    if len(set(o.batch_list)) != len(o.batch_list):
        raise ProfattrError(f"--batch lists a size twice ({','.join(map(str, o.batch_list))})")
    if o.max_new_tokens < o.steps + WINDOW_MARGIN_TOKENS:
        raise ProfattrError(f"--max-new-tokens ({o.max_new_tokens}) must be at least --steps + "
                            f"{WINDOW_MARGIN_TOKENS} ({o.steps + WINDOW_MARGIN_TOKENS}) so that the profile window "
                            "closes while the requests still decode")


def attached_plan(opts: Options, url: str, about: dict) -> Plan:
    """The plan of the windows on the running server: torch-profiler windows, no command to run."""
    args = about["server_info"]
    tp = args.get("tp_size") if isinstance(args.get("tp_size"), int) and args["tp_size"] > 0 else 1
    backend = str(args.get("moe_runner_backend") or "auto")
    host, port = parse_server_url(url)
    o = replace(opts, model=args["model_path"], backend=backend, tp=tp, host=host, port=port, profiler="torch",
                capture_range=None, args=(), launcher=None)
    name = _default_name(o, "sglang")
    return Plan(options=o, target="sglang", name=name, nsys=None, trace="", capture_range="cudaProfilerApi",
                target_cmd=[], profile_cmd=[], backend_sglang=backend, windows=windows_of(o, name))


def attached_run(p: Plan, url: str, about: dict) -> dict:
    """The run dict every window starts from: a launched capture's, with what the server said about itself."""
    args = about["server_info"]
    run = initial_run(p)
    run["commands"] = {"server_url": url}
    run["backend"] = {"requested": p.backend_sglang, "sglang": p.backend_sglang,
                      "note": "an attached server: the MoE runner its server info names (nothing was requested)"}
    run["model_config"], where = served_model_config(p.options.model)
    run["model_config_source"] = where
    scalars = {k: v for k, v in args.items() if k != "internal_states"}
    run["server"] = {"attached": True, "url": url, "host": p.options.host, "port": p.options.port, "args": [],
                     "launcher": None, "sglang_version": args.get("version"),
                     "server_info_endpoint": about["server_info_endpoint"], "server_info": clean_tree(scalars),
                     "model_info_endpoint": about["model_info_endpoint"],
                     "model_info": clean_tree(about["model_info"]) if about["model_info"] else None}
    run["server_log"] = serverlog.from_server_info(args)
    run["files"] = {}
    run["notes"].append(ATTACHED_NOTE)
    if run["model_config"] is None:
        run["notes"].append(f"the model's config.json is not readable on this host ({p.options.model}/config.json): "
                            "`profattr gap` needs --model for this capture")
    return run


def hub_snapshot(model: str) -> Path | None:
    """The newest local snapshot folder of a Hugging Face repository id in this host's hub cache ($HF_HUB_CACHE,
    else $HF_HOME/hub, else ~/.cache/huggingface/hub), where a server started with that id finds its files."""
    if not HF_REPO_ID.match(model) or Path(model).expanduser().exists():
        return None
    hub = os.environ.get("HF_HUB_CACHE") or (Path(os.environ["HF_HOME"]) / "hub" if os.environ.get("HF_HOME")
                                              else Path.home() / ".cache" / "huggingface" / "hub")
    snapshots = Path(hub) / ("models--" + model.replace("/", "--")) / "snapshots"
    try:
        found = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda d: (d / "config.json").stat().st_mtime) if found else None


def served_model_config(model: str) -> tuple:
    """(config.json of the served model or None, where it was read): the model folder, or for a Hugging Face id
    its snapshot in this host's hub cache."""
    config = model_config(model)
    if config is not None:
        return config, str(Path(model) / "config.json")
    snapshot = hub_snapshot(model)
    if snapshot is not None:
        config = model_config(str(snapshot))
        if config is not None:
            return config, f"the Hugging Face hub cache snapshot {snapshot.name} of {model}"
    return None, None


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait while the profiler is being stopped (a second Ctrl-C must not leave it running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT,
                                                                                         signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt


def _stop_profile(client) -> int | None:
    """POST /stop_profile; its status, None when the server cannot be reached."""
    with _signals_held():
        try:
            return client.call("/stop_profile", {}, timeout_s=PROBE_TIMEOUT_S)[0]
        except NET_ERRORS:
            return None


def _window(p: Plan, client, requests, w, run: dict, echo: Echo) -> None:
    """One window, and /stop_profile on every way out when profattr opened it and did not close it yet."""
    window = run["window"]
    try:
        drive.profile_window(p, client, requests, w, run, echo)
    except DriveError:
        status = window.get("start_profile_status")
        if status is not None and status != 200:
            raise DriveError(f"the server refused to open window {w.name}: POST /start_profile answered {status} "
                             f"({window.get('start_profile_answer') or 'no text'}); SGLang answers so when a profile "
                             "is already in progress (another client's /start_profile): profattr left it as it "
                             "was; try again once that profile has stopped") from None
        raise
    finally:
        if window.get("start_profile_status") == 200 and "stop_profile_status" not in window:
            status = _stop_profile(client)
            window.update({"stop_profile_status": status, "closed_utc_s": time.time(),
                           "closed_by": "stop_profile (profattr stopping early)" if status == 200 else
                           f"unknown (/stop_profile {'answered ' + str(status) if status else 'unreachable'})"})
    if not window.get("trace_files"):
        folder = p.options.out_dir.resolve()
        raise DriveError(f"no torch-profiler trace of window {w.name} reached {folder} within {drive.TRACE_WAIT_S} "
                         f"s: the server writes it into that folder itself, so it must run on this host (not in "
                         "another container or machine) as a user who can write there")


def _drive(p: Plan, client, url: str, runs: dict, echo: Echo) -> None:
    o = p.options
    requests = sglang.Requests(o.prompts, o.input_len, o.max_new_tokens, o.prompt_seed)
    try:
        for batch in o.batch_list:
            timing = drive.time_unprofiled(p, client, requests, batch, echo)
            timing.update({"measured_where": "the running server, before the window opened (no profiler "
                                             "collecting)", "log_span_bytes": None,
                           "unprofiled_step_note": "an attached server's log is not read: no decode-log step; "
                                                   "ms_per_token_unprofiled is the streamed figure"})
            for w in (w for w in p.windows if w.batch == batch):
                runs[w.name]["timing"].update(timing)
                _window(p, client, requests, w, runs[w.name], echo)
    except NET_ERRORS + (ValueError,) as exc:
        what = "stopped answering" if not client.healthy() else "failed a request"
        raise DriveError(f"the server at {url} {what} ({exc})") from None


def execute(opts: Options, url: str, echo: Echo) -> tuple:
    """Profile the running server at `url`: (run dict of the last window, exit code 0, 1 a check failed, 130
    interrupted); ProfattrError (after writing each window's run.json) for bad input or a failed server."""
    host, port = parse_server_url(url)
    url = f"http://{host}:{port}"
    _check_options(opts)
    client = sglang.Client(host, port)
    about = probe(client, url, opts.health_timeout_s, echo)
    p = attached_plan(opts, url, about)
    prepare_outputs(p)
    base = attached_run(p, url, about)
    runs = {w.name: window_run(p, base, w) for w in p.windows}
    for w in p.windows:
        write_run(p.window_path(w, "run"), runs[w.name])
    echo(f"attached to {url} (no launch; the server is left running): it serves {p.options.model} (SGLang "
         f"{base['server']['sglang_version']}, tp {p.options.tp}, MoE runner {p.backend_sglang}); windows: "
         f"{', '.join(w.name for w in p.windows)}")
    error, interrupted = None, False
    started = time.monotonic()
    with _sigterm_as_interrupt():
        try:
            _drive(p, client, url, runs, echo)
        except DriveError as exc:
            error = exc
        except ProfattrError as exc:  # e.g. the server answered a request with an error
            error = DriveError(exc.format_message())
        except KeyboardInterrupt:
            interrupted = True
            echo("interrupted: the profiler is stopped, the server left running; keeping what was recorded")
    codes = []
    for w in p.windows:
        run = runs[w.name]
        run["capture"]["duration_s"] = round(time.monotonic() - started, 1)
        run["status"] = "interrupted" if interrupted else "failed" if error else "complete"
        finish_outputs(p.options.out_dir, w.name, run, None, None, echo, force=True)
        write_run(p.window_path(w, "run"), run)
        failed = [f for f in (run["check"] or {}).get("findings", []) if f["status"] == FAIL]
        for f in failed:
            echo(f"check failed ({w.name}): {f['check']}: {f['message']}")
        codes.append(1 if failed else 0)
    kept = sorted(f.name for f in p.options.out_dir.iterdir()
                  if any(f.name.startswith(w.name + ".") or f.name.startswith(w.name + "-TP-") for w in p.windows))
    where = f"{p.options.out_dir}/ holds {', '.join(kept)}"
    if error:
        raise ProfattrError(f"{error}; {where}")
    if interrupted:
        echo(f"interrupted; {where}")
        return runs[p.windows[-1].name], 130
    echo(where)
    return runs[p.windows[-1].name], max(codes)


def describe(opts: Options, url: str) -> str:
    """The dry run: the requests, in order, without contacting the server."""
    host, port = parse_server_url(url)
    _check_options(opts)
    client = sglang.Client(host, port)
    body = sglang.Requests(opts.prompts, opts.input_len, opts.max_new_tokens, opts.prompt_seed).bodies(1)[0]
    lines = [f"# 1. is an SGLang server up at {client.base}, and how was it started (nothing is launched)",
             sglang.curl(client, "/health"), sglang.curl(client, SERVER_INFO_PATHS[0]),
             sglang.curl(client, MODEL_INFO_PATHS[0])]
    step = 2
    for batch in opts.batch_list:
        lines += [f"# {step}. batch {batch}: {opts.warmup} warm-up and {opts.trials} timed round(s) of {batch} "
                  "concurrent request(s)", sglang.curl(client, "/generate", body)]
        step += 1
        for rep in range(1, opts.repeat + 1):
            profile = sglang.torch_profile_body(opts.steps, str(opts.out_dir.resolve()), "NAME", opts.torch_with_stack)
            lines += [f"# {step}. window {rep} of batch {batch}: SGLang's torch profiler for {opts.steps} steps "
                      "(NAME from the server's backend and tp), the window's requests, then /stop_profile",
                      sglang.curl(client, "/start_profile", profile), sglang.curl(client, "/generate", body),
                      sglang.curl(client, "/stop_profile", {})]
            step += 1
    lines += [f"# {step}. check each capture (the server keeps running)"]
    return "\n".join(lines)
