"""One measure of unprofiled decode: the server's own decode log lines give the time of a decode step at the
window's batch, which is what a capture's step measures; and a representative workload (distinct prompts).

Expected figures are parsed in the test from the logs themselves (a server log committed with the GLM captures, and
the log the stub server writes), never taken from profattr's output.
"""
from __future__ import annotations

import gzip
import json
import shutil
import statistics
from pathlib import Path

import pytest

from profattr.engines import serverlog
from profattr.capture.sglang import Requests

from test_capture import events_of, free_port, invoke, real_nsys, stub_args, stub_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "h200"


def decode_steps_by_hand(text: str, batch: int) -> list:
    """ms per step of SGLang's decode lines at `batch` requests that follow another decode line (a line after a
    prefill covers the prefill too): split by hand, no regex."""
    out, previous = [], None
    for line in text.splitlines():
        if "Decode batch" in line:
            fields = dict(part.strip().split(": ", 1) for part in line.split("Decode batch,", 1)[1].split(", ")
                          if ": " in part)
            running = int(fields["#running-req"])
            rate = float(fields["gen throughput (token/s)"])
            if previous == running == batch:
                out.append(1000.0 * running / rate)
            previous = running
        elif "Prefill batch" in line:
            previous = None
    return out


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_decode_lines_of_a_committed_server_log_give_the_step(batch):
    log = EXAMPLES / "glm5" / "glm-triton.server.log.gz"
    expected = decode_steps_by_hand(gzip.decompress(log.read_bytes()).decode(), batch)
    got = serverlog.unprofiled_steps(log, batch)
    assert got["lines"] == len(expected) and len(expected) >= 3
    assert got["ms_per_step"] == pytest.approx(statistics.median(expected), rel=1e-12)
    assert got["min_ms"] == pytest.approx(min(expected)) and got["max_ms"] == pytest.approx(max(expected))
    assert "no timing span" in got["lines_from"]


def test_a_span_of_the_log_limits_the_lines(tmp_path):
    text = gzip.decompress((EXAMPLES / "glm5" / "glm-triton.server.log.gz").read_bytes())
    cut = text.index(b"Decode batch, #running-req: 4")
    log = tmp_path / "s.log"
    log.write_bytes(text)
    before = serverlog.unprofiled_steps(log, 1, [0, cut])
    assert before["lines"] == len(decode_steps_by_hand(text[:cut].decode(), 1))
    assert serverlog.unprofiled_steps(log, 4, [0, cut]) is None  # no batch-4 line before the cut
    assert before["lines_from"] == "the unprofiled timing rounds"


def test_random_prompts_are_distinct_per_request_and_round_and_reproducible():
    r = Requests("random", 64, 16, seed=3)
    first, second = r.bodies(4), r.bodies(4)
    ids = [tuple(b["input_ids"]) for b in first + second]
    assert len(set(ids)) == 8 and all(len(i) == 64 for i in ids)
    again = Requests("random", 64, 16, seed=3)
    assert [b["input_ids"] for b in again.bodies(4)] == [b["input_ids"] for b in first]
    assert [b["input_ids"] for b in Requests("random", 64, 16, seed=4).bodies(4)] != [b["input_ids"] for b in first]
    same = Requests("same", 64, 16).bodies(3)
    assert len({tuple(b["input_ids"]) for b in same}) == 1
    assert r.describe()["prompts"] == "random" and Requests("same", 8, 4).describe()["prompts"] == "same"
    with pytest.raises(ValueError):
        Requests("sometimes", 8, 4)


@pytest.mark.nsys
def test_stub_capture_records_the_unprofiled_step_from_the_servers_decode_lines(tmp_path):
    real_nsys()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    events = tmp_path / "events.jsonl"
    args = stub_args(tmp_path, model, free_port(), name="ds", max_new_tokens=24, trials=3)
    args += ["--decode-log-interval", "2"]
    result = invoke(args, env=stub_env(events))
    assert result.exit_code in (0, 1), result.output
    run = json.loads((tmp_path / "ds.run.json").read_text())
    assert run["requests"]["prompts"] == "random"
    timing = run["timing"]
    lo, hi = timing["log_span_bytes"]
    raw = (tmp_path / "ds.log").read_bytes()[lo:hi].decode()
    expected = decode_steps_by_hand(raw, run["requests"]["batch"])
    assert len(expected) >= 3
    step = timing["unprofiled_step"]
    assert step["lines"] == len(expected) and step["lines_from"] == "the unprofiled timing rounds"
    assert step["ms_per_step"] == pytest.approx(statistics.median(expected), rel=1e-12)
    assert step["ms_per_step"] >= 4.0  # the stub sleeps STEP_MS = 4 ms per unprofiled step
    generated = [e for e in events_of(events) if e["event"] == "generate"]
    assert len({e["prompt_key"] for e in generated}) == len(generated)  # every request its own prompt


def _overhead(path: Path) -> dict:
    from click.testing import CliRunner

    from profattr.cli import cli

    result = CliRunner().invoke(cli, ["check", str(path), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    return next(f for f in json.loads(result.output)["findings"] if f["check"] == "overhead")


def test_overhead_fails_where_the_capture_step_is_shorter_than_the_unprofiled_step(tmp_path, export_example):
    """NVFP4 batch 4, first window: the capture's median step (SQL, graph steps) against the server's own decode
    lines of the timing rounds (parsed here): the capture's steps leave out host time between steps."""
    from independent import expected_graph

    name = "glm5-nvfp4/glm-nvfp4-bs4-r1"
    path = export_example(name)
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    lo, hi = run["timing"]["log_span_bytes"]
    log = gzip.decompress((EXAMPLES / "glm5-nvfp4" / run["files"]["log"]).read_bytes())[lo:hi].decode()
    unprofiled = statistics.median(decode_steps_by_hand(log, 4))
    profiled = max(d["step_ms"] for d in expected_graph(path).values())
    assert profiled < 0.8 * unprofiled  # what the capture shows: 2.2 ms steps against 3.0 ms unprofiled
    f = _overhead(path)
    assert f["status"] == "fail" and "shorter than decode steps" in f["message"]
    assert f["data"]["ms_per_step_unprofiled"] == pytest.approx(unprofiled, rel=1e-9)
    assert f["data"]["ms_per_step_profiled"] == pytest.approx(profiled, rel=1e-6)


def test_committed_fp8_batch4_capture_disagrees_with_its_servers_decode_lines(tmp_path, export_example):
    """The round-two batch-4 capture passed the overhead check against the streamed ms/token; its server's decode
    lines (every line at batch 4: the capture recorded no timing span) say a decode step took longer than the
    capture's steps."""
    from independent import expected_graph

    name = "glm5/glm-triton-bs4-r1"
    src = export_example(name)
    folder = tmp_path / "cap"
    folder.mkdir()
    shutil.copyfile(src, folder / src.name)
    run = json.loads((EXAMPLES / f"{name}.run.json").read_text())
    log = EXAMPLES / "glm5" / run["files"]["log"]
    shutil.copyfile(log, folder / log.name)
    steps = decode_steps_by_hand(gzip.decompress(log.read_bytes()).decode(), 4)
    run["timing"]["unprofiled_step"] = serverlog.unprofiled_steps(log, 4)
    (folder / f"{src.stem}.run.json").write_text(json.dumps(run))
    profiled = max(d["step_ms"] for d in expected_graph(src).values())
    assert profiled < statistics.median(steps)
    f = _overhead(folder / src.name)
    assert f["status"] == "fail" and f["data"]["ms_per_step_unprofiled"] == pytest.approx(statistics.median(steps))
