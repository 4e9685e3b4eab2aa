"""Click command `profattr drill-report`: why the drilled kernels are slow, from a drill's NAME.ncu.csv (no ncu
needed)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from profattr.attribute.commands import rules_option
from profattr.errors import ProfattrError
from profattr.outputs import check_output, emit, output_options
from profattr.run_record import or_empty
from profattr.text import clean_tree


def _capture_for(csv_path: Path, given):
    """(budget dict or None, capture run.json or None): --capture, else the export of the capture the drill's
    run.json names, when its .sqlite lies beside the CSV (a .nsys-rep is not exported for this)."""
    from profattr.attribute.budget import compute_budget
    from profattr.report.why_slow import drill_run_of

    if given is None:
        of = or_empty(drill_run_of(csv_path)).drill_of or ""
        sqlite = csv_path.with_name(of[: -len(".run.json")] + ".sqlite") if of.endswith(".run.json") else None
        from profattr.inputs import is_regular_file

        if sqlite is None or not is_regular_file(sqlite):
            return None, None
        given = sqlite
    given = Path(given)
    budget = compute_budget(given).to_dict()
    run_path = given.with_name(given.name.rsplit(".", 1)[0] + ".run.json")
    from profattr import run_record

    return budget, run_record.optional(run_path)


@click.command("drill-report")
@click.argument("csv_path", metavar="CAPTURE.ncu.csv", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capture", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The nsys capture the drill belongs to (its categories and ms per step). Default: the export "
                   "of the capture its run.json names, when NAME.sqlite lies beside the CSV.")
@rules_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@click.option("--accept-partial", is_flag=True,
              help="Exit 0 for a drill that did not finish (default: its kept launches are shown, then exit 2).")
@output_options()
def drill_report(csv_path, capture, rules, fmt, accept_partial, output, force):
    """Why the kernels of an Nsight Compute drill are slow: per launch and per kernel family (same kernel, grid and
    block) the grid against the GPU's SMs, DRAM and SM throughput, occupancy and a verdict (memory-bound near peak,
    compute-bound, too few CTAs for the GPU, latency-bound) with the numbers behind it; per category the DRAM
    bytes against the weights the category must read per step.

    CAPTURE.ncu.csv is what `profattr drill` writes (`ncu --import R --csv --page raw`); NAME.run.json beside it
    says what the drill asked for.
    """
    from profattr.attribute.selection import top_families
    from profattr.report import why_slow
    from profattr.trace.ncu_csv import NoKernelsError

    from profattr import inputs

    inputs.regular_file(csv_path, "an ncu raw CSV (NAME.ncu.csv, written by `profattr drill`)")
    given = [csv_path, capture, *rules]
    if output:
        check_output(output, force, given)
    budget, run = _capture_for(csv_path, capture)
    try:
        analysis = why_slow.analyse_csv(csv_path, budget, run, rules).to_dict()
    except NoKernelsError as exc:
        names = [n for f in top_families(budget, 4) for n in f.names] if budget else []
        if names and "top kernels" not in exc.format_message():
            raise ProfattrError(f"{exc.format_message()}; the capture's top kernels are {', '.join(names)}") from None
        raise
    analysis = clean_tree(analysis)
    if fmt == "json":
        text = json.dumps(analysis, indent=2)
    elif fmt == "markdown":
        text = "\n".join(why_slow.render_markdown(analysis, "##")).rstrip("\n")
    else:
        text = why_slow.render_table(analysis)
    emit(text, output, force, given)
    drill = analysis["drill"]
    if drill.get("complete") is False and not accept_partial:
        raise ProfattrError(f"{csv_path.name}: {drill['notes'][0]}; the report above covers those launches only "
                            "(--accept-partial to exit 0)")
