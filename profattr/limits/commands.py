"""Click commands `profattr limit` and `profattr gap`: parse options, call one library function, render."""
from __future__ import annotations

import json
from pathlib import Path

import click

from profattr.errors import ProfattrError
from profattr.limits.model import DEFAULT_CONTEXT_LEN
from profattr.outputs import atomic_path, check_output, emit, output_options
from profattr.text import clean_tree


def say_warnings(spec) -> None:
    """The model spec's warnings (an ignore pattern that matches nothing), one `warning:` line each on stderr."""
    for text in spec.warnings:
        click.echo(f"warning: {text}", err=True)


@click.command("limit")
@click.option("--model", "-m", "model", required=True,
              help="Model preset (e.g. glm-5-nvfp4) or a Hugging Face config.json path.")
@click.option("--quant", default=None,
              help="Quantization scheme: nvfp4 (routed experts NVFP4, rest BF16), nvfp4-ffn, nvfp4-modelopt, "
                   "nvfp4-fp8, nvfp4-all, fp8, bf16. Default: a config.json's own quantization_config (required "
                   "without one); overrides it, and a preset's.")
@click.option("--hardware", "-H", "hardware", required=True, help="GPU preset, e.g. rtx-pro-6000-ws, h200, b200.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel size (GPUs).")
@click.option("--context", "context_len", type=click.IntRange(min=1), default=DEFAULT_CONTEXT_LEN, show_default=True,
              help="Tokens in the KV cache when the token is decoded.")
@click.option("--allreduce", type=click.Choice(["oneshot", "nccl"]), default="oneshot", show_default=True,
              help="All-reduce implementation for the realistic floor.")
@click.option("--launch", type=click.Choice(["graph", "eager"]), default="graph", show_default=True,
              help="CUDA-graph replay or eager launches for the realistic floor.")
@click.option("--kernels", type=click.IntRange(min=0), default=None,
              help="Kernels per decode step (default: preset or estimate).")
@click.option("--dsa/--no-dsa", "dsa_runs", default=None,
              help="Whether the DSA indexer runs (default: as the engine does on this hardware).")
@click.option("--kv-dtype", type=click.Choice(["bf16", "fp8"]), default=None,
              help="KV cache dtype (default: the config.json quantization_config's KV cache dtype, else bf16).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@output_options()
def limit(model, quant, hardware, tp, context_len, allreduce, launch, kernels, dsa_runs, kv_dtype, fmt, output, force):
    """The decode floor of MODEL on HARDWARE: weights-only and realistic, with their assumptions.

    The weights-only floor reads every active weight once, split evenly over the GPUs, at peak bandwidth.
    The realistic floor adds engine sharding (replicated weights), the KV cache, achievable bandwidth,
    small-message all-reduces and kernel launches. A sensitivity table shows what each assumption is worth.
    """
    from profattr.limits.floor import compute_limit
    from profattr.limits.hardware import load_hardware
    from profattr.limits.model import load_model
    from profattr.limits.render import render_limit_table

    given = [model]
    if output:
        check_output(output, force, given)
    hw = load_hardware(hardware)
    spec = load_model(model, tp=tp, quant=quant, context_len=context_len,
                      dsa_runs=hw.dsa_runs if dsa_runs is None else dsa_runs, kv_dtype=kv_dtype)
    if kernels is not None and kernels < 0:
        raise ProfattrError(f"--kernels must be 0 or more (got {kernels})")
    say_warnings(spec)
    result = compute_limit(spec, hw, allreduce=allreduce, launch=launch, kernels=kernels)
    text = json.dumps(clean_tree(result), indent=2) if fmt == "json" else render_limit_table(clean_tree(result))
    emit(text.rstrip("\n"), output, force, given)


@click.command("gap")
@click.argument("capture", type=click.Path(path_type=Path))
@click.option("--model", "-m", "model", default=None,
              help="Model preset or config.json (default: the workload recorded in NAME.run.json).")
@click.option("--quant", default=None,
              help="Quantization scheme (see `profattr limit`); default: the quantization_config of the config.json "
                   "the capture's run.json recorded (or --model's).")
@click.option("--hardware", "-H", "hardware", default=None,
              help="GPU preset (default: matched from the capture's GPU name).")
@click.option("--tp", type=click.IntRange(min=1), default=None,
              help="Tensor-parallel size (default: run.json, else GPU count).")
@click.option("--context", "context_len", type=click.IntRange(min=1), default=None,
              help=f"Tokens in the KV cache (default: run.json, else {DEFAULT_CONTEXT_LEN}).")
@click.option("--run-json", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Run metadata to take the workload from (default: NAME.run.json beside the capture).")
@click.option("--kv-dtype", type=click.Choice(["bf16", "fp8"]), default=None,
              help="KV cache dtype (default: the server's --kv-cache-dtype in run.json, else bf16).")
@click.option("--steps", default="auto", show_default=True, help="Step definition passed to the budget.")
@click.option("--rules", multiple=True, type=click.Path(dir_okay=False), help="Extra taxonomy rule files.")
@click.option("--bandwidth", type=click.Choice(["peak", "achievable"]), default="peak", show_default=True,
              help="Compare against peak or achievable memory bandwidth.")
@click.option("--chart", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG waterfall chart here.")
@click.option("--force", is_flag=True, help="Replace the chart and the -o file when they exist.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@output_options(force=False)
def gap(capture, model, quant, hardware, tp, context_len, run_json, kv_dtype, steps, rules, bandwidth, chart, force,
        fmt, output):
    """How far CAPTURE is from the hardware limit, per category, as a waterfall from floor to measured step."""
    from profattr.limits.render import render_gap_markdown, render_gap_table

    given = [capture, run_json, model, *rules]
    if chart is not None:
        check_output(chart, force, given, "the chart")
    if output:
        check_output(output, force, given)
    if chart is not None and output and str(chart) == str(output):
        raise ProfattrError(f"--chart and -o name the same file {chart}; give two files")
    from profattr.limits.capture_gap import capture_gap

    result = capture_gap(capture, model=model, quant=quant, hardware=hardware, tp=tp, context_len=context_len,
                         run_json=run_json, kv_dtype=kv_dtype, steps=steps, rules=rules, bandwidth=bandwidth)
    if chart is not None:
        from profattr.limits.chart import write_gap_chart

        with atomic_path(chart, force, given, "the chart") as tmp:
            write_gap_chart(result, tmp)
    if fmt == "json":
        text = json.dumps(clean_tree(result), indent=2)
    elif fmt == "markdown":
        text = render_gap_markdown(result)
    else:
        text = render_gap_table(clean_tree(result))
    emit(text.rstrip("\n"), output, force, given)
