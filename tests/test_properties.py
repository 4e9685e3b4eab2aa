"""Property tests (hypothesis) of the readers, the validation, the rule loading and the text cleaning: what holds for
ANY input, not only for the inputs someone thought of. About 11,500 examples in all (EXAMPLES below), derandomized
(the same examples every run), without hypothesis's example database, its home in a temporary folder (nothing is
written beside the tests). Under two minutes on two CPUs.

- a budget of any valid synthetic export (tests/synth.py, the real nsys table layout) has non-negative times and
  closes exactly per device: mean_step_ms == sum(categories) - overlap + idle, within 1e-9;
- the torch-trace reader raises nothing but ProfattrError on arbitrary JSON-ish input (and on arbitrary text);
- the streaming JSON reader raises nothing but JSONStreamError;
- classify never raises on arbitrary names and matches each within a deadline;
- rule loading raises nothing but ProfattrError on arbitrary TOML text, and on arbitrary rule tables;
- a user regex is compiled or refused (ProfattrError), never hangs the check;
- the validation of op arrays keeps only ops that end after they start, inside the capture's range, whatever the
  arrays hold;
- cleaned text holds no control characters.
"""
from __future__ import annotations

import io
import json
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from profattr.errors import ProfattrError
from profattr.trace.protocol import KeyBlocks
from synth import Builder, gpid, gtid

EXAMPLES = {"budget": 250, "trace": 2000, "trace_text": 800, "jsonstream": 1500, "classify": 2000,
            "rules_text": 1200, "rules_tables": 800, "regex": 700, "claims": 1200, "clean": 1000}
BASE = dict(derandomize=True, database=None, suppress_health_check=list(HealthCheck))
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="profattr-hypothesis-"))  # never .hypothesis/ in the worktree


def run_settings(name: str, deadline=None):
    return settings(max_examples=EXAMPLES[name], deadline=deadline, **BASE)


def test_enough_examples():
    assert sum(EXAMPLES.values()) >= 10_000


# --- the budget of any valid export closes ---------------------------------------------------------------------

KERNELS = ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "fused_moe_kernel", "rmsnorm_kernel",
           "_fwd_kernel_stage2", "void at::native::vectorized_elementwise_kernel<4>", "all_reduce_kernel",
           "cutlass_kernel_x", "triton_poi_fused_0"]

op = st.fixed_dictionaries({
    "offset": st.integers(0, 3000),  # launch time inside the step (may lie past its end: outside every step)
    "delay": st.integers(0, 2000),  # launch -> GPU start
    "duration": st.integers(0, 1500),
    "name": st.sampled_from(KERNELS),
    "stream": st.integers(0, 3),
    "device": st.integers(0, 2),
    "memcpy": st.booleans(),
})
step = st.fixed_dictionaries({"gap": st.integers(1, 4000), "length": st.integers(1, 3000),
                              "ops": st.lists(op, min_size=0, max_size=8)})
capture = st.fixed_dictionaries({"threads": st.lists(st.lists(step, min_size=1, max_size=6), min_size=1, max_size=2),
                                 "range_name": st.sampled_from(["decode_step", "forward", "step"])})


def _build(path, spec) -> None:
    b = Builder(path)
    for t_index, steps in enumerate(spec["threads"]):
        tid, pid = gtid(10, 10 + t_index), gpid(10)
        t = 1_000_000 * (t_index + 1)
        for s in steps:
            t += s["gap"]
            b.nvtx(tid, t, t + s["length"], spec["range_name"])
            for o in s["ops"]:
                launch = t + o["offset"]
                corr = b.launch(tid, launch, launch + 5, name="cudaMemcpyAsync_v3020" if o["memcpy"] else
                                "cudaLaunchKernel_v7000")
                start = launch + 5 + o["delay"]
                if o["memcpy"]:
                    b.memcpy(pid, corr, start, start + o["duration"], device=o["device"])
                else:
                    b.kernel(pid, corr, start, start + o["duration"], o["name"], device=o["device"],
                             stream=o["stream"])
            t += s["length"]
    b.close()


