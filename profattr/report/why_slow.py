"""The report section "Why the top kernels are slow", and `profattr drill-report`: what Nsight Compute drills of the
step's top kernels (`profattr drill`, NAME.ncu.csv) say about each kernel family, next to the capture's budget and
the floor bytes of each kernel's category.

Gathering (`analyse_csv`, `collect_drills`) reads the CSV, takes each kernel's category from the capture's budget
(else the taxonomy), the floor bytes from the model its run.json recorded, and calls
`attribute.kernel_bounds.analyse_drill`. Rendering (`render_table`, `render_markdown`, `section`) computes nothing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from profattr.attribute.kernel_bounds import analyse_drill
from profattr.attribute.kernel_families import shape_key
from profattr.attribute.kernel_verdict import THRESHOLDS
from profattr.errors import ProfattrError
from profattr.limits import kernel_floor
from profattr.run_record import RunRecord, or_empty
from profattr.text import md_escape, md_name
from profattr.text import clean_tree
from profattr.taxonomy.classify import load_rules
from profattr.trace.ncu_csv import load_drill_run, read_ncu_csv

TITLE = "## Why the top kernels are slow"


# --- gathering -------------------------------------------------------------------------------------------------------

def _device(budget: Optional[dict]) -> Optional[dict]:
    devices = (budget or {}).get("devices") or []
    return max(devices, key=lambda d: d["step_ms"]) if devices else None


def kernel_labels(ncu, budget: Optional[dict], rules: Sequence = ()) -> tuple:
    """({CSV kernel name: category}, {name: taxonomy family}, {name: {ms_per_step, count_per_step} in the capture},
    how, {kernel_families.shape_key: {ms_per_step, count_per_step} in the capture}): the capture's own classification of the same kernel (same short name; it carries the NVTX context rules)
    where the budget has it, else the taxonomy's."""
    ruleset = load_rules(rules)
    device = _device(budget)
    seen, ambiguous = {}, set()
    for k in (device or {}).get("kernels") or []:
        first = seen.setdefault(k["name"], k)
        if first["category"] != k["category"]:
            ambiguous.add(k["name"])  # one short name, several kernels (dense and expert Marlin): by full name
    for name in ambiguous:
        del seen[name]
    # the capture's launches of each kernel per launch shape (budget kernels[].shapes), to match drilled families
    by_shape: dict = {}
    for k in (device or {}).get("kernels") or []:
        for s in k.get("shapes") or []:
            if s.get("shape"):
                key = shape_key(k["name"], s["shape"]["grid"], s["shape"]["block"], s["shape"]["registers_per_thread"])
                acc = by_shape.setdefault(key, {"ms_per_step": 0.0, "count_per_step": 0.0, "gemm": []})
                acc["ms_per_step"] += s["ms_per_step"]
                acc["count_per_step"] += s["count_per_step"]
                if s["shape"].get("gemm"):  # the GEMMs (M, N, K) the capture ran with this shape
                    acc["gemm"].append(s["shape"]["gemm"])
    categories, families, in_capture = {}, {}, {}
    for k in ncu.kernels:
        if k.name in categories:
            continue
        mine = seen.get(k.short_name)
        if mine is not None:
            categories[k.name], families[k.name] = mine["category"], mine.get("family")
            in_capture[k.name] = {"ms_per_step": mine["ms_per_step"], "count_per_step": mine["count_per_step"]}
        else:
            rule = ruleset.match(k.name, short=k.short_name)
            categories[k.name] = rule.category if rule else "unclassified"
            families[k.name] = rule.family if rule else None
    n, m = len(in_capture), len(categories)
    how = ("kernel names classified by the taxonomy (no capture budget given)" if not budget else
           f"all {m} kernel names classified as in the capture's budget" if n == m else
           f"{n} of {m} kernel names classified as in the capture's budget, the rest by the taxonomy")
    return categories, families, in_capture, how, by_shape


