"""Files a command reads (captures, traces, run.json, rules files, ncu CSVs, ledgers, config.json): each is checked
to be a regular file before anything opens it, so a FIFO named `x.sqlite` is an error, not a read that waits
forever, and a folder, a symbolic-link loop or a device is said in one line.

Every input checked here is remembered for the rest of the command (`opened`): the output policy (outputs.py) never
writes to one of them.
"""
from __future__ import annotations

import errno
import os
import stat
import re
from pathlib import Path

from profattr.errors import ProfattrError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))
_opened: dict = {}  # resolved path -> Path as given, for every input of this command


def reset() -> None:
    """Forget the inputs of the previous command (the CLI calls it at the start of every command)."""
    _opened.clear()


def remember(path) -> None:
    """Record `path` as an input of this command (outputs never replace it)."""
    p = Path(path)
    _opened.setdefault(os.path.realpath(p), p)


def opened() -> list:
    """Every input recorded for this command, as given."""
    return list(_opened.values())


def _stat(p: Path, what: str) -> os.stat_result:
    try:
        return os.stat(p)
    except FileNotFoundError:
        raise ProfattrError(f"{p}: no such file; give {what}") from None
    except NotADirectoryError:
        raise ProfattrError(f"{p}: a part of this path is a file, not a folder; give {what}") from None
    except PermissionError:
        raise ProfattrError(f"{p}: permission denied; make it readable or give another copy") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProfattrError(f"{p}: a loop of symbolic links; give the file itself") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise ProfattrError(f"{str(p)[:80]}...: the path is too long") from None
        raise ProfattrError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    except ValueError:  # a NUL in the name
        raise ProfattrError(f"{p!r}: not a usable path (it contains a NUL character)") from None


def kind_of(st: os.stat_result) -> str:
    """'file', 'folder' or the words for what else it is (a FIFO, a socket, a device)."""
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    return next((words for test, words in _KINDS if test(st.st_mode)), "not a regular file")


def regular_file(path, what: str = "a file", folder_hint: str | None = None) -> Path:
    """`path` after checking (symbolic links followed) that it is a regular file; ProfattrError in one line when it
    is missing, a folder, a FIFO, a socket, a device, a link loop or unreadable. `what` names what was expected
    ("an Nsight Systems export"); `folder_hint` is said instead when it is a folder."""
    p = Path(path)
    kind = kind_of(_stat(p, what))
    if kind == "folder":
        raise ProfattrError(f"{p}: is a folder; {folder_hint or f'give {what}'}")
    if kind != "file":
        raise ProfattrError(f"{p}: is {kind}, not a regular file; give {what}")
    if not os.access(p, os.R_OK):
        raise ProfattrError(f"{p}: permission denied; make it readable or give another copy")
    remember(p)
    return p


def file_or_folder(path, what: str = "a capture") -> str:
    """'file' or 'folder' for an input that may be either (a trace folder of rank files); ProfattrError otherwise."""
    p = Path(path)
    kind = kind_of(_stat(p, what))
    if kind not in ("file", "folder"):
        raise ProfattrError(f"{p}: is {kind}, not a regular file; give {what}")
    if kind == "file":
        remember(p)
    return kind


def is_regular_file(path) -> bool:
    """Whether `path` is a regular file (symbolic links followed), without raising: for optional companions such as
    NAME.run.json beside a capture, which are read only when they are there and are files."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_text(path, what: str = "a text file") -> str:
    """The text of a regular file, decoded as UTF-8 with undecodable bytes replaced."""
    p = regular_file(path, what)
    try:
        return p.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise ProfattrError(f"{p}: cannot read it ({exc.strerror or exc})") from None


_TORCH_TRACE_NAME = re.compile(r"(-TP-\d+(-[A-Z]+-\d+)*)?(\.trace)?\.json(\.gz)?$")


def run_json_path(capture) -> Path:
    """NAME.run.json beside NAME.sqlite / NAME.nsys-rep / NAME.qdstrm, or beside the torch-profiler traces SGLang
    writes for a window NAME (NAME-TP-<rank>.trace.json.gz, as `profattr capture --profiler torch` and `capture
    --server` name them)."""
    capture = Path(capture)
    name = capture.name
    for suffix in (".sqlite", ".nsys-rep", ".qdstrm"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = _TORCH_TRACE_NAME.sub("", name) or name
    return capture.with_name(name + ".run.json")
