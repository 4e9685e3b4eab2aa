"""Bulk fetch of integer query results into numpy blocks: through Arrow (ADBC's SQLite driver) when it is installed,
else through the standard sqlite3 module.

Both run the same SQL on the same file and yield the same int64 values; Arrow skips the Python object made for every
value (sqlite3 builds a tuple per row), which is most of the cost of reading millions of GPU ops
(benchmarks/RESULTS.md: fetch methods side by side). `PROFATTR_FETCH=sqlite3` forces the standard module.

A big table is fetched faster in ranges of rowids, several at once (`ordered_blocks`): SQLite and Arrow work without
Python's lock, so each thread with its own connection keeps a core busy, and the rows still come in table order.
"""
from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from profattr import cores

CHUNK_ROWS = 65536  # rows per block: bounds what is alive at once
RANGE_ROWS = 4 * CHUNK_ROWS  # rowids per range of ordered_blocks (a few blocks: bounds what is fetched ahead)
MAX_THREADS = 4  # SQLite's scan of one file gains little beyond this


def method() -> str:
    """'adbc' when ADBC's SQLite driver is importable (and not turned off), else 'sqlite3'."""
    if os.environ.get("PROFATTR_FETCH", "").lower() == "sqlite3":
        return "sqlite3"
    try:
        import adbc_driver_sqlite.dbapi  # noqa: F401
    except ImportError:
        return "sqlite3"
    return "adbc"


class Unusable(Exception):
    """Arrow could not give int64 columns for this query (a NULL, a REAL, a text): the caller falls back."""


def adbc_connect(path: Path):
    """A read-only ADBC connection (mode=ro&immutable=1, as the reader's own: nothing is ever written or created
    beside the capture)."""
    import adbc_driver_sqlite.dbapi as dbapi

    return dbapi.connect(f"{Path(path).resolve().as_uri()}?mode=ro&immutable=1")


def adbc_blocks(conn, sql: str, params: Sequence, ncols: int) -> Iterator[np.ndarray]:
    """(ncols x rows) int64 blocks of the query's record batches; raises Unusable on a non-integer column."""
    from adbc_driver_sqlite import StatementOptions

    cur = conn.cursor()
    try:
        cur.adbc_statement.set_options(**{StatementOptions.BATCH_ROWS.value: str(CHUNK_ROWS)})
        cur.execute(sql, tuple(params) if params else None)
        reader = cur.fetch_record_batch()
        for batch in reader:
            if batch.num_columns != ncols:
                raise Unusable(f"{batch.num_columns} columns, expected {ncols}")
            n = batch.num_rows
            if n == 0:
                continue
            block = np.empty((ncols, n), dtype=np.int64)
            for i in range(ncols):
                col = batch.column(i)
                if col.null_count or not _is_integer(col.type):
                    raise Unusable(f"column {i}: {col.type}, {col.null_count} NULLs")
                block[i] = col.to_numpy(zero_copy_only=False)
            yield block
    except Unusable:
        raise
    except Exception as exc:  # the driver's own errors (type changes between batches): let sqlite3 decide
        raise Unusable(str(exc)) from None
    finally:
        cur.close()


def threads() -> int:
    """Threads that fetch at once: the cores this process may use, at most MAX_THREADS (PROFATTR_FETCH_THREADS
    sets it; with 1, one thread still fetches ahead of the caller)."""
    return cores.threads("PROFATTR_FETCH_THREADS", MAX_THREADS)


def row_ranges(first: int | None, last: int | None, size: int = RANGE_ROWS) -> list:
    """(lo, hi) rowid ranges, both ends included, that cover first..last in order."""
    if first is None or last is None:
        return []
    return [(lo, min(lo + size - 1, last)) for lo in range(int(first), int(last) + 1, size)]


def ordered_blocks(path: Path, sql: str, ncols: int, ranges: Iterable, workers: int,
                   fallback: Callable[[int, int], Iterator[np.ndarray]]) -> Iterator[np.ndarray]:
    """The (ncols x rows) blocks of `sql`, whose two parameters bound a rowid range, over each (lo, hi) of
    `ranges`, in the order of the ranges: up to `workers` ranges are fetched at once, each thread through a
    read-only ADBC connection of its own, and at most workers + 1 ranges are held ahead of the caller. A range
    Arrow cannot give as integers (Unusable) is fetched by `fallback(lo, hi)` in the caller's thread, which says
    what is wrong in its own words."""
    from concurrent.futures import ThreadPoolExecutor

    conns: dict = {}  # thread id -> its connection
    lock = threading.Lock()

    def fetch_range(lo: int, hi: int):
        me = threading.get_ident()
        with lock:
            conn = conns.get(me)
        if conn is None:
            conn = adbc_connect(path)
            with lock:
                conns[me] = conn
        try:
            return list(adbc_blocks(conn, sql, (lo, hi), ncols))
        except Unusable:
            return None

    todo = iter(ranges)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="profattr-fetch")
    ahead: deque = deque()
    try:
        for lo, hi in itertools.islice(todo, max(1, workers) + 1):
            ahead.append((lo, hi, pool.submit(fetch_range, lo, hi)))
        while ahead:
            lo, hi, done = ahead.popleft()
            following = next(todo, None)
            if following is not None:
                ahead.append((*following, pool.submit(fetch_range, *following)))
            blocks = done.result()
            if blocks is None:
                yield from fallback(lo, hi)
            else:
                while blocks:
                    yield blocks.pop(0)  # let each block go once the caller has it
    finally:
        for _, _, pending in ahead:
            pending.cancel()
        pool.shutdown(wait=True)
        for conn in conns.values():
            conn.close()


def _is_integer(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(arrow_type) or pa.types.is_null(arrow_type)


def sqlite3_blocks(cursor: sqlite3.Cursor, ncols: int) -> Iterator[np.ndarray]:
    """(ncols x rows) int64 blocks of an executed sqlite3 cursor (TypeError on a NULL)."""
    while True:
        chunk = cursor.fetchmany(CHUNK_ROWS)
        if not chunk:
            return
        n = len(chunk)
        yield np.fromiter(itertools.chain.from_iterable(chunk), dtype=np.int64, count=n * ncols).reshape(n, ncols).T


def skip_rows(blocks: Iterator[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    """The blocks without their first `rows` rows (to resume a query another method started)."""
    for block in blocks:
        if rows >= block.shape[1]:
            rows -= block.shape[1]
            continue
        yield block[:, rows:]
        rows = 0
