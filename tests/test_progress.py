"""The progress line of long work: on stderr only when stderr is a terminal (a pty here), cleared when done, and
never in stdout; with stderr a pipe, nothing of it at all. PROFATTR_PROGRESS_AFTER=0 shows it at once (no timing
in the test: the line is asserted by its content, not by how long anything took)."""
from __future__ import annotations

import os
import pty
import subprocess
import sys

from conftest import EXAMPLES, ROOT

CAPTURE = EXAMPLES / "sglang-triton-bs1.sqlite"


def _budget(tmp_path, stderr_tty: bool, **env_add):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PROFATTR_CACHE=str(tmp_path / "cache"), PROFATTR_PROGRESS_AFTER="0",
               **env_add)
    cmd = [sys.executable, "-m", "profattr", "budget", str(CAPTURE), "--format", "json", "--no-cache"]
    if not stderr_tty:
        run = subprocess.run(cmd, capture_output=True, env=env)
        return run.returncode, run.stdout, run.stderr
    parent, child = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=child, env=env)
        os.close(child)
        err = b""
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            err += chunk
        out = proc.stdout.read()
        proc.wait()
        return proc.returncode, out, err
    finally:
        os.close(parent)


def test_progress_on_a_terminal_is_on_stderr_and_cleared(tmp_path):
    rc, out, err = _budget(tmp_path, stderr_tty=True)
    assert rc == 0
    assert b"reading sglang-triton-bs1.sqlite" in err
    assert err.endswith(b"\r\x1b[K"), err[-80:]  # the last thing written clears the line
    assert b"\r" not in out and b"\x1b" not in out and b"reading " not in out
    rc2, out2, err2 = _budget(tmp_path, stderr_tty=False)
    assert rc2 == 0 and out2 == out  # the JSON is the same, byte for byte, with or without the progress line
    assert b"\r" not in err2 and b"\x1b" not in err2 and b"reading " not in err2


def test_progress_can_be_turned_off_on_a_terminal(tmp_path):
    rc, out, err = _budget(tmp_path, stderr_tty=True, PROFATTR_PROGRESS="0")
    assert rc == 0 and out.startswith(b"{")
    assert b"reading " not in err and b"\x1b" not in err
