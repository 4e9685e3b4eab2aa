"""Speed and memory of profattr (budget cold and warm, diff) and of nsys's own reports on large captures, as ratios to
SQLite's own aggregate scan of the same columns measured in the same run, at several sizes, with the growth exponents.
One script, one run.

    python benchmarks/budget_scale.py CAPTURE.sqlite [--sizes 0.3e6,3e6,30e6] [--workdir DIR] [--nsys PATH]
                                      [--markdown benchmarks/RESULTS.md] [--timeout 600] [--before CHECKOUT]

1. Scale a real capture: repeat its GPU activity, launch calls and NVTX ranges shifted in time (and in
   correlationId, keeping every kernel linked to its launch and NVTX nesting valid) until it holds about
   the requested number of kernel rows. Done in SQL (INSERT ... SELECT), so scaling itself is fast.
2. In separate processes (clean peak-memory readings), time:
   - T, the baseline: SQLite's C code reading every column the budget uses (kernels, launch calls, NVTX ranges) in
     one aggregate query per table (count, sum of end - start, max of each column), no Python object per row;
   - the row-iteration scan (the earlier baseline): kernel and launch columns fetched into Python, a tuple per row;
   - the bulk fetch of the reader's own two big queries (GPU ops packed into six integers, launch calls) into int64
     numpy arrays, side by side: sqlite3 (fetchmany + numpy.fromiter), Arrow through ADBC's SQLite driver, DuckDB's
     sqlite scanner (when its extension loads without a network: duckdb==1.4.4 + duckdb-ext-sqlite from PyPI);
   - `profattr budget` cold (empty caches: reads SQLite, fills the op store and the result cache), warm (the result
     cache's hit), warm from the op store alone (PROFATTR_RESULT_CACHE=0: the budget computed again from the cached
     op arrays), and with --no-cache; `profattr diff` of the file against itself, cold and warm; `profattr report` over three copies of
     the file (three cold budgets) and `profattr ledger add` into a new ledger, both cold;
   - nsys's `cuda_gpu_kern_sum` and `nvtx_gpu_proj_sum` (`nsys stats`, with --nsys), and `nsys-ai summary` when
     installed (on a hard link in its own folder: it writes its cache beside the file it reads).
3. Print, per size: wall time and peak memory of each tool as ratios to T. Peak memory is the largest RSS of any
   one process (getrusage of the children) and, sampled every 20 ms, the summed RSS of the whole process tree
   (diff runs two processes at once). Then the growth exponent of each tool: the log-log slope of time and memory
   against the number of kernels.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

# T, the baseline: SQLite's own C code reads every column the budget uses (kernels, launch calls, NVTX ranges) in
# one aggregate per table; no Python object per row
AGGREGATE = r"""
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
TABLES = (("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "deviceId", "correlationId", "globalPid", "shortName",
                                         "demangledName")),
          ("CUPTI_ACTIVITY_KIND_RUNTIME", ("correlationId", "globalTid", "start", "end", "nameId")),
          ("NVTX_EVENTS", ("start", "end", "globalTid", "textId")))
have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
n = 0
for table, cols in TABLES:
    if table in have:
        row = conn.execute(f'SELECT count(*), sum("end" - start), '
                           + ", ".join(f'max("{c}")' for c in cols) + f" FROM {table}").fetchone()
        n += row[0]
print(n)
"""

# the row-iteration scan (the earlier baseline): the same kernel and launch columns, one Python tuple per row
SCAN = r"""
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
n = 0
for row in conn.execute('SELECT start, "end", deviceId, correlationId, globalPid, shortName, demangledName '
                        'FROM CUPTI_ACTIVITY_KIND_KERNEL'):
    n += 1
for row in conn.execute('SELECT correlationId, globalTid, start, "end", nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME'):
    n += 1