def analyse_csv(path, budget: Optional[dict] = None, capture_run: Optional[RunRecord] = None, rules: Sequence = ()):
    """`kernel_bounds.DrillAnalysis` of one NAME.ncu.csv. `budget`: the capture it belongs to (profattr.budget/1),
    for categories and measured ms per step; `capture_run`: that capture's run.json, for the model when the drill's
    own run.json records none."""
    ncu = read_ncu_csv(path)
    categories, families, in_capture, how, in_capture_shapes = kernel_labels(ncu, budget, rules)
    spec, spec_how = kernel_floor.spec_for_run(ncu.run)
    if spec is None and capture_run is not None:
        spec, spec_how = kernel_floor.spec_for_run(capture_run)
    floors, assumptions = {}, [how]
    if spec is not None:
        rows = kernel_floor.weight_bytes(spec)
        floors = {cat: kernel_floor.category_floor(cat, rows) for cat in set(categories.values())}
        assumptions.append(f"floor bytes: {kernel_floor.ASSUMPTION}; model: {spec_how}")
    else:
        assumptions.append(f"no floor bytes: {spec_how}")
    measured = {}
    device = _device(budget)
    for c in (device or {}).get("categories") or []:
        measured[c["category"]] = c["ms_per_step"]
    return analyse_drill(ncu, categories, families, floors, measured, assumptions, in_capture, in_capture_shapes)


def drill_run_of(csv_path: Path) -> Optional[RunRecord]:
    """The RunRecord of the drill's run.json beside the CSV, or None."""
    return load_drill_run(csv_path)[0]


def discover(capture_path: Path, name: str) -> list:
    """NAME-drill*.ncu.csv beside the capture, and any *.ncu.csv there whose run.json says it drilled NAME."""
    folder = capture_path.parent
    found = sorted(folder.glob(f"{name}-drill*.ncu.csv"))
    for csv_path in sorted(folder.glob("*.ncu.csv")):
        if csv_path in found:
            continue
        if or_empty(drill_run_of(csv_path)).drill_of == f"{name}.run.json":
            found.append(csv_path)
    return found


def _attach(csv_path: Path, captures: list) -> tuple:
    """(capture, how) a --drill CSV belongs to: the capture its run.json names, else the one capture of the report,
    else the capture with the same SGLang MoE backend and model."""
    run = or_empty(drill_run_of(csv_path))
    of = run.drill_of
    for cap in captures:
        if of and of in (f"{_name(cap)}.run.json", Path(cap.run_path or "").name):
            return cap, f"drill of {of}"
    if len(captures) == 1:
        return captures[0], (f"drill of {of}, the report's one capture" if of else "the report's one capture")
    backend = run.backend_sglang
    same = [c for c in captures if backend and or_empty(c.run).backend_sglang == backend
            and or_empty(c.run).model == run.model]
    if len(same) == 1:
        return same[0], f"drill of {of or '?'}, attached by its model and MoE backend ({backend})"
    raise ProfattrError(f"--drill {csv_path}: cannot tell which capture it belongs to (its run.json names "
                        f"{of or 'none'}); give it as --drill CAPTURE={csv_path}")


