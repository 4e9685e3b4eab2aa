"""Nsight Systems as a tool: find `nsys`, read its version, find the host importer, build `nsys profile` command
lines, turn a `.qdstrm` into a `.nsys-rep`, and export a report to SQLite.

An install has two halves. The *target* half (`target-linux-x64/nsys`, the injection libraries) records; the *host*
half (`host-linux-x64/QdstrmImporter`) turns the raw stream (`.qdstrm`) into a report (`.nsys-rep`). Where only the
target half exists (for example an nsys unpacked from the `nsight-systems-target` package on a GPU machine),
`nsys profile` leaves `NAME.qdstrm` and says "skipping importation"; `import_qdstrm` finishes the job on a machine
with the host half.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from profattr import progress
from profattr.errors import ProfattrError

# Oldest release accepted. profattr records with 2024.2.3 (export schema 3.11.1); it reads exports of 2023.4.4
# (schema 3.7.2) too. 2023.4.4 silently recorded about 1% of a CUDA-13-era GLM-5-shaped decode (check flags it).
MIN_VERSION = (2022, 4)
TESTED_VERSION = "2024.2.3"
HOW_TO_GET = ("get one with `scripts/install-nsys` (Debian's Nsight Systems, unpacked into "
              "${PROFATTR_CACHE:-~/.cache/profattr}), or install Nsight Systems from NVIDIA and pass --nsys PATH "
              "or set PROFATTR_NSYS")
IMPORTER_NAME = "QdstrmImporter"

# Flags for a GPU target. node-level graph tracing: with `graph`, replayed kernels have no rows at all.
# fork-before-exec: SGLang and torchrun start one process per rank. No CPU sampling or context switches: they cost
# overhead and size and say nothing about kernels.
GPU_TRACE = "cuda,nvtx"
CPU_TRACE = "nvtx,osrt"
# What QdstrmImporter says when the stream holds CUDA runtime calls newer than the nsys release knows (seen: nsys
# 2023.4.4 on CUDA 13 after torch._grouped_mm ran inside the window).
UNKNOWN_RUNTIME_API = re.compile(r"Unknown runtime API function index:?\s*(\d+)")


@dataclass(frozen=True)
class Nsys:
    """A usable nsys: where it is, how it was found, its version, and the importer that goes with it (or None)."""

    path: str
    version: str
    source: str
    importer: str | None = None

    @property
    def version_tuple(self) -> tuple:
        return parse_version(self.version)


def parse_version(text: str) -> tuple:
    """(2023, 4, 4, 54) from "NVIDIA Nsight Systems version 2023.4.4.54-234433681190v0"; () when there is none."""
    match = re.search(r"(\d{4})\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    if not match:
        return ()
    return tuple(int(g) for g in match.groups() if g is not None)


def cache_dir() -> Path:
    """The folder `scripts/install-nsys` fills: $PROFATTR_CACHE, else ~/.cache/profattr."""
    return Path(os.environ.get("PROFATTR_CACHE") or Path.home() / ".cache" / "profattr")


def _version_key(path: str) -> tuple:
    return parse_version(path) or (0,)


def candidates(explicit: str | None = None) -> list:
    """Where to look, in order, as (path, source) pairs: --nsys, $PROFATTR_NSYS, PATH, CUDA toolkits, Nsight Systems
    installs, then the scripts/install-nsys cache. Newer versioned folders come first within a group."""
    found = []
    if explicit:
        found.append((str(explicit), "--nsys"))
    env = os.environ.get("PROFATTR_NSYS")
    if env:
        found.append((env, "$PROFATTR_NSYS"))
    on_path = shutil.which("nsys")
    if on_path:
        found.append((on_path, "PATH"))
    groups = [("/usr/local/cuda*/bin/nsys", "CUDA toolkit"),
              ("/opt/nvidia/nsight-systems/*/bin/nsys", "Nsight Systems install"),
              (str(cache_dir() / "nsys-*" / "bin" / "nsys"), "scripts/install-nsys cache")]
    for pattern, source in groups:
        for path in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            found.append((path, source))
    return found


def probe_version(path: str, timeout_s: float = 60) -> str:
    """The version `nsys --version` prints (such as "2023.4.4.54-234433681190v0"); raises ProfattrError when the file
    does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProfattrError(f"{path} does not run ({exc}); {HOW_TO_GET}") from None
    text = (out.stdout or "") + (out.stderr or "")
    if out.returncode != 0 or not parse_version(text):
        first = text.strip().splitlines()[:1]
        raise ProfattrError(f"{path} --version failed (exit {out.returncode}: {first[0] if first else 'no output'}); "
                            f"{HOW_TO_GET}")
    # "NVIDIA Nsight Systems version 2023.4.4.54-234433681190v0" -> "2023.4.4.54-234433681190v0"
    return re.search(r"\d{4}\.\S+", text).group(0)


