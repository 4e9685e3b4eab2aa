"""`profattr ledger` on real H200 captures: SGLang triton vs triton_kernel (batch 1, committed exports) and the
built-in workload on two GPUs (wl-graph-grouped-tp2, exported here, for the collective split).

Every figure the ledger stores is read back with plain SQL written here and checked against what profattr's
documented JSON outputs (`profattr budget --format json`, `profattr diff --format json`) and the run.json files say.
"""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import statistics

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from badinput import assert_one_line_error, digest
from conftest import EXAMPLES

TRITON = EXAMPLES / "sglang-triton-bs1.sqlite"
TRITON_KERNEL = EXAMPLES / "sglang-triton_kernel-bs1.sqlite"
TP2 = "wl-graph-grouped-tp2"
SAMPLES = "300"  # bootstrap samples: the same (fixed) seed on both sides, so the intervals must agree
TOL = 1e-9


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def ok(*args, env=None) -> str:
    result = run(*args, env=env)
    assert result.exit_code == 0, result.output
    return result.stdout




def rows(db_path, sql, params=()):
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()




def assert_close(got, want, where="", tol=TOL):
    """Equal structures; numbers within `tol`."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}", tol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]", tol)
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=0, abs=tol), (where, got, want)
    else:
        assert got == want, (where, got, want)


@pytest.fixture(scope="module")
def captures(export_example, tmp_path_factory):
    """label -> (capture path, its run.json): the tp2 export is copied with its run.json into a folder of its own."""
    folder = tmp_path_factory.mktemp("tp2")
    tp2 = folder / f"{TP2}.sqlite"
    shutil.copyfile(export_example(TP2), tp2)
    shutil.copyfile(EXAMPLES / f"{TP2}.run.json", folder / f"{TP2}.run.json")
    out = {"triton": TRITON, "triton_kernel": TRITON_KERNEL, TP2: tp2}
    return {k: (p, json.loads(p.with_name(p.name.replace(".sqlite", ".run.json")).read_text()))
            for k, p in out.items()}


@pytest.fixture(scope="module")
def budgets(captures):
    return {label: json.loads(ok("budget", path, "--format", "json")) for label, (path, _) in captures.items()}


@pytest.fixture(scope="module")
def ledger(captures, tmp_path_factory):
    path = tmp_path_factory.mktemp("ledger") / "campaign.db"
    out = ok("ledger", "add", TRITON, TRITON_KERNEL, "--label", "triton", "--label", "triton_kernel",
             "--ledger", path)
    assert "added entry 1 (triton)" in out and "added entry 2 (triton_kernel)" in out
    out = ok("ledger", "add", captures[TP2][0], "--ledger", path)  # default label: run.json's name
    assert f"added entry 3 ({TP2})" in out
    return path


def entry(ledger, label) -> dict:
    return rows(ledger, "SELECT * FROM entries WHERE label = ?", [label])[0]


# --- what is stored -------------------------------------------------------------------------------------------------

def test_schema_version_and_tables(ledger):
    assert rows(ledger, "SELECT value FROM meta WHERE key = 'schema'") == [{"value": "profattr.ledger/1"}]
    tables = {r["name"] for r in rows(ledger, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"meta", "entries", "gpus", "packages", "devices", "categories", "kernels", "comm", "comm_categories",
            "steps", "step_categories", "step_comm"} <= tables
    fks = rows(ledger, "SELECT * FROM pragma_foreign_key_list('kernels')")
    assert [(f["from"], f["table"], f["to"]) for f in fks] == [("entry_id", "entries", "id")]
    assert [r["label"] for r in rows(ledger, "SELECT label FROM entries ORDER BY id")] == [
        "triton", "triton_kernel", TP2]


def test_identity_matches_the_file_and_its_budget_json(ledger, captures, budgets):
    for label, (path, _) in captures.items():
        e, b = entry(ledger, label), budgets[label]
        assert e["capture_sha256"] == digest(path) and e["capture_bytes"] == path.stat().st_size
        assert e["capture_path"] == str(path.resolve())
        assert e["export_path"] == b["capture"]["path"]
        assert e["nsys_version"] == b["capture"]["nsys_version"]
        assert e["export_schema_version"] == b["capture"]["export_schema_version"]
        assert json.loads(e["export_gpus"]) == b["capture"]["gpus"]
        assert (e["steps_spec"], e["steps_source"], e["steps_count"], e["steps_reason"]) == (
            "auto", b["steps"]["source"], b["steps"]["count"], b["steps"]["reason"])
        assert e["nvtx_context"] == b["nvtx_context"]
        assert json.loads(e["nvtx_placement"]) == b["nvtx_placement"]
        assert (json.loads(e["comm_summary"]) if e["comm_summary"] else None) == b.get("comm")
        assert e["budget_schema"] == b["schema"] == "profattr.budget/1"
    assert budgets[TP2]["comm"]["ranks"] == [0, 1]  # the two-GPU capture does carry the split


def test_run_facts_match_run_json(ledger, captures):
    for label, (path, run) in captures.items():
        e = entry(ledger, label)
        backend = run.get("backend")
        resolved = (run.get("server_log") or {}).get("resolved") or {}
        assert e["run_json_path"] == str(path.with_name(path.name.replace(".sqlite", ".run.json")).resolve())
        assert e["model"] == run.get("model")
        assert e["tp"] == run.get("tp")
        assert e["batch"] == (run.get("requests") or {}).get("batch")
        assert e["backend_requested"] == (backend or {}).get("requested")
        assert e["backend_resolved"] == resolved.get("moe_runner_backend", (backend or {}).get("sglang"))
        assert (json.loads(e["server_args"]) if e["server_args"] else None) == (run.get("server") or {}).get("args")
        assert e["ms_per_token_unprofiled"] == run["timing"]["ms_per_token_unprofiled"]
        assert e["ms_per_token_profiled"] == run["timing"]["ms_per_token_profiled"]
        packages = rows(ledger, "SELECT package, version FROM packages WHERE entry_id = ?", [e["id"]])
        assert {p["package"]: p["version"] for p in packages} == run["packages"]
        gpus = rows(ledger, "SELECT * FROM gpus WHERE entry_id = ? ORDER BY position", [e["id"]])
        assert [(g["gpu_index"], g["name"], g["driver_version"], g["memory_total_mib"], g["pci_bus_id"], g["uuid"])
                for g in gpus] == [(g["index"], g["name"], g["driver_version"], g["memory_total_mib"],
                                    g["pci_bus_id"], g["uuid"]) for g in run["gpus"]]
        for g, want in zip(gpus, run["gpus"]):  # these captures predate clock probing: NULL, as run.json has none
            assert g["clocks_sm_mhz"] == want.get("clocks_sm_mhz")
    assert entry(ledger, "triton")["backend_resolved"] == "triton"
    assert entry(ledger, "triton_kernel")["server_args"] and entry(ledger, TP2)["backend_requested"] is None


def test_device_category_kernel_and_comm_rows_match_budget_json(ledger, budgets):
    fields = ["steps", "step_ms", "mean_step_ms", "busy_ms_per_step", "idle_ms_per_step", "overlap_ms_per_step",
              "kernels_per_step", "memops_per_step", "unclassified_share"]
    for label, b in budgets.items():
        eid = entry(ledger, label)["id"]
        devices = rows(ledger, "SELECT * FROM devices WHERE entry_id = ? ORDER BY device", [eid])
        assert [d["device"] for d in devices] == [d["device"] for d in b["devices"]]
        for got, want in zip(devices, b["devices"]):
            where = f"{label}/GPU {want['device']}"
            assert_close({k: got[k] for k in fields}, {k: want[k] for k in fields}, where)
            assert_close({"ops": got["outside_steps_ops"], "ms": got["outside_steps_ms"]}, want["outside_steps"], where)
            cats = rows(ledger, "SELECT category, ms_per_step, count_per_step, exclusive_ms_per_step, "
                                "overlapped_ms_per_step FROM categories WHERE entry_id = ? AND device = ? "
                                "ORDER BY position", [eid, want["device"]])
            # the share of the step is not stored: it is the exclusive time over the device's mean step
            assert_close(cats, [{k: v for k, v in c.items() if k != "share"} for c in want["categories"]],
                         where + " categories")
            for c, w in zip(cats, want["categories"]):
                assert c["exclusive_ms_per_step"] / got["mean_step_ms"] == pytest.approx(w["share"], abs=TOL)
            kernels = rows(ledger, "SELECT name, demangled, category, family, ms_per_step, count_per_step FROM kernels "
                                   "WHERE entry_id = ? AND device = ? ORDER BY position", [eid, want["device"]])
            kernel_cols = ["name", "demangled", "category", "family", "ms_per_step", "count_per_step"]
            assert_close(kernels, [{c: k[c] for c in kernel_cols} for k in want["kernels"]], where + " kernels")
            # each kernel row's launch shapes, in the budget's order
            shapes = rows(ledger, "SELECT kernel_position, label, ms_per_step, count_per_step, mean_us, share FROM "
                                  "kernel_shapes WHERE entry_id = ? AND device = ? ORDER BY kernel_position, position",
                          [eid, want["device"]])
            assert_close(shapes, [{"kernel_position": i, **{c: s[c] for c in ("label", "ms_per_step", "count_per_step",
                                                                              "mean_us", "share")}}
                                  for i, k in enumerate(want["kernels"]) for s in k["shapes"]], where + " shapes")
            short = rows(ledger, "SELECT under_us, count_per_step, ms_per_step, share FROM short_kernels "
                                 "WHERE entry_id = ? AND device = ?", [eid, want["device"]])
            assert_close(short, [want["short_kernels"]], where + " short kernels")
            comm = rows(ledger, "SELECT * FROM comm WHERE entry_id = ? AND device = ?", [eid, want["device"]])
            if "comm" not in want:
                assert comm == []
                continue
            by_cat = rows(ledger, "SELECT category, collective_ms_per_step, wait_ms_per_step FROM comm_categories "
                                  "WHERE entry_id = ? AND device = ? ORDER BY position", [eid, want["device"]])
            got_comm = {k: v for k, v in comm[0].items() if k not in ("entry_id", "device")}
            assert_close({**got_comm, "by_category": by_cat}, want["comm"], where + " comm")
    assert any("comm" in d for d in budgets[TP2]["devices"])


def test_per_step_rows_add_up_to_the_budget(ledger, budgets):
    """The stored steps reproduce the budget's definitions: median span, idle, overlap, per-category sums."""
    for label, b in budgets.items():
        eid = entry(ledger, label)["id"]
        for d in b["devices"]:
            steps = rows(ledger, "SELECT * FROM steps WHERE entry_id = ? AND device = ?", [eid, d["device"]])
            n = len(steps)
            assert n == d["steps"]
            span = [s["span_ns"] for s in steps]
            busy = sum(s["busy_ns"] for s in steps) / n
            assert statistics.median(span) / 1e6 == pytest.approx(d["step_ms"], abs=TOL)
            assert (sum(span) / n - busy) / 1e6 == pytest.approx(d["idle_ms_per_step"], abs=TOL)
            assert (sum(s["op_ns"] for s in steps) / n - busy) / 1e6 == pytest.approx(d["overlap_ms_per_step"],
                                                                                     abs=TOL)
            assert all(s["span_ns"] == s["end_ns"] - s["start_ns"] for s in steps)
            cats = rows(ledger, "SELECT category, sum(duration_ns) AS ns, sum(count) AS n, sum(exclusive_ns) AS excl "
                                "FROM step_categories WHERE entry_id = ? AND device = ? GROUP BY category",
                        [eid, d["device"]])
            per_step = rows(ledger, "SELECT s.step, s.busy_ns, sum(c.exclusive_ns) AS excl FROM steps s JOIN "
                                    "step_categories c USING (entry_id, device, step) WHERE s.entry_id = ? AND "
                                    "s.device = ? GROUP BY s.step", [eid, d["device"]])
            assert len(per_step) == n and all(r["excl"] == r["busy_ns"] for r in per_step)
            want = {c["category"]: c for c in d["categories"]}
            assert {c["category"] for c in cats} == set(want)
            for c in cats:
                assert c["ns"] / n / 1e6 == pytest.approx(want[c["category"]]["ms_per_step"], abs=TOL)
                assert c["excl"] / n / 1e6 == pytest.approx(want[c["category"]]["exclusive_ms_per_step"], abs=TOL)
                assert c["n"] / n == pytest.approx(want[c["category"]]["count_per_step"], abs=TOL)
            comm = rows(ledger, "SELECT category, sum(collective_ns) AS coll, sum(wait_ns) AS wait FROM step_comm "
                                "WHERE entry_id = ? AND device = ? GROUP BY category", [eid, d["device"]])
            want_comm = {c["category"]: c for c in (d.get("comm") or {}).get("by_category", [])}
            assert {c["category"] for c in comm} == set(want_comm)
            for c in comm:
                assert c["coll"] / n / 1e6 == pytest.approx(want_comm[c["category"]]["collective_ms_per_step"],
                                                            abs=TOL)
                assert c["wait"] / n / 1e6 == pytest.approx(want_comm[c["category"]]["wait_ms_per_step"], abs=TOL)


