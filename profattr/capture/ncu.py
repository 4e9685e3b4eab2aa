"""Nsight Compute as a tool: find `ncu`, build the command that profiles a few chosen kernels inside the target's
cudaProfilerStart/Stop window, and export a report's counters as CSV (`ncu --import R --csv --page raw`).

The counters that decide a kernel's bound come from four sections: SpeedOfLight (SM and memory throughput, % of
peak), MemoryWorkloadAnalysis (DRAM bytes and throughput), LaunchStats (grid, block, registers, waves per SM) and
Occupancy (achieved occupancy).
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

from profattr.errors import ProfattrError

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "LaunchStats", "Occupancy")
HOW_TO_GET = ("install Nsight Compute (it comes with the CUDA toolkit, or from developer.nvidia.com/nsight-compute) "
              "and pass --ncu PATH or set PROFATTR_NCU")


@dataclass(frozen=True)
class Ncu:
    path: str
    version: str
    source: str


def candidates(explicit: str | None = None) -> list:
    found = []
    if explicit:
        found.append((explicit, "--ncu"))
    if os.environ.get("PROFATTR_NCU"):
        found.append((os.environ["PROFATTR_NCU"], "$PROFATTR_NCU"))
    if shutil.which("ncu"):
        found.append((shutil.which("ncu"), "PATH"))
    for pattern, source in (("/opt/nvidia/nsight-compute/*/ncu", "Nsight Compute install"),
                            ("/usr/local/cuda*/bin/ncu", "CUDA toolkit")):
        for path in sorted(glob.glob(pattern), reverse=True):
            found.append((path, source))
    return found


def find_ncu(explicit: str | None = None) -> Ncu:
    """The ncu to use; ProfattrError saying where to get one when there is none (an explicit path must work)."""
    for path, source in candidates(explicit):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            if source in ("--ncu", "$PROFATTR_NCU"):
                raise ProfattrError(f"ncu given by {source} ({path}) is not an executable file; {HOW_TO_GET}")
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            if source in ("--ncu", "$PROFATTR_NCU"):
                raise ProfattrError(f"{path} does not run ({exc}); {HOW_TO_GET}") from None
            continue
        match = re.search(r"Version\s+(\S+)", out.stdout + out.stderr)
        return Ncu(path=path, version=match.group(1) if match else "unknown", source=source)
    raise ProfattrError(f"ncu (Nsight Compute CLI) not found on PATH, in /opt/nvidia/nsight-compute/*/ or "
                        f"/usr/local/cuda*/bin; {HOW_TO_GET}")


def kernel_regex(names: Sequence[str]) -> str:
    """An ncu `regex:` value matching exactly these kernel function names."""
    if not names:
        raise ProfattrError("no kernels to drill: the selection is empty")
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def profile_command(ncu: str, output_base, command: Sequence[str], kernels: str, launch_count: int,
                    launch_skip: int = 0, sections: Sequence[str] = SECTIONS, graph_profiling: str = "node",
                    from_start: bool = False, kernel_base: str = "function") -> list:
    """`ncu ... -o OUTPUT_BASE COMMAND...`: profile the kernels whose function name matches `kernels` (a regex),
    `launch_count` launches in all after skipping `launch_skip`, only between cudaProfilerStart and Stop unless
    `from_start`; replayed CUDA-graph kernels are profiled as nodes (`graph_profiling` node)."""
    args = [ncu, "--target-processes", "all", "--profile-from-start", "on" if from_start else "off",
            "--kernel-name-base", kernel_base, "--kernel-name", f"regex:{kernels}",
            "--launch-skip", str(int(launch_skip)), "--launch-count", str(int(launch_count)),
            "--graph-profiling", graph_profiling]
    for section in sections:
        args += ["--section", section]
    return args + ["-f", "-o", str(output_base), *command]


def export_command(ncu: str, report) -> list:
    return [ncu, "--import", str(report), "--csv", "--page", "raw"]


def export_csv(ncu: str, report, out, timeout_s: float = 600) -> Path:
    """Write `ncu --import REPORT --csv --page raw` into `out` (atomically); returns it."""
    report, out = Path(report), Path(out)
    partial = out.with_name(out.name + ".partial")
    try:
        with partial.open("w") as fh:
            proc = subprocess.run(export_command(ncu, report), stdout=fh, stderr=subprocess.PIPE, text=True,
                                  timeout=timeout_s)
        if proc.returncode != 0 or partial.stat().st_size == 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ProfattrError(f"ncu --import {report.name} --csv failed (exit {proc.returncode}: {last})")
        os.replace(partial, out)
    except subprocess.TimeoutExpired:
        raise ProfattrError(f"ncu --import {report.name} took longer than {timeout_s:.0f} s") from None
    finally:
        if partial.exists():
            partial.unlink()
    return out