def _name(cap) -> str:
    """The capture's name, as collect.capture_name gives it."""
    if cap.run and cap.run.name:
        return cap.run.name
    name = Path(cap.path).name
    for suffix in (".sqlite", ".nsys-rep"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def collect_drills(captures: list, drills: Sequence = (), rules: Sequence = ()) -> list:
    """Entries {label, csv, attached, analysis (profattr.drill/1) | None, note} for the drills of the report's
    captures: those found beside each capture, and `drills` (CSV paths, or (capture as given, CSV path)). A drill
    the user named must read; one found beside a capture that does not is listed with the reason."""
    entries, taken = [], set()
    named = []
    for item in drills:
        given, csv_path = item if isinstance(item, tuple) else (None, item)
        csv_path = Path(csv_path)
        if not csv_path.is_file():
            raise ProfattrError(f"--drill {csv_path}: no such file")
        if given is not None:
            match = [c for c in captures if given in (c.path, Path(c.path).name)]
            if len(match) != 1:
                raise ProfattrError(f"--drill {given}={csv_path}: {given} is not one of the report's captures")
            named.append((match[0], csv_path, "named with --drill"))
        else:
            cap, how = _attach(csv_path, captures)
            named.append((cap, csv_path, how + " (--drill)"))
    found = [(cap, p, "found beside the capture") for cap in captures for p in discover(Path(cap.path), _name(cap))]
    for cap, csv_path, how in named + found:
        key = csv_path.resolve()
        if key in taken:
            continue
        taken.add(key)
        entry = {"label": cap.label, "csv": str(csv_path), "attached": how, "analysis": None, "note": None}
        try:
            entry["analysis"] = analyse_csv(csv_path, cap.budget, cap.run, rules).to_dict()
            graphs = entry["analysis"]["drill"].get("graphs") or ""
            modes = {s.get("mode") for s in cap.launches or []}
            if graphs.startswith("eager") and "graph" in modes:
                entry["attached"] += ("; the drill ran eager while this capture replays CUDA graphs: the same kernels, "
                                      "launched one by one")
        except ProfattrError as exc:
            if (cap, csv_path, how) in named:
                raise
            entry["note"] = exc.format_message()
        entries.append(entry)
    return entries


def category_sentences(entries: list) -> dict:
    """{capture label: {category: one sentence from its drills}} for the ranked bottleneck list: per category, the
    kernel name with the most profiled time speaks for it."""
    out: dict = {}
    for e in entries:
        if e.get("analysis"):
            by_cat = out.setdefault(e["label"], {})
            # the kernel with the most time in the capture (else in the drill) speaks for its category
            names = sorted(e["analysis"]["names"], key=lambda n: -(n.get("capture_ms_per_step") or 0.0))
            for n in names:
                by_cat.setdefault(n["category"], f"ncu drill {Path(e['csv']).name}: {n['sentence']}")
    return out


# --- rendering -------------------------------------------------------------------------------------------------------

def _us(ns: float) -> str:
    return f"{ns / 1e3:.1f}"


def _range(stats: Optional[dict], fmt: str, scale: float = 1.0) -> str:
    if stats is None:  # not collected (a section the report lacks)
        return "n/a"
    lo, mid, hi = (format(stats[k] * scale, fmt) for k in ("min", "median", "max"))
    return mid if lo == hi else f"{mid} ({lo}-{hi})"


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _grid(v) -> str:
    return "x".join(str(x) for x in v)


def family_rows(a: dict) -> list:
    """[kernel, category, grid, CTAs, block, regs, launches, µs, DRAM TB/s, DRAM %, SM %, occupancy %, waves,
    verdict] per family (kernel and launch shape)."""
    rows = []
    for f in a["families"]:
        theo = f.get("theoretical_occupancy_pct")
        occ = _range(f["achieved_occupancy_pct"], ".1f") + (f" / {theo:.1f}" if theo is not None and
                                                            f["achieved_occupancy_pct"] else "")
        verdict = f["verdict"]["title"] + (" (borderline)" if f["verdict"]["borderline"] else "")
        if len(f["launch_verdicts"]) > 1:
            verdict += " (median; mixed launches)"
        rows.append([f["short_name"], f["category"], _grid(f["grid"]), str(f["grid_size"]), _grid(f["block"]),
                     str(f["registers_per_thread"]), str(f["launches"]), _range(f["duration_ns"], ".1f", 1e-3),
                     _range(f["dram_bytes_per_s"], ".2f", 1e-12), _range(f["dram_throughput_pct"], ".1f"),
                     _range(f["sm_throughput_pct"], ".1f"), occ, f"{f['waves_per_sm']:.2f}", verdict])
    return rows


FAMILY_HEADERS = ["kernel", "category", "grid", "CTAs", "block", "regs", "launches", "µs median (min-max)",
                  "DRAM TB/s", "DRAM % of peak",
                  "SM % of peak", "occupancy % achieved / theoretical", "waves/SM", "verdict"]
KERNEL_HEADERS = ["ID", "kernel", "grid", "CTAs", "block", "µs", "DRAM MB", "DRAM %", "SM %", "mem %", "occ %",
                  "waves", "regs", "verdict"]


def kernel_rows(a: dict) -> list:
    return [[str(k["id"]), k["short_name"], _grid(k["grid"]), str(k["grid_size"]), _grid(k["block"]),
             _us(k["duration_ns"]), f"{k['dram_bytes'] / 1e6:.2f}", f"{k['dram_throughput_pct']:.1f}",
             f"{k['sm_throughput_pct']:.1f}", f"{k['memory_throughput_pct']:.1f}",
             _pct(k["achieved_occupancy_pct"]), f"{k['waves_per_sm']:.2f}", str(k["registers_per_thread"]),
             k["verdict"]["title"]] for k in a["kernels"]]


def header_lines(a: dict) -> list:
    """Plain sentences: what the drill asked for and kept, how it ran, what ncu reported going wrong."""
    d = a["drill"]
    lines = []
    if d.get("run_json"):
        asked = d.get("launches_requested")
        lines.append(f"ncu {d.get('ncu_version') or '?'}; {d.get('graphs') or 'graph mode unknown'}; kernel regex "
                     f"{d.get('kernel_regex')!r} ({d.get('kernel_base') or 'function'} names); {d['profiled']} "
                     f"launch{'es' if d['profiled'] != 1 else ''} profiled"
                     + (f" of {asked} asked for" if asked else "") + (f"; drill of {d['of']}" if d.get("of") else ""))
    lines += list(d.get("notes") or [])
    return lines


def category_lines(a: dict) -> list:
    """One sentence per category: the profiled launches' bytes and bandwidth against the category's floor bytes."""
    peak = a.get("peak_dram_bytes_per_s")
    out = []
    for r in a["categories"]:
        text = (f"{r['category']}: the {r['launches']} profiled launch{'es' if r['launches'] != 1 else ''} moved "
                f"{r['dram_bytes'] / 1e6:.1f} MB of DRAM in {r['duration_ns'] / 1e3:.1f} µs: "
                f"{r['dram_bytes_per_s'] / 1e12:.2f} TB/s")
        if r.get("dram_pct_of_peak") is not None:
            text += f", {r['dram_pct_of_peak']:.1f}% of ncu's {peak / 1e12:.2f} TB/s peak"
        floor = r.get("floor")
        if floor:
            text += f". Floor: {floor['assumption']}"
            if r.get("floor_ms_at_peak") is not None:
                text += f": {r['floor_ms_at_peak']:.3f} ms at peak"
            if r.get("floor_ms_at_drilled_bandwidth") is not None:
                text += (f"; at the profiled {r['dram_bytes_per_s'] / 1e12:.2f} TB/s, "
                         f"{r['floor_ms_at_drilled_bandwidth']:.3f} ms per step")
            else:
                text += (f"; the profiled launches moved {100 * r['drilled_share_of_floor_bytes']:.1f}% of these "
                         "bytes, too small a share to stand for the category's bandwidth")
        elif floor is None:
            text += ". No weight floor for this category"
        if r.get("measured_ms_per_step") is not None:
            text += f"; the capture measures {r['measured_ms_per_step']:.3f} ms/step"
        out.append(text + ".")
    return out


def _text_table(headers: list, rows: list) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*map(str, r)).rstrip() for r in rows]


