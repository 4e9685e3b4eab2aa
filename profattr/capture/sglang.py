"""Driving an SGLang server over HTTP: its command line, health, token-id generate requests (streamed, timed per
token), and the profile window (`/start_profile` with `num_steps`).

Checked against SGLang 0.5.16:
- `python/sglang/srt/server_args.py`: MOE_RUNNER_BACKEND_CHOICES (the `--moe-runner-backend` values);
- `python/sglang/srt/entrypoints/http_server.py`: `GET /health` (503 while starting, 200 when up), `POST /generate`
  (streaming answers server-sent events `data: {...}` and a final `data: [DONE]`), `/start_profile` and
  `/stop_profile` (both answer plain text, not JSON; a failure inside raises, which FastAPI answers with 500);
- `python/sglang/srt/managers/scheduler_components/profiler_manager.py`: activity "CUDA_PROFILER" calls
  cudaProfilerStart/Stop on the base GPU's scheduler only; `num_steps` stops the window by itself after that many
  forward steps (prefill or decode), after which `/stop_profile` fails with "Profiling is not in progress";
  activities "CPU"/"GPU" run torch.profiler and export `{profile_id}-TP-{tp_rank}.trace.json.gz` into
  `output_dir` (DP/PP/EP ranks appended when those are > 1);
- `python/sglang/srt/managers/io_struct.py`: ProfileReq fields (output_dir, num_steps, activities, with_stack,
  record_shapes, profile_id);
- `python/sglang/srt/managers/tokenizer_manager.py`: streamed `output_ids` are cumulative unless the server runs with
  `--incremental-streaming-output`; `meta_info.completion_tokens` counts the tokens so far.
"""
from __future__ import annotations

import json
import random
import shlex
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from statistics import mean, median, pstdev
from typing import Callable, Sequence

from profattr.engines.sglang import (ALIASES, BACKEND_FAMILIES, MOE_RUNNER_BACKENDS,  # noqa: F401
                                     SGLANG_VERSION, VERBATIM_PREFIX)
from profattr.errors import ProfattrError

# Server options profattr sets itself; giving them after `--` too would make two different values.
OWNED_SERVER_ARGS = ("--model-path", "--model", "--tp", "--tp-size", "--port", "--host", "--moe-runner-backend")
PROFILE_ACTIVITIES = ["CUDA_PROFILER"]


def backend_help() -> str:
    """One line for --help: the aliases and every accepted name."""
    aliases = ", ".join(f"{k} = {v}" for k, v in ALIASES.items())
    others = ", ".join(b for b in MOE_RUNNER_BACKENDS if b not in ALIASES)
    return (f"SGLang MoE runner backend ({aliases}; also {others}, as SGLang {SGLANG_VERSION} names them; "
            f"`{VERBATIM_PREFIX}NAME` passes NAME unchecked, e.g. {VERBATIM_PREFIX}cutlass for SGLang's own runner)")


def resolve_backend(name: str) -> str:
    """The `--moe-runner-backend` value for a user-facing backend name; ProfattrError for an unknown one."""
    if name.startswith(VERBATIM_PREFIX) and len(name) > len(VERBATIM_PREFIX):
        return name[len(VERBATIM_PREFIX):]
    if name in ALIASES:
        return ALIASES[name]
    if name in MOE_RUNNER_BACKENDS:
        return name
    valid = ", ".join(list(ALIASES) + [b for b in MOE_RUNNER_BACKENDS if b not in ALIASES])
    raise ProfattrError(f"unknown backend {name!r}; valid: {valid} (or {VERBATIM_PREFIX}NAME to pass a name "
                        f"SGLang {SGLANG_VERSION} did not have)")


def default_launcher() -> list:
    return [sys.executable, "-m", "sglang.launch_server"]


def launcher_command(launcher: str | None) -> list:
    """The command that starts the server, as a list: `launcher` split like a shell would, else the default."""
    if not launcher:
        return default_launcher()
    parts = shlex.split(launcher)
    if not parts:
        raise ProfattrError("--launcher is empty; give a command such as 'python -m sglang.launch_server'")
    return parts


def check_passthrough(extra: Sequence[str]) -> None:
    """Refuse server arguments after `--` that profattr sets itself (two values would be ambiguous)."""
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_SERVER_ARGS:
            raise ProfattrError(f"{flag} after `--` clashes with the value profattr passes; give it to "
                                "`profattr capture` (--model, --tp, --port, --host, --backend) instead")


