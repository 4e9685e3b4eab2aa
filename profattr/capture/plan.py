"""Planning a capture: validate the options, pick the target, and build every command line (nsys profile around
the SGLang server, the built-in workload or any command), before anything runs. `describe` is the dry run.

Outputs of a capture named NAME in its folder: NAME.nsys-rep (or NAME.qdstrm where nsys has no importer),
NAME.sqlite, NAME.run.json, NAME.log (nsys and target output), NAME.workload.json (workload metadata).
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from profattr.capture import nsys as nsys_tool
from profattr.capture import sglang
from profattr.errors import ProfattrError

SCHEMA = "profattr.run/1"
SUFFIXES = {"report": ".nsys-rep", "qdstrm": ".qdstrm", "sqlite": ".sqlite", "run": ".run.json", "log": ".log",
            "workload": ".workload.json"}
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

    @property
    def base(self) -> Path:
        return self.options.out_dir / self.name

    def path(self, kind: str) -> Path:
        return self.options.out_dir / (self.name + SUFFIXES[kind])


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
        if "/" in opts.name or opts.name.startswith("."):
            raise ProfattrError(f"--name {opts.name!r} must be a plain file name (use -o for the folder)")
        return opts.name
    if target == "sglang":
        return f"sglang-{opts.backend or 'auto'}-tp{opts.tp}-bs{opts.batch}"
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


def plan(opts: Options) -> Plan:
    """Validate the options and build every command line; finds nsys (a dry run works without one)."""
    target = _target_of(opts)
    for flag, value in (("--tp", opts.tp), ("--batch", opts.batch), ("--steps", opts.steps),
                        ("--input-len", opts.input_len), ("--max-new-tokens", opts.max_new_tokens)):
        if value < 1:
            raise ProfattrError(f"{flag} must be at least 1 (got {value})")
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
    name = _default_name(opts, target)
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
    capture_range = opts.capture_range or "cudaProfilerApi"
    profile_cmd = nsys_tool.profile_command(nsys_path, out_dir / name, target_cmd, trace=trace,
                                            capture_range=capture_range, cuda_graph_trace=opts.cuda_graph_trace)
    return Plan(options=opts, target=target, name=name, nsys=tool, trace=trace, capture_range=capture_range,
                target_cmd=target_cmd, profile_cmd=profile_cmd, env={"PYTHONUNBUFFERED": "1"},
                backend_sglang=backend)


def shell_join(cmd) -> str:
    """The argument list as one shell-quoted line."""
    return " ".join(shlex.quote(str(c)) for c in cmd)


def describe(p: Plan) -> str:
    """The dry-run text: every command line and request, in the order the capture would run them."""
    o = p.options
    lines = []
    if p.nsys is None:
        lines.append(f"# nsys not found here; shown as {p.profile_cmd[0]!r} ({nsys_tool.HOW_TO_GET})")
    lines += [f"# 1. {p.target} under nsys (outputs in {o.out_dir}/, report {p.name}.nsys-rep)",
              shell_join(p.profile_cmd)]
    if p.target == "sglang":
        client = sglang.Client(o.host, o.port)
        body = sglang.generate_body(sglang.prompt_ids(o.input_len), o.max_new_tokens, stream=True)
        lines += [f"# 2. wait until healthy (up to {o.health_timeout_s:.0f} s)", sglang.curl(client, "/health"),
                  f"# 3. warm-up: {o.warmup} round(s) of {o.batch} concurrent request(s) with the window's shapes",
                  sglang.curl(client, "/generate", body),
                  f"# 4. unprofiled decode timing: {o.trials} round(s) of the same, ms/token from streamed "
                  "token arrival times",
                  f"# 5. open the window ({o.steps} forward steps), then decode {o.batch} request(s) inside it",
                  sglang.curl(client, "/start_profile", sglang.profile_body(o.steps)),
                  sglang.curl(client, "/generate", body),
                  "# 6. close the window if num_steps did not (answers 500 when already closed), stop the server "
                  "(SIGINT, then SIGTERM, then SIGKILL)",
                  f"curl -s -X POST {client.url('/stop_profile')}"]
        step = 7
    else:
        step = 2
    report, sqlite = p.path("report"), p.path("sqlite")
    lines += [f"# {step}. export (where nsys left {p.name}.qdstrm instead: "
              f"QdstrmImporter -i {p.path('qdstrm')} first)",
              shell_join(nsys_tool.export_command(p.profile_cmd[0], report, sqlite)),
              f"# {step + 1}. check the capture", shell_join(["profattr", "check", str(p.path("run"))])]
    return "\n".join(lines)