def test_show_gives_back_the_budget_json(ledger, budgets):
    for label, b in budgets.items():
        shown = json.loads(ok("ledger", "show", label, "--ledger", ledger, "--format", "json"))
        assert shown["schema"] == "profattr.ledger.entry/1" and shown["entry"]["label"] == label
        assert_close(shown["budget"], b, label)
    table = ok("ledger", "show", "2", "--ledger", ledger)
    assert "triton_kernel" in table and "requested triton_kernel, resolved triton_kernel" in table
    assert "triton\\_kernel" in ok("ledger", "show", "2", "--ledger", ledger, "--format", "markdown")
    assert ok("ledger", "show", TP2, "--ledger", ledger, "--format", "csv").startswith("device,row,")


def test_a_ledger_from_before_exclusive_time_still_opens_and_gains_it(small, tmp_path):
    """A ledger written before categories stored exclusive time (its tables without those columns) still shows,
    compares (op time and overlap as components) and takes new entries, which then store it."""
    old = tmp_path / "old.db"
    shutil.copyfile(small, old)
    conn = sqlite3.connect(old)
    for table, column in (("categories", "exclusive_ms_per_step"), ("categories", "overlapped_ms_per_step"),
                          ("step_categories", "exclusive_ns")):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.commit()
    conn.close()
    shown = json.loads(ok("ledger", "show", "1", "--ledger", old, "--format", "json"))["budget"]
    assert all("exclusive_ms_per_step" not in c and "share" not in c for c in shown["devices"][0]["categories"])
    assert "mean step" in ok("ledger", "show", "1", "--ledger", old)
    ok("ledger", "add", TRITON_KERNEL, "--label", "later", "--ledger", old)
    got = rows(old, "SELECT exclusive_ms_per_step FROM categories WHERE entry_id = 2")
    assert got and all(r["exclusive_ms_per_step"] is not None for r in got)
    assert rows(old, "SELECT count(*) AS n FROM categories WHERE exclusive_ms_per_step IS NULL")[0]["n"] > 0
    diff = json.loads(ok("ledger", "compare", "1", "2", "--ledger", old, "--format", "json", "--samples", "50"))
    d = diff["devices"][0]
    assert "overlap" in {c["component"] for c in d["components"]}  # one side has op time only: the old split
    assert abs(d["closure_ms"]) < 1e-9


