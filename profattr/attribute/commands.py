"""Click commands of the attribute stage: `budget` and `diff`."""
from __future__ import annotations

import click


STEPS_HELP = ("How to cut the capture into decode steps: auto (a repeating NVTX range that encloses the kernel "
              "launches, else CUDA graph launches, else whole), whole, graph (each cudaGraphLaunch), "
              "nvtx:NAME (ranges with that text; NAME@DOMAIN for a domain).")


def steps_option(f):
    return click.option("--steps", default="auto", show_default=True, help=STEPS_HELP)(f)


def rules_option(f):
    return click.option("--rules", "rules", multiple=True, type=click.Path(dir_okay=False),
                        help="Extra taxonomy rules (TOML); they take precedence over the shipped ones.")(f)


def format_option(choices=("table", "json", "csv", "markdown")):
    return click.option("--format", "fmt", type=click.Choice(choices), default="table", show_default=True)


@click.command()
@click.argument("capture", type=click.Path(dir_okay=False))
@steps_option
@rules_option
@format_option()
@click.option("--top", default=15, show_default=True, help="Kernels listed per GPU in table/markdown output.")
@click.option("--force", is_flag=True, help="Re-export a .nsys-rep even when an older .sqlite exists beside it.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def budget(capture, steps, rules, fmt, top, force, output):
    """Per decode step and per GPU: time per kernel category and kernel, idle time, and coverage.

    CAPTURE is an Nsight Systems SQLite export (or a .nsys-rep, exported beside it when nsys is available).
    """
    from profattr.attribute.budget import compute_budget
    from profattr.report import budget_view

    result = compute_budget(capture, steps=steps, rules=rules, force=force)
    data = result.to_dict()
    if fmt == "json":
        text = result.to_json()
    elif fmt == "csv":
        text = budget_view.render_csv(data)
    elif fmt == "markdown":
        text = budget_view.render_markdown(data, top=top)
    else:
        text = budget_view.render_table(data, top=top)
    _emit(text, output)


def _emit(text: str, output) -> None:
    if output:
        from pathlib import Path

        Path(output).write_text(text + ("" if text.endswith("\n") else "\n"))
    else:
        click.echo(text)


@click.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@steps_option
@rules_option
@format_option(("table", "json", "markdown"))
@click.option("--changed", help="Category family you changed between A and B (e.g. moe); warns when its kernels "
                                "are identical. Default: moe when the two run.json name different backends.")
@click.option("--samples", default=2000, show_default=True, help="Bootstrap samples for the 95% intervals.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def diff(a, b, steps, rules, fmt, changed, samples, output):
    """Attribute the step-time change from capture A to capture B.

    A and B are captures (.sqlite / .nsys-rep) or budget JSON files. Components (categories, idle, overlap)
    add up exactly to the change of the median step time.
    """
    import json

    from profattr.attribute.diff import compute_diff, load_side
    from profattr.report import diff_view

    result = compute_diff(load_side(a, steps, rules), load_side(b, steps, rules), samples=samples,
                          changed=changed)
    if fmt == "json":
        text = json.dumps(result, indent=2)
    elif fmt == "markdown":
        text = diff_view.render_markdown(result)
    else:
        text = diff_view.render_table(result)
    _emit(text, output)
