"""profattr as a library: open a capture, take its budget, diff, gap, check and report, in a notebook or a script.

Every function here calls the same library code as the CLI command of the same name and returns what that
command's `--format json` prints (as `Result` objects: `.to_dict()`, `.to_json()`, the top-level fields as
attributes); a budget also gives pandas tables (`Budget.to_pandas()`). Bad input raises `ProfattrError` (a plain
Exception) with the CLI's one-line message.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional, Sequence

from profattr.errors import ProfattrError, reset_warnings

NS_PER_MS = 1e6


def _call(fn):
    """A library call: its warnings (ProfattrWarning) are said once per message within the call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        reset_warnings()
        return fn(*args, **kwargs)

    return wrapper


class Result:
    """A versioned JSON result (its `schema` says which) with its top-level fields as attributes."""

    def __init__(self, data):
        self._data = data

    def to_dict(self):
        return self._data

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self._data, indent=indent)

    def __getattr__(self, name):
        data = self.__dict__.get("_data")
        if isinstance(data, dict) and name in data:
            return data[name]
        raise AttributeError(name)

    def __getitem__(self, key):
        return self._data[key]

    def __repr__(self) -> str:
        schema = self._data.get("schema") if isinstance(self._data, dict) else None
        return f"<{type(self).__name__} {schema or ''}>".replace(" >", ">")


class Budget(Result):
    """The per-step budget of one capture (profattr.budget/1); `.result` is attribute/budget.py's Budget."""

    def __init__(self, result):
        super().__init__(result.to_dict())
        self.result = result

    def to_pandas(self) -> dict:
        """{"categories", "kernels", "steps", "step_categories"}: DataFrames, one row per device and category,
        device and kernel, device and step, device, step and category; columns carry their units."""
        import pandas as pd

        cats, kernels = [], []
        for dev in self._data["devices"]:
            cats += [{"device": dev["device"], **row} for row in dev.get("categories", [])]
            kernels += [{"device": dev["device"], **{k: v for k, v in row.items() if k != "shapes"}}
                        for row in dev.get("kernels", [])]
        steps = self.result.per_step.copy() if self.result.per_step is not None else pd.DataFrame()
        if len(steps):
            steps["idle_ns"] = steps["span_ns"] - steps["busy_ns"]
            for col in ("span", "busy", "op", "idle"):
                steps[f"{col}_ms"] = steps[f"{col}_ns"] / NS_PER_MS
        step_cats = self.result.per_step_category
        return {"categories": pd.DataFrame(cats), "kernels": pd.DataFrame(kernels), "steps": steps,
                "step_categories": step_cats.frame() if step_cats is not None else pd.DataFrame()}


class Capture:
    """One capture: an nsys .sqlite / .nsys-rep, a torch-profiler trace or a folder of rank traces; `run` is the
    run.json beside it as a `RunRecord` (typed accessors such as `run.batch`, `run.resolved`; `run.raw` the dict),
    None when there is none."""

    def __init__(self, path):
        from profattr.check.locate import load_run
        from profattr.trace.reader import run_json_path
        from profattr.trace.source import sniff

        self.path = Path(path)
        if not self.path.exists():
            raise ProfattrError(f"{self.path}: no such file or folder; give an nsys export (.sqlite / .nsys-rep), "
                                "a torch-profiler trace or a folder of rank traces")
        kind = sniff(self.path)
        self.format = {"sqlite": "nsys", "nsys-rep": "nsys-rep", "json": "torch", "folder": "torch"}.get(kind)
        if self.format is None:
            raise ProfattrError(f"{self.path}: not an nsys export (.sqlite / .nsys-rep) nor a torch-profiler trace")
        run_path = run_json_path(self.path) if kind != "folder" else None
        self.run_path = run_path if run_path is not None and run_path.is_file() else None
        self.run = load_run(self.run_path) if self.run_path is not None else None

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"Capture({str(self.path)!r}, format={self.format!r})"

    @_call
    def budget(self, steps: str = "auto", rules: Sequence = (), skip_steps=None, by: str = "category",
               layer_range: Optional[str] = None, mapping=None) -> Budget:
        """As `profattr budget CAPTURE --format json` (with the per-step tables for to_pandas)."""
        from profattr.attribute.budget import compute_budget

        return Budget(compute_budget(self.path, steps=steps, rules=rules, skip_steps=skip_steps, by=by,
                                     layer_range=layer_range, mapping=_path(mapping) if mapping else None))

    def check(self, twin=None) -> Result:
        return check(self, twin=twin)

    def gap(self, **options) -> Result:
        return gap(self, **options)


@_call
def open(path) -> Capture:  # noqa: A001 - profattr.open, as a notebook reads it
    """The capture at `path` (nsys .sqlite / .nsys-rep, torch trace, folder of rank traces)."""
    return path if isinstance(path, Capture) else Capture(path)


def _path(item) -> str:
    return str(item.path) if isinstance(item, Capture) else str(item)


def _side(spec):
    """A diff side as attribute/diff.py takes it: a path (or glob), or a list of them (replicates)."""
    if isinstance(spec, (list, tuple)):
        return [_path(x) for x in spec]
    return _path(spec)


