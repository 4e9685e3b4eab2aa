"""A corpus of bad input for every command, built at test time from the REAL committed captures
(examples/h200/sglang-triton-bs1.sqlite and the torch trace glm-triton-torch-r1-TP-0.trace.json.gz; nothing damaged is
committed). Each case runs `profattr` in a child process with a time limit and checks:

- the exit status (2 for bad input; 0 where the input is usable);
- stderr: exactly one line, `error: ...` (or one `warning: ...` line and a normal result on stdout, or nothing);
- no `Traceback` anywhere, and no control character (ESC) on stdout;
- every input byte-identical afterwards, and nothing created beside it (its folder holds the same files);
- finished within the subprocess timeout (a hang fails the case; no assertion on speed).
"""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Callable

import pytest

from badinput import (ERROR, OK, WARNING, KERNEL, REAL_TRACE, RUNTIME, TIME_LIMIT_S, assert_outcome, cli,
                      copy_export, retype, snapshot, sql)

NVTX = "NVTX_EVENTS"
NAME = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"


@dataclass
class Case:
    """`build(folder)` makes the inputs in `folder` and returns the command's arguments (and maybe stdin)."""

    id: str
    build: Callable
    expect: str  # ERROR (exit 2, one error line), WARNING (exit 0, one warning line) or OK (exit 0, quiet stderr)
    needles: tuple = ()
    code: int | None = None  # another exit status (check: 1 when a check fails)
    hold: Callable | None = field(default=None)  # (folder) -> context held while the command runs


def export(folder, *statements, name="capture.sqlite"):
    return sql(copy_export(folder, name), *statements) if statements else copy_export(folder, name)


def budget(*statements, extra=()):
    return lambda f: ["budget", export(f, *statements), *extra]


def damaged_column(table, column, value, where="rowid IN (SELECT rowid FROM {t} LIMIT 3)", declared=None):
    def build(f):
        cap = retype(copy_export(f), table, column, declared)
        sql(cap, f'UPDATE {table} SET "{column}" = {value} WHERE ' + where.format(t=table))
        return ["budget", cap]
    return build


def truncated(fraction=None, size=None):
    def build(f):
        cap = copy_export(f)
        data = cap.read_bytes()
        cap.write_bytes(data[: size if size is not None else int(len(data) * fraction)])
        return ["budget", cap]
    return build


def corrupted(fraction, length=4096, byte=0xA5, at=None):
    def build(f):
        cap = copy_export(f)
        data = bytearray(cap.read_bytes())
        start = int(len(data) * fraction) // 4096 * 4096 if at is None else at
        data[start:start + length] = bytes([byte]) * length
        cap.write_bytes(bytes(data))
        return ["budget", cap]
    return build


def root_page_corrupted(table):
    """The root page of `table` overwritten (its b-tree cannot be read)."""
    def build(f):
        cap = copy_export(f)
        conn = sqlite3.connect(cap)
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
        data = bytearray(cap.read_bytes())
        data[(root - 1) * size:root * size] = b"\xa5" * size
        cap.write_bytes(bytes(data))
        return ["budget", cap]
    return build


def header_byte(offset, value):
    def build(f):
        cap = copy_export(f)
        data = bytearray(cap.read_bytes())
        data[offset] = value
        cap.write_bytes(bytes(data))
        return ["budget", cap]
    return build


def hostile_name(value: str):
    def build(f):
        cap = copy_export(f)
        conn = sqlite3.connect(cap)
        sid = conn.execute(f"SELECT shortName FROM {KERNEL} GROUP BY shortName ORDER BY count(*) DESC").fetchone()[0]
        conn.execute("UPDATE StringIds SET value = ? WHERE id = ?", (value, sid))
        conn.commit()
        conn.close()
        return ["budget", cap, "--top", "40"]
    return build


def hostile_nvtx(value: str):
    return budget(f"UPDATE {NVTX} SET text = {value!r} WHERE text IS NOT NULL")


