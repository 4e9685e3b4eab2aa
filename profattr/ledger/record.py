"""`profattr ledger add`: a capture's identity, run.json facts and budget, written into the ledger.

An entry is identified by the capture's content (SHA-256 of the file given), the step definition (`--steps`) and
the taxonomy (SHA-256 over the shipped rule files and any `--rules` files): the same three again are the same entry,
not a new one. Every budget of one `add` is computed before anything is written, and all its entries are written in
one transaction, so a failure leaves the ledger as it was.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from profattr import __version__
from profattr.attribute.budget import SCHEMA as BUDGET_SCHEMA
from profattr.attribute.budget import Budget, compute_budget
from profattr.errors import ProfattrError
from profattr.ledger.schema import (TABLES, add_new_columns, check_schema, create_ledger, create_missing_tables,
                                   create_tables, open_ledger, transaction)
from profattr.run_record import RunRecord
from profattr.taxonomy.classify import RULES_DIR, load_rules
from profattr.trace.reader import run_json_path

CHUNK_BYTES = 1 << 20
GPU_COLUMNS = [c for c in TABLES["gpus"][0] if c not in ("entry_id", "position", "gpu_index")]


@dataclass
class Pending:
    """A capture to add: who it is, its budget and its run.json (read before the ledger is written)."""

    given: str
    sha256: str
    size_bytes: int
    label: Optional[str]  # None: the default (run.json name, else the file name)
    budget: Optional[Budget] = None
    run: Optional[RunRecord] = None
    run_path: Optional[Path] = None


def file_sha256(path: Path) -> tuple:
    """(hex SHA-256 of the file's bytes, its size in bytes)."""
    h = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
                h.update(block)
                size += len(block)
    except OSError as exc:
        raise ProfattrError(f"{path}: cannot read the capture ({exc.strerror or exc})") from None
    return h.hexdigest(), size


def rules_sha256(rules: Sequence) -> str:
    """SHA-256 over the taxonomy a budget uses: the shipped rule files, then the `--rules` files in order."""
    load_rules(rules)  # a bad rules file fails here, with its own message
    h = hashlib.sha256()
    for kind, paths in (("shipped", sorted(RULES_DIR.glob("*.toml"))), ("user", [Path(p) for p in rules])):
        for p in paths:
            h.update(f"{kind}:{p.name}\0".encode())
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def check_label(label: str) -> str:
    if not label.strip():
        raise ProfattrError("--label: a label is empty; give each capture a non-empty name")
    if label.strip().isdigit():
        raise ProfattrError(f"--label {label!r}: entries are addressed by number or label, so a label cannot be a "
                            "number; add a word")
    return label


def default_label(path: Path, run: Optional[RunRecord]) -> str:
    if run and run.name and run.name.strip():
        name = run.name
    else:
        name = path.name
        for suffix in (".sqlite", ".nsys-rep", ".qdrep"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
    return f"capture-{name}" if name.isdigit() else name


def read_run(path: Path) -> tuple:
    """(RunRecord, run.json path) when NAME.run.json is beside the capture, else (None, None)."""
    from profattr.check.locate import load_run

    run_path = run_json_path(path)
    return (load_run(run_path), run_path) if run_path.exists() else (None, None)


def add_captures(ledger_path, captures: Sequence, labels: Optional[Sequence[str]] = None, steps: str = "auto",
                 rules: Sequence = (), skip_steps=None) -> list:
    """Add each capture; per capture {"capture", "status": added | already, "entry_id", "label"}, in order.
    `skip_steps` (budget's --skip-steps) is part of the steps spec an entry is identified by."""
    ledger_path = Path(ledger_path)
    if labels and len(labels) != len(captures):
        raise ProfattrError(f"--label given {len(labels)} time(s) for {len(captures)} capture(s); give one per "
                            "capture, in order, or none")
    labels = [check_label(x) for x in labels] if labels else [None] * len(captures)
    if len({x for x in labels if x is not None}) != len([x for x in labels if x is not None]):
        raise ProfattrError("--label: two captures were given the same label; labels name one entry each")
    db = open_ledger(ledger_path, missing_ok=True)
    try:
        spec = steps if skip_steps in (None, 0, "0") else f"{steps};skip-steps={skip_steps}"
        return _add(db, ledger_path, captures, labels, spec, rules)
    finally:
        if db is not None:
            db.close()


def _add(db, ledger_path: Path, captures: Sequence, labels: list, steps: str, rules: Sequence) -> list:
    taxonomy = rules_sha256(rules)
    results, pending = [], []
    for given, label in zip(captures, labels):
        path = Path(given)
        if not path.is_file():
            raise ProfattrError(f"{path}: no such file" if not path.exists() else f"{path}: is not a file")
        sha, size = file_sha256(path)
        entry = _existing(db, sha, steps, taxonomy) if db is not None else None
        twin = next((p for p in pending if p.sha256 == sha), None)
        if entry is not None or twin is not None:
            results.append({"capture": str(given), "status": "already",
                            "entry_id": entry["id"] if entry else None, "label": entry["label"] if entry else None})
            continue
        if label is not None and db is not None and _label_entry(db, label) is not None:
            raise ProfattrError(f"--label {label!r} already names entry {_label_entry(db, label)} of "
                                f"{ledger_path}; give another label")
        item = Pending(str(given), sha, size, label)
        step_source, _, skip = steps.partition(";skip-steps=")
        item.budget = compute_budget(path, steps=step_source, rules=rules, skip_steps=skip or None)
        item.run, item.run_path = read_run(path)
        pending.append(item)
        results.append({"capture": str(given), "status": "added", "pending": item})
    if not pending:
        return results
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if db is None:
        created = create_ledger(ledger_path)
        try:
            _write(created, ledger_path, pending, results, steps, rules, taxonomy, now)
        finally:
            created.close()
            if ledger_path.exists() and ledger_path.stat().st_size == 0:  # rolled back: leave no empty file
                ledger_path.unlink()
    else:
        _write(db, ledger_path, pending, results, steps, rules, taxonomy, now)
    for r in results:
        r.pop("pending", None)
    return results


def _write(db, ledger_path: Path, pending: list, results: list, steps: str, rules: Sequence, taxonomy: str,
           now: str) -> None:
    """All pending entries in one transaction (the tables too, when the ledger is new)."""
    with transaction(db, ledger_path):
        if "meta" not in db.table_names():
            create_tables(db, now, __version__)
        check_schema(db, ledger_path)
        add_new_columns(db)
        create_missing_tables(db)
        for item in pending:
            if _existing(db, item.sha256, steps, taxonomy) is not None:  # added meanwhile by another process
                raise ProfattrError(f"{item.given}: added to {ledger_path} by another process meanwhile; run the "
                                    "add again")
            entry_id, label = insert_entry(db, item, steps, rules, taxonomy, now)
            for r in results:
                if r.get("pending") is item:
                    r.update(entry_id=entry_id, label=label)


def _existing(db, sha: str, steps: str, taxonomy: str) -> Optional[dict]:
    row = db.execute("SELECT id, label FROM entries WHERE capture_sha256 = ? AND steps_spec = ? AND rules_sha256 = ?",
                     [sha, steps, taxonomy]).fetchone()
    return {"id": row[0], "label": row[1]} if row else None


def _label_entry(db, label: str) -> Optional[int]:
    row = db.execute("SELECT id FROM entries WHERE label = ?", [label]).fetchone()
    return row[0] if row else None


def insert_entry(db, item: Pending, steps: str, rules: Sequence, taxonomy: str, now: str) -> tuple:
    """Insert one entry and all its rows (inside the caller's transaction); returns (entry id, label)."""
    b = item.budget
    label = item.label
    if label is None:
        base = default_label(Path(item.given), item.run)
        label, n = base, 2
        while _label_entry(db, label) is not None:
            label, n = f"{base}-{n}", n + 1
    elif _label_entry(db, label) is not None:
        raise ProfattrError(f"--label {label!r} already names entry {_label_entry(db, label)}; give another label")
    entry = {
        "label": label, "added_utc": now, "capture_path": str(Path(item.given).resolve()),
        "capture_sha256": item.sha256, "capture_bytes": item.size_bytes, "export_path": b.path,
        "capture_format": b.format, "profiler_version": b.tool_version,
        "nsys_version": b.nsys_version, "export_schema_version": b.schema_version, "steps_spec": steps,
        "rules_files": json.dumps([str(r) for r in rules]), "rules_sha256": taxonomy, "budget_schema": BUDGET_SCHEMA,
        "profattr_version": __version__, "steps_source": b.steps_source, "steps_count": int(b.steps_count),
        "steps_reason": b.steps_reason, "steps_excluded": _json(b.steps_excluded),
        "nvtx_context": b.context_method, "nvtx_placement": _json(b.nvtx_placement),
        "comm_summary": _json(b.comm), "export_gpus": _json(b.gpus),
        "run_json_path": str(item.run_path.resolve()) if item.run_path else None,
    }
    entry.update(run_facts(item.run))
    if b.skipped_rows and "skipped_rows" in db["entries"].columns_dict:  # ledgers made before lack the column
        entry["skipped_rows"] = _json(b.skipped_rows)
    entry_id = db["entries"].insert(entry).last_pk
    if item.run:
        db["gpus"].insert_all(gpu_rows(entry_id, item.run))
        packages = item.run.packages
        db["packages"].insert_all([{"entry_id": entry_id, "package": str(k), "version": v}
                                   for k, v in packages.items()])
    for table, rows in budget_rows(entry_id, b).items():
        if table == "devices" and "evidence_json" not in db[table].columns_dict:  # ledgers made before lack it
            rows = [{k: v for k, v in r.items() if k != "evidence_json"} for r in rows]
        db[table].insert_all(rows)
    return entry_id, label


def _shape_columns(shape: Optional[dict]) -> dict:
    """kernel_shapes columns of a budget shape (trace/ops.py unpack_shape); NULLs when it was not recorded."""
    if not shape:
        return {c: None for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                                  "registers_per_thread", "gemm_m", "gemm_n", "gemm_k")}
    gemm = shape.get("gemm") or {}
    return {"grid_x": shape["grid"][0], "grid_y": shape["grid"][1], "grid_z": shape["grid"][2],
            "block_x": shape["block"][0], "block_y": shape["block"][1], "block_z": shape["block"][2],
            "registers_per_thread": shape["registers_per_thread"], "gemm_m": gemm.get("m"), "gemm_n": gemm.get("n"),
            "gemm_k": gemm.get("k")}


def _json(value) -> Optional[str]:
    return None if value is None else json.dumps(value, sort_keys=True)


def run_facts(run: Optional[RunRecord]) -> dict:
    """The entries columns read from run.json (all NULL without one)."""
    if not run:
        return {}
    resolved = run.resolved
    return {
        "run_name": run.name, "target": run.target, "created_utc": run.created_utc, "model": run.model,
        "backend_requested": run.backend_requested,
        "backend_resolved": (resolved["moe_runner_backend"] if "moe_runner_backend" in resolved
                             else run.backend_sglang),
        "backend_json": _json(run.recorded("backend")), "server_resolved": _json(resolved or None),
        "tp": run.tp, "batch": run.batch, "server_args": _json(run.recorded("server.args")),
        "ms_per_token_unprofiled": run.ms_per_token_unprofiled, "ms_per_token_profiled": run.ms_per_token_profiled,
    }


def gpu_rows(entry_id: int, run: RunRecord) -> list:
    rows = []
    for position, g in enumerate(run.gpus):
        row = {"entry_id": entry_id, "position": position, "gpu_index": g.get("index")}
        row.update({c: g.get(c) for c in GPU_COLUMNS})
        rows.append(row)
    return rows


ROWS_PER_CHUNK = 1 << 16  # per-step rows made into Python values at once


def _frame_rows(entry_id: int, frame, columns: dict):
    """Rows of a per-step DataFrame as plain Python values, made a chunk at a time as they are written (never the
    whole table as Python objects); `columns`: frame column -> ledger column."""
    if frame is None or len(frame) == 0:
        return
    keys = ["entry_id", *columns.values()]
    for lo in range(0, len(frame), ROWS_PER_CHUNK):
        values = [frame[src].iloc[lo:lo + ROWS_PER_CHUNK].tolist() for src in columns]
        for row in zip(*values):
            yield dict(zip(keys, (entry_id, *row)))


# a budget device's evidence section, its step-to-step spread and its GEMM precision table, kept whole as JSON
EVIDENCE_KEYS = ("evidence", "unknowns", "unknowns_total", "conflicts", "distributions", "gemm_precision")


def budget_rows(entry_id: int, b: Budget) -> dict:
    """table -> rows of the budget: per device, its categories, kernels and comm split, and the per-step tables."""
    out = {t: [] for t in ("devices", "categories", "kernels", "kernel_shapes", "short_kernels", "comm",
                           "comm_categories")}
    for d in b.devices:
        dev = int(d["device"])
        key = {"entry_id": entry_id, "device": dev}
        outside = d.get("outside_steps") or {}
        out["devices"].append({**key, "steps": int(d["steps"]), "outside_steps_ops": int(outside.get("ops", 0)),
                               "outside_steps_ms": float(outside.get("ms", 0.0)),
                               **{c: float(d[c]) for c in ("step_ms", "mean_step_ms", "busy_ms_per_step",
                                                           "idle_ms_per_step", "overlap_ms_per_step",
                                                           "kernels_per_step", "memops_per_step",
                                                           "unclassified_share")},
                               "evidence_json": _json({k: d[k] for k in EVIDENCE_KEYS if k in d} or None)})
        out["categories"] += [{**key, "position": i, "category": c["category"],
                               "ms_per_step": float(c["ms_per_step"]), "count_per_step": float(c["count_per_step"]),
                               "exclusive_ms_per_step": float(c["exclusive_ms_per_step"]),
                               "overlapped_ms_per_step": float(c["overlapped_ms_per_step"])}
                              for i, c in enumerate(d["categories"])]
        out["kernels"] += [{**key, "position": i, "name": k["name"], "demangled": k["demangled"],
                            "category": k["category"], "family": k["family"], "ms_per_step": float(k["ms_per_step"]),
                            "count_per_step": float(k["count_per_step"]), "weight_dtype": k.get("weight_dtype"),
                            "math": k.get("math")} for i, k in enumerate(d["kernels"])]
        out["kernel_shapes"] += [{**key, "kernel_position": i, "position": j, **_shape_columns(s["shape"]),
                                  "label": s["label"], **{c: float(s[c]) for c in ("ms_per_step", "count_per_step",
                                                                                  "mean_us", "share")}}
                                 for i, k in enumerate(d["kernels"]) for j, s in enumerate(k.get("shapes") or [])]
        short = d.get("short_kernels")
        if short:
            out["short_kernels"].append({**key, **{c: float(short[c]) for c in ("under_us", "count_per_step",
                                                                                "ms_per_step", "share")}})
        comm = d.get("comm")
        if comm:
            out["comm"].append({**key, **{c: float(comm[c]) for c in TABLES["comm"][0] if c not in key}})
            out["comm_categories"] += [{**key, "position": i, "category": c["category"],
                                        "collective_ms_per_step": float(c["collective_ms_per_step"]),
                                        "wait_ms_per_step": float(c["wait_ms_per_step"])}
                                       for i, c in enumerate(comm["by_category"])]
    out["steps"] = _frame_rows(entry_id, b.per_step, {"device": "device", "step": "step", "start_ns": "start_ns",
                                                      "end_ns": "end_ns", "span_ns": "span_ns", "busy_ns": "busy_ns",
                                                      "op_ns": "op_ns", "kernels": "kernel_count"})
    table = b.per_step_category  # rows made a chunk at a time as they are written (step_table.py)
    out["step_categories"] = [] if table is None else table.rows(
        {"device": "device", "step": "step", "category": "category", "ns": "duration_ns", "count": "count",
         "exclusive_ns": "exclusive_ns"}, entry_id=entry_id)
    out["step_comm"] = _frame_rows(entry_id, b.per_step_comm, {"device": "device", "step": "step",
                                                               "category": "category", "collective_ns":
                                                               "collective_ns", "wait_ns": "wait_ns"})
    return out
