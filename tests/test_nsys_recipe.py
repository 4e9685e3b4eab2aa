"""The budget packaged as an nsys recipe (nsys_recipes/profattr_budget) runs inside a real `nsys recipe` and agrees
with `profattr budget` on the same capture."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess

import pytest

from conftest import EXAMPLES, IN_CI, ROOT, require_nsys
from profattr.attribute.budget import compute_budget

pytestmark = pytest.mark.nsys


def test_recipe_matches_budget(tmp_path):
    nsys = _need_recipe_tools(extra=())
    rep = tmp_path / "sglang-triton-bs1.nsys-rep"
    shutil.copyfile(EXAMPLES / rep.name, rep)
    env = dict(os.environ, NSYS_RECIPE_PATH=str(ROOT / "nsys_recipes"))
    out = tmp_path / "out"
    proc = subprocess.run([nsys, "recipe", "profattr_budget", "--input", str(rep), "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = list(csv.DictReader((out / "devices.csv").open()))
    assert len(rows) == 1
    expected = compute_budget(EXAMPLES / "sglang-triton-bs1.sqlite").devices[0]
    assert float(rows[0]["step_ms"]) == pytest.approx(expected["step_ms"], rel=1e-9)
    assert float(rows[0]["kernels_per_step"]) == pytest.approx(expected["kernels_per_step"], rel=1e-9)
    assert (out / "sglang-triton-bs1.budget.json").exists()


def _need_recipe_tools(extra=("distributed",)):
    nsys = require_nsys("run the nsys recipe")
    for mod in ("psutil", "pyarrow") + tuple(extra):
        try:
            __import__(mod)
        except ImportError:
            if IN_CI:
                pytest.fail(f"{mod} missing in CI (pip install -e '.[test]')")
            pytest.skip(f"{mod} missing: nsys recipes (and their Dask mode) need it")
    return nsys


def _run_recipe(nsys, tmp_path, reports, *extra):
    env = dict(os.environ, NSYS_RECIPE_PATH=str(ROOT / "nsys_recipes"), PYTHONPATH=str(ROOT),
               PROFATTR_CACHE=str(tmp_path / "cache"),
               # distributed.Client(n_workers=2, threads_per_worker=1, processes=True): a local cluster of two
               # worker processes
               NSYS_DASK_N_WORKERS="2", NSYS_DASK_THREADS_PER_WORKER="1", NSYS_DASK_PROCESSES="True")
    out = tmp_path / "out"
    proc = subprocess.run([nsys, "recipe", "profattr_budget", "--mode", "dask-futures", "--input",
                           *[str(r) for r in reports], "--output", str(out), *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    analysis = json.loads(next(out.glob("*.nsys-analysis")).read_text())
    assert analysis["Mode"] == "dask-futures"
    return {(r["file"], int(r["device"])): r for r in csv.DictReader((out / "devices.csv").open())}, out


DASK_REPORTS = ["sglang-triton-bs1", "wl-eager-loop", "wl-graph-grouped-tp2"]


def test_dask_recipe_on_several_reports_matches_one_by_one_budgets(tmp_path, export_example):
    """Three real reports (graph, eager, two ranks) on two Dask workers give the numbers of one-by-one budgets."""
    nsys = _need_recipe_tools()
    reports = []
    for name in DASK_REPORTS:
        reports.append(tmp_path / f"{name}.nsys-rep")
        shutil.copyfile(EXAMPLES / reports[-1].name, reports[-1])
    rows, out = _run_recipe(nsys, tmp_path, reports)
    for name in DASK_REPORTS:
        expected = compute_budget(export_example(name))
        for d in expected.devices:
            row = rows[(name, d["device"])]
            for key in ("step_ms", "busy_ms_per_step", "idle_ms_per_step", "kernels_per_step"):
                assert float(row[key]) == pytest.approx(d[key], rel=1e-12), (name, key)
            if d.get("comm"):
                assert float(row["comm_wait_ms_per_step"]) == pytest.approx(d["comm"]["wait_ms_per_step"], rel=1e-12)
        assert (out / f"{name}.budget.json").exists()
    assert len(rows) == sum(len(compute_budget(export_example(n)).devices) for n in DASK_REPORTS)


def _split_ranks(export, folder):
    """Per-process exports of a two-rank capture, cut with SQL: every row of another process is deleted (the
    shared tables, strings and metadata stay), as a per-rank capture of the same run would hold."""
    import sqlite3

    pids = [r[0] for r in sqlite3.connect(f"file:{export}?mode=ro", uri=True).execute(
        "SELECT DISTINCT globalPid >> 24 FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
    assert len(pids) == 2
    out = []
    for rank, pid in enumerate(pids):
        dst = folder / f"tp2-rank{rank}.sqlite"
        shutil.copyfile(export, dst)
        conn = sqlite3.connect(dst)
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            if table in ("PROCESSES", "ThreadNames"):
                continue
            cols = {r[1] for r in conn.execute(f"pragma table_info('{table}')")}
            col = next((c for c in ("globalPid", "globalTid") if c in cols), None)
            if col:
                conn.execute(f"DELETE FROM {table} WHERE {col} IS NOT NULL AND ({col} >> 24) != ?", (pid,))
        conn.commit()
        conn.close()
        out.append(dst)
    return out


def test_merged_ranks_equal_the_all_ranks_capture(tmp_path, export_example):
    """The two ranks of the TP2 capture as two per-rank exports, merged, are the budget of the capture holding both
    (every number, the comm split included)."""
    from profattr.attribute.many import merged_budget

    whole = export_example("wl-graph-grouped-tp2")
    ranks = _split_ranks(whole, tmp_path)
    expected = compute_budget(whole).to_dict()
    got = merged_budget(ranks).to_dict()
    assert got["capture"]["path"] == " + ".join(str(r) for r in ranks)
    expected["capture"]["path"] = got["capture"]["path"] = None
    assert got == expected
    assert expected["comm"]["ranks"] == [0, 1]
    for rank, path in enumerate(ranks):  # each per-rank export alone: that rank's GPU, no comm split
        assert [d["device"] for d in compute_budget(path).devices] == [rank]


def test_dask_recipe_merges_per_rank_reports(tmp_path, export_example):
    """`--merge-ranks` on Dask: per-rank rows and one merged budget with the comm split of the two-rank capture."""
    nsys = _need_recipe_tools()
    whole = export_example("wl-graph-grouped-tp2")
    reports = []
    for rank in (0, 1):  # the recipe takes .nsys-rep inputs; each rank's export (newer, beside it) is what it reads
        reports.append(tmp_path / f"tp2-rank{rank}.nsys-rep")
        shutil.copyfile(EXAMPLES / "wl-graph-grouped-tp2.nsys-rep", reports[-1])
    ranks = _split_ranks(whole, tmp_path)
    for r in ranks:
        os.utime(r, None)
    rows, out = _run_recipe(nsys, tmp_path, reports, "--merge-ranks")
    expected = compute_budget(whole)
    for d in expected.devices:
        row = rows[("merged", d["device"])]
        assert float(row["step_ms"]) == pytest.approx(d["step_ms"], rel=1e-12)
        assert float(row["comm_wait_ms_per_step"]) == pytest.approx(d["comm"]["wait_ms_per_step"], rel=1e-12)
        assert float(row["comm_transfer_ms_per_step"]) == pytest.approx(d["comm"]["transfer_ms_per_step"],
                                                                       rel=1e-12)
        alone = rows[(f"tp2-rank{d['device']}", d["device"])]
        assert alone["comm_wait_ms_per_step"] == ""  # one rank alone has nobody to wait for
    assert (out / "merged.budget.json").exists()
