"""Everything `profattr report` shows, gathered per capture: budget, launches, lint findings, gap, and the diffs
of every capture against the first. The renderers (markdown.py, charts.py) take the result and compute nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from profattr.attribute.diff import BOOTSTRAP_SAMPLES, Side, compute_diff, expand, group, load_side
from profattr.errors import ProfattrError
from profattr.report import why_slow
from profattr.report.bottlenecks import rank_bottlenecks
from profattr.report.budget_view import exclusive_ms
from profattr.report.capture_reads import ReadJob, read_captures
from profattr.run_record import RunRecord, or_empty
from profattr.taxonomy.classify import load_rules

# rules about kernels of other GPU generations or FP4 formats: the part of the taxonomy these captures cannot test
OTHER_HARDWARE = re.compile(r"sm_?1[0-2]\d|sm1[0-2]x|fp4|e2m1|nvf4|blockscaled|b12x", re.IGNORECASE)


@dataclass
class CaptureReport:
    label: str
    path: str  # as the user gave it
    budget: dict  # profattr.budget/1
    launches: list  # report.launches.launch_stats
    run: Optional[RunRecord] = None
    run_path: Optional[str] = None
    run_note: Optional[str] = None
    checks: Optional[list] = None  # finding dicts: check, status, message
    checks_source: str = "none"  # run.json | now | none
    checks_note: Optional[str] = None  # why there are none (an error message), or why they were computed now
    gap: Optional[dict] = None  # profattr.gap/1
    gap_note: Optional[str] = None  # why there is no gap (plain text, unescaped)
    side: Optional[Side] = field(default=None, repr=False)
    why_slow: dict = field(default_factory=dict)  # category -> sentence from this capture's ncu drills
    timeline: Optional[list] = field(default=None, repr=False)  # report.timeline.step_view per GPU (median step)

    def as_input(self) -> dict:
        """The plain structure bottlenecks.py and charts.py take."""
        return {"label": self.label, "budget": self.budget, "launches": self.launches, "gap": self.gap,
                "why_slow": self.why_slow, "run": self.run}


@dataclass
class ReportData:
    captures: list
    diffs: list  # {"a": label, "b": label, "diff": profattr.diff/1}
    bottlenecks: list
    evidence: dict
    command: str = ""
    hardware: Optional[str] = None
    charts: dict = field(default_factory=dict)  # role -> file name inside the output folder
    campaign: Optional[list] = None  # ledger entries for the Campaign section (report/campaign.py), with --ledger
    campaign_ledger: Optional[str] = None  # the ledger's path, as given
    drills: list = field(default_factory=list)  # why_slow.collect_drills entries
    sweep: list = field(default_factory=list)  # batch_sweep rows, when the captures decode several batch sizes
    out_dir: Optional[str] = None  # the report's folder, while write_report writes it (the sections' own charts)
    projection: Optional[dict] = None  # profattr.project/1 of the first capture, with report --to


def default_labels(names: Sequence[str]) -> list:
    """Short labels: the capture names without the `-`-separated words they all share at the start and end."""
    if len(names) < 2:
        return list(names)
    words = [n.split("-") for n in names]
    head = 0
    while all(len(w) > head + 1 for w in words) and len({w[head] for w in words}) == 1:
        head += 1
    tail = 0
    while (all(len(w) > head + tail + 1 for w in words)
           and len({w[len(w) - 1 - tail] for w in words}) == 1):
        tail += 1
    labels = ["-".join(w[head:len(w) - tail]) for w in words]
    return labels if len(set(labels)) == len(labels) and all(labels) else list(names)


def capture_name(path: Path, run: Optional[RunRecord]) -> str:
    if run and run.name:
        return run.name
    name = path.name
    for suffix in (".sqlite", ".nsys-rep", ".qdrep"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def group_name(cap: "CaptureReport") -> str:
    """The name of a replicate group: what its members' names share, without a trailing replicate number."""
    import os

    names = [capture_name(Path(m.path), m.run) for m in cap.side.members]
    common = os.path.commonprefix(names)
    return re.sub(r"[-_.]*r?\d*$", "", common) or names[0]


def read_run(path: Path):
    """(RunRecord or None, run.json path shown, note)."""
    from profattr import run_record
    from profattr.trace.reader import run_json_path

    run, run_path = run_record.beside(path)  # one there that cannot be trusted is an error
    if run is None:
        return None, None, (f"no {run_json_path(path).name} beside the capture: commands, versions and lint are "
                            "unknown")
    return run, str(run_path), None