print(n)
"""

# the reader's two big queries (queries/gpu_kernels.sql with its optional columns filled, launch_calls_by_name.sql),
# fetched into int64 arrays by one method (argv[2])
FETCH = r"""
import sys, numpy as np
path, method = sys.argv[1], sys.argv[2]
KERNELS = ('SELECT k.start, k."end", k.deviceId, ((COALESCE(k.streamId, 0) & 2147483647) << 32) | '
           '(COALESCE(k.demangledName, k.shortName) & 4294967295), (((k.globalPid >> 24) & 4294967295) << 32) | '
           '(k.correlationId & 4294967295), COALESCE(k.graphNodeId, -1) FROM CUPTI_ACTIVITY_KIND_KERNEL AS k')
NAMES = ("SELECT id FROM StringIds WHERE value LIKE '%Launch%' OR value LIKE '%emcpy%' OR value LIKE '%emset%'")
LAUNCHES = ('SELECT (((r.globalTid >> 24) & 4294967295) << 32) | (r.correlationId & 4294967295), r.globalTid, '
            'r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r WHERE r.nameId IN ({})')
import sqlite3
ids = ",".join(str(r[0]) for r in sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(NAMES))
queries = [(KERNELS, 6), (LAUNCHES.format(ids), 3)]
total = 0
if method == "sqlite3":
    import itertools
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    for sql, n in queries:
        cur = conn.execute(sql); parts = []
        while True:
            rows = cur.fetchmany(65536)
            if not rows:
                break
            parts.append(np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=len(rows) * n))
        total += sum(len(p) for p in parts) // n
elif method == "adbc":
    import adbc_driver_sqlite.dbapi as dbapi
    conn = dbapi.connect(f"file:{path}?mode=ro")
    for sql, n in queries:
        cur = conn.cursor()
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": "65536"})
        cur.execute(sql)
        cols = [[] for _ in range(n)]
        for batch in cur.fetch_record_batch():
            for i in range(n):
                cols[i].append(batch.column(i).to_numpy())
        total += sum(len(c) for c in cols[0])
elif method == "duckdb":
    import duckdb, duckdb_ext
    ext = [p + "/extensions" for p in duckdb_ext.__path__][0]
    conn = duckdb.connect(config={"extension_directory": ext, "autoinstall_known_extensions": False})
    conn.execute("LOAD sqlite")
    conn.execute(f"ATTACH '{path}' AS s (TYPE sqlite, READ_ONLY)")
    for sql, n in queries:
        res = conn.execute(sql.replace("FROM CUPTI", "FROM s.CUPTI").replace("FROM StringIds", "FROM s.StringIds")
                           ).fetchnumpy()
        total += len(next(iter(res.values())))
