"""Planning a capture: validate the options, pick the target, and build every command line (nsys around the SGLang
server, the built-in workload or any command), before anything runs. `describe` is the dry run.

Outputs of a capture named NAME in its folder: NAME.nsys-rep (or NAME.qdstrm where nsys has no importer),
NAME.sqlite, NAME.run.json, NAME.log (nsys and target output), NAME.workload.json (workload metadata); with
`--profiler torch`, NAME-TP-<rank>.trace.json.gz (torch-profiler traces, one per rank) instead of the nsys files.

One SGLang server can serve several profiled windows: one per batch size of `--batch 1,4,8`, times `--repeat N`
replicates. Each window is a capture of its own (NAME-bsB-rI); they share the server's log (SESSION.log).
How a window is recorded (`--capture-range`):
- cudaProfilerApi (default): SGLang's `/start_profile` with CUDA_PROFILER calls cudaProfilerStart/Stop on its base
  GPU; nsys (`--capture-range-end=repeat:K` for K windows) writes one report per window;
- session: profattr starts the server under `nsys launch` and opens each window itself (`nsys start` / `nsys stop`
  around the window's requests): every process of the server is recorded, whichever rank calls what;
- nvtx: a window is an NVTX range named by `--nvtx-capture` (for targets that mark their windows);
- none: the whole run is one capture.
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from profattr.capture import ncu
from profattr.tools import nsys as nsys_tool
from profattr.capture import sglang
from profattr.errors import ProfattrError

SCHEMA = "profattr.run/1"
SUFFIXES = {"report": ".nsys-rep", "qdstrm": ".qdstrm", "sqlite": ".sqlite", "run": ".run.json", "log": ".log",
            "workload": ".workload.json", "ncu_report": ".ncu-rep", "ncu_csv": ".ncu.csv"}
CAPTURE_RANGES = ("cudaProfilerApi", "session", "nvtx", "none")
PROFILERS = ("nsys", "torch", "ncu")
WORKLOAD_MODULE = "profattr.workloads.moe_decode"
WINDOW_MARGIN_TOKENS = 4  # decode past the window so that SGLang's step counter reaches num_steps and closes it
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Options:
    """Everything `profattr capture` was asked to do (the Click command fills it)."""

    out_dir: Path = Path("captures")
    name: str | None = None
    force: bool = False
    dry_run: bool = False
    nsys: str | None = None
    trace: str | None = None
    capture_range: str | None = None
    cuda_graph_trace: str = "node"
    args: tuple = ()  # after `--`: server args (sglang), workload args, or the command
    # sglang
    model: str | None = None
    backend: str | None = None
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    launcher: str | None = None
    health_timeout_s: float = 600
    input_len: int = 64
    max_new_tokens: int = 64
    prompts: str = "random"  # sglang.PROMPT_KINDS
    prompt_seed: int = 0
    batch: int = 1
    warmup: int = 3
    trials: int = 5
    steps: int = 20
    # workload
    workload: str | None = None
    mode: str = "eager"
    moe_impl: str = "grouped"
    graph_window: str = "after"
    timeout_s: float | None = None
    # several windows from one server (SGLang): batch sizes, replicates of each
    batches: tuple = ()
    repeat: int = 1
    nvtx_capture: str | None = None
    cpu_samples: bool = False  # nsys --sample=process-tree --python-sampling=true
    profiler: str = "nsys"
    torch_with_stack: bool = False
    # profiler ncu (profattr drill): the kernels to profile inside the window
    ncu: str | None = None
    ncu_kernels: str | None = None
    ncu_launch_count: int = 0
    ncu_launch_skip: int = 0
    ncu_kernel_base: str = "function"

    @property
    def batch_list(self) -> tuple:
        return tuple(self.batches) or (self.batch,)


@dataclass(frozen=True)
class Window:
    """One profiled window: its capture name, decode batch size, replicate number (1-based) and position in the
    server's session (1-based; nsys numbers repeated reports this way)."""

    name: str
    batch: int
    replicate: int
    index: int


