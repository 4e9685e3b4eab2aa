"""Evidence from an SGLang server's log: what it resolved and what it warned about.

What SGLang 0.5.16 prints, and where (python/sglang/srt/...):
- `server_args=ServerArgs(...)` once at start-up (entrypoints/engine.py), after its defaults and overrides
  (arg_groups/overrides.py turns `auto` backends into concrete ones): the MoE runner, FP8 GEMM, attention and
  sampling backends, TP size, CUDA-graph settings actually used;
- "Using default MoE kernel config. Performance might be sub-optimal!" (layers/moe/moe_runner/triton_utils/
  fused_moe_triton_config.py) when no tuned Triton MoE config exists for the shape and GPU, and "Fallback to
  triton version ..." when one from another Triton version is used;
- "Capture ... CUDA graph begin. ... bs=[...]" (model_executor) when decode runs under CUDA graphs;
- "Load weight end. elapsed=..., type=GlmMoeDsaForCausalLM, quant=fp8, fmt=e4m3, ..." (model_executor/model_runner.py)
  once the weights are loaded: the quantization method the server resolved (`quant=modelopt_fp4, quant_algo=NVFP4`
  for a ModelOpt NVFP4 checkpoint);
- log lines start with `[YYYY-MM-DD HH:MM:SS]` (with ` TPn` etc. in multi-rank servers); a traceback is one
  event (its exception line); the 500 that `/stop_profile` answers once `num_steps` closed the window is profattr's
  own request, counted apart (`own_request`), not a server error.
Times are read as UTC (the server's clock, as written); events are matched to a window by its recorded times.
"""
from __future__ import annotations

import re
import statistics
from calendar import timegm
from pathlib import Path

MAX_BYTES = 64 * 1024 * 1024  # a log is read up to this size (the end is kept)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STAMP = re.compile(r"^\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[^\]]*)\]\s*")
SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)\)\s*$")
ARG = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]]*\]|\{[^}]*\}|[^,]+)")
# server_args fields that decide which kernels run
KEY_ARGS = ("moe_runner_backend", "fp8_gemm_runner_backend", "fp4_gemm_runner_backend", "attention_backend",
            "decode_attention_backend", "prefill_attention_backend", "sampling_backend", "quantization",
            "kv_cache_dtype", "tp_size", "dp_size", "ep_size", "moe_a2a_backend", "disable_cuda_graph",
            "cuda_graph_max_bs", "cuda_graph_bs", "disable_custom_all_reduce", "enable_layerwise_nvtx_marker",
            "disable_shared_experts_fusion", "page_size", "fp4_gemm_backend", "dsa_decode_backend",
            "dsa_prefill_backend",
            "nsa_decode_backend", "nsa_prefill_backend", "enable_torch_compile", "mem_fraction_static",
            "max_running_requests", "chunked_prefill_size", "disable_radix_cache", "load_format", "dtype")
# (kind, pattern): what a performance engineer must know happened
EVENTS = (
    ("default_kernel_config", re.compile(r"Using default \w[\w ]* (?:kernel )?config|Performance might be sub-optimal",
                                         re.IGNORECASE)),
    # a kernel or backend fallback (not SGLang's "fallback token IDs", which only names the yes/no tokens)
    ("fallback", re.compile(r"\bfall(?:ing)? ?back\b(?! token IDs)|\bfallback\b(?! token IDs)", re.IGNORECASE)),
    ("jit_compile", re.compile(r"\bJIT\b|\bcompil(?:e|ing|ation)\b|\bnvcc\b|\bautotun", re.IGNORECASE)),
    ("cuda_graph", re.compile(r"CUDA graph", re.IGNORECASE)),
    ("error", re.compile(r"Traceback \(most recent call last\)|\bError\b:|\bERROR\b|out of memory")),
    ("warning", re.compile(r"\bWARNING\b|\bWarning:|\bwarn\b", re.IGNORECASE)),
)
LOAD_QUANT = re.compile(r"Load weight end\b.*?\bquant=([\w.-]+)(?:.*?\bquant_algo=([\w.-]+))?")
GRAPH_CAPTURE = re.compile(r"Capture (?:target )?decode CUDA graph begin\b.*?\bbs=\[([0-9, ]*)\]", re.IGNORECASE)
DEFAULT_CONFIG = re.compile(r"Using default (.+?) (?:kernel )?config\b", re.IGNORECASE)
CONFIG_FILE = re.compile(r"configs/(?:[^/\s]+/)*([^/]+?\.json)")
TRACEBACK = "Traceback (most recent call last)"
ASGI_HEADER = "Exception in ASGI application"
# exceptions the capture driver itself provokes: /stop_profile after num_steps closed the window answers 500,
# and the SIGINT that stops the server at the end of a capture
OWN_REQUESTS = re.compile(r"Profiling is not in progress|^KeyboardInterrupt")
MAX_EVENTS_PER_KIND = 20


