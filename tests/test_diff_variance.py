"""Diffs that hold for the decode, not only for the capture: the levels a side was measured at, the hierarchical
bootstrap (servers, windows, steps), the verdict that needs 3 windows per side, the regression gate, and the
variance components of the committed replicate windows.

Expected numbers come from SQL on the exports (tests/independent.py) or from synthetic data whose variance is
known, never from profattr's output.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from independent import expected_nvtx_like
from profattr.attribute import diff_stats
from profattr.attribute.diff import compute_diff, group, load_side
from profattr.attribute.variance import components
from profattr.cli import cli
from profattr.taxonomy.classify import load_rules

DECODE = "step[DECODE bs=%]"


def sql_device(path) -> dict:
    """SQL figures of the decode steps of a one-GPU capture."""
    return next(iter(expected_nvtx_like(path, DECODE).values()))


def sql_category_ms(dev: dict, category: str) -> float:
    """ms/step of a category from the SQL per-kernel sums, classified by name (the graph kernels of these captures
    have no NVTX context: their graphs were captured before the window)."""
    rules = load_rules()
    total = 0.0
    for (short, demangled), (ms, _count) in dev["per_demangled"].items():
        rule = rules.match(demangled) or rules.match(short)
        total += ms if rule is not None and rule.category == category else 0.0
    return total


@pytest.fixture(scope="module")
def aa(export_example):
    """The A/A pair: two windows of one server, same configuration."""
    return export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-triton-bs1-r2")


def test_aa_pair_is_within_noise_and_says_its_levels(aa):
    a, b = aa
    diff = compute_diff(load_side(a), load_side(b), samples=500)
    sa, sb = sql_device(a), sql_device(b)
    d = diff["devices"][0]
    assert d["step_ms"]["delta"] == pytest.approx(sb["step_ms"] - sa["step_ms"], rel=1e-9)
    assert diff["a"]["levels"] == {"servers": 1, "windows": 1, "steps": sa["steps"]}
    assert diff["b"]["levels"] == {"servers": 1, "windows": 1, "steps": sb["steps"]}
    # the steps-only interval excludes 0 (the two windows differ by far more than their steps say) ...
    assert d["step_ms"]["ci95"][0] > 0 and d["step_ms"]["change"]
    # ... but one window per side covers no window-to-window variance, so nothing is established
    assert diff["interval"]["covers_window_variance"] is False
    assert diff["interval"]["covers_server_variance"] is False
    assert diff["interval"]["covers"] == ["steps"]
    assert diff["verdict"] == "within noise"
    assert "not established" in diff["verdict_reason"]
    assert not d["step_ms"]["established"] and not any(c["established"] for c in d["components"])


def test_aa_pair_is_within_noise_in_the_report_and_never_ranked(aa, tmp_path):
    a, b = aa
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", str(a), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    ranked = text.split("## Bottlenecks, ranked", 1)[1].split("\n## ", 1)[0]
    assert "No difference between captures is ranked" in ranked
    assert "slower than" not in ranked and "faster than" not in ranked
    section = text.split("## Differences against", 1)[1].split("\n## ", 1)[0]
    assert "**within noise**" in section and "no difference is established" in section
    assert "Verdict: **within noise**" in section
    assert "regression" not in section


def _window(rng, mean, sd_step, steps):
    values = mean + rng.normal(0.0, sd_step, steps)
    return np.stack([values, values], axis=1)  # one component, and the span column


def _interval(mats_a, mats_b, rng, windows: bool, samples=800):
    sa = diff_stats._side_samples(mats_a, ["idle"], rng, samples, resample_windows=windows)
    sb = diff_stats._side_samples(mats_b, ["idle"], rng, samples, resample_windows=windows)
    return np.percentile(sb[:, 0] - sa[:, 0], [2.5, 97.5])


def test_resampling_windows_widens_the_interval_and_covers_a_known_truth():
    """Synthetic windows: each window's mean is off by N(0, 0.3 ms), each step by N(0, 0.15 ms), 6 windows of 20
    steps per side, B truly 0.2 ms slower. Resampling windows gives an interval that holds the truth at about the
    nominal rate; steps alone give one far too narrow that misses it most of the time."""
    truth, hits_windows, hits_steps = 0.2, 0, 0
    seeds = range(60)
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        mats_a = [_window(rng, rng.normal(3.0, 0.3), 0.15, 20) for _ in range(6)]
        mats_b = [_window(rng, rng.normal(3.0 + truth, 0.3), 0.15, 20) for _ in range(6)]
        wide = _interval(mats_a, mats_b, rng, windows=True)
        narrow = _interval(mats_a, mats_b, rng, windows=False)
        assert wide[1] - wide[0] > 2.0 * (narrow[1] - narrow[0])
        hits_windows += wide[0] <= truth <= wide[1]
        hits_steps += narrow[0] <= truth <= narrow[1]
    assert hits_windows / len(seeds) >= 0.8
    assert hits_steps / len(seeds) <= 0.5


@pytest.mark.parametrize("threads, chunk_cells", [("1", 1 << 22), ("2", 4096), ("3", 64), ("2", 1)])
def test_step_bootstrap_draws_and_values_whatever_the_threads_and_chunks(threads, chunk_cells, monkeypatch):
    """One replicate's step bootstrap, on one thread or several and in chunks of any size, gives exactly what one
    draw of every resample at once gives, computed here with numpy directly."""
    m = np.random.default_rng(3).gamma(2.0, 0.4, size=(301, 6))  # 301 steps: 5 components, then the span
    names = [f"category:c{j}" for j in range(5)]
    samples = 257
    idx = np.random.default_rng(11).integers(0, len(m), size=(samples, len(m)))
    want = np.empty((samples, len(names) + 2))
    for j in range(len(names)):
        want[:, j] = np.ascontiguousarray(m[:, j])[idx].mean(axis=1)
    span = np.ascontiguousarray(m[:, -1])[idx]
    want[:, -2], want[:, -1] = np.median(span, axis=1), span.mean(axis=1)
    monkeypatch.setenv("PROFATTR_BOOTSTRAP_THREADS", threads)
    monkeypatch.setattr(diff_stats, "BOOTSTRAP_CHUNK_CELLS", chunk_cells)
    got = diff_stats._replicate_samples(m, names, np.random.default_rng(11), samples)
    assert np.array_equal(got, want)


def test_servers_are_resampled_above_their_windows():
    """Two servers of three windows each: resampling servers (the top level) widens the interval beyond
    resampling all six windows as if they were one server's, when the servers differ."""
    rng = np.random.default_rng(7)
    mats = [_window(rng, 3.0 + off + rng.normal(0, 0.02), 0.05, 20) for off in (0.0, 0.0, 0.0, 0.5, 0.5, 0.5)]
    by_server = diff_stats._side_samples(mats, ["idle"], rng, 2000, servers=[[0, 1, 2], [3, 4, 5]])
    one_server = diff_stats._side_samples(mats, ["idle"], rng, 2000, servers=[[0, 1, 2, 3, 4, 5]])
    assert np.std(by_server[:, 0]) > 1.5 * np.std(one_server[:, 0])


