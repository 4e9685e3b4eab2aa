"""Click command `profattr report`: the markdown bottleneck report, with PNG charts, for one capture or several."""
from __future__ import annotations

import fnmatch
import glob
import shlex
from pathlib import Path

import click

from profattr.attribute.commands import cache_option, rules_option, steps_option
from profattr.errors import ProfattrError
from profattr.report.campaign import CAMPAIGN_CHART
from profattr.report.write import CATEGORY_CHART, LAUNCH_CHART, REPORT_FILE, write_report
from profattr.report.write import check_target as _check_target


def _command_line(captures, output, steps, rules, hardware, labels, samples, changed, mappings=(),
                  ledger=None, drills=(), skip_steps=None) -> str:
    args = ["profattr", "report", *map(str, captures), "-o", str(output)]
    if ledger is not None:
        args += ["--ledger", str(ledger)]
    for m in mappings:
        args += ["--mapping", m]
    for d in drills:
        args += ["--drill", d]
    if steps != "auto":
        args += ["--steps", steps]
    if skip_steps is not None:
        args += ["--skip-steps", str(skip_steps)]
    for r in rules:
        args += ["--rules", str(r)]
    if hardware:
        args += ["--hardware", hardware]
    if labels:
        args += ["--labels", labels]
    if changed:
        args += ["--changed", changed]
    if samples is not None:
        args += ["--samples", str(samples)]
    return " ".join(shlex.quote(a) for a in args)


def _named_capture(target: str, captures) -> list:
    """The captures (as given) that `target` names: by path or file name, else the glob (a replicate group) that
    holds it."""
    match = [c for c in captures if target in (c, Path(c).name)]
    return match or [c for c in captures if glob.has_magic(c) and fnmatch.fnmatch(target, c)]


def _mapping_pairs(mappings, captures, option: str = "--mapping", other: str = "EAGER_CAPTURE") -> dict:
    """{capture as given: other capture} from CAPTURE=OTHER values (--mapping's eager capture, --graph-twin's
    graph-level twin); CAPTURE may be given by its file name, or as a member of a replicate glob."""
    out = {}
    for m in mappings:
        target, sep, eager = m.partition("=")
        match = _named_capture(target, captures) if sep and eager else []
        if len(match) != 1:
            raise ProfattrError(f"{option} {m!r}: expected CAPTURE={other} with CAPTURE one of the report's "
                                f"captures ({', '.join(Path(c).name for c in captures)})")
        out[match[0]] = eager
    return out


def _drill_items(drills, captures) -> list:
    """--drill values: CSV, or CAPTURE=CSV (CAPTURE one of the report's captures by path or file name, or a member
    of a glob given as a replicate group: the drill goes with that group)."""
    items = []
    for d in drills:
        target, sep, csv_path = d.partition("=")
        if not (sep and csv_path):
            items.append(d)
            continue
        match = _named_capture(target, captures)
        if len(match) != 1:
            raise ProfattrError(f"--drill {d!r}: {target} is {'none' if not match else 'more than one'} of the "
                                f"report's captures ({', '.join(Path(c).name for c in captures)}); give "
                                "CAPTURE=DRILL.ncu.csv with CAPTURE as given, or the CSV alone")
        items.append((match[0], csv_path))
    return items


@click.command()
@click.argument("captures", nargs=-1, type=click.Path())
@click.option("-o", "--output", "output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write report.md, details.md and the PNG charts into (created when missing).")
@steps_option
@rules_option
@click.option("--hardware", "-H", default=None,
              help="GPU preset for the gap to the hardware limit (default: matched from the capture's GPU name).")
@click.option("--labels", default=None, help="Comma-separated names of the captures, in order (default: their "
                                             "names without the words they share). With --ledger and no CAPTURES: "
                                             "the ledger entries to show (numbers or labels), in order.")
@click.option("--changed", default=None, help="Category family changed between the captures (e.g. moe), for the "
                                              "diff's same-kernel warning. Default: as `profattr diff` decides.")
@click.option("--samples", default=None, type=click.IntRange(min=1),
              help="Bootstrap samples for the diffs' 95% intervals.  [default: 2000]")
@click.option("--mapping", "mappings", multiple=True, metavar="CAPTURE=EAGER",
              help="Lend NVTX context (layers, context rules) to CAPTURE's replayed graph kernels from EAGER, an eager "
                   "capture of the same workload (as `profattr budget --mapping`). Repeatable.")
@click.option("--graph-twin", "graph_twins", multiple=True, metavar="CAPTURE=TWIN",
              help="Set CAPTURE's graph launches (traced per node) against TWIN, the same decode captured with "
                   "`--cuda-graph-trace graph`: what per-node tracing adds to each launch, and whether the GPU's wait "
                   "before replays is the decode's. Repeatable.")
@click.option("--ledger", "ledger_path", default=None, type=click.Path(dir_okay=False), metavar="PATH",
              help="Add a Campaign section: ms/step of every experiment of this ledger (`profattr ledger`), stacked "
                   "by category. Without CAPTURES the report is that section alone.")