def locked(f):
    cap = copy_export(f)
    return ["budget", cap]


class Locker:
    """An exclusive transaction on the capture, held by another connection while the command runs."""

    def __init__(self, folder):
        self.conn = sqlite3.connect(folder / "capture.sqlite", check_same_thread=False, isolation_level=None)

    def __enter__(self):
        self.conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        self.conn.execute("BEGIN EXCLUSIVE")
        self.conn.execute("UPDATE StringIds SET value = value WHERE id = (SELECT min(id) FROM StringIds)")
        return self

    def __exit__(self, *exc):
        self.conn.execute("ROLLBACK")
        self.conn.close()


def fifo(name, command=("budget",)):
    def build(f):
        os.mkfifo(f / name)
        return [*command, f / name]
    return build


def symlink_loop(f):
    (f / "a.sqlite").symlink_to(f / "b.sqlite")
    (f / "b.sqlite").symlink_to(f / "a.sqlite")
    return ["budget", f / "a.sqlite"]


def dangling(f):
    (f / "gone.sqlite").symlink_to(f / "nowhere.sqlite")
    return ["budget", f / "gone.sqlite"]


def folder_named(f):
    (f / "x.sqlite").mkdir()
    return ["budget", f / "x.sqlite"]


def odd_name(name, via=None):
    def build(f):
        cap = copy_export(f, name)
        return ["budget", via(cap) if via else cap]
    return build


def text_file(f):
    (f / "notes.sqlite").write_text("hello, not a database\n")
    return ["budget", f / "notes.sqlite"]


def other_sqlite(f):
    conn = sqlite3.connect(f / "other.sqlite")
    conn.execute("CREATE TABLE t (a)")
    conn.commit()
    conn.close()
    return ["budget", f / "other.sqlite"]


def duplicate_launches(f):
    cap = copy_export(f)
    cols = ", ".join(f'"{r[1]}"' for r in sqlite3.connect(cap).execute(f"pragma table_info('{RUNTIME}')"))
    sql(cap, f"INSERT INTO {RUNTIME} ({cols}) SELECT {cols} FROM {RUNTIME} WHERE rowid % 5 = 0")
    return ["budget", cap]


# --- torch-profiler traces ----------------------------------------------------------------------------------------

def trace_bytes() -> bytes:
    return REAL_TRACE.read_bytes()


def trace_cut(size_of: Callable):
    def build(f):
        data = trace_bytes()
        p = f / "t.trace.json.gz"
        p.write_bytes(data[: size_of(len(data))])
        return ["budget", p]
    return build


def trace_flipped(f):
    data = bytearray(trace_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)
    p = f / "t.trace.json.gz"
    p.write_bytes(bytes(data))
    return ["budget", p]


def trace_json(edit: Callable, name="t.trace.json.gz", raw: bytes | None = None):
    def build(f):
        p = f / name
        if raw is not None:
            p.write_bytes(raw)
        else:
            doc = json.loads(gzip.decompress(trace_bytes()))
            text = edit(doc)
            data = text.encode() if isinstance(text, str) else json.dumps(text).encode()
            p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        return ["budget", p]
    return build


def _events(doc, cat, fn, every=50):
    n = 0
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict) and ev.get("cat") == cat:
            if n % every == 0:
                fn(ev)
            n += 1
    return doc