print(total)
"""

DUCKDB_PROBE = ("import duckdb, duckdb_ext; c = duckdb.connect(config={'extension_directory': "
                "[p + '/extensions' for p in duckdb_ext.__path__][0], 'autoinstall_known_extensions': False}); "
                "c.execute('LOAD sqlite')")

REPEATED = {  # table -> columns shifted in time / in correlationId
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "correlationId"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "correlationId"),
    "NVTX_EVENTS": ("start", "end", None),
}


def scale(src: Path, dst: Path, target_kernels: int) -> dict:
    shutil.copyfile(src, dst)
    conn = sqlite3.connect(dst)
    kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    t0, t1 = conn.execute("SELECT min(start), max(\"end\") FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    k1 = max(conn.execute("SELECT max(\"end\") FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0], t1)
    period = (k1 - t0) + 1_000_000
    corr_period = conn.execute("SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
    copies = max(1, round(target_kernels / max(kernels, 1)))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, (c_start, c_end, c_corr) in REPEATED.items():
        if table not in tables:
            continue
        cols = [r[1] for r in conn.execute(f"pragma table_info('{table}')")]
        base = f"{table}_base"
        conn.execute(f"CREATE TEMP TABLE {base} AS SELECT * FROM {table}")
        where = "WHERE eventType IN (59, 60)" if table == "NVTX_EVENTS" else ""
        if "eventId" in cols:  # newer exports: a primary key that must stay unique
            cols = [c for c in cols if c != "eventId"]
        for k in range(1, copies):
            exprs = []
            for c in cols:
                if c in (c_start, c_end):
                    exprs.append(f'"{c}" + {k * period}')
                elif c == c_corr:
                    exprs.append(f'"{c}" + {k * corr_period}')
                else:
                    exprs.append(f'"{c}"')
            conn.execute(f"INSERT INTO {table} ({', '.join(chr(34) + c + chr(34) for c in cols)}) "
                         f"SELECT {', '.join(exprs)} FROM {base} {where}")
        conn.execute(f"DROP TABLE {base}")
    conn.commit()
    counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in REPEATED if t in tables}
    conn.close()
    return {"copies": copies, "rows": counts}



# run one command; wall seconds, the largest RSS of one process and the sampled peak of the tree's summed RSS (MB)
RUNNER = r"""
import json, resource, subprocess, sys, time
import psutil
timeout, cmd = float(sys.argv[1]), sys.argv[2:]
t = time.perf_counter()
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
proc, tree_peak = psutil.Process(p.pid), 0
while p.poll() is None:
    try:
        rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
        tree_peak = max(tree_peak, rss)
    except psutil.Error:
        pass
    if time.perf_counter() - t > timeout:
        for c in proc.children(recursive=True):
            c.kill()
        p.kill()
        p.wait()
        print(json.dumps({"rc": "timeout", "wall": time.perf_counter() - t}))
        sys.exit(0)
    time.sleep(0.02)
err = p.stderr.read()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "wall": time.perf_counter() - t, "err": err[-400:] if p.returncode else "",
                  "cpu": usage.ru_utime + usage.ru_stime, "max_mb": usage.ru_maxrss / 1024.0,
                  "tree_mb": tree_peak / 2 ** 20}))