def find_nsys(explicit: str | None = None, check_version: bool = True) -> Nsys:
    """The nsys to use. An explicit --nsys or $PROFATTR_NSYS must work (no silent fallback); otherwise the first
    candidate that runs. Raises ProfattrError (missing, broken, or older than MIN_VERSION) with how to get one."""
    tried = []
    for path, source in candidates(explicit):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            if source in ("--nsys", "$PROFATTR_NSYS"):
                raise ProfattrError(f"nsys given by {source} ({path}) is not an executable file; {HOW_TO_GET}")
            continue
        try:
            version = probe_version(path)
        except ProfattrError:
            if source in ("--nsys", "$PROFATTR_NSYS"):
                raise
            tried.append(path)
            continue
        tool = Nsys(path=path, version=version, source=source, importer=find_importer(path))
        if check_version and tool.version_tuple[:2] < MIN_VERSION:
            raise ProfattrError(f"nsys at {path} is version {'.'.join(map(str, tool.version_tuple))}, older than "
                                f"{'.'.join(map(str, MIN_VERSION))}; {HOW_TO_GET}")
        return tool
    extra = f" (found but not working: {', '.join(tried)})" if tried else ""
    raise ProfattrError(f"nsys (Nsight Systems CLI) not found on PATH, in /usr/local/cuda*/bin, "
                        f"/opt/nvidia/nsight-systems/*/bin or {cache_dir()}/nsys-*/bin{extra}; {HOW_TO_GET}")


def _script_targets(path: str) -> list:
    """Absolute paths ending in /nsys named inside a small wrapper script (such as the one scripts/install-nsys
    writes), so that the importer beside the real binary is found."""
    try:
        if os.path.getsize(path) > 64 * 1024:
            return []
        with open(path, "rb") as fh:
            head = fh.read()
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    return re.findall(r"(/[^\s\"'$]*/nsys)\b", head.decode(errors="replace"))


def find_importer(nsys_path: str | None) -> str | None:
    """QdstrmImporter for this nsys, or None: $PROFATTR_QDSTRM_IMPORTER, then `host-linux-x64/` beside the folder of
    the nsys binary (what nsys itself looks for), following symlinks and wrapper scripts."""
    env = os.environ.get("PROFATTR_QDSTRM_IMPORTER")
    if env and os.path.isfile(env) and os.access(env, os.X_OK):
        return env
    if not nsys_path:
        return None
    bins = [nsys_path, os.path.realpath(nsys_path)] + _script_targets(nsys_path)
    folders = []
    for b in bins:
        d = os.path.dirname(os.path.abspath(b))
        # target-linux-x64/nsys -> ../host-linux-x64; <install>/bin/nsys -> ../host-linux-x64
        folders += [os.path.join(d, "..", "host-linux-x64"), os.path.join(d, "host-linux-x64")]
    for folder in folders:
        exe = os.path.normpath(os.path.join(folder, IMPORTER_NAME))
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