def test_server_groups_and_coverage_rules():
    assert diff_stats.server_groups([("s", "a", "t"), ("s", "a", "t"), None, ("s", "b", "t")]) == [[0, 1], [2], [3]]
    few = diff_stats.coverage({"servers": 1, "windows": 2, "steps": 40}, {"servers": 1, "windows": 2, "steps": 40})
    assert not few["covers_window_variance"] and not few["covers_server_variance"]
    three = diff_stats.coverage({"servers": 1, "windows": 3, "steps": 60}, {"servers": 1, "windows": 4, "steps": 80})
    assert three["covers_window_variance"] and not three["covers_server_variance"]
    assert three["covers"] == ["steps", "windows"] and "server-to-server" in three["missing"][0]
    unknown = diff_stats.coverage({"servers": None, "windows": 3, "steps": 60},
                                  {"servers": 2, "windows": 3, "steps": 60})
    assert not unknown["covers_server_variance"] and "unknown" in unknown["missing"][0]


@pytest.fixture(scope="module")
def fp8_pair(export_example):
    """DeepGEMM's dense FP8 GEMMs (fp8dg) back to Triton's (fp8tr): a real gemm.fp8 regression, 2 windows a side."""
    a = [export_example(f"glm5/glm-fp8dg-bs1-r{r}") for r in (1, 2)]
    b = [export_example(f"glm5/glm-fp8tr-bs1-r{r}") for r in (1, 2)]
    return a, b


