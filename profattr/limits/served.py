"""The model a served capture ran, from what `profattr capture` recorded in run.json: no model flags needed.

run.json keeps the checkpoint's config.json (`model_config`), the server's arguments (`server_log.server_args`,
else the command line in `server.args`), the tensor-parallel size and the request shape. From them: the
architecture (config.json), the weights' quantization (its `quantization_config`), the KV cache dtype
(--kv-cache-dtype), the batch (requests.batch) and the mean context over the decoded tokens.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Mapping, Optional, Tuple, Any

from profattr.errors import ProfattrError
from profattr.limits.model import ModelSpec, quant_schemes, spec_from_config, validate_config
from profattr.limits.quantization import Quantization, parse, scheme_name
from profattr.run_record import RunRecord

_KV_DTYPES = {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp16": "bf16", "float16": "bf16",
              "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8": "fp8"}


def quant_of_config(config: Mapping[str, Any]) -> Tuple[str, str, Optional[Quantization]]:
    """(scheme name, why, Quantization or None) of a checkpoint from its config.json's `quantization_config`
    (quantization.py reads it module by module); an unquantized BF16/FP16 checkpoint is the bf16 scheme."""
    quantization = parse(config)
    if quantization is not None:
        return scheme_name(quantization), quantization.describe(), quantization
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype in ("bfloat16", "float16"):
        return "bf16", f"no quantization_config; weights {dtype}", None
    raise ProfattrError(f"config.json has no quantization_config and dtype {dtype!r}; pass --quant "
                        f"({', '.join(quant_schemes())})")


def _server_arg(run: RunRecord, key: str) -> Optional[str]:
    """A server argument as SGLang logged it (server_args), else as given on its command line (`--key-with-dashes`)."""
    args = run.logged_server_args
    if args.get(key) is not None:
        return str(args[key])
    return run.server_flag("--" + key.replace("_", "-"))


def kv_dtype_of(run: RunRecord, weights: str, recorded: Optional[str] = None) -> Tuple[str, str]:
    """(KV cache dtype, why) of a served run: --kv-cache-dtype; `auto` means the KV cache dtype the checkpoint's
    quantization_config records (`recorded`), else the model's activation dtype."""
    value = _server_arg(run, "kv_cache_dtype") or "auto"
    if value not in _KV_DTYPES:
        raise ProfattrError(f"run.json: KV cache dtype {value!r} is not modelled (known: "
                            f"{', '.join(sorted(_KV_DTYPES))}); pass --model with a config.json and --kv-dtype")
    if _KV_DTYPES[value] is None and recorded:
        return recorded, f"--kv-cache-dtype {value}, the quantization_config's KV cache {recorded}"
    return _KV_DTYPES[value] or "bf16", f"--kv-cache-dtype {value}"


def spec_from_run(run: RunRecord, *, source: str, tp: Optional[int], context_len: Optional[int],
                  kv_dtype: Optional[str], dsa_runs: bool, quant: Optional[str] = None) -> ModelSpec:
    """ModelSpec of the model a served capture ran, from its run.json alone; `quant` (a scheme of quant.toml)
    overrides the quantization its config.json records."""
    config = run.model_config
    if not config:
        served = f" (it served {run.model})" if run.model else ""
        raise ProfattrError(f"{source}: records neither a `workload` nor the model's config.json{served}; pass "
                            "--model (a preset or config.json) and --quant")
    validate_config(config, f"{source} model_config")  # an impossible architecture: one error naming the field
    recorded_tp = run.tp
    if tp and recorded_tp and tp != recorded_tp:
        raise ProfattrError(f"--tp {tp} disagrees with the tp {recorded_tp} {source} recorded")
    batch = run.batch or 1  # not recorded: the model of one sequence
    if context_len is None:
        if run.input_len is not None and run.max_new_tokens is not None:
            context_len = run.input_len + run.max_new_tokens // 2
        else:
            raise ProfattrError(f"{source}: no request shape (requests.input_len, max_new_tokens); pass --context")
    override = quant
    if override:
        quant_why, quantization = f"--quant preset {override}, over the config.json's own", None
    else:
        try:
            quant, quant_why, quantization = quant_of_config(config)
        except ProfattrError as exc:
            raise ProfattrError(f"{source}: {exc}") from None
    kv_why = "--kv-dtype"
    if kv_dtype is None:
        kv_dtype, kv_why = kv_dtype_of(run, quant, quantization.kv_dtype if quantization else None)
    backend = _server_arg(run, "attention_backend")
    if backend in ("dsa", "nsa"):
        dsa_runs = True
    try:
        spec = spec_from_config(config, quant=quant, tp=tp or recorded_tp or 1, context_len=context_len,
                                dsa_runs=dsa_runs, kv_dtype=kv_dtype, batch=batch,
                                model_id=str(config.get("_name_or_path") or run.model or ""),
                                name=str(config.get("model_type")), source=f"{source} model_config",
                                quantization=quantization)
    except ProfattrError as exc:
        raise ProfattrError(f"{source}: {exc}") from None
    how = "quantization from config.json quantization_config" if quantization else "weights"
    notes = (f"{how} ({quant_why}); KV cache {kv_dtype} ({kv_why}); batch {batch}; context "
             f"{context_len} tokens (mean over the decoded tokens)",)
    if override:
        source_text = f"--quant preset {override} (overrides the config.json quantization_config)"
    elif quantization is None:
        source_text = f"config.json without quantization_config ({quant_why}): scheme {quant}"
    else:
        source_text = spec.quant_source
    return replace(spec, notes=spec.notes + notes, quant_source=source_text)

