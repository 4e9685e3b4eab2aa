"""The files of a capture: refusing to replace earlier ones, naming each window's report, turning what nsys left
(.nsys-rep or .qdstrm) into an export, checking it, and writing NAME.run.json atomically.

Commands are recorded with file names relative to the capture folder: run.json travels with its folder, and the
paths of the machine that made or finished it mean nothing elsewhere.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from profattr.capture import ncu
from profattr.check import overall
from profattr.check.run import evaluate
from profattr.check.timing import profiled_timing
from profattr.tools import nsys as nsys_tool
from profattr.capture import sglang
from profattr.capture.drive import CLIENT_CAVEAT
from profattr.capture.plan import SUFFIXES, Plan
from profattr.errors import ProfattrError
from profattr.run_record import RunRecord

Echo = Callable[[str], None]
TORCH_SUFFIX = ".trace.json.gz"


def existing_outputs(p: Plan) -> list:
    """Files an earlier capture of the same names left in the folder (each window's, the session's log)."""
    if not p.options.out_dir.is_dir():
        return []
    found = [p.window_path(w, k) for w in p.windows for k in SUFFIXES if p.window_path(w, k).exists()]
    found += [p.path("log")] if p.path("log").exists() and p.path("log") not in found else []
    for w in p.windows:
        found += [f for f in sglang.trace_files(p.options.out_dir, w.name) if f not in found]
        base = p.nsys_output(w)
        found += [f for s in (".nsys-rep", ".qdstrm") if (f := base.with_name(base.name + s)).exists()
                  and f not in found]
    return found


def prepare_outputs(p: Plan) -> None:
    """Create the folder; refuse to replace an earlier capture of the same name unless --force (then remove only
    the files a capture of this name writes)."""
    out = p.options.out_dir
    if out.exists() and not out.is_dir():
        raise ProfattrError(f"{out} exists and is not a folder; give -o a folder")
    found = existing_outputs(p)
    if found and not p.options.force:
        raise ProfattrError(f"a capture named {p.windows[0].name if len(p.windows) == 1 else p.name} already exists "
                            f"in {out} ({', '.join(f.name for f in found[:6])}); pass --force to replace it or "
                            "choose --name")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfattrError(f"cannot create the output folder {out} ({exc.strerror})") from None
    for f in found:
        f.unlink()
    for w in p.windows:  # from an interrupted export
        stale = p.window_path(w, "sqlite").with_name(w.name + SUFFIXES["sqlite"] + ".partial")
        if stale.exists():
            stale.unlink()


def write_run(path: Path, run: dict) -> None:
    """Write run.json atomically (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(run, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def name_window_outputs(p: Plan) -> None:
    """Give each window's report its capture name (nsys numbered them NAME.1, NAME.2, ... under one profile)."""
    for w in p.windows:
        base = p.nsys_output(w)
        if base.name == w.name:
            continue
        for suffix in (".nsys-rep", ".qdstrm"):
            src = base.with_name(base.name + suffix)
            if src.exists():
                os.replace(src, p.window_path(w, "report" if suffix == ".nsys-rep" else "qdstrm"))


def finish_outputs(p_dir: Path, name: str, run: dict, nsys_path: str | None, importer: str | None, echo: Echo,
                   force: bool = False, ncu_path: str | None = None) -> None:
    """Turn what the profiler left (.nsys-rep, .qdstrm, or torch traces) into something to read, run the checks,
    measure the profiled ms/token in the capture, and record it all in `run`."""
    def f(kind):
        return p_dir / (name + SUFFIXES[kind])

    report, qdstrm, sqlite = f("report"), f("qdstrm"), f("sqlite")
    if not report.exists() and qdstrm.exists():
        if importer:
            echo(f"importing {qdstrm.name} with {nsys_tool.IMPORTER_NAME}")
            run["commands"]["import"] = nsys_tool.import_command(nsys_tool.IMPORTER_NAME, qdstrm.name, report.name)
            nsys_tool.import_qdstrm(qdstrm, importer, report, force=force)
        else:
            run["status"] = "needs_import"
            run["notes"].append(f"nsys here has no importer (host-linux-x64/{nsys_tool.IMPORTER_NAME}) and left "
                                f"{qdstrm.name}; on a machine with a full Nsight Systems, run "
                                f"`profattr capture --finish <this folder>`")
    if report.exists():
        if sqlite.exists() and not force:
            raise ProfattrError(f"{sqlite} exists; pass --force to export it again")
        run["commands"]["export"] = nsys_tool.export_command("nsys", report.name, sqlite.name)
        echo(f"exporting {report.name} to SQLite")
        nsys_tool.export_sqlite(report, sqlite, nsys=nsys_path, force=force)
    ncu_report, ncu_csv = f("ncu_report"), f("ncu_csv")
    if ncu_report.exists() and ncu_path and (force or not ncu_csv.exists()):
        echo(f"exporting {ncu_report.name} to CSV")
        run["commands"]["ncu_export"] = [*ncu.export_command("ncu", ncu_report.name), ">", ncu_csv.name]
        ncu.export_csv(ncu_path, ncu_report, ncu_csv)
    traces = sglang.trace_files(p_dir, name) if p_dir.is_dir() else []
    readable = sqlite if sqlite.exists() else (traces[0] if len(traces) == 1 else traces if traces else None)
    if readable is not None and run.get("profiler") != "ncu":
        try:
            findings, budget = evaluate(readable, RunRecord(run))  # the checks read the run being written
        except ProfattrError as exc:
            if readable == sqlite:
                raise
            run["notes"].append(f"not checked here: {exc.format_message()}")
        else:
            record_profiled_timing(run, budget)
            run["check"] = {"status": overall(findings), "findings": [x.to_dict() for x in findings]}
    files = {kind: f(kind).name for kind in SUFFIXES if f(kind).exists() or kind == "run"}
    log = run.get("files", {}).get("log")
    if log and (p_dir / log).exists():
        files["log"] = log  # the server's log, shared by the windows of one session
    if traces:
        files["traces"] = [t.name for t in traces]
    run["files"] = files


def record_profiled_timing(run: dict, budget) -> None:
    """Put the profiled ms/token measured in the capture (median step span, per device) into run["timing"]; a
    client-side figure the target measured stays as ms_per_token_profiled_client."""
    timing = run.setdefault("timing", {})
    if "ms_per_token_profiled" in timing and "profiled_source" not in timing:
        # written before the capture was measured: the SGLang driver's client-side figure
        timing["ms_per_token_profiled_client"] = timing.pop("ms_per_token_profiled")
        timing.setdefault("profiled_client_caveat", CLIENT_CAVEAT)
    measured = profiled_timing(budget)
    if measured:
        timing.update(measured)
