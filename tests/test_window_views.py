"""The report's views read window by window from the op store (report/window_views.py): the same launch and idle
analysis, timeline steps, check facts and kernel spreads as the budget's attribution over all ops gives, on real
captures cut into windows small enough that steps, graph replays and idle gaps straddle them; the exact pieces
they add up with (arrays.Median, host_gaps.overlap_ns, check/facts.py OpFacts) against plain numpy and Python; and
`profattr report` never reading all ops at once where the windows serve."""
from __future__ import annotations

import numpy as np
import pytest

from profattr.arrays import Median
from profattr.attribute import budget as budget_module
from profattr.attribute.budget import ONE_WINDOW, compute_budget, opened
from profattr.check.facts import OpFacts
from profattr.check.run import evaluate_budget
from profattr.report import host_gaps
from profattr.report.launches import launch_stats
from profattr.report.timeline import capture_views
from profattr.report.window_views import window_views
from profattr.taxonomy.classify import load_rules

REAL = ["glm5/glm-triton-bs1-r1", "glm5/glm-fp8dg-bs1-r1", "wl-graph-grouped-tp2", "sglang-triton-bs1"]


def plain(x):
    """Comparable values: arrays as lists, floats by their exact repr."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return plain(x.tolist())
    if isinstance(x, (float, np.floating)):
        return repr(float(x))
    if isinstance(x, np.integer):
        return int(x)
    return x


def facts_of(f: OpFacts) -> dict:
    return {"n": f.n_ops, "first": f.first_ns, "last": f.last_ns, "devices": f.device_rows(), "names": f.names}


def all_at_once(path, steps="auto"):
    budget = compute_budget(path, steps=steps, keep_attribution=True)
    with opened(path) as source:
        return (plain(budget.to_dict()), plain(launch_stats(budget, source)),
                plain(capture_views(budget, source=source)), facts_of(OpFacts.of(budget.attribution.ops)),
                plain([f.to_dict() for f in evaluate_budget(source, budget)]))


def by_windows(path, monkeypatch, window_ops: int, steps="auto"):
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", str(window_ops))
    rules = load_rules(())
    with opened(path) as source:
        budget = compute_budget(source, steps=steps, rules=rules, keep_attribution=ONE_WINDOW)
        assert budget.attribution is None  # computed window by window
        views = window_views(budget, source, rules)
        assert views is not None and views.op_facts.first_calls.usable
        checks = plain([f.to_dict() for f in evaluate_budget(source, budget, None, views.op_facts)])
    return plain(budget.to_dict()), plain(views.launches), plain(views.timeline), facts_of(views.op_facts), checks


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("window_ops", [97, 1999])
def test_windows_give_the_views_of_all_ops_at_once(export_example, monkeypatch, name, window_ops):
    path = export_example(name)
    want = all_at_once(path)
    got = by_windows(path, monkeypatch, window_ops)
    for part, a, b in zip(("budget", "launches", "timeline", "facts", "checks"), want, got):
        assert a == b, part
    assert any(d["distributions"].get("kernels") for d in got[0]["devices"])  # the kernel spread is there


def test_windows_cut_inside_replays_and_steps(export_example, monkeypatch):
    """The windows really split the work that the carries join: steps and graph replays over two windows."""
    path = export_example("glm5/glm-fp8dg-bs1-r1")
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "97")
    with opened(path) as source:
        budget = compute_budget(source, keep_attribution=ONE_WINDOW)
        w = budget.windowed
        split_steps = split_replays = 0
        seen_steps, seen_keys = set(), set()
        for ops in source.time_windows():
            step = w.step_of(ops)
            here = set(step[step >= 0].tolist())
            keys = set(ops.launch_key[ops.graph_node >= 0].tolist())
            split_steps += len(here & seen_steps)
            split_replays += len(keys & seen_keys)
            seen_steps |= here
            seen_keys |= keys
    assert split_steps > 10 and split_replays > 10


@pytest.mark.parametrize("steps", ["nvtx:decode_step", "whole"])
def test_windows_of_one_kernel_keep_the_samples_in_the_gaps(tmp_path, monkeypatch, steps):
    """CPU samples in the gaps, a window per kernel: for NVTX steps the step's thread; for one whole step the
    thread that launched the device's ops, known only after the last window."""
    from test_cpu_samples import sampled_steps

    # three steps of three kernels: two gaps a step; samples of T and U every 10 ns over both gaps
    path = sampled_steps(tmp_path / "s.sqlite", steps=3, kernels=3, samples_until=450).close()
    want = all_at_once(path, steps)
    got = by_windows(path, monkeypatch, 1, steps)
    assert want == got
    samples = got[1][0]["host_in_idle"]["cpu_samples"]
    # T's ten samples in each of a step's two gaps; U's never count (one whole step: all three steps' gaps)
    assert float(samples["samples_per_step"]) == (20.0 if steps != "whole" else 60.0)


