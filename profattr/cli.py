"""Thin Click layer: each command parses options, calls one library function and renders its result.

Commands are imported lazily (by name) so that `profattr --help` stays fast and a command whose optional
dependencies are missing does not break the others.
"""
import importlib
import sys

import click

from profattr import __version__

# command name -> "module:attribute"
COMMANDS = {
    "budget": "profattr.attribute.commands:budget",
    "classify": "profattr.taxonomy.commands:classify",
    "diff": "profattr.attribute.commands:diff",
    "capture": "profattr.capture.commands:capture",
    "check": "profattr.capture.commands:check",
    "doctor": "profattr.capture.commands:doctor",
    "drill": "profattr.capture.commands:drill",
    "drill-report": "profattr.report.drill_commands:drill_report",
    "limit": "profattr.limits.commands:limit",
    "gap": "profattr.limits.commands:gap",
    "report": "profattr.report.commands:report",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="profattr")
def cli():
    """Where every millisecond of a decoded token goes: Nsight Systems captures in, time budgets out."""


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="profattr", standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
