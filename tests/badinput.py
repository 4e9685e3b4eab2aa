"""Helpers of the bad-input tests: copies of the REAL committed captures to damage at test time (never committed as
binaries), the CLI in a child process with a time limit, and what every case checks (exit status, one line on
stderr, no traceback, inputs byte-identical, nothing created beside them)."""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL_EXPORT = ROOT / "examples" / "h200" / "sglang-triton-bs1.sqlite"
REAL_TRACE = ROOT / "examples" / "h200" / "glm5" / "glm-triton-torch-r1-TP-0.trace.json.gz"
TIME_LIMIT_S = 120  # a hang fails here (subprocess timeout), not a wall-clock assertion on speed
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
TIME_COLUMNS = {  # every time column of the tables profattr reads (and the session's)
    KERNEL: ("start", "end"), RUNTIME: ("start", "end"), "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end"), "NVTX_EVENTS": ("start", "end"),
    "CUDA_GRAPH_EVENTS": ("start", "end"), "CUDA_GRAPH_NODE_EVENTS": ("start", "end"),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ("start", "end"), "CUPTI_ACTIVITY_KIND_CUDA_EVENT": ("start", "end"),
}


def copy_export(folder: Path, name: str = "capture.sqlite") -> Path:
    """A copy of the real H200 export (SGLang triton, batch 1) to damage."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    shutil.copyfile(REAL_EXPORT, out)
    return out


def sql(path: Path, *statements: str) -> Path:
    """Run statements on a copy (with the journal off: no file is left beside it)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    for s in statements:
        conn.execute(s)
    conn.commit()
    conn.close()
    return path


def retype(path: Path, table: str, column: str, declared: str | None = None) -> Path:
    """Recreate `table` with `column` declared as `declared` (default: as it was) and without NOT NULL, so that
    a test can store NULLs and text there (SQLite cannot alter a column)."""
    conn = sqlite3.connect(path)
    create = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    lines = []
    for line in create.splitlines():
        parts = line.split()
        if parts and parts[0].strip('"') == column:
            comment = line.find("--")
            code = line[:comment] if comment >= 0 else line
            trailing = "," if code.rstrip().endswith(",") else ""
            line = f"    {parts[0]} {declared or parts[1].rstrip(',')}{trailing}"
        lines.append(line)
    conn.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
    conn.execute("\n".join(lines))
    conn.execute(f"INSERT INTO {table} SELECT * FROM old_{table}")
    conn.execute(f"DROP TABLE old_{table}")
    conn.commit()
    conn.close()
    return path


def shift_times(path: Path, delta_ns: int) -> Path:
    """Every time column of every table moved by `delta_ns` (the session duration stays what it is)."""
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, cols in TIME_COLUMNS.items():
        if table in tables:
            have = {r[1] for r in conn.execute(f"pragma table_info('{table}')")}
            sets = ", ".join(f'"{c}" = "{c}" + ({delta_ns})' for c in cols if c in have)
            if sets:
                conn.execute(f"UPDATE {table} SET {sets}")
    conn.commit()
    conn.close()
    return path


def shuffle_rows(path: Path, seed: int = 7) -> Path:
    """Every table rewritten in a random row order (nsys 2025.6+ no longer writes rows in time order)."""
    conn = sqlite3.connect(path)
    tables = [r for r in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' AND sql IS NOT NULL "
                                      "AND name NOT LIKE 'sqlite_%'")]
    indexes = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type='index' AND sql IS NOT NULL")]
    for i, (table, create) in enumerate(tables):
        conn.execute(f'ALTER TABLE "{table}" RENAME TO "shuffled_{i}"')
        conn.execute(create)
        # a deterministic pseudo-random order: a hash of the rowid and a seed
        conn.execute(f'INSERT INTO "{table}" SELECT * FROM "shuffled_{i}" '
                     f"ORDER BY ((rowid * 2654435761 + {seed}) % 1000003), rowid DESC")
        conn.execute(f'DROP TABLE "shuffled_{i}"')
    for create in indexes:
        conn.execute(create)
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_one_line_error(result, *needles) -> None:
    """A Click result of bad input (in-process CliRunner): exit 2, no traceback, one `error: ` line on stderr that
    holds each needle."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for n in needles:
        assert n in lines[0], (n, lines[0])


def snapshot(folder: Path) -> dict:
    """name -> sha256 (regular files) or kind (anything else), for every entry of `folder`."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.is_symlink():
            out[p.name] = "link"
        elif p.is_file():
            out[p.name] = digest(p)
        else:
            out[p.name] = "folder" if p.is_dir() else "special"
    return out


def cli(*args, cwd=None, stdin: bytes | None = None, env=None, timeout: int = TIME_LIMIT_S):
    """`profattr ARGS` in a child process (the installed entry point's code path: profattr.cli:main)."""
    import profattr

    package_root = str(Path(profattr.__file__).resolve().parent.parent)  # the profattr these tests import
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    environment.pop("PROFATTR_DEBUG", None)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "profattr", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, timeout=timeout, env=environment)


def stderr_lines(proc) -> list:
    return [line for line in proc.stderr.decode("utf-8", "replace").splitlines() if line.strip()]


