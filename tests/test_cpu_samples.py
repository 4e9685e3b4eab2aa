"""CPU samples of the step's thread inside the GPU's idle gaps (report/host_gaps.py sample_summary, read by
trace/nsys_samples.py): a real nsys CPU capture made here (a Python program that marks its busy phases with NVTX
ranges, standing in for idle gaps, since it launches no GPU work), a synthetic capture with kernels whose gaps hold
samples, edge cases by hand, and a committed capture without samples. Expected numbers come from SQL and plain
Python written here.
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import EXAMPLES, require_nsys
from profattr.attribute.budget import compute_budget
from profattr.report import host_gaps, md_runtime
from profattr.report.launches import launch_stats
from profattr.trace.source import open_trace
from synth import Builder, gpid, gtid

PROGRAM = textwrap.dedent("""
    import time
    import nvtx

    def spin_in_gap(seconds):
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:
            n += sum(i * i for i in range(200))
        return n

    for _ in range(4):
        with nvtx.annotate("gap"):
            spin_in_gap(0.15)
        time.sleep(0.05)
""")
# the program's "gap" ranges: thread, start, end
GAPS = """SELECT n.globalTid, n.start, n."end" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
          WHERE n.eventType = 59 AND COALESCE(n.text, s.value) = 'gap' ORDER BY n.start"""
# samples inside the gap ranges of their own thread, by leaf frame (symbol, module)
LEAVES_IN_GAPS = f"""
WITH gaps(tid, s, e) AS ({GAPS})
SELECT sym.value, mod.value, count(*) FROM COMPOSITE_EVENTS ev
JOIN gaps g ON g.tid = ev.globalTid AND ev.start >= g.s AND ev.start < g.e
JOIN SAMPLING_CALLCHAINS c ON c.id = ev.id AND c.stackDepth = 0
JOIN StringIds sym ON sym.id = c.symbol JOIN StringIds mod ON mod.id = c.module
GROUP BY sym.value, mod.value"""


def _ro(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """A real CPU capture with nsys CPU and Python sampling, exported to SQLite."""
    nsys = require_nsys("make a CPU-sampled capture")
    out = tmp_path_factory.mktemp("samples")
    (out / "prog.py").write_text(PROGRAM)
    subprocess.run([nsys, "profile", "--trace=nvtx", "--sample=process-tree", "--python-sampling=true",
                    "--cpuctxsw=none", "--force-overwrite", "true", "-o", str(out / "s"), sys.executable,
                    str(out / "prog.py")], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=out)
    subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out / "s.sqlite"),
                    str(out / "s.nsys-rep")], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out / "s.sqlite"


@pytest.mark.nsys
def test_real_samples_read_as_recorded(sampled):
    conn = _ro(sampled)
    rows = conn.execute("""SELECT ev.globalTid, ev.start, COALESCE(c.symbol, -1), COALESCE(c.module, -1)
                           FROM COMPOSITE_EVENTS ev LEFT JOIN SAMPLING_CALLCHAINS c
                           ON c.id = ev.id AND c.stackDepth = 0 WHERE ev.globalTid IS NOT NULL
                           ORDER BY ev.id""").fetchall()
    # nsys 2024.2.3 keeps --python-sampling backtraces as NVTX marks (eventType 34) whose frames the SQLite export
    # leaves out: the call chains hold native frames only
    marks = conn.execute("SELECT count(*), count(text) FROM NVTX_EVENTS WHERE eventType = 34").fetchone()
    conn.close()
    with open_trace(sampled) as source:
        got = source.cpu_samples()
    assert len(rows) > 50
    assert got["tid"].tolist() == [r[0] for r in rows] and got["start"].tolist() == [r[1] for r in rows]
    assert got["leaf_symbol"].tolist() == [r[2] for r in rows]
    assert got["leaf_module"].tolist() == [r[3] for r in rows]
    if marks[0]:
        assert marks[1] == 0
    assert (got["py_symbol"] == -1).all() and (got["py_module"] == -1).all()


@pytest.mark.nsys
def test_real_samples_in_gaps_match_sql(sampled):
    conn = _ro(sampled)
    gaps = conn.execute(GAPS).fetchall()
    leaves = conn.execute(LEAVES_IN_GAPS).fetchall()
    period = conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'LINUX_PERF_OPTIONS:SAMPLING_PERIOD'"
                          ).fetchone()
    conn.close()
    assert len(gaps) == 4
    gs = np.array([g[1] for g in gaps], dtype=np.int64)
    ge = np.array([g[2] for g in gaps], dtype=np.int64)
    gap_tid = np.array([g[0] for g in gaps], dtype=np.int64)
    with open_trace(sampled) as source:
        samples = source.cpu_samples()
        ids = np.unique(np.concatenate([samples["leaf_symbol"], samples["leaf_module"]]))
        names = source.strings(ids[ids >= 0])
        period_ns = source.sampling_period_ns()
    assert period_ns == float(period[0])
    summary = host_gaps.sample_summary(gs, ge, gap_tid, samples, names, n_steps=4, period_ns=period_ns)
    idle = sum(e - s for _, s, e in gaps)
    total = sum(n for _, _, n in leaves)
    assert total > 20  # the thread spins through every gap: about one sample per period
    assert summary["samples_per_step"] == pytest.approx(total / 4)
    assert summary["share_of_idle"] == pytest.approx(total * float(period[0]) / idle)
    assert 0 < summary["share_of_idle"] < 1.5  # nsys may lose some samples (it says so in its diagnostics)
    expected = {(sym, os.path.basename(mod)): n for sym, mod, n in leaves}
    top = sorted(expected.values(), reverse=True)[:host_gaps.TOP]
    assert [f["samples_per_step"] * 4 for f in summary["functions"]] == pytest.approx(top)
    for f in summary["functions"]:
        assert expected[(f["function"], f["module"])] == pytest.approx(f["samples_per_step"] * 4)
        assert f["share_of_idle"] == pytest.approx(f["samples_per_step"] * 4 * float(period[0]) / idle)
        assert f["python"] is None


@pytest.mark.nsys
def test_innermost_python_frame_of_a_call_chain(sampled, tmp_path):
    """Python frames in a call chain (a module that is a .py file, or a perf-map name 'py::function:file'): the one
    nearest the leaf is the sample's Python function. Added to a copy of the real export, as a sampler that
    records them would."""
    copy = tmp_path / "py.sqlite"
    shutil.copyfile(sampled, copy)
    conn = sqlite3.connect(copy)
    top = conn.execute("SELECT max(id) FROM StringIds").fetchone()[0]
    strings = {"decode_step": top + 1, "/srv/model.py": top + 2, "py::forward:/srv/layers.py": top + 3,
               "[anon]": top + 4}
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in strings.items()])
    ids = [r[0] for r in conn.execute("SELECT id FROM COMPOSITE_EVENTS WHERE globalTid IS NOT NULL ORDER BY id")]
    outer, inner = ids[::3], ids[::6]  # every third sample: decode_step; every sixth also forward, nearer the leaf
    conn.executemany("INSERT INTO SAMPLING_CALLCHAINS (id, symbol, module, stackDepth) VALUES (?, ?, ?, 200)",
                     [(i, strings["decode_step"], strings["/srv/model.py"]) for i in outer])
    conn.executemany("INSERT INTO SAMPLING_CALLCHAINS (id, symbol, module, stackDepth) VALUES (?, ?, ?, 150)",
                     [(i, strings["py::forward:/srv/layers.py"], strings["[anon]"]) for i in inner])
    conn.commit()
    conn.close()
    with open_trace(copy) as source:
        got = source.cpu_samples()
    expected = {i: strings["py::forward:/srv/layers.py"] if i in set(inner) else strings["decode_step"]
                for i in outer}
    want = np.array([expected.get(i, -1) for i in ids])
    assert got["py_symbol"].tolist() == want.tolist()
    names = {v: k for k, v in strings.items()}
    summary = host_gaps.sample_summary(np.array([0]), np.array([2 ** 62]), np.array([got["tid"][0]]),
                                       {k: v[want >= 0] for k, v in got.items()}, names, 1, period_ns=1.0)
    labels = {f["python"] for f in summary["functions"]}
    assert labels <= {"forward (layers.py)", "decode_step (model.py)"} and labels


def test_sample_summary_edges():
    """A sample at a gap's start counts, one at its end does not, nor one of another thread; the period is
    estimated from a thread's sample spacing when the capture gives none; names are cleaned of control
    characters."""
    gs, ge, gap_tid = np.array([100, 300]), np.array([200, 400]), np.array([7, 8])
    samples = {"tid": np.array([7, 7, 7, 8, 7, 8, 8]), "start": np.array([100, 150, 200, 150, 310, 330, 350]),
               "leaf_symbol": np.array([1, 1, 2, 1, 2, 3, 3]), "leaf_module": np.array([9, 9, 9, 9, 9, 9, 9]),
               "py_symbol": np.array([-1, -1, -1, -1, -1, 4, -1]), "py_module": np.array([-1] * 7)}
    names = {1: "spin", 2: "other", 3: "cuda\x07Launch", 4: "py::step:/a/b.py", 9: "/usr/lib/libpython3.so"}
    out = host_gaps.sample_summary(gs, ge, gap_tid, samples, names, n_steps=2)
    # inside: (7,100) spin, (7,150) spin, (8,330) cuda+py step, (8,350) cuda; not (7,200) at the end, not (8,150)
    # on thread 8 in thread 7's gap, not (7,310) in thread 8's gap
    assert out["samples_per_step"] == 2.0
    # the median spacing of consecutive samples per thread: 7: 50, 50, 110; 8: 180, 20
    assert out["period_ms"] == pytest.approx(50 / 1e6)
    assert out["share_of_idle"] == pytest.approx(4 * 50 / 200)
    got = {(f["function"], f["module"], f["python"]): f["samples_per_step"] for f in out["functions"]}
    assert got == {("spin", "libpython3.so", None): 1.0, ("cuda Launch", "libpython3.so", "step (b.py)"): 0.5,
                   ("cuda Launch", "libpython3.so", None): 0.5}
    assert host_gaps.sample_summary(gs, ge, gap_tid, None, names, 2) is None
    none_inside = host_gaps.sample_summary(gs[:0], ge[:0], gap_tid[:0], samples, names, 2)
    assert none_inside["samples_per_step"] == 0 and none_inside["functions"] == []


SAMPLE_DDL = ["""CREATE TABLE COMPOSITE_EVENTS (id INTEGER NOT NULL PRIMARY KEY, start INTEGER NOT NULL, cpu INTEGER,
                 threadState INTEGER, globalTid INTEGER, cpuCycles INTEGER NOT NULL)""",
              """CREATE TABLE SAMPLING_CALLCHAINS (id INTEGER NOT NULL, symbol INTEGER NOT NULL,
                 module INTEGER NOT NULL, kernelMode INTEGER, thumbCode INTEGER, unresolved INTEGER,
                 specialEntry INTEGER, originalIP INTEGER, unwindMethod INTEGER, stackDepth INTEGER NOT NULL,
                 PRIMARY KEY (id, stackDepth))"""]


def sampled_steps(path, steps: int, kernels: int, samples_until: int):
    """A synthetic capture (its Builder, still open): `steps` NVTX steps 10 µs apart on thread T, each with
    `kernels` kernels of 100 ns, 100 ns apart (a 100 ns gap between two); samples of T and of another thread U every
    10 ns, from 50 ns into the step's first kernel to `samples_until` ns after it began."""
    b = Builder(path)
    T, U, P = gtid(10), gtid(10, 11), gpid(10)
    for stmt in SAMPLE_DDL:
        b.conn.execute(stmt)
    sid = 0
    for i in range(steps):
        t = 10_000 + i * 10_000
        b.nvtx(T, t, t + 5000, "decode_step")
        for k in range(kernels):
            c = b.launch(T, t + 10 + k * 20, t + 20 + k * 20)
            b.kernel(P, c, t + 1000 + k * 200, t + 1100 + k * 200, "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT")
        for tid, leaf in ((T, "PyEval"), (U, "epoll_wait")):
            for ts in range(t + 1050, t + 1000 + samples_until, 10):
                sid += 1
                b.conn.execute("INSERT INTO COMPOSITE_EVENTS VALUES (?, ?, 0, 1, ?, 0)", (sid, ts, tid))
                b.conn.execute("INSERT INTO SAMPLING_CALLCHAINS (id, symbol, module, stackDepth) VALUES "
                               "(?, ?, ?, 0)", (sid, b.string(leaf), b.string("/lib/libpython3.11.so")))
    return b


