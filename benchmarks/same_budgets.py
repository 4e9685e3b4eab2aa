"""`profattr budget --format json` of every committed capture, dumped to a folder and compared with an earlier dump:
the check that a change meant to make budget faster changed none of its results.

    python benchmarks/same_budgets.py dump DIR [--captures examples/h200]    # one CAPTURE.json per capture
    python benchmarks/same_budgets.py compare BEFORE AFTER                   # byte for byte; exit 1 on a difference

Each budget runs in its own process with --no-cache (so the op store is built from the export every time, the cold
path) and with the profattr of this checkout. A capture whose budget fails is recorded with its exit status and
stderr, so a failure that is the same before and after compares equal too.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def captures(root: Path) -> list:
    """The captures under root: a .sqlite where there is one, else the .nsys-rep (never both of one capture)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.suffix in (".sqlite", ".nsys-rep") and path.is_file():
            stem = path.with_suffix("")
            if path.suffix == ".sqlite" or stem not in found:
                found[stem] = path
    return [found[k] for k in sorted(found)]


def dump(out: Path, root: Path, extra: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for path in captures(root):
        # named by the capture, not its suffix: a .nsys-rep is read through the .sqlite exported beside it, so the
        # two dumps compare the same capture whichever of the two the folder held when each was made
        name = str(path.relative_to(root).with_suffix("")).replace(os.sep, "__") + ".json"
        run = subprocess.run([sys.executable, "-m", "profattr", "budget", str(path), "--format", "json",
                              "--no-cache"] + extra, capture_output=True, env=env,
                             cwd=os.sep)  # not a checkout's folder: `-m` would import its profattr, not REPO's
        body = run.stdout if run.returncode == 0 else f"exit {run.returncode}\n".encode() + run.stderr
        (out / name).write_bytes(body)
        print(f"{name}: exit {run.returncode}, {len(run.stdout):,} bytes", flush=True)


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    bad = 0
    for name in names:
        a, b = before / name, after / name
        same = a.exists() and b.exists() and a.read_bytes() == b.read_bytes()
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'}  {name}")
    print(f"{len(names) - bad} of {len(names)} identical")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--captures", default=str(REPO / "examples" / "h200"))
    d.add_argument("budget_args", nargs="*", help="extra budget options (after --)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(Path(args.out), Path(args.captures), args.budget_args)
    else:
        sys.exit(compare(Path(args.before), Path(args.after)))


if __name__ == "__main__":
    main()
