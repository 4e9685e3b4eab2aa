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

_KV_DTYPES = {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp16": "bf16", "float16": "bf16",
              "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8": "fp8"}


def quant_of_config(config: Mapping[str, Any]) -> Tuple[str, str]:
    """(quantization scheme, why) of a checkpoint from its config.json's `quantization_config`."""
    qc = config.get("quantization_config")
    if not qc:
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        if dtype in ("bfloat16", "float16"):
            return "bf16", f"no quantization_config; weights {dtype}"
        raise ProfattrError(f"config.json has no quantization_config and dtype {dtype!r}; pass --quant "
                            f"({', '.join(quant_schemes())})")
    if not isinstance(qc, Mapping):
        raise ProfattrError("config.json: quantization_config is not an object; pass --quant")
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        return "fp8", f"quantization_config: quant_method fp8{f', blocks {block}' if block else ''}"
    algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "").upper()
    if method == "modelopt" and algo == "FP8":
        return "fp8", "quantization_config: modelopt FP8"
    if method in ("modelopt", "modelopt_fp4") and algo == "NVFP4":
        return "nvfp4", ("quantization_config: modelopt NVFP4; assumed the experts-only layout (routed experts "
                         "NVFP4, the rest BF16); pass --quant nvfp4-modelopt if the dense MLP is FP8")
    raise ProfattrError(f"config.json: quantization {method or '?'} {algo} is not modelled; pass --model with the "
                        f"config.json and --quant ({', '.join(quant_schemes())})")


def _server_arg(run: Mapping[str, Any], key: str) -> Optional[str]:
    args = ((run.get("server_log") or {}).get("server_args") or {})
    if args.get(key) is not None:
        return str(args[key])
    argv: List[str] = [str(a) for a in ((run.get("server") or {}).get("args") or [])]
    flag = "--" + key.replace("_", "-")
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def kv_dtype_of(run: Mapping[str, Any], weights: str) -> Tuple[str, str]:
    """(KV cache dtype, why) of a served run: --kv-cache-dtype, `auto` meaning the model's activation dtype."""
    value = _server_arg(run, "kv_cache_dtype") or "auto"
    if value not in _KV_DTYPES:
        raise ProfattrError(f"run.json: KV cache dtype {value!r} is not modelled (known: "
                            f"{', '.join(sorted(_KV_DTYPES))}); pass --model with a config.json and --kv-dtype")
    return _KV_DTYPES[value] or "bf16", f"--kv-cache-dtype {value}"


def spec_from_run(run: Mapping[str, Any], *, source: str, tp: Optional[int], context_len: Optional[int],
                  kv_dtype: Optional[str], dsa_runs: bool) -> ModelSpec:
    """ModelSpec of the model a served capture ran, from its run.json alone."""
    config = run.get("model_config")
    if not isinstance(config, dict) or not config:
        served = f" (it served {run['model']})" if run.get("model") else ""
        raise ProfattrError(f"{source}: records neither a `workload` nor the model's config.json{served}; pass "
                            "--model (a preset or config.json) and --quant")
    validate_config(config, f"{source} model_config")  # an impossible architecture: one error naming the field
    recorded_tp = run.get("tp") if isinstance(run.get("tp"), int) and run["tp"] > 0 else None
    if tp and recorded_tp and tp != recorded_tp:
        raise ProfattrError(f"--tp {tp} disagrees with the tp {recorded_tp} {source} recorded")
    requests = run.get("requests") or {}
    batch = requests.get("batch") if isinstance(requests.get("batch"), int) and requests["batch"] > 0 else 1
    if context_len is None:
        if isinstance(requests.get("input_len"), int) and isinstance(requests.get("max_new_tokens"), int):
            context_len = requests["input_len"] + requests["max_new_tokens"] // 2
        else:
            raise ProfattrError(f"{source}: no request shape (requests.input_len, max_new_tokens); pass --context")
    quant, quant_why = quant_of_config(config)
    kv_why = "--kv-dtype"
    if kv_dtype is None:
        kv_dtype, kv_why = kv_dtype_of(run, quant)
    backend = _server_arg(run, "attention_backend")
    if backend in ("dsa", "nsa"):
        dsa_runs = True
    try:
        spec = spec_from_config(config, quant=quant, tp=tp or recorded_tp or 1, context_len=context_len,
                                dsa_runs=dsa_runs, kv_dtype=kv_dtype, batch=batch,
                                model_id=str(config.get("_name_or_path") or run.get("model") or ""),
                                name=str(config.get("model_type")), source=f"{source} model_config")
    except ProfattrError as exc:
        raise ProfattrError(f"{source}: {exc}") from None
    notes = (f"weights {quant} ({quant_why}); KV cache {kv_dtype} ({kv_why}); batch {batch}; context "
             f"{context_len} tokens (mean over the decoded tokens)",)
    return replace(spec, notes=spec.notes + notes)

