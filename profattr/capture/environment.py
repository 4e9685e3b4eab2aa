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
    return gpus, None if gpus else "nvidia-smi listed no GPU"


def _int(text: str):
    try:
        return int(float(text))
    except ValueError:
        return None


def host() -> dict:
    """Platform and Python (no host name: run.json files get shared and committed)."""
    return {"platform": platform.platform(), "python": sys.version.split()[0], "python_executable": sys.executable}