@click.option("--drill", "drills", multiple=True, metavar="[CAPTURE=]CSV",
              help="An ncu drill (NAME.ncu.csv from `profattr drill`) for the section \"Why the top kernels are "
                   "slow\", beyond the NAME-drill*.ncu.csv found beside each capture. Repeatable.")
@click.option("--layers", is_flag=True,
              help="Break every capture's step down by model layer (NVTX layer ranges, e.g. SGLang's "
                   "--enable-layerwise-nvtx-marker); captures given a --mapping always are.")
@click.option("--to", "to", default=None,
              help="Target GPU preset: add an 'On the target' section projecting the first capture there.")
@click.option("--to-tp", type=click.IntRange(min=1), default=None, help="Tensor-parallel size on the target (--to).")
@click.option("--to-layers", type=click.IntRange(min=1), default=None, help="Layers of the real model (--to).")
@click.option("--force", is_flag=True, help="Overwrite an existing report (report.md, details.md and charts) in the folder.")
@cache_option
def report(captures, output, steps, skip_steps, rules, hardware, labels, changed, samples, mappings, layers, to, to_tp,
           to_layers, force, ledger_path, drills, graph_twins):
    """Write the bottleneck report of CAPTURES to OUTPUT/report.md, with PNG charts and OUTPUT/details.md (how to
    reproduce it: run facts, versions, checks, gap tables).

    CAPTURES are Nsight Systems SQLite exports, .nsys-rep reports or torch-profiler traces; the first is the
    baseline every other capture is compared with (where batch sizes differ, the first of the same batch; a batch
    sweep table compares the rest). NAME.run.json beside a capture (written by `profattr capture`) adds commands,
    versions, lint findings, what else differs between runs, and the gap to the hardware limit (from the served
    model's recorded config.json or the built-in workload). Nsight Compute drills of a capture
    (NAME-drill*.ncu.csv beside it, or --drill) add why its top kernels are slow.
    """
    from profattr.attribute.diff import BOOTSTRAP_SAMPLES
    from profattr.report.collect import collect_report

    if not captures and ledger_path is None:
        raise ProfattrError("give one or more CAPTURES, or --ledger PATH for the campaign report of a ledger")
    # fail before the slow part (gap charts, named after captures, are checked when known)
    given = [*captures, ledger_path, *rules, *(m.partition("=")[2] for m in mappings),
             *(d.partition("=")[2] or d for d in drills), *(t.partition("=")[2] for t in graph_twins)]
    if output.exists() and not output.is_dir():
        raise ProfattrError(f"{output} exists and is not a folder; give -o a folder for report.md and its charts")
    names = (REPORT_FILE, CATEGORY_CHART, LAUNCH_CHART) if captures else (REPORT_FILE,)
    for name in names + ((CAMPAIGN_CHART,) if ledger_path is not None else ()):
        _check_target(output / name, output, force, given)
    label_list = [x.strip() for x in labels.split(",")] if labels else None
    if label_list is not None and not all(label_list):
        raise ProfattrError(f"--labels {labels!r}: a label is empty; give one non-empty name per capture")
    campaign = None
    if ledger_path is not None:
        campaign = _campaign(ledger_path, [] if captures else (label_list or []))
    if not captures:
        from profattr.report.campaign import write_campaign_report

        command = _command_line(captures, output, steps, rules, hardware, labels, samples, changed, mappings,
                                ledger_path)
        written = write_campaign_report(campaign, ledger_path, output, command, force=force)
        click.echo(f"wrote {written[0]} and {len(written) - 1} chart(s)")
        return
    data = collect_report(list(captures), labels=label_list, steps=steps, skip_steps=skip_steps, rules=rules,
                          hardware=hardware,
                          samples=BOOTSTRAP_SAMPLES if samples is None else samples, changed=changed,
                          mappings=_mapping_pairs(mappings, captures), drills=_drill_items(drills, captures),
                          layers=layers,
                          graph_twins=_mapping_pairs(graph_twins, captures, "--graph-twin", "TWIN"),
                          project_to={"to": to, "tp": to_tp, "layers": to_layers} if to else None)
    data.command = (_command_line(captures, output, steps, rules, hardware, labels, samples, changed, mappings,
                                  ledger_path, drills, skip_steps) + (" --layers" if layers else "")
                    + "".join(f" --graph-twin {shlex.quote(t)}" for t in graph_twins))
    data.campaign, data.campaign_ledger = campaign, ledger_path
    if to:
        data.command += f" --to {shlex.quote(to)}" + (f" --to-tp {to_tp}" if to_tp else "") + (
            f" --to-layers {to_layers}" if to_layers else "")
    written = write_report(data, output, force=force)
    click.echo(f"wrote {written[0]}, {written[1].name} and {len(written) - 2} chart(s)")


def _campaign(ledger_path, refs) -> list:
    """The ledger's entries for the Campaign section (all, or those named by `refs`), as plain structures."""
    from profattr.ledger.query import campaign
    from profattr.ledger.schema import open_ledger, sqlite_errors

    db = open_ledger(ledger_path)
    try:
        with sqlite_errors(ledger_path):
            return campaign(db, refs, ledger_path)
    finally:
        db.close()
