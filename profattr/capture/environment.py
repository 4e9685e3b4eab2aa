"""Facts about the machine a capture ran on, for run.json and `profattr doctor`: GPUs and driver (nvidia-smi),
package versions, host. Every probe is cheap and never fails: a missing tool gives an empty answer."""
from __future__ import annotations

import platform
import shutil
import subprocess
import sys

# distribution names to report; the first installed name of each tuple wins
PACKAGES = {
    "torch": ("torch",),
    "sglang": ("sglang",),
    "sglang_kernel": ("sglang-kernel", "sgl-kernel"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "triton": ("triton",),
    "nvtx": ("nvtx",),
    "profattr": ("profattr",),
}
GPU_FIELDS = ("index", "name", "driver_version", "memory.total", "pci.bus_id", "uuid")
# clocks (MHz) and limits when the capture started: a confound when two captures are compared
CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.limit", "persistence_mode")


def package_versions() -> dict:
    """{"torch": "2.11.0+cu130", "sglang": None, ...}: installed versions, None when absent."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for key, names in PACKAGES.items():
        out[key] = None
        for name in names:
            try:
                out[key] = version(name)
                break
            except PackageNotFoundError:
                continue
    if out["profattr"] is None:  # running from a checkout that is not installed
        from profattr import __version__
        out["profattr"] = __version__
    return out


def nvidia_smi_gpus(timeout_s: float = 20) -> tuple:
    """(gpus, error): the GPUs nvidia-smi lists (dicts with index, name, driver_version, memory_total_mib,
    pci_bus_id, uuid), or an empty list and why."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return [], "nvidia-smi not found"
    cmd = [exe, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return [], f"nvidia-smi exit {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}"
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(GPU_FIELDS):
            continue
        row = dict(zip(GPU_FIELDS, parts))
        gpus.append({"index": int(row["index"]), "name": row["name"], "driver_version": row["driver_version"],
                     "memory_total_mib": _int(row["memory.total"]), "pci_bus_id": row["pci.bus_id"],
                     "uuid": row["uuid"]})
    _add_clocks(exe, gpus, timeout_s)
    return gpus, None if gpus else "nvidia-smi listed no GPU"


def _add_clocks(exe: str, gpus: list, timeout_s: float) -> None:
    """Each GPU's current and maximum clocks, power limit and persistence mode (missing values are left out)."""
    cmd = [exe, f"--query-gpu=index,{','.join(CLOCK_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return
    by_index = {g["index"]: g for g in gpus}
    for line in out.stdout.strip().splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(CLOCK_FIELDS) + 1 or _int(parts[0]) not in by_index:
            continue
        gpu = by_index[_int(parts[0])]
        for name, value in zip(CLOCK_FIELDS, parts[1:]):
            key = name.replace(".", "_") + ("_mhz" if name.startswith("clocks") else "_w" if name == "power.limit"
                                            else "")
            number = _int(value)
            gpu[key] = number if number is not None else (value if value and "N/A" not in value else None)


def _int(text: str):
    try:
        return int(float(text))
    except ValueError:
        return None


def host() -> dict:
    """Platform and Python (no host name: run.json files get shared and committed)."""
    return {"platform": platform.platform(), "python": sys.version.split()[0], "python_executable": sys.executable}
