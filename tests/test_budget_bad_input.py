"""Bad input to `profattr budget`: one clear line, exit 2, no traceback, and the input untouched."""
from __future__ import annotations

import shutil
import sqlite3
import threading

import pytest
from click.testing import CliRunner

from profattr.cli import cli
from badinput import assert_one_line_error, digest
from synth import Builder, gpid, gtid


def run(*args):
    result = CliRunner().invoke(cli, list(args))
    return result






def small_capture(path, with_steps=True):
    b = Builder(path)
    T, P = gtid(10), gpid(10)
    for i in range(3):
        t = 1000 + i * 1000
        if with_steps:
            b.nvtx(T, t, t + 500, "decode_step")
        c = b.launch(T, t + 10, t + 20)
        b.kernel(P, c, t + 50, t + 80, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT")
    return b.close()


def test_not_sqlite(tmp_path):
    p = tmp_path / "x.sqlite"
    p.write_text("hello")
    before = digest(p)
    r = run("budget", str(p))
    assert_one_line_error(r, "not a SQLite file")
    assert digest(p) == before


def test_missing_file(tmp_path):
    assert_one_line_error(run("budget", str(tmp_path / "nope.sqlite")), "no such file")


def test_truncated(tmp_path):
    good = small_capture(tmp_path / "good.sqlite")
    data = good.read_bytes()
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: len(data) // 3])
    before = digest(p)
    r = run("budget", str(p))
    assert_one_line_error(r, "cut.sqlite")
    assert digest(p) == before


def test_locked(tmp_path):
    p = small_capture(tmp_path / "locked.sqlite")
    writer = sqlite3.connect(p, check_same_thread=False)
    writer.execute("PRAGMA locking_mode=EXCLUSIVE")
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO StringIds VALUES (999999, 'x')")
    try:
        r = run("budget", str(p))
        assert_one_line_error(r, "locked")
    finally:
        writer.rollback()
        writer.close()


def test_not_an_nsys_export(tmp_path):
    p = tmp_path / "other.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE t (a)")
    conn.commit()
    conn.close()
    assert_one_line_error(run("budget", str(p)), "not an Nsight Systems export")


def test_no_kernel_data(tmp_path):
    b = Builder(tmp_path / "nvtx_only.sqlite", tables={"NVTX_EVENTS"})
    b.nvtx(gtid(1), 0, 10, "decode_step")
    p = b.close()
    assert_one_line_error(run("budget", str(p)), "no CUDA kernel data", "--trace=cuda")


def test_graph_level_trace_has_no_kernels(tmp_path):
    b = Builder(tmp_path / "graph_mode.sqlite", tables={"CUPTI_ACTIVITY_KIND_RUNTIME"})
    for i in range(3):
        b.launch(gtid(1), i * 100, i * 100 + 5, name="cudaGraphLaunch_v10000")
    p = b.close()
    assert_one_line_error(run("budget", str(p)), "--cuda-graph-trace=graph", "--cuda-graph-trace=node")


def test_step_range_never_occurs_lists_candidates(tmp_path):
    p = small_capture(tmp_path / "c.sqlite")
    assert_one_line_error(run("budget", str(p), "--steps", "nvtx:forward"), "forward", "candidates: decode_step")


def test_bad_steps_spec(tmp_path):
    p = small_capture(tmp_path / "c.sqlite")
    assert_one_line_error(run("budget", str(p), "--steps", "layers"), "auto, whole, graph, nvtx:NAME or nvtx-re:REGEX")


def test_rules_file_with_bad_regex(tmp_path):
    p = small_capture(tmp_path / "c.sqlite")
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\nid = "mine.bad"\ncategory = "norm"\npattern = "rms(norm"\n')
    r = run("budget", str(p), "--rules", str(rules))
    assert_one_line_error(r, "mine.toml")


def test_nsys_rep_export_never_overwrites_without_force(tmp_path):
    rep = tmp_path / "r.nsys-rep"
    rep.write_bytes(b"not really a report")
    stale = tmp_path / "r.sqlite"
    shutil.copyfile(small_capture(tmp_path / "src.sqlite"), stale)
    # make the .sqlite older than the report
    import os

    os.utime(stale, (1, 1))
    before = digest(stale)
    assert_one_line_error(run("budget", str(rep)), "--force")
    assert digest(stale) == before


def test_input_is_never_written(tmp_path):
    p = small_capture(tmp_path / "c.sqlite")
    before = digest(p)
    r = run("budget", str(p), "--format", "json")
    assert r.exit_code == 0, r.output
    assert digest(p) == before
    assert not list(tmp_path.glob("c.sqlite-*"))  # no journal or WAL files beside it


@pytest.mark.parametrize("meta_table", ["META_DATA_EXPORT", "EXPORT_META_DATA"])
def test_old_and_new_metadata_table(tmp_path, meta_table):
    b = Builder(tmp_path / "m.sqlite", meta_table=meta_table)
    c = b.launch(gtid(3), 10, 20)
    b.kernel(gpid(3), c, 30, 40, "rmsnorm_kernel")
    p = b.close()
    r = run("budget", str(p), "--format", "json")
    assert r.exit_code == 0, r.output
    assert '"nsys_version": "2023.4.4.54"' in r.output


def test_concurrent_readers(tmp_path):
    """Two budgets of the same file at once (read-only connections never lock each other out)."""
    p = small_capture(tmp_path / "c.sqlite")
    out = []
    threads = [threading.Thread(target=lambda: out.append(run("budget", str(p)).exit_code)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [0, 0]