def test_report_never_reads_all_ops_at_once_where_windows_serve(export_example, monkeypatch, tmp_path):
    from profattr.report.collect import collect_report

    def refuse(*args, **kwargs):
        raise AssertionError("the report computed a budget over all ops at once")

    path = export_example("glm5/glm-triton-bs1-r1")
    with opened(path) as source:  # its ops fit one window: read at once, the same memory
        assert compute_budget(source, keep_attribution=ONE_WINDOW).attribution is not None
    monkeypatch.setenv("PROFATTR_WINDOW_OPS", "997")  # a capture of many windows
    monkeypatch.setattr(budget_module, "_one_window", refuse)
    data = collect_report([str(path)], samples=50)
    cap = data.captures[0]
    assert cap.launches and cap.timeline and cap.checks
    assert cap.budget["devices"][0]["distributions"]["kernels"]


@pytest.mark.parametrize("seed", range(6))
def test_median_in_parts_is_numpys(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-1000, 10**9, size=int(rng.integers(1, 3000)))
    values[rng.integers(0, len(values), 50)] = 7  # repeats
    m = Median()
    for part in np.array_split(values, int(rng.integers(1, 9))):
        m.add(part)
    assert m.median() == float(np.median(values.astype(np.float64)))
    assert len(m) == len(values)
    assert Median().median() is None


@pytest.mark.parametrize("seed", range(4))
def test_overlap_is_summed_over_gaps_in_any_split(seed, monkeypatch):
    """Against plain Python: each call's overlap with each gap, summed (gaps of two steps may overlap)."""
    rng = np.random.default_rng(seed)
    gs = rng.integers(0, 10_000, 300)
    ge = gs + rng.integers(1, 400, 300)
    cs = rng.integers(-100, 10_500, 200)
    ce = cs + rng.integers(0, 800, 200)
    want = [sum(max(0, min(e, b) - max(s, a)) for a, b in zip(gs.tolist(), ge.tolist()))
            for s, e in zip(cs.tolist(), ce.tolist())]
    assert host_gaps.overlap_ns(gs, ge, cs, ce).tolist() == want
    monkeypatch.setattr(host_gaps, "GAPS_PER_CHUNK", 7)  # chunks of gaps, each from its own origin
    assert host_gaps.overlap_ns(gs, ge, cs, ce).tolist() == want
    half = host_gaps.overlap_ns(gs[::2], ge[::2], cs, ce) + host_gaps.overlap_ns(gs[1::2], ge[1::2], cs, ce)
    assert half.tolist() == want
    big = np.int64(2**62)  # times near the top of int64 stay exact
    assert host_gaps.overlap_ns(gs + big, ge + big, cs + big, ce + big).tolist() == want