def _truncated_json(doc):
    text = json.dumps(doc)
    return text[: len(text) // 2]


# --- rules files ---------------------------------------------------------------------------------------------------

def rules(text: str | bytes, command="classify"):
    def build(f):
        p = f / "mine.toml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        if command == "classify":
            return ["classify", NAME, "--rules", p]
        return ["budget", export(f), "--rules", p]
    return build


RULE = '[[rule]]\nid = "mine.x"\ncategory = "{category}"\npattern = "{pattern}"\n'


# --- run.json, ledger, ncu CSV ----------------------------------------------------------------------------------

def run_json(content: str | None, command="check"):
    def build(f):
        cap = export(f)
        if content is None:
            os.mkfifo(f / "capture.run.json")
        else:
            (f / "capture.run.json").write_text(content)
        return [command, cap] + (["-H", "h200"] if command == "gap" else [])
    return build


def _input_file(name: str, content: bytes | None, argv):
    """A case whose input is the file NAME holding `content` (a FIFO when None); argv(path) is the command."""
    def build(f):
        p = f / name
        if content is None:
            os.mkfifo(p)
        else:
            p.write_bytes(content)
        return argv(p)
    return build


def ledger_file(content: bytes | None, args=("list",)):
    return _input_file("ledger.db", content, lambda p: ["ledger", *args, "--ledger", p])


def truncated_ledger(f):
    p = f / "ledger.db"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY, label TEXT)")
    conn.execute("INSERT INTO meta VALUES ('schema', 'profattr.ledger/1')")
    conn.executemany("INSERT INTO entries (label) VALUES (?)", [(f"e{i}" * 50,) for i in range(500)])
    conn.commit()
    conn.close()
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return ["ledger", "list", "--ledger", p]


def ncu_csv(content: bytes | None):
    return _input_file("d.ncu.csv", content, lambda p: ["drill-report", p])


def args(*a, with_export=False):
    def build(f):
        return [str(export(f)) if x == "@capture" else x for x in a]
    return build


BIG = 1 << 20
GRAPH_LAUNCHES = ("rowid IN (SELECT r.rowid FROM {t} AS r JOIN StringIds AS s ON s.id = r.nameId "
                  "WHERE s.value LIKE 'cudaGraphLaunch%' LIMIT 3)")
OTHER_CALLS = ("rowid IN (SELECT r.rowid FROM {t} AS r JOIN StringIds AS s ON s.id = r.nameId "
               "WHERE s.value NOT LIKE '%Launch%' AND s.value NOT LIKE '%emcpy%' AND s.value NOT LIKE '%emset%' "
               "LIMIT 3)")