@dataclass
class Plan:
    options: Options
    target: str
    name: str
    nsys: nsys_tool.Nsys | None
    trace: str
    capture_range: str
    target_cmd: list
    profile_cmd: list
    env: dict = field(default_factory=dict)
    backend_sglang: str | None = None
    windows: list = field(default_factory=list)
    session: str | None = None  # nsys session name (--capture-range session)
    ncu: "ncu.Ncu | None" = None  # the Nsight Compute of a drill

    @property
    def base(self) -> Path:
        return self.options.out_dir / self.name

    def path(self, kind: str) -> Path:
        """The session's file of this kind (its log; with one window, that window's files too)."""
        return self.options.out_dir / (self.name + SUFFIXES[kind])

    def window_path(self, window: Window, kind: str) -> Path:
        return self.options.out_dir / (window.name + SUFFIXES[kind])

    def nsys_output(self, window: Window) -> Path:
        """Where nsys writes a window's report, before profattr names it: with several windows under one
        `nsys profile`, nsys numbers them NAME.1, NAME.2, ... (capture range repeat)."""
        if len(self.windows) > 1 and self.capture_range in ("cudaProfilerApi", "nvtx"):
            return self.options.out_dir / f"{self.name}.{window.index}"
        return self.options.out_dir / window.name


# --- planning -----------------------------------------------------------------------------------------------------

def _target_of(opts: Options) -> str:
    if opts.model and opts.workload:
        raise ProfattrError("give either --model (SGLang) or --workload, not both")
    if opts.model:
        return "sglang"
    if opts.workload:
        if opts.workload != "moe-decode":
            raise ProfattrError(f"unknown workload {opts.workload!r}; the built-in one is moe-decode")
        return "workload"
    if not opts.args:
        raise ProfattrError("nothing to capture: give --model PATH (SGLang), --workload moe-decode, "
                            "or a command after `--`")
    return "command"


def _default_name(opts: Options, target: str) -> str:
    if opts.name:
        if "/" in opts.name or opts.name.startswith(".") or not re.fullmatch(r"[\w.+-]+", opts.name):
            raise ProfattrError(f"--name {opts.name!r} must be a plain file name of letters, digits and . _ + - "
                                "(use -o for the folder)")
        return opts.name
    if target == "sglang":
        batches = opts.batch_list
        bs = f"-bs{batches[0]}" if len(batches) == 1 else ""
        backend = re.sub(r"[^\w.+-]", "_", opts.backend or "auto")
        return f"sglang-{backend}-tp{opts.tp}{bs}"
    if target == "workload":
        return f"moe-decode-{opts.mode}-{opts.moe_impl}-tp{opts.tp}-bs{opts.batch}"
    return _command_name(opts.args)


def _command_name(args) -> str:
    """A short name for a command: the module of `python -m pkg.mod` (mod), a script's stem, else the program."""
    program = Path(args[0]).name
    if program.startswith("python") and len(args) > 1:
        if args[1] == "-m" and len(args) > 2:
            return args[2].rsplit(".", 1)[-1]
        if not args[1].startswith("-"):
            return Path(args[1]).stem
    return re.sub(r"[^\w.-]", "_", program) or "capture"


def _check_model(model: str, dry_run: bool) -> None:
    if dry_run or Path(model).expanduser().exists():
        return
    if HF_REPO_ID.match(model) and not model.startswith((".", "~")):
        return  # a Hugging Face repository id; SGLang downloads it
    raise ProfattrError(f"model path {model} does not exist; give a local model folder (with config.json) "
                        "or a Hugging Face repository id such as Qwen/Qwen3-30B-A3B")


def _workload_command(opts: Options, meta_path: Path) -> list:
    args = ["--mode", opts.mode, "--moe-impl", opts.moe_impl, "--graph-window", opts.graph_window,
            "--steps", str(opts.steps), "--batch", str(opts.batch), "--meta-out", str(meta_path), *opts.args]
    if opts.tp > 1:
        # torch's own launcher, run by this Python: a `torchrun` on PATH may belong to another environment
        head = [sys.executable, "-m", "torch.distributed.run"]
        return [*head, "--nproc-per-node", str(opts.tp), "-m", WORKLOAD_MODULE, *args]
    return [sys.executable, "-m", WORKLOAD_MODULE, *args]


