"""The budget's result cache: `profattr budget` of a capture it has already budgeted with the same options reads the
result (the `profattr.budget/1` JSON) instead of computing it again, and says the first run's warnings again. A
hit imports neither numpy nor pandas: it costs the file key and one JSON read.

- Key: the capture file (trace/cache.py's key: identity and the hash of its ends), every option that changes the
  result (steps, skip_steps, by, layer_range, each --rules file's key, the mapping capture's key) and the content
  hash of profattr's own code and data, so that a changed capture, rule file or profattr is a miss.
- What is cached: budgets of an Nsight Systems export (a .sqlite, or a .nsys-rep whose export beside it is current);
  torch traces and rank folders are computed every time. A failed budget is never cached.
- Where: $PROFATTR_CACHE/budgets (cache_keys.py), at most MAX_ENTRIES results, the least recently used dropped
  first. Off with --no-cache / PROFATTR_NO_CACHE=1 (both caches) or PROFATTR_RESULT_CACHE=0 (this one only).
- A hit's result is the miss's: the miss returns the JSON it stored, read back, so both render the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

from profattr import cache_keys, errors, inputs

RESULT_VERSION = "1"
MAX_ENTRIES = 256
PACKAGE = Path(__file__).resolve().parents[1]
_code_hash: list = []


def enabled() -> bool:
    return cache_keys.enabled() and os.environ.get("PROFATTR_RESULT_CACHE", "1").lower() not in ("0", "false", "no")


def code_hash() -> str:
    """The content hash of every file of the profattr package (its code, rules, inventories, queries, specs)."""
    if not _code_hash:
        h = hashlib.sha256()
        for root, dirs, files in os.walk(PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = Path(root) / name
                h.update(str(path.relative_to(PACKAGE)).encode() + b"\0")
                h.update(path.read_bytes())
        _code_hash.append(h.hexdigest())
    return _code_hash[0]


def _entry(capture, options: dict, rules, mapping) -> Path | None:
    """The cache file of this budget, or None when it is not cached (not an export read now, or an input that is
    not a file: the computation says what is wrong with it)."""
    inputs.file_or_folder(capture)  # a missing capture is the reader's one-line error, before any key
    export = cache_keys.current_export(capture)
    if export is None or not all(Path(r).is_file() for r in rules) or (mapping is not None and
                                                                         not Path(mapping).is_file()):
        return None
    return cache_keys.cache_root("budgets") / f"{_key(export, options, rules, mapping)}.json"


def _key(export: Path, options: dict, rules, mapping) -> str:
    parts = {"version": RESULT_VERSION, "code": code_hash(), "capture": cache_keys.file_key(export, "budget"),
             "options": options, "rules": [cache_keys.file_key(r, "rules") for r in rules],
             "mapping": None if mapping is None else cache_keys.file_key(mapping, "mapping")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


def budget_result(capture, steps: str = "auto", rules=(), *, force: bool = False, mapping=None,
                  by: str = "category", layer_range=None, skip_steps=None) -> dict:
    """The `profattr.budget/1` dict of compute_budget(capture, ...) (without per-step tables), from the result cache
    when it holds it (its warnings said again), else computed and stored."""
    options = {"steps": steps, "by": by, "layer_range": layer_range, "skip_steps": skip_steps}
    entry = _entry(capture, options, rules, mapping) if enabled() and not force else None
    cached = _read(entry) if entry is not None else None
    if cached is not None:
        for line in cached["warnings"]:
            errors.warn(line)
        return cached["budget"]
    with errors.recorded_warnings() as said:
        budget = _computed(capture, rules, force, mapping, steps=steps, by=by, layer_range=layer_range,
                           skip_steps=skip_steps, step_categories=False)
    text = json.dumps({"warnings": said, "budget": budget.to_dict()})
    if entry is None and enabled():  # a .nsys-rep exported just now (or --force): its export is there now
        entry = _entry(capture, options, rules, mapping)
    if entry is not None:
        _write(entry, text)
    return json.loads(text)["budget"]


def _computed(capture, rules, force: bool, mapping, **options):
    """compute_budget(capture, ...) on a miss. The capture is opened and its op store built (numpy and SQLite
    only) while a thread imports the budget's modules (pandas is most of them) and compiles the shipped rules: the
    two longest waits of a first look at a capture overlap. With --mapping, compute_budget opens both captures in
    its own order."""
    if mapping is not None:
        from profattr.attribute.budget import compute_budget

        return compute_budget(capture, rules=rules, force=force, mapping=mapping, **options)
    loaded: dict = {}
    thread = threading.Thread(target=_load_budget_modules, args=(loaded,), name="profattr-import", daemon=True)
    thread.start()
    from profattr.trace.cache import store_or_export
    from profattr.trace.source import open_trace

    try:
        if rules:  # a bad rules file is said before the capture is read, as compute_budget does
            from profattr.taxonomy.classify import load_rules

            rules = load_rules(rules)
        with open_trace(capture, force=force) as export:
            reader = store_or_export(export)
            try:
                thread.join()
                if "error" in loaded:
                    raise loaded["error"]
                return loaded["budget"].compute_budget(reader, rules=rules, **options)
            finally:
                if reader is not export:
                    reader.close()
    finally:
        thread.join()


def _load_budget_modules(loaded: dict) -> None:
    try:
        from profattr.attribute import budget
        from profattr.taxonomy.classify import load_rules

        load_rules()  # the shipped rules, compiled once per process (their cache)
        loaded["budget"] = budget
    except BaseException as exc:  # raised in the caller's thread
        loaded["error"] = exc


def _read(entry: Path) -> dict | None:
    """The entry's {"warnings", "budget"}, or None when it is missing or damaged (removed: then computed again)."""
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("budget"), dict) or not isinstance(
                data.get("warnings"), list):
            raise ValueError("not an entry")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        entry.unlink(missing_ok=True)
        return None
    os.utime(entry)  # recently used
    return data


def _write(entry: Path, text: str) -> None:
    """Store `text` as `entry` (written aside, then renamed into place), then keep at most MAX_ENTRIES. A cache that
    cannot be written is no error: the budget was computed."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, entry)
        finally:
            Path(tmp).unlink(missing_ok=True)
        entries = sorted(entry.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
