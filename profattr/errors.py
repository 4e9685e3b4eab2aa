"""One exception type for every user-facing failure, and warnings about the input.

`ProfattrError` is a plain Exception: library callers catch it like any other; the CLI (cli.py run_guarded) prints
it as one line `error: ...` and exits 2. `warn` says what profattr has to say about its input: under the CLI one line
`warning: ...` on stderr, once per command; in library calls a Python warning (ProfattrWarning), once per message
per call (api.py forgets the messages said at the start of each call)."""
from __future__ import annotations

import sys
import threading
import warnings
from contextlib import contextmanager

from profattr.text import clean


class ProfattrError(Exception):
    """What is wrong and what to do, in one line. The CLI prints it as `error: ...` and exits 2."""

    exit_code = 2

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return str(self.message)

    def format_message(self) -> str:
        return " ".join(clean(str(self.message)).split())

    def show(self, file=None) -> None:
        _echo(f"error: {self.format_message()}", file)


class ProfattrWarning(UserWarning):
    """What profattr has to say about its input (damaged rows skipped, a rule that matches nothing, ...)."""


_warned: set = set()
_to_stderr = False  # True while a CLI command runs (cli.py)
_recorders: list = []  # lists that recorded_warnings() fills


def _echo(line: str, file=None) -> None:
    import click  # the CLI's output, with its encoding handling; only a command reaches here

    click.echo(line, file=file if file is not None else sys.stderr)


def warn(message: str) -> None:
    """Say `message` (one line, control characters removed) once: as `warning: MESSAGE` on stderr under a command,
    else as a ProfattrWarning. The same message from a capture read twice (a report reads each capture for several
    sections) is said once."""
    line = " ".join(clean(message).split())
    for said in _recorders:  # every line, said before or not: a cached result says them all again
        said.append(line)
    if line in _warned:
        return
    _warned.add(line)
    if _to_stderr:
        _echo(f"warning: {line}")
    else:
        warnings.warn(line, ProfattrWarning, stacklevel=2)


class recorded_warnings:
    """`with recorded_warnings() as lines:` the lines warn() is given meanwhile (still said as usual)."""

    def __enter__(self) -> list:
        self.lines: list = []
        _recorders.append(self.lines)
        return self.lines

    def __exit__(self, *exc) -> None:
        _recorders.remove(self.lines)


def reset_warnings() -> None:
    """Forget the warnings said so far (the CLI calls it at the start of every command, api.py at every call)."""
    _warned.clear()


def warnings_to_stderr(on: bool) -> bool:
    """Send warn() to stderr (`warning: ...` lines) or to Python's warnings; returns the previous setting."""
    global _to_stderr
    previous, _to_stderr = _to_stderr, bool(on)
    return previous


_commands = [0]  # CLI commands running in this process (threads of one process may each run one)
_commands_lock = threading.Lock()


@contextmanager
def command_warnings():
    """While a CLI command runs, warn() says its lines on stderr; after the last running command ends, as Python
    warnings again. Counted, not saved and restored: two commands on two threads that end in any order leave the
    library's warnings as they were."""
    global _to_stderr
    with _commands_lock:
        _commands[0] += 1
        _to_stderr = True
    try:
        yield
    finally:
        with _commands_lock:
            _commands[0] -= 1
            if not _commands[0]:
                _to_stderr = False