def test_launch_stats_samples_of_the_step_thread_in_idle(tmp_path):
    """A synthetic capture: two NVTX steps on thread T, each with two kernels 100 ns apart (a 100 ns gap); samples
    of T and of another thread U inside and outside the gaps, every 10 ns (5 before the gap [t+1100, t+1200), 10 in
    it, 5 after)."""
    path = sampled_steps(tmp_path / "s.sqlite", steps=2, kernels=2, samples_until=250).close()
    stats = launch_stats(compute_budget(path, steps="nvtx:decode_step", keep_attribution=True))[0]
    s = stats["host_in_idle"]["cpu_samples"]
    assert stats["idle_ms_per_step"] == pytest.approx(100 / 1e6)
    assert s["samples_per_step"] == 10.0  # T's ten samples in each gap; U's never count
    assert s["period_ms"] == pytest.approx(10 / 1e6) and s["share_of_idle"] == pytest.approx(1.0)
    assert [(f["function"], f["module"]) for f in s["functions"]] == [("PyEval", "libpython3.11.so")]
    text = "\n".join(md_runtime.launch_section(_report_data(stats)))
    assert "CPU samples (nsys `--sample`)" in text and "| PyEval | libpython3.11.so |  | 10.00 | 100.0% |" in text


def _report_data(stats):
    d = {"device": stats["device"]}
    return SimpleNamespace(captures=[SimpleNamespace(label="c", budget={"devices": [d]}, launches=[stats])],
                           charts={})


