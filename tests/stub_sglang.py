"""A stand-in for `python -m sglang.launch_server`, for driving `profattr capture` in CI without a GPU.

    python tests/stub_sglang.py --model-path M --port P [--tp N] [--moe-runner-backend B] [other server args]

It implements the behaviour the capture driver relies on, written from SGLang 0.5.16's source:
- python/sglang/launch_server.py: the command line (`--model-path`, `--port`, `--host`, `--tp`,
  `--moe-runner-backend`; other arguments are accepted and ignored here);
- python/sglang/srt/entrypoints/http_server.py: `GET /health` answers 503 while the server starts and 200 once it
  is up; `POST /generate` takes `input_ids` (or `text`) and `sampling_params`, and with `"stream": true` answers
  server-sent events `data: {...}` and a final `data: [DONE]`; `/start_profile` and `/stop_profile` (GET or POST)
  answer PLAIN TEXT ("Start profiling.\\n", "Stop profiling. This will take some time.\\n");
- python/sglang/srt/managers/tokenizer_control_mixin.py: a failed profile request raises RuntimeError, which the
  HTTP layer turns into status 500 (for example /stop_profile when no profile is in progress);
- python/sglang/srt/managers/scheduler_components/profiler_manager.py: the window opens at once (with `start_step`:
  at the next forward step) and, with `num_steps`, closes by itself after that many forward steps (prefill or
  decode), checked before each step; a start while a profile is in progress fails (500) only with `start_step` or
  `profile_by_stage`, and is otherwise answered 200 while the profile in progress goes on with its own settings;
- python/sglang/srt/managers/tokenizer_manager.py: streamed `output_ids` are cumulative;
  `meta_info` carries `prompt_tokens`, `completion_tokens` and `finish_reason` ({"type": "length", ...});
- python/sglang/srt/managers/scheduler_components/profiler_manager.py: activities "CPU"/"GPU" (the torch profiler)
  write `{output_dir}/{profile_id}-TP-{rank}.trace.json.gz` per TP rank when the window closes (Chrome trace
  JSON: here one `step[DECODE bs=N]` user_annotation per step (utils/profile_utils.py build_step_span_name), its
  cudaLaunchKernel call and a kernel linked to it by correlation id);
- python/sglang/srt/entrypoints/engine.py: the server logs `server_args=ServerArgs(...)` at start-up;
- python/sglang/srt/entrypoints/http_server.py, functions get_server_info and get_model_info: `GET
  /get_server_info` answers dataclasses.asdict(ServerArgs) merged with the scheduler's info, plus
  `internal_states` (one dict per DP rank) and `version`; `GET /get_model_info` answers model_path,
  tokenizer_path, is_generation, preferred_sampling_params and weight_version (JSON both).
A trace the scheduler cannot write (output_dir missing or not writable by the server's user) is logged as an
error and the server keeps serving.

One scheduler thread batches all running requests into forward steps, as SGLang's scheduler does; each step is an
NVTX push/pop range `stub_forward_step`, and the profile window is a range `stub_profile_window` around the steps
it holds, so a capture of the stub shows whether the driver opened the window where it should.

Knobs (environment): STUB_SGLANG_STARTUP_S (seconds until healthy, default 0.5), STUB_SGLANG_STEP_MS (time per
step, default 4), STUB_SGLANG_PROFILED_STEP_MS (inside the window, default 6), STUB_SGLANG_CRASH_AFTER_S (exit with
code 3 after that many seconds, before becoming healthy), STUB_SGLANG_CRASH_IN_WINDOW_STEPS (die with code 4 after
that many steps inside the profile window, as a scheduler does on a CUDA error), STUB_SGLANG_REFUSE (a message: end
the start-up with a traceback whose exception is `ValueError: MESSAGE` and exit with code 1, as SGLang does when
it refuses a configuration at load), STUB_SGLANG_EVENTS (a file that receives one JSON line per
launch, request and profile event).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import nvtx
except ImportError:  # the stub still serves without NVTX
    nvtx = None


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


STARTUP_S = _env_float("STUB_SGLANG_STARTUP_S", 0.5)
STEP_MS = _env_float("STUB_SGLANG_STEP_MS", 4.0)
PROFILED_STEP_MS = _env_float("STUB_SGLANG_PROFILED_STEP_MS", 6.0)
CRASH_AFTER_S = os.environ.get("STUB_SGLANG_CRASH_AFTER_S")
CRASH_IN_WINDOW_STEPS = os.environ.get("STUB_SGLANG_CRASH_IN_WINDOW_STEPS")
REFUSE = os.environ.get("STUB_SGLANG_REFUSE")
EVENTS = os.environ.get("STUB_SGLANG_EVENTS")
DECODE_LOG_INTERVAL = 40
_events_lock = threading.Lock()


def log(message: str) -> None:
    print(f"[stub-sglang] {message}", flush=True)


def record(event: str, **data) -> None:
    if not EVENTS:
        return
    with _events_lock, open(EVENTS, "a") as fh:
        fh.write(json.dumps({"event": event, "time_s": time.time(), **data}) + "\n")


def _push(name: str) -> None:
    if nvtx is not None:
        nvtx.push_range(name)


def _pop() -> None:
    if nvtx is not None:
        nvtx.pop_range()


class Request:
    def __init__(self, prompt_tokens: int, max_new_tokens: int, seed: int):
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.output_ids: list = []
        self.events: queue.Queue = queue.Queue()  # receives the token count after each step, None when done


class Scheduler(threading.Thread):
    """Batches running requests into forward steps; owns the profile window (like SGLang's scheduler process)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.pending: queue.Queue = queue.Queue()
        self.control: queue.Queue = queue.Queue()
        self.running: list = []
        self.forward_ct = 0
        self.profiled_ct = 0
        self.profiling = False
        self.window_left = None
        self.stopped = threading.Event()
        self.torch_window = None  # the /start_profile body of a torch-profiler window, and its events
        self.pending_start = None  # (body, forward step) of a window asked for with start_step
        self.torch_events: list = []
        self.decode_ct, self.decode_tokens, self.decode_tic = 0, 0, time.perf_counter()

    # control requests run on this thread, between steps, and answer through a reply queue
    def call(self, op: str, body: dict) -> tuple:
        reply: queue.Queue = queue.Queue()
        self.control.put((op, body, reply))
        return reply.get(timeout=30)

    def _start_profile(self, body: dict) -> tuple:
        # profiler_manager.py, the START_PROFILE branch: with start_step (or profile_by_stage) the answer is
        # _init_profile's own, which fails while a profile is in progress; without them that failure is dropped
        # and _start_profile() starts the profiler again with the settings of the profile in progress, answering
        # success (so a second client's start looks accepted, and its output_dir is ignored)
        staged = bool(body.get("start_step")) or bool(body.get("profile_by_stage"))
        if self.profiling:
            if staged:
                return False, "Profiling is already in progress. Call /stop_profile first."
            record("start_profile_restarted", body=body, forward_ct=self.forward_ct)
            log("Profiling starts (the profile in progress, started again with its own settings)")
            return True, "Succeeded"
        if staged:  # the window opens at the forward step max(start_step, forward_ct + 1)
            self.pending_start = (body, max(int(body.get("start_step") or 0), self.forward_ct + 1))
            return True, "Succeeded"
        return self._begin_profile(body)

    def _begin_profile(self, body: dict) -> tuple:
        self.pending_start = None
        self.profiling = True
        self.window_left = body.get("num_steps")
        acts = body.get("activities") or ["CPU", "GPU"]
        self.torch_window = body if ("CPU" in acts or "GPU" in acts) else None
        self.torch_events = []
        _push("stub_profile_window")
        record("start_profile", body=body, forward_ct=self.forward_ct)
        log(f"Profiling starts (activities={body.get('activities')}, num_steps={self.window_left})")
        return True, "Succeeded"

    def _stop_profile(self, reason: str) -> tuple:
        if not self.profiling:
            return False, "Profiling is not in progress. Call /start_profile first."
        self.profiling = False
        _pop()
        if self.torch_window is not None:
            self._write_traces(self.torch_window)
            self.torch_window = None
        record("stop_profile", reason=reason, forward_ct=self.forward_ct)
        log(f"Profiling done ({reason})")
        return True, "Succeeded"

    def _write_traces(self, body: dict) -> None:
        import gzip

        out = body.get("output_dir") or "/tmp"
        profile_id = body.get("profile_id") or str(time.time())
        for rank in range(TP):
            events = []
            for i, (t0_us, t1_us, bs) in enumerate(self.torch_events):
                corr = 100 + i
                events += [
                    {"ph": "X", "cat": "user_annotation", "name": f"step[DECODE bs={bs}]", "pid": 7, "tid": 7,
                     "ts": t0_us, "dur": t1_us - t0_us, "args": {}},
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                     "ts": t0_us + 1.0, "dur": 2.0, "args": {"correlation": corr, "cbid": 211}},
                    {"ph": "X", "cat": "kernel", "name": "void stub::decode_kernel<1>(float*)", "pid": rank,
                     "tid": 7, "ts": t0_us + 5.0, "dur": max(1.0, (t1_us - t0_us) / 2),
                     "args": {"device": rank, "stream": 7, "correlation": corr, "grid": [1, 1, 1],
                              "block": [128, 1, 1]}}]
            trace = {"schemaVersion": 1, "deviceProperties": [{"id": rank, "name": "stub GPU", "numSms": 1}],
                     "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": TP},
                     "traceEvents": events}
            path = os.path.join(out, f"{profile_id}-TP-{rank}.trace.json.gz")
            try:
                with gzip.open(path + ".tmp", "wt") as fh:
                    json.dump(trace, fh)
                os.replace(path + ".tmp", path)
            except OSError as exc:
                log(f"ERROR: could not export the trace to {path}: {exc}")
                record("trace_failed", path=path, error=str(exc))
                continue
            record("trace", path=path, steps=len(self.torch_events))

    def run(self) -> None:
        while not self.stopped.is_set():
            while not self.control.empty():
                op, body, reply = self.control.get()
                reply.put(self._start_profile(body) if op == "start" else self._stop_profile("stop_profile"))
            joined = 0
            while not self.pending.empty():
                self.running.append(self.pending.get())
                joined += 1
            if joined:
                self._log_prefill(joined)
            if not self.running:
                time.sleep(0.001)
                continue
            if self.pending_start is not None and self.forward_ct >= self.pending_start[1]:
                self._begin_profile(self.pending_start[0])
            if self.profiling and self.window_left is not None and self.window_left <= 0:
                self._stop_profile("num_steps")
            self._step()
        if self.profiling:  # push/pop ranges must end on the thread that opened them
            self._stop_profile("shutdown")

    def _step(self) -> None:
        profiled = self.profiling
        before = len(self.running)
        _push("stub_forward_step")
        t0 = time.perf_counter_ns() / 1e3
        time.sleep((PROFILED_STEP_MS if profiled else STEP_MS) / 1e3)
        if profiled and self.torch_window is not None:
            self.torch_events.append((t0, time.perf_counter_ns() / 1e3, len(self.running)))
        _pop()
        self.forward_ct += 1
        if profiled and self.window_left is not None:
            self.window_left -= 1
        if profiled:
            self.profiled_ct += 1
            if CRASH_IN_WINDOW_STEPS is not None and self.profiled_ct >= int(CRASH_IN_WINDOW_STEPS):
                log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access was "
                    "encountered (simulated)")
                sys.stdout.flush()
                os._exit(4)
        still = []
        for req in self.running:
            req.output_ids.append((req.seed + len(req.output_ids)) % 1000 + 1)
            req.events.put(len(req.output_ids))
            if len(req.output_ids) >= req.max_new_tokens:
                req.events.put(None)
            else:
                still.append(req)
        self.running = still
        self._log_decode(before)

    # scheduler_metrics_mixin.py: log_prefill_stats once per prefill batch; log_decode_stats every
    # --decode-log-interval decode steps, its throughput the tokens decoded since the last such line over the time
    # since it (a prefill in between is inside that time)
    def _log_prefill(self, joined: int) -> None:
        print(f"[{_stamp()}] Prefill batch, #new-seq: {joined}, #new-token: {joined}, #cached-token: 0, token "
              f"usage: 0.00, #running-req: {len(self.running) - joined}, #queue-req: 0, cuda graph: False, input "
              "throughput (token/s): 1000.00", flush=True)

    def _log_decode(self, running: int) -> None:
        self.decode_tokens += running
        self.decode_ct += 1
        if self.decode_ct % DECODE_LOG_INTERVAL:
            return
        now = time.perf_counter()
        gap = now - self.decode_tic
        self.decode_tic = now
        tokens, self.decode_tokens = self.decode_tokens, 0
        print(f"[{_stamp()}] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.00, cuda graph: "
              f"False, gen throughput (token/s): {tokens / max(gap, 1e-9):.2f}, #queue-req: 0", flush=True)


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