@pytest.mark.parametrize("in_start_order, spilled", [(False, False), (True, False), (True, True)])
def test_host_tally_in_windows_is_the_tally_of_all_gaps(in_start_order, spilled, monkeypatch):
    """The calls held whole (sorted by start where they are not), or spilled in blocks of 7 calls (trace/calls.py)."""
    import pandas as pd

    from profattr.attribute.steps import Steps
    from profattr.trace import calls as call_sets

    rng = np.random.default_rng(3)
    gs = np.sort(rng.integers(0, 100_000, 400))
    ge = gs + rng.integers(1, 50, 400)
    api = {"kind": rng.integers(0, 4, 500), "start": rng.integers(0, 100_000, 500), "tid": np.ones(500, int)}
    api["end"] = api["start"] + rng.integers(0, 300, 500)
    if in_start_order:  # as nsys writes its calls: read without a sorted copy
        order = np.argsort(api["start"], kind="stable")
        api = {k: v[order] for k, v in api.items()}
    starts = rng.integers(0, 100_000, 60)
    ranges = pd.DataFrame({"start": starts, "end": starts + rng.integers(1, 900, 60), "tid": np.arange(60),
                           "text": [f"r{i % 7}" for i in range(60)]})
    steps = Steps(source="nvtx:x", tid=np.array([999]), start=np.array([0]), end=np.array([1]))
    monkeypatch.setattr(call_sets, "BLOCK_CALLS", 7)
    held = call_sets.SpilledCalls.of([api]) if spilled else call_sets.WholeCalls(api)
    calls = host_gaps.HostCalls(held, ranges, steps)
    whole = calls.tally().add(gs, ge).result(5)
    parts = calls.tally()
    for idx in np.array_split(np.arange(len(gs)), 9):
        parts.add(gs[idx], ge[idx])
    assert parts.result(5) == whole
    kinds = {r["kind"]: r["ms_per_step"] for r in whole["api"]}
    for k, name in enumerate(host_gaps.KINDS):
        sel = api["kind"] == k
        ns = sum(max(0, min(e, b) - max(s, a)) for s, e in zip(api["start"][sel], api["end"][sel])
                 for a, b in zip(gs, ge))
        assert kinds.get(name, 0.0) == pytest.approx(ns / 5 / 1e6, rel=1e-12)


def test_op_facts_in_windows(export_example):
    from profattr.trace.source import open_trace

    path = export_example("wl-graph-grouped-tp2")
    with open_trace(path) as source:
        ops = source.ops()
    whole = OpFacts.of(ops)
    parts = OpFacts()
    for idx in np.array_split(np.arange(len(ops)), 13):
        parts.add(ops.take(idx))
    assert facts_of(parts) == facts_of(whole)
    kernel = ops.kind == 0
    assert [d["kernels"] for d in whole.device_rows()] == [int((kernel & (ops.device == d)).sum())
                                                          for d in np.unique(ops.device[kernel])]
    assert whole.first_ns == int(ops.start.min()) and whole.last_ns == int(ops.end.max())


def _jobs(paths):
    from profattr.report.capture_reads import ReadJob

    return [ReadJob(given=str(p), path=str(p), run=None, steps="auto", rules=(), force=False, skip_steps=None,
                    mapping=None, by="category", defaults=True, graph_twin=None, host_cycle=False) for p in paths]


def _read_plain(read) -> list:
    return [plain(read.budget.to_dict()), plain(read.launches), plain(read.timeline), plain(read.checks),
            read.checks_source]


@pytest.mark.parametrize("workers", ["2", "1"])
def test_a_file_named_twice_is_read_once_and_as_without_the_cache(tmp_path, monkeypatch, workers):
    """read_captures (a report's captures; with two workers their stores built and the captures read in worker
    processes, with one here): a file named twice read once, each read the one that the budget and views give in
    this process with no cache at all."""
    import shutil

    from conftest import EXAMPLES
    from profattr.report.capture_reads import read_capture, read_captures

    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PROFATTR_READ_WORKERS", workers)
    paths = []
    for name in ("sglang-triton-bs1", "sglang-triton_kernel-bs1"):
        paths.append(tmp_path / f"{name}.sqlite")
        shutil.copyfile(EXAMPLES / f"{name}.sqlite", paths[-1])
    jobs = _jobs([paths[0], paths[1], paths[0]])
    reads = read_captures(jobs)
    assert reads[0] is reads[2] and reads[0] is not reads[1]
    assert len(list((tmp_path / "cache" / "opstore").iterdir())) == 2  # stored where they were read
    monkeypatch.setenv("PROFATTR_NO_CACHE", "1")
    assert [_read_plain(r) for r in reads[:2]] == [_read_plain(read_capture(job)) for job in jobs[:2]]


