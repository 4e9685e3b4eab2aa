"""Bad input of the formats added after the nsys exports: torch-profiler traces, Nsight Compute CSVs, campaign
ledgers, run.json and the config.json it keeps; and two nsys cases (GPU work outside the recorded session, replayed
graph kernels recorded with correlationId 0). Every damaged or hostile input is built at test time from the REAL
committed files (tests/badinput.py); nothing damaged is committed. Each case runs `profattr` in a child process
with a time limit and checks, as tests/test_bad_input_corpus.py does:

- exit 2 and exactly one stderr line `error: ...` (holding the case's words), or exit 0 with exactly one
  `warning: ...` line (valid but odd) or none (valid);
- no `Traceback` and no `internal error` anywhere;
- every input byte-identical afterwards, and nothing created beside it.
"""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Callable

import pytest

from badinput import (ERROR, OK, WARNING, GLM, KERNEL, REAL_TRACE, RUNTIME, TIME_LIMIT_S, assert_outcome,
                      capture_with_run, cli, copy_export, damaged_ledger, ncu_rows, run_doc, shift_times, snapshot,
                      sql, stderr_lines, trace_doc, write_ncu, write_trace, zero_graph_correlations)



@dataclass
class Case:
    """`build(folder)` makes the inputs in `folder` and returns the command's arguments."""

    id: str
    build: Callable
    expect: str
    needles: tuple = ()
    code: int | None = None


# --- torch traces ------------------------------------------------------------------------------------------------

def trace(transform=None, raw: bytes | None = None, name: str = "t.trace.json.gz", command: str = "budget"):
    """A trace made from the real one (`transform(doc)` returns the new document) or from `raw` bytes."""
    def build(f):
        if raw is not None:  # the bytes as they are (not compressed again)
            return [command, _raw(f, name, raw)]
        return [command, write_trace(f, transform(trace_doc()) if transform else trace_doc(), name)]
    return build


def events(doc, cat, change, every=1):
    """`change(event)` on every `every`-th event of category `cat` (in place); the document."""
    seen = 0
    for e in doc["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") == cat:
            if seen % every == 0:
                change(e)
            seen += 1
    return doc


def first_of(doc, cat, change, n=3):
    """`change(event)` on the first `n` events of category `cat`; the document."""
    hits = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == cat][:n]
    for e in hits:
        change(e)
    return doc


def cut_gzip(fraction):
    data = REAL_TRACE.read_bytes()
    return data[: int(len(data) * fraction)]


def flipped_gzip():
    data = bytearray(REAL_TRACE.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xA5
    return bytes(data)


def trace_folder(second: bytes | None):
    """A folder of two rank files: the real trace as TP-0 and `second` as TP-1."""
    def build(f):
        folder = f / "ranks"
        folder.mkdir()
        (folder / "t-TP-0.trace.json.gz").write_bytes(REAL_TRACE.read_bytes())
        if second is not None:
            (folder / "t-TP-1.trace.json.gz").write_bytes(second)
        return ["budget", folder]
    return build


def without(doc, cats):
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (isinstance(e, dict) and e.get("cat") in cats)]
    return doc


