"""Click commands of the attribute stage: `budget` and `diff`."""
from __future__ import annotations

import click

from profattr.outputs import check_output, emit, output_options


STEPS_HELP = ("How to cut the capture into decode steps: auto (SGLang's decode spans step[DECODE bs=N], torch's "
              "ProfilerStep#N, a repeating NVTX range whose instances enclose the launches alike, CUDA graph "
              "launches, else whole), whole, graph (each cudaGraphLaunch), nvtx:NAME (ranges with that text; "
              "NAME@DOMAIN for a domain), nvtx-re:REGEX (ranges whose text matches).")


def steps_option(f):
    f = click.option("--skip-steps", "skip_steps", default=None, metavar="N|auto",
                     help="leave out the first N steps of each thread, or `auto` the slow start (warm-up) the "
                          "steady-state check finds; the output says what it left out")(f)
    return click.option("--steps", default="auto", show_default=True, help=STEPS_HELP)(f)


def _no_cache(ctx, param, value):
    if value:  # an environment variable, so that diff's worker processes see it too
        import os

        os.environ["PROFATTR_NO_CACHE"] = "1"
    return value


def cache_option(f):
    return click.option("--no-cache", "no_cache", is_flag=True, expose_value=False, callback=_no_cache,
                        help="Read the capture from SQLite without the budget cache (also PROFATTR_NO_CACHE=1). The "
                             "cache (PROFATTR_CACHE or XDG_CACHE_HOME/profattr) keeps each capture's op arrays, so "
                             "repeated budgets, diffs and reports skip the SQLite read.")(f)


def rules_option(f):
    return click.option("--rules", "rules", multiple=True, type=click.Path(dir_okay=False),
                        help="Extra taxonomy rules (TOML); they take precedence over the shipped ones.")(f)


LAYER_RANGE_HELP = ("Regex for NVTX ranges that are layers (implies --by layer); the label is its group `layer`, "
                    "else its first group, else the range text. Default: layers.N, layers_N, layer_N and SGLang's "
                    "layerwise markers.")
MAPPING_HELP = ("Eager capture of the same workload (same NVTX ranges): replayed CUDA-graph kernels whose graph was "
                "captured outside the profiled window take the layer and NVTX context of the kernel at the same "
                "position of the same step there.")


def format_option(choices=("table", "json", "csv", "markdown")):
    return click.option("--format", "fmt", type=click.Choice(choices), default="table", show_default=True)


@click.command()
@click.argument("capture", type=click.Path())
@steps_option
@rules_option
@format_option()
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1),
              help="Kernels listed per GPU in table/markdown output.")
@click.option("--by", "by", type=click.Choice(("category", "layer")), default="category", show_default=True,
              help="layer: also break each GPU's step down by model layer (read from NVTX).")
@click.option("--layer-range", "layer_range", metavar="REGEX", help=LAYER_RANGE_HELP)
@click.option("--mapping", type=click.Path(dir_okay=False), metavar="CAPTURE", help=MAPPING_HELP)
@click.option("--force", is_flag=True, help="Replace the -o file when it exists, and re-export a .nsys-rep even when "
                                           "an older .sqlite exists beside it.")
@output_options(force=False)
@cache_option
def budget(capture, steps, skip_steps, rules, fmt, top, by, layer_range, mapping, force, output):
    """Per decode step and per GPU: time per kernel category and kernel, idle time, and coverage.

    CAPTURE is an Nsight Systems SQLite export (or a .nsys-rep, exported beside it when nsys is available).
    Each category's exclusive time (the busy time, each moment shared equally among the categories running then)
    and idle add up to the mean step, so the shares add up to 100%; its overlapped time is the rest of its op time.
    With several GPUs running collectives, each GPU's collective time is split into transfer and wait.
    """
    from profattr.attribute.result_cache import budget_result

    import json

    given = [capture, mapping, *rules]
    if output:
        check_output(output, force, given)  # before the slow part
    data = budget_result(capture, steps=steps, rules=rules, force=force, mapping=mapping,
                         by="layer" if layer_range is not None else by, layer_range=layer_range,
                         skip_steps=skip_steps)  # from the result cache when this budget was computed before
    from profattr.report import budget_view

    if fmt == "json":  # a machine format: names exactly as captured, control characters escaped by JSON
        text = json.dumps(data, indent=2)
    elif fmt == "csv":
        text = budget_view.render_csv(data)
    elif fmt == "markdown":
        text = budget_view.render_markdown(data, top=top)
    else:
        text = budget_view.render_table(data, top=top)
    emit(text, output, force, given, exact=fmt == "csv")


