"""`RunRecord`: one NAME.run.json, read through typed accessors, each with its one default.

Every accessor gives the field's value when the file records it and, when it does not (absent or null), one
default: None for a value, {} for an object, [] for an array. The exceptions say so in their docs: the flags
(`server_attached`, `graph_captured_in_window`) are False, `profiler_used` is nsys, and three arrays whose emptiness
is itself a recorded fact (`check_findings`, `graph_batch_sizes`, `log_span_bytes`) are None. A field `validate`
does not check (schema.py FIELDS) is type-checked here: a value of another type reads as not recorded. `raw` is the
dict itself, for writers and for `recorded`, which passes a field through into a machine output as the file has it
(null when absent).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar

from profattr.run_record.schema import FIELDS, fits, value_at

T = TypeVar("T")


class _Field(Generic[T]):
    """An accessor of one dotted field: its value when it is recorded and of `kind`, else `default()`."""

    def __init__(self, field: str, kind: str, default: Callable[[], T], doc: str):
        self.field, self.kind, self.default, self.__doc__ = field, kind, default, doc

    def __get__(self, record: Any, owner: Any = None) -> T:
        if record is None:
            return self  # type: ignore[return-value]  # the class attribute: the accessor itself
        value = value_at(record.raw, self.field)
        return value if value is not None and fits(value, self.kind) else self.default()


def _text(field: str, doc: str) -> _Field[Optional[str]]:
    return _Field(field, "str", lambda: None, doc)


def _int(field: str, doc: str) -> _Field[Optional[int]]:
    return _Field(field, "int", lambda: None, doc)


def _number(field: str, doc: str) -> _Field[Optional[float]]:
    return _Field(field, "num", lambda: None, doc)


def _dict(field: str, doc: str) -> _Field[dict]:
    return _Field(field, "dict", dict, doc)


def _list(field: str, doc: str) -> _Field[list]:
    return _Field(field, "list", list, doc)


def _list_or_none(field: str, doc: str) -> _Field[Optional[list]]:
    return _Field(field, "list", lambda: None, doc)


class RunRecord:
    """One run.json. `RunRecord(raw)` trusts `raw` (the dict profattr's own writers build); a file goes through
    run_record.load, which validates it first. A record that holds nothing (`{}`) is falsy, as no run.json is."""

    __slots__ = ("raw", "path")

    def __init__(self, raw: dict, path: Optional[Path] = None):
        self.raw = raw
        self.path = path

    def __bool__(self) -> bool:
        return bool(self.raw)

    def __repr__(self) -> str:
        return f"RunRecord({str(self.path) if self.path else self.name!r})"

    def has(self, field: str) -> bool:
        """Whether the dotted `field` is recorded (present and not null)."""
        return value_at(self.raw, field) is not None

    def recorded(self, field: str) -> Any:
        """A validated field (schema.py FIELDS) as the file has it, None when absent: what a machine output
        (JSON, the ledger) passes through unchanged."""
        if field not in FIELDS:
            raise KeyError(f"{field} is not a run.json field profattr validates")
        return value_at(self.raw, field)

    def replaced(self, **fields: Any) -> "RunRecord":
        """A copy with these top-level fields replaced (what profattr re-reads from the server log)."""
        return RunRecord(dict(self.raw, **fields), self.path)

    # --- what ran --------------------------------------------------------------------------------------------------
    schema = _text("schema", "`profattr.run/N`, or None")
    name = _text("name", "the capture's name (NAME of NAME.run.json), or None")
    status = _text("status", "complete | interrupted | needs_import ..., or None")
    target = _text("target", "what was profiled: sglang | workload | command ...")
    profiler = _text("profiler", "nsys | torch | ncu, or None")

    @property
    def profiler_used(self) -> str:
        """The profiler, `nsys` when not recorded (captures made before run.json named it were all nsys)."""
        return self.profiler or "nsys"

    created_utc = _text("created_utc", "when the capture started, ISO UTC")
    model = _text("model", "the served model (its path or id), or None")
    tp = _int("tp", "the tensor-parallel size (a positive integer), or None")
    driver_version = _text("driver_version", "the NVIDIA driver, or None")
    profiler_version = _text("profiler_version", "the torch profiler's version (a torch-profiler capture), or None")
    notes = _list("notes", "notes the capture wrote, []")
    capture_trace = _text("capture.trace", "nsys --trace (`cuda,nvtx,...`)")
    capture_range = _text("capture.capture_range", "nsys --capture-range (cudaProfilerApi, none ...), or None")
    cuda_graph_trace = _text("capture.cuda_graph_trace", "nsys --cuda-graph-trace (node | graph), or None")
    commands = _dict("commands", "{profile, target, import, export ...}: argv lists")
    profile_command = _list("commands.profile", "the profiler's argv, []")

    _gpus = _list("gpus", "the host's GPUs as recorded")

    @property
    def gpus(self) -> list:
        """The host's GPUs (nvidia-smi: index, name, clocks, driver ...), objects only; []."""
        return [g for g in self._gpus if isinstance(g, dict)]

    # --- versions --------------------------------------------------------------------------------------------------
    nsys_version = _text("nsys.version", "the nsys that recorded, or None")
    ncu_version = _text("ncu.version", "the ncu that profiled (a drill), or None")
    packages = _dict("packages", "package -> version (sglang, torch ...), {}")
    host = _dict("host", "{python, platform ...} of the host, {}")

    # --- the server and what it resolved ---------------------------------------------------------------------------
    backend = _dict("backend", "{requested, sglang}: the MoE backend asked for, {}")
    backend_requested = _text("backend.requested", "the backend `profattr capture --backend` was given, or None")
    backend_sglang = _text("backend.sglang",
                           "the MoE runner backend SGLang was asked for (--moe-runner-backend), or None")
    model_config = _dict("model_config", "the model's config.json, {}")
    server_args = _list("server.args", "the server's command-line arguments, []")
    server_launcher = _list("server.launcher", "the launcher's argv, []")
    server_port = _int("server.port", "the server's port, or None")

    @property
    def server_attached(self) -> bool:
        """True for a server profattr attached to (capture --server), else False."""
        return value_at(self.raw, "server.attached") is True

    server_log = _dict("server_log", "what the server log said (serverlog.py), {}")
    logged_server_args = _dict("server_log.server_args",
                               "the server's settings as its log printed them (SGLang names), {}")
    resolved = _dict("server_log.resolved", "the backends the server resolved (moe_runner_backend ...), {}")
    cuda_graph = _dict("server_log.cuda_graph",
                       "{decode, batch_sizes}: the CUDA graphs the server log says it captured, {}")
    graph_batch_sizes = _list_or_none("server_log.cuda_graph.batch_sizes",
                                      "the batch sizes of the decode graphs the server captured, or None")
    log_source = _text("server_log.source",
                       "where server_log came from (`server_info` for an attached server), or None")
    log_counts = _dict("server_log.counts", "event kind -> lines in the log, {}")
    log_in_window = _dict("server_log.in_window", "event kind -> lines inside the profiled window, {}")
    default_kernel_configs = _list("server_log.default_kernel_configs",
                                   "kernel shapes the server ran without a tuned config, []")
    loaded_quant = _dict("server_log.loaded_quant", "{quant, quant_algo} of the server's model-load line, {}")

    def log_events(self, kind: str) -> list:
        """The server log's events of one kind (`jit_compile`, `fallback`, `error`, `default_kernel_config`), []."""
        events = value_at(self.raw, f"server_log.events.{kind}")
        return events if isinstance(events, list) else []

    @property
    def server_flags(self) -> dict:
        """The server's command-line flags (`server.args`): `--name value` pairs, a flag without a value as True,
        keys with `-` as `_`; {}."""
        out: dict = {}
        items = [str(x) for x in self.server_args]
        for i, item in enumerate(items):
            if not item.startswith("--"):
                continue
            key, eq, value = item[2:].partition("=")
            nxt = items[i + 1] if i + 1 < len(items) else None
            follows = nxt is not None and not nxt.startswith("--")
            out[key.replace("-", "_")] = value if eq else (nxt if follows else True)
        return out

    def server_flag(self, flag: str) -> Optional[str]:
        """The value of `flag` (e.g. `--kv-cache-dtype`) on the recorded server command line (`--flag V` or
        `--flag=V`), or None."""
        argv = [str(a) for a in self.server_args]
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None

    # --- requests, window, timing ----------------------------------------------------------------------------------
    requests = _dict("requests", "{batch, input_len, max_new_tokens ...}, {}")
    batch = _int("requests.batch", "sequences per decode step, or None")
    input_len = _int("requests.input_len", "prompt tokens per request, or None")
    max_new_tokens = _int("requests.max_new_tokens", "tokens generated per request, or None")
    window = _dict("window", "the profiled window {steps_requested ...}, {}")
    steps_requested = _int("window.steps_requested", "decode steps the window asked for, or None")
    timing = _dict("timing", "what the target measured around the window, {}")
    ms_per_token_unprofiled = _number("timing.ms_per_token_unprofiled",
                                      "ms per token without the profiler (client side), or None")
    ms_per_token_profiled = _number("timing.ms_per_token_profiled", "ms per token under the profiler, or None")
    ms_per_token_profiled_client = _number("timing.ms_per_token_profiled_client",
                                           "ms per token under the profiler, client side, or None")
    profiled_source = _text("timing.profiled_source",
                            "where ms_per_token_profiled came from (older runs: none, client side)")
    unprofiled_step = _dict("timing.unprofiled_step",
                            "the server's unprofiled decode step at the window's batch {ms_per_step ...}, {}")
    cuda_driver_version = _int("timing.cuda_driver_version", "the CUDA driver, 1000 * major + 10 * minor, or None")
    log_span_bytes = _list_or_none("timing.log_span_bytes",
                                   "[start, end] bytes of the server log the timing rounds wrote, or None")

    # --- the built-in workload, recorded checks, files, drills, sessions -------------------------------------------
    workload = _dict("workload", "the built-in workload's record (its spec), {}")
    workload_batch = _int("workload.batch", "the built-in workload's batch")
    moe_impl = _text("workload.moe_impl", "the built-in workload's MoE")

    @property
    def graph_captured_in_window(self) -> bool:
        """Whether the built-in workload captured its CUDA graph inside the window; False when not recorded."""
        return bool(value_at(self.raw, "workload.graph_captured_in_window"))

    _findings = _list_or_none("check.findings", "the findings `profattr check` recorded")

    @property
    def check_findings(self) -> Optional[list]:
        """The finding objects `profattr check` recorded (`check.findings`), or None when it recorded none."""
        findings = self._findings
        return None if findings is None else [f for f in findings if isinstance(f, dict)]

    files = _dict("files", "role -> file name beside run.json (sqlite, log ...), {}")
    log_file = _text("files.log", "the server log's file name, or None")
    sqlite_file = _text("files.sqlite", "the export's file name, or None")
    trace_files = _list("files.traces", "the torch-profiler traces' names, []")
    drill = _dict("drill", "what a drill asked for (profattr drill), {}")
    drill_of = _text("drill.of", "the run.json of the capture drilled, or None")
    drill_kernel_regex = _text("drill.kernel_regex", "ncu's kernel regex, or None")
    drill_kernel_base = _text("drill.kernel_base", "ncu's --kernel-name-base")
    _families = _list("drill.families", "the kernel families the drill chose")

    @property
    def drill_families(self) -> list:
        """The kernel families the drill chose {category, family, names ...}, objects only; []."""
        return [f for f in self._families if isinstance(f, dict)]

    drill_launch_count = _int("drill.launch_count", "launches asked for, or None")
    drill_steps = _int("drill.steps", "decode steps drilled, or None")
    drill_graphs = _text("drill.graphs", "eager or CUDA graphs, or None")
    session = _dict("session", "the capture session of its windows, {}")
    session_name = _text("session.name", "the session's name, or None")