TRACE_CASES = [
    Case("trace-one-byte", trace(raw=b"x"), ERROR, ("not a readable trace", "torch-profiler")),
    Case("trace-not-gzip-text", trace(raw=b"hello, this is not a trace\n"), ERROR,
         ("not a readable trace", "torch-profiler")),
    Case("trace-empty-gz-name", trace(raw=b"", name="t.trace.json.gz"), ERROR, ("the file is empty", "torch")),
    Case("trace-gzip-of-nothing", lambda f: ["budget", _raw(f, "t.trace.json.gz", gzip.compress(b""))], ERROR,
         ("not a readable trace",)),
    Case("trace-gzip-of-binary", lambda f: ["budget", _raw(f, "t.trace.json.gz", gzip.compress(b"\x00\x01\x02\xff"))],
         ERROR, ("not a readable trace",)),
    Case("trace-gzip-cut-in-half", trace(raw=cut_gzip(0.5)), ERROR, ("truncated or damaged gzip",)),
    Case("trace-gzip-bytes-flipped", trace(raw=flipped_gzip()), ERROR, ("gzip",)),
    Case("trace-json-cut", lambda f: ["budget", _raw(f, "t.json", json.dumps(trace_doc()).encode()[:200_000])],
         ERROR, ("not a readable trace", "truncated")),
    Case("trace-array-form", trace(lambda d: d["traceEvents"], name="t.json"), OK),
    Case("trace-array-form-gz", trace(lambda d: d["traceEvents"]), OK),
    Case("trace-array-then-garbage", lambda f: ["budget", _raw(f, "t.json", json.dumps(trace_doc()["traceEvents"])
                                                               .encode() + b" trailing")], ERROR,
         ("text after the array",)),
    Case("trace-top-level-number", trace(raw=b"42", name="t.json"), ERROR, ("not a readable trace",)),
    Case("trace-top-level-string", trace(raw=b'"traceEvents"', name="t.json"), ERROR, ("not a readable trace",)),
    Case("trace-events-an-object", trace(lambda d: {"traceEvents": {"a": 1}}), ERROR, ("expected",)),
    Case("trace-ts-as-text", trace(lambda d: first_of(d, "kernel", lambda e: e.update(ts="soon"))), WARNING,
         ("trace events", "kernel events without the fields")),
    Case("trace-dur-null", trace(lambda d: first_of(d, "kernel", lambda e: e.update(dur=None))), WARNING,
         ("trace events",)),
    Case("trace-correlation-text", trace(lambda d: first_of(d, "kernel", lambda e: e["args"].update(
        correlation="abc"))), WARNING, ("trace events",)),
    Case("trace-ts-nan", lambda f: ["budget", _raw(f, "t.json", json.dumps(
        first_of(trace_doc(), "kernel", lambda e: e.update(ts=float("nan")))).encode())], WARNING, ("trace events",)),
    Case("trace-ts-beyond-64-bits", trace(lambda d: first_of(d, "kernel", lambda e: e.update(ts=1e300))), WARNING,
         ("trace events",)),
    Case("trace-runtime-without-args", trace(lambda d: first_of(d, "cuda_runtime", lambda e: e.pop("args", None))),
         WARNING, ("cuda_runtime events",)),
    Case("trace-every-kernel-damaged", trace(lambda d: events(without(d, ("gpu_memcpy", "gpu_memset")), "kernel",
                                                              lambda e: e.pop("args", None))), ERROR,
         ("every one of its", "GPU events", "damaged")),
    Case("trace-duplicated-events", trace(lambda d: dict(d, traceEvents=d["traceEvents"] * 2)), WARNING,
         ("repeated exactly",)),
    Case("trace-shifted-time-base", trace(lambda d: [_shift(e) for e in d["traceEvents"] if isinstance(e, dict)]
                                          and d), OK),
    Case("trace-no-launch-calls", trace(lambda d: without(d, ("cuda_runtime", "cuda_driver"))), ERROR,
         ("no GPU work in its steps",)),
    Case("trace-device-properties-bogus", trace(lambda d: dict(d, deviceProperties="none")), OK),
    Case("trace-invalid-utf8-in-names", lambda f: ["budget", _raw(f, "t.json", json.dumps(trace_doc()).replace(
        '"name": "', '"name": "\udcff', 5).encode("utf-8", "surrogateescape"))], OK),
    Case("trace-hostile-step-names", trace(lambda d: events(d, "user_annotation", lambda e: e.update(
        name=str(e.get("name")) + "\x1b[2J\r\n"), every=7)), OK),
    Case("trace-folder-empty", lambda f: ["budget", _mkdir(f / "empty")], ERROR, ("no torch-profiler traces",)),
    Case("trace-folder-damaged-rank", trace_folder(b"\x1f\x8b garbage"), ERROR, ("t-TP-1.trace.json.gz",)),
    Case("trace-check-one-byte", trace(raw=b"x", command="check"), ERROR, ("not a readable trace",)),
]


def _shift(e):
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + 3_600_000_000.0  # an hour later, in microseconds


def _raw(folder, name, data: bytes):
    p = folder / name
    p.write_bytes(data)
    return p


def _mkdir(p):
    p.mkdir()
    return p


# --- Nsight Compute CSVs -----------------------------------------------------------------------------------------

