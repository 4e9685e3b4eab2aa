"""Speed and memory of reading a large torch-profiler trace, as ratios to a plain `json.load` of the same file.

    python benchmarks/trace_stream.py TRACE.json.gz [--events 2000000] [--workdir DIR]

1. Scale a real trace: repeat its events (shifted in time, correlation ids offset so every kernel keeps its launch)
   until it holds about `--events` events; write it as gzip JSON.
2. In separate processes (clean peak-memory readings), time:
   - baseline: `json.load` of the file (the whole document in memory, nothing computed);
   - profattr's reader (streamed: one event at a time into typed columns), then its ops arrays;
   - `profattr budget --format json` on the file.
3. Print wall time and peak RSS of each, as ratios to the baseline measured in the same run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOAD = r"""
import gzip, json, sys
with gzip.open(sys.argv[1], "rt") as fh:
    doc = json.load(fh)
print(len(doc["traceEvents"]))
"""
READ = r"""
import sys
sys.path.insert(0, sys.argv[2])
from profattr.trace.kineto import KinetoTrace
t = KinetoTrace(sys.argv[1])
print(len(t.ops().start))
"""


def scale(src: Path, out: Path, events: int) -> int:
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    base = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in base) - min(e["ts"] for e in base) + 1000.0
    copies = max(1, events // len(base))
    written = 0
    with gzip.open(out, "wt", compresslevel=1) as fh:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        first = True
        for c in range(copies):
            for e in base:
                e2 = dict(e, ts=e["ts"] + c * span)
                args = e.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = dict(args, correlation=args["correlation"] + c * 10_000_000)
                fh.write(("" if first else ",") + json.dumps(e2))
                first = False
                written += 1
        fh.write("]}")
    return written


PEAK = "\nimport resource, sys; print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"


def measure(code: str, *args) -> tuple:
    """(wall seconds, peak RSS MB) of a child process (the child reports its own peak)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + PEAK, *map(str, args)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    peak_kb = int(proc.stderr.rsplit("PEAK_KB", 1)[1].split()[0])
    return wall, peak_kb / 1024.0


def measure_cli(*args) -> tuple:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.argv = ['profattr'] + sys.argv[2:]\n"
            "from profattr.cli import cli\ntry:\n    cli.main(args=sys.argv[1:], standalone_mode=False)\n"
            "except SystemExit:\n    pass")
    return measure(code, ROOT, *args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--workdir", type=Path)
    o = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=o.workdir) as tmp:
        big = Path(tmp) / "scaled.trace.json.gz"
        n = scale(o.trace, big, o.events)
        print(f"scaled trace: {n:,} events, {big.stat().st_size / 1e6:.0f} MB gzip")
        rows = [("json.load (baseline)", measure(LOAD, big)), ("profattr reader + ops", measure(READ, big, ROOT)),
                ("profattr budget", measure_cli("budget", str(big), "--format", "json", "--steps", "whole"))]
    base_t, base_m = rows[0][1]
    print(f"{'what':<24}{'wall s':>9}{'x load':>9}{'peak MB':>10}{'x load':>9}")
    for name, (t, m) in rows:
        print(f"{name:<24}{t:>9.2f}{t / base_t:>9.2f}{m:>10.0f}{m / base_m:>9.2f}")


if __name__ == "__main__":
    main()