@_call
def diff(a, b, steps: str = "auto", rules: Sequence = (), samples: Optional[int] = None,
         changed: Optional[str] = None, min_windows: int = 3, skip_steps=None, by: str = "category",
         layer_range: Optional[str] = None) -> Result:
    """As `profattr diff A B --format json`; `a` and `b` are captures (paths or Capture) or lists of them
    (replicate groups)."""
    from profattr.attribute.diff import BOOTSTRAP_SAMPLES, compute_diff, load_sides

    side_a, side_b = load_sides(_side(a), _side(b), steps, rules, None, None, by, layer_range, skip_steps)
    return Result(compute_diff(side_a, side_b, samples=BOOTSTRAP_SAMPLES if samples is None else samples,
                               changed=changed, min_windows=min_windows))


@_call
def gap(capture, model: Optional[str] = None, hardware: Optional[str] = None, steps: str = "auto",
        rules: Sequence = (), **options) -> Result:
    """As `profattr gap CAPTURE --format json`; options: quant, tp, context_len, run_json, kv_dtype, bandwidth."""
    from profattr.limits.capture_gap import capture_gap

    return Result(capture_gap(_path(capture), model=model, hardware=hardware, steps=steps, rules=rules, **options))


@_call
def check(capture, twin=None) -> Result:
    """As `profattr check CAPTURE --format json`: `status` and `findings`."""
    from profattr.check import to_json
    from profattr.check.run import check_capture

    cap, findings = check_capture(_path(capture), twin=_path(twin) if twin is not None else None)
    return Result(to_json(findings, cap))


@_call
def report(captures, out, force: bool = False, labels: Optional[Sequence[str]] = None, steps: str = "auto",
           rules: Sequence = (), hardware: Optional[str] = None, samples: Optional[int] = None,
           changed: Optional[str] = None, skip_steps=None, layers: bool = False) -> list:
    """As `profattr report CAPTURES -o OUT`: writes OUT/report.md and its charts; returns the paths written."""
    import shlex

    from profattr.attribute.diff import BOOTSTRAP_SAMPLES
    from profattr.report.collect import collect_report
    from profattr.report.write import write_report

    paths = [_path(c) for c in ([captures] if isinstance(captures, (str, Path, Capture)) else captures)]
    if not paths:
        raise ProfattrError("report: give one or more captures")
    data = collect_report(paths, labels=list(labels) if labels else None, steps=steps, skip_steps=skip_steps,
                          rules=rules, hardware=hardware, samples=BOOTSTRAP_SAMPLES if samples is None else samples,
                          changed=changed, layers=layers)
    data.command = " ".join(shlex.quote(a) for a in ["profattr", "report", *paths, "-o", str(out)])
    return write_report(data, Path(out), force=force)


@_call
def classify(names, rules: Sequence = (), nvtx: Sequence[str] = (), torch_ops: Sequence[str] = ()) -> list:
    """As `profattr classify NAMES --format json`: per name {name, category, family, rule, evidence, weight_dtype,
    math}; `nvtx` and `torch_ops` are the launch contexts (enclosing NVTX ranges, launching torch operators)."""
    from profattr.taxonomy.classify import load_rules

    names = [names] if isinstance(names, str) else list(names)
    ruleset = load_rules(rules)
    contexts = ruleset.contexts_for(nvtx) | ruleset.torch_op_contexts(torch_ops)
    out = []
    for name in names:
        decision = ruleset.decide(name, contexts)
        rule = decision.rule
        out.append({"name": name, "category": decision.category, "family": rule.family if rule else None,
                    "rule": rule.id if rule else None, "evidence": decision.evidence,
                    "weight_dtype": (rule.weight_dtype or None) if rule else None,
                    "math": (rule.math or None) if rule else None})
    return out


class Ledger:
    """A campaign ledger (SQLite, `profattr ledger`): add captures, list, show, compare and follow entries."""

    def __init__(self, path=None):
        from profattr.ledger.schema import default_path

        self.path = Path(path) if path is not None else default_path()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    def _read(self, fn):
        from profattr.ledger.schema import open_ledger, sqlite_errors

        db = open_ledger(self.path)
        try:
            with sqlite_errors(self.path):
                return fn(db)
        finally:
            db.close()

    @_call
    def add(self, captures, labels: Optional[Sequence[str]] = None, steps: str = "auto", rules: Sequence = (),
            skip_steps=None) -> list:
        from profattr.ledger.record import add_captures

        items = [captures] if isinstance(captures, (str, Path, Capture)) else list(captures)
        return add_captures(self.path, [Path(_path(c)) for c in items], labels=labels, steps=steps, rules=rules,
                            skip_steps=skip_steps)

    @_call
    def entries(self) -> list:
        from profattr.ledger import query

        return self._read(query.list_rows)

    @_call
    def show(self, entry) -> dict:
        from profattr.ledger import query

        return self._read(lambda db: query.show(db, query.resolve_entry(db, entry, self.path)))

    @_call
    def compare(self, a, b, samples: Optional[int] = None, changed: Optional[str] = None) -> Result:
        from profattr.attribute.diff import BOOTSTRAP_SAMPLES
        from profattr.ledger import query

        n = BOOTSTRAP_SAMPLES if samples is None else samples
        return Result(self._read(lambda db: query.compare(db, self.path, a, b, samples=n, changed=changed)))

    @_call
    def trend(self, metric: str) -> list:
        from profattr.ledger import query

        return self._read(lambda db: query.trend(db, metric, self.path))