def ncu(rows_fn=None, raw_fn=None, with_run=True, run_text=None):
    """drill-report on a CSV made from the real drill's rows (`rows_fn(rows)`) or bytes (`raw_fn(bytes)`)."""
    def build(f):
        rows = ncu_rows()
        if raw_fn is not None:
            raw = raw_fn(write_ncu(f, rows, with_run=False).read_bytes())
            path = write_ncu(f, raw=raw, with_run=with_run, run_text=run_text)
        else:
            path = write_ncu(f, rows_fn(rows) if rows_fn else rows, with_run=with_run, run_text=run_text)
        return ["drill-report", path, "--accept-partial"]
    return build


def cell(column, value, row=3):
    """Rows with `value` in `column` of data row `row` (0: header, 1: units)."""
    def change(rows):
        rows[row][rows[0].index(column)] = value
        return rows
    return change


def drop_columns(*names):
    def change(rows):
        keep = [i for i, n in enumerate(rows[0]) if n not in names]
        return [[r[i] for i in keep] for r in rows]
    return change


def every_row(column, value):
    def change(rows):
        i = rows[0].index(column)
        for r in rows[2:]:
            r[i] = value
        return rows
    return change


DURATION, GRID, DRAM_PCT = "gpu__time_duration.sum", "launch__grid_size", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct")
DRILL_RUN = GLM / "glm-drill-triton.run.json"

NCU_CASES = [
    Case("ncu-byte-order-mark", ncu(raw_fn=lambda b: b"\xef\xbb\xbf" + b), OK),
    Case("ncu-crlf-and-bom", ncu(raw_fn=lambda b: b"\xef\xbb\xbf" + b.replace(b"\n", b"\r\n")), OK),
    Case("ncu-text-in-duration", ncu(cell(DURATION, "fast")), WARNING,
         ("1 of 15 kernel rows left out", "text where a number belongs", DURATION)),
    Case("ncu-text-in-grid", ncu(cell(GRID, "12x")), WARNING, ("left out", GRID)),
    Case("ncu-no-value-in-dram", ncu(cell(DRAM_PCT, "n/a", row=5)), WARNING, ("without a value the verdicts need",)),
    Case("ncu-negative-duration", ncu(cell(DURATION, "-3.5")), WARNING, ("a value out of range",)),
    Case("ncu-zero-sm-count", ncu(cell("device__attribute_multiprocessor_count", "0")), WARNING, ("out of range",)),
    Case("ncu-infinite-value", ncu(cell(DURATION, "inf")), WARNING, ("text where a number belongs",)),
    Case("ncu-row-with-extra-field", ncu(lambda rows: rows[:4] + [rows[4] + ["x"]] + rows[5:]), WARNING,
         ("fields missing or extra",)),
    Case("ncu-id-not-an-integer", ncu(cell("ID", "1.5")), WARNING, ("without a kernel ID",)),
    Case("ncu-empty-kernel-name", ncu(cell("Kernel Name", " ")), WARNING, ("without a kernel name",)),
    Case("ncu-repeated-row", ncu(lambda rows: rows + [rows[3]]), WARNING, ("repeating an earlier row's kernel ID",)),
    Case("ncu-every-row-damaged", ncu(every_row(DURATION, "?")), ERROR, ("none of its 15 kernel rows",)),
    Case("ncu-without-occupancy-section", ncu(drop_columns(*OCCUPANCY)), WARNING,
         ("without the Occupancy section", "occupancy is not reported")),
    Case("ncu-without-a-speedoflight-column", ncu(drop_columns(DURATION)), ERROR, ("lacks the column", DURATION)),
    Case("ncu-no-units-row", ncu(lambda rows: [rows[0]] + rows[2:]), ERROR, ("units row",)),
    Case("ncu-unknown-unit", ncu(cell(DURATION, "parsec", row=1)), ERROR, ("a unit profattr cannot convert",)),
    Case("ncu-header-only", ncu(lambda rows: rows[:1]), ERROR, ("nothing else",)),
    Case("ncu-column-named-twice", ncu(lambda rows: [r + [r[0]] for r in rows]), ERROR, ("twice",)),
    Case("ncu-last-row-cut", ncu(lambda rows: rows[:-1] + [rows[-1][:10]]), ERROR, ("truncated",)),
    Case("ncu-latin1-name", ncu(raw_fn=lambda b: b.replace(b"_w8a8_block_fp8_matmul", b"_w8a8\xe9matmul", 1)), OK),
    Case("ncu-prof-lines-inside", ncu(raw_fn=lambda b: b"==PROF== Connected\n" + b + b"==WARNING== done\n"), OK),
    Case("ncu-nul-bytes", ncu(raw_fn=lambda b: b[:100] + b"\x00\x00" + b[100:]), ERROR, ("binary file",)),
    Case("ncu-run-json-not-json", ncu(run_text="{not json"), ERROR, ("d.run.json", "not a readable run.json")),
    Case("ncu-run-json-wrong-type", ncu(run_text=json.dumps(dict(json.loads(DRILL_RUN.read_text()), drill=dict(
        json.loads(DRILL_RUN.read_text())["drill"], launch_count="48")))), ERROR, ("drill.launch_count",)),
]