def plan_all(opts: Options) -> list:
    """The plans of a capture command: one session for an SGLang server (its windows are the replicates), or
    one separate run per replicate for the workload and commands (NAME-rI)."""
    if opts.repeat <= 1 or _target_of(opts) == "sglang":
        return [plan(opts)]
    base = _default_name(opts, _target_of(opts))
    return [plan(replace(opts, name=f"{base}-r{i}", repeat=1)) for i in range(1, opts.repeat + 1)]


def windows_of(opts: Options, base: str) -> list:
    """The windows of a session, in the order they run: per batch size, its replicates."""
    batches = opts.batch_list
    out = []
    for batch in batches:
        for rep in range(1, opts.repeat + 1):
            name = base + (f"-bs{batch}" if len(batches) > 1 else "") + (f"-r{rep}" if opts.repeat > 1 else "")
            out.append(Window(name=name, batch=batch, replicate=rep, index=len(out) + 1))
    return out


def _check_windows(opts: Options, target: str, capture_range: str) -> None:
    several = len(opts.batch_list) > 1 or opts.repeat > 1
    if opts.repeat < 1:
        raise ProfattrError(f"--repeat must be at least 1 (got {opts.repeat})")
    if len(set(opts.batch_list)) != len(opts.batch_list):
        raise ProfattrError(f"--batch lists a size twice ({','.join(map(str, opts.batch_list))})")
    if len(opts.batch_list) > 1 and target != "sglang":
        raise ProfattrError("several --batch sizes need an SGLang target (--model): one server serves them all")
    if several and capture_range == "none" and target == "sglang":
        raise ProfattrError("several windows (--batch list or --repeat) need a capture range: use "
                            "--capture-range cudaProfilerApi (default) or session")
    if capture_range == "nvtx" and not opts.nvtx_capture:
        raise ProfattrError("--capture-range nvtx needs --nvtx-capture RANGE (the NVTX range that is a window)")
    if opts.nvtx_capture and capture_range != "nvtx":
        raise ProfattrError("--nvtx-capture applies with --capture-range nvtx")
    if capture_range == "session" and target != "sglang":
        raise ProfattrError("--capture-range session drives the windows of an SGLang server (--model); for a "
                            "command use cudaProfilerApi, nvtx or none")
    if opts.profiler not in PROFILERS:
        raise ProfattrError(f"--profiler {opts.profiler!r}: expected nsys or torch")
    if opts.profiler == "ncu" and (several or target != "sglang" or not opts.ncu_kernels):
        raise ProfattrError("an ncu drill profiles one window of an SGLang server, for the kernels it names")
    if opts.profiler == "torch" and target != "sglang":
        raise ProfattrError("--profiler torch asks SGLang's /start_profile for a torch-profiler trace: it needs "
                            "--model; for other programs use torch.profiler in the program itself")


