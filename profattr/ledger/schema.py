"""The ledger's tables (`profattr.ledger/1`), where the ledger lives, opening it, and its one-transaction writes.

Every table but `meta` and `entries` is keyed by `entry_id` (a foreign key to `entries.id`) and, where it holds
per-GPU figures, by `device` (the nsys device id, as in the budget). Units are in the column names. README.md
("The campaign ledger") documents the same schema for people and for Datasette.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from profattr.errors import ProfattrError

SCHEMA = "profattr.ledger/1"
SCHEMA_PREFIX = "profattr.ledger/"
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
LOCK_TIMEOUT_S = 5.0  # how long a write waits for another writer before giving up ("database is locked")

ENTRY = ("entry_id", "entries", "id")
# table -> (columns in order with their Python types, primary key, foreign keys, indexes)
TABLES = {
    "meta": ({"key": str, "value": str}, "key", [], []),
    "entries": ({
        "id": int, "label": str, "added_utc": str,
        # identity of the capture and of how it was budgeted
        "capture_path": str, "capture_sha256": str, "capture_bytes": int, "export_path": str,
        "capture_format": str, "profiler_version": str,
        "nsys_version": str, "export_schema_version": str, "steps_spec": str, "rules_files": str,
        "rules_sha256": str, "budget_schema": str, "profattr_version": str,
        # the budget's capture-wide parts
        "steps_source": str, "steps_count": int, "steps_reason": str, "steps_excluded": str, "nvtx_context": str,
        "nvtx_placement": str, "comm_summary": str, "export_gpus": str,
        # NAME.run.json facts (NULL without a run.json)
        "run_json_path": str, "run_name": str, "target": str, "created_utc": str, "model": str,
        "backend_requested": str, "backend_resolved": str, "backend_json": str, "server_resolved": str,
        "tp": int, "batch": int, "server_args": str,
        "ms_per_token_unprofiled": float, "ms_per_token_profiled": float,
        # rows the capture's reader skipped as damaged (JSON, the budget's capture.skipped_rows; NULL: none, or a
        # ledger made before profattr counted them)
        "skipped_rows": str,
    }, "id", [], [(("label",), True), (("capture_sha256", "steps_spec", "rules_sha256"), True)]),
    "gpus": ({
        "entry_id": int, "position": int, "gpu_index": int, "name": str, "driver_version": str,
        "memory_total_mib": int, "pci_bus_id": str, "uuid": str, "clocks_sm_mhz": int, "clocks_mem_mhz": int,
        "clocks_max_sm_mhz": int, "clocks_max_mem_mhz": int, "power_limit_w": float, "persistence_mode": str,
    }, ("entry_id", "position"), [ENTRY], []),
    "packages": ({"entry_id": int, "package": str, "version": str}, ("entry_id", "package"), [ENTRY], []),
    "devices": ({
        "entry_id": int, "device": int, "steps": int, "step_ms": float, "mean_step_ms": float,
        "busy_ms_per_step": float, "idle_ms_per_step": float, "overlap_ms_per_step": float,
        "kernels_per_step": float, "memops_per_step": float, "unclassified_share": float,
        "outside_steps_ops": int, "outside_steps_ms": float,
        # what decided the categories, the kernels no certain name rule covers, the contradicted rules, the spread
        # over steps (JSON: the budget device's evidence, unknowns, unknowns_total, conflicts and distributions;
        # NULL in ledgers made before)
        "evidence_json": str,
    }, ("entry_id", "device"), [ENTRY], []),
    "categories": ({
        "entry_id": int, "device": int, "position": int, "category": str, "ms_per_step": float,
        "count_per_step": float, "exclusive_ms_per_step": float, "overlapped_ms_per_step": float,
    }, ("entry_id", "device", "category"), [ENTRY], [(("category",), False)]),
    "kernels": ({
        "entry_id": int, "device": int, "position": int, "name": str, "demangled": str, "category": str,
        "family": str, "ms_per_step": float, "count_per_step": float,
        # a GEMM kernel's weight precision and how its math ran (taxonomy rule data; NULL for other kernels and in
        # ledgers made before)
        "weight_dtype": str, "math": str,
    }, ("entry_id", "device", "position"), [ENTRY], [(("category",), False), (("name",), False)]),
    # a kernel row's launch shapes (budget kernels[].shapes), in the budget's order; grid/block/registers NULL when
    # the capture did not record the shape, gemm_m/n/k NULL when no linear layer's NVTX range named them
    "kernel_shapes": ({
        "entry_id": int, "device": int, "kernel_position": int, "position": int, "grid_x": int, "grid_y": int,
        "grid_z": int, "block_x": int, "block_y": int, "block_z": int, "registers_per_thread": int, "gemm_m": int,
        "gemm_n": int, "gemm_k": int, "label": str,
        "ms_per_step": float, "count_per_step": float, "mean_us": float, "share": float,
    }, ("entry_id", "device", "kernel_position", "position"), [ENTRY], []),
    # kernels shorter than `under_us` inside the steps (budget devices[].short_kernels)
    "short_kernels": ({
        "entry_id": int, "device": int, "under_us": float, "count_per_step": float, "ms_per_step": float,
        "share": float,
    }, ("entry_id", "device"), [ENTRY], []),
    "comm": ({
        "entry_id": int, "device": int, "collective_ms_per_step": float, "transfer_ms_per_step": float,
        "wait_ms_per_step": float, "slowest_rank_share": float, "caused_wait_ms_per_step": float,
        "instances_per_step": float,
        "unmatched_per_step": float,
    }, ("entry_id", "device"), [ENTRY], []),
    "comm_categories": ({
        "entry_id": int, "device": int, "position": int, "category": str, "collective_ms_per_step": float,
        "wait_ms_per_step": float,
    }, ("entry_id", "device", "category"), [ENTRY], []),
    "steps": ({
        "entry_id": int, "device": int, "step": int, "start_ns": int, "end_ns": int, "span_ns": int,
        "busy_ns": int, "op_ns": int, "kernel_count": int,
    }, ("entry_id", "device", "step"), [ENTRY], []),
    "step_categories": ({
        "entry_id": int, "device": int, "step": int, "category": str, "duration_ns": int, "count": int,
        "exclusive_ns": int,
    }, ("entry_id", "device", "step", "category"), [ENTRY], []),
    "step_comm": ({
        "entry_id": int, "device": int, "step": int, "category": str, "collective_ns": int, "wait_ns": int,
    }, ("entry_id", "device", "step", "category"), [ENTRY], []),
}


# columns added to a table after ledgers had been made without them: NULL in their older rows, added to an older
# ledger's table by its next write (add_new_columns); readers take NULL as "not recorded"
ADDED_COLUMNS = {"categories": ("exclusive_ms_per_step", "overlapped_ms_per_step"), "step_categories": ("exclusive_ns",),
                 "kernels": ("weight_dtype", "math")}


def add_new_columns(db) -> None:
    """The ADDED_COLUMNS an older ledger's tables lack (inside the caller's write transaction)."""
    for table, names in ADDED_COLUMNS.items():
        have = db[table].columns_dict
        for name in names:
            if name not in have:
                db[table].add_column(name, TABLES[table][0][name])


def has_columns(db, table: str, names) -> bool:
    """Whether the ledger's `table` has all these columns (an older ledger may lack ADDED_COLUMNS)."""
    have = db[table].columns_dict
    return all(n in have for n in names)