# --- ledgers -----------------------------------------------------------------------------------------------------

def ledger(*statements, args=("show", "1")):
    def build(f):
        return ["ledger", *args, "--ledger", damaged_ledger(f, *statements)]
    return build


LEDGER_CASES = [
    Case("ledger-json-cut", ledger("UPDATE entries SET export_gpus = '[{\"id\": 0, '"), ERROR,
         ("entry 1's entries.export_gpus", "not readable JSON", "damaged")),
    Case("ledger-json-of-another-kind", ledger("UPDATE entries SET steps_excluded = '[1, 2]'"), ERROR,
         ("entries.steps_excluded", "not a JSON object")),
    Case("ledger-json-column-a-number", ledger("UPDATE entries SET server_args = 5"), ERROR, ("entries.server_args",)),
    Case("ledger-text-in-step-ms-list", ledger("UPDATE devices SET step_ms = 'fast'", args=("list",)), ERROR,
         ("devices.step_ms", "not a number")),
    Case("ledger-text-in-category-ms", ledger("UPDATE categories SET ms_per_step = 'x' WHERE rowid = 1"), ERROR,
         ("categories.ms_per_step",)),
    Case("ledger-text-in-kernel-count", ledger("UPDATE kernels SET count_per_step = 'many' WHERE rowid = 2"), ERROR,
         ("kernels.count_per_step",)),
    Case("ledger-text-in-batch", ledger("UPDATE entries SET batch = 'four'"), ERROR, ("entries.batch",
                                                                                    "not an integer")),
    Case("ledger-text-in-step-rows", ledger("UPDATE steps SET span_ns = 'long' WHERE rowid = 3",
                                            args=("compare", "1", "1")), ERROR, ("steps rows", "span")),
    Case("ledger-text-in-trend-metric", ledger("UPDATE entries SET ms_per_token_unprofiled = 'quick'",
                                               args=("trend", "ms_per_token")), ERROR, ("ms_per_token",)),
    Case("ledger-float-device", ledger("UPDATE devices SET device = 0.5", args=("list",)), ERROR,
         ("devices.device",)),
    Case("ledger-report-campaign", lambda f: ["report", "--ledger", damaged_ledger(
        f, "UPDATE entries SET comm_summary = '{oops'"), "-o", f.parent / "out"], ERROR, ("entries.comm_summary",)),
]


# --- run.json ----------------------------------------------------------------------------------------------------

def run_json(edit=None, text: str | None = None, command=("gap", "@", "-H", "h200")):
    """`command` (@: the capture) on a copy of the real export with the real run.json, edited, beside it."""
    def build(f):
        run = run_doc()
        if edit is not None:
            edit(run)
        cap = capture_with_run(f, text if text is not None else run)
        return [cap if a == "@" else a for a in command]
    return build


def setting(*path_and_value):
    *path, value = path_and_value

    def edit(run):
        node = run
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


