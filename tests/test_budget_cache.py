"""The op store and the budget cache on real captures: the store's ops are the reader's ops exactly, a windowed budget
(many small windows) is the one-window budget exactly, cached and uncached budgets are identical, the cache lives in
the user's cache folder (never beside the capture), a damaged entry is rebuilt, and the cache stays within its size."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import EXAMPLES, SGLANG_CAPTURES, SGLANG_EAGER_CAPTURES, WORKLOAD_CAPTURES
from profattr.attribute.budget import _one_window, compute_budget
from profattr.cli import cli
from profattr.taxonomy.classify import load_rules
from profattr.trace import cache, store, store_build
from profattr.trace.reader import open_export

# graph and eager, one GPU and two (tp2: collectives, the comm split), with and without memory ops
CAPTURES = ["sglang-triton-bs1", "sglang-triton_kernel-bs1", "sglang-triton-bs1-eager", "wl-eager-loop",
            "wl-graph-grouped-before", "wl-graph-grouped-tp2"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "user-cache"
    monkeypatch.setenv("PROFATTR_CACHE", str(folder))
    monkeypatch.delenv("PROFATTR_NO_CACHE", raising=False)
    return folder


def _same_budget(a, b):
    assert a.to_dict() == b.to_dict()
    pd.testing.assert_frame_equal(a.per_step, b.per_step)
    pd.testing.assert_frame_equal(a.per_step_category.frame(), b.per_step_category.frame())
    if a.per_step_comm is None:
        assert b.per_step_comm is None
    else:
        pd.testing.assert_frame_equal(a.per_step_comm.reset_index(drop=True), b.per_step_comm.reset_index(drop=True))


@pytest.mark.parametrize("name", CAPTURES)
def test_store_ops_are_the_readers_ops(name, export_example, tmp_path):
    path = export_example(name)
    with open_export(path) as export:
        expected = export.ops()
        built = store_build.build(export, tmp_path / "store", size=777)  # many windows, a launch buffer that slides
        got = built.ops()
        for column in store.COLUMNS:
            want, have = getattr(expected, column), getattr(got, column)
            assert have.dtype == want.dtype, column
            assert np.array_equal(have, want), column
        pd.testing.assert_frame_equal(built.ranges(), export.ranges())
        reopened = store.OpStore(tmp_path / "store")  # as a warm run reads it
        first = reopened.ranges()
        first["start"] = -1  # a caller's change to its frame is its own
        pd.testing.assert_frame_equal(reopened.ranges(), export.ranges())
        for a, b in ((built.graph_launches(), export.graph_launches()), (built.node_creation(), export.node_creation())):
            assert (a is None) == (b is None)
            if a is not None:
                assert all(np.array_equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("name", CAPTURES)
def test_windowed_cached_and_uncached_budgets_are_identical(name, export_example, cache_dir, monkeypatch):
    path = export_example(name)
    with open_export(path) as export:  # the reference: every op in memory, read straight from SQLite
        reference = _one_window(export, "auto", load_rules(()))
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "501")
    cold = compute_budget(path)
    assert list(cache_dir.glob("opstore/*/meta.json")), "the cold budget stored the capture"
    warm = compute_budget(path)
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")
    uncached = compute_budget(path)
    for other in (cold, warm, uncached):
        _same_budget(reference, other)


def test_report_path_reads_the_cache(export_example, cache_dir):
    """keep_attribution (report, layers) takes every op from the store: the same attribution as from SQLite."""
    path = export_example("wl-graph-grouped-tp2")
    with open_export(path) as export:
        reference = _one_window(export, "auto", load_rules(()))
    compute_budget(path)  # fills the cache
    warm = compute_budget(path, keep_attribution=True, by="layer")
    _same_budget(reference, compute_budget(path))
    assert np.array_equal(warm.attribution.step, reference.attribution.step)
    assert np.array_equal(warm.attribution.combo, reference.attribution.combo)


def test_nothing_is_written_beside_the_capture(tmp_path, cache_dir):
    folder = tmp_path / "captures"
    folder.mkdir()
    capture = folder / "sglang-triton-bs1.sqlite"
    shutil.copyfile(EXAMPLES / capture.name, capture)
    before = sorted(p.name for p in folder.iterdir())
    compute_budget(capture)
    compute_budget(capture)
    assert sorted(p.name for p in folder.iterdir()) == before
    entries = [p for p in (cache_dir / "opstore").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    assert not any(str(folder) in str(p) for p in cache_dir.rglob("*"))


def test_damaged_entry_is_rebuilt(tmp_path, cache_dir):
    capture = tmp_path / "sglang-triton-bs1.sqlite"
    shutil.copyfile(EXAMPLES / capture.name, capture)
    good = compute_budget(capture).to_dict()
    (entry,) = [p for p in (cache_dir / "opstore").iterdir() if not p.name.startswith(".")]
    with open(entry / "ops.start.bin", "r+b") as fh:  # truncated column
        fh.truncate(100)
    assert compute_budget(capture).to_dict() == good
    (entry / "meta.json").write_text("{not json")  # unreadable metadata
    assert compute_budget(capture).to_dict() == good
    (entry / "tables.npz").write_bytes(b"garbage")
    assert compute_budget(capture).to_dict() == good
    assert store.OpStore(entry).rows > 0  # rebuilt, readable again


def test_key_follows_the_file(tmp_path, cache_dir):
    capture = tmp_path / "c.sqlite"
    shutil.copyfile(EXAMPLES / "sglang-triton-bs1.sqlite", capture)
    key = cache.capture_key(capture)
    assert cache.capture_key(capture) == key
    os.utime(capture, ns=(capture.stat().st_atime_ns, capture.stat().st_mtime_ns + 1))
    assert cache.capture_key(capture) != key


def test_cache_is_bounded_least_recently_used_first(tmp_path, cache_dir, monkeypatch):
    captures = []
    for i, name in enumerate(["sglang-triton-bs1", "sglang-triton_kernel-bs1"]):
        captures.append(tmp_path / f"{name}.sqlite")
        shutil.copyfile(EXAMPLES / f"{name}.sqlite", captures[-1])
    compute_budget(captures[0])
    first = cache.capture_key(captures[0])
    size = sum(f.stat().st_size for f in (cache_dir / "opstore" / first).iterdir())
    monkeypatch.setenv("PROFATTR_CACHE_MAX_MB", str(1.5 * size / 2 ** 20))  # room for one entry, not two
    compute_budget(captures[1])
    names = {p.name for p in (cache_dir / "opstore").iterdir() if not p.name.startswith(".")}
    assert names == {cache.capture_key(captures[1])}


def test_no_cache_option_and_variable(tmp_path, cache_dir, monkeypatch):
    capture = tmp_path / "sglang-triton-bs1.sqlite"
    shutil.copyfile(EXAMPLES / capture.name, capture)
    try:
        result = CliRunner().invoke(cli, ["budget", str(capture), "--format", "json", "--no-cache"])
        assert result.exit_code == 0, result.output
        assert not (cache_dir / "opstore").exists()
        assert os.environ.get("PROFATTR_NO_CACHE") == "1"  # set for diff's worker processes too
        result2 = CliRunner().invoke(cli, ["budget", str(capture), "--format", "json"])
        assert result2.exit_code == 0
        assert not (cache_dir / "opstore").exists()
        assert json.loads(result.output) == json.loads(result2.output)
    finally:
        os.environ.pop("PROFATTR_NO_CACHE", None)  # the option sets it in this process
    result3 = CliRunner().invoke(cli, ["budget", str(capture), "--format", "json"])
    assert json.loads(result3.output) == json.loads(result.output)
    assert (cache_dir / "opstore").exists()


def test_unwritable_cache_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    monkeypatch.setenv("PROFATTR_CACHE", str(blocker))  # opstore/ cannot be made under a file
    capture = EXAMPLES / "sglang-triton-bs1.sqlite"
    assert compute_budget(capture).to_dict()["devices"]


@pytest.mark.parametrize("name", SGLANG_CAPTURES[2:] + SGLANG_EAGER_CAPTURES[1:] + WORKLOAD_CAPTURES[1:2])
def test_more_captures_windowed(name, export_example, cache_dir, monkeypatch):
    path = export_example(name)
    with open_export(path) as export:
        reference = _one_window(export, "auto", load_rules(()))
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "1000")
    _same_budget(reference, compute_budget(path))


def test_stored_range_texts_share_one_object_per_distinct_text():
    texts = ["layer.0", None, "layer.1", "layer.0", "", None, "layer.1"]
    got = store._shared_strings([t if t is None else "".join(t) for t in texts])  # fresh objects per element
    assert got.tolist() == texts
    assert got[0] is got[3] and got[2] is got[6] and got[1] is None and got[5] is None
    assert store._shared_strings([]).tolist() == []


def test_several_exports_are_stored_and_read_in_worker_processes(tmp_path, cache_dir, monkeypatch):
    """report/read_pool.py (a report of several captures): each export's store built in a worker process (the same
    file named twice built once, a damaged file left for the command), every capture read there; the reads are
    those of this process, and the budgets read from the stores are the one-window budgets read from SQLite."""
    from profattr.report import read_pool

    names = ["sglang-triton-bs1", "sglang-triton_kernel-bs1"]
    paths = []
    for name in names:
        paths.append(tmp_path / f"{name}.sqlite")
        shutil.copyfile(EXAMPLES / f"{name}.sqlite", paths[-1])
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes((EXAMPLES / f"{names[0]}.sqlite").read_bytes()[:4096])
    jobs = [_Job(str(p)) for p in (paths[0], broken, paths[1])]
    log = tmp_path / "builds.txt"
    monkeypatch.setenv("BUILD_LOG", str(log))
    monkeypatch.setattr(cache, "build_store", _logged_build)
    monkeypatch.setenv("PROFATTR_READ_WORKERS", "2")
    reads = read_pool.read_in_workers(jobs, [paths[0], tmp_path / "missing.sqlite"], _pid_and_budget)
    builds = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert sorted(Path(b[1]).name for b in builds) == sorted(["broken.sqlite"] + [p.name for p in paths])  # once each
    assert str(os.getpid()) not in {b[0] for b in builds}  # in workers
    entries = {p.name for p in (cache_dir / "opstore").iterdir() if not p.name.startswith(".")}
    assert entries == {cache.capture_key(p) for p in paths}  # the damaged one has none
    assert reads[1] is None  # the damaged capture: read again by the caller, which meets its error
    pids = {pid for pid, _ in reads[::2]}
    assert os.getpid() not in pids  # read in workers
    monkeypatch.setenv("PROFATTR_READ_WORKERS", "1")
    assert read_pool.read_in_workers(jobs, [], _pid_and_budget) == [None] * 3  # one worker: read here
    for (_, got), path in zip(reads[::2], paths):
        with open_export(path) as export:
            reference = _one_window(export, "auto", load_rules(()))
        _same_budget(reference, got)
    monkeypatch.setenv("PROFATTR_READ_WORKERS", "2")
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")  # the cache off: reads still run in workers, nothing is stored
    again = read_pool.read_in_workers(jobs[::2], [], _pid_and_budget)
    assert all(r is not None and r[0] != os.getpid() for r in again)


class _Job:  # the one field of report/capture_reads.py ReadJob that read_pool reads, and `force`
    def __init__(self, path):
        self.path, self.force = path, False


_build = cache.build_store


def _logged_build(path):
    with open(os.environ["BUILD_LOG"], "a") as fh:  # a line per build, from whichever process built it
        fh.write(f"{os.getpid()} {path}\n")
    return _build(path)


def _pid_and_budget(job):
    return os.getpid(), compute_budget(job.path)


def test_one_export_is_stored_while_the_command_imports(tmp_path, cache_dir, monkeypatch):
    """store_while (diff of one capture file): the one export without a store is stored here while `work` runs on
    a thread; with two unstored exports, or the cache off, nothing is built; `work`'s error is raised; and
    `profattr diff` of a file with itself leaves its store in the cache with the diff the one read from SQLite."""
    import threading

    names = ["sglang-triton-bs1", "sglang-triton_kernel-bs1"]
    paths = []
    for name in names:
        paths.append(tmp_path / f"{name}.sqlite")
        shutil.copyfile(EXAMPLES / f"{name}.sqlite", paths[-1])
    entries = lambda: {p.name for p in (cache_dir / "opstore").iterdir()  # noqa: E731
                       if not p.name.startswith(".")} if (cache_dir / "opstore").exists() else set()
    ran = []
    cache.store_while([str(paths[0]), str(paths[1]), "no-such-*.sqlite"], lambda: ran.append(1))
    assert ran == [1] and entries() == set()  # two to store: the command's own processes read them
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")
    cache.store_while([str(paths[0])], lambda: ran.append(threading.current_thread().name))
    assert ran[-1] == "profattr-import" and entries() == set()
    monkeypatch.delenv("PROFATTR_NO_CACHE")
    cache.store_while([str(paths[0]), str(paths[0])], lambda: ran.append(2))
    assert ran[-1] == 2 and entries() == {cache.capture_key(paths[0])}

    def broken():
        raise RuntimeError("import failed")

    with pytest.raises(RuntimeError, match="import failed"):
        cache.store_while([str(paths[1])], broken)
    assert entries() == {cache.capture_key(p) for p in paths}  # the store was still built
    args = ["diff", str(paths[1]), str(paths[1]), "--format", "json", "--samples", "50"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")
    uncached = CliRunner().invoke(cli, args)
    assert uncached.exit_code == 0 and json.loads(uncached.output) == json.loads(result.output)