# --- list, compare, trend -------------------------------------------------------------------------------------------

def test_list_in_insertion_order(ledger, captures, budgets):
    listed = json.loads(ok("ledger", "list", "--ledger", ledger, "--format", "json"))["entries"]
    assert [(e["id"], e["label"]) for e in listed] == [(1, "triton"), (2, "triton_kernel"), (3, TP2)]
    for e in listed:
        b = budgets[e["label"]]
        slowest = max(b["devices"], key=lambda d: d["step_ms"])
        assert (e["device"], e["step_ms"]) == (slowest["device"], slowest["step_ms"])
        assert_close(e["top_categories"], [{"category": c["category"], "ms_per_step": c["ms_per_step"]}
                                           for c in slowest["categories"][:3]])
        assert e["ms_per_token"] == captures[e["label"]][1]["timing"]["ms_per_token_unprofiled"]
    text = ok("ledger", "list", "--ledger", ledger)
    assert text.splitlines()[1].split()[:2] == ["1", "triton"]
    csv_lines = ok("ledger", "list", "--ledger", ledger, "--format", "csv").splitlines()
    assert csv_lines[0].startswith("id,label,ms_per_token,device,step_ms,category_1") and len(csv_lines) == 4
    assert "| 2 | triton\\_kernel |" in ok("ledger", "list", "--ledger", ledger, "--format", "markdown")


