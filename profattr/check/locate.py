"""Where a capture's files are: a folder or file written by `profattr capture` (NAME.run.json beside NAME.sqlite or
NAME-TP-<rank>.trace.json.gz) or any nsys export / torch-profiler trace (then the checks that need run.json are
skipped)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from profattr.errors import ProfattrError
from profattr.run_record import RunRecord
from profattr.trace.reader import resolve_capture

TRACE_SUFFIX = ".trace.json.gz"


@dataclass
class Capture:
    """What `check` looks at: the readable capture (None when not exported yet) and run.json (None for a bare
    capture)."""

    path: "Path | list | None"  # an export or trace; a list of rank trace files
    run: RunRecord | None
    run_path: Path | None

    @property
    def sqlite(self) -> Path | None:  # the name earlier callers use
        return self.path


def load_run(path: Path) -> RunRecord:
    """The RunRecord of a run.json written by `profattr capture`; ProfattrError when it is not one."""
    from profattr import run_record

    return run_record.load(path, require_schema=True)


def _capture_of_run(run_path: Path, run: RunRecord) -> Path | None:
    name = run_path.name[: -len(".run.json")]
    candidates = [run_path.parent / run.sqlite_file] if run.sqlite_file else []
    candidates.append(run_path.parent / f"{name}.sqlite")
    traces = run.trace_files or sorted(p.name for p in run_path.parent.glob(f"{name}-TP-*{TRACE_SUFFIX}"))
    for c in candidates:
        if c.exists():
            return c
    if traces:
        paths = [run_path.parent / t for t in traces if (run_path.parent / t).exists()]
        if len(paths) == 1:
            return paths[0]
        if paths:
            return paths  # several ranks: their files
    return None


def locate(path) -> Capture:
    """Resolve a folder, NAME.run.json, NAME.sqlite, NAME.nsys-rep or a trace to the capture and run.json."""
    from profattr import inputs

    path = Path(path)
    if inputs.file_or_folder(path, "a capture (folder, NAME.run.json, NAME.sqlite or NAME.nsys-rep)") == "folder":
        runs = sorted(path.glob("*.run.json"))
        if len(runs) == 1:
            return locate(runs[0])
        exports = sorted(path.glob("*.sqlite"))
        traces = sorted(path.glob(f"*{TRACE_SUFFIX}"))
        if not runs and len(exports) == 1:
            return locate(exports[0])
        if not runs and not exports and traces:
            return Capture(path, None, None)
        if not runs and not exports:
            raise ProfattrError(f"{path}: no capture here (no NAME.run.json, NAME.sqlite or trace)")
        names = ", ".join(p.name for p in (runs or exports))
        raise ProfattrError(f"{path} holds several captures ({names}); give one file")
    if path.name.endswith(".run.json"):
        run = load_run(path)
        return Capture(_capture_of_run(path, run), run, path)
    if path.suffix == ".qdstrm":
        raise ProfattrError(f"{path}: a raw nsys stream, not a report yet; turn it into one with "
                            f"`profattr capture --finish {path.parent}` on a machine with QdstrmImporter")
    if path.suffix in (".nsys-rep", ".qdrep"):
        path = resolve_capture(path)
    name = path.name
    for suffix in (".sqlite", TRACE_SUFFIX, ".json.gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    run_path = path.with_name(name + ".run.json")
    if not os.path.lexists(run_path) and "-TP-" in name:
        run_path = path.with_name(name.rsplit("-TP-", 1)[0] + ".run.json")
    run = load_run(run_path) if os.path.lexists(run_path) else None
    return Capture(path, run, run_path if run else None)
