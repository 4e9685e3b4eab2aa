"""SGLang's names, as data (sglang.toml): the version profattr is checked against, its MoE runner backends, the
short names users type, and the kernel families that fingerprint each backend. capture/ drives SGLang with them;
check/ verifies a capture ran the backend it says."""
from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

_DATA = tomllib.loads(Path(__file__).with_name("sglang.toml").read_text(encoding="utf-8"))

SGLANG_VERSION: str = _DATA["version"]
MOE_RUNNER_BACKENDS: tuple = tuple(_DATA["moe_runner_backends"]["names"])
ALIASES: dict = dict(_DATA["aliases"])
VERBATIM_PREFIX = "sglang:"
# backend -> (families of its expert GEMM kernels, families of its marker kernels)
BACKEND_FAMILIES: dict = {name: (tuple(v["gemm"]), tuple(v["markers"]))
                          for name, v in _DATA["backend_families"].items()}