def assert_error(proc, *needles, code: int = 2) -> str:
    """Exit `code`, exactly one line on stderr starting with `error:` (holding every needle), no traceback."""
    err = proc.stderr.decode("utf-8", "replace")
    out = proc.stdout.decode("utf-8", "replace")
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = stderr_lines(proc)
    assert proc.returncode == code, (proc.returncode, err[-2000:], out[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def assert_ok(proc, warning: str | None = None) -> str:
    """Exit 0, no traceback; with `warning`, exactly one `warning:` line on stderr holding it, else none."""
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    assert proc.returncode == 0, (proc.returncode, err[-2000:])
    lines = stderr_lines(proc)
    if warning is None:
        assert lines == [], lines
    else:
        assert len(lines) == 1 and lines[0].startswith("warning: ") and warning in lines[0], lines
    return proc.stdout.decode("utf-8")


# --- round two: torch traces, ncu CSVs, run.json, config.json, ledgers ----------------------------------------

GLM = ROOT / "examples" / "h200" / "glm5"
REAL_NCU = GLM / "glm-drill-triton.ncu.csv"  # 15 launches of an interrupted drill (drill-report --accept-partial)
REAL_RUN = GLM / "glm-triton-bs1-r1.run.json"  # an SGLang capture's run.json: requests, tp, model_config (GLM-5)
REAL_GRAPH_EXPORT = REAL_EXPORT  # 19 cudaGraphLaunch replays of 140 node kernels (nsys node tracing)
_cache: dict = {}


def trace_doc() -> dict:
    """The real torch trace, parsed (once per test process; each caller gets its own deep copy)."""
    import copy
    import gzip
    import json

    if "trace" not in _cache:
        _cache["trace"] = json.loads(gzip.decompress(REAL_TRACE.read_bytes()))
    return copy.deepcopy(_cache["trace"])


def write_trace(folder: Path, doc, name: str = "t.trace.json.gz") -> Path:
    """`doc` (a dict, a list of events, or raw bytes) as a trace file; gzip when the name ends in .gz."""
    import gzip
    import json

    folder.mkdir(parents=True, exist_ok=True)
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    out = folder / name
    out.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    return out


def ncu_rows() -> list:
    """The real ncu CSV as rows of fields (header, units, one row per launch)."""
    import csv

    return [list(r) for r in csv.reader(REAL_NCU.read_text().splitlines())]


def write_ncu(folder: Path, rows=None, raw: bytes | None = None, with_run: bool = True,
              run_text: str | None = None) -> Path:
    """A drill CSV (the real one, or `rows`, or `raw` bytes) named d.ncu.csv, with the drill's run.json beside it
    (as d.run.json) unless `with_run` is False; `run_text` replaces that run.json's content."""
    import csv
    import io

    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "d.ncu.csv"
    if raw is None:
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows if rows is not None else ncu_rows())
        raw = buf.getvalue().encode()
    out.write_bytes(raw)
    if with_run:
        (folder / "d.run.json").write_text(run_text if run_text is not None else
                                           REAL_NCU.with_name("glm-drill-triton.run.json").read_text())
    return out


def run_doc() -> dict:
    import json

    return json.loads(REAL_RUN.read_text())


def capture_with_run(folder: Path, run, name: str = "capture") -> Path:
    """A copy of the real export with `run` (a dict, or raw text) beside it as its run.json."""
    import json

    cap = copy_export(folder, f"{name}.sqlite")
    (folder / f"{name}.run.json").write_text(run if isinstance(run, str) else json.dumps(run))
    return cap


def base_ledger() -> Path:
    """A ledger holding one entry (the real export, added with `profattr ledger add`), made once per test process
    in a temporary folder; copy it before damaging it."""
    import atexit
    import tempfile

    if "ledger" not in _cache:
        folder = Path(tempfile.mkdtemp(prefix="profattr-ledger-"))
        atexit.register(shutil.rmtree, folder, True)
        cap = copy_export(folder)
        shutil.copyfile(REAL_EXPORT.with_name("sglang-triton-bs1.run.json"), folder / "capture.run.json")
        proc = cli("ledger", "add", cap, "--ledger", folder / "ledger.db", "--label", "base")
        assert proc.returncode == 0, proc.stderr
        _cache["ledger"] = folder / "ledger.db"
    return _cache["ledger"]


def damaged_ledger(folder: Path, *statements: str) -> Path:
    """A copy of base_ledger() with `statements` run on it (journal off: nothing left beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "ledger.db"
    shutil.copyfile(base_ledger(), out)
    conn = sqlite3.connect(out)
    for s in statements:
        conn.execute(s)
    conn.commit()
    conn.close()
    return out


def zero_graph_correlations(path: Path) -> int:
    """Give every kernel that a cudaGraphLaunch replayed a correlationId of 0, as newer nsys releases record the
    kernels of graphs built before the capture; returns how many kernels changed."""
    conn = sqlite3.connect(path)
    n = conn.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 0 WHERE correlationId IN ("
        "SELECT r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r JOIN StringIds AS s ON s.id = r.nameId "
        "WHERE s.value LIKE 'cudaGraphLaunch%')").rowcount
    conn.commit()
    conn.close()
    return n


ERROR, WARNING, OK = "error", "warning", "ok"  # what a bad-input case expects


def assert_outcome(proc, expect: str, needles=(), code: int | None = None) -> None:
    """A bad-input case's contract: no traceback, no internal error, no escape sequence; then one `error:` line
    and exit `code` (2), or exit `code` (0) with a result on stdout and either one `warning:` line holding every
    needle (WARNING) or nothing on stderr (OK)."""
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in out + err, err[-3000:]
    assert "internal error" not in err, err[-3000:]
    assert "\x1b" not in out and "\x1b" not in err
    if expect == ERROR:
        assert_error(proc, *needles, code=code or 2)
        return
    lines = stderr_lines(proc)
    assert proc.returncode == (code or 0), (proc.returncode, err[-2000:])
    if expect == WARNING:
        assert len(lines) == 1 and lines[0].startswith("warning: "), err[-2000:]
        for n in needles:
            assert n in lines[0], (n, lines[0])
    else:
        assert lines == [], lines
    assert out.strip(), "a usable input gives a result"