def profile_command(nsys: str, output_base, command: Sequence[str], *, trace: str = GPU_TRACE,
                    capture_range: str = "cudaProfilerApi", cuda_graph_trace: str = "node",
                    fork_before_exec: bool = True, extra: Sequence[str] = (), repeat: int = 1,
                    nvtx_capture: str | None = None, cpu_samples: bool = False) -> list:
    """`nsys profile ... -o OUTPUT_BASE COMMAND...` as an argument list. OUTPUT_BASE has no suffix: nsys adds
    `.nsys-rep` (or `.qdstrm` where no importer is installed). `repeat` > 1 records that many capture ranges, one
    report each, which nsys names OUTPUT_BASE.1, OUTPUT_BASE.2, ... `cpu_samples`: record CPU samples of the
    process tree, with Python backtrace sampling (the report's idle section reads them)."""
    args = [nsys, "profile", *_trace_flags(trace, cuda_graph_trace, fork_before_exec)]
    if capture_range and capture_range != "none":
        args.append(f"--capture-range={capture_range}")
        if capture_range == "nvtx" and nvtx_capture:
            args.append(f"--nvtx-capture={nvtx_capture}")
        args.append("--capture-range-end=stop" if repeat <= 1 else f"--capture-range-end=repeat:{repeat}")
    args += [*_sample_flags(cpu_samples), *(["--python-sampling=true"] if cpu_samples else []), "--cpuctxsw=none",
             *extra, "-o", str(output_base)]
    return args + list(command)


def _sample_flags(cpu_samples: bool) -> list:
    return ["--sample=process-tree"] if cpu_samples else ["--sample=none"]


def _trace_flags(trace: str, cuda_graph_trace: str, fork_before_exec: bool) -> list:
    args = [f"--trace={trace}"]
    if "cuda" in trace.split(","):
        args.append(f"--cuda-graph-trace={cuda_graph_trace}")
    if fork_before_exec:
        args.append("--trace-fork-before-exec=true")
    return args


def launch_command(nsys: str, session: str, command: Sequence[str], *, trace: str = GPU_TRACE,
                   cuda_graph_trace: str = "node", fork_before_exec: bool = True, cpu_samples: bool = False) -> list:
    """`nsys launch`: start COMMAND with nsys's injection in a named session, recording nothing until
    `nsys start --session` (every process of the session is recorded from then until `nsys stop`)."""
    return [nsys, "launch", f"--session-new={session}", *_trace_flags(trace, cuda_graph_trace, fork_before_exec),
            *(["--python-sampling=true"] if cpu_samples else []), "--wait=all", *command]


def start_command(nsys: str, session: str, output_base, cpu_samples: bool = False) -> list:
    return [nsys, "start", f"--session={session}", *_sample_flags(cpu_samples), "--cpuctxsw=none", "-o",
            str(output_base)]


def stop_command(nsys: str, session: str) -> list:
    return [nsys, "stop", f"--session={session}"]


def _call(cmd: list, what: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run `cmd` with its output captured; ProfattrError when it cannot start or runs past `timeout_s`."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProfattrError(f"{what} took longer than {timeout_s:.0f} s: {' '.join(cmd)}") from None
    except OSError as exc:
        raise ProfattrError(f"{what} could not start ({exc}): {' '.join(cmd)}") from None


def session_call(cmd: list, timeout_s: float = 300) -> str:
    """Run `nsys start` / `nsys stop`; ProfattrError with nsys's own words when it fails."""
    out = _call(cmd, f"`{' '.join(cmd[1:3])}`", timeout_s)
    text = (out.stdout + "\n" + out.stderr).replace("\r", "\n")
    if out.returncode != 0:
        last = [ln.strip() for ln in text.splitlines() if ln.strip()][-1:] or ["no output"]
        raise ProfattrError(f"`nsys {cmd[1]}` failed (exit {out.returncode}: {last[0]})")
    return text


def export_command(nsys: str, report, out) -> list:
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(report)]


def import_command(importer: str, qdstrm, out) -> list:
    return [importer, "-i", str(qdstrm), "-o", str(out)]


