"""The budget's result cache (profattr/attribute/result_cache.py) on real captures: a second `profattr budget` with
the same options is answered from the cache in every output format, byte for byte what the computation writes (and
the numbers still SQL's), its warnings said again; a changed capture, option, rule file or profattr is a miss; a
damaged entry is computed again; nothing is written beside the capture."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import EXAMPLES
from independent import expected_graph
from profattr.attribute import result_cache
from profattr.cli import cli

CAPTURE = EXAMPLES / "sglang-triton-bs1.sqlite"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "user-cache"
    monkeypatch.setenv("PROFATTR_CACHE", str(folder))
    monkeypatch.delenv("PROFATTR_NO_CACHE", raising=False)
    monkeypatch.delenv("PROFATTR_RESULT_CACHE", raising=False)
    return folder


class _Computed:
    """Counts the budgets actually computed (compute_budget calls) under the CLI."""

    def __init__(self, monkeypatch):
        import profattr.attribute.budget as budget

        self.calls = 0
        real = budget.compute_budget

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(budget, "compute_budget", counted)


def _budget(*args) -> str:
    result = CliRunner().invoke(cli, ["budget", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("fmt", ["json", "table", "csv", "markdown"])
def test_a_second_budget_is_read_from_the_cache_byte_for_byte(cache_dir, monkeypatch, fmt):
    computed = _Computed(monkeypatch)
    first = _budget(CAPTURE, "--format", fmt)
    assert computed.calls == 1 and len(list((cache_dir / "budgets").glob("*.json"))) == 1
    second = _budget(CAPTURE, "--format", fmt)
    assert computed.calls == 1, "the second budget was computed again"
    assert second == first
    monkeypatch.setenv("PROFATTR_RESULT_CACHE", "0")
    assert _budget(CAPTURE, "--format", fmt) == first and computed.calls == 2  # what the computation writes


def test_a_cached_budget_still_gives_sqls_numbers(cache_dir):
    want = expected_graph(CAPTURE)[0]
    for _ in range(2):  # computed, then read from the cache
        got = json.loads(_budget(CAPTURE, "--format", "json"))["devices"][0]
        assert got["steps"] == want["steps"]
        assert got["step_ms"] == pytest.approx(want["step_ms"], abs=1e-9)
        assert got["mean_step_ms"] == pytest.approx(want["mean_step_ms"], abs=1e-9)


def test_a_hit_imports_neither_numpy_nor_pandas(cache_dir):
    """What makes a warm budget cost less than reading the export: the hit is the file key and one JSON read."""
    _budget(CAPTURE, "--format", "json")
    code = ("import sys; from profattr.cli import main; sys.argv = ['profattr', 'budget', sys.argv[1], '--format', "
            "'json', '-o', sys.argv[2]]\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'pandas') if m in sys.modules))")
    out = cache_dir.parent / "hit.json"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parents[1])}
    run = subprocess.run([sys.executable, "-c", code, str(CAPTURE), str(out)], capture_output=True, text=True,
                         env=env, check=True)
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout + run.stderr
    assert json.loads(out.read_text()) == json.loads(_budget(CAPTURE, "--format", "json"))


def test_what_changes_the_result_is_a_miss(cache_dir, tmp_path, monkeypatch):
    computed = _Computed(monkeypatch)
    capture = tmp_path / "c.sqlite"
    shutil.copyfile(CAPTURE, capture)
    rules = tmp_path / "r.toml"
    rules.write_text("[[rule]]\nid = 'norms'\ncategory = 'other'\npattern = 'RMSNorm'\n")
    runs = [(capture,), (capture, "--skip-steps", "2"), (capture, "--steps", "whole"), (capture, "--rules", rules),
            (capture, "--by", "layer")]
    for args in runs:
        _budget(*args, "--format", "json")
    assert computed.calls == len(runs)
    for args in runs:  # each again: all hits
        _budget(*args, "--format", "json")
    assert computed.calls == len(runs)
    rules.write_text("[[rule]]\nid = 'norms'\ncategory = 'other'\npattern = 'Norm'\n")  # the same file, new rules
    _budget(capture, "--rules", rules, "--format", "json")
    assert computed.calls == len(runs) + 1
    conn = sqlite3.connect(capture)  # the capture changed: one kernel 1 us longer
    conn.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 1000 WHERE rowid = 1')
    conn.commit()
    conn.close()
    _budget(capture, "--format", "json")
    assert computed.calls == len(runs) + 2
    monkeypatch.setattr(result_cache, "_code_hash", ["another profattr"])  # profattr changed
    _budget(capture, "--format", "json")
    assert computed.calls == len(runs) + 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.sqlite", "r.toml", "user-cache"]  # nothing beside


def test_warnings_are_said_again_from_the_cache(cache_dir, tmp_path):
    capture = tmp_path / "damaged.sqlite"
    shutil.copyfile(CAPTURE, capture)
    conn = sqlite3.connect(capture)
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'late' WHERE rowid IN (5, 6)")  # a text: damaged
    conn.commit()
    conn.close()
    outputs = []
    for _ in range(2):
        result = CliRunner().invoke(cli, ["budget", str(capture), "--format", "json"])
        assert result.exit_code == 0, result.output
        outputs.append((result.stdout, [line for line in result.stderr.splitlines() if line.startswith("warning:")]))
    assert outputs[0] == outputs[1]
    assert any("skipped 2 damaged row(s)" in line for line in outputs[0][1]), outputs[0][1]


def test_a_damaged_entry_is_computed_again(cache_dir, monkeypatch):
    first = _budget(CAPTURE, "--format", "json")
    (entry,) = (cache_dir / "budgets").glob("*.json")
    entry.write_text('{"budget": ')
    computed = _Computed(monkeypatch)
    assert _budget(CAPTURE, "--format", "json") == first and computed.calls == 1
    assert json.loads(entry.read_text())["budget"] == json.loads(first)


def test_no_cache_writes_no_result(cache_dir):
    _budget(CAPTURE, "--format", "json", "--no-cache")
    assert not (cache_dir / "budgets").exists()


def test_a_failed_budget_is_not_cached(cache_dir, tmp_path):
    capture = tmp_path / "empty.sqlite"
    shutil.copyfile(CAPTURE, capture)
    conn = sqlite3.connect(capture)
    conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    conn.commit()
    conn.close()
    for _ in range(2):
        result = CliRunner().invoke(cli, ["budget", str(capture)])
        assert result.exit_code != 0 and "no GPU work" in result.output, result.output
    assert not list((cache_dir / "budgets").glob("*.json"))