def server_command(launcher: Sequence[str], model: str, tp: int, backend: str, host: str, port: int,
                   extra: Sequence[str] = ()) -> list:
    """The full server command line (without nsys)."""
    return [*launcher, "--model-path", str(model), "--tp", str(tp), "--moe-runner-backend", backend,
            "--host", host, "--port", str(port), *extra]


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (a second server would fail to bind, or worse, the
    requests would go to the old one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


PROMPT_KINDS = ("random", "same")
PROMPT_ID_RANGE = (100, 10_000)  # token ids that exist in every vocabulary served here (no tokenizer needed)


def prompt_ids(length: int, seed: int | None = None) -> list:
    """`length` token ids. Without a seed, the one fixed prompt of earlier captures; with one, ids drawn uniformly
    from PROMPT_ID_RANGE by a generator seeded with it (the same seed gives the same prompt)."""
    if seed is None:
        return [100 + (i * 37) % 1000 for i in range(length)]
    rng = random.Random(seed)
    lo, hi = PROMPT_ID_RANGE
    return [rng.randrange(lo, hi) for _ in range(length)]


class Requests:
    """The bodies of each round of concurrent requests. `random` (the default): every request of every round gets
    its own prompt (seeded by the round's and the request's number, so a capture is reproducible), so a batch holds
    distinct requests as real traffic does (whether they reach different experts is the router's: under dummy
    weights they may not); `same`: the one fixed prompt for all, as captures made before this choice existed."""

    def __init__(self, kind: str, input_len: int, max_new_tokens: int, seed: int = 0):
        if kind not in PROMPT_KINDS:
            raise ValueError(f"prompts {kind!r}: expected one of {', '.join(PROMPT_KINDS)}")
        self.kind, self.input_len, self.max_new_tokens, self.seed = kind, input_len, max_new_tokens, seed
        self.rounds = 0

    def bodies(self, batch: int) -> list:
        """The next round's `batch` bodies."""
        self.rounds += 1
        if self.kind == "same":
            return [generate_body(prompt_ids(self.input_len), self.max_new_tokens)] * batch
        base = (self.seed * 1_000_003 + self.rounds) * 4096
        return [generate_body(prompt_ids(self.input_len, base + i), self.max_new_tokens) for i in range(batch)]

    def describe(self) -> dict:
        """What run.json records of the prompts."""
        if self.kind == "same":
            return {"prompts": "same", "prompts_note": "one fixed prompt for every request (prompt_ids without seed)"}
        return {"prompts": "random", "prompt_seed": self.seed, "prompt_id_range": list(PROMPT_ID_RANGE),
                "prompts_note": ("distinct random token ids per request and round: request i of round r is seeded "
                                 "with (seed * 1000003 + r) * 4096 + i, rounds counted from 1 over warm-up, timing "
                                 "and windows in order")}


def generate_body(input_ids: Sequence[int], max_new_tokens: int, stream: bool = True) -> dict:
    """A /generate request that always decodes exactly `max_new_tokens` tokens (greedy, end-of-sequence ignored)."""
    return {"input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": 0, "ignore_eos": True},
            "stream": bool(stream)}


def profile_body(num_steps: int) -> dict:
    return {"activities": list(PROFILE_ACTIVITIES), "num_steps": int(num_steps)}


def torch_profile_body(num_steps: int, output_dir: str, profile_id: str, with_stack: bool = False) -> dict:
    """`/start_profile` for a torch-profiler trace (profiler_manager.py: activities CPU and GPU; the trace is
    written as OUTPUT_DIR/PROFILE_ID-TP-<rank>.trace.json.gz when `num_steps` forward steps have run). Stacks and
    shapes are off by default: they cost CPU time in every step and inflate the trace; SGLang's own default is
    on (tokenizer_control_mixin.py, SGLANG_PROFILE_WITH_STACK).

    `start_step` 1 opens the window at the next forward step (max(start_step, forward count + 1)), and it is what
    makes a busy server say so: in profiler_manager.py's START_PROFILE branch, only a request with start_step (or
    profile_by_stage) gets _init_profile's answer, which fails ("Profiling is already in progress", HTTP 500) while
    another profile runs; without it that failure is dropped, the profile in progress is started again with its
    own settings and the answer is 200, so the window's traces would never come and its /stop_profile would stop
    the other client's profile (seen on a real SGLang 0.5.16 server)."""
    return {"activities": ["CPU", "GPU"], "num_steps": int(num_steps), "output_dir": output_dir,
            "profile_id": profile_id, "with_stack": bool(with_stack), "record_shapes": False, "start_step": 1}