def capture_gap(budget: dict, run: Optional[RunRecord], run_path: Optional[str], hardware: Optional[str]):
    """(gap dict or None, note) for a capture whose run.json records the built-in workload's spec or the served
    model's config.json (limits/served.py); its GPUs are those the budget read (the export's TARGET_INFO_GPU, a
    torch trace's deviceProperties)."""
    workload = or_empty(run).has("workload")
    served = bool(or_empty(run).model_config)
    if not workload and not served:
        why = ("no run.json" if run is None else
               "run.json records neither the built-in workload nor the served model's config.json")
        return None, f"skipped: {why}"
    from profattr.limits.gap import budget_gpus, compute_gap
    from profattr.limits.hardware import load_hardware, match_hardware
    from profattr.limits.served import spec_from_run
    from profattr.limits.workload import spec_from_workload

    gpus = budget_gpus(budget)
    names = [str(g.get("name") or "") for g in gpus.values()] or [
        str(d.get("name") or "") for d in or_empty(run).gpus]
    hw_id = hardware
    if hw_id is None:
        matched = {match_hardware(n) for n in names}
        if len(matched) != 1 or None in matched:
            return None, "skipped: cannot tell the hardware from the capture's GPU names; pass --hardware"
        hw_id = matched.pop()
    source = Path(run_path).name if run_path else "run.json"
    try:
        hw = load_hardware(hw_id)
        if workload:
            spec = spec_from_workload(run.workload, source=source)
        else:
            spec = spec_from_run(run, source=source, tp=None, context_len=None, kv_dtype=None, dsa_runs=hw.dsa_runs)
        gap = compute_gap(budget, spec, hw, capture_gpus=gpus)
        _add_lm_head(gap, budget, spec)
        return gap, None
    except ProfattrError as exc:
        return None, f"skipped: {exc.format_message()}"


def _add_lm_head(gap: dict, budget: dict, spec) -> None:
    """Each gap device's `lm_head`: the logits projection's launch shape and its own efficiency against its weight
    bytes (limits/kernel_floor.py lm_head_rows), where the budget has that shape."""
    from profattr.limits.kernel_floor import lm_head_rows

    for d in gap.get("devices") or []:
        rows = lm_head_rows({"devices": [x for x in budget["devices"] if x["device"] == d["device"]]}, spec,
                            float(d.get("memory_bandwidth_bytes_per_s") or 0.0))
        if d["device"] in rows:
            d["lm_head"] = rows[d["device"]]


def evidence_summary(captures: Sequence[CaptureReport], rules: Sequence = ()) -> dict:
    """Which taxonomy rules classified these captures (by evidence, weighted by GPU time), and which matched nothing
    here (their names come from sources only), among them the rules for other GPU generations or FP4 kernels."""
    ruleset = load_rules(rules)
    hit: dict = {}
    by_id = {r.id: r for r in ruleset.rules}  # with the inventories' rules (inventory.LIBRARY) that hit
    for cap in captures:
        for d in cap.budget["devices"]:
            for k in d["kernels"]:
                if k["category"] == "unclassified":
                    continue
                rule = _rule_for(ruleset, k)
                if rule is not None:
                    hit[rule.id] = hit.get(rule.id, 0.0) + k["ms_per_step"]
                    by_id.setdefault(rule.id, rule)
    ms_by_evidence: dict = {}
    for rule_id, ms in hit.items():
        ev = by_id[rule_id].evidence
        ms_by_evidence[ev] = ms_by_evidence.get(ev, 0.0) + ms
    unmatched = [r for r in ruleset.rules if r.id not in hit and not r.user]
    other_hw = [r for r in unmatched if OTHER_HARDWARE.search(f"{r.id} {r.pattern}")]
    count_by_evidence: dict = {}
    for r in unmatched:
        count_by_evidence[r.evidence] = count_by_evidence.get(r.evidence, 0) + 1
    return {
        "rules_total": len(ruleset.rules),
        "rules_hit": sorted(hit),
        "hit_by_evidence": {ev: sum(1 for i in hit if by_id[i].evidence == ev) for ev in
                            sorted({by_id[i].evidence for i in hit})},
        "ms_by_evidence": ms_by_evidence,
        "unmatched_rules": len(unmatched),
        "unmatched_by_evidence": count_by_evidence,
        "other_hardware_rules": len(other_hw),
        "other_hardware_examples": [r.id for r in other_hw[:6]],
    }