def _gate(args):
    return CliRunner().invoke(cli, ["diff", "--format", "json", *args])


def test_gate_fails_a_real_regression_only_when_the_user_accepts_two_windows(fp8_pair):
    a, b = fp8_pair
    want = (np.mean([sql_category_ms(sql_device(p), "gemm.fp8") for p in b])
            - np.mean([sql_category_ms(sql_device(p), "gemm.fp8") for p in a]))
    assert want > 1.0  # SQL: Triton's FP8 GEMMs cost over a ms/step more than DeepGEMM's
    args = [*map(str, a), "--", *map(str, b)]
    # the default needs 3 windows per side: the gate is not applied, and says why
    default = _gate(["--fail-on", "category:gemm.fp8=0.05", *args])
    assert default.exit_code == 0, default.stderr
    assert "gate not applied" in default.stderr and "fewer than 3" in default.stderr
    assert json.loads(default.stdout)["verdict"] == "within noise"
    # lowered explicitly: exit 1, one line naming the component, its delta, and the variance the interval lacks
    # (options may follow the second group too)
    lowered = _gate([*args, "--fail-on", "category:gemm.fp8=0.05", "--min-windows=2"])
    assert lowered.exit_code == 1, lowered.stderr
    lines = [x for x in lowered.stderr.splitlines() if x.startswith("regression:")]
    assert len(lines) == 1 and "category:gemm.fp8" in lines[0]
    got = float(re.search(r"category:gemm\.fp8 ([+-][\d.]+) ms/step", lines[0]).group(1))
    assert "does not cover window-to-window variance" in lines[0]
    result = json.loads(lowered.stdout)
    # the gate reads the component, a category's own (exclusive) change; its op time change is SQL's
    comp = next(c for c in result["devices"][0]["components"] if c["component"] == "category:gemm.fp8")
    assert comp["op_delta_ms_per_step"] == pytest.approx(want, abs=5e-4)
    assert got == pytest.approx(comp["delta_ms_per_step"], abs=5e-4) and got > 1.0
    assert result["a"]["levels"]["windows"] == 2 and result["b"]["levels"]["servers"] == 1
    assert result["verdict"] == "regression" and result["validity"]["min_windows"] == 2
    # a threshold above the change passes
    assert _gate(["--fail-on", f"category:gemm.fp8={want + 0.1:.3f}", "--min-windows", "2", *args]).exit_code == 0


