"""Open a capture with the reader its content calls for: an Nsight Systems SQLite export (or a .nsys-rep, exported
beside it first), or torch-profiler traces (Chrome trace JSON, plain or gzip; a folder of rank files). Every reader
offers the same interface (trace/reader.py Export); nothing downstream knows which one ran."""
from __future__ import annotations

from pathlib import Path

from profattr import inputs
from profattr.trace.reader import SQLITE_MAGIC, open_export, resolve_capture

NSYS_REP_MAGIC = b"NVIDIA Tegra Profiler Report"
TRACE_NAMES = (".json", ".json.gz", ".gz")  # names only torch-profiler traces take


def sniff(path: Path) -> str:
    """'sqlite', 'nsys-rep', 'json', 'folder' or 'unknown', from the file's first bytes (not its name). The path is
    checked to be a regular file or a folder before it is opened (a FIFO would block the read forever)."""
    if inputs.file_or_folder(path) == "folder":
        return "folder"
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError:
        return "unknown"  # open_export says what is wrong
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(NSYS_REP_MAGIC):
        return "nsys-rep"
    if head[:2] == b"\x1f\x8b":
        return "json"  # only torch traces come gzipped: the JSON reader says what is wrong with a damaged one
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    if path.name.lower().endswith(TRACE_NAMES):
        return "json"  # named as a trace (empty, one byte, not gzip): the trace reader says what is wrong
    return "unknown"


def open_trace(path, force: bool = False):
    """The reader for `path` (a context manager): a file, a folder of rank traces, or a list of rank trace files.
    A .nsys-rep is exported to SQLite beside it first."""
    if isinstance(path, (list, tuple)):
        from profattr.trace.kineto import KinetoTrace

        return KinetoTrace(list(path))
    path = Path(path)
    kind = sniff(path)
    if kind == "nsys-rep" or (kind == "unknown" and path.suffix in (".nsys-rep", ".qdrep")):
        return open_export(resolve_capture(path, force=force, kind="report"))
    if kind in ("json", "folder"):
        from profattr.trace.kineto import KinetoTrace

        return KinetoTrace(path)
    if kind == "sqlite":
        return open_export(path)
    return open_export(path)  # says in one line what it is not