RUN_CASES = [
    Case("run-batch-as-text", run_json(setting("requests", "batch", "4")), ERROR,
         ("capture.run.json", "requests.batch", '"4"', "a positive integer")),
    Case("run-batch-zero", run_json(setting("requests", "batch", 0)), ERROR, ("requests.batch", "0")),
    Case("run-batch-negative", run_json(setting("requests", "batch", -2)), ERROR, ("requests.batch",)),
    Case("run-batch-fractional", run_json(setting("requests", "batch", 4.5)), ERROR, ("requests.batch",)),
    Case("run-batch-boolean", run_json(setting("requests", "batch", True)), ERROR, ("requests.batch", "true")),
    Case("run-tp-as-text", run_json(setting("tp", "8")), ERROR, ("field tp",)),
    Case("run-tp-zero", run_json(setting("tp", 0)), ERROR, ("field tp",)),
    Case("run-input-len-negative", run_json(setting("requests", "input_len", -64)), ERROR, ("requests.input_len",)),
    Case("run-requests-a-list", run_json(setting("requests", [1, 2])), ERROR, ("field requests", "a JSON object")),
    Case("run-model-config-text", run_json(setting("model_config", "glm5")), ERROR, ("model_config",)),
    Case("run-timing-negative", run_json(setting("timing", "ms_per_token_unprofiled", -3.1)), ERROR,
         ("timing.ms_per_token_unprofiled",)),
    Case("run-server-args-text", run_json(setting("server", "args", "--tp 8")), ERROR, ("server.args",)),
    Case("run-schema-foreign", run_json(setting("schema", "other.tool/1")), ERROR, ("not a profattr run file",)),
    Case("run-cut", run_json(text=json.dumps(run_doc())[:5000]), ERROR, ("not a readable run.json",)),
    Case("run-nested-too-deep", run_json(text='{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"), ERROR,
         ("not a readable run.json",)),
    Case("run-undecodable-bytes-in-text", lambda f: ["gap", _run_bytes(f), "-H", "h200"], OK),
    Case("run-batch-text-check", run_json(setting("requests", "batch", "1"), command=("check", "@")), ERROR,
         ("requests.batch",)),
    Case("run-batch-text-diff", lambda f: ["diff", copy_export(f / "a"), run_json(
        setting("requests", "batch", "1"), command=("@",))(f)[0]], ERROR, ("requests.batch",)),
    Case("run-batch-text-ledger-add", lambda f: ["ledger", "add", run_json(setting("requests", "batch", "x"),
                                                                         command=("@",))(f)[0],
                                                 "--ledger", f / "new.db"], ERROR, ("requests.batch",)),
    Case("run-batch-text-report", lambda f: ["report", run_json(setting("requests", "batch", "2"), command=("@",))(f)[0],
                                             "-o", f.parent / "out"], ERROR, ("requests.batch",)),
    Case("run-workload-batch-text", run_json(setting("workload", {"schema": "profattr.workload/1", "batch": "1"})),
         ERROR, ("workload.batch",)),
]


def _run_bytes(folder):
    cap = capture_with_run(folder, run_doc())
    run = folder / "capture.run.json"
    run.write_bytes(run.read_bytes().replace(b'"complete"', b'"compl\xff\xfete"', 1))
    return cap


# --- config.json -------------------------------------------------------------------------------------------------

def config_in_run(**changes):
    """gap on a capture whose run.json keeps the real GLM config.json with `changes` (None: remove the field)."""
    def edit(run):
        for k, v in changes.items():
            if v is None:
                run["model_config"].pop(k, None)
            else:
                run["model_config"][k] = v
    return run_json(edit)


def config_file(config_fn, quant="fp8"):
    """limit --model CONFIG.json (a copy of the real GLM config.json, changed by `config_fn`)."""
    def build(f):
        config = config_fn(dict(run_doc()["model_config"]))
        p = f / "config.json"
        p.write_text(json.dumps(config))
        return ["limit", "--model", p, "--quant", quant, "-H", "h200"]
    return build


def llama(**changes):
    """A llama-style config (GQA) with `changes`."""
    base = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    return config_file(lambda _: {**base, **changes}, quant="bf16")


CONFIG_CASES = [
    Case("config-hidden-negative", config_in_run(hidden_size=-6144), ERROR,
         ("model_config", "hidden_size is -6144", "a positive integer")),
    Case("config-hidden-zero-file", config_file(lambda c: dict(c, hidden_size=0)), ERROR,
         ("config.json", "hidden_size is 0")),
    Case("config-heads-zero", config_in_run(num_attention_heads=0), ERROR, ("num_attention_heads is 0",)),
    Case("config-layers-as-text", config_in_run(num_hidden_layers="6"), ERROR,
         ("num_hidden_layers is \"6\"", "an integer")),
    Case("config-kv-heads-do-not-divide", config_in_run(num_key_value_heads=7), ERROR, ("not a multiple",)),
    Case("config-top-k-above-experts", config_in_run(num_experts_per_tok=300), ERROR, ("more than the 256",)),
    Case("config-vocab-boolean", config_in_run(vocab_size=True), ERROR, ("vocab_size is true",)),
    Case("config-experts-negative", config_in_run(n_routed_experts=-1), ERROR, ("n_routed_experts is -1",)),
    Case("config-lora-rank-fractional", config_in_run(kv_lora_rank=511.5), ERROR, ("kv_lora_rank is 511.5",)),
    Case("config-model-type-number", config_file(lambda c: dict(c, model_type=5)), ERROR, ("model_type",)),
    Case("config-not-an-object", config_file(lambda c: [c]), ERROR, ("expected a JSON object",)),
    Case("config-gqa-head-dim-zero", llama(head_dim=0), ERROR, ("head_dim is 0",)),
    Case("config-gqa-hidden-not-split", llama(hidden_size=4000, num_attention_heads=48, num_key_value_heads=8),
         ERROR, ("not split evenly",)),
    Case("config-mlp-only-layers-text", llama(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                                              moe_intermediate_size=768, mlp_only_layers="0,1"), ERROR,
         ("mlp_only_layers",)),
    Case("config-tied-embeddings-text", llama(tie_word_embeddings="yes"), ERROR, ("tie_word_embeddings",)),
    Case("config-widths-written-with-a-point", config_file(lambda c: dict(c, hidden_size=6144.0)), OK),
]


# --- nsys: GPU work outside the recorded session, graph kernels without a correlationId ---------------------------

def shifted(delta_ns):
    def build(f):
        return ["budget", shift_times(copy_export(f), delta_ns)]
    return build


def zero_correlations(*statements):
    def build(f):
        cap = copy_export(f)
        zero_graph_correlations(cap)
        return ["budget", sql(cap, *statements) if statements else cap]
    return build


NSYS_CASES = [
    Case("nsys-work-two-days-after-the-session", shifted(2 * 86_400 * 10 ** 9), WARNING,
         ("outside the session nsys recorded",)),
    Case("nsys-work-beyond-any-capture", shifted(2 ** 62), ERROR, ("times no capture holds",)),
    Case("nsys-replays-with-correlation-zero", zero_correlations(), OK),
    Case("nsys-replays-with-correlation-zero-launch-lost", zero_correlations(
        f"DELETE FROM {RUNTIME} WHERE rowid = (SELECT r.rowid FROM {RUNTIME} AS r JOIN StringIds AS s ON s.id = "
        "r.nameId WHERE s.value LIKE 'cudaGraphLaunch%' ORDER BY r.start LIMIT 1 OFFSET 5)"), WARNING,
         ("correlationId 0", "not", "profattr check")),
]

CASES = TRACE_CASES + NCU_CASES + LEDGER_CASES + RUN_CASES + CONFIG_CASES + NSYS_CASES


def test_the_round_two_corpus_is_large_enough():
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
    kinds = {c.id.split("-")[0] for c in CASES}
    assert {"trace", "ncu", "ledger", "run", "config"} <= kinds


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_round2(tmp_path, case):
    folder = tmp_path / "in"
    folder.mkdir()
    argv = case.build(folder)
    before = snapshot(folder)
    proc = cli(*argv, cwd=folder, timeout=TIME_LIMIT_S)
    assert_outcome(proc, case.expect, case.needles, case.code)
    assert snapshot(folder) == before, "an input changed, or something was created beside it"


# --- what the readers make of the odd-but-valid inputs: checked against the real files themselves ---------------

from badinput import REAL_EXPORT, REAL_NCU  # noqa: E402
from independent import expected_graph  # noqa: E402
from test_budget_real import compare  # noqa: E402


def _budget_json(*argv, env=None) -> dict:
    proc = cli("budget", *argv, "--format", "json", env={"PROFATTR_NO_CACHE": "1", **(env or {})})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("by", ["category", "layer"])  # the op store's windows, and the whole-array reader
def test_replayed_kernels_recorded_with_correlation_zero_reach_their_steps(tmp_path, by):
    cap = copy_export(tmp_path)
    zeroed = zero_graph_correlations(cap)
    left = sqlite3.connect(cap).execute(f"SELECT count(*) FROM {KERNEL} WHERE correlationId = 0").fetchone()[0]
    assert zeroed == left == 2660  # every replayed kernel lost its id
    extra = ["--by", "layer"] if by == "layer" else []
    compare(_budget_json(cap, *extra, env={"PROFATTR_WINDOW_OPS": "500"}), expected_graph(REAL_EXPORT))


def test_check_names_replays_that_cannot_be_linked(tmp_path):
    cap = copy_export(tmp_path)
    zeroed = zero_graph_correlations(cap)
    proc = cli("check", cap, "--format", "json")
    findings = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    assert findings["graph_replay_ids"]["status"] == "pass"
    assert findings["graph_replay_ids"]["data"]["linked"] == zeroed
    sql(cap, f"DELETE FROM {RUNTIME} WHERE rowid = (SELECT r.rowid FROM {RUNTIME} AS r JOIN StringIds AS s ON "
             "s.id = r.nameId WHERE s.value LIKE 'cudaGraphLaunch%' ORDER BY r.start LIMIT 1 OFFSET 5)")
    proc = cli("check", cap, "--format", "json")
    found = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}["graph_replay_ids"]
    assert found["status"] == "fail" and found["data"]["unlinked"] == zeroed and found["data"]["linked"] == 0
    assert "19 replays but 18 cudaGraphLaunch calls" in found["message"]


