"""One exception type for every user-facing failure: one clear line, non-zero exit, no traceback."""
import click


class ProfattrError(click.ClickException):
    """What is wrong and what to do, in one line. The CLI prints it as `error: ...` and exits 2."""

    exit_code = 2

    def format_message(self) -> str:
        return " ".join(str(self.message).split())

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)
