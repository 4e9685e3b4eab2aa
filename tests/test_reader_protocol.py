"""The one reader interface (profattr/trace/protocol.py): each reader defines every member itself, a real capture of
each kind answers them with the documented types, merged ranks name their kernels as each rank's SQL does, and no
module above trace/ probes a reader with hasattr/getattr."""
from __future__ import annotations

import ast
import inspect
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from independent import sql as _sql
from profattr.attribute.many import MergedSource
from profattr.trace.cache import StoreSource, open_store
from profattr.trace.kineto import KinetoTrace
from profattr.trace.protocol import KeyBlocks
from profattr.trace.ops import Ops
from profattr.trace.protocol import Reader, is_reader
from profattr.trace.reader import Export, open_export

ROOT = Path(__file__).resolve().parents[1]
SQLITE = ROOT / "examples/h200/sglang-triton-bs1.sqlite"
TORCH = ROOT / "examples/h200/glm5-attach/glm-attach-bs1-r1-TP-0.trace.json.gz"
MEMBERS = [name for name in dir(Reader) if not name.startswith("_")] + list(Reader.__annotations__)
DATA = set(Reader.__annotations__) | {n for n in MEMBERS if isinstance(inspect.getattr_static(Reader, n, None), property)}


@pytest.mark.parametrize("cls", [Export, StoreSource, KinetoTrace, MergedSource])
def test_every_reader_defines_every_member_itself(cls):
    """No member comes through attribute forwarding (__getattr__): each is the class's own, or set on the instance
    in its constructor (the data members)."""
    assert "__getattr__" not in cls.__dict__
    source = inspect.getsource(cls)
    for name in MEMBERS:
        own = any(name in klass.__dict__ or name in klass.__dict__.get("__annotations__", {})  # dataclass fields
                  for klass in cls.__mro__ if klass is not object)
        assigned = f"self.{name} =" in source or f"self.{name}:" in source
        assert own or (name in DATA and assigned), f"{cls.__name__} lacks {name}"


def _answers(reader, fmt: str, windows: bool, tables: bool, torch: bool) -> None:
    assert isinstance(reader, Reader) and is_reader(reader)
    assert reader.format == fmt
    ops = reader.ops()
    assert isinstance(ops, Ops) and len(ops) > 0
    ranges = reader.ranges()
    assert isinstance(ranges, pd.DataFrame) and {"start", "end", "tid", "text"} <= set(ranges.columns)
    api = reader.api_calls()
    assert set(api) == {"tid", "start", "end", "kind"} and len(api["tid"]) > 0
    assert set(np.unique(api["kind"]).tolist()) <= {0, 1, 2, 3}
    assert all(isinstance(b, np.ndarray) for b in reader.fold_api_keys(KeyBlocks).blocks)
    held = reader.host_calls()  # the same calls, in start order
    assert len(held) == len(api["tid"]) and [held.count(k) for k in range(4)] == np.bincount(api["kind"], minlength=4).tolist()
    order = np.argsort(api["start"], kind="stable")
    assert np.concatenate([b["start"] for b in held.blocks()]).tolist() == api["start"][order].tolist()
    lo, hi = reader.record_span()
    assert lo is not None and hi > lo
    configs = reader.kernel_configs()
    assert {"device", "name", "gx", "bx", "start", "duration"} <= set(configs)
    names = reader.strings(np.unique(configs["name"]))
    assert set(names) == set(np.unique(configs["name"]).tolist())
    assert (reader.time_windows() is not None) == windows
    assert (reader.nsys_tables() is not None) == tables
    assert (reader.torch_ops() is not None) == torch and (reader.python_frames() is not None) == torch
    assert reader.claims.total() == 0
    assert not is_reader(str(reader.path)) and not is_reader([reader.path])