def test_work_outside_the_session_is_said_and_budgeted_as_recorded(tmp_path):
    cap = shift_times(copy_export(tmp_path), 2 * 86_400 * 10 ** 9)
    duration = sqlite3.connect(REAL_EXPORT).execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    proc = cli("budget", cap, "--format", "json", env={"PROFATTR_NO_CACHE": "1"})
    assert f"ANALYSIS_DETAILS: 0..{duration} ns" in stderr_lines(proc)[0]
    compare(json.loads(proc.stdout), expected_graph(REAL_EXPORT))


def test_a_trace_in_array_form_or_repeated_gives_the_object_forms_budget(tmp_path):
    doc = trace_doc()
    gpu_events = sum(1 for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
                     and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    whole = _budget_json(write_trace(tmp_path / "a", doc))
    array = _budget_json(write_trace(tmp_path / "b", doc["traceEvents"], name="t.json"))
    twice = _budget_json(write_trace(tmp_path / "c", dict(doc, traceEvents=doc["traceEvents"] * 2)))
    assert array["devices"] == whole["devices"] and twice["devices"] == whole["devices"]
    repeated = twice["capture"]["skipped_rows"]["trace events"]
    assert repeated["GPU events repeated exactly (the same event twice)"] == gpu_events


def _drill(path) -> dict:
    proc = cli("drill-report", path, "--format", "json", "--accept-partial")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout)