SCHEDULER = Scheduler()
STARTED = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    server_version = "stub-sglang"

    def log_message(self, fmt, *args):  # quiet: the driver's log should hold the stub's own lines
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else {}

    def do_GET(self):
        if self.path in ("/health", "/health_generate"):
            up = time.monotonic() - STARTED >= STARTUP_S
            record("health", up=up)
            return self._send(200 if up else 503, b"", "text/plain")
        if self.path in ("/start_profile", "/stop_profile"):
            return self._profile({})
        if self.path == "/get_server_info":
            record("server_info")
            return self._json(200, server_info())
        if self.path == "/get_model_info":
            record("model_info")
            return self._json(200, {"model_path": ARGS.model_path, "tokenizer_path": ARGS.model_path,
                                    "is_generation": True, "preferred_sampling_params": None,
                                    "weight_version": "default"})
        self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        try:
            body = self._body()
        except ValueError:
            return self._json(400, {"error": {"message": "invalid JSON"}})
        if self.path == "/generate":
            return self._generate(body)
        if self.path in ("/start_profile", "/stop_profile"):
            return self._profile(body)
        self._json(404, {"detail": "Not Found"})

    def _profile(self, body: dict):
        op = "start" if self.path == "/start_profile" else "stop"
        ok, message = SCHEDULER.call(op, body)
        if not ok:  # RuntimeError(message) in SGLang, answered by the framework as a plain 500
            log(f"RuntimeError: {message}")
            return self._text(500, "Internal Server Error")
        self._text(200, "Start profiling.\n" if op == "start" else "Stop profiling. This will take some time.\n")

    def _generate(self, body: dict):
        ids = body.get("input_ids")
        if ids is None and isinstance(body.get("text"), str):
            ids = list(range(len(body["text"].split()) or 1))
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return self._json(400, {"error": {"message": "input_ids must be a non-empty list of ints"}})
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128))
        record("generate", prompt_tokens=len(ids), sampling_params=params, stream=bool(body.get("stream")),
               prompt_key=",".join(map(str, ids[:8])))
        req = Request(len(ids), max_new, seed=sum(ids))
        started = time.monotonic()
        SCHEDULER.pending.put(req)

        def payload(count: int, done: bool) -> dict:
            meta = {"id": f"stub-{id(req)}", "prompt_tokens": req.prompt_tokens, "completion_tokens": count,
                    "finish_reason": {"type": "length", "length": count} if done else None,
                    "e2e_latency": time.monotonic() - started}
            return {"text": "", "output_ids": req.output_ids[:count], "meta_info": meta}

        if not body.get("stream"):
            count = 0
            while (item := req.events.get()) is not None:
                count = item
            return self._json(200, payload(count, True))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        count = 0
        while True:
            item = req.events.get()
            done = item is None
            if not done:
                count = item
            if done or count < req.max_new_tokens:
                self.wfile.write(b"data: " + json.dumps(payload(count, done)).encode() + b"\n\n")
                self.wfile.flush()
            if done:
                break
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="stub_sglang")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp", "--tp-size", type=int, default=1)
    p.add_argument("--moe-runner-backend", default="auto")
    p.add_argument("--decode-log-interval", type=int, default=40)
    return p.parse_known_args(argv)


