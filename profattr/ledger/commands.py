"""Click group `profattr ledger`: add captures to a campaign ledger, and list, show, compare and follow them."""
from __future__ import annotations

import json

import click

from profattr.attribute.commands import format_option, rules_option, steps_option
from profattr.outputs import check_output, emit, output_options
from profattr.text import clean_tree

LEDGER_HELP = ("The ledger file (SQLite). Default: $PROFATTR_LEDGER, else $XDG_DATA_HOME/profattr/ledger.db, else "
               "~/.local/share/profattr/ledger.db.")


def ledger_option(f):
    return click.option("--ledger", "ledger_path", type=click.Path(), default=None, help=LEDGER_HELP)(f)


def _path(ledger_path):
    from profattr.ledger.schema import default_path

    return ledger_path if ledger_path is not None else str(default_path())


def _open(ledger_path):
    from profattr.ledger.schema import open_ledger

    path = _path(ledger_path)
    return open_ledger(path), path


def _read(ledger_path, fn):
    """fn(db, path) on the opened ledger, with SQLite failures as one-line errors; the ledger closed after."""
    from profattr.ledger.schema import sqlite_errors

    db, path = _open(ledger_path)
    try:
        with sqlite_errors(path):
            return fn(db, path)
    finally:
        db.close()


@click.group()
def ledger():
    """A campaign ledger: every capture's identity, run.json facts and per-step budget in one SQLite database.

    Entries are addressed by number or label. The schema (profattr.ledger/1) is in README.md; the file opens in
    sqlite-utils and Datasette as it is.
    """


@ledger.command("add")
@click.argument("captures", nargs=-1, required=True, type=click.Path())
@click.option("--label", "labels", multiple=True,
              help="Name of the entry; once per capture, in order (default: run.json's name, else the file name).")
@ledger_option
@steps_option
@rules_option
def add(captures, labels, ledger_path, steps, skip_steps, rules):
    """Budget CAPTURES and record them (with NAME.run.json's facts when it is beside a capture).

    The same capture (same content) with the same --steps and rules is recorded once.
    """
    from profattr.ledger.record import add_captures
    from profattr.outputs import input_named

    path = _path(ledger_path)
    source = input_named(path, [*captures, *rules])
    if source is not None:  # the ledger is written: never a capture, its run.json or a rules file
        from profattr.errors import ProfattrError

        raise ProfattrError(f"--ledger {path}: is an input of this command ({source}); give the ledger its own file")
    for r in add_captures(path, list(captures), labels=list(labels) or None, steps=steps, rules=rules,
                          skip_steps=skip_steps):
        if r["status"] == "added":
            click.echo(f"added entry {r['entry_id']} ({r['label']}): {r['capture']}")
        elif r["entry_id"] is not None:
            click.echo(f"{r['capture']}: already in the ledger as entry {r['entry_id']} ({r['label']}); not added "
                       "again")
        else:
            click.echo(f"{r['capture']}: already in the ledger (the same file was given twice); not added again")
    click.echo(f"ledger: {path}")


@ledger.command("list")
@ledger_option
@format_option()
@output_options()
def list_(ledger_path, fmt, output, force):
    """The entries in the order they were added: label, ms/token, step time and largest categories (slowest GPU)."""
    from profattr.ledger.query import list_rows
    from profattr.report.ledger_view import list_view

    _check_output(output, force, ledger_path)
    rows = clean_tree(_read(ledger_path, lambda db, path: list_rows(db)))
    if fmt == "json":
        text = json.dumps({"schema": "profattr.ledger.list/1", "entries": rows}, indent=2)
    else:
        text = list_view(rows, fmt)
    emit(text, output, force, [_path(ledger_path)])


@ledger.command("show")
@click.argument("entry")
@ledger_option
@format_option()
@output_options()
def show(entry, ledger_path, fmt, output, force):
    """ENTRY (number or label) in full: identity, run facts, GPUs, packages, and its budget."""
    from profattr.ledger.query import resolve_entry, show as show_entry
    from profattr.report.ledger_view import show_view

    _check_output(output, force, ledger_path)
    shown = clean_tree(_read(ledger_path, lambda db, path: show_entry(db, resolve_entry(db, entry, path))))
    emit(json.dumps(shown, indent=2) if fmt == "json" else show_view(shown, fmt), output, force,
         [_path(ledger_path)])


@ledger.command("compare")
@click.argument("a")
@click.argument("b")
@ledger_option
@format_option()
@click.option("--changed", help="Category family you changed between A and B (as for `profattr diff`).")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(min=1),
              help="Bootstrap samples for the 95% intervals.")
@output_options()
def compare(a, b, ledger_path, fmt, changed, samples, output, force):
    """B - A from the stored budgets: the components of `profattr diff`, with its bootstrap intervals."""
    from profattr.ledger.query import compare as compare_entries
    from profattr.report.ledger_view import compare_view

    _check_output(output, force, ledger_path)
    result = clean_tree(_read(ledger_path, lambda db, path: compare_entries(db, path, a, b, samples=samples,
                                                                             changed=changed)))
    emit(json.dumps(result, indent=2) if fmt == "json" else compare_view(result, fmt), output, force,
         [_path(ledger_path)])


@ledger.command("trend")
@click.argument("metric")
@ledger_option
@format_option()
@output_options()
def trend(metric, ledger_path, fmt, output, force):
    """METRIC across the entries: step_ms, mean_step_ms, busy, idle, overlap, kernels_per_step, ms_per_token,
    ms_per_token_profiled or category:<id> (ms/step)."""
    from profattr.ledger.query import trend as trend_rows
    from profattr.report.ledger_view import trend_view

    _check_output(output, force, ledger_path)
    rows = clean_tree(_read(ledger_path, lambda db, path: trend_rows(db, metric, path)))
    if fmt == "json":
        text = json.dumps({"schema": "profattr.ledger.trend/1", "metric": metric, "rows": rows}, indent=2)
    else:
        text = trend_view(rows, fmt)
    emit(text, output, force, [_path(ledger_path)])


def _check_output(output, force, ledger_path) -> None:
    if output:
        check_output(output, force, [_path(ledger_path)])