CASES = [
    # --- the SQLite export: truncated, corrupted, locked, not a file -------------------------------------------
    Case("sqlite-empty", truncated(size=0), ERROR, ("not a SQLite file",)),
    Case("sqlite-cut-15-bytes", truncated(size=15), ERROR, ("not a SQLite file",)),
    Case("sqlite-cut-100-bytes", truncated(size=100), ERROR, ("damaged or truncated",)),
    Case("sqlite-cut-1-page", truncated(size=4096), ERROR, ("damaged or truncated",)),
    Case("sqlite-cut-a-third", truncated(1 / 3), ERROR, ("damaged or truncated",)),
    Case("sqlite-cut-half", truncated(1 / 2), ERROR, ("damaged or truncated",)),
    Case("sqlite-cut-last-page", truncated(size=-4096), ERROR, ("damaged or truncated",)),
    Case("sqlite-kernel-page-corrupted", root_page_corrupted(KERNEL), ERROR, ("damaged",)),
    Case("sqlite-runtime-page-corrupted", root_page_corrupted(RUNTIME), ERROR, ("damaged",)),
    Case("sqlite-strings-page-corrupted", root_page_corrupted("StringIds"), ERROR, ("damaged",)),
    Case("sqlite-schema-page-corrupted", corrupted(0.0, 4000, 0xA5, at=100), ERROR, ("damaged",)),
    Case("sqlite-page-corrupted-90pct", corrupted(0.90), ERROR, ("damaged",)),
    # a page of a table profattr never reads (the enum tables, the system environment): not noticed, rightly
    Case("sqlite-unread-page-corrupted", root_page_corrupted("TARGET_INFO_SYSTEM_ENV"), OK),
    Case("sqlite-page-zeroed-first", corrupted(0.0, 4096, 0x00), ERROR, ("not a SQLite file",)),
    Case("sqlite-header-page-size", header_byte(16, 0x03), ERROR, ("damaged",)),
    Case("sqlite-locked", locked, ERROR, ("locked",), hold=Locker),
    Case("sqlite-fifo", fifo("x.sqlite"), ERROR, ("FIFO",)),
    Case("sqlite-symlink-loop", symlink_loop, ERROR, ("loop of symbolic links",)),
    Case("sqlite-dangling-symlink", dangling, ERROR, ("no such file",)),
    Case("sqlite-folder", folder_named, ERROR, ("folder",)),
    Case("sqlite-text-file", text_file, ERROR, ("not a SQLite file",)),
    Case("sqlite-not-nsys", other_sqlite, ERROR, ("not an Nsight Systems export",)),
    Case("name-with-spaces", odd_name("my capture (1).sqlite"), OK),
    Case("name-unicode", odd_name("カプチャ ✓ ü.sqlite"), OK),
    Case("name-control-characters", odd_name("a\x1b[31mb\tc.sqlite"), OK),
    Case("name-leading-dash", odd_name("-x.sqlite"), OK),
    Case("name-leading-dash-dotted", odd_name("-x.sqlite", via=lambda p: f"./{p.name}"), OK),
    # --- NULLs, type confusion, ids --------------------------------------------------------------------------------
    Case("null-kernel-start", damaged_column(KERNEL, "start", "NULL"), WARNING, ("start NULL or not an integer",)),
    Case("null-kernel-device", damaged_column(KERNEL, "deviceId", "NULL"), WARNING, ("deviceId",)),
    Case("null-runtime-correlation", damaged_column(RUNTIME, "correlationId", "NULL", GRAPH_LAUNCHES), WARNING,
         (RUNTIME, "correlationId")),
    Case("null-runtime-thread", damaged_column(RUNTIME, "globalTid", "NULL", GRAPH_LAUNCHES), WARNING,
         (RUNTIME, "globalTid")),
    # calls the budget never reads (not launches): their damage is not met, so not counted
    Case("null-runtime-unread-calls", damaged_column(RUNTIME, "globalTid", "NULL", OTHER_CALLS), OK),
    Case("null-nvtx-thread", damaged_column(NVTX, "globalTid", "NULL", "eventType IN (59, 60) AND rowid IN "
                                                                       "(SELECT rowid FROM {t} LIMIT 2)"),
         WARNING, (NVTX,)),
    Case("null-string-value", damaged_column("StringIds", "value", "NULL", "id = 1"), OK),
    Case("text-kernel-start", damaged_column(KERNEL, "start", "'soon'"), WARNING, ("start NULL or not an integer",)),
    Case("text-kernel-device", damaged_column(KERNEL, "deviceId", "'gpu0'"), WARNING, ("deviceId",)),
    Case("text-runtime-start", damaged_column(RUNTIME, "start", "'later'", GRAPH_LAUNCHES), WARNING, (RUNTIME,)),
    Case("text-nvtx-start", damaged_column(NVTX, "start", "'x'"), WARNING, (NVTX,)),
    Case("blob-string-value", damaged_column("StringIds", "value", "x'ff00ff'", "id = 2"), OK),
    Case("real-kernel-start", damaged_column(KERNEL, "start", "start + 0.5"), OK),
    Case("kernel-start-declared-text", lambda f: ["budget", retype(copy_export(f), KERNEL, "start", "TEXT")],
         ERROR, (KERNEL, "TEXT")),
    Case("runtime-column-missing", budget(f"ALTER TABLE {RUNTIME} DROP COLUMN nameId"), ERROR, (RUNTIME, "nameId")),
    Case("every-launch-damaged", damaged_column(RUNTIME, "start", "NULL", "1"), ERROR, (RUNTIME, "damaged")),
    Case("kernel-table-empty", budget(f"DELETE FROM {KERNEL}", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY"), ERROR,
         ("no GPU work in the capture",)),
    Case("kernel-table-missing", budget(f"DROP TABLE {KERNEL}"), ERROR, ("no CUDA kernel data",)),
    Case("stream-id-beyond-31-bits", budget(f"UPDATE {KERNEL} SET streamId = 4294967303 WHERE rowid < 4"), WARNING,
         ("beyond its range",)),
    Case("name-id-beyond-32-bits", budget(f"UPDATE {KERNEL} SET demangledName = 8589934593 WHERE rowid < 4"),
         WARNING, ("beyond its range",)),
    # --- times ----------------------------------------------------------------------------------------------------
    Case("end-before-start", budget(f'UPDATE {KERNEL} SET "end" = start - 100 WHERE rowid % 97 = 0'), WARNING,
         ("end before start",)),
    Case("end-int64-max", budget(f'UPDATE {KERNEL} SET "end" = 9223372036854775807 WHERE rowid < 3'), WARNING,
         ("outside the capture",)),
    Case("start-minus-2-62", budget(f"UPDATE {KERNEL} SET start = -4611686018427387904 WHERE rowid < 3"), WARNING,
         ("outside the capture",)),
    Case("every-kernel-reversed", budget(f'UPDATE {KERNEL} SET "end" = start - 1',
                                         "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY"), ERROR,
         ("no GPU work", "damaged row")),
    Case("launch-time-absurd", budget(f"UPDATE {RUNTIME} SET start = 4611686018427387000 WHERE rowid % 7 = 0"),
         WARNING, ("launch call time outside",)),
    Case("nvtx-end-before-start", budget(f'UPDATE {NVTX} SET "end" = start - 10 WHERE eventType = 59 AND '
                                         f'rowid % 2 = 0'), WARNING, ("range end before start",)),
    Case("all-times-negative", budget(*(f'UPDATE {t} SET start = start - 100000000000, "end" = "end" - 100000000000'
                                        for t in (KERNEL, RUNTIME, NVTX, "CUPTI_ACTIVITY_KIND_MEMCPY",
                                                  "CUDA_GRAPH_EVENTS"))), WARNING,
         ("outside the session nsys recorded",)),
    # --- correlation ids and NVTX ranges --------------------------------------------------------------------------
    Case("duplicate-correlation-ids", duplicate_launches, OK),
    Case("dangling-correlation-ids", budget(f"UPDATE {KERNEL} SET correlationId = correlationId + 1000000000 "
                                            f"WHERE rowid % 3 = 0"), OK),
    Case("unclosed-nvtx-ranges", budget(f'UPDATE {NVTX} SET "end" = NULL WHERE eventType = 59'), OK),
    # --- hostile names ------------------------------------------------------------------------------------------
    Case("name-escape-sequences", hostile_name("evil\x1b[2J\x1b]0;title\x07k\x1b[31m"), OK),
    Case("name-newlines", hostile_name("line1\nline2\r\nline3"), OK),
    Case("name-1mb", hostile_name("k" * BIG), OK),
    Case("name-nul-and-c1", hostile_name("a\x00b\x85c\x9bd"), OK),
    Case("nvtx-escape-and-newline", hostile_nvtx("range\x1b[1A\nsplit"), OK),
    Case("nvtx-1mb", hostile_nvtx("n" * BIG), OK),
    # --- torch-profiler traces ------------------------------------------------------------------------------------
    Case("trace-gzip-cut-10", trace_cut(lambda n: 10), ERROR, ("truncated or damaged gzip",)),
    Case("trace-gzip-cut-1000", trace_cut(lambda n: 1000), ERROR, ("truncated or damaged gzip",)),
    Case("trace-gzip-cut-half", trace_cut(lambda n: n // 2), ERROR, ("truncated or damaged gzip",)),
    Case("trace-gzip-cut-end", trace_cut(lambda n: n - 10), ERROR, ("truncated or damaged gzip",)),
    Case("trace-gzip-corrupted", trace_flipped, ERROR, ("gzip",)),
    Case("trace-json-truncated", trace_json(_truncated_json), ERROR, ("truncated JSON",)),
    Case("trace-plain-json", trace_json(lambda d: d, name="t.json"), OK),
    Case("trace-no-events", trace_json(lambda d: {"schemaVersion": 1}), ERROR, ("no traceEvents",)),
    Case("trace-events-not-a-list", trace_json(lambda d: {"traceEvents": 5}), ERROR, ("expected",)),
    Case("trace-nested-deep", trace_json(None, name="t.json", raw=b'{"traceEvents": ' + b"[" * 200000 + b"]" * 200000
                                         + b"}"), ERROR, ("nested too deeply",)),
    Case("trace-bad-fields", trace_json(lambda d: _events(d, "kernel", lambda e: e.update(dur="slow", ts=None))),
         WARNING, ("trace events",)),
    Case("trace-negative-duration", trace_json(lambda d: _events(d, "kernel", lambda e: e.update(dur=-5.0))),
         WARNING, ("end before start",)),
    Case("trace-huge-ids", trace_json(lambda d: _events(d, "kernel", lambda e: e["args"].update(device=2 ** 40))),
         WARNING, ("trace events",)),
    Case("trace-hostile-names", trace_json(lambda d: _events(d, "kernel", lambda e: e.update(
        name="x\x1b[31m\nevil" + "y" * 1000), every=3)), OK),
    Case("trace-fifo", fifo("t.trace.json.gz"), ERROR, ("FIFO",)),
    Case("trace-empty-file", trace_json(None, name="t.json", raw=b""), ERROR, ("the file is empty", "torch-profiler")),
    # --- rules files --------------------------------------------------------------------------------------------
    Case("rules-invalid-toml", rules('[[rule]]\nid = "x\n'), ERROR, ("mine.toml:2", "invalid TOML")),
    Case("rules-unknown-category", rules(RULE.format(category="gemm.fp3", pattern="^x")), ERROR,
         ("mine.toml:3", "unknown category")),
    Case("rules-nested-quantifier", rules(RULE.format(category="norm", pattern="(a+)+$")), OK),
    Case("rules-backreference", rules(RULE.format(category="norm", pattern="(a)\\\\1")), ERROR,
         ("mine.toml:4", "RE2")),
    Case("rules-lookbehind-budget", rules(RULE.format(category="norm", pattern="(?<!x)y"), "budget"),
         ERROR, ("mine.toml:4", "RE2")),
    Case("rules-invalid-regex", rules(RULE.format(category="norm", pattern="rms(norm")), ERROR,
         ("mine.toml:4", "bad regex")),
    Case("rules-unknown-key", rules(RULE.format(category="norm", pattern="x") + 'colour = "red"\n'), ERROR,
         ("unknown key 'colour'",)),
    Case("rules-not-utf8", rules(b'[[rule]]\nid = "\xff\xfe"\n'), ERROR, ("not UTF-8",)),
    Case("rules-fifo", lambda f: (os.mkfifo(f / "r.toml"), ["classify", NAME, "--rules", f / "r.toml"])[1],
         ERROR, ("FIFO",)),
    Case("rules-folder", lambda f: ((f / "r.toml").mkdir(), ["classify", NAME, "--rules", f / "r.toml"])[1],
         ERROR, ("folder",)),
    Case("rules-empty-file", rules(""), OK),
    # --- run.json, ledger, ncu CSV -----------------------------------------------------------------------------
    Case("run-json-invalid", run_json("{not json"), ERROR, ("not a readable run.json",)),
    Case("run-json-fifo", run_json(None), ERROR, ("FIFO",)),
    Case("run-json-not-object-gap", run_json("[1, 2]", command="gap"), ERROR, ("profattr.run/1",)),
    Case("ledger-not-sqlite", ledger_file(b"hello"), ERROR, ("not a profattr ledger",)),
    Case("ledger-fifo", ledger_file(None), ERROR, ("FIFO",)),
    Case("ledger-truncated", truncated_ledger, ERROR, ("ledger",)),
    Case("ledger-show-unknown", ledger_file(b"", args=("show", "7")), ERROR, ("no ledger here yet",)),
    Case("ncu-csv-empty", ncu_csv(b""), ERROR, ("empty",)),
    Case("ncu-csv-binary", ncu_csv(b"\x00\x01binary"), ERROR, ("binary",)),
    Case("ncu-csv-header-only", ncu_csv(b'"ID","Kernel Name"\n'), ERROR, ("d.ncu.csv",)),
    Case("ncu-csv-fifo", ncu_csv(None), ERROR, ("FIFO",)),
    # --- bad arguments, every command -----------------------------------------------------------------------
    Case("budget-steps-bogus", args("budget", "@capture", "--steps", "layers"), ERROR, ("--steps",)),
    Case("budget-top-negative", args("budget", "@capture", "--top", "-1"), ERROR, ("--top",)),
    Case("budget-skip-steps-negative", args("budget", "@capture", "--skip-steps", "-2"), ERROR, ("--skip-steps",)),
    Case("diff-samples-zero", args("diff", "@capture", "@capture", "--samples", "0"), ERROR, ("--samples",)),
    Case("diff-one-capture", args("diff", "@capture"), ERROR, ("two captures (A B)",)),
    Case("classify-no-names", args("classify"), ERROR, ("NAMES",)),
    Case("check-missing", args("check", "nowhere.sqlite"), ERROR, ("no such file",)),
    Case("limit-unknown-hardware", args("limit", "-m", "glm-5-nvfp4", "-H", "tpu9"), ERROR, ("tpu9",)),
    Case("limit-tp-zero", args("limit", "-m", "glm-5-nvfp4", "-H", "h200", "--tp", "0"), ERROR, ("--tp",)),
    Case("gap-tp-zero", args("gap", "@capture", "--tp", "0"), ERROR, ("--tp",)),
    Case("gap-unknown-hardware", args("gap", "@capture", "-H", "tpu9", "-m", "glm-5-nvfp4"), ERROR, ("tpu9",)),
    Case("report-nothing", args("report", "-o", "out"), ERROR, ("CAPTURES",)),
    Case("report-empty-label", args("report", "@capture", "-o", "out", "--labels", ",,"), ERROR, ("--labels",)),
    Case("ledger-compare-one", args("ledger", "compare", "1"), ERROR, ("'B'",)),
    Case("ledger-no-subcommand", args("ledger"), ERROR, ("missing command",)),
    Case("drill-report-missing", args("drill-report", "none.ncu.csv"), ERROR, ("no such file",)),
    Case("capture-port-out-of-range", args("capture", "--dry-run", "--workload", "moe-decode", "--port", "99999"),
         ERROR, ("--port",)),
    Case("capture-no-target", args("capture", "--dry-run"), ERROR, ("nothing to capture",)),
    Case("capture-bad-batch", args("capture", "--dry-run", "--workload", "moe-decode", "--batch", "x"), ERROR,
         ("--batch",)),
    Case("unknown-command", args("bugdet", "@capture"), ERROR, ("bugdet",)),
]


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(tmp_path, case):
    folder = tmp_path / "in"
    folder.mkdir()
    argv = case.build(folder)
    before = snapshot(folder)
    holder = case.hold(folder) if case.hold else None
    if holder is not None:
        holder.__enter__()
    try:
        proc = cli(*argv, cwd=folder, timeout=TIME_LIMIT_S)
    finally:
        if holder is not None:
            holder.__exit__(None, None, None)
    assert_outcome(proc, case.expect, case.needles, case.code)
    after = snapshot(folder)
    assert after == before, "an input changed, or something was created beside it"
