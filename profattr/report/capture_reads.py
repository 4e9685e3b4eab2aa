"""Each capture of a report read once, from one open reader: its budget, launch and idle analysis, timeline steps,
lint findings and (for the capture projected to another GPU) its host cycle; a file named twice read once. With two
or more cores the op stores are built and the captures read in worker processes, a process per core (read_pool.py),
else one after another here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from profattr import progress
from profattr.attribute.budget import ONE_WINDOW, Budget, compute_budget, opened
from profattr.errors import ProfattrError
from profattr.attribute.host_cycle import host_cycle
from profattr.report import read_pool
from profattr.report.launches import launch_stats
from profattr.report.timeline import capture_views
from profattr.report.window_views import window_views
from profattr.run_record import RunRecord, or_empty


@dataclass(frozen=True)
class ReadJob:
    given: str  # the capture as the user named it (the key of mappings and graph twins)
    path: str  # the file read (a replicate group's first member)
    run: Optional[RunRecord]
    steps: str
    rules: tuple  # rule files
    force: bool
    skip_steps: object
    mapping: Optional[str]
    by: str
    defaults: bool  # the report's steps and rules are the defaults (run.json's findings can be shown)
    graph_twin: Optional[str]
    host_cycle: bool  # the capture projected to another GPU: its host cycle too


@dataclass
class CaptureRead:
    budget: Budget  # without its attribution
    launches: list
    timeline: list
    checks: Optional[list]
    checks_source: str
    checks_note: Optional[str]
    host: Optional[dict]


def read_captures(jobs: list, also_stored=()) -> list:
    """A CaptureRead per job, in order. `also_stored`: captures the command reads later (the other replicates of a
    group), whose op stores are built beside the reads. A capture a worker could not read is read here, so its
    error is the one a read in this process meets."""
    unique: list = []
    slot = []
    for job in jobs:
        k = next((i for i, u in enumerate(unique) if _same_read(u, job)), None)
        if k is None:
            unique.append(job)
            k = len(unique) - 1
        slot.append(k)
    reads = read_pool.read_in_workers(unique, also_stored, read_capture)
    for i, job in enumerate(unique):
        if reads[i] is None:
            with progress.stage(f"reading {Path(job.path).name}"):
                reads[i] = read_capture(job)
    return [reads[k] for k in slot]


def _same_read(a: ReadJob, b: ReadJob) -> bool:
    if (a.given, a.mapping, a.graph_twin, a.host_cycle) != (b.given, b.mapping, b.graph_twin, b.host_cycle):
        return False
    try:
        return os.path.samefile(a.path, b.path)
    except OSError:
        return False


def read_capture(job: ReadJob) -> CaptureRead:
    """Everything the report shows of one capture, from one open reader: window by window where the budget was
    computed that way (window_views.py), else from its attribution."""
    from profattr.taxonomy.classify import load_rules

    ruleset = load_rules(list(job.rules))
    host = None
    with opened(job.path, force=job.force) as source:
        budget = compute_budget(source, steps=job.steps, rules=ruleset, force=job.force, keep_attribution=ONE_WINDOW,
                                skip_steps=job.skip_steps, mapping=job.mapping, by=job.by)
        read = window_views(budget, source, ruleset)
        if read is not None:
            launches, views, op_facts = read.launches, read.timeline, read.op_facts
        else:
            launches = launch_stats(budget, source)
            views = capture_views(budget, source=source)  # the median step of each GPU (report/timeline.py)
            op_facts = None
        add_graph_tracing(launches, source, job.graph_twin)
        checks, checks_source, checks_note = lint_findings(Path(budget.path), job.run, source, budget, job.defaults,
                                                           op_facts)
        if job.host_cycle:
            host = host_cycle(source)
    budget.attribution = budget.windowed = None  # no longer needed: the diff needs only the per-step tables
    return CaptureRead(budget, launches, views, checks, checks_source, checks_note, host)


def lint_findings(path: Path, run: Optional[RunRecord], source, budget, defaults: bool = True, op_facts=None):
    """(finding dicts or None, source, note): source `run.json` when the capture recorded `profattr check`'s
    findings and the report's budget is what they were computed on (`defaults`: the default steps, rules and no
    skipped steps, as `profattr capture` checks), `now` when they were computed here (from `source`, the capture's
    open reader, and `budget`, the report's budget of it: the checks count the report's steps and rules; note: why
    not the recorded ones), `none` (with the reason in note) when neither worked. `op_facts`: the facts of the
    capture's ops (check/facts.py OpFacts) where the budget keeps no attribution."""
    recorded = or_empty(run).check_findings
    if defaults and recorded is not None:
        return recorded, "run.json", None
    why = ("run.json's were made on the default steps and rules" if recorded is not None else "run.json records none")
    try:
        from profattr.check.run import evaluate_budget, fresh_server_log, located

        findings = evaluate_budget(source, budget, fresh_server_log(located(path)), op_facts)
    except ProfattrError as exc:
        return None, "none", exc.format_message()
    return [f.to_dict() for f in findings], "now", why


def add_graph_tracing(launches: list, source, twin: Optional[str]) -> None:
    """Each device's launch stats gain `graph_tracing`: how the capture (open as `source`) traced its graph
    replays and, with a graph-level twin, what per-node tracing cost (attribute/graph_launch.py)."""
    from profattr.attribute.graph_launch import costs_of, launch_costs, tracing_cost

    mine = launch_costs(source)
    if mine is None:
        return
    info = {"tracing": mine["tracing"], "launch": mine, "twin": twin, "cost": None}
    if twin is not None:
        theirs = costs_of(Path(twin))
        if theirs is None or theirs["tracing"] != "graph":
            raise ProfattrError(f"--graph-twin {twin}: not a capture whose graph launches were traced at graph level "
                                "(record it with `profattr capture --cuda-graph-trace graph`)")
        info["cost"] = tracing_cost(mine, theirs)
    for s in launches:
        s["graph_tracing"] = info
