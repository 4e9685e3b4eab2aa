"""Click commands of the capture stage: `capture`, `check`, `doctor`. Each parses options, calls one library
function and renders its result."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from profattr.capture import plan as capture_plan
from profattr.capture import run as capture_run
from profattr.capture.sglang import backend_help
from profattr.check import FAIL, Finding, overall, render_table, to_json
from profattr.check.locate import locate
from profattr.check.run import check_capture
from profattr.outputs import check_output, emit, output_options
from profattr.text import clean_tree

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
@click.option("--capture-range", type=click.Choice(["cudaProfilerApi", "session", "nvtx", "none"]), default=None,
              help="cudaProfilerApi (default): record between cudaProfilerStart and Stop (SGLang: /start_profile, "
                   "base GPU only); session: profattr opens each window with nsys start/stop, every process "
                   "recorded (SGLang); nvtx: the NVTX range --nvtx-capture is the window; none: the whole run")
@click.option("--nvtx-capture", metavar="RANGE", help="with --capture-range nvtx: the NVTX range (RANGE or "
              "RANGE@DOMAIN) that opens a window")
@click.option("--profiler", type=click.Choice(["nsys", "torch"]), default="nsys", show_default=True,
              help="SGLang target: nsys, or SGLang's torch profiler (/start_profile CPU,GPU; writes "
                   "NAME-TP-<rank>.trace.json.gz, no nsys needed)")
@click.option("--torch-with-stack", is_flag=True, help="--profiler torch: record Python stacks (SGLang's own "
              "default; costs CPU time in every step)")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="replicate windows per batch size (SGLang: windows of one server, named NAME-rI; workload or "
                   "command: separate runs)")
@click.option("--cpu-samples", is_flag=True, help="nsys: also record CPU samples of the process tree with Python "
              "backtrace sampling (--sample=process-tree --python-sampling=true); the report then names the "
              "functions the step's CPU thread ran while the GPU idled")
@click.option("--cuda-graph-trace", type=click.Choice(["node", "graph"]), default="node", show_default=True,
              help="node: one row per replayed kernel (graph: replayed kernels are not recorded)")
@click.option("--model", metavar="PATH", help="SGLang target: model folder (or Hugging Face id) to serve")
@click.option("--server", "server_url", metavar="URL", help="profile the SGLang server already running at "
              "http://HOST:PORT instead of launching one (torch-profiler windows through its /start_profile; it "
              "must run on this host to write the traces into -o; it is left running)")
@click.option("--backend", help=backend_help() + " [default: auto]")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="tensor-parallel size (GPUs)")
@click.option("--host", default="127.0.0.1", show_default=True, help="SGLang server host")
@click.option("--port", type=click.IntRange(1, 65535), default=30000, show_default=True, help="SGLang server port")
@click.option("--launcher", envvar="PROFATTR_SGLANG_LAUNCHER", metavar="CMD",
              help="command that starts the server instead of `python -m sglang.launch_server` "
                   "(env PROFATTR_SGLANG_LAUNCHER)")
@click.option("--health-timeout", "health_timeout_s", type=click.FloatRange(min=0, min_open=True), default=600,
              show_default=True, help="seconds to wait for GET /health")
@click.option("--input-len", type=click.IntRange(min=1), default=64, show_default=True,
              help="prompt length in token ids")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="tokens decoded per request (at least --steps + 4)")
@click.option("--prompts", type=click.Choice(["random", "same"]), default="random", show_default=True,
              help="SGLang: random token ids, distinct per request and round (seeded), or one fixed prompt for all "
                   "(then a batch's sequences route to the same experts)")
@click.option("--prompt-seed", type=int, default=0, show_default=True, help="seed of --prompts random")
@click.option("--batch", "batch_spec", default="1", show_default=True, metavar="B[,B...]",
              help="concurrent requests (decode batch size); SGLang: a list (1,4,8) profiles one window per size "
                   "from one server, named NAME-bsB")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="warm-up rounds before timing")
@click.option("--trials", type=click.IntRange(min=1), default=5, show_default=True, help="unprofiled timing rounds")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="forward steps inside the profiled window")
@click.option("--workload", type=click.Choice(["moe-decode"]), help="built-in PyTorch MoE decode workload")
@click.option("--mode", type=click.Choice(["eager", "graph"]), default="eager", show_default=True,
              help="workload: eager launches or CUDA graph replay")
@click.option("--moe-impl", type=click.Choice(["loop", "grouped"]), default="grouped", show_default=True,
              help="workload: per-expert loop or grouped expert kernels")
@click.option("--graph-window", type=click.Choice(["after", "before"]), default="after", show_default=True,
              help="workload --mode graph: open the window after the graph capture, or before it")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="workload/command: stop it after this many seconds")
@click.option("--finish", "finish_dir", type=click.Path(exists=True, path_type=Path), metavar="DIR",
              help="finish a capture (NAME.qdstrm where nsys had no importer, or NAME.nsys-rep): import, export, "
                   "measure the profiled ms/token in the capture, check")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def capture(out_dir, name, force, dry_run, nsys_path, trace, capture_range, nvtx_capture, profiler, torch_with_stack,
            repeat, cpu_samples, cuda_graph_trace, model, server_url, backend, tp, host, port, launcher, health_timeout_s, input_len,
            max_new_tokens, prompts, prompt_seed, batch_spec, warmup, trials, steps, workload, mode, moe_impl, graph_window, timeout_s,
            finish_dir, args):
    """Record decode under Nsight Systems and export it: an SGLang server (--model), the built-in workload
    (--workload moe-decode), or any command after `--`.

    \b
    Arguments after `--` go to the SGLang server, to the workload, or are the command itself:
      profattr capture --model M --backend cutlass --tp 8 -- --load-format dummy
      profattr capture --workload moe-decode --mode graph --tp 2
      profattr capture --trace nvtx --capture-range none -- python -m profattr.workloads.cpu_smoke
      profattr capture --finish captures/     (after a capture that left NAME.qdstrm)
      profattr capture --server http://127.0.0.1:30000 --batch 1,4,8   (a server already running)
    Exit status: 0 captured, 1 `profattr check` found a failure, 2 bad input or a failed target, 130 interrupted.
    """
    if finish_dir is not None:
        run, code = capture_run.finish(finish_dir, name, nsys_path, force, _echo)
        _print_check(run)
        sys.exit(code)
    batches = _batches(batch_spec)
    opts = capture_plan.Options(
        out_dir=out_dir, name=name, force=force, dry_run=dry_run, nsys=nsys_path, trace=trace,
        capture_range=capture_range, cuda_graph_trace=cuda_graph_trace, args=tuple(args), model=model,
        backend=backend, tp=tp, host=host, port=port, launcher=launcher, health_timeout_s=health_timeout_s,
        input_len=input_len, max_new_tokens=max_new_tokens, prompts=prompts, prompt_seed=prompt_seed, batch=batches[0], warmup=warmup, trials=trials,
        steps=steps, workload=workload, mode=mode, moe_impl=moe_impl, graph_window=graph_window, timeout_s=timeout_s,
        batches=batches if len(batches) > 1 else (), repeat=repeat, nvtx_capture=nvtx_capture, profiler=profiler,
        torch_with_stack=torch_with_stack, cpu_samples=cpu_samples)
    if server_url is not None:
        _attach(opts, server_url)
    plans = capture_plan.plan_all(opts)
    if dry_run:
        click.echo("\n".join(capture_plan.describe(p) for p in plans))
        return
    code = 0
    for plan in plans:
        run, plan_code = capture_run.execute(plan, _echo)
        _print_check(run)
        code = max(code, plan_code)
    sys.exit(code)


def _attach(opts, server_url: str) -> None:
    """`capture --server URL`: the windows of a running server; exits."""
    from profattr.capture import attach
    from profattr.errors import ProfattrError

    o = opts
    given = [flag for flag, on in (("--model", o.model), ("--workload", o.workload), ("a command after `--`", o.args),
                                   ("--backend", o.backend), ("--launcher", o.launcher), ("--nsys", o.nsys),
                                   ("--trace", o.trace), ("--capture-range", o.capture_range),
                                   ("--cpu-samples", o.cpu_samples)) if on]
    if given:
        raise ProfattrError(f"--server profiles a running server with its own torch profiler; {given[0]} does not "
                            "apply (the server's model, backend and tp are what it was started with)")
    if o.dry_run:
        click.echo(attach.describe(o, server_url))
        sys.exit(0)
    run, code = attach.execute(o, server_url, _echo)
    _print_check(run)
    sys.exit(code)


def _batches(spec: str) -> tuple:
    from profattr.errors import ProfattrError

    try:
        values = tuple(int(x) for x in str(spec).split(",") if x.strip())
    except ValueError:
        raise ProfattrError(f"--batch {spec!r}: expected a batch size or a comma-separated list such as 1,4,8") \
            from None
    if not values:
        raise ProfattrError("--batch is empty; give a batch size such as 1 or a list such as 1,4,8")
    return values


def _print_check(run: dict) -> None:
    if run.get("check"):
        click.echo(render_table([Finding(**f) for f in run["check"]["findings"]]))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture_path", metavar="CAPTURE", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=FORMATS, default="table", show_default=True)
@click.option("--twin", type=click.Path(path_type=Path), metavar="CAPTURE",
              help="an eager or torch-profiler capture of the same decode: kernels per step must agree")
@output_options()
def check(capture_path, fmt, twin, output, force):
    """Is a capture trustworthy? Backend kernels present (and no other backend's), graph replays traced per node,
    every tensor-parallel device present, no first-call outliers in the window, profiler overhead, steps counted vs
    requested, NVTX recorded. CAPTURE is a capture folder, NAME.run.json, NAME.sqlite or NAME.nsys-rep.

    Exit status 1 when any check fails."""
    given = [capture_path, twin]
    if output:
        check_output(output, force, given)
    cap, findings = check_capture(capture_path, twin=twin)
    if fmt == "json":
        emit(json.dumps(clean_tree(to_json(findings, cap)), indent=2), output, force, given)
    else:
        emit(render_table(findings), output, force, given)
    sys.exit(1 if overall(findings) == FAIL else 0)


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
        click.echo(json.dumps({"schema": "profattr.doctor/1", "status": overall(findings),
                               "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        click.echo(render_table(findings))
    sys.exit(1 if overall(findings) == FAIL else 0)


def _or(value, default):
    """`value`, or `default` when the run did not record it (None)."""
    return default if value is None else value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("capture_path", metavar="CAPTURE", type=click.Path(path_type=Path))
@click.option("--top", type=click.IntRange(1, 20), default=4, show_default=True,
              help="kernel families of the decode step to profile, largest first")
@click.option("--kernels", metavar="REGEX", help="profile the kernels whose function name matches REGEX instead")
@click.option("--steps", "drill_steps", type=click.IntRange(1, 50), default=2, show_default=True,
              help="decode steps whose launches of the chosen kernels ncu profiles")
@click.option("--launch-count", "launch_count_opt", type=click.IntRange(1, 100000), help="launches to profile (default: the chosen "
              "kernels' launches per step in the capture, times --steps)")
@click.option("--kernel-base", type=click.Choice(["function", "demangled"]), default="function", show_default=True,
              help="what --kernels matches: the function name, or the whole demangled name (templates and all)")
@click.option("--eager", is_flag=True, help="run the server without CUDA graphs (--disable-cuda-graph) for the drill")
@click.option("--ncu", "ncu_path", metavar="PATH", help="ncu to use (else $PROFATTR_NCU, PATH, "
              "/opt/nvidia/nsight-compute/*/ncu, /usr/local/cuda*/bin/ncu)")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="folder for NAME.ncu-rep and NAME.ncu.csv (default: the capture's folder)")
@click.option("--name", help="drill name (default: CAPTURE's name + -drill)")
@click.option("--port", type=click.IntRange(1, 65535), help="server port (default: the capture's)")
@click.option("--health-timeout", "health_timeout_s", type=float, default=900, show_default=True,
              help="seconds to wait for the server under ncu (every launch is intercepted: start-up is slow)")
@click.option("--force", is_flag=True, help="replace an earlier drill of the same name")
@click.option("--dry-run", is_flag=True, help="print the kernels chosen and the commands; run nothing")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def drill(capture_path, top, kernels, drill_steps, launch_count_opt, kernel_base, eager, ncu_path, out_dir, name,
          port, health_timeout_s, force, dry_run, args):
    """Nsight Compute on the top kernels of a decode step: why they are slow, not only that they are.

    \b
    CAPTURE is an SGLang capture made by `profattr capture` (its run.json says how to start the same server and
    requests; server arguments after `--` replace the recorded ones). From its budget, the top kernel families are
    chosen; the same server runs under ncu, and once the window's requests have their first token, ncu profiles
    those kernels for --steps decode steps (SpeedOfLight, MemoryWorkloadAnalysis, LaunchStats, Occupancy).
    Writes NAME.ncu-rep and NAME.ncu.csv (`ncu --import --csv --page raw`, made where ncu runs).
    """
    from profattr.attribute.budget import compute_budget
    from profattr.attribute.selection import launch_count, top_families
    from profattr.capture import ncu as ncu_tool
    from profattr.errors import ProfattrError

    if not dry_run:
        ncu_tool.find_ncu(ncu_path)  # first: without ncu nothing below is worth computing
    cap = locate(capture_path)
    if cap.run is None or cap.run.target != "sglang":
        raise ProfattrError(f"{capture_path}: a drill re-runs an SGLang capture made by `profattr capture` "
                            "(its NAME.run.json says how); this capture has no SGLang run.json")
    if cap.sqlite is None and not (kernels and launch_count_opt):
        raise ProfattrError(f"{capture_path}: no export to choose kernels from; finish the capture first, or give "
                            "--kernels REGEX and --launch-count N")
    run = cap.run
    families = top_families(compute_budget(cap.sqlite).to_dict(), top) if cap.sqlite is not None else []
    if kernels:
        regex = kernels
        count = launch_count_opt or launch_count(families, drill_steps)
    else:
        regex = ncu_tool.kernel_regex([n for f in families for n in f.names])
        count = launch_count_opt or launch_count(families, drill_steps)
    server_args = list(args) if args else list(run.server_args)
    if eager and "--disable-cuda-graph" not in server_args:
        server_args.append("--disable-cuda-graph")
    base = cap.run_path.name[: -len(".run.json")]
    opts = capture_plan.Options(
        out_dir=out_dir or cap.run_path.parent, name=name or f"{base}-drill", force=force, dry_run=dry_run,
        args=tuple(server_args), model=run.model, backend=run.backend_requested,
        tp=run.tp or 1, port=port or _or(run.server_port, 30000),
        launcher=" ".join(run.server_launcher) or None,
        health_timeout_s=health_timeout_s, input_len=_or(run.input_len, 64),
        max_new_tokens=_or(run.max_new_tokens, 64), batch=_or(run.batch, 1), warmup=1, trials=1,
        steps=drill_steps, profiler="ncu", ncu=ncu_path, ncu_kernels=regex, ncu_launch_count=count,
        ncu_kernel_base=kernel_base)
    for f in families:
        _echo(f"chosen: {f.category} {f.family} {f.ms_per_step:.3f} ms/step ({f.share_of_step:.0%}): "
              f"{', '.join(f.names)}")
    plan = capture_plan.plan(opts)
    if dry_run:
        click.echo(capture_plan.describe(plan))
        return
    result, code = capture_run.execute(plan, _echo)
    result["drill"] = {"of": cap.run_path.name, "families": [f.__dict__ for f in families], "kernel_regex": regex,
                       "kernel_base": kernel_base,
                       "launch_count": count, "steps": drill_steps,
                       "graphs": "eager (--disable-cuda-graph)" if "--disable-cuda-graph" in server_args
                       else "CUDA graphs, kernels profiled as graph nodes (--graph-profiling node)"}
    from profattr.capture.outputs import write_run

    write_run(plan.window_path(plan.windows[0], "run"), result)
    sys.exit(code)