def test_nsys_export_and_its_store_answer_the_interface(tmp_path, monkeypatch):
    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    expected_calls = _sql(SQLITE, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0]
    with open_export(SQLITE) as export:
        _answers(export, "nsys", windows=False, tables=True, torch=False)
        assert export.nsys_tables() is export
        keys = np.sort(np.concatenate(export.fold_api_keys(KeyBlocks).blocks))
        assert len(keys) == expected_calls
        assert keys.tolist() == sorted(((t >> 24) & 0xFFFFFFFF) << 32 | c for t, c in _sql(
            SQLITE, "SELECT globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
        store = open_store(export)
        try:
            _answers(store, "nsys", windows=True, tables=True, torch=False)
            assert store.nsys_tables() is export and store.claims is export.claims
        finally:
            store.close()


def test_torch_trace_answers_the_interface():
    with KinetoTrace(TORCH) as trace:
        _answers(trace, "torch", windows=False, tables=False, torch=True)
        assert trace.nsys_version is None and trace.schema_version is not None


def _swap_names(path: Path) -> tuple:
    """Swap the texts of two kernel names' string ids in this export (the most and the least launched: their counts
    differ), and the kernel rows' ids, so that an id means another name than in the other rank's export; returns
    the two ids."""
    conn = sqlite3.connect(path)
    by_count = "SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1 ORDER BY count(*) {}, 1 LIMIT 1"
    a, b = conn.execute(by_count.format("DESC")).fetchone()[0], conn.execute(by_count.format("ASC")).fetchone()[0]
    va = conn.execute("SELECT value FROM StringIds WHERE id = ?", (a,)).fetchone()[0]
    vb = conn.execute("SELECT value FROM StringIds WHERE id = ?", (b,)).fetchone()[0]
    conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (vb + "\x00tmp", a))
    conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (va, b))
    conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (vb, a))
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = CASE demangledName WHEN ? THEN ? WHEN ? "
                 "THEN ? ELSE demangledName END", (a, b, b, a))
    conn.commit()
    conn.close()
    return a, b


def test_merged_ranks_name_their_kernels_as_each_rank_does(tmp_path):
    """Two ranks whose exports intern two kernel names under swapped ids: the merged reader's kernel configurations
    name every kernel as that rank's own SQL join does, and its calls are both ranks' calls."""
    first, second = tmp_path / "r0.sqlite", tmp_path / "r1.sqlite"
    shutil.copyfile(SQLITE, first)
    shutil.copyfile(SQLITE, second)
    a, b = _swap_names(second)
    expected = []
    for path in (first, second):
        expected += [v for (v,) in _sql(path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                                              "ON s.id = k.demangledName ORDER BY k.rowid")]
    exports = [open_export(first), open_export(second)]
    merged = MergedSource(exports)
    try:
        assert isinstance(merged, Reader)
        ops = merged.ops()
        configs = merged.kernel_configs()
        names = merged.strings(np.unique(configs["name"]))
        got = [names[int(i)] for i in configs["name"]]
        assert len(got) == len(expected)
        assert sorted(got) == sorted(expected)  # the same names, as many times each
        # the swapped ids now mean two names: the second rank's are remapped, so both names keep their counts
        for name_id in (a, b):
            text = _sql(first, "SELECT value FROM StringIds WHERE id = ?", (name_id,))[0][0]
            assert got.count(text) == 2 * _sql(first, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE "
                                                      "demangledName = ?", (name_id,))[0][0]
        op_names = merged.strings(np.unique(ops.demangled_id))
        assert sorted(op_names[int(i)] for i in ops.demangled_id[ops.kind == 0]) == sorted(expected)
        calls = sum(_sql(p, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0] for p in (first, second))
        assert sum(len(b) for b in merged.fold_api_keys(KeyBlocks).blocks) == calls
        assert merged.nsys_tables() is None and merged.time_windows() is None
    finally:
        merged.close()


PROBED = ("attribute", "check", "report", "limits", "ledger")


def test_no_module_above_trace_probes_a_reader():
    """hasattr(x, ...) and getattr(x, "member", default) are how code asks which reader it holds: none above
    trace/ does (the interface answers None where a format has nothing)."""
    found = []
    for package in PROBED:
        for path in sorted((ROOT / "profattr" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                    continue
                probe = node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3
                                                       and isinstance(node.args[1], ast.Constant))
                if probe:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


KERNEL_SQL = ('SELECT deviceId, COALESCE(demangledName, shortName), gridX, gridY, gridZ, blockX, blockY, blockZ, '
              'start, "end" - start FROM CUPTI_ACTIVITY_KIND_KERNEL')
CONFIG_COLUMNS = ("device", "name", "gx", "gy", "gz", "bx", "by", "bz", "start", "duration")


@pytest.mark.parametrize("name", ["sglang-triton-bs1", "sglang-triton_kernel-bs4", "wl-graph-grouped-tp2",
                                  "wl-eager-loop"])
def test_the_store_gives_every_kernels_configuration_as_sql_does(name, export_example, tmp_path, monkeypatch):
    """The checks' kernel configurations come from the op store's columns (not a second SQL read of every kernel):
    the same rows and values as SQL selects them."""
    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    path = export_example(name)
    want = sorted(_sql(path, KERNEL_SQL))
    with open_export(path) as export:
        store = open_store(export)
        try:
            configs = store.kernel_configs()
            assert store.store.kernel_configs() is not None  # from the columns, not the SQL fallback
        finally:
            store.close()
    got = sorted(zip(*(configs[c].tolist() for c in CONFIG_COLUMNS)))
    assert got == want
