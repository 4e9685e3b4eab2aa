"""RunRecord (profattr/run_record/record.py): every accessor against the committed run.json files parsed here with
json, with fields missing, and the rule that no reader outside run_record/ digs into a run.json dict itself."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import EXAMPLES
from profattr import run_record
from profattr.errors import ProfattrError
from profattr.run_record import RunRecord, or_empty
from profattr.run_record.record import _Field

ROOT = Path(__file__).resolve().parent.parent
# accessor -> (dotted field of run.json, the type of a recorded value, the default when it is not recorded)
SCALARS = {
    "schema": ("schema", str), "name": ("name", str), "status": ("status", str), "target": ("target", str),
    "profiler": ("profiler", str), "created_utc": ("created_utc", str), "model": ("model", str), "tp": ("tp", int),
    "driver_version": ("driver_version", str), "profiler_version": ("profiler_version", str),
    "capture_trace": ("capture.trace", str), "capture_range": ("capture.capture_range", str),
    "cuda_graph_trace": ("capture.cuda_graph_trace", str), "nsys_version": ("nsys.version", str),
    "ncu_version": ("ncu.version", str), "backend_requested": ("backend.requested", str),
    "backend_sglang": ("backend.sglang", str), "server_port": ("server.port", int),
    "log_source": ("server_log.source", str), "batch": ("requests.batch", int),
    "input_len": ("requests.input_len", int), "max_new_tokens": ("requests.max_new_tokens", int),
    "steps_requested": ("window.steps_requested", int),
    "ms_per_token_unprofiled": ("timing.ms_per_token_unprofiled", (int, float)),
    "ms_per_token_profiled": ("timing.ms_per_token_profiled", (int, float)),
    "ms_per_token_profiled_client": ("timing.ms_per_token_profiled_client", (int, float)),
    "profiled_source": ("timing.profiled_source", str), "cuda_driver_version": ("timing.cuda_driver_version", int),
    "workload_batch": ("workload.batch", int), "moe_impl": ("workload.moe_impl", str),
    "log_file": ("files.log", str), "sqlite_file": ("files.sqlite", str), "drill_of": ("drill.of", str),
    "drill_kernel_regex": ("drill.kernel_regex", str), "drill_kernel_base": ("drill.kernel_base", str),
    "drill_launch_count": ("drill.launch_count", int), "drill_steps": ("drill.steps", int),
    "drill_graphs": ("drill.graphs", str), "session_name": ("session.name", str),
    "graph_batch_sizes": ("server_log.cuda_graph.batch_sizes", list), "log_span_bytes": ("timing.log_span_bytes", list),
}
DICTS = {
    "commands": "commands", "packages": "packages", "host": "host", "backend": "backend",
    "model_config": "model_config", "server_log": "server_log", "logged_server_args": "server_log.server_args",
    "resolved": "server_log.resolved", "cuda_graph": "server_log.cuda_graph", "log_counts": "server_log.counts",
    "log_in_window": "server_log.in_window", "loaded_quant": "server_log.loaded_quant", "requests": "requests",
    "window": "window", "timing": "timing", "unprofiled_step": "timing.unprofiled_step", "workload": "workload",
    "files": "files", "drill": "drill", "session": "session",
}
LISTS = {"notes": "notes", "profile_command": "commands.profile", "server_args": "server.args",
         "server_launcher": "server.launcher", "default_kernel_configs": "server_log.default_kernel_configs",
         "trace_files": "files.traces"}
# computed accessors, each checked by a test of its own below
COMPUTED = {"gpus", "drill_families", "check_findings", "server_attached", "server_flags", "profiler_used",
            "graph_captured_in_window"}

# one of each kind of committed capture: SGLang (nsys), a drill (ncu), an attached server (torch), the workload
KINDS = ["glm5/glm-triton-bs1-r1", "glm5/glm-drill-triton", "glm5-attach/glm-attach-bs1-r1", "wl-eager-grouped",
         "sglang-triton-bs1", "glm5-nvfp4/glm-nvfp4-rnd-bs4-r2"]


def parsed(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.run.json").read_text())


def dig(data, field: str):
    for part in field.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_the_tables_name_every_accessor():
    fields = {n for n, v in vars(RunRecord).items() if isinstance(v, (_Field, property)) and not n.startswith("_")}
    assert fields == set(SCALARS) | set(DICTS) | set(LISTS) | COMPUTED


@pytest.mark.parametrize("name", KINDS)
def test_accessors_read_the_committed_run_json(name):
    data = parsed(name)
    run = run_record.load(EXAMPLES / f"{name}.run.json")
    assert run.raw == data and run.path == EXAMPLES / f"{name}.run.json"
    for attr, (field, kind) in SCALARS.items():
        value = dig(data, field)
        got = getattr(run, attr)
        if value is None:
            assert got is None, attr
        else:
            assert got == value and isinstance(got, kind), attr
    for attr, field in DICTS.items():
        value = dig(data, field)
        assert getattr(run, attr) == (value if isinstance(value, dict) else {}), attr
    for attr, field in LISTS.items():
        value = dig(data, field)
        assert getattr(run, attr) == (value if isinstance(value, list) else []), attr
    assert run.gpus == [g for g in data.get("gpus") or [] if isinstance(g, dict)]
    assert run.server_attached is ((data.get("server") or {}).get("attached") is True)
    assert run.profiler_used == (data.get("profiler") or "nsys")
    findings = (data.get("check") or {}).get("findings")
    assert run.check_findings == findings


def test_the_committed_files_cover_what_the_accessors_read():
    # the real files hold a value for most accessors (a table entry no file has would test only the default)
    datas = [parsed(n) for n in KINDS]
    empty = [a for a, (f, _) in SCALARS.items() if all(dig(d, f) is None for d in datas)]
    assert set(empty) <= {"profiler_version", "cuda_driver_version", "session_name", "log_source", "sqlite_file",
                          "steps_requested", "profiled_source"}, empty


def test_a_run_json_with_fields_missing_reads_the_defaults(tmp_path):
    data = parsed("glm5/glm-triton-bs1-r1")
    for field in ("requests", "timing", "server_log", "backend", "gpus", "model", "tp", "check", "capture"):
        del data[field]
    data["server"] = None  # null reads as absent
    path = tmp_path / "x.run.json"
    path.write_text(json.dumps(data))
    run = run_record.load(path)
    for empty in (run, RunRecord({}), or_empty(None)):
        for attr, (field, _) in SCALARS.items():
            if dig(data, field) is None or empty is not run:
                assert getattr(empty, attr) is None, attr
        for attr, field in DICTS.items():
            if dig(data, field) is None or empty is not run:
                assert getattr(empty, attr) == {} and isinstance(getattr(empty, attr), dict), attr
        for attr, field in LISTS.items():
            if dig(data, field) is None or empty is not run:
                assert getattr(empty, attr) == [] and isinstance(getattr(empty, attr), list), attr
        assert empty.gpus == [] and empty.check_findings is None and empty.server_attached is False
        assert empty.server_flags == {} and empty.server_flag("--tp") is None and empty.log_events("error") == []
    assert run.name == data["name"] and run.drill == {}  # what is there still reads
    assert not RunRecord({}) and run and not or_empty(None)


def test_a_default_is_a_fresh_object():
    a, b = RunRecord({}), RunRecord({})
    a.resolved["x"] = 1  # a caller that writes into a default changes no other record
    assert b.resolved == {} and a.resolved == {}


def test_server_flags_and_events_on_the_committed_drill():
    data = parsed("glm5/glm-drill-triton")
    run = RunRecord(data)
    argv = [str(a) for a in data["server"]["args"]]
    i = argv.index("--tp") if "--tp" in argv else None
    assert run.server_flag("--tp") == (argv[i + 1] if i is not None else None)
    flags = run.server_flags
    assert all(not k.startswith("-") and "-" not in k for k in flags)
    for k, v in flags.items():
        flag = "--" + k.replace("_", "-")
        assert flag in argv or any(a.startswith(flag + "=") for a in argv)
        if v is not True:
            assert run.server_flag(flag) == v
    for kind in ("error", "fallback", "jit_compile", "default_kernel_config"):
        assert run.log_events(kind) == ((data.get("server_log") or {}).get("events") or {}).get(kind, [])
    assert run.drill_families == data["drill"]["families"]
    assert [e["text"] for e in run.log_events("error")]  # the committed drills' logs hold ncu's errors


def test_flags_with_and_without_values():
    run = RunRecord({"server": {"args": ["--tp", "2", "--disable-cuda-graph", "--kv-cache-dtype=fp8_e4m3", "x"]}})
    assert run.server_flags == {"tp": "2", "disable_cuda_graph": True, "kv_cache_dtype": "fp8_e4m3"}
    assert run.server_flag("--kv-cache-dtype") == "fp8_e4m3" and run.server_flag("--tp") == "2"
    assert run.server_flag("--disable-cuda-graph") == "--kv-cache-dtype=fp8_e4m3"  # the next word, as SGLang reads it


def test_unvalidated_fields_of_another_type_read_as_not_recorded():
    run = RunRecord({"host": "linux", "gpus": [1, {"index": 0}], "profiler_version": 2,
                     "server": {"attached": "yes"}, "check": {"findings": [1, {"check": "x"}]},
                     "server_log": {"events": {"error": "boom"}}, "drill": {"families": [1, {"names": ["k"]}]}})
    assert run.host == {} and run.gpus == [{"index": 0}] and run.profiler_version is None
    assert run.drill_families == [{"names": ["k"]}]
    assert run.server_attached is False and run.check_findings == [{"check": "x"}] and run.log_events("error") == []


def test_recorded_passes_a_field_through_and_replaced_copies():
    data = parsed("glm5-attach/glm-attach-bs1-r1")
    run = RunRecord(data)
    assert run.recorded("backend") == data.get("backend") and run.recorded("server.args") == data["server"]["args"]
    assert RunRecord({}).recorded("backend") is None
    with pytest.raises(KeyError):
        run.recorded("host")  # not a validated field: nothing unchecked passes through
    fresh = run.replaced(server_log={"resolved": {"moe_runner_backend": "x"}})
    assert fresh.resolved == {"moe_runner_backend": "x"} and run.raw["server_log"] == data["server_log"]
    assert run.has("server_log") and not RunRecord({"workload": None}).has("workload")


def test_load_returns_a_record_and_refuses_a_wrong_kind(tmp_path):
    data = parsed("glm5/glm-triton-bs1-r1")
    data["requests"]["batch"] = "4"
    path = tmp_path / "bad.run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfattrError, match="field requests.batch"):
        run_record.load(path)
    assert run_record.optional(tmp_path / "none.run.json") is None
    assert isinstance(run_record.optional(EXAMPLES / "wl-eager-grouped.run.json"), RunRecord)


# --- no reader digs into run.json itself ----------------------------------------------------------------------------
# capture/ builds and writes run.json (a dict); run_record/ is the one reader
WRITERS = ("profattr/run_record/", "profattr/capture/")
RUN_NAMES = {"run", "run_a", "run_b", "capture_run"}  # what the readers call a run.json


def _is_run(node) -> bool:
    """`run`, `x.run`, `(run or {})`, `(x.run or {})`: an expression that names a run.json."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_run(node.values[0])
    return (isinstance(node, ast.Name) and node.id in RUN_NAMES) or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "run")