def plan(opts: Options) -> Plan:
    """Validate the options and build every command line; finds nsys (a dry run works without one)."""
    target = _target_of(opts)
    for flag, value in (("--tp", opts.tp), ("--steps", opts.steps),
                        ("--input-len", opts.input_len), ("--max-new-tokens", opts.max_new_tokens)):
        if value < 1:
            raise ProfattrError(f"{flag} must be at least 1 (got {value})")
    for value in opts.batch_list:
        if value < 1:
            raise ProfattrError(f"--batch must be at least 1 (got {value})")
    if not 1 <= opts.port <= 65535:
        raise ProfattrError(f"--port must be between 1 and 65535 (got {opts.port})")
    if opts.warmup < 0 or opts.trials < 1:
        raise ProfattrError("--warmup must be >= 0 and --trials >= 1")
    backend = None
    if target == "sglang":
        backend = sglang.resolve_backend(opts.backend or "auto")
        _check_model(opts.model, opts.dry_run)
        sglang.check_passthrough(opts.args)
        if opts.max_new_tokens < opts.steps + WINDOW_MARGIN_TOKENS:
            raise ProfattrError(f"--max-new-tokens ({opts.max_new_tokens}) must be at least --steps + "
                                f"{WINDOW_MARGIN_TOKENS} ({opts.steps + WINDOW_MARGIN_TOKENS}) so that the profile "
                                "window closes while the requests still decode")
    elif opts.backend:
        raise ProfattrError("--backend applies to SGLang captures (--model); the workload takes --moe-impl")
    if opts.profiler in ("torch", "ncu") and opts.capture_range not in (None, "cudaProfilerApi"):
        raise ProfattrError(f"--capture-range {opts.capture_range} is an nsys setting; with --profiler torch each "
                            "window is SGLang's own /start_profile window")
    capture_range = opts.capture_range or "cudaProfilerApi"
    if capture_range not in CAPTURE_RANGES:
        raise ProfattrError(f"--capture-range {capture_range!r}: expected one of {', '.join(CAPTURE_RANGES)}")
    _check_windows(opts, target, capture_range)
    name = _default_name(opts, target)
    windows = windows_of(opts, name)
    ncu_tool = None
    if opts.profiler in ("torch", "ncu"):
        tool, nsys_path = None, None
        if opts.profiler == "ncu":
            try:
                ncu_tool = ncu.find_ncu(opts.ncu)
            except ProfattrError:
                if not opts.dry_run:
                    raise
    else:
        try:
            tool = nsys_tool.find_nsys(opts.nsys)
            nsys_path = tool.path
        except ProfattrError:
            if not opts.dry_run:
                raise
            tool, nsys_path = None, opts.nsys or "nsys"
    out_dir = opts.out_dir
    meta_path = out_dir / (name + SUFFIXES["workload"])
    if target == "sglang":
        target_cmd = sglang.server_command(sglang.launcher_command(opts.launcher), opts.model, opts.tp, backend,
                                           opts.host, opts.port, opts.args)
    elif target == "workload":
        target_cmd = _workload_command(opts, meta_path)
    else:
        target_cmd = list(opts.args)
    trace = opts.trace or nsys_tool.GPU_TRACE
    session = None
    if opts.profiler == "torch":
        profile_cmd = list(target_cmd)
    elif opts.profiler == "ncu":
        ncu_path = ncu_tool.path if ncu_tool else (opts.ncu or "ncu")
        profile_cmd = ncu.profile_command(ncu_path, out_dir / windows[0].name, target_cmd, opts.ncu_kernels,
                                          opts.ncu_launch_count, opts.ncu_launch_skip,
                                          kernel_base=opts.ncu_kernel_base)
    elif capture_range == "session":
        session = f"profattr-{name}"
        profile_cmd = nsys_tool.launch_command(nsys_path, session, target_cmd, trace=trace,
                                               cuda_graph_trace=opts.cuda_graph_trace, cpu_samples=opts.cpu_samples)
    else:
        output = out_dir / windows[0].name if len(windows) == 1 else out_dir / name
        profile_cmd = nsys_tool.profile_command(nsys_path, output, target_cmd, trace=trace,
                                                capture_range=capture_range, cuda_graph_trace=opts.cuda_graph_trace,
                                                repeat=len(windows) if capture_range != "none" else 1,
                                                nvtx_capture=opts.nvtx_capture, cpu_samples=opts.cpu_samples)
    return Plan(options=opts, target=target, name=name, nsys=tool, trace=trace, capture_range=capture_range,
                target_cmd=target_cmd, profile_cmd=profile_cmd, env={"PYTHONUNBUFFERED": "1"},
                backend_sglang=backend, windows=windows, session=session, ncu=ncu_tool)


def shell_join(cmd) -> str:
    """The argument list as one shell-quoted line."""
    return " ".join(shlex.quote(str(c)) for c in cmd)