def _assert_same_diff(got: dict, want: dict):
    for key in ("changed", "warnings", "verdict"):
        assert got[key] == want[key], key
    for side in ("a", "b"):
        assert got[side]["steps"] == want[side]["steps"] and got[side]["backend"] == want[side]["backend"]
    assert len(got["devices"]) == len(want["devices"])
    for g, w in zip(got["devices"], want["devices"]):
        comps_g = {c["component"]: c for c in g.pop("components")}
        comps_w = {c["component"]: c for c in w.pop("components")}
        assert_close(comps_g, comps_w, f"GPU {w['device']} components")
        assert_close(g, w, f"GPU {w['device']}")


def test_compare_equals_diff_of_the_captures(ledger):
    want = json.loads(ok("diff", TRITON, TRITON_KERNEL, "--format", "json", "--samples", SAMPLES))
    got = json.loads(ok("ledger", "compare", "triton", "2", "--ledger", ledger, "--format", "json",
                        "--samples", SAMPLES))
    assert (got["a"]["entry"], got["a"]["label"], got["b"]["entry"], got["b"]["label"]) == (
        1, "triton", 2, "triton_kernel")
    assert got["devices"][0]["step_ms"]["ci95"] is not None  # the per-step rows gave intervals, as diff's do
    _assert_same_diff(got, want)


