"""Click commands that show a capture rather than summarise it: `timeline` (a PNG of one step per GPU) and `export`
(the attributed steps as a Perfetto / Chrome trace)."""
from __future__ import annotations

from pathlib import Path

import click

from profattr.attribute.commands import cache_option, rules_option, steps_option
from profattr.errors import ProfattrError
from profattr.outputs import atomic_path, check_output

FORCE_HELP = "Replace the -o file when it exists."


def _budget(capture, steps, skip_steps, rules):
    from profattr.attribute.budget import compute_budget

    return compute_budget(capture, steps=steps, rules=rules, keep_attribution=True, skip_steps=skip_steps,
                          step_categories=False)


@click.command()
@click.argument("captures", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="step.png", show_default=True,
              help="The PNG to write (its folder is created; never an input).")
@click.option("--step", "step", default="median", show_default=True, metavar="median|N",
              help="The step to draw on each GPU: the one whose span is the median, or the step number N "
                   "(numbered as in the budget's per-step tables and the Perfetto export).")
@steps_option
@rules_option
@click.option("--force", is_flag=True, help=FORCE_HELP)
@cache_option
def timeline(captures, output, step, steps, skip_steps, rules, force):
    """Draw one decode step per GPU: its GPU ops by stream coloured by category, the idle gaps, the CUDA API calls
    and NVTX ranges of its CPU thread, and the step's budget beside it.

    With two CAPTURES, their steps are drawn one above the other on one time axis (ms from each step's start).
    """
    from profattr.report.timeline import capture_views, describe_view, write_timeline

    if len(captures) > 2:
        raise ProfattrError(f"timeline draws one or two captures (got {len(captures)}); give A, or A B")
    given = [*captures, *rules]
    check_output(output, force, given, "the timeline")
    groups, devices = [], []
    for capture in captures:
        budget = _budget(capture, steps, skip_steps, rules)
        groups.append((Path(capture).name, capture_views(budget, step)))
        devices += budget.to_dict()["devices"]
    labels = [g[0] for g in groups]
    if len(set(labels)) < len(labels):
        groups = [(f"{chr(ord('A') + k)}: {label}", views) for k, (label, views) in enumerate(groups)]
    with atomic_path(output, force, given, "the timeline") as tmp:
        write_timeline(groups, tmp, devices)
    for label, views in groups:
        for v in views:
            click.echo(describe_view(label, v))
    click.echo(f"wrote {click.format_filename(output)}")


@click.command()
@click.argument("capture", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(("perfetto",)), default="perfetto", show_default=True,
              help="perfetto: Chrome / Perfetto JSON trace events, for ui.perfetto.dev or chrome://tracing.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The trace file to write (its folder is created; never an input).")
@click.option("--step-range", "step_range", metavar="FIRST:LAST",
              help="Only these steps (numbers as in the budget's per-step tables, both included; 5: from step 5 "
                   "on). Default: every step.")
@steps_option
@rules_option
@click.option("--force", is_flag=True, help=FORCE_HELP)
@cache_option
def export(capture, fmt, output, step_range, steps, skip_steps, rules, force):
    """Write the attributed steps of CAPTURE as a trace to open in a trace viewer: per GPU a track per stream
    with each kernel's category, family, step and launch shape, a track per category, the idle gaps and the
    step boundaries; and per CPU thread its CUDA API calls and NVTX ranges during those steps."""
    from profattr.report.perfetto import parse_step_range, write_trace
    from profattr.trace.source import open_trace

    given = [capture, *rules]
    chosen = parse_step_range(step_range)
    check_output(output, force, given, "the trace")
    budget = _budget(capture, steps, skip_steps, rules)
    with open_trace(budget.path) as source:
        api = source.api_calls()  # the host tracks' CUDA calls
    with atomic_path(output, force, given, "the trace") as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            n = write_trace(budget, fh, chosen, api)
    click.echo(f"wrote {click.format_filename(output)}: {n} events ({fmt}); open it in ui.perfetto.dev")