def describe(p: Plan) -> str:
    """The dry-run text: every command line and request, in the order the capture would run them."""
    o = p.options
    lines = []
    if p.nsys is None and o.profiler == "nsys":
        lines.append(f"# nsys not found here; shown as {p.profile_cmd[0]!r} ({nsys_tool.HOW_TO_GET})")
    under = {"nsys": "under nsys", "torch": "without nsys (torch profiler)", "ncu": "under Nsight Compute"}[o.profiler]
    names = ", ".join(w.name for w in p.windows)
    lines += [f"# 1. {p.target} {under} (outputs in {o.out_dir}/: {names})", shell_join(p.profile_cmd)]
    step = 2
    if p.target == "sglang":
        client = sglang.Client(o.host, o.port)
        lines += [f"# {step}. wait until healthy (up to {o.health_timeout_s:.0f} s)", sglang.curl(client, "/health")]
        step += 1
        for batch in o.batch_list:
            body = sglang.Requests(o.prompts, o.input_len, o.max_new_tokens, o.prompt_seed).bodies(1)[0]
            lines += [f"# {step}. batch {batch}: warm-up, {o.warmup} round(s) of {batch} concurrent request(s); "
                      f"then {o.trials} unprofiled timing round(s) (ms/token from streamed token arrival times)",
                      sglang.curl(client, "/generate", body)]
            step += 1
            for w in (w for w in p.windows if w.batch == batch):
                lines.append(f"# {step}. window {w.name}: {window_how(p, w)}")
                if p.capture_range == "session":
                    lines.append(shell_join(nsys_tool.start_command(p.profile_cmd[0], p.session,
                                                                    p.nsys_output(w),
                                                                    cpu_samples=p.options.cpu_samples)))
                else:
                    lines.append(sglang.curl(client, "/start_profile", window_body(p, w)))
                lines.append(sglang.curl(client, "/generate", body))
                if p.capture_range == "session":
                    lines.append(shell_join(nsys_tool.stop_command(p.profile_cmd[0], p.session)))
                step += 1
        lines += [f"# {step}. stop the server (SIGINT, then SIGTERM, then SIGKILL)"]
        step += 1
    if o.profiler == "ncu":
        w = p.windows[0]
        lines += [f"# {step}. the counters as CSV", shell_join(ncu.export_command(p.profile_cmd[0],
                                                                                p.window_path(w, "ncu_report")))
                  + f" > {shlex.quote(str(p.window_path(w, 'ncu_csv')))}"]
        step += 1
    if o.profiler == "nsys":
        w = p.windows[0]
        report, sqlite = p.window_path(w, "report"), p.window_path(w, "sqlite")
        lines += [f"# {step}. export each window (where nsys left NAME.qdstrm instead: "
                  f"QdstrmImporter -i {p.window_path(w, 'qdstrm')} first)",
                  shell_join(nsys_tool.export_command(p.profile_cmd[0], report, sqlite))]
        step += 1
    lines += [f"# {step}. check each capture", shell_join(["profattr", "check", str(p.window_path(p.windows[0],
                                                                                                 "run"))])]
    return "\n".join(lines)


def window_how(p: Plan, w: Window) -> str:
    """One line: how this window is recorded."""
    o = p.options
    if o.profiler == "ncu":
        return (f"once the requests have decoded their first token, {o.steps} forward steps between SGLang's "
                f"cudaProfilerStart and Stop; ncu profiles {o.ncu_launch_count} launches of the chosen kernels")
    if o.profiler == "torch":
        return (f"SGLang's torch profiler for {o.steps} forward steps (CPU and GPU activities), trace "
                f"{w.name}-TP-<rank>.trace.json.gz")
    if p.capture_range == "session":
        return "nsys start, the window's requests, nsys stop (every process of the server recorded)"
    return f"{o.steps} forward steps between SGLang's cudaProfilerStart and Stop (base GPU's scheduler)"


def window_body(p: Plan, w: Window) -> dict:
    """The /start_profile request body of a window."""
    o = p.options
    if o.profiler == "torch":
        return sglang.torch_profile_body(o.steps, str(o.out_dir.resolve()), w.name, with_stack=o.torch_with_stack)
    return sglang.profile_body(o.steps)
