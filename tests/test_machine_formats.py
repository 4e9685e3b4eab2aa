"""Machine formats are lossless: `budget --format json` and `csv` carry kernel names exactly as the export holds
them (JSON escapes control characters, CSV quotes); the table and markdown stay one clean line per row."""
from __future__ import annotations

import csv
import io
import json

from click.testing import CliRunner

from profattr.cli import cli
from synth import Builder, gpid, gtid

HOSTILE = 'gemm "fast"\nkernel\x1b[31m, v2'


def _capture(path):
    b = Builder(path)
    t, p = gtid(10), gpid(10)
    for i in range(3):
        c = b.launch(t, 1000 + i * 1000, 1010 + i * 1000)
        b.kernel(p, c, 1050 + i * 1000, 1080 + i * 1000, HOSTILE)
    b.nvtx(t, 900, 4000, "decode_step")
    return b.close()


def _budget(cap, fmt):
    r = CliRunner().invoke(cli, ["budget", str(cap), "--format", fmt, "--steps", "nvtx:decode_step"])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_json_carries_the_name_exactly(tmp_path):
    text = _budget(_capture(tmp_path / "h.sqlite"), "json")
    assert "\x1b" not in text and "\\u001b" in text  # escaped by JSON, not replaced
    kernels = json.loads(text)["devices"][0]["kernels"]
    assert [k["demangled"] for k in kernels] == [HOSTILE]
    assert kernels[0]["count_per_step"] == 3.0  # the 3 launches inside the one decode_step range


def test_csv_carries_the_name_exactly(tmp_path):
    rows = list(csv.DictReader(io.StringIO(_budget(_capture(tmp_path / "h.sqlite"), "csv"))))
    names = [r["name"] for r in rows if r["row"] == "kernel"]
    assert names == [HOSTILE]


def test_table_and_markdown_stay_clean(tmp_path):
    cap = _capture(tmp_path / "h.sqlite")
    for fmt in ("table", "markdown"):
        text = _budget(cap, fmt)
        assert "\x1b" not in text, fmt
        assert any('gemm "fast"' in line and "kernel" in line for line in text.splitlines()), fmt  # one line
