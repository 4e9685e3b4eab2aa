"""One exception type for every user-facing failure: one clear line, non-zero exit, no traceback; and warnings, one
line each on stderr, said once per command."""
import click

from profattr.text import clean


class ProfattrError(click.ClickException):
    """What is wrong and what to do, in one line. The CLI prints it as `error: ...` and exits 2."""

    exit_code = 2

    def format_message(self) -> str:
        return " ".join(clean(self.message).split())

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


_warned: set = set()


def warn(message: str) -> None:
    """Print `warning: MESSAGE` on stderr (one line, control characters removed), once per command run: the same
    message from a capture read twice (a report reads each capture for several sections) is said once."""
    line = " ".join(clean(message).split())
    if line in _warned:
        return
    _warned.add(line)
    click.echo(f"warning: {line}", err=True)


def reset_warnings() -> None:
    """Forget the warnings said so far (the CLI calls it at the start of every command)."""
    _warned.clear()
