"""Stopping a profiled program cleanly, without ever killing nsys while it writes its report.

`nsys profile` starts the target through `nsys-launcher` in a new session, so the target (and every process it
forks: SGLang's schedulers, torchrun's ranks) lives in process groups apart from nsys's own. Signals go to those
groups; nsys is left to notice that its target ended and to finish writing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int):
    """(ppid, pgid, state) of a live process, or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its closing parenthesis
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), fields[0]


def _all_pids() -> list:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()] if PROC.is_dir() else []


def descendants(pid: int) -> list:
    """Live (non-zombie) descendants of `pid`, from /proc; empty where /proc is absent."""
    children: dict = {}
    for p in _all_pids():
        st = _stat(p)
        if st and st[2] != "Z":
            children.setdefault(st[0], []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def target_groups(launcher_pid: int) -> list:
    """Process groups of everything `launcher_pid` (nsys) started, except nsys's own group."""
    own = _stat(launcher_pid)
    own_group = own[1] if own else None
    groups = []
    for p in descendants(launcher_pid):
        st = _stat(p)
        if st and st[1] != own_group and st[1] not in groups:
            groups.append(st[1])
    return groups


def group_alive(pgid: int) -> bool:
    for p in _all_pids():
        st = _stat(p)
        if st and st[1] == pgid and st[2] != "Z":
            return True
    return False


def _wait(predicate, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def stop_target(launcher: subprocess.Popen, sigint_s: float = 60, sigterm_s: float = 20, sigkill_s: float = 10,
                target_is_launcher: bool = False) -> str:
    """Stop what `launcher` (nsys) runs: SIGINT, then SIGTERM, then SIGKILL to the target's process groups,
    each after the previous one had its time. Returns how it ended ("already exited", "SIGINT", "SIGTERM",
    "SIGKILL" or "still running"). nsys itself gets no signal where /proc shows the tree; elsewhere it gets the
    SIGINT (it forwards it to its target). `target_is_launcher`: no nsys in between (the torch profiler), so the
    launcher's own process group is the target's."""
    if launcher.poll() is not None:
        return "already exited"
    if target_is_launcher:
        for sig, wait_s in ((signal.SIGINT, sigint_s), (signal.SIGTERM, sigterm_s), (signal.SIGKILL, sigkill_s)):
            try:
                os.killpg(launcher.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            if _wait(lambda: launcher.poll() is not None and not group_alive(launcher.pid), wait_s):
                return sig.name
        return "still running"
    groups = target_groups(launcher.pid)
    if not groups and not PROC.is_dir():
        launcher.send_signal(signal.SIGINT)
        return "SIGINT" if _wait(lambda: launcher.poll() is not None, sigint_s) else "still running"
    if not groups:
        children = [c for c in descendants(launcher.pid) if (_stat(c) or (0,))[0] == launcher.pid]
        if not children:
            return "already exited"
        # a profiler that keeps its target in its own process group (ncu): signal the target's process itself
        for sig, wait_s in ((signal.SIGINT, sigint_s), (signal.SIGTERM, sigterm_s), (signal.SIGKILL, sigkill_s)):
            for c in children:
                try:
                    os.kill(c, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            if _wait(lambda: not any(_stat(c) and _stat(c)[2] != "Z" for c in children), wait_s):
                return sig.name
        return "still running"
    for sig, wait_s in ((signal.SIGINT, sigint_s), (signal.SIGTERM, sigterm_s), (signal.SIGKILL, sigkill_s)):
        # look again: a process that left the target's group (setsid) would keep nsys waiting for it
        groups += [g for g in target_groups(launcher.pid) if g not in groups]
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if _wait(lambda: not any(group_alive(g) for g in groups) and not target_groups(launcher.pid), wait_s):
            return sig.name
    return "still running"


def wait_exit(proc: subprocess.Popen, timeout_s: float, on_tick=None, tick_s: float = 60) -> bool:
    """Wait for `proc` to exit (True) or `timeout_s` to pass (False), calling `on_tick(elapsed_s)` every `tick_s`."""
    start = time.monotonic()
    next_tick = tick_s
    while proc.poll() is None:
        elapsed = time.monotonic() - start
        if elapsed >= timeout_s:
            return False
        if on_tick and elapsed >= next_tick:
            on_tick(elapsed)
            next_tick += tick_s
        time.sleep(0.2)
    return True


def log_tail(path, lines: int = 20) -> list:
    """The last `lines` non-empty lines of a log, each as a terminal would show it: a progress bar redrawn with
    carriage returns (nsys's "Processing N events: [...]") is its last drawing, one line, so it cannot push the lines
    a dying server wrote before it out of the tail."""
    try:
        data = Path(path).read_bytes()[-64 * 1024:]
    except OSError:
        return []
    out = []
    for line in data.decode(errors="replace").split("\n"):
        shown = [part for part in line.split("\r") if part.strip()]
        if shown:
            out.append(shown[-1].rstrip())
    return out[-lines:]
