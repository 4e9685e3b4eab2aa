"""Open an Nsight Systems SQLite export read-only and describe what it holds.

Exports differ between nsys versions (2022.x to 2026.x): tables exist only when they have rows ("lazy" export),
columns come and go, the metadata table was renamed. Everything here probes `sqlite_master` and
`pragma table_info` instead of assuming a layout.
"""
from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from profattr import inputs
from profattr.inputs import run_json_path  # noqa: F401 (NAME.run.json: inputs.py)
from profattr.errors import ProfattrError
# the table names, queries/ and DamagedValues live in nsys_sqlite.py (below the table readers); importable here too
from profattr.trace import calls as call_sets
from profattr.trace import fetch
from profattr.trace.nsys_sqlite import (KERNEL, MEMCPY, MEMSET, NVTX, QUERIES_DIR, RUNTIME,  # noqa: F401
                                        DamagedValues, load_query)

SQLITE_MAGIC = b"SQLite format 3\x00"
CHUNK_ROWS = 65536  # rows fetched per step: bounds the Python objects alive at once
@dataclass
class Export:
    """A read-only view of one nsys SQLite export (its SQL tables: nsys_sqlite.NsysTables), and the reader
    interface every capture format offers (protocol.py Reader)."""

    path: Path
    conn: sqlite3.Connection
    tables: set = field(default_factory=set)
    schema_version: str | None = None
    nsys_version: str | None = None
    _columns: dict = field(default_factory=dict, repr=False)
    _adbc: object = field(default=None, repr=False)  # a second, Arrow connection (trace/fetch.py), opened on use
    claims: object = field(default=None, repr=False)  # validate.Claims: what the arrays below were checked for
    _rows_checked: bool = field(default=False, repr=False)  # validate.hide_damaged_rows has run
    _api_calls: dict | None = field(default=None, repr=False)  # api_calls(), read once (the checks and views ask)
    _host_calls: object = field(default=None, repr=False)  # host_calls(), read once
    format = "nsys"

    def __post_init__(self):
        if self.claims is None:
            from profattr.trace.validate import Claims

            self.claims = Claims(self.path)

    @property
    def tool_version(self) -> str | None:
        return self.nsys_version

    @property
    def rows_checked(self) -> bool:
        """Whether damaged rows were found and hidden (by TEMP views of this reader's own connection)."""
        return self._rows_checked

    # --- the reader interface (the SQL lives in queries/, the array work in nsys_tables.py) -------------------
    def nsys_tables(self) -> "Export":
        return self

    def launch_gpu_starts(self) -> dict | None:
        from profattr.trace.nsys_graphs import launch_gpu_starts

        return launch_gpu_starts(self)

    def gpu_interval_windows(self):
        from profattr.trace.nsys_graphs import gpu_intervals

        yield gpu_intervals(self)

    def time_windows(self, size: int | None = None):
        return None  # every op at once: the windows come from its op store (cache.py StoreSource)

    def torch_ops(self):
        return None  # nsys records no torch operators

    def python_frames(self):
        return None  # nor Python frames (its CPU samples are cpu_samples)

    def ops(self, include_memory: bool = True):
        from profattr.trace.nsys_tables import load_ops

        return self._read(lambda: self.claims.ops(load_ops(self, include_memory)))

    def ranges(self):
        from profattr.trace.nsys_tables import load_ranges

        return self._read(lambda: self.claims.ranges(load_ranges(self)))

    def graph_launches(self):
        from profattr.trace.nsys_tables import graph_launches

        return self._read(lambda: self.claims.events(graph_launches(self), "graph_launches"))

    def node_creation(self):
        from profattr.trace.nsys_tables import node_creation

        return self._read(lambda: self.claims.events(node_creation(self), "node_creation"))

    def _read(self, read):
        """`read()`; when it meets a damaged value (a NULL or a text where the schema has an integer), every row is
        checked (validate.hide_damaged_rows: damaged rows counted, then hidden) and the read is done again."""
        try:
            return read()
        except (DamagedValues, TypeError, ValueError, OverflowError) as exc:
            if self._rows_checked:
                raise ProfattrError(f"{self.path}: a value the checks did not expect ({exc}); the export looks "
                                    "damaged (export it again with `nsys export --type sqlite`)") from None
        from profattr.trace.validate import hide_damaged_rows

        self._rows_checked = True
        for table, reasons in hide_damaged_rows(self).items():
            before = self.claims.skipped.get(table, {})
            self.claims.skipped[table] = {**before, **reasons, "rows": before.get("rows", 0) + reasons["rows"]}
        return self._read(read)

    def kernel_configs(self) -> dict:
        """Every kernel's device, demangled-name id, grid and block, start and duration (ns)."""
        cols = ["device", "name", "gx", "gy", "gz", "bx", "by", "bz", "start", "duration"]
        if not self.has(KERNEL):
            return {c: np.zeros(0, dtype=np.int64) for c in cols}
        return self.claims.kernel_configs(self._read(lambda: self.arrays(load_query("check_kernel_sequence"), cols)))

    def record_span(self) -> tuple:
        """(first start, last end) of the CPU-side records (CUDA calls, NVTX ranges); (None, None) without any."""
        runtime = (f'SELECT min(start) AS s, max("end") AS e FROM {RUNTIME}' if self.has(RUNTIME)
                   else "SELECT NULL AS s, NULL AS e")
        nvtx = (f'SELECT min(start), max("end") FROM {NVTX} WHERE eventType IN (59, 60) AND "end" IS NOT NULL'
                if self.has(NVTX) else "SELECT NULL, NULL")
        row = self.query(load_query("record_span", runtime=runtime, nvtx=nvtx))[0]
        return (row[0], row[1])

    def fold_api_keys(self, start):
        """`start()` given the keys process << 32 | correlationId of every recorded CUDA call, a block of rowids at a
        time (for the completeness check: memory is a block, not the table); returns it. Read again from a new
        accumulator when damaged rows had to be hidden first."""
        def fold():
            acc = start()
            if self.has(RUNTIME):
                for block in self.blocks_by_rows(RUNTIME, "r", "runtime_correlation", 1, fetch.threads()):
                    acc.add(block[0])
            return acc

        return self._read(fold)

    def api_calls(self) -> dict:
        """CUDA calls that launch, copy or wait: arrays tid, start, end, kind (0 graph, 1 kernel, 2 memory, 3 sync)."""
        if not self.has(RUNTIME):
            return {k: np.zeros(0, dtype=np.int64) for k in ("tid", "start", "end", "kind")}
        if self._api_calls is None:  # read-only arrays: the callers share them
            names = ["tid", "start", "end", "kind"]
            calls = self._read(lambda: self.claims.events(columns_of(self.blocks_by_rows(
                RUNTIME, "r", "api_calls", len(names), fetch.threads()), names, self.rows_at_most(RUNTIME)),
                "api_calls"))
            for values in calls.values():
                values.setflags(write=False)
            self._api_calls = calls
        return dict(self._api_calls)

    def host_calls(self):
        """api_calls() as a calls.ApiCalls (trace/calls.py) in start order, read once: spilled to a temporary file a block at a
        time when the CUDA-call table is long (more than calls.WHOLE_ROWS rows) and in start order, else whole."""
        if self._host_calls is None:
            spilled = None
            if self._api_calls is None and (self.rows_at_most(RUNTIME) or 0) > call_sets.WHOLE_ROWS:
                names = ["tid", "start", "end", "kind"]
                spilled = self._read(lambda: call_sets.SpilledCalls.of(self.claims.events_in_parts(
                    (dict(zip(names, block)) for block in self.blocks_by_rows(
                        RUNTIME, "r", "api_calls", len(names), fetch.threads())), "api_calls")))
            self._host_calls = spilled if spilled is not None else call_sets.WholeCalls(self.api_calls())
        return self._host_calls

    def cpu_samples(self) -> dict | None:
        """CPU samples (trace/nsys_samples.py): arrays tid, start, leaf_symbol, leaf_module, py_symbol, py_module
        (StringIds ids, -1 for no such frame); None when the capture recorded none."""
        from profattr.trace import nsys_samples

        if not nsys_samples.has_samples(self):
            return None
        return self._read(lambda: self.claims.events(nsys_samples.cpu_samples(self), "cpu_samples"))

    def sampling_period_ns(self) -> float | None:
        """The CPU sampling period (ns) the capture records; None when it says none."""
        from profattr.trace import nsys_samples

        return nsys_samples.sampling_period_ns(self)

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set:
        """Column names of `table` (empty when the table is absent)."""
        if table not in self._columns:
            if table not in self.tables:
                return set()
            self._columns[table] = {row[1] for row in self.conn.execute(f"pragma table_info('{table}')")}
        return self._columns[table]

    def column_or(self, table: str, column: str, alias: str, default: str = "NULL") -> str:
        """`alias.column` when the column exists in this export, else a constant (for optional columns)."""
        return f"{alias}.{column}" if column in self.columns(table) else default

    def query(self, sql: str, params: Sequence = ()) -> list:
        return self._run(sql, params).fetchall()

    def _run(self, sql: str, params: Sequence = ()):
        try:
            return self.conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise _database_error(self.path, exc) from None

    def arrays(self, sql: str, names: Sequence[str], params: Sequence = (), max_rows: int | None = None) -> dict:
        """Run `sql` and return its integer columns as contiguous int64 numpy arrays, without a row list.

        Rows are pulled in chunks straight into one column-major buffer (each column contiguous), so memory is
        the result plus one chunk. `max_rows`, when known (an upper bound), sizes the buffer once. NULLs must be
        replaced in SQL (COALESCE): integer columns only.
        """
        return columns_of(self._blocks(sql, params, len(names)), names, max_rows)

    def blocks_by_rows(self, table: str, alias: str, query: str, ncols: int, workers: int, **fragments):
        """The blocks of queries/<query>.sql over `table` in table order (its `{row_range}` bounds `alias`'s
        rowids): through Arrow, a range of rowids per thread on connections of their own (trace/fetch.py
        ordered_blocks); through this connection where damaged rows are hidden by its views, Arrow is not
        installed, or the table has no rowids."""
        bounds = None
        if fetch.method() == "adbc" and not self._rows_checked:
            try:
                bounds = self.query(load_query("rowid_bounds", table=table))[0]
            except ProfattrError:  # a table without rowids (not as nsys writes it): read it whole
                bounds = None
        if bounds is None:
            return self._blocks(load_query(query, **{**fragments, "row_range": "1"}), (), ncols)
        first, last = bounds
        sql = load_query(query, **{**fragments, "row_range": f"{alias}.rowid BETWEEN ? AND ?"})
        return fetch.ordered_blocks(self.path, sql, ncols, fetch.row_ranges(first, last), workers,
                                    lambda lo, hi: self._blocks(sql, (lo, hi), ncols))

    def arrays_into(self, sql: str, buf: np.ndarray, offset: int, params: Sequence = ()) -> int:
        """Run `sql` and write its integer columns into rows of `buf` (columns x rows) from column `offset`;
        returns the number of rows written. `buf` must have room (size it with `count`)."""
        filled = offset
        for block in self._blocks(sql, params, buf.shape[0]):
            buf[:, filled:filled + block.shape[1]] = block
            filled += block.shape[1]
        return filled - offset

    def _blocks(self, sql: str, params: Sequence, ncols: int):
        """The query's rows as (ncols x chunk) int64 blocks, a chunk at a time (trace/fetch.py: through Arrow when
        ADBC's SQLite driver is installed, else sqlite3; the same values either way)."""
        done = 0
        # damaged rows are hidden by TEMP views of this connection (validate.hide_damaged_rows): then sqlite3 only
        if fetch.method() == "adbc" and not self._rows_checked:
            try:
                if self._adbc is None:
                    self._adbc = fetch.adbc_connect(self.path)
                for block in fetch.adbc_blocks(self._adbc, sql, params, ncols):
                    done += block.shape[1]
                    yield block
                return
            except fetch.Unusable:
                pass  # a NULL or a non-integer value: sqlite3 says what it is (below), from where Arrow stopped
        try:
            yield from fetch.skip_rows(fetch.sqlite3_blocks(self._run(sql, params), ncols), done)
        except sqlite3.DatabaseError as exc:
            raise _database_error(self.path, exc) from None
        except (TypeError, ValueError, OverflowError):
            raise DamagedValues(f"{self.path}: a NULL, a text or a number beyond 64 bits in an integer column of a "
                                "query; the export looks damaged (re-export it with `nsys export --type sqlite`)"
                                ) from None

    def rows_at_most(self, table: str) -> int | None:
        """An upper bound of the rows of `table` from its first and last rowid (no scan), None when unknown: a
        buffer of that size is filled without growing, and the pages it never fills are never touched (they take
        no memory)."""
        try:
            first, last = self.query(load_query("rowid_bounds", table=table))[0]
        except ProfattrError:
            return None
        return int(last) - int(first) + 1 if first is not None and last is not None else 0

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT count(*) FROM {table}")[0][0]) if self.has(table) else 0

    def strings(self, ids: Iterable[int]) -> dict:
        """StringIds values for the given ids (nsys interns every name)."""
        ids = sorted({int(i) for i in ids if i is not None and int(i) >= 0})
        out: dict = {}
        for chunk_start in range(0, len(ids), 900):  # stay under SQLite's bound-parameter limit
            chunk = ids[chunk_start:chunk_start + 900]
            marks = ",".join("?" * len(chunk))
            out.update(self.query(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", chunk))
        # a BLOB where the text belongs (a damaged row) is decoded like text
        return {k: _text(v) if isinstance(v, bytes) else str(v) for k, v in out.items() if v is not None}

    @property
    def gpus(self) -> list:
        """GPUs described in the export (TARGET_INFO_GPU, when the capture recorded it)."""
        if not self.has("TARGET_INFO_GPU"):
            return []
        cols = self.columns("TARGET_INFO_GPU")
        wanted = [c for c in ("id", "name", "busLocation", "computeMajor", "computeMinor", "smCount",
                              "memoryBandwidth", "totalMemory", "clockRate", "uuid") if c in cols]
        rows = self.query(f"SELECT {', '.join(wanted)} FROM TARGET_INFO_GPU ORDER BY 1")
        # a BLOB where a number or a name belongs (a damaged table) would not survive JSON: shown as text
        return [{k: _text(v) if isinstance(v, bytes) else v for k, v in zip(wanted, row)} for row in rows]

    def close(self) -> None:
        if self._host_calls is not None:
            self._host_calls.close()
            self._host_calls = None
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _database_error(path: Path, exc: Exception) -> ProfattrError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return ProfattrError(f"{path}: the database is locked by another process; wait for nsys to finish "
                             "writing it, or copy it and open the copy")
    if "readonly" in text or "read-only" in text:
        return ProfattrError(f"{path}: an unfinished write left {path.name}-journal beside it (the writer crashed "
                             "or is still running); let it finish, or export the capture again")
    if "malformed" in text or "not a database" in text or "disk I/O" in text or "file is not" in text:
        return ProfattrError(f"{path}: the SQLite file is damaged or truncated ({text}); "
                             "export it again with `nsys export --type sqlite --force-overwrite true`")
    return ProfattrError(f"{path}: SQLite error: {text}")


def _text(raw: bytes) -> str:
    """SQLite TEXT as str: UTF-8, an invalid byte becomes U+FFFD (names from damaged or foreign exports)."""
    return raw.decode("utf-8", errors="replace")


def connect_read_only(path: Path, head: bytes) -> sqlite3.Connection:
    """A connection that can neither write the file nor create anything beside it (`mode=ro&immutable=1`).

    immutable=1 also means SQLite takes no locks and reads no journal, so first: a rollback-journal file (header
    byte 18 = 1) is probed with a plain read-only connection, which says "locked" while a writer holds it and
    refuses a hot journal (an unfinished write), and creates nothing; a WAL file (byte 18 = 2) is not probed (a
    read-only connection would create -shm and -wal beside it) and is refused while a -wal with changes not yet
    checkpointed into it lies beside it, since those changes would be missed.
    """
    uri = path.resolve().as_uri()
    if len(head) > 18 and head[18] == 2:
        wal = path.with_name(path.name + "-wal")
        if inputs.is_regular_file(wal) and os.path.getsize(wal) > 0:
            raise ProfattrError(f"{path}: a WAL-mode database with changes still in {wal.name} beside it; "
                                "checkpoint them first (sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)') or finish "
                                "writing it, then read it")
    else:
        probe = None
        try:
            probe = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=0)
            probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise _database_error(path, exc) from None
        finally:
            if probe is not None:
                probe.close()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    except sqlite3.DatabaseError as exc:
        raise _database_error(path, exc) from None
    conn.text_factory = _text
    conn.execute("PRAGMA temp_store = MEMORY")  # the TEMP views of validate.py: never a file
    return conn


def open_export(path) -> Export:
    """Open an nsys SQLite export read-only and immutable, check what its tables claim (trace/validate.py); raise
    ProfattrError with one clear line when it is not one."""
    from profattr.trace.validate import Claims, check_structure, session_of

    path = inputs.regular_file(path, "an Nsight Systems export (.sqlite) or a .nsys-rep",
                               folder_hint="give the .sqlite (or .nsys-rep) file inside it")
    try:
        with path.open("rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        raise ProfattrError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not head.startswith(SQLITE_MAGIC):
        raise ProfattrError(f"{path}: not a SQLite file; give an Nsight Systems export "
                            "(`nsys export --type sqlite REPORT.nsys-rep`) or the .nsys-rep itself")
    conn = connect_read_only(path, head)
    export = Export(path=path, conn=conn)
    try:
        export.tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in export.tables), None)
        if "StringIds" not in export.tables and meta_table is None:
            raise ProfattrError(f"{path}: a SQLite file, but not an Nsight Systems export (no StringIds or "
                                "META_DATA_EXPORT table)")
        if meta_table is not None:
            meta = {str(k): v for k, v in export.query(f"SELECT name, value FROM {meta_table}")}
            export.schema_version = _text_or_none(meta.get("EXPORT_SCHEMA_VERSION"))
            export.nsys_version = _text_or_none(meta.get("EXPORT_PRODUCT_VERSION"))
        check_structure(export)
        export.claims = Claims(path, session_of(export), starts=lambda: _kernel_starts(export))
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _database_error(path, exc) from None
    except BaseException:
        conn.close()
        raise
    return export