def _nsys_path(nsys) -> str:
    if isinstance(nsys, Nsys):
        return nsys.path
    if nsys:
        return str(nsys)
    return find_nsys().path


def importer_too_old(text: str, qdstrm_name: str = "the .qdstrm") -> str | None:
    """The one-line explanation when `text` (importer or nsys output) shows a CUDA runtime call this nsys cannot
    decode; None otherwise."""
    found = UNKNOWN_RUNTIME_API.search(text or "")
    if not found:
        return None
    return (f"{IMPORTER_NAME} stopped at \"Unknown runtime API function index: {found.group(1)}\": this nsys is too "
            "old for the CUDA runtime that was traced; use a newer Nsight Systems, or keep such launches out of the "
            f"profiled window (e.g. the workload's --grouped-kernel bmm); {qdstrm_name} is kept")


def _run_tool(cmd: list, what: str, out_path: Path, timeout_s: float, diagnose=None) -> None:
    """Run a tool that must write `out_path`; ProfattrError with its last error line when it does not.
    `diagnose(output) -> message or None` turns a known failure into its own message."""
    proc = _call(cmd, what, timeout_s)
    known = diagnose(proc.stdout + "\n" + proc.stderr) if diagnose else None
    if known:
        raise ProfattrError(known)
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).replace("\r", "\n").splitlines()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    if proc.returncode != 0 or errors or not out_path.exists():
        detail = (errors or [ln for ln in lines if ln] or ["no output"])[-1]
        raise ProfattrError(f"{what} failed (exit {proc.returncode}: {detail}); command: {' '.join(cmd)}")


def export_sqlite(report, out=None, nsys=None, force: bool = False, timeout_s: float = 3600) -> Path:
    """Export `report` (.nsys-rep) to SQLite at `out` (default: beside it, .sqlite); returns the path.

    Writes to a temporary name first and renames, so an interrupted export never leaves a half-written file under
    the final name. Refuses to replace an existing `out` unless `force`."""
    report = Path(report)
    out = Path(out) if out else report.with_suffix(".sqlite")
    if not report.exists():
        raise ProfattrError(f"{report}: no such report to export")
    if out.exists() and not force:
        raise ProfattrError(f"{out} exists; pass --force to export again")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        partial.unlink()
    cmd = export_command(_nsys_path(nsys), report, partial)
    try:
        with progress.stage(f"nsys export {report.name}"):
            _run_tool(cmd, "nsys export", partial, timeout_s)
        os.replace(partial, out)
    finally:
        if partial.exists():
            partial.unlink()
    return out


def import_qdstrm(qdstrm, importer: str | None = None, out=None, force: bool = False,
                  timeout_s: float = 3600) -> Path:
    """Turn `NAME.qdstrm` into `NAME.nsys-rep` (or `out`) with QdstrmImporter; returns the report path."""
    qdstrm = Path(qdstrm)
    out = Path(out) if out else qdstrm.with_suffix(".nsys-rep")
    if not qdstrm.exists():
        raise ProfattrError(f"{qdstrm}: no such file")
    if out.exists() and not force:
        raise ProfattrError(f"{out} exists; pass --force to import {qdstrm.name} again")
    importer = importer or find_importer(find_nsys().path)
    if not importer:
        raise ProfattrError(f"no {IMPORTER_NAME} found to turn {qdstrm.name} into a report: it lives in "
                            "host-linux-x64/ of a full Nsight Systems install; run this where `scripts/install-nsys` "
                            "has installed one, or set PROFATTR_QDSTRM_IMPORTER")
    partial = out.with_name(out.stem + ".partial" + out.suffix)  # the importer insists on .nsys-rep
    if partial.exists():
        partial.unlink()
    try:
        # a stream the importer cannot fully decode is a failure, even where it still writes a (partial) report
        _run_tool(import_command(importer, qdstrm, partial), IMPORTER_NAME, partial, timeout_s,
                  diagnose=lambda output: importer_too_old(output, qdstrm.name))
        os.replace(partial, out)
    finally:
        if partial.exists():
            partial.unlink()
    return out