"""


def measure(cmd: list, env: dict, timeout: float) -> dict:
    """One run of cmd in a fresh Python parent (so that peaks never mix)."""
    # run from the file system's root: `python -m profattr` puts its working folder first on sys.path, so in a
    # checkout it would import that checkout's profattr and not the one PYTHONPATH names (the --before rows)
    out = subprocess.run([sys.executable, "-c", RUNNER, str(timeout)] + cmd, capture_output=True, text=True,
                         env=env, cwd=os.sep)
    try:
        r = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"rc": "error", "err": out.stderr[-400:]}
    return r


# where a cold budget's time goes: (stage, [(file suffix, function name)]), read from cProfile's cumulative times;
# stages may nest (the store build holds the fetch and the launch join), so they do not add up to the total
STAGES = [("fetch: SQLite to int64 blocks", [("trace/fetch.py", "adbc_blocks"), ("trace/fetch.py", "sqlite3_blocks")]),
          ("store build (holds the fetch, the launch join and the writes)", [("trace/store_build.py", "build")]),
          ("launch join", [("trace/store_build.py", "join")]),
          ("writing the op store (tofile)", [("~", "<method 'tofile' of 'numpy.ndarray' objects>")]),
          ("steps", [("attribute/steps.py", "find_steps")]),
          ("windowed pass (holds the stages below)", [("attribute/windows.py", "_pass")]),
          ("NVTX context of each op", [("attribute/context.py", "add")]),
          ("graph contexts (place_contexts)", [("attribute/graphs.py", "place_contexts")]),
          ("classification (names to categories)", [("attribute/accumulate.py", "ids")]),
          ("per-step sums and launch shapes (Accumulator.add)", [("attribute/accumulate.py", "add")]),
          ("  of which grouping rows (group_rows)", [("attribute/accumulate.py", "group_rows")]),
          ("  of which exclusive split", [("attribute/exclusive.py", "add")]),
          ("taxonomy rules (load_rules)", [("taxonomy/classify.py", "load_rules")]),
          ("assembling the budget", [("attribute/budget.py", "assemble")]),
          ("sorting (numpy sort, argsort, lexsort: tottime, every stage)", "sort"),
          ("imports", [("attribute/budget.py", "<module>")])]


def profile_cold(big: Path, work: Path, env: dict) -> list:
    """(stage, seconds) of one cold `profattr budget` under cProfile (in its own process, empty cache), plus the
    total."""
    import pstats

    out = work / "cold.prof"
    shutil.rmtree(work / "cache", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "profattr", "budget", str(big),
                    "--format", "json"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   cwd=os.sep)
    stats = pstats.Stats(str(out)).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    rows = [("total (under cProfile)", max(v[3] for v in stats.values()))]
    for label, keys in STAGES:
        if keys == "sort":
            t = sum(v[2] for (f, _, fn), v in stats.items() if f == "~" and "sort" in fn)
        else:
            t = sum(v[3] for (f, _, fn), v in stats.items() for suffix, name in keys
                    if fn == name and (f.endswith(suffix) or f == suffix))
        rows.append((label, t))
    shutil.rmtree(work / "cache", ignore_errors=True)
    out.unlink(missing_ok=True)
    return rows


def slope(xs, ys):
    """Least-squares slope of log(y) against log(x)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def machine() -> str:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        mem = float("nan")
    return f"{os.cpu_count()} CPU cores, {mem:.0f} GiB RAM, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def tools_for(big: Path, work: Path, args, cache: Path) -> list:
    """(name, command, environment changes, prepare) per tool, in run order."""
    py = sys.executable
    repo = str(Path(__file__).resolve().parent.parent)
    budget = [py, "-m", "profattr", "budget", str(big), "--format", "json"]
    diff = [py, "-m", "profattr", "diff", str(big), str(big), "--format", "json"]
    clear = lambda: shutil.rmtree(cache, ignore_errors=True)  # noqa: E731
    env = {"PROFATTR_CACHE": str(cache), "PYTHONPATH": repo}
    tools = [("sql aggregate scan (T)", [py, "-c", AGGREGATE, str(big)], {}, None),
             ("sql row scan", [py, "-c", SCAN, str(big)], {}, None),
             ("fetch: sqlite3", [py, "-c", FETCH, str(big), "sqlite3"], {}, None),
             ("fetch: adbc (Arrow)", [py, "-c", FETCH, str(big), "adbc"], {}, None)]
    if subprocess.run([py, "-c", DUCKDB_PROBE], capture_output=True).returncode == 0:
        tools.append(("fetch: duckdb sqlite_scan", [py, "-c", FETCH, str(big), "duckdb"], {}, None))
    # three captures of the same size (copies: distinct files, so three cache entries and three cold budgets)
    copies = [work / f"copy{i}-{big.name}" for i in (1, 2, 3)]
    report = [py, "-m", "profattr", "report", *map(str, copies), "--output", str(work / "report")]
    ledger = [py, "-m", "profattr", "ledger", "add", str(big), "--ledger", str(work / "ledger.db")]

    def three_copies():
        clear()
        shutil.rmtree(work / "report", ignore_errors=True)
        for c in copies:
            if not c.exists():
                shutil.copyfile(big, c)

    def fresh_ledger():
        clear()
        (work / "ledger.db").unlink(missing_ok=True)
    tools += [("profattr budget cold", budget, env, clear),
              ("profattr budget warm", budget, env, None),  # the result cache's hit
              ("profattr budget warm, op store only", budget, {**env, "PROFATTR_RESULT_CACHE": "0"}, None),
              ("profattr budget --no-cache", budget + ["--no-cache"], env, None),
              ("profattr diff self cold", diff, env, clear),
              ("profattr diff self warm", diff, env, None),
              ("profattr report 3 captures cold", report, env, three_copies),
              ("profattr ledger add cold", ledger, env, fresh_ledger)]
    if args.before:  # the same budgets with another checkout of profattr (the code before a change), same run
        before_cache = work / "cache-before"
        before_env = {"PROFATTR_CACHE": str(before_cache), "PYTHONPATH": str(Path(args.before).resolve())}
        clear_before = lambda: shutil.rmtree(before_cache, ignore_errors=True)  # noqa: E731

        def three_copies_before():
            three_copies()
            clear_before()

        def fresh_ledger_before():
            fresh_ledger()
            clear_before()
        tools += [("before: profattr budget cold", budget, before_env, clear_before),
                  ("before: profattr budget warm", budget, before_env, None),
                  ("before: profattr diff self cold", diff, before_env, clear_before),
                  ("before: profattr report 3 captures cold", report, before_env, three_copies_before),
                  ("before: profattr ledger add cold", ledger, before_env, fresh_ledger_before)]
    if args.nsys:
        for report in ("cuda_gpu_kern_sum", "nvtx_gpu_proj_sum"):
            tools.append((f"nsys {report}", [args.nsys, "stats", "-q", "--report", report, "--format", "csv",
                                             "--output", "-", str(big)], {}, None))
    nsys_ai = shutil.which("nsys-ai")
    if nsys_ai:
        folder = work / "nsys-ai"

        def link():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            os.link(big, folder / big.name)
        tools.append(("nsys-ai summary", [nsys_ai, "summary", str(folder / big.name)], {}, link))
    return tools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture")
    ap.add_argument("--sizes", default="0.3e6,3e6,30e6", help="kernel counts to scale the capture to")
    ap.add_argument("--workdir")
    ap.add_argument("--nsys", help="also time nsys's own stats reports (path to nsys)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool at sizes under 10M kernels; the fastest "
                                                          "is kept (one run above)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run before a tool counts as timed out")
    ap.add_argument("--before", help="also time budget cold and warm with the profattr of this checkout (the code "
                                     "before a change), in the same run")
    ap.add_argument("--markdown", help="also write the table into this file")
    ap.add_argument("--keep", action="store_true", help="keep the scaled captures")
    ap.add_argument("--only", help="run only the tools whose name matches this regular expression (and T)")
    ap.add_argument("--profile", action="store_true", help="also profile one cold budget per size (cProfile, in "
                                                           "process) and print where its time goes, by stage")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="profattr-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(float(x)) for x in args.sizes.split(",")]
    all_results, rows_of, profiles = {}, {}, {}
    for size in sizes:
        big = work / f"scaled-{size}.sqlite"
        t = time.perf_counter()
        try:
            info = scale(Path(args.capture), big, size)
        except (sqlite3.Error, OSError) as exc:
            print(f"{size:,} kernels: could not scale ({exc}); stopping at the sizes measured")
            big.unlink(missing_ok=True)
            break
        rows_of[size] = info["rows"]
        print(f"scaled x{info['copies']} in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{k.replace('CUPTI_ACTIVITY_KIND_', '')}={v:,}" for k, v in info["rows"].items()),
              flush=True)
        cache = work / "cache"
        results = {}
        repeat = args.repeat if size < 10_000_000 else 1
        for name, cmd, env_add, prepare in tools_for(big, work, args, cache):
            if args.only and name != "sql aggregate scan (T)" and not re.search(args.only, name):
                continue
            runs = []
            for _ in range(repeat):
                if prepare:
                    prepare()
                runs.append(measure(cmd, dict(os.environ, **env_add), args.timeout))
                if runs[-1].get("rc") != 0:
                    break
            ok = [r for r in runs if r.get("rc") == 0]
            results[name] = ({"wall_s": min(r["wall"] for r in ok), "cpu_s": min(r["cpu"] for r in ok),
                              "max_mb": max(r["max_mb"] for r in ok),
                              "tree_mb": max(r["tree_mb"] for r in ok)} if ok else
                             {"failed": str(runs[-1].get("rc")), "err": runs[-1].get("err", "")})
            print(f"  {size:>11,} {name:<30} {json.dumps(results[name])}", flush=True)
        all_results[size] = results
        if args.profile:
            profiles[size] = profile_cold(big, work, dict(os.environ, PROFATTR_CACHE=str(work / "cache"),
                                                          PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
            for label, t in profiles[size]:
                print(f"  {size:>11,} profile {label:<60} {t:.2f} s", flush=True)
        shutil.rmtree(work / "cache", ignore_errors=True)
        shutil.rmtree(work / "cache-before", ignore_errors=True)
        shutil.rmtree(work / "nsys-ai", ignore_errors=True)
        shutil.rmtree(work / "report", ignore_errors=True)
        (work / "ledger.db").unlink(missing_ok=True)
        for copy in work.glob(f"copy?-{big.name}"):
            copy.unlink()
        if not args.keep:
            big.unlink(missing_ok=True)
    text = render(all_results, rows_of, Path(args.capture).name, sizes, profiles)
    print(text)
    print(json.dumps({"rows": {str(k): v for k, v in rows_of.items()},
                      "results": {str(k): v for k, v in all_results.items()}}))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


def render(all_results: dict, rows_of: dict, source: str, requested: list, profiles: dict | None = None) -> str:
    lines = [f"# profattr at scale: {date.today().isoformat()}", "",
             f"Machine: {machine()}. Source capture: `{source}` (SGLang decode on an H200, CUDA graphs), scaled in "
             "SQL to each size. Every number is a ratio to T, SQLite's aggregate scan of the columns the budget uses "
             "(count, sum and max per column, in SQLite's C code) on the same file in the same run "
             "(`x T`); `cpu s` is the user + system CPU time of the tool's processes (steadier than wall time on a "
             "shared machine), `max MB` the largest RSS of one process, `tree MB` the sampled peak of the summed RSS of "
             "all its processes.", ""]
    measured = list(all_results)
    missing = [s for s in requested if s not in all_results]
    for size, results in all_results.items():
        base = results.get("sql aggregate scan (T)", {})
        lines += [f"## {size:,} kernels requested: " + ", ".join(f"{k.replace('CUPTI_ACTIVITY_KIND_', '')} "
                                                              f"{v:,}" for k, v in rows_of[size].items()), "",
                  "| tool | wall s | x T | cpu s | x T | max MB | x T | tree MB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in results.items():
            if "failed" in r:
                lines.append(f"| {name} | {r['failed']} | | | | | | |")
                continue
            lines.append(f"| {name} | {r['wall_s']:.2f} | {r['wall_s'] / base['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                         f"{r['cpu_s'] / base['cpu_s']:.2f} | {r['max_mb']:.0f} | "
                         f"{r['max_mb'] / base['max_mb']:.2f} | {r['tree_mb']:.0f} |")
        lines.append("")
    if len(measured) >= 2:
        lines += [f"## Growth exponents (log-log slope over {', '.join(f'{s:,}' for s in measured)} kernels)", "",
                  "| tool | time | max memory |", "|---|---:|---:|"]
        names = list(all_results[measured[-1]])
        for name in names:
            ok = [s for s in measured if "wall_s" in all_results[s].get(name, {})]
            ts = slope(ok, [all_results[s][name]["wall_s"] for s in ok])
            ms = slope(ok, [all_results[s][name]["max_mb"] for s in ok])
            lines.append(f"| {name} | {'' if ts is None else f'{ts:.2f}'} | {'' if ms is None else f'{ms:.2f}'} |")
        lines.append("")
    if profiles:
        sizes = list(profiles)
        lines += ["## Where a cold budget's time goes (cProfile, cumulative seconds; stages nest)", "",
                  "| stage | " + " | ".join(f"{s:,} kernels" for s in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for i, (label, _) in enumerate(profiles[sizes[0]]):
            lines.append(f"| {label} | " + " | ".join(f"{profiles[s][i][1]:.2f}" for s in sizes) + " |")
        lines.append("")
    if missing:
        lines.append("Not measured here: " + ", ".join(f"{s:,}" for s in missing) + " kernels (see above).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