# entries columns that hold JSON text, and what it must decode to
JSON_COLUMNS = {"rules_files": (list,), "nvtx_placement": (dict,), "comm_summary": (dict,), "export_gpus": (list,),
                "backend_json": (dict,), "server_resolved": (dict,), "server_args": (dict, list),
                "steps_excluded": (dict,), "skipped_rows": (dict,)}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "text"}


def ledger_path(db) -> str:
    """The file a ledger connection reads (for messages)."""
    try:
        return next((row[2] for row in db.conn.execute("PRAGMA database_list") if row[1] == "main"), "the ledger")
    except sqlite3.Error:
        return "the ledger"


def _damaged(db, table: str, row: dict, column: str, what: str) -> ProfattrError:
    entry = row.get("entry_id", row.get("id")) if table != "entries" else row.get("id")
    return ProfattrError(f"{ledger_path(db)}: entry {entry}'s {table}.{column} {what}: the ledger is damaged; add "
                         "the capture again into a new ledger (`profattr ledger add CAPTURE --ledger NEW.db`)")


def checked(db, table: str, row: dict) -> dict:
    """`row` of `table` as read, after checking every value the schema knows against its type (an integer where
    the schema says integer, a finite number where it says number, text) and every JSON column for being JSON of
    its kind (`stored_json` decodes those). A value that is not what the schema says is one ProfattrError naming the
    entry and the column."""
    columns = TABLES[table][0]
    for column, value in row.items():
        want = columns.get(column)
        if want is None or value is None:
            continue
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
                and abs(value) != float("inf")
        else:
            ok = isinstance(value, want) and not isinstance(value, bool)
        if not ok:
            raise _damaged(db, table, row, column, f"holds {str(value)[:40]!r}, not {_TYPE_NAMES[want]}")
    if table == "entries":
        for column in JSON_COLUMNS:
            stored_json(db, table, row, column)
    return row


def stored_json(db, table: str, row: dict, column: str):
    """The JSON a row's column stores, decoded (None for NULL); a ProfattrError naming the entry when it is not
    JSON of the kind the column holds."""
    import json

    text = row.get(column)
    if text is None:
        return None
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError) as exc:
        raise _damaged(db, table, row, column, f"is not readable JSON ({exc})") from None
    kinds = JSON_COLUMNS.get(column, (dict, list))
    if not isinstance(value, kinds):
        raise _damaged(db, table, row, column, f"holds {str(text)[:40]!r}, not a JSON "
                       f"{' or '.join('object' if k is dict else 'array' for k in kinds)}")
    return value


def default_path() -> Path:
    """$PROFATTR_LEDGER, else $XDG_DATA_HOME/profattr/ledger.db, else ~/.local/share/profattr/ledger.db."""
    if os.environ.get("PROFATTR_LEDGER"):
        return Path(os.environ["PROFATTR_LEDGER"])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "profattr" / "ledger.db"


