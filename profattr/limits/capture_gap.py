"""The gap of one capture to the hardware limit: its budget, its GPU (matched to a preset unless given) and its
model (given, or the workload / served model its run.json records), handed to compute_gap (gap.py). What `profattr
gap` and the library's `profattr.gap` call."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from profattr.errors import ProfattrError, warn
from profattr.limits.model import DEFAULT_CONTEXT_LEN


def capture_gap(capture, model: Optional[str] = None, quant: Optional[str] = None, hardware: Optional[str] = None,
                tp: Optional[int] = None, context_len: Optional[int] = None, run_json=None,
                kv_dtype: Optional[str] = None, steps: str = "auto", rules: Sequence = (),
                bandwidth: str = "peak") -> dict:
    """The gap result (profattr.gap/1 dict) of `capture` (.sqlite or .nsys-rep); `bandwidth` peak or achievable."""
    from profattr.attribute.budget import compute_budget
    from profattr.limits.gap import budget_gpus, compute_gap
    from profattr.limits.hardware import hardware_presets, load_hardware, match_hardware
    from profattr.trace.reader import resolve_capture

    if bandwidth not in ("peak", "achievable"):
        raise ProfattrError(f"bandwidth {bandwidth!r}: expected peak or achievable")
    capture = Path(capture)
    run_json = Path(run_json) if run_json is not None else None
    sqlite_path = Path(resolve_capture(capture))
    budget = compute_budget(sqlite_path, steps=steps, rules=rules).to_dict()
    gpus = budget_gpus(budget)  # the GPUs the budget read from the capture: it is not opened again
    if hardware is None:
        names = {str(g.get("name") or "") for g in gpus.values()}
        matched = {match_hardware(n) for n in names if n}
        if len(matched) != 1 or None in matched:
            raise ProfattrError(f"cannot tell the hardware from the capture (GPUs: {', '.join(sorted(names)) or 'none'}"
                                f"); pass --hardware, one of: {', '.join(hardware_presets())}")
        hardware = matched.pop()
    hw = load_hardware(hardware)
    spec = _gap_model(capture, model, quant, tp, context_len, run_json, len(budget.get("devices", [])), hw,
                      kv_dtype)
    for text in spec.warnings:  # e.g. an ignore pattern of quantization_config that matches no module
        warn(text)
    fraction = 1.0 if bandwidth == "peak" else hw.achievable_bandwidth_fraction.value
    return compute_gap(budget, spec, hw, capture_gpus=gpus, bandwidth_fraction=fraction)


def _gap_model(capture: Path, model: Optional[str], quant, tp, context_len, run_json, n_devices, hw, kv_dtype):
    """ModelSpec for a capture: --model if given, else the built-in workload's record or the served model's
    config.json that run.json keeps."""
    from profattr.limits.model import load_model
    from profattr.limits.served import spec_from_run
    from profattr.limits.workload import load_run_json, served_defaults, spec_from_workload
    from profattr.trace.reader import run_json_path

    path = Path(run_json) if run_json else run_json_path(capture)
    run = load_run_json(path) if path.exists() else None
    if model:
        recorded = served_defaults(run) if run else {}
        return load_model(model, tp=tp or recorded.get("tp") or n_devices or 1, quant=quant,
                          context_len=context_len if context_len is not None else
                          recorded.get("context_len", DEFAULT_CONTEXT_LEN), dsa_runs=hw.dsa_runs,
                          kv_dtype=kv_dtype, batch=recorded.get("batch", 1))
    if run is None:
        raise ProfattrError(f"no model for {capture.name}: {path.name} not found; pass --model (a preset or "
                            "config.json) or --run-json")
    record = run.workload
    if not run.has("workload"):
        if quant:
            from profattr.limits.model import quant_schemes

            if quant not in quant_schemes():
                raise ProfattrError(f"unknown quantization {quant!r}; valid: {', '.join(quant_schemes())}")
        return spec_from_run(run, source=str(path), tp=tp, context_len=context_len, kv_dtype=kv_dtype,
                             dsa_runs=hw.dsa_runs, quant=quant)
    spec = spec_from_workload(record, context_len=context_len, source=str(path))
    if tp and tp != spec.tp:
        raise ProfattrError(f"--tp {tp} disagrees with the workload's recorded tp {spec.tp}")
    return spec


