"""The one output policy of every command that writes a file (`-o/--output`, `gap --chart`, `report -o FOLDER`,
`ledger --ledger`):

- never write to an input of the command: the paths given, the files read on the way (NAME.run.json, the .sqlite
  exported from a .nsys-rep, rules files; inputs.py records them) and their SQLite companions (-wal, -shm,
  -journal). Paths are compared after resolving symbolic links, and by (st_dev, st_ino), so a hard link or a link
  to the capture is the capture;
- create the output's folder when it is missing, or fail in one line when it cannot be made;
- refuse to replace an existing file without --force; never replace anything that is not a regular file;
- write atomically: a temporary file in the same folder, renamed over the target once complete, so an interrupted
  command leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterable

import click

from profattr import inputs as input_files
from profattr.errors import ProfattrError
from profattr.text import clean_block

SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def companions(path) -> list:
    """Files that belong to an input `path`: NAME.run.json beside a capture, the .sqlite exported from a .nsys-rep,
    and SQLite's -wal/-shm/-journal."""
    from profattr.inputs import run_json_path

    p = Path(path)
    out = [p, run_json_path(p)]
    if p.suffix in (".nsys-rep", ".qdrep"):
        out.append(p.with_suffix(".sqlite"))
    return out + [p.with_name(p.name + s) for s in SQLITE_COMPANIONS]


def _identity(path):
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def input_named(path, given: Iterable = ()):
    """The input (of `given`, and of every input this command has read) that `path` would overwrite, else None."""
    target_real = os.path.realpath(path)
    target_id = _identity(path)
    for source in list(given) + input_files.opened():
        if source is None:
            continue
        for related in companions(source):
            if os.path.realpath(related) == target_real:
                return source
            if target_id is not None and _identity(related) == target_id:
                return source
    return None


def check_output(path, force: bool = False, given: Iterable = (), what: str = "the output") -> Path:
    """`path` checked against the policy above (before anything is computed, and again before it is written)."""
    p = Path(path)
    if str(p) in ("", ".", "..") or p.name in ("", ".", ".."):
        raise ProfattrError(f"{p}: not a file name; give a file for {what}")
    source = input_named(p, given)
    if source is not None:
        same = "" if os.path.realpath(source) == os.path.realpath(p) else f" (it is {source} or belongs to it)"
        raise ProfattrError(f"{p}: is an input of this command{same}; write {what} to another file")
    if p.is_dir():
        raise ProfattrError(f"{p}: is a folder; give a file name for {what}")
    if os.path.lexists(p):
        if not input_files.is_regular_file(p):
            raise ProfattrError(f"{p}: exists and is not a regular file; give another name for {what}")
        if not force:
            raise ProfattrError(f"{p} exists; pass --force to replace it")
    return p


def ensure_folder(folder) -> Path:
    """`folder`, created (with its parents) when missing; ProfattrError when it cannot be."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ProfattrError(f"cannot create the folder {folder}: a file of that name is in the way") from None
    except NotADirectoryError:
        raise ProfattrError(f"cannot create the folder {folder}: a part of its path is a file") from None
    except OSError as exc:
        raise ProfattrError(f"cannot create the folder {folder} ({exc.strerror or exc})") from None
    return folder


def _mode_for(path: Path) -> int:
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(path, force: bool = False, given: Iterable = (), what: str = "the output"):
    """A temporary path beside `path` (same suffix, for writers that go by it) to write to; renamed over `path` when
    the block ends without an error, removed when it fails."""
    p = check_output(path, force, given, what)
    ensure_folder(p.parent if str(p.parent) else Path("."))
    try:
        # same suffix (or none): matplotlib takes the format from it
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.stem[:60]}-partial-", suffix=p.suffix)
    except OSError as exc:
        raise ProfattrError(f"cannot write {p} ({exc.strerror or exc})") from None
    os.close(fd)
    try:
        yield Path(tmp)
        check_output(p, force, given, what)  # again: the inputs read meanwhile (run.json, exports) count too
        os.chmod(tmp, _mode_for(p))
        os.replace(tmp, p)
    except OSError as exc:
        raise ProfattrError(f"cannot write {p} ({exc.strerror or exc})") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_text(path, text: str, force: bool = False, given: Iterable = (), what: str = "the output",
               newline: bool = True) -> Path:
    """Write `text` (UTF-8; ending in a newline unless `newline` is False) to `path` under the policy above."""
    if newline and not text.endswith("\n"):
        text += "\n"
    data = text.encode("utf-8", errors="replace")
    with atomic_path(path, force, given, what) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return Path(path)


def emit(text: str, output=None, force: bool = False, given: Iterable = (), exact: bool = False) -> None:
    """A command's rendered result: to stdout, or to `output` under the policy above. Control characters other than
    line breaks never leave (text.clean_block), except with `exact`: a machine format (CSV) whose fields carry the
    capture's names as they are."""
    if not exact:
        text = clean_block(text)
    if output:
        write_text(output, text, force, given)
    else:
        click.echo(text, color=True if exact else None)  # color=True: Click keeps escape sequences as they are


def output_options(force: bool = True):
    """`-o/--output FILE` (and `--force`, unless the command has its own) for a command that prints a result."""
    def decorate(f):
        if force:
            f = click.option("--force", is_flag=True, help="Replace the -o file when it exists.")(f)
        return click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
                            help="Write to this file instead of stdout (its folder is created; an existing file is "
                                 "replaced only with --force; never an input).")(f)
    return decorate