class _Connection(sqlite3.Connection):
    """A connection whose `with conn:` blocks do nothing while a ledger transaction holds it: sqlite-utils 3.x
    commits after each insert_all that way, which would leave a failed `ledger add` half-written."""

    held = False

    def __exit__(self, exc_type, exc, tb):
        if self.held:
            return False
        return super().__exit__(exc_type, exc, tb)


def _database(path: Path):
    import sqlite_utils

    conn = sqlite3.connect(str(path), timeout=LOCK_TIMEOUT_S, factory=_Connection)
    conn.execute("PRAGMA foreign_keys = ON")
    return sqlite_utils.Database(conn)


@contextlib.contextmanager
def sqlite_errors(path):
    """SQLite failures on the ledger as one-line ProfattrErrors (locked, damaged, anything else)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise ProfattrError(f"{path}: the ledger is locked by another process (database is locked); try again "
                                "when it has finished") from None
        if "not a database" in text or "malformed" in text:
            raise ProfattrError(f"{path}: not a profattr ledger (the file is not a readable SQLite database: "
                                f"{text})") from None
        raise ProfattrError(f"{path}: SQLite error on the ledger: {text}") from None


def open_ledger(path, missing_ok: bool = False):
    """The ledger at `path` as a sqlite_utils.Database, checked to be a `profattr.ledger/1` this profattr reads.

    A missing or empty file is None with `missing_ok` (a ledger not started yet), else a ProfattrError."""
    from profattr import inputs

    path = Path(path)
    if path.is_dir():
        raise ProfattrError(f"{path}: is a folder; give the ledger's file (e.g. {path / 'ledger.db'})")
    if not os.path.lexists(path) or (inputs.is_regular_file(path) and path.stat().st_size == 0):
        if missing_ok:
            return None
        raise ProfattrError(f"{path}: no ledger here yet; start one with `profattr ledger add CAPTURE --ledger "
                            f"{path}`")
    inputs.regular_file(path, "a profattr ledger (SQLite)", folder_hint=f"give the ledger's file (e.g. "
                                                                         f"{path / 'ledger.db'})")
    with path.open("rb") as fh:
        if fh.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise ProfattrError(f"{path}: not a profattr ledger (not a SQLite file)")
    db = _database(path)
    try:
        with sqlite_errors(path):
            check_schema(db, path)
    except ProfattrError:
        db.close()
        raise
    return db


def check_schema(db, path) -> None:
    """ProfattrError unless `db` is a ledger of a schema version this profattr reads."""
    if "meta" not in db.table_names() or "entries" not in db.table_names():
        raise ProfattrError(f"{path}: a SQLite file, but not a profattr ledger (no meta/entries tables)")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    schema = row[0] if row else None
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise ProfattrError(f"{path}: not a profattr ledger (meta schema {schema!r}, expected {SCHEMA})")
    version = schema[len(SCHEMA_PREFIX):]
    if not version.isdigit():
        raise ProfattrError(f"{path}: not a profattr ledger (meta schema {schema!r}, expected {SCHEMA})")
    if int(version) > SCHEMA_VERSION:
        raise ProfattrError(f"{path}: written by a newer profattr (schema {schema}); this profattr reads up to "
                            f"{SCHEMA}: upgrade profattr to read it")


def create_ledger(path):
    """A new, empty database file at `path` (its tables are made by `create_tables`, inside the first write)."""
    from profattr.outputs import ensure_folder

    path = Path(path)
    ensure_folder(path.parent)
    try:
        return _database(path)
    except sqlite3.Error as exc:
        raise ProfattrError(f"{path}: cannot create the ledger ({exc})") from None


def create_tables(db, created_utc: str, profattr_version: str) -> None:
    """Every table and index of the schema, and the meta rows (schema version, when, by which profattr)."""
    create_missing_tables(db)
    db["meta"].insert_all([{"key": "schema", "value": SCHEMA}, {"key": "created_utc", "value": created_utc},
                           {"key": "created_by", "value": f"profattr {profattr_version}"}])


@contextlib.contextmanager
def transaction(db, path):
    """One write transaction: taken up front (BEGIN IMMEDIATE, so a locked ledger fails before any write), committed
    at the end, rolled back on any error."""
    conn = db.conn
    with sqlite_errors(path):
        conn.execute("BEGIN IMMEDIATE")
    conn.held = True
    try:
        with sqlite_errors(path):
            yield db
    except BaseException:
        conn.held = False
        conn.rollback()
        raise
    conn.held = False
    with sqlite_errors(path):
        conn.commit()


def create_missing_tables(db) -> None:
    """The schema's tables (and their indexes) that `db` lacks: a ledger made before a table was added gets it on
    its next write; its older entries have no rows there."""
    have = set(db.table_names())
    for name, (columns, pk, foreign_keys, indexes) in TABLES.items():
        if name in have:
            continue
        db[name].create(columns, pk=pk, foreign_keys=foreign_keys)
        for cols, unique in indexes:
            db[name].create_index(list(cols), unique=unique)