def _expected_verdict(row: dict) -> str:
    """The verdict of one launch from its CSV numbers (the thresholds README states: 60% of peak, 0.5 waves)."""
    dram = float(row["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"])
    sm = float(row["sm__throughput.avg.pct_of_peak_sustained_elapsed"])
    mem = float(row["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"])
    waves = float(row["launch__waves_per_multiprocessor"])
    if max(dram, mem) >= 60 and max(dram, mem) >= sm:
        return "memory_bound"
    if sm >= 60:
        return "compute_bound"
    return "too_few_ctas" if waves < 0.5 else "latency_bound"


def test_ncu_csv_without_occupancy_or_with_a_bom_keeps_every_verdict(tmp_path):
    rows = ncu_rows()
    by_id = {r[0]: dict(zip(rows[0], r)) for r in rows[2:]}
    bom = write_ncu(tmp_path / "bom", raw=b"\xef\xbb\xbf" + REAL_NCU.read_bytes())
    keep = [i for i, n in enumerate(rows[0]) if n not in OCCUPANCY]
    bare = write_ncu(tmp_path / "bare", [[r[i] for i in keep] for r in rows])
    for path, occupancy in ((bom, True), (bare, False)):
        kernels = _drill(path)["kernels"]
        assert sorted(str(k["id"]) for k in kernels) == sorted(by_id)
        for k in kernels:
            assert k["verdict"]["kind"] == _expected_verdict(by_id[str(k["id"])])
            expected = float(by_id[str(k["id"])][OCCUPANCY[0]]) if occupancy else None
            assert k["achieved_occupancy_pct"] == expected


def test_ncu_damaged_row_is_left_out_and_counted(tmp_path):
    rows = ncu_rows()
    damaged_id = rows[4][0]
    rows[4][rows[0].index(DURATION)] = "12,5 us"
    analysis = _drill(write_ncu(tmp_path, rows))
    assert analysis["drill"]["skipped_rows"] == {"with text where a number belongs": 1}
    assert sorted(str(k["id"]) for k in analysis["kernels"]) == sorted(r[0] for r in rows[2:] if r[0] != damaged_id)
