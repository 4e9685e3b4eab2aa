"""Issue #12: each defect seen, as a test that failed before its fix. Real captures go in (copies of the committed H200
export, damaged in SQL at test time), one line comes out.

The wider corpus of bad input is tests/test_bad_input_corpus.py; properties are tests/test_properties.py."""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
import stat

import pytest
from click.testing import CliRunner

from badinput import (KERNEL, REAL_EXPORT, REAL_TRACE, RUNTIME, assert_error, assert_ok, cli, copy_export, digest,
                      retype, shift_times, shuffle_rows, snapshot, sql)
from profattr.cli import cli as profattr_cli
from synth import Builder, gpid, gtid

NAME = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"


def run(*args, input=None):
    return CliRunner().invoke(profattr_cli, [str(a) for a in args], input=input)


def one_error(result, *needles, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def budget_json(path, *args) -> dict:
    r = run("budget", path, "--format", "json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def comparable(budget: dict) -> dict:
    """A budget without what names the file (for comparing two copies of one capture)."""
    out = json.loads(json.dumps(budget))
    out["capture"].pop("path")
    return out


@pytest.fixture(scope="module")
def real_budget() -> dict:
    return budget_json(REAL_EXPORT)


# --- outputs: never an input, folders made, --force, atomic ------------------------------------------------------

def test_budget_o_capture_is_refused_and_the_capture_kept(tmp_path):
    cap = copy_export(tmp_path)
    before = digest(cap)
    one_error(run("budget", cap, "-o", cap), "is an input of this command")
    one_error(run("budget", cap, "-o", cap, "--force"), "is an input of this command")
    assert digest(cap) == before


@pytest.mark.parametrize("target", ["wal", "shm", "journal", "hardlink", "symlink", "run.json"])
def test_outputs_never_replace_an_input_or_its_companions(tmp_path, target):
    cap = copy_export(tmp_path)
    if target == "hardlink":
        out = tmp_path / "alias.sqlite"
        os.link(cap, out)
    elif target == "symlink":
        out = tmp_path / "alias.txt"
        out.symlink_to(cap)
    elif target == "run.json":
        out = tmp_path / "capture.run.json"
    else:
        out = tmp_path / f"capture.sqlite-{target}"
    before = digest(cap)
    one_error(run("budget", cap, "-o", out, "--force"), "is an input of this command")
    assert digest(cap) == before


def test_every_command_with_an_output_refuses_its_inputs(tmp_path):
    cap = copy_export(tmp_path)
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\nid = "mine.x"\ncategory = "norm"\npattern = "^zzz$"\n')
    config = tmp_path / "config.json"
    config.write_text("{}")
    before = snapshot(tmp_path)
    one_error(run("diff", cap, REAL_EXPORT, "-o", cap, "--force"), "is an input")
    one_error(run("classify", "x", "--rules", rules, "-o", rules, "--force"), "is an input")
    one_error(run("limit", "-m", config, "-H", "h200", "--quant", "fp8", "-o", config, "--force"), "is an input")
    one_error(run("gap", cap, "-H", "h200", "-m", "glm-5-nvfp4", "-o", cap, "--force"), "is an input")
    one_error(run("gap", cap, "-H", "h200", "-m", "glm-5-nvfp4", "--chart", cap, "--force"), "is an input")
    one_error(run("check", cap, "-o", cap, "--force"), "is an input")
    one_error(run("ledger", "add", cap, "--ledger", cap), "is an input")
    one_error(run("budget", cap, "--rules", rules, "-o", rules, "--force"), "is an input")
    assert snapshot(tmp_path) == before


def test_an_existing_output_needs_force_and_is_replaced_whole(tmp_path):
    out = tmp_path / "budget.txt"
    out.write_text("old\n")
    one_error(run("budget", REAL_EXPORT, "-o", out), "exists; pass --force")
    assert out.read_text() == "old\n"
    r = run("budget", REAL_EXPORT, "-o", out, "--force", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["schema"] == "profattr.budget/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.txt"]  # no temporary file left


def test_o_into_missing_folders_creates_them(tmp_path):
    out = tmp_path / "missing" / "dir" / "out.json"
    r = run("budget", REAL_EXPORT, "-o", out, "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["schema"] == "profattr.budget/1"


def test_o_under_a_file_fails_cleanly(tmp_path):
    (tmp_path / "file").write_text("x")
    one_error(run("budget", REAL_EXPORT, "-o", tmp_path / "file" / "out.txt"), "cannot create the folder")


def test_o_never_replaces_a_device(tmp_path):
    one_error(run("budget", REAL_EXPORT, "-o", "/dev/null", "--force"), "not a regular file")


def test_diff_classify_limit_have_force(tmp_path):
    out = tmp_path / "x.txt"
    out.write_text("keep")
    one_error(run("diff", REAL_EXPORT, REAL_EXPORT, "-o", out), "--force")
    one_error(run("classify", NAME, "-o", out), "--force")
    one_error(run("limit", "-m", "glm-5-nvfp4", "-H", "h200", "-o", out), "--force")
    assert out.read_text() == "keep"
    assert run("classify", NAME, "-o", out, "--force").exit_code == 0
    assert "gemm" in out.read_text()


# --- inputs: regular files first, read-only and immutable ---------------------------------------------------------

@pytest.mark.parametrize("name", ["x.sqlite", "x.trace.json.gz", "x.nsys-rep"])
def test_a_fifo_capture_is_an_error_not_a_hang(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert_error(cli("budget", fifo, timeout=60), "FIFO")


def test_fifo_rules_ncu_csv_ledger_and_run_json(tmp_path):
    for name in ("rules.toml", "d.ncu.csv", "ledger.db", "capture.run.json"):
        os.mkfifo(tmp_path / name)
    assert_error(cli("classify", NAME, "--rules", tmp_path / "rules.toml", timeout=60), "FIFO")
    assert_error(cli("drill-report", tmp_path / "d.ncu.csv", timeout=60), "FIFO")
    assert_error(cli("ledger", "list", "--ledger", tmp_path / "ledger.db", timeout=60), "FIFO")
    assert_error(cli("check", tmp_path / "capture.run.json", timeout=60), "FIFO")
    cap = copy_export(tmp_path)  # a FIFO run.json beside a capture is not waited on
    assert_error(cli("check", cap, timeout=60), "FIFO")
    assert_ok(cli("budget", cap, timeout=60))


def test_wal_mode_export_leaves_nothing_beside_it(tmp_path):
    cap = copy_export(tmp_path)
    conn = sqlite3.connect(cap)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.close()
    before = snapshot(tmp_path)
    assert sorted(before) == ["capture.sqlite"]
    assert_ok(cli("budget", cap))
    assert_ok(cli("check", cap))  # check exits 0 here: the capture passes
    assert snapshot(tmp_path) == before


def test_wal_with_changes_not_checkpointed_is_refused(tmp_path):
    cap = copy_export(tmp_path)
    writer = sqlite3.connect(cap)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO StringIds VALUES (99999999, 'x')")
    writer.commit()
    try:
        assert (tmp_path / "capture.sqlite-wal").stat().st_size > 0
        one_error(run("budget", cap), "WAL", "capture.sqlite-wal")
    finally:
        writer.close()


# --- user regexes run on RE2 ---------------------------------------------------------------------------------------

def test_a_nested_quantifier_classifies_a_4096_character_name_on_re2(tmp_path):
    import re

    from profattr.taxonomy.classify import load_rules

    rules = tmp_path / "nested.toml"
    rules.write_text('# nested\n\n[[rule]]\nid = "mine.nested"\ncategory = "norm"\npattern = "(a+)+$"\n')
    assert load_rules([rules]).rule("mine.nested").regex.engine == "re2"  # Python's re would backtrack 2^4095 ways
    assert all(isinstance(r.regex, re.Pattern) for r in load_rules(()).rules)  # the shipped rules stay on re
    adversarial, matching = "a" * 4095 + "!", "a" * 4096
    # (a+)+$ matches what a+$ matches; Python's re runs the latter in linear time
    expected = ["norm" if re.search("a+$", n) else "unclassified" for n in (adversarial, matching)]
    assert expected == ["unclassified", "norm"]
    out = json.loads(cli("classify", adversarial, matching, "--rules", rules, "--format", "json").stdout)
    assert [row["category"] for row in out] == expected


def test_a_nested_quantifier_rule_gives_its_category_in_a_budget(tmp_path):
    import re

    rules = tmp_path / "nested.toml"
    rules.write_text('[[rule]]\nid = "mine.nested"\ncategory = "norm"\npattern = "^([a-z_]+)+kernel$"\n')
    with sqlite3.connect(f"file:{REAL_EXPORT}?mode=ro", uri=True) as db:
        names = {n for (n,) in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                          "JOIN StringIds s ON s.id = k.demangledName")}
    linear = re.compile("^[a-z_]+kernel$")  # the same language without the nested quantifier
    expected = {n for n in names if linear.search(n)}
    assert "fused_moe_kernel" in expected and "triton_per_fused_copy__mul_sum_0" in names  # a near miss is there
    budget = json.loads(assert_ok(cli("budget", REAL_EXPORT, "--rules", rules, "--format", "json")))
    kernels = [k for d in budget["devices"] for k in d["kernels"]]
    assert {k["demangled"] for k in kernels if k["category"] == "norm" and k["family"] == "user"} == \
        expected & {k["demangled"] for k in kernels}
    assert expected & {k["demangled"] for k in kernels}


@pytest.mark.parametrize("pattern, what", [("(a)\\\\1", "backreference"), ("^(?!x)a", "lookahead"),
                                           ("(?<!_)experts", "lookbehind"), ("a++", "possessive")])
def test_a_pattern_re2_cannot_run_is_one_line_with_file_and_line(tmp_path, pattern, what):
    rules = tmp_path / "re2.toml"
    rules.write_text(f'# {what}\n\n[[rule]]\nid = "mine.{what}"\ncategory = "norm"\npattern = "{pattern}"\n')
    assert_error(cli("classify", "aa", "--rules", rules), "re2.toml:6", f"mine.{what}", "RE2", "rewrite it")


def test_user_nvtx_layer_range_and_steps_regexes_run_on_re2(tmp_path):
    rules = tmp_path / "ctx.toml"
    rules.write_text('[[rule]]\nid = "mine.ctx"\ncategory = "norm"\npattern = "^zz$"\nnvtx = "(x+)+y"\n')
    out = json.loads(cli("classify", "zz", "--rules", rules, "--nvtx", "x" * 4095 + "y", "--format", "json").stdout)
    assert out[0]["category"] == "norm"
    (tmp_path / "bad.toml").write_text('[[rule]]\nid = "mine.ctx"\ncategory = "norm"\npattern = "^zz$"\n'
                                       'nvtx = "(x)\\\\1"\n')
    assert_error(cli("classify", "zz", "--rules", tmp_path / "bad.toml"), "bad.toml:5", "'nvtx'", "RE2")
    assert_error(cli("budget", REAL_EXPORT, "--layer-range", "(a)\\1"), "--layer-range", "RE2")
    assert_error(cli("budget", REAL_EXPORT, "--steps", "nvtx-re:(?<=a)b"), "--steps nvtx-re", "RE2")


def test_long_names_are_matched_on_their_first_characters(tmp_path):
    rules = tmp_path / "tail.toml"
    rules.write_text('[[rule]]\nid = "mine.tail"\ncategory = "norm"\npattern = "TAIL$"\n')
    head = json.loads(cli("classify", "x" * 10 + "TAIL", "--rules", rules, "--format", "json").stdout)
    cut = json.loads(cli("classify", "x" * 10_000 + "TAIL", "--rules", rules, "--format", "json").stdout)
    assert head[0]["category"] == "norm" and cut[0]["category"] == "unclassified"


# --- ids do not overflow ---------------------------------------------------------------------------------------

def _one_kernel_capture(path, device=0, stream=7, corr=None, name_id=None):
    b = Builder(path)
    t, p = gtid(10), gpid(10)
    for i in range(3):
        c = b.launch(t, 1000 + i * 1000, 1010 + i * 1000)
        b.kernel(p, c, 1050 + i * 1000, 1080 + i * 1000, NAME, device=device, stream=stream)
    b.nvtx(t, 900, 4000, "decode_step")
    return b.close()


def test_device_300_is_gpu_300(tmp_path):
    cap = _one_kernel_capture(tmp_path / "d.sqlite", device=300)
    assert [d["device"] for d in budget_json(cap)["devices"]] == [300]


@pytest.mark.parametrize("column,value", [("streamId", 2 ** 31 + 7), ("streamId", -3), ("deviceId", 2 ** 32 + 1),
                                          ("correlationId", 2 ** 32 + 1), ("demangledName", 2 ** 31 + 1),
                                          ("demangledName", 2 ** 32 + 2)])
def test_ids_beyond_their_width_are_skipped_and_counted_not_wrapped(tmp_path, column, value):
    cap = copy_export(tmp_path)
    n = sqlite3.connect(cap).execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
    sql(cap, f"UPDATE {KERNEL} SET {column} = {value} WHERE rowid = (SELECT min(rowid) FROM {KERNEL})")
    r = run("budget", cap, "--format", "json")
    assert r.exit_code == 0, r.output
    assert "warning: " in r.stderr and "skipped 1 damaged row" in r.stderr
    skipped = json.loads(r.stdout)["capture"]["skipped_rows"]
    assert skipped[KERNEL]["rows"] == 1
    assert sum(d["kernels_per_step"] * d["steps"] for d in json.loads(r.stdout)["devices"]) < n


# --- time -------------------------------------------------------------------------------------------------------

def test_times_shifted_below_zero_give_the_same_budget(tmp_path, real_budget):
    cap = copy_export(tmp_path)
    high = sqlite3.connect(cap).execute(f'SELECT max("end") FROM {RUNTIME}').fetchone()[0]
    shift_times(cap, -(high + 10 ** 9))
    assert sqlite3.connect(cap).execute(f'SELECT max("end") FROM {KERNEL}').fetchone()[0] < 0
    assert comparable(budget_json(cap)) == comparable(real_budget)


def test_shuffled_row_order_gives_the_identical_budget(tmp_path, real_budget):
    cap = shuffle_rows(copy_export(tmp_path))
    first = sqlite3.connect(cap).execute(f"SELECT start FROM {KERNEL} LIMIT 3").fetchall()
    assert first != sorted(first)  # really out of order
    assert comparable(budget_json(cap)) == comparable(real_budget)


@pytest.mark.parametrize("update,reason", [
    ('"end" = start - 5', "end before start"),
    ('"end" = 9223372036854775807', "a time outside the capture"),
    ("start = -4611686018427387904", "a time outside the capture"),
])
def test_absurd_times_are_skipped_with_one_warning(tmp_path, update, reason):
    cap = copy_export(tmp_path)
    sql(cap, f"UPDATE {KERNEL} SET {update} WHERE rowid IN (SELECT rowid FROM {KERNEL} LIMIT 2)")
    r = run("budget", cap, "--format", "json")
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and reason in warnings[0], r.stderr
    budget = json.loads(r.stdout)
    assert budget["capture"]["skipped_rows"][KERNEL] == {reason: 2, "rows": 2}
    for d in budget["devices"]:
        assert d["step_ms"] >= 0 and d["busy_ms_per_step"] >= 0 and d["idle_ms_per_step"] >= -1e-9
        assert all(c["ms_per_step"] >= 0 for c in d["categories"])


def test_no_numpy_warning_reaches_stderr(tmp_path):
    cap = copy_export(tmp_path)
    sql(cap, f'UPDATE {KERNEL} SET "end" = 9223372036854775807, start = -4611686018427387904 '
             f"WHERE rowid % 3 = 0")
    for command in ("budget", "check"):
        proc = cli(command, cap)
        assert proc.returncode == 0, proc.stderr
        assert b"RuntimeWarning" not in proc.stderr and b"overflow" not in proc.stderr
        assert len([x for x in proc.stderr.splitlines() if x.strip()]) == 1, proc.stderr


def test_a_text_start_column_is_a_damaged_table(tmp_path):
    cap = retype(copy_export(tmp_path), KERNEL, "start", "TEXT")
    one_error(run("budget", cap), KERNEL, "start", "TEXT")


def test_a_missing_required_column_names_the_table(tmp_path):
    cap = copy_export(tmp_path)
    sql(cap, f"ALTER TABLE {RUNTIME} DROP COLUMN correlationId")
    one_error(run("budget", cap), RUNTIME, "correlationId")


def test_a_kernel_start_stored_as_text_is_a_skipped_row(tmp_path):
    cap = copy_export(tmp_path)
    sql(cap, f"UPDATE {KERNEL} SET start = 'soon' WHERE rowid = 5")
    r = run("budget", cap, "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["capture"]["skipped_rows"][KERNEL]["start NULL or not an integer"] == 1


def test_every_row_damaged_is_a_damaged_table(tmp_path):
    cap = retype(copy_export(tmp_path), RUNTIME, "globalTid")
    sql(cap, f"UPDATE {RUNTIME} SET globalTid = NULL")
    one_error(run("budget", cap), RUNTIME, "damaged", "globalTid")


# --- no GPU work ------------------------------------------------------------------------------------------------

def test_empty_kernel_table_is_the_same_error_for_budget_and_diff(tmp_path):
    cap = copy_export(tmp_path)
    sql(cap, f"DELETE FROM {KERNEL}", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    one_error(run("budget", cap), "no GPU work in the capture")
    one_error(run("diff", cap, REAL_EXPORT), "no GPU work in the capture")
    one_error(run("diff", REAL_EXPORT, cap), "no GPU work in the capture")


def test_no_work_inside_the_steps_is_one_error(tmp_path):
    b = Builder(tmp_path / "late.sqlite")
    t, p = gtid(10), gpid(10)
    for i in range(3):
        b.nvtx(t, i * 100, i * 100 + 50, "decode_step")
    c = b.launch(t, 5000, 5010)
    b.kernel(p, c, 5050, 5080, NAME)
    late = b.close()
    one_error(run("budget", late, "--steps", "nvtx:decode_step"), "no GPU work in its steps")


# --- text ---------------------------------------------------------------------------------------------------------

def test_invalid_utf8_in_names_and_nvtx_is_replaced(tmp_path):
    cap = copy_export(tmp_path)
    conn = sqlite3.connect(cap)
    sid = conn.execute(f"SELECT shortName FROM {KERNEL} GROUP BY shortName ORDER BY count(*) DESC").fetchone()[0]
    conn.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", (b"bad\xff\xfename", sid))
    conn.execute("UPDATE NVTX_EVENTS SET text = CAST(? AS TEXT) WHERE text IS NOT NULL", (b"range\xc3",))
    conn.commit()
    conn.close()
    for fmt in ("table", "json", "csv", "markdown"):
        r = run("budget", cap, "--format", fmt)
        assert r.exit_code == 0, r.output
    assert "bad\ufffd\ufffdname" in run("budget", cap, "--top", "100").stdout


def test_classify_stdin_with_invalid_utf8():
    proc = cli("classify", "-", stdin=b"nvjet_sm90_tst_64x8\xff\n\xfe\xfe\n")
    out = assert_ok(proc)
    assert "\ufffd" in out and len(out.splitlines()) == 3


@pytest.mark.parametrize("samples", ["0", "-5"])
def test_diff_samples_must_be_positive(samples):
    one_error(run("diff", REAL_EXPORT, REAL_EXPORT, "--samples", samples), "--samples")


def test_control_characters_never_reach_any_output(tmp_path):
    cap = copy_export(tmp_path)
    conn = sqlite3.connect(cap)
    sid = conn.execute(f"SELECT shortName FROM {KERNEL} GROUP BY shortName ORDER BY count(*) DESC").fetchone()[0]
    conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", ("evil\x1b[2J\x1b]0;owned\x07\nname\r\x00", sid))
    conn.execute("UPDATE NVTX_EVENTS SET text = 'step\x1b[1A\nsplit' WHERE text IS NOT NULL")
    conn.commit()
    conn.close()
    for fmt in ("table", "markdown"):  # for people: cleaned
        r = run("budget", cap, "--format", fmt, "--top", "50")
        assert r.exit_code == 0, r.output
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\x00" not in r.stdout, fmt
    # machine formats carry the name exactly: JSON escapes it (no raw control character), CSV quotes it
    r = run("budget", cap, "--format", "json", "--top", "50")
    assert r.exit_code == 0 and "\x1b" not in r.stdout and "\x07" not in r.stdout, r.output
    names = [k["demangled"] for d in json.loads(r.stdout)["devices"] for k in d["kernels"]]
    assert "evil\x1b[2J\x1b]0;owned\x07\nname\r\x00" in names, [n for n in names if "evil" in n]
    table = run("budget", cap, "--top", "50").stdout
    assert any("evil" in line and "name" in line for line in table.splitlines())  # one row, not two
    out = tmp_path / "report"
    r = run("report", cap, "-o", out)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in (out / "report.md").read_text()
    r = run("classify", "k\x1b[31m\nx")
    assert "\x1b" not in r.stdout and len(r.stdout.splitlines()) == 2


# --- arguments and usage errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["budget", str(REAL_EXPORT), "--top", "-1"], "--top"),
    (["gap", str(REAL_EXPORT), "--tp", "0"], "--tp"),
    (["limit", "-m", "glm-5-nvfp4", "-H", "h200", "--tp", "0"], "--tp"),
    (["capture", "--dry-run", "--workload", "moe-decode", "--port", "99999"], "--port"),
    (["budget"], "CAPTURE"),
    (["budget", str(REAL_EXPORT), "--bogus"], "--bogus"),
    (["bugdet"], "bugdet"),
    (["ledger", "show"], "ENTRY"),
])
def test_usage_errors_are_one_line(args, needle):
    proc = cli(*args)
    line = assert_error(proc, needle)
    assert "--help" in line


def test_no_command_is_one_line():
    assert_error(cli(), "missing command", "budget")


def test_an_unexpected_exception_is_one_line_exit_1(tmp_path, monkeypatch):
    import profattr.attribute.budget as budget

    def boom(*a, **k):
        raise KeyError("surprise")

    monkeypatch.setattr(budget, "compute_budget", boom)
    r = run("budget", REAL_EXPORT)
    line = one_error(r, "internal error: KeyError", "PROFATTR_DEBUG=1", code=1)
    assert "Traceback" not in r.output
    monkeypatch.setenv("PROFATTR_DEBUG", "1")
    r = run("budget", REAL_EXPORT)
    assert r.exit_code == 1 and "Traceback" in r.stderr and line in r.stderr


def test_keyboard_interrupt_exits_130(monkeypatch):
    import profattr.attribute.budget as budget

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(budget, "compute_budget", interrupted)
    r = run("budget", REAL_EXPORT)
    assert r.exit_code == 130 and "Traceback" not in r.output


def test_torch_trace_fifo_member_and_truncated_gzip(tmp_path):
    data = REAL_TRACE.read_bytes()
    cut = tmp_path / "cut.trace.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    one_error(run("budget", cut), "truncated")
    folder = tmp_path / "ranks"
    folder.mkdir()
    (folder / "x-TP-0.trace.json.gz").write_bytes(data)
    os.mkfifo(folder / "x-TP-1.trace.json.gz")
    assert stat.S_ISFIFO(os.stat(folder / "x-TP-1.trace.json.gz").st_mode)
    proc = cli("check", folder, "--format", "json", timeout=60)  # the FIFO is not a rank file: it is never opened
    assert proc.returncode in (0, 1) and proc.stderr == b"", proc.stderr
    assert json.loads(proc.stdout)["schema"] == "profattr.check/1"
    assert json.loads(gzip.decompress(data))["traceEvents"]
