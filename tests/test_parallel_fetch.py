"""The op store's build fetches the kernel table in ranges of rowids on several connections at once, takes the
kernels' (demangled, short) name pairs from that same scan, and looks up the memory ops' launch calls exactly. Here,
on real captures, the store's columns are what plain SQL written in the test reads from the export: the rows in
table order (also with ranges of a few rows and rowids with gaps), each kernel's short-name id, each op's launch
call; and a name no short id can stand for still sends the budget to the export's own reader."""
from __future__ import annotations

import json
import shutil
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from profattr.cli import cli
from profattr.trace import fetch, store_build
from profattr.trace.reader import open_export

KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
# graph and eager, one GPU and two, with memcpys and memsets
CAPTURES = ["sglang-triton-bs1", "sglang-triton-bs1-eager", "wl-graph-grouped-tp2", "wl-eager-loop"]


def _tables(conn) -> set:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _sql_rows(path) -> dict:
    """start, end, deviceId of every GPU op in the store's order (kernels, memcpys, memsets, each in rowid order),
    each kernel's short-name id (the smallest short id recorded with its demangled name), and each op's launch
    call (thread and start, -1 without one), read with sqlite3."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    have = _tables(conn)
    tables = [t for t in (KERNEL, MEMCPY, MEMSET) if t in have]
    cols = {"start": [], "end": [], "device": [], "name_id": [], "launch_tid": [], "launch_ns": []}
    pairs = ("WITH pairs AS (SELECT COALESCE(demangledName, shortName) AS demangled, min(shortName) AS short "
             f"FROM {KERNEL} GROUP BY 1) ")
    for table in tables:
        kernel = table == KERNEL
        rows = conn.execute(
            (pairs if kernel else "")
            + f'SELECT o.start, o."end", o.deviceId, {"p.short" if kernel else "0"}, COALESCE(r.globalTid, -1), '
            f"COALESCE(r.start, -1) FROM {table} o LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = o.correlationId AND (r.globalTid & -16777216) = (o.globalPid & -16777216) "
            + ("LEFT JOIN pairs p ON p.demangled = COALESCE(o.demangledName, o.shortName) " if kernel else "")
            + "ORDER BY o.rowid").fetchall()
        for key, values in zip(cols, zip(*rows)):
            cols[key].extend(values)
    conn.close()
    return {k: np.array(v, dtype=np.int64) for k, v in cols.items()} | {"kernels": _count(path, KERNEL)}


def _count(path, table) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def _store_columns(export, folder, size: int) -> dict:
    built = store_build.build(export, folder, size=size)
    return {name: built.column(name) for name in ("start", "end", "device", "name_id", "launch_tid", "launch_ns")}


def _assert_store_is_sql(path, got: dict) -> None:
    want = _sql_rows(path)
    n = want["kernels"]
    for column in ("start", "end", "device", "launch_tid", "launch_ns"):
        assert np.array_equal(got[column].astype(np.int64), want[column]), column
    assert np.array_equal(got["name_id"][:n].astype(np.int64), want["name_id"][:n])


@pytest.mark.parametrize("name", CAPTURES)
def test_ranges_on_two_threads_read_the_table_in_order(name, export_example, tmp_path, monkeypatch):
    path = export_example(name)
    monkeypatch.setenv("PROFATTR_FETCH_THREADS", "2")
    monkeypatch.setattr(fetch, "RANGE_ROWS", 1000)  # many ranges, several fetched ahead
    monkeypatch.setattr(fetch, "CHUNK_ROWS", 300)  # several blocks per range
    with open_export(path) as export:
        got = _store_columns(export, tmp_path / "store", size=777)
    _assert_store_is_sql(path, got)


def test_rowids_with_gaps(export_example, tmp_path, monkeypatch):
    """Rows deleted from a copy of a real capture: a range can hold fewer rows than its width, or none."""
    path = tmp_path / "gaps.sqlite"
    shutil.copyfile(export_example("sglang-triton-bs1"), path)
    conn = sqlite3.connect(path)
    conn.execute(f"DELETE FROM {KERNEL} WHERE rowid % 7 = 3 OR rowid BETWEEN 2000 AND 4500")
    conn.commit()
    conn.close()
    monkeypatch.setenv("PROFATTR_FETCH_THREADS", "3")
    monkeypatch.setattr(fetch, "RANGE_ROWS", 500)
    with open_export(path) as export:
        got = _store_columns(export, tmp_path / "store", size=4096)
    _assert_store_is_sql(path, got)


def test_one_thread_and_sqlite3_give_the_same_store(export_example, tmp_path, monkeypatch):
    path = export_example("wl-graph-grouped-tp2")
    stores = []
    for i, (threads, method) in enumerate((("1", ""), ("4", ""), ("2", "sqlite3"))):
        monkeypatch.setenv("PROFATTR_FETCH_THREADS", threads)
        monkeypatch.setenv("PROFATTR_FETCH", method)
        with open_export(path) as export:
            stores.append(_store_columns(export, tmp_path / f"store{i}", size=2048))
    for other in stores[1:]:
        for column, values in stores[0].items():
            assert np.array_equal(values, other[column]), column


def test_row_ranges_cover_the_rowids_once():
    assert fetch.row_ranges(None, None) == []
    assert fetch.row_ranges(5, 5, size=3) == [(5, 5)]
    assert fetch.row_ranges(1, 10, size=4) == [(1, 4), (5, 8), (9, 10)]


def test_a_kernel_name_without_a_short_id_is_read_by_the_export(export_example, tmp_path, cache_off):
    """Every row of one demangled name with a short-name id beyond 31 bits: no short id can stand for it, so the
    store is not built and the budget is the export reader's, which counts those rows as damaged and leaves them
    out."""
    path = tmp_path / "nameless.sqlite"
    shutil.copyfile(export_example("sglang-triton-bs1"), path)
    conn = sqlite3.connect(path)
    damaged = conn.execute(f"UPDATE {KERNEL} SET shortName = 8589934593 WHERE demangledName = "
                           f"(SELECT demangledName FROM {KERNEL} WHERE rowid = 1)").rowcount
    conn.commit()
    conn.close()
    assert damaged >= 1
    with open_export(path) as export:
        with pytest.raises(store_build.DamagedValues):
            store_build.build(export, tmp_path / "store")
    assert not (tmp_path / "store").exists()  # nothing half-written is left
    result = CliRunner().invoke(cli, ["budget", str(path), "--format", "json", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert f"skipped {damaged} damaged row(s)" in result.stderr
    assert json.loads(result.stdout)["devices"]


@pytest.fixture
def cache_off(monkeypatch):
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")