def _shapes_of(name_summary: dict) -> list:
    """The per-shape lines under a kernel name's sentence: only when it ran more than one launch shape."""
    shapes = name_summary.get("shapes") or []
    return shapes if len(shapes) > 1 else []


def render_table(a: dict) -> str:
    """`profattr drill-report --format table`."""
    a = clean_tree(a)
    lines = [f"drill: {a['csv']}"]
    lines += [f"  {x}" for x in header_lines(a)]
    lines += ["", "launches:"] + ["  " + x for x in _text_table(KERNEL_HEADERS, kernel_rows(a))]
    lines += ["", "families (same kernel, grid, block and registers per thread):"]
    lines += ["  " + x for x in _text_table(FAMILY_HEADERS, family_rows(a))]
    lines += ["", "why:"]
    for n in a["names"]:
        lines.append(f"  - {n['sentence']}")
        lines += [f"      {s['sentence']}" for s in _shapes_of(n)]
    lines += ["", "bytes against the floor:"] + [f"  - {x}" for x in category_lines(a)]
    lines += ["", "assumptions:"] + [f"  - {x}" for x in a["assumptions"]]
    lines += ["", "thresholds: " + "; ".join(f"{k} {v['value']:g} ({v['reason']})" for k, v in THRESHOLDS.items())]
    return "\n".join(lines)


