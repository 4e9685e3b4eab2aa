"""What only an Nsight Systems export records about itself: its capture settings, NVTX event types, and the
diagnostics nsys wrote while recording (warnings such as a CUDA driver newer than this nsys supports)."""
from __future__ import annotations

from profattr.trace.reader import NVTX, load_query

DIAGNOSTICS = "DIAGNOSTIC_EVENT"
MIN_SEVERITY = 2  # ENUM_DIAGNOSTIC_SEVERITY_LEVEL: 1 info, 2 warning, 3 error


def traced_cuda(export) -> bool | None:
    """Whether CUDA was traced, from the capture settings nsys stored; None when they do not say."""
    if not export.has("META_DATA_CAPTURE"):
        return None
    values = {str(v).lower() for (v,) in export.query(load_query("check_cuda_traced"))}
    return ("true" in values) if values else None


def nvtx_event_types(export) -> dict | None:
    if not export.has(NVTX):
        return None
    return dict(export.query(load_query("check_nvtx_event_types")))


def diagnostics(export) -> list:
    """(severity, text) of nsys's warnings and errors during the capture, first ones first (at most 20)."""
    if not export.has(DIAGNOSTICS) or not {"severity", "text"} <= export.columns(DIAGNOSTICS):
        return []
    rows = export.query(load_query("check_diagnostics"), (MIN_SEVERITY,))
    return [(int(sev), str(text)) for sev, text in rows]
