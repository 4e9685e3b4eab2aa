"""A progress line on stderr for long work (an nsys export, a cold op-store build, the bootstrap, each capture of a
report): shown only when stderr is a terminal and the work has run longer than about two seconds, redrawn in place
with the seconds elapsed, and cleared when the work ends. Nothing of it ever reaches stdout, a pipe or a file, so
JSON and text outputs are the same with or without it. `PROFATTR_PROGRESS=0` turns it off;
`PROFATTR_PROGRESS_AFTER` (seconds) changes the delay.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

DEFAULT_AFTER_S = 2.0
REDRAW_S = 0.25
FRAMES = "|/-\\"
_lock = threading.Lock()
_depth = [0]  # only the outermost stage draws: an inner one would fight it for the line


def _after_fork_in_child() -> None:
    """A forked worker starts with a lock of its own and no stage open: the parent's drawing thread is not there to
    release the lock it may have held when the worker was forked."""
    global _lock
    _lock = threading.Lock()
    _depth[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_s() -> float:
    try:
        return max(0.0, float(os.environ.get("PROFATTR_PROGRESS_AFTER", DEFAULT_AFTER_S)))
    except ValueError:
        return DEFAULT_AFTER_S


def enabled(stream=None) -> bool:
    stream = stream or sys.stderr
    if os.environ.get("PROFATTR_PROGRESS", "1").strip().lower() in ("0", "no", "off", "false"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


@contextmanager
def stage(label: str):
    """Run the body; while it runs past the delay on a terminal, draw `label` and the seconds elapsed on stderr."""
    stream = sys.stderr
    with _lock:
        _depth[0] += 1
        outer = _depth[0] == 1
    if not outer or not enabled(stream):
        try:
            yield
        finally:
            with _lock:
                _depth[0] -= 1
        return
    done = threading.Event()
    drawn = [False]
    t0 = time.monotonic()
    text = "".join(ch for ch in str(label) if ch.isprintable())[:60]

    def draw():
        if done.wait(_after_s()):
            return
        i = 0
        while not done.is_set():
            with _lock:
                if done.is_set():
                    break
                stream.write(f"\r{FRAMES[i % len(FRAMES)]} {text} {time.monotonic() - t0:.0f} s\033[K")
                stream.flush()
                drawn[0] = True
            i += 1
            done.wait(REDRAW_S)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with _lock:
            done.set()
            if drawn[0]:
                stream.write("\r\033[K")
                stream.flush()
            _depth[0] -= 1
        thread.join(timeout=1.0)