def test_compare_keeps_the_comm_wait_split_and_its_intervals(ledger, captures):
    tp2 = captures[TP2][0]
    want = json.loads(ok("diff", tp2, tp2, "--format", "json", "--samples", SAMPLES))
    got = json.loads(ok("ledger", "compare", "3", TP2, "--ledger", ledger, "--format", "json",
                        "--samples", SAMPLES))
    wait = [c for d in got["devices"] for c in d["components"] if c["component"] == "comm_wait"]
    assert len(wait) == 2 and all(c["ci95"] is not None for c in wait)
    _assert_same_diff(got, want)


def test_compare_renders_as_table_markdown_and_csv(ledger):
    table = ok("ledger", "compare", "1", "2", "--ledger", ledger, "--samples", "50")
    assert table.startswith("A: entry 1 (triton)") and "category:moe.gemm" in table
    assert "triton\\_kernel ms" in ok("ledger", "compare", "1", "2", "--ledger", ledger, "--samples", "50",
                                       "--format", "markdown")
    csv_text = ok("ledger", "compare", "1", "2", "--ledger", ledger, "--samples", "50", "--format", "csv")
    assert csv_text.splitlines()[0] == ("device,component,a_ms_per_step,b_ms_per_step,delta_ms_per_step,ci95_low,"
                                        "ci95_high,noise")