def _parse_args(text: str) -> dict:
    out = {}
    for key, value in ARG.findall(text):
        if key not in KEY_ARGS or key in out:
            continue
        value = value.strip()
        if value[:1] in "'\"":
            value = value[1:-1]
        elif value in ("True", "False"):
            value = value == "True"
        elif value == "None":
            value = None
        elif re.fullmatch(r"-?\d+", value):
            value = int(value)
        elif re.fullmatch(r"-?\d+\.\d*", value):
            value = float(value)
        out[key] = value
    return out


def _blocks(text: str):
    """(time, body) per log entry: a traceback becomes one entry, its exception line, at the time of the line
    before it (tracebacks carry no stamp)."""
    lines = [ANSI.sub("", raw).rstrip() for raw in text.splitlines()]
    t = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        stamp = STAMP.match(line)
        if stamp:
            t = timegm(tuple(int(x) for x in stamp.groups()) + (0, 0, 0))
        body = line[stamp.end():] if stamp else line.strip()
        if ASGI_HEADER in body and i < len(lines) and TRACEBACK in lines[i]:
            continue  # the header of the traceback that follows
        if TRACEBACK in body:
            while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
                i += 1
            if i < len(lines) and TRACEBACK in lines[i]:
                continue  # two processes' tracebacks interleaved: the next one ends with the exception
            exception = lines[i].strip() if i < len(lines) else "Traceback (no exception line)"
            i += 1
            yield t, ("own_request", exception) if OWN_REQUESTS.search(exception) else ("traceback", exception)
            continue
        yield t, (None, body)


def parse(text: str) -> dict:
    """Evidence from log text (see the module docstring): resolved server args, CUDA-graph use, and the events
    of each kind (first lines, with their time), with counts."""
    server_args: dict = {}
    graph_bs: list = []
    events: dict = {kind: [] for kind, _ in EVENTS}
    events["own_request"] = []
    counts: dict = {kind: 0 for kind in events}
    configs: set = set()
    loaded_quant: dict = {}
    for t, (tag, body) in _blocks(text):
        if tag == "own_request":
            counts["own_request"] += 1
            if len(events["own_request"]) < MAX_EVENTS_PER_KIND:
                events["own_request"].append({"time_utc_s": t, "text": body[:300]})
            continue
        m = SERVER_ARGS.search(body)
        if m:
            if not server_args:
                server_args = _parse_args(m.group(1))
            continue
        q = LOAD_QUANT.search(body)
        if q and not loaded_quant:
            loaded_quant = {"quant": q.group(1), "quant_algo": q.group(2)}
        g = GRAPH_CAPTURE.search(body)
        if g:
            graph_bs = sorted({int(x) for x in g.group(1).replace(" ", "").split(",") if x})
        kinds = ["error"] if tag == "traceback" else [k for k, pattern in EVENTS if pattern.search(body)][:1]
        for kind in kinds:
            counts[kind] += 1
            if kind == "default_kernel_config":
                what = DEFAULT_CONFIG.search(body)
                for f in CONFIG_FILE.findall(body):
                    configs.add(f"{what.group(1)}: {f}" if what else f)
            if len(events[kind]) < MAX_EVENTS_PER_KIND:
                events[kind].append({"time_utc_s": t, "text": body[:300]})
    resolved = {k: server_args.get(k) for k in ("moe_runner_backend", "fp8_gemm_runner_backend",
                                                "fp4_gemm_runner_backend", "attention_backend", "sampling_backend")
                if k in server_args}
    if "fp4_gemm_runner_backend" not in resolved and "fp4_gemm_backend" in server_args:
        resolved["fp4_gemm_runner_backend"] = server_args["fp4_gemm_backend"]
    graphs = None
    if server_args.get("disable_cuda_graph") is True:
        graphs = {"decode": False, "batch_sizes": []}
    elif graph_bs:
        graphs = {"decode": True, "batch_sizes": graph_bs}
    return {"server_args": server_args, "resolved": resolved, "cuda_graph": graphs, "loaded_quant": loaded_quant,
            "default_kernel_configs": sorted(configs), "counts": counts, "events": events}


EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b:?")


def server_said(evidence: dict | None) -> str | None:
    """The exception a dying server ended on (the last traceback's exception line, e.g. SGLang refusing a backend:
    "ValueError: Current platform does not support NVFP4 quantization with the selected MoE backend. ..."), or
    None when its log holds none."""
    rows = ((evidence or {}).get("events") or {}).get("error") or []
    said = [r["text"] for r in rows if EXCEPTION_LINE.match(r.get("text") or "")]
    return said[-1] if said else None


SERVER_INFO_SOURCE = "server_info"


