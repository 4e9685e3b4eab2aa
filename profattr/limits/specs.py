"""Load the TOML data files under profattr/limits/specs/ (models, hardware, quantization, sharding, categories)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Dict

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - 3.9/3.10
    import tomli as _toml

SPECS_DIR = Path(__file__).resolve().parent / "specs"


@lru_cache(maxsize=None)
def load_toml(relative_path: str) -> Dict[str, Any]:
    """Parsed contents of specs/<relative_path> (cached; callers must not mutate it)."""
    with open(SPECS_DIR / relative_path, "rb") as handle:
        return _toml.load(handle)


def preset_ids(kind: str) -> Dict[str, str]:
    """Map every id and alias of the presets in specs/<kind>/ (models or hardware) to its file name."""
    names: Dict[str, str] = {}
    for path in sorted((SPECS_DIR / kind).glob("*.toml")):
        data = load_toml(f"{kind}/{path.name}")
        for name in [data.get("id", path.stem), *data.get("aliases", [])]:
            names[str(name).lower()] = path.name
    return names