@run_settings("budget")
@given(spec=capture)
def test_budget_of_any_valid_export_closes(tmp_path_factory, spec):
    from profattr.attribute.budget import compute_budget

    path = tmp_path_factory.mktemp("synth") / "c.sqlite"
    _build(path, spec)
    try:
        b = compute_budget(path, steps=f"nvtx:{spec['range_name']}").to_dict()
    except ProfattrError as exc:  # only when no op was launched inside a step
        assert "no GPU work" in exc.format_message()
        return
    assert b["devices"]
    assert "skipped_rows" not in b["capture"]  # a valid export has nothing to skip
    for d in b["devices"]:
        cats = sum(c["ms_per_step"] for c in d["categories"])
        assert abs(d["mean_step_ms"] - (cats - d["overlap_ms_per_step"] + d["idle_ms_per_step"])) <= 1e-9
        # exclusive time: the categories' shares of the busy time and idle make the step, shares 100 %
        exclusive = sum(c["exclusive_ms_per_step"] for c in d["categories"])
        assert abs(d["mean_step_ms"] - (exclusive + d["idle_ms_per_step"])) <= 1e-9
        assert abs(sum(c["share"] for c in d["categories"]) + d["idle_share"] - 1.0) <= 1e-9 or not d["mean_step_ms"]
        assert all(-1e-12 <= c["exclusive_ms_per_step"] <= c["ms_per_step"] + 1e-12 for c in d["categories"])
        assert d["step_ms"] >= 0 and d["mean_step_ms"] >= 0 and d["busy_ms_per_step"] >= 0
        assert d["idle_ms_per_step"] >= -1e-9 and d["overlap_ms_per_step"] >= -1e-9
        assert all(c["ms_per_step"] >= 0 and c["count_per_step"] > 0 for c in d["categories"])
        assert all(k["ms_per_step"] >= 0 for k in d["kernels"])
        assert 0.0 <= d["unclassified_share"] <= 1.0


# --- the torch-trace reader ------------------------------------------------------------------------------------

scalar = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
jsonish = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=12)
event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "B", 1, None]),
     "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
                             "user_annotation", "cpu_op", None, 3])},
    optional={"name": st.one_of(st.text(max_size=20), jsonish, st.sampled_from(["cudaGraphLaunch",
                                                                                "cudaLaunchKernel",
                                                                                "ProfilerStep#1",
                                                                                "Memcpy HtoD (Pageable)"])),
              "ts": st.one_of(st.floats(-1e18, 1e18), st.integers(-2 ** 66, 2 ** 66), scalar),
              "dur": st.one_of(st.floats(-1e6, 1e12), st.integers(-10, 10 ** 6), scalar),
              "tid": st.one_of(st.integers(-5, 2 ** 40), scalar), "pid": st.one_of(st.integers(0, 100), scalar),
              "args": st.one_of(st.fixed_dictionaries({}, optional={
                  "device": st.one_of(st.integers(-3, 2 ** 33), scalar),
                  "stream": st.one_of(st.integers(-3, 2 ** 33), scalar),
                  "correlation": st.one_of(st.integers(-3, 2 ** 40), scalar),
                  "grid": st.one_of(st.lists(st.integers(-2, 2 ** 70), max_size=4), jsonish),
                  "block": st.one_of(st.lists(st.integers(-2, 2 ** 31), max_size=4), jsonish)}), jsonish)})
trace_doc = st.one_of(
    st.fixed_dictionaries({"traceEvents": st.lists(event, max_size=25)},
                          optional={"deviceProperties": jsonish, "distributedInfo": jsonish,
                                    "schemaVersion": jsonish, "baseTimeNanoseconds": jsonish}),
    jsonish)


def _read_trace(path) -> None:
    from profattr.trace.kineto import KinetoTrace

    try:
        t = KinetoTrace(path)
    except ProfattrError:
        return
    ops = t.ops()
    assert (ops.end >= ops.start).all()
    t.ops(include_memory=False)
    t.ranges()
    t.graph_launches()
    t.api_calls()
    t.fold_api_keys(KeyBlocks)
    t.kernel_configs()
    t.strings(range(len(t.names)))


@run_settings("trace")
@given(doc=trace_doc)
def test_torch_reader_raises_only_profattr_errors_on_any_json(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("trace") / "t.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    _read_trace(path)


@run_settings("trace_text")
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      st.sampled_from(['{"traceEvents": [', '{"traceEvents": [{"ph": "X"}', '{"a": 1} x',
                                       '{"traceEvents": []}', '{"traceEvents": [{}, 1, "x"]} ', '{]', '{"a"'])))