@pytest.mark.parametrize("metric,field", [("step_ms", "step_ms"), ("idle", "idle_ms_per_step"),
                                          ("category:moe.gemm", None), ("category:comm.allreduce", None)])
def test_trend_follows_the_budget_json(ledger, budgets, metric, field):
    trend = json.loads(ok("ledger", "trend", metric, "--ledger", ledger, "--format", "json"))
    want = []
    for label in ("triton", "triton_kernel", TP2):
        for d in budgets[label]["devices"]:
            if field:
                value = d[field]
            else:  # a category a GPU did not run costs it 0 ms/step
                cat = metric.split(":", 1)[1]
                value = next((c["ms_per_step"] for c in d["categories"] if c["category"] == cat), 0.0)
            want.append((label, d["device"], value))
    got = [(r["label"], r["device"], r["value"]) for r in trend["rows"]]
    assert [(x, y) for x, y, _ in got] == [(x, y) for x, y, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        assert g == pytest.approx(w, abs=TOL)
    first = {}
    for r in trend["rows"]:
        first.setdefault(r["device"], r["value"])
        assert r["change_vs_first"] == pytest.approx(r["value"] - first[r["device"]], abs=TOL)


def test_trend_ms_per_token_is_run_json_timing(ledger, captures):
    trend = json.loads(ok("ledger", "trend", "ms_per_token", "--ledger", ledger, "--format", "json"))
    assert [(r["label"], r["value"]) for r in trend["rows"]] == [
        (label, run["timing"]["ms_per_token_unprofiled"]) for label, (_, run) in captures.items()]
    assert ok("ledger", "trend", "ms_per_token", "--ledger", ledger, "--format", "csv").splitlines()[0] == (
        "entry_id,label,device,metric,value,unit,change_vs_first")


# --- adding again, defaults -----------------------------------------------------------------------------------------

def test_same_capture_is_not_added_twice(ledger, tmp_path):
    before = digest(ledger)
    out = ok("ledger", "add", TRITON, "--label", "again", "--ledger", ledger)
    assert "already in the ledger as entry 1 (triton)" in out
    assert digest(ledger) == before
    fresh = tmp_path / "fresh.db"
    out = ok("ledger", "add", TRITON, TRITON, "--ledger", fresh)
    assert "added entry 1 (sglang-triton-bs1)" in out and "given twice" in out
    assert rows(fresh, "SELECT count(*) AS n FROM entries") == [{"n": 1}]
    # another step definition is another budget of the same file: a new entry
    out = ok("ledger", "add", TRITON, "--steps", "whole", "--ledger", fresh)
    assert "added entry 2 (sglang-triton-bs1-2)" in out


def test_default_ledger_location(tmp_path, monkeypatch):
    from profattr.ledger.schema import default_path

    monkeypatch.delenv("PROFATTR_LEDGER", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "profattr" / "ledger.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "profattr" / "ledger.db"
    target = tmp_path / "env.db"
    ok("ledger", "add", TRITON_KERNEL, env={"PROFATTR_LEDGER": str(target)})
    assert rows(target, "SELECT label FROM entries") == [{"label": "sglang-triton_kernel-bs1"}]


# --- bad input ------------------------------------------------------------------------------------------------------

@pytest.fixture()
def small(tmp_path):
    """A ledger of one entry (triton), made for a test that tries to break it."""
    path = tmp_path / "small.db"
    ok("ledger", "add", TRITON, "--label", "triton", "--ledger", path)
    return path


def counts(path) -> dict:
    return {t: rows(path, f"SELECT count(*) AS n FROM {t}")[0]["n"]
            for t in ("entries", "devices", "categories", "kernels", "steps", "step_categories", "packages")}


def test_not_a_ledger(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("hello")
    before = digest(text)
    assert_one_line_error(run("ledger", "list", "--ledger", text), "not a profattr ledger")
    assert_one_line_error(run("ledger", "add", TRITON, "--ledger", text), "not a profattr ledger")
    assert digest(text) == before
    before = digest(TRITON)  # an nsys export is SQLite too, but not a ledger; it is never written
    assert_one_line_error(run("ledger", "show", "1", "--ledger", TRITON), "not a profattr ledger")
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--ledger", TRITON), "not a profattr ledger")
    assert digest(TRITON) == before
    assert_one_line_error(run("ledger", "list", "--ledger", tmp_path / "none.db"), "no ledger here yet")
    assert not (tmp_path / "none.db").exists()


def test_newer_schema_is_refused(small):
    conn = sqlite3.connect(small)
    conn.execute("UPDATE meta SET value = 'profattr.ledger/2' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    before = digest(small)
    for args in (("list",), ("show", "1"), ("add", TRITON_KERNEL), ("trend", "step_ms")):
        assert_one_line_error(run("ledger", *args, "--ledger", small), "newer profattr", "profattr.ledger/2")
    assert digest(small) == before


@pytest.mark.parametrize("lock", ["EXCLUSIVE", "IMMEDIATE"])
def test_locked_ledger(small, monkeypatch, lock):
    """Another connection holds the ledger: EXCLUSIVE (nobody may read) or IMMEDIATE (another writer: the add
    budgets its capture, then cannot take the write lock). Either way one line, and nothing written."""
    from profattr.ledger import schema

    monkeypatch.setattr(schema, "LOCK_TIMEOUT_S", 0.05)
    before = counts(small)
    other = sqlite3.connect(small, isolation_level=None)
    other.execute(f"BEGIN {lock}")
    try:
        assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--ledger", small), "locked",
                              "database is locked")
        if lock == "EXCLUSIVE":
            assert_one_line_error(run("ledger", "list", "--ledger", small), "locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert counts(small) == before


def test_capture_that_fails_to_budget_adds_nothing(small, tmp_path):
    bad = tmp_path / "broken.sqlite"
    bad.write_text("not an export")
    before = counts(small)
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, bad, "--ledger", small), "broken.sqlite",
                          "not a SQLite file")
    assert counts(small) == before  # the good capture given with it was not added either
    assert_one_line_error(run("ledger", "add", bad, "--ledger", tmp_path / "new.db"), "not a SQLite file")
    assert not (tmp_path / "new.db").exists()
    assert_one_line_error(run("ledger", "add", tmp_path / "missing.sqlite", "--ledger", small), "no such file")


def test_failure_while_writing_rolls_back(small, monkeypatch):
    """A write that fails after the entry and most of its rows are in: the whole add is rolled back."""
    from profattr.ledger import record

    real = record.budget_rows

    def broken(entry_id, budget):
        out = real(entry_id, budget)
        out["step_comm"] = [{"entry_id": entry_id, "no_such_column": 1}]
        return out

    monkeypatch.setattr(record, "budget_rows", broken)
    before = counts(small)
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--ledger", small), "small.db")
    assert counts(small) == before


def test_unknown_entry(ledger):
    assert_one_line_error(run("ledger", "show", "99", "--ledger", ledger), "no entry '99'", "1 triton")
    assert_one_line_error(run("ledger", "show", "nope", "--ledger", ledger), "no entry 'nope'")
    assert_one_line_error(run("ledger", "compare", "1", "nope", "--ledger", ledger), "no entry 'nope'")
    assert_one_line_error(run("ledger", "trend", "flops", "--ledger", ledger), "expected one of")
    assert_one_line_error(run("ledger", "trend", "category:moe.nothing", "--ledger", ledger), "in no entry")


def test_bad_labels(small):
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--label", "42", "--ledger", small), "cannot be a number")
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--label", "triton", "--ledger", small),
                          "already names entry 1")
    assert_one_line_error(run("ledger", "add", TRITON_KERNEL, "--label", "a", "--label", "b", "--ledger", small),
                          "one per capture")


# --- the report's Campaign section ----------------------------------------------------------------------------------

def table_rows(text: str, header_start: str) -> list:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return out


def test_campaign_report_from_the_ledger(ledger, budgets, tmp_path):
    out = tmp_path / "campaign"
    assert "wrote" in ok("report", "--ledger", ledger, "-o", out)
    text = (out / "report.md").read_text(encoding="utf-8")
    assert (out / "campaign.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Campaign" in text and "](campaign.png)" in text
    header = next(line for line in text.splitlines() if line.startswith("| entry | label | GPU"))
    names = [c.strip() for c in header.strip("|").split("|")]
    table = table_rows(text, "| entry | label | GPU")
    want = [(label, d) for label in ("triton", "triton_kernel", TP2) for d in budgets[label]["devices"]]
    assert len(table) == len(want)
    for row, (label, d) in zip(table, want):
        cells = dict(zip(names, row))
        assert cells["label"] == label.replace("_", "\\_")
        assert cells["step ms (median)"] == f"{d['step_ms']:.3f}"
        assert cells["idle"] == f"{d['idle_ms_per_step']:.3f}"
        # the bars stack exclusive time: categories + other + idle = mean step
        by_cat = {c["category"]: c["exclusive_ms_per_step"] for c in d["categories"]}
        shown = [n for n in names[6:-3]]
        for name in shown:
            assert cells[name] == f"{by_cat.get(name.replace(chr(92), ''), 0.0):.3f}", (label, name)
        other = sum(v for k, v in by_cat.items() if k not in [n.replace("\\", "") for n in shown])
        assert float(cells["other categories"]) == pytest.approx(other, abs=6e-4)
        stack = sum(float(cells[n]) for n in shown) + float(cells["other categories"]) + float(cells["idle"])
        assert stack == pytest.approx(d["mean_step_ms"], abs=5e-4 * (len(shown) + 3))
    assert_one_line_error(run("report", "--ledger", ledger, "-o", out), "exists")
    picked = tmp_path / "picked"
    ok("report", "--ledger", ledger, "--labels", "triton_kernel,1", "-o", picked)
    labels = [r[1] for r in table_rows((picked / "report.md").read_text(), "| entry | label | GPU")]
    assert labels == ["triton\\_kernel", "triton"]
    assert_one_line_error(run("report", "--ledger", ledger, "--labels", "nope", "-o", tmp_path / "x"), "no entry")
    assert_one_line_error(run("report", "-o", tmp_path / "y"), "--ledger")


def test_capture_report_gets_a_campaign_section(small, tmp_path):
    ok("ledger", "add", TRITON_KERNEL, "--label", "a|b*c <x>", "--ledger", small)
    out = tmp_path / "report"
    ok("report", TRITON, TRITON_KERNEL, "--ledger", small, "-o", out, "--samples", "50")
    text = (out / "report.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines.index("## Categories per capture") < lines.index("## Campaign") < lines.index(
        "## Idle time and launches")
    assert (out / "campaign.png").exists() and "--ledger" in text
    assert "| 2 | a\\|b\\*c &lt;x&gt; |" in text  # a label is stored as given, escaped in markdown
    assert rows(small, "SELECT label FROM entries WHERE id = 2") == [{"label": "a|b*c <x>"}]


def test_failed_first_add_leaves_no_file(tmp_path, monkeypatch):
    from profattr.ledger import record

    real = record.budget_rows
    monkeypatch.setattr(record, "budget_rows", lambda eid, b: {**real(eid, b), "steps": [{"entry_id": eid, "x": 1}]})
    path = tmp_path / "first.db"
    assert_one_line_error(run("ledger", "add", TRITON, "--ledger", path), "first.db")
    assert not path.exists()