def test_capture_without_samples_says_nothing_about_them():
    path = EXAMPLES / "glm5" / "glm-triton-bs1-r1.sqlite"
    with open_trace(path) as source:
        assert source.cpu_samples() is None and source.sampling_period_ns() is None
    stats = launch_stats(compute_budget(path, keep_attribution=True))
    assert stats and all("cpu_samples" not in s["host_in_idle"] for s in stats)
    text = "\n".join(md_runtime.launch_section(_report_data(stats[0])))
    assert "## Idle time and launches" in text and "CPU samples" not in text


def test_sample_names_are_escaped_in_markdown():
    stats = {"device": 0, "mode": "graph", "graph_launches_per_step": 1.0, "kernel_launches_per_step": 0.0,
             "memory_calls_per_step": 0.0, "sync_calls_per_step": 0.0, "kernels_per_step": 1.0,
             "graph_ops_per_step": 1.0, "eager_ops_per_step": 0.0, "mean_step_ms": 1.0, "idle_ms_per_step": 0.5,
             "idle_share": 0.5, "idle_before_graph_ops_ms": 0.5, "idle_before_eager_ops_ms": 0.0,
             "mean_gap_us": 1.0, "median_gap_us": 1.0, "largest_gap_us": 1.0,
             "host_in_idle": {"idle_ms_per_step": 0.5, "api": [], "nvtx": [], "cpu_samples": {
                 "samples_per_step": 1.0, "period_ms": 1.0, "share_of_idle": None, "functions": [
                     {"function": "op<|x|>*", "module": "lib`a`.so", "python": "f_(<b>)", "samples_per_step": 1.0,
                      "share_of_idle": None}]}}}
    lines = md_runtime.launch_section(_report_data(stats))
    row = next(line for line in lines if "op" in line and line.startswith("| `c` |"))
    # words that hold markup characters are code spans (a longer fence around backticks); the rest is escaped
    assert "op&lt;\\|x\\|`>*`" in row and "``lib`a`.so``" in row and "`f_(<b>`)" in row and "n/a" in row
    assert "<b>" not in re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", "", "\n".join(lines))
