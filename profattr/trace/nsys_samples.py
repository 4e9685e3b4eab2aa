"""CPU samples of an Nsight Systems export (`nsys profile --sample=process-tree`) as the reader's arrays.

COMPOSITE_EVENTS holds one row per sample (thread, time); SAMPLING_CALLCHAINS its call chain, one row per frame
(stackDepth 0 is the leaf; symbol and module are StringIds ids). Per sample: its leaf frame and the innermost Python
frame of its chain, where the chain has one (queries/cpu_sample_python_frames.sql says what counts as one). nsys
2024.2.3 records `--python-sampling` backtraces as NVTX marks whose frames the SQLite export leaves out, so there
the chains hold native frames only (the interpreter's, such as _PyEval_EvalFrameDefault).
"""
from __future__ import annotations

import numpy as np

from profattr.trace.nsys_sqlite import NsysTables, load_query

SAMPLES = "COMPOSITE_EVENTS"
CALLCHAINS = "SAMPLING_CALLCHAINS"
SAMPLE_COLUMNS = {"id", "start", "globalTid"}
CALLCHAIN_COLUMNS = {"id", "symbol", "module", "stackDepth"}
KEYS = ("tid", "start", "leaf_symbol", "leaf_module", "py_symbol", "py_module")


def has_samples(export: NsysTables) -> bool:
    return (SAMPLE_COLUMNS <= export.columns(SAMPLES)) and (CALLCHAIN_COLUMNS <= export.columns(CALLCHAINS))


def cpu_samples(export: NsysTables) -> dict | None:
    """Arrays tid, start, leaf_symbol, leaf_module, py_symbol, py_module (StringIds ids; -1 where the sample has no
    such frame), one entry per sample in id order; None without sampling tables."""
    if not has_samples(export):
        return None
    s = export.arrays(load_query("cpu_samples"), ["id", "tid", "start", "leaf_symbol", "leaf_module"],
                      max_rows=export.count(SAMPLES))
    py = export.arrays(load_query("cpu_sample_python_frames"), ["id", "symbol", "module", "depth"])
    py_symbol = np.full(len(s["id"]), -1, dtype=np.int64)
    py_module = np.full(len(s["id"]), -1, dtype=np.int64)
    if len(py["id"]) and len(s["id"]):
        pos = np.clip(np.searchsorted(s["id"], py["id"]), 0, len(s["id"]) - 1)  # s["id"] is sorted (ORDER BY)
        hit = s["id"][pos] == py["id"]
        py_symbol[pos[hit]] = py["symbol"][hit]
        py_module[pos[hit]] = py["module"][hit]
    return {"tid": s["tid"], "start": s["start"], "leaf_symbol": s["leaf_symbol"], "leaf_module": s["leaf_module"],
            "py_symbol": py_symbol, "py_module": py_module}


def sampling_period_ns(export: NsysTables) -> float | None:
    """The CPU sampling period in ns when the capture says it (a CPU-clock trigger); None otherwise."""
    if not {"name", "value"} <= export.columns("META_DATA_CAPTURE"):
        return None
    period, trigger = export.query(load_query("cpu_sampling_period"))[0]
    try:
        period = float(period)
    except (TypeError, ValueError):
        return None
    if str(trigger or "").strip().lower() != "software" or not 0 < period < 1e12:
        return None
    return period
