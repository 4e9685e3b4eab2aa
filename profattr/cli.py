"""Thin Click layer: each command parses options, calls one library function and renders its result.

Commands are imported lazily (by name) so that `profattr --help` stays fast and a command whose optional
dependencies are missing does not break the others.

Errors, for every command (`ProfattrGroup.main`): bad input and usage errors are one line on stderr, `error: ...`,
exit 2; an unexpected exception is one line `error: internal error: TYPE: MESSAGE (PROFATTR_DEBUG=1 for the
traceback)`, exit 1 (PROFATTR_DEBUG=1 prints the traceback too); Ctrl-C exits 130. Python warnings (numpy's,
pandas') never reach stderr outside PROFATTR_DEBUG=1: what profattr has to say about its input it says itself, as
`warning: ...` lines (errors.warn).
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

import click

from profattr import __version__
from profattr.errors import ProfattrError, command_warnings, reset_warnings
from profattr.text import clean

# command name -> "module:attribute"
COMMANDS = {
    "budget": "profattr.attribute.commands:budget",
    "classify": "profattr.taxonomy.commands:classify",
    "taxonomy": "profattr.taxonomy.commands:taxonomy",
    "diff": "profattr.attribute.commands:diff",
    "variance": "profattr.attribute.commands:variance",
    "capture": "profattr.capture.commands:capture",
    "check": "profattr.capture.commands:check",
    "doctor": "profattr.capture.commands:doctor",
    "drill": "profattr.capture.commands:drill",
    "drill-report": "profattr.report.drill_commands:drill_report",
    "limit": "profattr.limits.commands:limit",
    "gap": "profattr.limits.commands:gap",
    "project": "profattr.limits.project_commands:project",
    "report": "profattr.report.commands:report",
    "timeline": "profattr.report.look_commands:timeline",
    "export": "profattr.report.look_commands:export",
    "ledger": "profattr.ledger.commands:ledger",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [name for name in COMMANDS if self._load(name) is not None]

    def get_command(self, ctx, name):
        return self._load(name)

    @staticmethod
    def _load(name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            # a command that is not there yet (or lacks an optional dependency) is simply not listed
            if isinstance(exc, ImportError) and exc.name and not exc.name.startswith("profattr"):
                raise
            return None


INTERNAL_MESSAGE_CHARS = 300  # an internal error's message is cut here (it may quote a 1 MB kernel name)


def debugging() -> bool:
    return os.environ.get("PROFATTR_DEBUG", "") not in ("", "0")


def _one_line(text, limit: int | None = None) -> str:
    line = " ".join(clean(text).split())
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def usage_line(exc: click.UsageError) -> str:
    """A Click usage error as one line: what is wrong, and where the help is."""
    message = _one_line(exc.format_message()).rstrip(".")
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    command = exc.ctx.command_path if exc.ctx is not None else "profattr"
    return f"error: {message}; see '{command} --help'"


def run_guarded(invoke) -> int:
    """Run `invoke()` (a command, not standalone) and turn whatever it raises into an exit status and at most one
    line on stderr."""
    from profattr import inputs

    reset_warnings()
    inputs.reset()
    debug = debugging()
    try:
        with command_warnings(), warnings.catch_warnings():
            if not debug:
                warnings.simplefilter("ignore")
            rv = invoke()
        return rv if isinstance(rv, int) else 0
    except SystemExit:
        raise
    except click.exceptions.NoArgsIsHelpError as exc:
        ctx = exc.ctx
        names = ", ".join(ctx.command.list_commands(ctx)) if ctx is not None and hasattr(ctx.command,
                                                                                          "list_commands") else ""
        command = ctx.command_path if ctx is not None else "profattr"
        click.echo(f"error: missing command{f' (one of {names})' if names else ''}; see '{command} --help'", err=True)
        return 2
    except click.UsageError as exc:
        click.echo(usage_line(exc), err=True)
        return exc.exit_code
    except ProfattrError as exc:
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except (KeyboardInterrupt, click.Abort):
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (`| head`): nothing more can be said there, and nothing is wrong
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as exc:  # noqa: BLE001 - the one place every unexpected failure ends
        if debug:
            import traceback

            traceback.print_exc()
        message = _one_line(str(exc), INTERNAL_MESSAGE_CHARS)
        click.echo(f"error: internal error: {type(exc).__name__}: {message} (PROFATTR_DEBUG=1 for the traceback)",
                   err=True)
        return 1


class ProfattrGroup(LazyGroup):
    """The top-level group: every command runs under `run_guarded`."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        parent = super()
        sys.exit(run_guarded(lambda: parent.main(args, prog_name, complete_var, standalone_mode=False, **extra)))


@click.group(cls=ProfattrGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="profattr")
def cli():
    """Where every millisecond of a decoded token goes: Nsight Systems captures in, time budgets out."""


def main(argv=None):
    cli.main(args=argv, prog_name="profattr", standalone_mode=True)


if __name__ == "__main__":
    main()
