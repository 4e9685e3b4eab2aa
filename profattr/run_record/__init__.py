"""NAME.run.json (`profattr.run/1`, written by `profattr capture` and `profattr drill`): the one reader every command
goes through, which checks what it reads against the format before anyone uses it.

`load(path)` parses the file and validates every field profattr reads: its JSON type (a batch size written as the
string "4" is an error, not a default of 1), its range (a batch, a tp, a count of rounds: positive or non-negative
integers; a time: a non-negative number) and, for objects, their members in turn. A field that is absent or null
is allowed (older captures lack some), and fields profattr does not read are not looked at. `beside(capture)` is
the run.json next to a capture: None when there is none, and an error when there is one that cannot be trusted.
The model's config.json that run.json keeps (`model_config`) is an object here; its architecture fields are
validated where a model is built from it (limits/model.py). What comes back is a `RunRecord` (record.py): every
reader takes its fields through its accessors, each with one default; schema.py holds the fields and their kinds.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from profattr.errors import ProfattrError
from profattr.run_record.record import RunRecord
from profattr.run_record.schema import FIELDS, SCHEMA_PREFIX, WHAT, validate

__all__ = ["FIELDS", "SCHEMA_PREFIX", "WHAT", "RunRecord", "beside", "load", "optional", "or_empty", "validate"]


def load(path, require_schema: bool = False) -> RunRecord:
    """The RunRecord of the run.json at `path`, parsed and validated (ProfattrError when it cannot be trusted).
    `require_schema`: it must say `schema: profattr.run/N` (for a run.json given on its own, not beside a capture)."""
    from profattr import inputs

    path = Path(path)
    text = inputs.read_text(path, WHAT)
    try:
        run = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProfattrError(f"{path}: not a readable run.json ({exc}); restore the file `profattr capture` wrote, or "
                            "remove it") from None
    if require_schema and not (isinstance(run, dict) and isinstance(run.get("schema"), str)):
        raise ProfattrError(f"{path}: not a profattr run file (schema profattr.run/1 expected)")
    return RunRecord(validate(run, path), path)


def beside(capture) -> tuple:
    """(RunRecord or None, its path or None): NAME.run.json beside a capture, validated; None when there is none (or it
    is not a file there: a FIFO is never waited on), a ProfattrError when it is there but cannot be trusted."""
    from profattr import inputs

    path = inputs.run_json_path(capture)
    if not os.path.lexists(path) or not inputs.is_regular_file(path):
        return None, None
    return load(path), path


def optional(path) -> Optional[RunRecord]:
    """The RunRecord of the run.json at `path` when it is there (validated), else None."""
    from profattr import inputs

    path = Path(path)
    if not os.path.lexists(path) or not inputs.is_regular_file(path):
        return None
    return load(path)


def or_empty(run: Optional[RunRecord]) -> RunRecord:
    """`run`, or an empty record for None (no run.json): every accessor then gives its default."""
    return run if run is not None else RunRecord({})