def _md_table(headers: list, rows: list, text_columns: Sequence[int] = (0, 1)) -> list:
    """A markdown table; the cells of `text_columns` are identifiers from the capture (kernel, category), written as
    code spans; the rest are numbers and words profattr wrote."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return out + ["| " + " | ".join(md_name(c) if i in text_columns else str(c) for i, c in enumerate(r)) + " |"
                  for r in rows]


def render_markdown(a: dict, heading: str = "###", title: Optional[str] = None, intro: Sequence = ()) -> list:
    """Markdown lines of one drill analysis (every string from the CSV or run.json escaped; `intro`: lines already
    in markdown)."""
    out = [f"{heading} {md_escape(title or Path(a['csv']).name)}", ""]
    out += [f"- {x}" for x in intro] + [f"- {md_escape(x)}" for x in header_lines(a)]
    out += [""] + _md_table(FAMILY_HEADERS, family_rows(a)) + [""]
    for n in a["names"]:
        out.append(f"- {md_escape(n['sentence'])}")
        out += [f"  - {md_escape(s['sentence'])}" for s in _shapes_of(n)]
    out += [""] + [f"- {md_escape(x)}" for x in category_lines(a)]
    out += ["", "Assumptions: " + md_escape("; ".join(a["assumptions"])) + ".", ""]
    return out


def section(data) -> list:
    """The report's section; nothing when the report has no drill."""
    entries = data.drills or []
    if not entries:
        return []
    out = [TITLE, "",
           "Nsight Compute drills (`profattr drill`) of the step's top kernels, one row per kernel family (same "
           "kernel, grid, block and registers per thread: one launch shape). Verdicts, in this order: memory-bound "
           "near peak (DRAM or L1/L2 at or above "
           f"{THRESHOLDS['memory_bound_pct']['value']:g}% of peak), compute-bound (SM at or above "
           f"{THRESHOLDS['compute_bound_pct']['value']:g}%), too few CTAs for the GPU (neither, and the grid fills "
           f"under {THRESHOLDS['few_waves']['value']:g} of the GPU's CTA slots), latency-bound (neither, though the "
           "grid fills the GPU); the 60% line is Nsight Compute's own SOLBottleneck rule.", ""]
    for e in entries:
        where = f"{md_name(e['label'])}: {md_escape(e['attached'])}"
        if e["analysis"] is None:
            out += [f"### {md_escape(Path(e['csv']).name)}", "", f"Skipped ({where}): {md_escape(e['note'])}", ""]
            continue
        out += render_markdown(e["analysis"], "###", f"{Path(e['csv']).name} ({e['label']})",
                               intro=[f"capture {where}"])
    return out