def _rule_for(ruleset, kernel: dict):
    """The rule that gave a budget kernel its category: plain first, then under each NVTX context."""
    names = (kernel.get("demangled") or kernel["name"], kernel["name"])
    for contexts in [frozenset()] + [frozenset([p]) for p in ruleset.context_patterns]:
        rule = ruleset.match(names[0], contexts, short=names[1])
        if rule is not None and rule.category == kernel["category"]:
            return rule
    return None


def collect_report(paths: Sequence, labels: Optional[Sequence[str]] = None, steps: str = "auto",
                   rules: Sequence = (), hardware: Optional[str] = None, samples: int = BOOTSTRAP_SAMPLES,
                   changed: Optional[str] = None, force_export: bool = False,
                   mappings: Optional[dict] = None, skip_steps=None, drills: Sequence = (),
                   layers: bool = False, graph_twins: Optional[dict] = None,
                   project_to: Optional[dict] = None) -> ReportData:
    """Budgets, launch stats, lint findings and gaps of every capture; diffs of each against the first; the ranked
    bottlenecks; the taxonomy evidence. Captures are .sqlite exports or .nsys-rep reports; `mappings` gives a
    capture (as passed) an eager twin that lends NVTX context to its replayed graph kernels; `drills` names ncu
    drill CSVs (paths, or (capture as passed, path)) beyond those found beside the captures; `layers` breaks every
    capture down by model layer (captures with a mapping always are); `graph_twins` gives a capture (as passed) a
    twin traced at graph level (--cuda-graph-trace graph), against which its graph launches' cost is set.
    `project_to`: project_capture's options (to, tp, layers): the first capture projected to that GPU from the
    report's own budget of it (the `projection`)."""
    if labels is not None and len(labels) != len(paths):
        raise ProfattrError(f"--labels gives {len(labels)} label(s) for {len(paths)} capture(s); give one per capture")
    captures, projection = [], None
    load_rules(rules)  # a bad rule file fails here, before any capture is read
    # the checks `profattr capture` recorded were computed on the default steps and rules: shown only then
    defaults = steps == "auto" and not rules and skip_steps in (None, 0, "0")
    contexts, jobs = [], []
    for given in paths:
        path = Path(given)
        run, run_path, run_note = read_run(path)
        mapping = (mappings or {}).get(given)
        members = expand(given)  # a glob names replicate captures of one configuration: one column of the report
        if len(members) > 1:
            path = Path(members[0])
            run, run_path, run_note = read_run(path)
        by = "layer" if mapping or layers else "category"
        contexts.append((given, path, run, run_path, run_note, mapping, members, by))
        jobs.append(ReadJob(given=str(given), path=str(path), run=run, steps=steps, rules=tuple(rules),
                            force=force_export, skip_steps=skip_steps, mapping=mapping, by=by, defaults=defaults,
                            graph_twin=(graph_twins or {}).get(given),
                            host_cycle=project_to is not None and not jobs))  # the first capture, with --to
    # the other replicates' stores are built beside the reads (--force exports them again first: not beforehand)
    reads = read_captures(jobs, also_stored=[] if force_export else [m for g in paths for m in expand(g)[1:]])
    for (given, path, run, run_path, run_note, mapping, members, by), job, read in zip(contexts, jobs, reads):
        budget = read.budget
        data = budget.to_dict()
        if job.host_cycle:  # from the report's own budget of it: not opened again
            from profattr.limits.projection import project_capture

            projection = project_capture(path, measured=(data, read.host), **project_to)
        side = Side(str(path), data, budget.per_step, budget.per_step_category, run)
        side.per_step_comm = budget.per_step_comm  # per-step collective waits (several GPUs)
        if len(members) > 1:
            rest = [load_side(m, steps=steps, rules=rules, mapping=mapping, by=by, skip_steps=skip_steps)
                    for m in members[1:]]
            side = group([side] + rest)
            data = side.budget
            run_note = (f"{len(members)} replicates ({', '.join(Path(m).name for m in members)}): budgets, gap and "
                        f"diffs are their mean, with intervals over replicates and steps; launches, checks and run "
                        f"metadata are of the first")
        gap, gap_note = capture_gap(data, run, run_path, hardware)
        captures.append(CaptureReport(label="", path=str(given), budget=data, launches=read.launches, run=run,
                                      run_path=run_path, run_note=run_note, checks=read.checks,
                                      checks_source=read.checks_source, checks_note=read.checks_note, gap=gap,
                                      gap_note=gap_note, side=side, timeline=read.timeline))
    names = list(labels) if labels is not None else default_labels(
        [group_name(c) if c.side is not None and len(c.side.members) > 1 else capture_name(Path(c.path), c.run)
         for c in captures])
    if len(set(names)) != len(names):
        raise ProfattrError(f"labels must differ from each other (got {', '.join(names)}); pass --labels")
    for cap, name in zip(captures, names):
        cap.label = name
    diffs = []
    for i, cap in enumerate(captures[1:], 1):
        first = baseline_of(captures[:i], cap)
        if first is None:
            continue  # the first capture of its batch size: the batch sweep compares it
        diff = compute_diff(first.side, cap.side, samples=samples, changed=changed or _changed(first, cap))
        diffs.append({"a": first.label, "b": cap.label, "diff": diff,
                      "a_modes": {s["device"]: s["mode"] for s in first.launches},
                      "b_modes": {s["device"]: s["mode"] for s in cap.launches},
                      "a_unprofiled_ms_per_token": unprofiled_ms(first.run),
                      "b_unprofiled_ms_per_token": unprofiled_ms(cap.run)})
    drill_entries = why_slow.collect_drills(captures, drills, rules)
    sentences = why_slow.category_sentences(drill_entries)
    for cap in captures:
        cap.why_slow = sentences.get(cap.label, {})
    bottlenecks = rank_bottlenecks([c.as_input() for c in captures], diffs)
    return ReportData(captures=captures, diffs=diffs, bottlenecks=bottlenecks,
                      evidence=evidence_summary(captures, rules), hardware=hardware, drills=drill_entries,
                      sweep=batch_sweep(captures), projection=projection)


