"""`profattr doctor`: can this machine make and read captures? Each finding says what is there, and for what is
missing, how to get it. The decisive one is a real capture: a few seconds of `cpu_smoke` under nsys, exported,
with its NVTX ranges counted in the export."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from profattr.capture import environment
from profattr.tools import nsys as nsys_tool
from profattr.check import FAIL, PASS, SKIP, WARN, Finding
from profattr.capture.sglang import SGLANG_VERSION
from profattr.errors import ProfattrError
from profattr.trace.reader import load_query, open_export

NVTX_RECORDED_BELOW = (0, 2, 12)  # nvtx 0.2.12+ ranges are not recorded by nsys 2023.4.4
SMOKE_STEPS = 20
CAPTURE_TIMEOUT_S = 120
HOW = {
    "torch": "pip install torch (needed by --workload moe-decode)",
    "sglang": f"pip install 'sglang=={SGLANG_VERSION}' (needed by SGLang captures, --model)",
    "flashinfer": "pip install flashinfer-python (SGLang's flashinfer_* MoE runner backends)",
    "triton": "comes with torch on Linux (SGLang's triton MoE runner backends)",
}


def _version_tuple(text: str | None) -> tuple:
    parts = []
    for piece in (text or "").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_nsys(explicit: str | None) -> tuple:
    """(Finding, Nsys or None)."""
    try:
        tool = nsys_tool.find_nsys(explicit)
    except ProfattrError as exc:
        return Finding("nsys", FAIL, exc.format_message()), None
    text = f"{tool.path} ({tool.source}), version {tool.version}"
    if tool.version_tuple[:3] < nsys_tool.parse_version(nsys_tool.TESTED_VERSION):
        return Finding("nsys", WARN, f"{text}: older than {nsys_tool.TESTED_VERSION}, the version profattr is "
                       "tested with", {"path": tool.path, "version": tool.version}), tool
    return Finding("nsys", PASS, text, {"path": tool.path, "version": tool.version, "source": tool.source}), tool


def check_importer(tool) -> Finding:
    if tool is None:
        return Finding("importer", SKIP, "no nsys")
    if tool.importer:
        return Finding("importer", PASS, f"{tool.importer} turns .qdstrm streams into .nsys-rep reports",
                       {"path": tool.importer})
    return Finding("importer", WARN, f"no {nsys_tool.IMPORTER_NAME} beside {tool.path}: captures here end as "
                   ".qdstrm; finish them with `profattr capture --finish DIR` on a machine with a full Nsight "
                   "Systems (scripts/install-nsys installs one), or set PROFATTR_QDSTRM_IMPORTER")


def check_nvtx_package(versions: dict) -> Finding:
    version = versions.get("nvtx")
    if not version:
        return Finding("nvtx", FAIL, "Python package nvtx missing (profattr's NVTX ranges need it); "
                       "pip install 'nvtx<0.2.12'")
    if _version_tuple(version) >= NVTX_RECORDED_BELOW:
        return Finding("nvtx", WARN, f"nvtx {version}: nsys 2023.4.4 records no ranges from nvtx 0.2.12 and "
                       "later (newer nsys may); pip install 'nvtx<0.2.12' to be sure", {"version": version})
    return Finding("nvtx", PASS, f"nvtx {version}", {"version": version})


def smoke_capture(tool, workdir: Path, steps: int = SMOKE_STEPS, timeout_s: float = CAPTURE_TIMEOUT_S) -> Finding:
    """Profile `python -m profattr.workloads.cpu_smoke` with NVTX tracing, export it, and compare the ranges in the
    export with the ranges the program says it emitted."""
    if tool is None:
        return Finding("capture", SKIP, "no nsys")
    base = workdir / "doctor"
    meta = workdir / "smoke.json"
    cmd = nsys_tool.profile_command(tool.path, base, [sys.executable, "-m", "profattr.workloads.cpu_smoke",
                                                      "--steps", str(steps), "--meta-out", str(meta)],
                                    trace="nvtx", capture_range="none", fork_before_exec=False)
    started = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Finding("capture", FAIL, f"nsys profile of cpu_smoke took over {timeout_s:.0f} s")
    except OSError as exc:
        return Finding("capture", FAIL, f"nsys profile could not start: {exc}")
    seconds = time.monotonic() - started
    report, qdstrm = base.with_suffix(".nsys-rep"), base.with_suffix(".qdstrm")
    if out.returncode != 0 or not (report.exists() or qdstrm.exists()) or not meta.exists():
        tail = " ".join((out.stdout + out.stderr).replace("\r", "\n").split()[-25:])
        return Finding("capture", FAIL, f"nsys profile of cpu_smoke failed (exit {out.returncode}): {tail}")
    if not report.exists():
        if not tool.importer:
            return Finding("capture", WARN, f"nsys wrote {qdstrm.name} in {seconds:.1f} s but there is no importer "
                           "here to read it; the NVTX ranges could not be counted")
        try:
            nsys_tool.import_qdstrm(qdstrm, tool.importer, report)
        except ProfattrError as exc:
            return Finding("capture", FAIL, exc.format_message())
    try:
        sqlite = nsys_tool.export_sqlite(report, nsys=tool)
        with open_export(sqlite) as export:
            types = dict(export.query(load_query("check_nvtx_event_types"))) if export.has("NVTX_EVENTS") else {}
    except ProfattrError as exc:
        return Finding("capture", FAIL, exc.format_message())
    emitted = sum(json.loads(meta.read_text())["ranges"].values())
    recorded = types.get(59, 0) + types.get(60, 0)
    data = {"seconds": round(seconds, 1), "ranges_emitted": emitted, "ranges_recorded": recorded}
    if recorded == emitted:
        return Finding("capture", PASS, f"real capture of cpu_smoke: {recorded} of {emitted} NVTX ranges recorded "
                       f"and exported ({seconds:.1f} s)", data)
    version = environment.package_versions().get("nvtx")
    why = (f"the nvtx package {version} emits ranges this nsys does not record; pip install 'nvtx<0.2.12'"
           if recorded == 0 and types.get(75) else "see the report")
    return Finding("capture", FAIL, f"real capture of cpu_smoke: {recorded} of {emitted} NVTX ranges recorded; "
                   f"{why}", data)


def check_gpu() -> Finding:
    gpus, error = environment.nvidia_smi_gpus()
    if not gpus:
        return Finding("gpu", WARN, f"no GPU visible ({error}): SGLang and workload captures need an NVIDIA GPU and "
                       "driver; checking and analysing captures works without one")
    names = ", ".join(sorted({g["name"] for g in gpus}))
    return Finding("gpu", PASS, f"{len(gpus)} GPU(s): {names}; driver {gpus[0]['driver_version']}", {"gpus": gpus})


def check_packages(versions: dict) -> list:
    findings = []
    for key in ("torch", "sglang", "flashinfer", "triton"):
        version = versions.get(key)
        if version:
            findings.append(Finding(key, PASS, f"{key} {version}", {"version": version}))
        else:
            findings.append(Finding(key, WARN, f"{key} not installed: {HOW[key]}"))
    return findings


def run_doctor(nsys_explicit: str | None = None, capture: bool = True) -> list:
    """Every doctor finding, in order: nsys, importer, nvtx, capture, gpu, torch, sglang, flashinfer, triton."""
    versions = environment.package_versions()
    nsys_finding, tool = check_nsys(nsys_explicit)
    findings = [nsys_finding, check_importer(tool), check_nvtx_package(versions)]
    if capture:
        with tempfile.TemporaryDirectory(prefix="profattr-doctor-") as tmp:
            findings.append(smoke_capture(tool, Path(tmp)))
    else:
        findings.append(Finding("capture", SKIP, "skipped (--skip-capture)"))
    findings.append(check_gpu())
    findings += check_packages(versions)
    return findings