def test_torch_reader_raises_only_profattr_errors_on_any_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("trace") / "t.json"
    path.write_text("{" + text if not text.startswith(("{", "[")) else text, encoding="utf-8",
                    errors="surrogatepass")
    _read_trace(path)


@run_settings("jsonstream")
@given(text=st.one_of(st.text(max_size=120), jsonish.map(lambda d: json.dumps({"traceEvents": [d], "k": d}))),
       cut=st.integers(0, 200))
def test_json_stream_raises_only_its_error(text, cut):
    from profattr.trace.jsonstream import JSONStreamError, members

    for candidate in (text, text[:cut]):
        try:
            for key, value in members(io.StringIO(candidate), stream="traceEvents"):
                if key == "traceEvents":
                    list(value)
        except JSONStreamError:
            pass


# --- classify and the rules ------------------------------------------------------------------------------------

hostile_text = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Z", "Cc")),
                       max_size=300)
long_text = st.builds(lambda c, n, tail: c * n + tail, st.sampled_from(list("a_x<0: ")), st.integers(0, 20_000),
                      hostile_text)


@pytest.fixture(scope="module")
def shipped():
    from profattr.taxonomy.classify import load_rules

    return load_rules(())


@run_settings("classify", deadline=2000)
@given(name=st.one_of(hostile_text, long_text), ranges=st.lists(st.one_of(hostile_text, long_text), max_size=3))
def test_classify_never_raises_on_any_name(shipped, name, ranges):
    contexts = shipped.contexts_for(ranges)
    category = shipped.classify(name, contexts, short=name[:40])
    assert category == "unclassified" or category in shipped.categories


toml_scalar = st.one_of(st.text(max_size=15), st.integers(-5, 10 ** 6), st.booleans(),
                        st.sampled_from(["norm", "gemm.fp8", "moe.gemm", "nope.cat", "(a+)+$", "rms(norm", "^x",
                                         ".*a.*b", "(?i)moe|experts", "[", "\\d+"]))
rule_table = st.dictionaries(st.sampled_from(["id", "category", "pattern", "nvtx", "family", "source", "evidence",
                                              "priority", "note", "colour"]), toml_scalar, max_size=7)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)  # a TOML basic string is a JSON string for these characters


def _rules_file(tables, categories, priority) -> str:
    lines = [f"priority = {_toml_value(priority)}"] if priority is not None else []
    for c in categories:
        lines += ["[[category]]", f"id = {_toml_value(c)}"]
    for t in tables:
        lines.append("[[rule]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


def _load(tmp_path_factory, text: str | bytes) -> None:
    from profattr.taxonomy.classify import load_rules

    path = tmp_path_factory.mktemp("rules") / "r.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        rs = load_rules([path])
    except ProfattrError:
        return
    rs.classify("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", rs.contexts_for(["model.layers.0.mlp.experts"]))


@run_settings("rules_text", deadline=None)
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=120),
                      st.builds(lambda a, b: a + b, st.sampled_from(["[[rule]]\n", "priority = 3\n",
                                                                     "[[category]]\nid = 'x.y'\n", "rule = 5\n"]),
                                st.text(max_size=100))))
def test_rule_loading_raises_only_profattr_errors_on_any_text(tmp_path_factory, text):
    _load(tmp_path_factory, text)


@run_settings("rules_tables", deadline=None)
@given(tables=st.lists(rule_table, max_size=4), categories=st.lists(st.sampled_from(["x.y", "norm", "Bad!", ""]),
                                                                    max_size=2),
       priority=st.one_of(st.none(), toml_scalar))
def test_rule_loading_raises_only_profattr_errors_on_any_rules(tmp_path_factory, tables, categories, priority):
    _load(tmp_path_factory, _rules_file(tables, categories, priority))


regex_atom = st.one_of(st.sampled_from(list("ab.x_") + ["\\d", "\\w", "\\s", "[a-c]", "[^x]", "(?:a)", "\\b",
                                                          "\\Z"]),
                       st.text(alphabet="ab()[]{}|*+?.^$\\,2", max_size=4))
