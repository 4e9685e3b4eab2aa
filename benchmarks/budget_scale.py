"""Speed and memory of `profattr budget` (and `diff`) on a large capture, as ratios to a plain SQL scan.

    python benchmarks/budget_scale.py CAPTURE.sqlite [--kernels 3000000] [--workdir DIR] [--nsys PATH]

1. Scale a real capture: repeat its GPU activity, launch calls and NVTX ranges shifted in time (and in
   correlationId, keeping every kernel linked to its launch and NVTX nesting valid) until it holds about
   `--kernels` kernel rows. Done in SQL (INSERT ... SELECT), so scaling itself is fast.
2. In separate processes (clean peak-memory readings), time:
   - baseline: a plain SQL scan fetching the columns the budget needs (kernels + runtime calls) into Python;
   - the same scan aggregated inside SQLite (no rows cross into Python), the floor of any SQLite reader;
   - `profattr budget --format json`;
   - `profattr diff` of the file against itself;
   - optionally nsys's own `cuda_gpu_kern_sum` and `nvtx_gpu_proj_sum` reports (with --nsys).
3. Print wall time and peak RSS, each as a ratio to the baseline measured in the same run (machines are noisy;
   absolute seconds mean little).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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

# the same columns scanned inside SQLite only (no rows cross into Python): the floor of any SQLite-based reader
SCAN_IN_SQLITE = r"""
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(conn.execute('SELECT count(*), total(start), total("end"), total(deviceId), total(correlationId), '
                   'total(globalPid), total(shortName), total(demangledName) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone())
print(conn.execute('SELECT count(*), total(correlationId), total(globalTid), total(start), total("end"), '
                   'total(nameId) FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchone())
"""

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


def peak_of(cmd: list) -> tuple:
    """Wall seconds and peak RSS (MB) of cmd, measured by a fresh Python parent so that peaks never mix."""
    wrapper = [sys.executable, "-c",
               "import resource,subprocess,sys,time;t=time.perf_counter();"
               "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,text=True);"
               "w=time.perf_counter()-t;"
               "print(r.returncode, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
               "sys.stderr.write(r.stderr[-400:] if r.returncode else '')"] + cmd
    out = subprocess.run(wrapper, capture_output=True, text=True)
    rc, wall, kb = out.stdout.split()
    if int(rc) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return float(wall), int(kb) / 1024.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("capture")
    ap.add_argument("--kernels", type=int, default=3_000_000)
    ap.add_argument("--workdir")
    ap.add_argument("--nsys", help="also time nsys's own stats reports (path to nsys)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool; the fastest is kept")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="profattr-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    big = work / "scaled.sqlite"
    t = time.perf_counter()
    info = scale(Path(args.capture), big, args.kernels)
    print(f"scaled {args.capture} x{info['copies']} in {time.perf_counter() - t:.1f} s: "
          + ", ".join(f"{k.replace('CUPTI_ACTIVITY_KIND_', '')}={v:,}" for k, v in info["rows"].items()))
    py = sys.executable
    tools = {
        "sql scan (baseline)": [py, "-c", SCAN, str(big)],
        "sql scan inside SQLite": [py, "-c", SCAN_IN_SQLITE, str(big)],
        "profattr budget": [py, "-m", "profattr", "budget", str(big), "--format", "json"],
        "profattr diff (self)": [py, "-m", "profattr", "diff", str(big), str(big), "--format", "json"],
    }
    if args.nsys:
        tools["nsys stats cuda_gpu_kern_sum"] = [args.nsys, "stats", "-q", "--report", "cuda_gpu_kern_sum",
                                                 "--format", "csv", "--output", "-", str(big)]
        tools["nsys stats nvtx_gpu_proj_sum"] = [args.nsys, "stats", "-q", "--report", "nvtx_gpu_proj_sum",
                                                 "--format", "csv", "--output", "-", str(big)]
    results = {}
    for name, cmd in tools.items():
        runs = [peak_of(cmd) for _ in range(args.repeat)]
        results[name] = (min(r[0] for r in runs), max(r[1] for r in runs))
    base_wall, base_mb = results["sql scan (baseline)"]
    print(f"{'tool':<32}{'wall s':>9}{'x scan':>9}{'peak MB':>10}{'x scan':>9}")
    for name, (wall, mb) in results.items():
        print(f"{name:<32}{wall:>9.2f}{wall / base_wall:>9.2f}{mb:>10.0f}{mb / base_mb:>9.2f}")
    print(json.dumps({"rows": info["rows"], "results": {k: {"wall_s": w, "peak_mb": m, "wall_ratio": w / base_wall,
                                                             "peak_ratio": m / base_mb}
                                                         for k, (w, m) in results.items()}}))


if __name__ == "__main__":
    main()
