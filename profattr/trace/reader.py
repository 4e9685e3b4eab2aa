"""Open an Nsight Systems SQLite export read-only and describe what it holds.

Exports differ between nsys versions (2022.x to 2026.x): tables exist only when they have rows ("lazy" export),
columns come and go, the metadata table was renamed. Everything here probes `sqlite_master` and
`pragma table_info` instead of assuming a layout.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from profattr.errors import ProfattrError

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
CHUNK_ROWS = 65536  # rows fetched per step: bounds the Python objects alive at once
QUERIES_DIR = Path(__file__).resolve().parent.parent / "queries"


def load_query(name: str, **fragments: str) -> str:
    """The SQL text of `queries/<name>.sql`, with `{fragment}` placeholders filled (for optional columns)."""
    path = QUERIES_DIR / f"{name}.sql"
    text = path.read_text()
    return text.format(**fragments) if fragments else text


@dataclass
class Export:
    """A read-only view of one nsys SQLite export, and the reader interface every capture format offers:
    ops(), ranges(), graph_launches(), node_creation(), api_calls(), kernel_configs(), strings(ids), gpus."""

    path: Path
    conn: sqlite3.Connection
    tables: set = field(default_factory=set)
    schema_version: str | None = None
    nsys_version: str | None = None
    _columns: dict = field(default_factory=dict, repr=False)
    _adbc: object = field(default=None, repr=False)  # a second, Arrow connection (trace/fetch.py), opened on use
    format = "nsys"

    @property
    def tool_version(self) -> str | None:
        return self.nsys_version

    # --- the reader interface (the SQL lives in queries/, the array work in nsys_tables.py) -------------------
    def ops(self, include_memory: bool = True):
        from profattr.trace.nsys_tables import load_ops

        return load_ops(self, include_memory)

    def ranges(self):
        from profattr.trace.nsys_tables import load_ranges

        return load_ranges(self)

    def graph_launches(self):
        from profattr.trace.nsys_tables import graph_launches

        return graph_launches(self)

    def node_creation(self):
        from profattr.trace.nsys_tables import node_creation

        return node_creation(self)

    def kernel_configs(self) -> dict:
        """Every kernel's device, demangled-name id, grid and block, start and duration (ns)."""
        cols = ["device", "name", "gx", "gy", "gz", "bx", "by", "bz", "start", "duration"]
        if not self.has(KERNEL):
            return {c: np.zeros(0, dtype=np.int64) for c in cols}
        return self.arrays(load_query("check_kernel_sequence"), cols)

    def record_span(self) -> tuple:
        """(first start, last end) of the CPU-side records (CUDA calls, NVTX ranges); (None, None) without any."""
        runtime = (f'SELECT min(start) AS s, max("end") AS e FROM {RUNTIME}' if self.has(RUNTIME)
                   else "SELECT NULL AS s, NULL AS e")
        nvtx = (f'SELECT min(start), max("end") FROM {NVTX} WHERE eventType IN (59, 60) AND "end" IS NOT NULL'
                if self.has(NVTX) else "SELECT NULL, NULL")
        row = self.query(load_query("record_span", runtime=runtime, nvtx=nvtx))[0]
        return (row[0], row[1])

    def api_keys(self) -> np.ndarray:
        """process << 32 | correlationId of every recorded CUDA call (for the completeness check)."""
        if not self.has(RUNTIME):
            return np.zeros(0, dtype=np.int64)
        return self.arrays(load_query("runtime_correlation"), ["key"], max_rows=self.count(RUNTIME))["key"]

    def api_calls(self) -> dict:
        """CUDA calls that launch, copy or wait: arrays tid, start, end, kind (0 graph, 1 kernel, 2 memory, 3 sync)."""
        if not self.has(RUNTIME):
            return {k: np.zeros(0, dtype=np.int64) for k in ("tid", "start", "end", "kind")}
        return self.arrays(load_query("api_calls"), ["tid", "start", "end", "kind"])

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
        buf = np.empty((len(names), max(int(max_rows or 0), 1)), dtype=np.int64)
        filled = 0
        for block in self._blocks(sql, params, len(names)):
            n = block.shape[1]
            if filled + n > buf.shape[1]:
                # grow by a quarter: a doubling buffer of millions of rows would double the peak memory
                grown = np.empty((len(names), max(buf.shape[1] + buf.shape[1] // 4, filled + n)), dtype=np.int64)
                grown[:, :filled] = buf[:, :filled]
                buf = grown
            buf[:, filled:filled + n] = block
            filled += n
        return {name: buf[i, :filled] for i, name in enumerate(names)}

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
        from profattr.trace import fetch

        done = 0
        if fetch.method() == "adbc":
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
        except TypeError:
            raise ProfattrError(f"{self.path}: unexpected NULL in an integer column of a query; "
                                "the export looks damaged (re-export it with `nsys export --type sqlite`)") from None

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
        return out

    @property
    def gpus(self) -> list:
        """GPUs described in the export (TARGET_INFO_GPU, when the capture recorded it)."""
        if not self.has("TARGET_INFO_GPU"):
            return []
        cols = self.columns("TARGET_INFO_GPU")
        wanted = [c for c in ("id", "name", "busLocation", "computeMajor", "computeMinor", "smCount",
                              "memoryBandwidth", "totalMemory", "clockRate", "uuid") if c in cols]
        rows = self.query(f"SELECT {', '.join(wanted)} FROM TARGET_INFO_GPU ORDER BY 1")
        return [dict(zip(wanted, row)) for row in rows]

    def close(self) -> None:
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
    if "locked" in text:
        return ProfattrError(f"{path}: the database is locked by another process; wait for nsys to finish "
                             "writing it, or copy it and open the copy")
    if "malformed" in text or "not a database" in text or "disk I/O" in text:
        return ProfattrError(f"{path}: the SQLite file is damaged or truncated ({text}); "
                             "export it again with `nsys export --type sqlite --force-overwrite true`")
    return ProfattrError(f"{path}: SQLite error: {text}")


def open_export(path) -> Export:
    """Open an nsys SQLite export read-only; raise ProfattrError with one clear line when it is not one."""
    path = Path(path)
    if not path.exists():
        raise ProfattrError(f"{path}: no such file")
    if path.is_dir():
        raise ProfattrError(f"{path}: is a folder; give the .sqlite (or .nsys-rep) file inside it")
    with path.open("rb") as fh:
        head = fh.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise ProfattrError(f"{path}: not a SQLite file; give an Nsight Systems export "
                            "(`nsys export --type sqlite REPORT.nsys-rep`) or the .nsys-rep itself")
    # mode=ro: the user's capture is never written. No journal or lock files are created beside it.
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    export = Export(path=path, conn=conn)
    try:
        export.tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _database_error(path, exc) from None
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in export.tables), None)
    if "StringIds" not in export.tables and meta_table is None:
        conn.close()
        raise ProfattrError(f"{path}: a SQLite file, but not an Nsight Systems export (no StringIds or "
                            "META_DATA_EXPORT table)")
    if meta_table is not None:
        meta = dict(export.query(f"SELECT name, value FROM {meta_table}"))
        export.schema_version = meta.get("EXPORT_SCHEMA_VERSION")
        export.nsys_version = meta.get("EXPORT_PRODUCT_VERSION")
    return export


def resolve_capture(path, force: bool = False, nsys: str | None = None, kind: str | None = None) -> Path:
    """The SQLite export for `path`: the file itself, or for a .nsys-rep (by name, or `kind="report"` when its
    content says so) the .sqlite beside it (exported with nsys when missing or older than the report; an existing
    newer one is reused, an older one is replaced only with `force`)."""
    path = Path(path)
    if path.suffix not in (".nsys-rep", ".qdrep") and kind != "report":
        return path
    if not path.exists():
        raise ProfattrError(f"{path}: no such file")
    out = path.with_suffix(".sqlite") if path.suffix in (".nsys-rep", ".qdrep") else path.with_name(path.name + ".sqlite")
    if out.exists() and out.stat().st_mtime >= path.stat().st_mtime:
        return out
    if out.exists() and not force:
        raise ProfattrError(f"{out} exists but is older than {path.name}; pass --force to export it again")
    # running nsys is a tool wrapper both stages use; import lazily so analysis of .sqlite files never needs it
    from profattr.tools import nsys as nsys_tool

    nsys_tool.export_sqlite(path, out, nsys=nsys, force=True)
    return out


def run_json_path(capture) -> Path:
    """NAME.run.json beside NAME.sqlite / NAME.nsys-rep / NAME.qdstrm (written by `profattr capture`)."""
    capture = Path(capture)
    name = capture.name
    for suffix in (".sqlite", ".nsys-rep", ".qdstrm"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return capture.with_name(name + ".run.json")