def batch_of(cap: CaptureReport) -> Optional[int]:
    """Sequences decoded per step, as run.json recorded the requests (or the built-in workload its batch)."""
    run = or_empty(cap.run)
    return run.batch or run.workload_batch


def baseline_of(earlier: Sequence[CaptureReport], cap: CaptureReport) -> Optional[CaptureReport]:
    """What `cap` is compared with: the first capture, or where batch sizes differ, the first capture of the same
    batch (None when `cap` is the first of its batch: a step of another batch does other work)."""
    batch = batch_of(cap)
    if batch is None or batch_of(earlier[0]) in (None, batch):
        return earlier[0]
    return next((c for c in earlier if batch_of(c) == batch), None)


def batch_sweep(captures: Sequence[CaptureReport]) -> list:
    """Rows of the batch sweep (when the captures decode more than one batch size): per capture and GPU, the step,
    the GPU time per generated token and tokens per second, largest categories."""
    if len({batch_of(c) for c in captures} - {None}) < 2:
        return []
    rows = []
    for cap in captures:
        batch = batch_of(cap)
        for d in cap.budget["devices"]:
            step = float(d.get("mean_step_ms") or 0.0)
            rows.append({"label": cap.label, "device": d["device"], "batch": batch,
                         "backend": or_empty(cap.run).backend_sglang or or_empty(cap.run).backend_requested,
                         "fp8_gemm_backend": or_empty(cap.run).resolved.get("fp8_gemm_runner_backend"),
                         "median_step_ms": d.get("step_ms"), "mean_step_ms": step,
                         "ms_per_token": step / batch if batch and step else None,
                         "tokens_per_s": 1e3 * batch / step if batch and step else None,
                         "unprofiled_ms_per_step": unprofiled_ms(cap.run),
                         "categories": {c["category"]: exclusive_ms(c) for c in d["categories"]}})
    return rows


def unprofiled_ms(run: Optional[RunRecord]) -> Optional[float]:
    """ms per token measured without the profiler (run.json `timing`), or None."""
    value = or_empty(run).ms_per_token_unprofiled
    return float(value) if value is not None else None


def _changed(a: CaptureReport, b: CaptureReport) -> Optional[str]:
    """`moe` when the two built-in workload captures ran different MoE implementations; else the diff decides."""
    ra, rb = or_empty(a.run), or_empty(b.run)
    if ra.has("workload") and rb.has("workload") and ra.moe_impl != rb.moe_impl:
        return "moe"
    return None