regex = st.recursive(regex_atom, lambda inner: st.one_of(
    st.builds(lambda a, b: a + b, inner, inner),
    st.builds(lambda a, q: f"(?:{a}){q}", inner,
              st.sampled_from(["*", "+", "?", "{2,}", "{1,3}", "{,2}", "*?", "++"])),
    st.builds(lambda a, b: f"({a}|{b})", inner, inner)), max_leaves=8)


@run_settings("regex", deadline=None)
@given(pattern=regex, texts=st.lists(st.text(alphabet="abx_ 0", max_size=10), max_size=4))
def test_a_user_regex_is_compiled_or_refused(pattern, texts):
    import re
    import warnings

    from profattr.regexguard import MAX_MATCH_CHARS, UserRegex, compile_user

    try:
        rx = compile_user(pattern, "test")
    except ProfattrError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("test: bad regex")
        return
    assert isinstance(rx, UserRegex)
    rx.search("a" * MAX_MATCH_CHARS)  # linear time, whatever the pattern
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # re's FutureWarning on a possible nested set
            python = re.compile(pattern)
    except re.error:
        return
    # on short ASCII texts without a newline, RE2 and Python's re agree (backtracking is cheap on 10 characters)
    assert [rx.search(t) is not None for t in texts] == [python.search(t) is not None for t in texts]


# --- the validation of op arrays ----------------------------------------------------------------------------------

int64 = st.integers(-2 ** 63, 2 ** 63 - 1)
times = st.one_of(int64, st.integers(-10 ** 12, 10 ** 12), st.integers(0, 10 ** 9))


@run_settings("claims")
@given(rows=st.lists(st.tuples(times, times, times, st.integers(0, 2), st.booleans(), st.integers(-1, 5),
                               st.integers(-1, 9)), max_size=30),
       session=st.one_of(st.none(), st.tuples(st.just(0), st.integers(1, 10 ** 12))))
def test_claims_keep_only_plausible_ops(rows, session):
    from profattr.trace.ops import Ops
    from profattr.trace.validate import TIME_LIMIT_NS, Claims

    n = len(rows)
    col = list(zip(*rows)) if rows else [()] * 7
    i64 = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    ops = Ops(start=i64(col[0]), end=i64(col[1]), device=np.array(col[5], dtype=np.int32),
              launch_key=i64(col[6]), name_id=np.zeros(n, dtype=np.int32), demangled_id=np.zeros(n, dtype=np.int32),
              graph_node=np.full(n, -1, dtype=np.int64), stream=np.zeros(n, dtype=np.int32),
              kind=np.array(col[3], dtype=np.int8), launch_tid=np.ones(n, dtype=np.int64), launch_ns=i64(col[2]),
              launched=np.array(col[4], dtype=bool))
    claims = Claims("x", session)
    with np.errstate(all="raise"):  # no overflow anywhere in the checks
        kept = claims.ops(ops)
    lo, hi = claims.window()
    assert -TIME_LIMIT_NS <= lo <= hi <= TIME_LIMIT_NS
    assert (kept.end >= kept.start).all() and (kept.start >= lo).all() and (kept.end <= hi).all()
    assert (kept.device >= 0).all() and (kept.launch_key >= 0).all()
    assert (~kept.launched | ((kept.launch_ns >= lo) & (kept.launch_ns <= hi))).all()
    with np.errstate(all="raise"):
        kept.duration_ns.sum()  # differences of kept times never overflow
    assert len(kept) <= n


# --- cleaned text ----------------------------------------------------------------------------------------------

@run_settings("clean")
@given(value=st.recursive(st.one_of(hostile_text, st.integers(), st.floats(allow_nan=False)),
                          lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(hostile_text, inner, max_size=3)), max_leaves=8))
def test_cleaned_text_has_no_control_characters(value):
    from profattr.text import clean, clean_block, clean_tree

    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, x in v.items():
                yield from strings(k)
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    control = set(chr(c) for c in range(32)) | set(chr(c) for c in range(0x7f, 0xa0))
    for s in strings(clean_tree(value)):
        assert not control & set(s)
    text = json.dumps(value, ensure_ascii=False)
    assert not (control - {"\n"}) & set(clean_block(text).replace("\r\n", "\n"))
    assert not control & set(clean(text))
    assert len(clean(text)) == len(text)  # one character for one: positions in a line stay