def test_gate_passes_the_aa_pair(aa):
    a, b = aa
    result = _gate(["--fail-on", "5%", "--fail-on", "idle=0.05", str(a), str(b)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "within noise"
    assert "gate not applied" in result.stderr


@pytest.mark.parametrize("spec", ["fast", "category:gemm.fp8=", "=0.1", "idle=-1", "x=y"])
def test_a_bad_threshold_is_one_line_exit_2(spec, aa):
    a, b = aa
    result = _gate(["--fail-on", spec, str(a), str(b)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --fail-on") and len(result.stderr.strip().splitlines()) == 1


def test_a_confounded_pair_is_not_comparable(export_example):
    """Batch 1 against batch 4 of one server: the requests differ, so no verdict but `not comparable`."""
    a, b = export_example("glm5/glm-triton-bs1-r1"), export_example("glm5/glm-triton-bs4-r1")
    diff = compute_diff(load_side(a), load_side(b), samples=200, min_windows=1)
    assert diff["verdict"] == "not comparable" and "requests batch" in diff["verdict_reason"]


def test_grouped_windows_of_one_server_count_one_server(fp8_pair):
    a, _b = fp8_pair
    side = group([load_side(p) for p in a])
    assert diff_stats.levels(side.members)["servers"] == 1
    assert diff_stats.levels(side.members)["windows"] == 2


def test_variance_components_recover_known_variances():
    """Nested synthetic data (8 servers x 6 windows x 200 steps): SDs 0.2 (server), 0.3 (window), 0.1 (step)."""
    rng = np.random.default_rng(3)
    servers = []
    for _ in range(8):
        s = rng.normal(0.0, 0.2)
        servers.append([s + rng.normal(0.0, 0.3) + rng.normal(0.0, 0.1, 200) for _ in range(6)])
    rows = {r["level"]: r for r in components(servers)["components"]}
    assert rows["step"]["sd_ms"] == pytest.approx(0.1, rel=0.05)
    assert rows["window"]["sd_ms"] == pytest.approx(0.3, rel=0.25)
    assert rows["server"]["sd_ms"] == pytest.approx(0.2, rel=0.6)
    assert rows["window"]["df"] == 40 and rows["server"]["df"] == 7
    one = components([servers[0]])
    assert one["components"][2]["sd_ms"] is None  # one server: no server component


def test_variance_command_groups_windows_by_server_and_configuration(aa, fp8_pair, export_example):
    a, b = aa
    fp8tr = fp8_pair[1]
    result = CliRunner().invoke(cli, ["variance", str(a), str(b), *map(str, fp8tr),
                                                       "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["configurations"]) == 1  # triton and fp8tr ran the same resolved server arguments
    c = data["configurations"][0]
    assert c["levels"]["servers"] == 2 and c["levels"]["windows"] == 4
    # the servers differ in a flag the log's server_args line leaves out: listed with the server component
    run_a = json.loads(a.with_name("glm-triton-bs1-r1.run.json").read_text())["server"]["args"]
    run_b = json.loads(fp8tr[0].with_name("glm-fp8tr-bs1-r1.run.json").read_text())["server"]["args"]
    flag = lambda args: args[args.index("--cuda-graph-max-bs") + 1]  # noqa: E731
    diffs = c["between_servers"][0]["differences"]
    assert any(d["what"] == "server flag --cuda-graph-max-bs" and (d["a"], d["b"]) == (flag(run_a), flag(run_b))
               for d in diffs)
    step = next(m for m in c["devices"][0]["metrics"] if m["metric"] == "step_ms")
    want = [[sql_device(p)["mean_step_ms"] for p in (a, b)], [sql_device(p)["mean_step_ms"] for p in fp8tr]]
    assert np.allclose(step["window_means_ms"], want, rtol=1e-9)
    rows = {r["level"]: r for r in step["components"]}
    assert rows["window"]["df"] == 2 and rows["server"]["df"] == 1


def _result(windows, servers, ci, delta=0.3, confounds=()):
    """A diff dict with one device, as compute_diff leaves it before the verdict (synthetic edge cases)."""
    lv = {"servers": servers, "windows": windows, "steps": 20 * windows}
    change = ci is not None and not (ci[0] <= 0.0 <= ci[1])
    return {"a": {"levels": lv}, "b": {"levels": lv}, "interval": diff_stats.coverage(lv, lv),
            "confounds": list(confounds),
            "devices": [{"device": 0, "step_ms": {"a": 3.0, "b": 3.0 + delta, "delta": delta, "ci95": ci,
                                                  "change": change},
                         "components": [{"component": "idle", "delta_ms_per_step": delta, "ci95": ci,
                                         "change": change, "noise": not change}]}]}


def test_three_windows_of_one_server_can_be_a_change_that_says_the_server_level_is_missing():
    from profattr.attribute.verdict import decide

    r = _result(3, 1, [0.1, 0.5])
    decide(r)
    assert r["verdict"] == "regression" and "server-to-server" in r["verdict_reason"]
    assert r["devices"][0]["step_ms"]["established"] and r["devices"][0]["components"][0]["established"]
    both = _result(3, 2, [-0.6, -0.1], delta=-0.3)
    decide(both)
    assert both["verdict"] == "improvement" and "server" not in both["verdict_reason"]
    noise = _result(4, 2, [-0.1, 0.5])
    decide(noise)
    assert noise["verdict"] == "within noise"


def test_confounds_and_missing_intervals_are_not_comparable():
    from profattr.attribute.verdict import decide

    r = _result(3, 2, [0.1, 0.5], confounds=[{"kind": "confound", "what": "driver", "a": "570", "b": "580"}])
    decide(r)
    assert r["verdict"] == "not comparable" and "driver" in r["verdict_reason"]
    intended = _result(3, 2, [0.1, 0.5], confounds=[{"kind": "intended", "what": "server argument x", "a": 1,
                                                     "b": 2}])
    decide(intended)
    assert intended["verdict"] == "regression"
    no_ci = _result(3, 2, None)
    decide(no_ci)
    assert no_ci["verdict"] == "not comparable" and "no per-step data" in no_ci["verdict_reason"]


def test_only_established_diffs_rank_as_bottlenecks():
    from profattr.attribute.verdict import decide
    from profattr.report.bottlenecks import rank_bottlenecks

    def entry(windows):
        r = _result(windows, 2, [0.1, 0.5])
        decide(r)
        r["devices"][0].update(kernels_per_step={"a": 100.0, "b": 100.0})
        return {"a": "A", "b": "B", "diff": r}
    ranked = rank_bottlenecks([], [entry(3)])
    assert [i["kind"] for i in ranked] == ["diff"] and "B is 0.300 ms/step slower than A" in ranked[0]["title"]
    assert rank_bottlenecks([], [entry(2)]) == []


def test_variance_markdown_and_table_name_the_levels(aa):
    a, b = aa
    for fmt in ("markdown", "table"):
        result = CliRunner().invoke(cli, ["variance", str(a), str(b), "--format", fmt])
        assert result.exit_code == 0, result.output
        assert "1 server(s), 2 window(s)" in result.output
        assert "needs 2+ servers of the configuration" in result.output or "| server | n/a |" in result.output


def test_gate_fails_a_real_regression_with_three_windows_and_two_servers_a_side(export_example):
    """NVFP4 back to FP8 at batch 1 (random prompts; 2 servers x 3 windows each side): a step regression the default
    gate calls without lowering --min-windows. The expected delta is SQL's mean step per side."""
    import statistics

    from independent import expected_graph

    fp8 = [export_example(f"glm5/glm-fp8-{s}-bs1-r{r}") for s in ("rnd", "rnd2") for r in (1, 2, 3)]
    nvfp4 = [export_example(f"glm5-nvfp4/glm-nvfp4-{s}-bs1-r{r}") for s in ("rnd", "rnd2") for r in (1, 2, 3)]
    median_step = {p: next(iter(expected_graph(p).values()))["step_ms"] for p in fp8 + nvfp4}
    assert statistics.mean(median_step[p] for p in fp8) > statistics.mean(median_step[p] for p in nvfp4) + 0.5
    result = _gate(["--skip-steps", "auto", "--fail-on", "5%", *map(str, nvfp4), "--", *map(str, fp8)])
    assert result.exit_code == 1, result.stderr
    lines = [x for x in result.stderr.splitlines() if x.startswith("regression:")]
    assert len(lines) == 1 and "step" in lines[0] and "does not cover" not in lines[0]
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "regression" and verdict["interval"]["covers_window_variance"]
    assert verdict["interval"]["covers_server_variance"]
    same = _gate(["--skip-steps", "auto", "--fail-on", "5%", *map(str, fp8[:3]), "--", *map(str, fp8[3:])])
    assert same.exit_code == 0 and json.loads(same.stdout)["verdict"] != "regression"  # FP8 server A/A
