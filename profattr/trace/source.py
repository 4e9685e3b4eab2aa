"""Open a capture with the reader its content calls for: an Nsight Systems SQLite export (or a .nsys-rep, exported
beside it first), or torch-profiler traces (Chrome trace JSON, plain or gzip; a folder of rank files). Every reader
offers the same interface (trace/reader.py Export); nothing downstream knows which one ran."""
from __future__ import annotations

import gzip
from pathlib import Path

from profattr.errors import ProfattrError
from profattr.trace.reader import SQLITE_MAGIC, open_export, resolve_capture

NSYS_REP_MAGIC = b"NVIDIA Tegra Profiler Report"


def sniff(path: Path) -> str:
    """'sqlite', 'nsys-rep', 'json', 'folder' or 'unknown', from the file's first bytes (not its name)."""
    if path.is_dir():
        return "folder"
    with path.open("rb") as fh:
        head = fh.read(64)
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(NSYS_REP_MAGIC):
        return "nsys-rep"
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(64)
        except (OSError, EOFError):
            return "json"  # a damaged gzip: the JSON reader says what is wrong
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return "unknown"


def open_trace(path, force: bool = False):
    """The reader for `path` (a context manager): a file, a folder of rank traces, or a list of rank trace files.
    A .nsys-rep is exported to SQLite beside it first."""
    if isinstance(path, (list, tuple)):
        from profattr.trace.kineto import KinetoTrace

        return KinetoTrace(list(path))
    path = Path(path)
    if not path.exists():
        raise ProfattrError(f"{path}: no such file or folder")
    kind = sniff(path) if (path.is_dir() or path.is_file()) else "unknown"
    if kind == "nsys-rep" or (kind == "unknown" and path.suffix in (".nsys-rep", ".qdrep")):
        return open_export(resolve_capture(path, force=force, kind="report"))
    if kind in ("json", "folder"):
        from profattr.trace.kineto import KinetoTrace

        return KinetoTrace(path)
    if kind == "sqlite":
        return open_export(path)
    return open_export(path)  # says in one line what it is not