def trace_files(folder, profile_id: str) -> list:
    """The torch-profiler traces SGLang wrote for `profile_id` (one per rank), sorted by rank."""
    import re
    from pathlib import Path

    pattern = re.compile(re.escape(profile_id) + r"-TP-(\d+)(-[A-Z]+-\d+)*\.trace\.json\.gz$")
    found = [(int(m.group(1)), p) for p in Path(folder).iterdir() if (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


@dataclass
class StreamResult:
    """One streamed generate: arrival time (s, perf_counter) and token count of every event."""

    sent_s: float
    times_s: list = field(default_factory=list)
    tokens: list = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return self.tokens[-1] if self.tokens else 0

    def decode_ms_per_token(self, max_token: int | None = None) -> float | None:
        """Decode time per token: time from the first streamed token to the last event with at most `max_token`
        tokens, divided by the tokens between them. The first token (prefill) is excluded; events that carry
        several tokens at once are handled by their counts. None when fewer than two tokens qualify."""
        pts = [(t, n) for t, n in zip(self.times_s, self.tokens) if n >= 1 and (max_token is None or n <= max_token)]
        if len(pts) < 2 or pts[-1][1] <= pts[0][1]:
            return None
        (t0, n0), (t1, n1) = pts[0], pts[-1]
        return (t1 - t0) * 1e3 / (n1 - n0)


class Client:
    """Minimal HTTP client for the SGLang endpoints profattr uses (standard library only)."""

    def __init__(self, host: str, port: int, timeout_s: float = 600):
        self.base = f"http://{host}:{port}"
        self.timeout_s = timeout_s

    def url(self, path: str) -> str:
        return self.base + path

    def _request(self, path: str, body: dict | None, timeout_s: float | None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s)

    def call(self, path: str, body: dict | None = None, timeout_s: float | None = None) -> tuple:
        """(HTTP status, body text); an HTTP error status is returned, not raised."""
        try:
            with self._request(path, body, timeout_s) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def healthy(self) -> bool:
        try:
            return self.call("/health", timeout_s=5)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    def generate_stream(self, body: dict, timeout_s: float | None = None, first_token=None) -> StreamResult:
        """POST a streaming /generate and time every server-sent event until `data: [DONE]`; `first_token` (a
        threading.Event) is set when the first token arrives (the prefill is done)."""
        body = dict(body, stream=True)
        result = StreamResult(sent_s=time.perf_counter())
        try:
            resp = self._request("/generate", body, timeout_s)
        except urllib.error.HTTPError as exc:
            raise ProfattrError(f"POST /generate answered {exc.code}: "
                                f"{exc.read().decode(errors='replace')[:200]}") from None
        with resp:
            incremental_total = 0
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise ProfattrError(f"POST /generate streamed an error: {str(event['error'])[:200]}")
                meta = event.get("meta_info") or {}
                if "completion_tokens" in meta:
                    count = int(meta["completion_tokens"])
                else:  # cumulative output_ids by default; with --incremental-streaming-output they are deltas
                    incremental_total += len(event.get("output_ids") or [])
                    count = incremental_total
                result.times_s.append(time.perf_counter())
                result.tokens.append(count)
                if first_token is not None and count >= 1:
                    first_token.set()
        return result


def wait_healthy(client: Client, alive: Callable[[], bool], timeout_s: float, poll_s: float = 1.0,
                 on_tick: Callable[[float], None] | None = None, tick_s: float = 30) -> float:
    """Poll GET /health until 200; returns the seconds it took. Raises ServerExited when `alive()` turns False,
    ServerTimeout after `timeout_s`."""
    start = time.monotonic()
    next_tick = tick_s
    while True:
        elapsed = time.monotonic() - start
        if client.healthy():
            return elapsed
        if not alive():
            raise ServerExited(elapsed)
        if elapsed >= timeout_s:
            raise ServerTimeout(elapsed)
        if on_tick and elapsed >= next_tick:
            on_tick(elapsed)
            next_tick += tick_s
        time.sleep(poll_s)


class ServerExited(Exception):
    def __init__(self, elapsed_s: float):
        super().__init__(elapsed_s)
        self.elapsed_s = elapsed_s


class ServerTimeout(Exception):
    def __init__(self, elapsed_s: float):
        super().__init__(elapsed_s)
        self.elapsed_s = elapsed_s


def run_concurrent(client: Client, bodies: Sequence[dict], after_first_token=None) -> list:
    """One streaming generate per body, all at once (one thread each); returns their StreamResults.
    `after_first_token()` runs in the caller's thread once every stream has its first token (all prefills done),
    while they decode."""
    batch = len(bodies)
    results: list = [None] * batch
    errors: list = []
    firsts = [threading.Event() for _ in range(batch)]

    def one(i: int) -> None:
        try:
            results[i] = client.generate_stream(bodies[i], first_token=firsts[i])
        except Exception as exc:  # re-raised in the caller's thread
            errors.append(exc)
            firsts[i].set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(batch)]
    for t in threads:
        t.start()
    if after_first_token is not None:
        for event in firsts:
            event.wait(timeout=client.timeout_s)
        if not errors:
            after_first_token()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def ms_per_token(results: Sequence[StreamResult], max_token: int | None = None) -> float | None:
    """Mean over the concurrent streams of their decode ms/token (at batch B this is the time of one step)."""
    values = [v for v in (r.decode_ms_per_token(max_token) for r in results) if v is not None]
    return mean(values) if values else None


def spread(values: Sequence[float]) -> dict:
    """Summary of repeated trials: median (the value reported), mean, min, max, population stdev, n."""
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"median": median(values), "mean": mean(values), "min": min(values), "max": max(values),
            "stdev": pstdev(values), "n": len(values)}


def curl(client: Client, path: str, body: dict | None = None) -> str:
    """The request as a curl command line (for --dry-run)."""
    if body is None:
        return f"curl -s {client.url(path)}"
    flags = "-sN " if body.get("stream") else "-s "
    return (f"curl {flags}-X POST {client.url(path)} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body, separators=(',', ':')))}")