def raw_reads(tree) -> list:
    """(line, text) of each `.get(...)`, string subscript, `or {}` or `.raw` on an expression naming a run."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _is_run(node.func.value):
            out.append(node)
        elif isinstance(node, ast.Subscript) and _is_run(node.value) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            out.append(node)
        elif isinstance(node, ast.BoolOp) and _is_run(node.values[0]) and isinstance(node.values[-1], ast.Dict):
            out.append(node)
        elif isinstance(node, ast.Attribute) and node.attr == "raw" and _is_run(node.value):
            out.append(node)
    return [(n.lineno, ast.unparse(n)) for n in out]


def test_the_scan_finds_raw_reads():
    found = raw_reads(ast.parse('a = run.get("x")\nb = (cap.run or {}).get("y")\nc = run["z"]\nd = run[:-1]\n'
                                'e = run or {}\nf = cap.run.raw\ng = run.batch\n'))
    assert sorted(line for line, _ in found) == [1, 2, 2, 3, 5, 6]


def test_no_reader_outside_run_record_digs_into_run_json():
    found = []
    for path in sorted((ROOT / "profattr").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(WRITERS):
            continue
        found += [f"{rel}:{line}: {text}" for line, text in raw_reads(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "read run.json through RunRecord's accessors:\n" + "\n".join(found)


def test_the_readers_take_a_record():
    # the modules that read run.json import the type (a reader that still took a dict would not need it)
    readers = ["report/collect.py", "report/md_details.py", "report/why_slow.py", "report/bottlenecks.py",
               "attribute/confounds.py", "attribute/variance.py", "attribute/diff.py", "attribute/diff_stats.py",
               "attribute/kernel_bounds.py", "check/backend.py", "check/completeness.py", "check/recording.py",
               "check/timing.py", "check/locate.py", "check/run.py", "limits/served.py", "limits/workload.py",
               "limits/kernel_floor.py", "ledger/record.py", "trace/ncu_csv.py"]
    for rel in readers:
        text = (ROOT / "profattr" / rel).read_text(encoding="utf-8")
        assert "from profattr.run_record import" in text, rel

