"""The run.json format as profattr reads it: each field's kind (`FIELDS`) and `validate`, which checks a parsed file
against them (a wrong kind or range is one ProfattrError naming the file and the field)."""
from __future__ import annotations

import json
import math
from typing import Any

from profattr.errors import ProfattrError

SCHEMA_PREFIX = "profattr.run/"
WHAT = "a run.json (NAME.run.json, written by `profattr capture`)"

# dotted field -> kind: str, bool, list, dict, num (a finite number), num>=0, int, int>=0, int>0
FIELDS = {
    "schema": "str", "name": "str", "status": "str", "target": "str", "profiler": "str", "created_utc": "str",
    "model": "str", "tp": "int>0", "driver_version": "str", "notes": "list", "gpus": "list",
    "capture": "dict", "capture.trace": "str", "capture.capture_range": "str", "capture.cuda_graph_trace": "str",
    "capture.duration_s": "num>=0",
    "commands": "dict", "commands.profile": "list", "commands.target": "list",
    "nsys": "dict", "nsys.version": "str", "ncu": "dict", "ncu.version": "str",
    "packages": "dict", "backend": "dict", "backend.requested": "str", "backend.sglang": "str",
    "model_config": "dict",
    "server": "dict", "server.args": "list", "server.launcher": "list", "server.port": "int>=0",
    "server_log": "dict", "server_log.server_args": "dict", "server_log.resolved": "dict",
    "server_log.cuda_graph": "dict", "server_log.cuda_graph.batch_sizes": "list", "server_log.events": "dict",
    "server_log.counts": "dict", "server_log.in_window": "dict", "server_log.default_kernel_configs": "list",
    "requests": "dict", "requests.batch": "int>0", "requests.input_len": "int>=0",
    "requests.max_new_tokens": "int>=0", "requests.warmup_rounds": "int>=0", "requests.timed_rounds": "int>=0",
    "window": "dict", "window.steps_requested": "int>=0", "window.opened_utc_s": "num>=0",
    "window.closed_utc_s": "num>=0", "window.trace_files": "list",
    "timing": "dict", "timing.ms_per_token_unprofiled": "num>=0", "timing.ms_per_token_profiled": "num>=0",
    "timing.ms_per_token_profiled_client": "num>=0", "timing.profiled_per_device": "list", "timing.unprofiled": "dict",
    "workload": "dict", "workload.schema": "str", "workload.batch": "int>0", "workload.tp": "int>0",
    "workload.rank": "int>=0", "workload.context_len": "int>=0", "workload.dtype_bytes": "int>0",
    "workload.steps_profiled": "int>=0", "workload.warmup_steps": "int>=0", "workload.mode": "str",
    "workload.params": "dict", "workload.params.total": "int>=0", "workload.params.active_per_token": "int>=0",
    "workload.params.per_rank_active": "int>=0", "workload.params.by_component": "dict", "workload.config": "dict",
    "workload.kv_cache_bytes_per_token": "int>=0", "workload.kv_cache_bytes_read_per_step": "int>=0",
    "workload.ms_per_token_unprofiled": "dict", "workload.nvtx": "dict",
    "check": "dict", "check.status": "str", "check.findings": "list",
    "files": "dict", "files.sqlite": "str", "files.report": "str", "files.run": "str", "files.log": "str",
    "files.traces": "list", "files.ncu_csv": "str", "files.ncu_report": "str", "files.workload": "str",
    "drill": "dict", "drill.of": "str", "drill.kernel_regex": "str", "drill.kernel_base": "str",
    "drill.families": "list", "drill.launch_count": "int>=0", "drill.steps": "int>=0", "drill.graphs": "str",
    "session": "dict", "session.name": "str", "session.windows": "list", "session.batches": "list",
    "session.index": "int>=0", "session.replicate": "int>=0", "session.replicates": "int>=0",
}
_KIND_TEXT = {"str": "text", "bool": "true or false", "list": "a JSON array", "dict": "a JSON object",
              "num": "a number", "num>=0": "a number, 0 or more", "int": "an integer",
              "int>=0": "an integer, 0 or more", "int>0": "a positive integer"}


def fits(value: Any, kind: str) -> bool:
    """Whether `value` is of `kind` (a FIELDS kind)."""
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    if kind == "dict":
        return isinstance(value, dict)
    if isinstance(value, bool):
        return False
    if kind.startswith("num"):
        return isinstance(value, (int, float)) and math.isfinite(value) and (kind == "num" or value >= 0)
    if not isinstance(value, int):
        return False
    return kind == "int" or (value >= 0 if kind == "int>=0" else value > 0)


def value_at(run: Any, field: str) -> Any:
    """The value of a dotted `field` (`server_log.resolved`) in a parsed run.json; None when it or a parent is
    absent, null or not an object (a wrong parent was reported by `validate` first)."""
    value = run
    for part in field.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else ("an object" if isinstance(value, dict)
                                                                         else "an array")
    return text if len(text) <= 40 else text[:39] + "…"


def validate(run: Any, path) -> dict:
    """`run` (the parsed file) when every field profattr reads has its kind and range; else one ProfattrError
    naming the file, the field, what it holds and what it should."""
    if not isinstance(run, dict):
        raise ProfattrError(f"{path}: expected a JSON object (profattr.run/1), got {_shown(run)}; give the run.json "
                            "`profattr capture` wrote")
    schema = run.get("schema")
    if schema is not None and not (isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX)):
        raise ProfattrError(f"{path}: not a profattr run file (schema {_shown(schema)}, profattr.run/1 expected)")
    for field, kind in FIELDS.items():
        value = value_at(run, field)
        if value is not None and not fits(value, kind):
            raise ProfattrError(f"{path}: field {field} is {_shown(value)}, expected {_KIND_TEXT[kind]}; correct it "
                                "in the run.json (or capture again) so that it says what the capture ran")
    return run