def test_a_damaged_capture_among_others_is_one_clear_error(tmp_path, monkeypatch):
    import shutil

    from conftest import EXAMPLES
    from profattr.errors import ProfattrError
    from profattr.report.capture_reads import read_captures

    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    good = tmp_path / "good.sqlite"
    shutil.copyfile(EXAMPLES / "sglang-triton-bs1.sqlite", good)
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(good.read_bytes()[:4096])
    with pytest.raises(ProfattrError) as err:
        read_captures(_jobs([good, broken]))
    assert "broken.sqlite" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("workers", ["2", "1"])
def test_warnings_of_captures_read_in_workers_are_said_once_by_the_command(tmp_path, monkeypatch, workers):
    """A capture with a damaged row, read in a worker process beside a sound one (report/read_pool.py), or here: the
    command says its warning once on stderr, and the library gives it as a Python warning (a worker's own stderr
    and warnings would reach neither)."""
    import warnings

    from click.testing import CliRunner

    import profattr
    from badinput import KERNEL, copy_export
    from badinput import sql as run_sql
    from profattr.cli import cli

    monkeypatch.setenv("PROFATTR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PROFATTR_READ_WORKERS", workers)
    good = copy_export(tmp_path, "good.sqlite")
    damaged = copy_export(tmp_path, "damaged.sqlite")
    run_sql(damaged, f"UPDATE {KERNEL} SET streamId = -3 WHERE rowid = (SELECT min(rowid) FROM {KERNEL})")
    result = CliRunner().invoke(cli, ["report", str(good), str(damaged), "-o", str(tmp_path / "cli"),
                                      "--samples", "50"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len([line for line in lines if "damaged.sqlite: skipped 1 damaged row" in line]) == 1, lines
    assert not any("good.sqlite" in line and "damaged row" in line for line in lines)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profattr.report([good, damaged], tmp_path / "lib", samples=50)
    said = [str(w.message) for w in caught if issubclass(w.category, profattr.errors.ProfattrWarning)]
    assert any("damaged.sqlite: skipped 1 damaged row" in m for m in said), said


@pytest.mark.parametrize("block", [7, 1 << 18])
def test_calls_per_step_against_plain_python(block, monkeypatch):
    """launches._calls_per_step, the CUDA calls of each step by kind a block of the calls at a time: each call in the
    latest-starting step of its thread that started at or before it, when that step had not ended; per kind the
    calls, and the synchronizations' host time; on real graph and eager captures."""
    from conftest import EXAMPLES
    from profattr.attribute.budget import compute_budget
    from profattr.report import launches
    from profattr.trace import calls
    from profattr.trace.source import open_trace

    monkeypatch.setattr(calls, "BLOCK_CALLS", block)
    for name in ("sglang-triton-bs1.sqlite", "sglang-triton-bs1-eager.nsys-rep"):
        path = EXAMPLES / name
        budget = compute_budget(path, keep_attribution=True)
        steps = budget.attribution.steps
        with open_trace(path) as source:
            api = source.api_calls()
            got = launches._calls_per_step(steps, source.host_calls())
        want = np.zeros((len(steps), 5))
        for tid, start, end, kind in zip(*(api[k].tolist() for k in ("tid", "start", "end", "kind"))):
            mine = [i for i in range(len(steps)) if steps.tid[i] == tid and steps.start[i] <= start]
            if not mine:
                continue
            i = max(mine, key=lambda j: (steps.start[j], j))
            if steps.end[i] < start:
                continue
            want[i, kind] += 1
            if kind == 3:
                want[i, 4] += end - start
        assert want[:, :4].sum() > 0
        assert got.tolist() == want.tolist()