class GroupsCommand(click.Command):
    """`diff A1 A2 -- B1 B2`: what follows `--` is the second group (Click would otherwise drop the `--`)."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            group_b, options = self._split_options(args[i + 1:])
            ctx.meta["profattr_group_b"] = group_b
            args = args[:i] + options
        return super().parse_args(ctx, args)

    def _split_options(self, tail: list) -> tuple:
        """The captures after `--`, and this command's options written among them (`-- B1 B2 --fail-on 5%`), which
        go back to the options. A name that is not one of its options stays a capture."""
        takes = {}
        for param in self.params:
            if isinstance(param, click.Option):
                for name in param.opts + param.secondary_opts:
                    takes[name] = not (param.is_flag or param.count)
        captures, options = [], []
        k = 0
        while k < len(tail):
            item = tail[k]
            name = item.split("=", 1)[0]
            if name in takes:
                options.append(item)
                if takes[name] and "=" not in item and k + 1 < len(tail):
                    options.append(tail[k + 1])
                    k += 1
            else:
                captures.append(item)
            k += 1
        return captures, options


@click.command(cls=GroupsCommand)
@click.argument("captures", nargs=-1, required=True)
@steps_option
@rules_option
@format_option(("table", "json", "markdown"))
@click.option("--changed", help="Category family you changed between A and B (e.g. moe); warns when its kernels "
                                "are identical. Default: moe when the two run.json name different backends.")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(min=1),
              help="Bootstrap samples for the 95% intervals.")
@click.option("--mapping-a", type=click.Path(dir_okay=False), metavar="CAPTURE",
              help="--mapping for A. " + MAPPING_HELP)
@click.option("--mapping-b", type=click.Path(dir_okay=False), metavar="CAPTURE", help="--mapping for B.")
@click.option("--by", "by", type=click.Choice(("category", "layer")), default="category", show_default=True,
              help="layer: also list the change per model layer (read from NVTX).")
@click.option("--layer-range", "layer_range", metavar="REGEX", help=LAYER_RANGE_HELP)
@click.option("--fail-on", "fail_on", multiple=True, metavar="PCT%|COMPONENT=MS",
              help="Regression gate (repeatable): exit 1 when the step got slower by more than PCT% of A's step "
                   "(--fail-on 5%), or COMPONENT (category:<id>, idle, step, ...) by more than MS ms/step "
                   "(--fail-on category:gemm.fp8=0.05), with its 95% interval above 0, in a valid comparison "
                   "(enough windows per side, no confound); one line on stderr says which.")
@click.option("--min-windows", "min_windows", default=3, show_default=True, type=click.IntRange(min=1),
              help="Windows (captures) per side below which no change is established: the verdict is `within "
                   "noise` and the gate does not fail. Fewer than 3 leave window-to-window variance out of the "
                   "intervals; lowering it is your call, and the output says so.")
@output_options()
@cache_option
def diff(captures, steps, skip_steps, rules, fmt, changed, samples, mapping_a, mapping_b, by, layer_range, fail_on,
         min_windows, output, force):
    """Attribute the step-time change from capture A to capture B: `diff A B`, or from one group of replicate
    captures to another: `diff A1 A2 -- B1 B2` (or `diff 'a-r*.sqlite' 'b-r*.sqlite'`, glob patterns quoted).

    Captures are .sqlite / .nsys-rep / torch-profiler traces, or budget JSON files. Components (each category's
    exclusive time, split by kernel family, idle) add up exactly to the change of the median step time; a
    category's change of overlapped time (run alongside other categories) is shown as its contention; with several
    GPUs running
    collectives, the time spent waiting for the slowest rank is its own component (comm_wait). A component is
    called a change only when its 95% interval (over servers, windows and steps) excludes 0 and it is at least 1 us
    or 0.5% of A's step. The verdict (regression, improvement, within noise, not comparable) needs --min-windows
    windows per side and no confound between the runs.
    """
    import json

    from profattr.errors import ProfattrError
    from profattr.text import clean_tree
    from profattr.trace.cache import store_while

    group_b = click.get_current_context().meta.get("profattr_group_b")
    if group_b is not None:
        if not group_b:
            raise ProfattrError("nothing after `--`: give the second group of captures after it (diff A1 A2 -- B1 B2)")
        a, b = list(captures), list(group_b)
    elif len(captures) == 2:
        a, b = captures
    else:
        raise ProfattrError(f"diff takes two captures (A B), or two groups split by `--` (A1 A2 -- B1 B2); got "
                            f"{len(captures)} without `--`")
    paths = [*(a if isinstance(a, list) else [a]), *(b if isinstance(b, list) else [b])]
    given = [*paths, mapping_a, mapping_b, *rules]
    if output:
        check_output(output, force, given)
    from profattr.attribute.verdict import gate, parse_fail_on

    gate_rules = parse_fail_on(fail_on)  # a bad threshold is an error before the slow part
    by = "layer" if layer_range is not None else by
    store_while(paths, _diff_modules)  # a capture's op store built while the diff's modules import
    from profattr.attribute.diff import compute_diff, load_sides

    side_a, side_b = load_sides(a, b, steps, rules, mapping_a, mapping_b, by, layer_range, skip_steps)
    result = compute_diff(side_a, side_b, samples=samples, changed=changed, min_windows=min_windows)
    from profattr.report import diff_view

    if fmt == "json":  # names exactly as captured, escaped by JSON
        text = json.dumps(result, indent=2)
    elif fmt == "markdown":
        text = diff_view.render_markdown(result)
    else:
        text = diff_view.render_table(result)
    emit(text, output, force, given)
    if gate_rules:
        failures, notes = gate(result, gate_rules)
        for line in notes:
            click.echo(f"warning: {clean_tree(line)}", err=True)
        if failures:
            click.echo(clean_tree(failures[0])
                       + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""), err=True)
            raise SystemExit(1)


@click.command()
@click.argument("captures", nargs=-1, required=True)
@steps_option
@rules_option
@format_option(("table", "json", "markdown"))
@output_options()
@cache_option
def variance(captures, steps, skip_steps, rules, fmt, output, force):
    """How much a decode step varies: between the steps of a window, the windows of one server, and the servers
    (launches) of one configuration, from the windows given (paths or quoted globs).

    Captures are grouped by configuration (the server's resolved arguments, batch, model) and by server (the
    windows one `profattr capture` run opened in one launch, as run.json records). Per metric (the step's span, the
    GPU's busy and idle time in it) and level: the standard deviation (ms), its share of one step's variance and
    its degrees of freedom; what else differs between the servers of a configuration is listed with them.
    """
    import json

    from profattr.attribute.diff import expand, load_sides
    from profattr.attribute.variance import variance_report
    from profattr.report import variance_view
    from profattr.text import clean_tree

    paths = [p for c in captures for p in expand(c)]
    given = [*paths, *rules]
    if output:
        check_output(output, force, given)
    group, _ = load_sides(paths, paths[:1], steps, rules, skip_steps=skip_steps)  # read in parallel, each once
    data = variance_report(group.members)
    if fmt == "json":
        text = json.dumps(clean_tree(data), indent=2)
    elif fmt == "markdown":
        text = variance_view.render_markdown(data)
    else:
        text = variance_view.render_table(data)
    emit(text, output, force, given)


def _diff_modules() -> None:
    """What a diff imports (pandas most of it), and the shipped rules compiled (their cache)."""
    from profattr.attribute import diff  # noqa: F401
    from profattr.report import diff_view  # noqa: F401
    from profattr.taxonomy.classify import load_rules

    load_rules()