def from_server_info(server_args: dict) -> dict:
    """The evidence a running server gives about itself without its log: the same shape as `parse`, from the
    server arguments its server-info endpoint answers (entrypoints/http_server.py: dataclasses.asdict(ServerArgs),
    the values the `server_args=ServerArgs(...)` start-up line shows). No events: the log is not read; the CUDA-graph
    batch sizes are the configured ones (`cuda_graph_bs`), not the captured ones."""
    args = {k: server_args[k] for k in KEY_ARGS if k in server_args}
    resolved = {k: args.get(k) for k in ("moe_runner_backend", "fp8_gemm_runner_backend", "fp4_gemm_runner_backend",
                                         "attention_backend", "sampling_backend") if k in args}
    graphs = None
    if args.get("disable_cuda_graph") is True:
        graphs = {"decode": False, "batch_sizes": []}
    elif args.get("disable_cuda_graph") is False and isinstance(args.get("cuda_graph_bs"), list):
        graphs = {"decode": True, "batch_sizes": sorted(int(b) for b in args["cuda_graph_bs"] if isinstance(b, int))}
    return {"source": SERVER_INFO_SOURCE, "server_args": args, "resolved": resolved, "cuda_graph": graphs,
            "default_kernel_configs": [], "counts": {}, "events": {}}


def _log_bytes(path, whole: bool = False) -> bytes | None:
    """A log file's bytes, gunzipped for a .gz: its last MAX_BYTES, or with `whole` all of it (byte offsets
    recorded while it was written refer to the start; a log too large for that gives None), None when unreadable."""
    try:
        path = Path(path)
        size = path.stat().st_size
        gz = path.suffix == ".gz"
        if whole and size > MAX_BYTES * (4 if gz else 1):
            return None
        with path.open("rb") as fh:
            if not whole and size > MAX_BYTES:
                fh.seek(size - MAX_BYTES)
            data = fh.read()
    except OSError:
        return None
    if gz:
        import gzip

        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return None
    return data


def read_log(path) -> dict | None:
    """`parse` of a log file (the last MAX_BYTES of it), or None when it cannot be read."""
    data = _log_bytes(path)
    return None if data is None else parse(data.decode("utf-8", errors="replace"))


def for_window(evidence: dict | None, window: dict) -> dict | None:
    """The evidence with each timed event marked in_window (between the window's opening and closing, as
    profattr recorded them), and the count of such events per kind."""
    if evidence is None:
        return None
    opened, closed = window.get("opened_utc_s"), window.get("closed_utc_s")
    out = dict(evidence, events={}, in_window={})
    for kind, rows in evidence["events"].items():
        marked = []
        for row in rows:
            t = row.get("time_utc_s")
            inside = (opened is not None and closed is not None and t is not None
                      and int(opened) <= t <= int(closed) + 1)  # log stamps have whole seconds
            marked.append(dict(row, in_window=inside))
        out["events"][kind] = marked
        out["in_window"][kind] = sum(1 for r in marked if r["in_window"])
    return out


# "Decode batch, #running-req: 4, #token: 512, token usage: 0.00, cuda graph: True, gen throughput (token/s):
# 1303.57, #queue-req: 0" (managers/scheduler_metrics_mixin.py, log_decode_stats): printed every
# --decode-log-interval decode steps, the throughput being the tokens decoded since the previous such line over the
# time since it. A line right after a prefill (or after an idle server) spans more than decode steps, so only a line
# whose previous scheduler line was a decode line at the same number of requests is one of decode steps alone.
DECODE_LINE = re.compile(rb"Decode batch[.,]?\s.*?#running-req:\s*(\d+)\b.*?gen throughput \(token/s\):\s*([0-9.]+)")
PREFILL_LINE = re.compile(rb"Prefill batch")
DECODE_STEP_METHOD = ("server log: SGLang's decode lines at #running-req = batch whose previous scheduler line was "
                      "a decode line too (decode steps only); one step = #running-req / gen throughput")


def decode_step_ms(data: bytes, batch: int) -> list:
    """ms per decode step of each clean decode line at `batch` requests in log bytes (see DECODE_LINE)."""
    out, previous = [], None
    for line in data.splitlines():
        m = DECODE_LINE.search(line)
        if m:
            running, tokens_per_s = int(m.group(1)), float(m.group(2))
            if previous == running == batch and tokens_per_s > 0:
                out.append(1e3 * running / tokens_per_s)
            previous = running
        elif PREFILL_LINE.search(line):
            previous = None
    return out


def unprofiled_steps(path, batch: int, span_bytes=None) -> dict | None:
    """The unprofiled time of one decode step at `batch` from the server's own decode lines: those of the timed
    rounds when the capture recorded where they lie in the log (`span_bytes`), else every clean decode line at that
    batch (warm-up, timing and windows alike: a rougher figure, said so). None without a readable log or lines."""
    raw = _log_bytes(path, whole=True)
    if raw is None:
        return None
    where = "all of the server's decode lines at this batch (the capture recorded no timing span)"
    if span_bytes and len(span_bytes) == 2 and all(isinstance(x, int) for x in span_bytes):
        raw, where = raw[span_bytes[0]:span_bytes[1]], "the unprofiled timing rounds"
    values = decode_step_ms(raw, int(batch))
    if not values:
        return None
    q25, _q50, q75 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"ms_per_step": statistics.median(values), "p25_ms": q25, "p75_ms": q75, "min_ms": min(values),
            "max_ms": max(values), "lines": len(values), "batch": int(batch), "method": DECODE_STEP_METHOD, "lines_from": where}
