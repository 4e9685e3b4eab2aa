"""Click commands of the capture stage: `capture`, `check`, `doctor`. Each parses options, calls one library
function and renders its result."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from profattr.capture import lint
from profattr.capture import plan as capture_plan
from profattr.capture import run as capture_run
from profattr.capture.sglang import backend_help

FORMATS = click.Choice(["table", "json"])


def _echo(message: str) -> None:
    click.echo(f"capture: {message}", err=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default="captures",
              show_default=True, help="folder for NAME.nsys-rep, NAME.sqlite, NAME.run.json and NAME.log")
@click.option("--name", help="capture name (default from the target: sglang-BACKEND-tpN-bsB, moe-decode-..., or the "
              "command's program name)")
@click.option("--force", is_flag=True, help="replace an earlier capture of the same name")
@click.option("--dry-run", is_flag=True, help="print the exact command lines and requests; run nothing")
@click.option("--nsys", "nsys_path", metavar="PATH", help="nsys to use (else $PROFATTR_NSYS, PATH, /usr/local/cuda*/bin, "
              "/opt/nvidia/nsight-systems/*/bin, then the scripts/install-nsys cache)")
@click.option("--trace", help="nsys --trace value (default cuda,nvtx; a CPU-only command: nvtx,osrt)")
@click.option("--capture-range", type=click.Choice(["cudaProfilerApi", "none"]), default=None,
              help="cudaProfilerApi (default): record only between cudaProfilerStart and Stop; none: the whole run")
@click.option("--cuda-graph-trace", type=click.Choice(["node", "graph"]), default="node", show_default=True,
              help="node: one row per replayed kernel (graph: replayed kernels are not recorded)")
@click.option("--model", metavar="PATH", help="SGLang target: model folder (or Hugging Face id) to serve")
@click.option("--backend", help=backend_help() + " [default: auto]")
@click.option("--tp", type=int, default=1, show_default=True, help="tensor-parallel size (GPUs)")
@click.option("--host", default="127.0.0.1", show_default=True, help="SGLang server host")
@click.option("--port", type=int, default=30000, show_default=True, help="SGLang server port")
@click.option("--launcher", envvar="PROFATTR_SGLANG_LAUNCHER", metavar="CMD",
              help="command that starts the server instead of `python -m sglang.launch_server` "
                   "(env PROFATTR_SGLANG_LAUNCHER)")
@click.option("--health-timeout", "health_timeout_s", type=float, default=600, show_default=True,
              help="seconds to wait for GET /health")
@click.option("--input-len", type=int, default=64, show_default=True, help="prompt length in token ids")
@click.option("--max-new-tokens", type=int, default=64, show_default=True,
              help="tokens decoded per request (at least --steps + 4)")
@click.option("--batch", type=int, default=1, show_default=True, help="concurrent requests (decode batch size)")
@click.option("--warmup", type=int, default=3, show_default=True, help="warm-up rounds before timing")
@click.option("--trials", type=int, default=5, show_default=True, help="unprofiled timing rounds")
@click.option("--steps", type=int, default=20, show_default=True, help="forward steps inside the profiled window")
@click.option("--workload", type=click.Choice(["moe-decode"]), help="built-in PyTorch MoE decode workload")
@click.option("--mode", type=click.Choice(["eager", "graph"]), default="eager", show_default=True,
              help="workload: eager launches or CUDA graph replay")
@click.option("--moe-impl", type=click.Choice(["loop", "grouped"]), default="grouped", show_default=True,
              help="workload: per-expert loop or grouped expert kernels")
@click.option("--graph-window", type=click.Choice(["after", "before"]), default="after", show_default=True,
              help="workload --mode graph: open the window after the graph capture, or before it")
@click.option("--timeout", "timeout_s", type=float, default=None, help="workload/command: stop it after this many seconds")
@click.option("--finish", "finish_dir", type=click.Path(exists=True, path_type=Path), metavar="DIR",
              help="finish a capture (NAME.qdstrm where nsys had no importer, or NAME.nsys-rep): import, export, "
                   "measure the profiled ms/token in the capture, check")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def capture(out_dir, name, force, dry_run, nsys_path, trace, capture_range, cuda_graph_trace, model, backend, tp,
            host, port, launcher, health_timeout_s, input_len, max_new_tokens, batch, warmup, trials, steps,
            workload, mode, moe_impl, graph_window, timeout_s, finish_dir, args):
    """Record decode under Nsight Systems and export it: an SGLang server (--model), the built-in workload
    (--workload moe-decode), or any command after `--`.

    \b
    Arguments after `--` go to the SGLang server, to the workload, or are the command itself:
      profattr capture --model M --backend cutlass --tp 8 -- --load-format dummy
      profattr capture --workload moe-decode --mode graph --tp 2
      profattr capture --trace nvtx --capture-range none -- python -m profattr.workloads.cpu_smoke
      profattr capture --finish captures/     (after a capture that left NAME.qdstrm)
    Exit status: 0 captured, 1 `profattr check` found a failure, 2 bad input or a failed target, 130 interrupted.
    """
    if finish_dir is not None:
        run, code = capture_run.finish(finish_dir, name, nsys_path, force, _echo)
        _print_check(run)
        sys.exit(code)
    opts = capture_plan.Options(
        out_dir=out_dir, name=name, force=force, dry_run=dry_run, nsys=nsys_path, trace=trace,
        capture_range=capture_range, cuda_graph_trace=cuda_graph_trace, args=tuple(args), model=model,
        backend=backend, tp=tp, host=host, port=port, launcher=launcher, health_timeout_s=health_timeout_s,
        input_len=input_len, max_new_tokens=max_new_tokens, batch=batch, warmup=warmup, trials=trials, steps=steps,
        workload=workload, mode=mode, moe_impl=moe_impl, graph_window=graph_window, timeout_s=timeout_s)
    plan = capture_plan.plan(opts)
    if dry_run:
        click.echo(capture_plan.describe(plan))
        return
    run, code = capture_run.execute(plan, _echo)
    _print_check(run)
    sys.exit(code)


def _print_check(run: dict) -> None:
    if run.get("check"):
        click.echo(lint.render_table([lint.Finding(**f) for f in run["check"]["findings"]]))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture_path", metavar="CAPTURE", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def check(capture_path, fmt):
    """Is a capture trustworthy? Backend kernels present (and no other backend's), graph replays traced per node,
    every tensor-parallel device present, no first-call outliers in the window, profiler overhead, steps counted vs
    requested, NVTX recorded. CAPTURE is a capture folder, NAME.run.json, NAME.sqlite or NAME.nsys-rep.

    Exit status 1 when any check fails."""
    cap, findings = lint.check_capture(capture_path)
    if fmt == "json":
        click.echo(json.dumps(lint.to_json(findings, cap), indent=2))
    else:
        click.echo(lint.render_table(findings))
    sys.exit(1 if lint.overall(findings) == lint.FAIL else 0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nsys", "nsys_path", metavar="PATH", help="nsys to check (else found as `capture` finds it)")
@click.option("--skip-capture", is_flag=True, help="skip the few-second real capture of cpu_smoke")
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
def doctor(nsys_path, skip_capture, fmt):
    """Can this machine capture? nsys and its version, the .qdstrm importer, a real capture of cpu_smoke with its
    NVTX ranges counted, GPUs, and torch / sglang / flashinfer / triton; for each missing piece, how to get it.

    Exit status 1 when a required piece fails."""
    from profattr.capture.doctor import run_doctor

    findings = run_doctor(nsys_path, capture=not skip_capture)
    if fmt == "json":
        click.echo(json.dumps({"schema": "profattr.doctor/1", "status": lint.overall(findings),
                               "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        click.echo(lint.render_table(findings))
    sys.exit(1 if lint.overall(findings) == lint.FAIL else 0)
