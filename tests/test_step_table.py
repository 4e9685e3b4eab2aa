"""The budget's step x category matrices (attribute/step_table.py) on real captures, against SQL written here.

The ops and their steps come from SQL on the export (tests/independent.py's step definitions, as in
test_exclusive.py); the op time and count of each (device, step, category) is a GROUP BY in SQL, each op's category
being the one the budget gave it (the classification is tested elsewhere). Every cell of the matrices must equal
those sums and every other cell be 0; the exclusive cells add up to each step's busy time (the split itself is
test_exclusive.py's).
"""
from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest

from independent import MEMOPS, OPS_CTE, _connect, _tables
from profattr.attribute.budget import compute_budget
from profattr.attribute.step_table import StepCategories
from test_exclusive import categories_by_op, step_cte

# one GPU with CUDA graphs (one stream; two streams), eager launches (SGLang; a loop of the built-in workload)
CAPTURES = ["sglang-triton-bs1", "glm5/glm-triton-bs4-r1", "glm5/glm-triton-eager", "wl-eager-loop"]


def expected_cells(path, name: str) -> dict:
    """{(device, first start of the step, category): [ns, count]}: SQL GROUP BY over the ops launched inside each
    step, each op joined to the category the budget gave it (a temporary table of (device, start, end, demangled
    name) -> category: a kernel's category may depend on its NVTX context, so it is given per op)."""
    cte, params = step_cte(name, path)
    by_op = categories_by_op(path)
    conn = _connect(path)
    conn.execute("CREATE TEMP TABLE op_category (dev INT, s INT, e INT, demangled TEXT, category TEXT)")
    conn.executemany("INSERT INTO op_category VALUES (?, ?, ?, ?, ?)", [(*k, c) for k, c in by_op.items()])
    memops = "".join(q for t, q in MEMOPS.items() if t in _tables(conn))
    rows = conn.execute("WITH " + OPS_CTE.format(memops=memops) + "," + cte + """,
        assigned AS (SELECT ops.*, steps.step FROM ops JOIN steps
                       ON steps.stid = ops.tid AND ops.api BETWEEN steps.ss AND steps.se),
        firsts AS (SELECT dev, step, min(s) AS first FROM assigned GROUP BY dev, step)
        SELECT a.dev, f.first, c.category, sum(a.e - a.s), count(*)
        FROM assigned a JOIN firsts f USING (dev, step)
        JOIN op_category c ON c.dev = a.dev AND c.s = a.s AND c.e = a.e AND c.demangled = a.demangled
        GROUP BY a.dev, a.step, c.category""", params).fetchall()
    conn.close()
    return {(dev, first, cat): [ns, count] for dev, first, cat, ns, count in rows}


@pytest.mark.parametrize("name", CAPTURES)
def test_matrices_hold_the_sql_sums(name, export_example):
    path = export_example(name)
    want = expected_cells(path, name)
    b = compute_budget(path)
    table = b.per_step_category
    assert isinstance(table, StepCategories)
    first = {(int(d), int(s)): int(t) for d, s, t in b.per_step[["device", "step", "start_ns"]].to_numpy()}
    got = {}
    for i, (dev, step) in enumerate(zip(table.device.tolist(), table.step.tolist())):
        for j, cat in enumerate(table.categories):
            if table.count[i, j] or table.ns[i, j] or table.exclusive_ns[i, j]:
                got[(dev, first[(dev, step)], cat)] = [int(table.ns[i, j]), int(table.count[i, j])]
    assert got == want
    # per step, the exclusive cells add up to the step's busy time, and only categories that ran have any
    busy = b.per_step.set_index(["device", "step"])["busy_ns"]
    for i, (dev, step) in enumerate(zip(table.device.tolist(), table.step.tolist())):
        assert int(table.exclusive_ns[i].sum()) == int(busy.loc[(dev, step)])
    assert not (table.has_exclusive & (table.count == 0)).any()
    assert ((table.exclusive_ns > 0) <= table.has_exclusive).all()


@pytest.mark.parametrize("name", CAPTURES[1:])
def test_frame_rows_and_table_agree_with_the_matrices(name, export_example):
    """frame() lists one row per cell that ran, in (device, step) then column order; rows() gives the same values
    (the ledger's), from_frame() builds the same matrices back, table() reindexes by any step order."""
    path = export_example(name)
    table = compute_budget(path).per_step_category
    frame = table.frame()
    assert list(frame.columns) == ["device", "step", "category", "ns", "count", "exclusive_ns"]
    assert len(frame) == len(table) == int((table.count > 0).sum())
    assert frame["ns"].sum() == table.ns.sum() and frame["count"].sum() == table.count.sum()
    assert frame.set_index(["device", "step"]).index.is_monotonic_increasing
    position = frame["category"].map({c: j for j, c in enumerate(table.categories)})
    assert (position.groupby([frame["device"], frame["step"]]).diff().dropna() > 0).all()
    rows = list(table.rows({"device": "device", "step": "step", "category": "category", "ns": "duration_ns",
                            "count": "count", "exclusive_ns": "exclusive_ns"}, entry_id=7))
    assert [(r["device"], r["step"], r["category"], r["duration_ns"], r["count"], r["exclusive_ns"], r["entry_id"])
            for r in rows] == [(*t, 7) for t in frame.itertuples(index=False, name=None)]
    back = StepCategories.from_frame(frame)
    order = [table.categories.index(c) for c in back.categories]
    assert (back.ns == table.ns[:, order]).all() and (back.count == table.count[:, order]).all()
    assert (back.exclusive_ns == table.exclusive_ns[:, order]).all()
    dev = int(table.device[0])
    own = table.step[table.rows_of(dev)]
    steps = np.r_[own[::-1], own.max() + 1000]  # reversed, and a step without work
    m = table.table(dev, steps, "ns")
    assert (m[:-1] == table.ns[table.rows_of(dev)][::-1]).all() and not m[-1].any()


def test_ledger_rows_match_sql_on_the_export(export_example, tmp_path):
    """`ledger add` writes the matrices' cells as rows: their sums per (device, step) equal the SQL sums."""
    from profattr.ledger.record import add_captures

    name = "glm5/glm-triton-bs4-r1"
    path = export_example(name)
    want = expected_cells(path, name)
    add_captures(tmp_path / "l.db", [path])
    conn = sqlite3.connect(tmp_path / "l.db")
    got = {(d, s, c): [ns, n] for d, s, c, ns, n in conn.execute(
        "SELECT c.device, s.start_ns, c.category, c.duration_ns, c.count FROM step_categories c "
        "JOIN steps s USING (entry_id, device, step)")}
    conn.close()
    assert got == want


def test_to_pandas_keeps_the_per_row_table(export_example):
    """The notebook API's step_categories frame: one row per (device, step, category) that ran, built from the
    matrices on demand."""
    from profattr.api import Capture

    name = "glm5/glm-triton-bs4-r1"
    path = export_example(name)
    want = expected_cells(path, name)
    tables = Capture(path).budget().to_pandas()
    steps = tables["steps"].set_index(["device", "step"])["start_ns"]
    frame = tables["step_categories"]
    assert isinstance(frame, pd.DataFrame)
    got = {(int(r.device), int(steps.loc[(r.device, r.step)]), r.category): [int(r.ns), int(r.count)]
           for r in frame.itertuples()}
    assert got == want