TP = 1
ARGS = None
VERSION = "0.5.16"


def server_info() -> dict:
    """What get_server_info answers: the server args (those this stub knows, with SGLang's field names), the
    scheduler's info, internal_states and version."""
    a = ARGS
    return {"model_path": a.model_path, "tokenizer_path": a.model_path, "host": a.host, "port": a.port,
            "tp_size": a.tp, "dp_size": 1, "ep_size": 1, "moe_runner_backend": a.moe_runner_backend,
            "attention_backend": "flashinfer", "sampling_backend": "flashinfer", "kv_cache_dtype": "auto",
            "disable_cuda_graph": True, "cuda_graph_bs": None, "decode_log_interval": a.decode_log_interval,
            "load_format": "dummy", "dtype": "auto", "max_total_num_tokens": 4096, "max_req_input_len": 4090,
            "internal_states": [{"last_gen_throughput": 0.0}], "version": VERSION}


def main(argv=None) -> int:
    global TP, ARGS
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    TP, ARGS = args.tp, args
    global DECODE_LOG_INTERVAL
    DECODE_LOG_INTERVAL = max(1, args.decode_log_interval)
    record("launch", argv=sys.argv[1:], model_path=args.model_path, tp=args.tp,
           moe_runner_backend=args.moe_runner_backend, port=args.port, extra=rest)
    log(f"server args: model_path={args.model_path} tp={args.tp} moe_runner_backend={args.moe_runner_backend} "
        f"port={args.port} extra={rest}")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    print(f"[{stamp}] server_args=ServerArgs(model_path='{args.model_path}', tp_size={args.tp}, "
          f"moe_runner_backend='{args.moe_runner_backend}', disable_cuda_graph=True)", flush=True)
    if REFUSE:
        # a model load that refuses the configuration, as SGLang's scheduler does (its traceback, then exit 1):
        # python/sglang/srt/layers/quantization/modelopt_quant.py raises for NVFP4 with a MoE runner the GPU lacks
        time.sleep(0.2)
        print("Traceback (most recent call last):\n  File \"sglang/srt/managers/scheduler.py\", line 1, in "
              f"run_scheduler_process\n    raise ValueError(...)\nValueError: {REFUSE}", flush=True)
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}] Received sigquit from a child process. It "
              "usually means the child failed.", flush=True)
        return 1
    if CRASH_AFTER_S is not None:
        time.sleep(float(CRASH_AFTER_S))
        log("Scheduler hit an exception: RuntimeError: CUDA error: out of memory (simulated)")
        return 3
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    SCHEDULER.start()

    def shutdown(signum, frame):
        log(f"received {signal.Signals(signum).name}, shutting down")
        record("shutdown", signal=signal.Signals(signum).name)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    log(f"Uvicorn running on http://{args.host}:{args.port} (stub)")
    httpd.serve_forever(poll_interval=0.1)
    SCHEDULER.stopped.set()
    SCHEDULER.join(timeout=5)
    httpd.server_close()
    log("shutdown complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