def _kernel_starts(export: Export) -> np.ndarray:
    """Every kernel's start (ns): the time range's bulk, when it is asked for before the ops are read."""
    if not export.has(KERNEL):
        return np.zeros(0, dtype=np.int64)
    return export.arrays('SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL AS k', ["start"])["start"]


def _text_or_none(value):
    return None if value is None else str(value)


def resolve_capture(path, force: bool = False, nsys: str | None = None, kind: str | None = None) -> Path:
    """The SQLite export for `path`: the file itself, or for a .nsys-rep (by name, or `kind="report"` when its
    content says so) the .sqlite beside it (exported with nsys when missing or older than the report; an existing
    newer one is reused, an older one is replaced only with `force`)."""
    path = Path(path)
    if path.suffix not in (".nsys-rep", ".qdrep") and kind != "report":
        return path
    inputs.regular_file(path, "an Nsight Systems report (.nsys-rep)")
    out = path.with_suffix(".sqlite") if path.suffix in (".nsys-rep", ".qdrep") else path.with_name(path.name + ".sqlite")
    if out.exists() and out.stat().st_mtime >= path.stat().st_mtime:
        return out
    if out.exists() and not force:
        raise ProfattrError(f"{out} exists but is older than {path.name}; pass --force to export it again")
    # running nsys is a tool wrapper both stages use; import lazily so analysis of .sqlite files never needs it
    from profattr.tools import nsys as nsys_tool

    nsys_tool.export_sqlite(path, out, nsys=nsys, force=True)
    return out


def columns_of(blocks, names: Sequence[str], max_rows: int | None = None) -> dict:
    """(len(names) x n) int64 blocks gathered into one contiguous array per column (Export.arrays). `max_rows`, an
    upper bound of the rows, sizes the buffer at once: the part of each column never filled is never touched, so it
    takes no memory, and nothing is copied as the rows come."""
    buf = np.empty((len(names), max(int(max_rows or 0), 1)), dtype=np.int64)
    filled = 0
    for block in blocks:
        n = block.shape[1]
        if filled + n > buf.shape[1]:
            # grow by a quarter: a doubling buffer of millions of rows would double the peak memory
            grown = np.empty((len(names), max(buf.shape[1] + buf.shape[1] // 4, filled + n)), dtype=np.int64)
            grown[:, :filled] = buf[:, :filled]
            buf = grown
        buf[:, filled:filled + n] = block
        filled += n
    return {name: buf[i, :filled] for i, name in enumerate(names)}
