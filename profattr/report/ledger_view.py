"""Render what `profattr ledger` reads (ledger/query.py results) as a table for a person, CSV, or markdown.

Strings from captures and users (labels, kernel and category names, paths, server flags) are printed as stored,
without their control characters (text.clean_tree), and through `md_escape` in markdown.
"""
from __future__ import annotations

import csv
import io

from profattr.report import budget_view, diff_view
from profattr.text import md_escape
from profattr.text import clean_tree


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_rows(rows: list, columns: list, fmt: str) -> str:
    """`rows` (dicts) as an aligned text table, CSV (raw values) or a markdown table; `columns`: (key, header)."""
    rows = clean_tree(rows)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([key for key, _ in columns])
        for r in rows:
            w.writerow(["" if r.get(key) is None else r.get(key) for key, _ in columns])
        return buf.getvalue().rstrip("\n")
    cells = [[_cell(r.get(key)) for key, _ in columns] for r in rows]
    numeric = [all(isinstance(r.get(key), (int, float)) or r.get(key) is None for r in rows) for key, _ in columns]
    if fmt == "markdown":
        out = ["| " + " | ".join(md_escape(h) for _, h in columns) + " |",
               "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
        return "\n".join(out + ["| " + " | ".join(c if n else md_escape(c) for c, n in zip(row, numeric)) + " |"
                                for row in cells])
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, (_, h) in enumerate(columns)]

    def line(values):
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)).rstrip()
    return "\n".join([line([h for _, h in columns])] + [line(row) for row in cells])


def list_view(rows: list, fmt: str) -> str:
    """`ledger list`: one row per entry; the largest categories as `category ms` in table and markdown, one pair of
    columns each in CSV."""
    flat = []
    for r in rows:
        row = dict(r)
        row["largest"] = ", ".join(f"{c['category']} {c['ms_per_step']:.3f}" for c in r["top_categories"])
        for i, c in enumerate(r["top_categories"], 1):
            row[f"category_{i}"], row[f"category_{i}_ms_per_step"] = c["category"], c["ms_per_step"]
        flat.append(row)
    if fmt == "csv":
        columns = [("id", ""), ("label", ""), ("ms_per_token", ""), ("device", ""), ("step_ms", "")]
        for i in range(1, 4):
            columns += [(f"category_{i}", ""), (f"category_{i}_ms_per_step", "")]
        return render_rows(flat, columns, fmt)
    return render_rows(flat, [("id", "entry"), ("label", "label"), ("ms_per_token", "ms/token"),
                              ("device", "GPU"), ("step_ms", "step ms"), ("largest", "largest categories (ms/step)")],
                       fmt)


def _facts(shown: dict) -> list:
    """(name, value) lines of an entry's identity and run facts, values as stored."""
    e = shown["entry"]
    rules = ", ".join(e["rules_files"] or []) or "shipped only"
    facts = [("entry", f"{e['id']} ({e['label']})"), ("added", e["added_utc"]), ("capture", e["capture_path"]),
             ("sha256", f"{e['capture_sha256']} ({e['capture_bytes']} bytes)"), ("export", e["export_path"]),
             ("nsys", f"{e['nsys_version']} (export schema {e['export_schema_version']})"),
             ("steps", f"--steps {e['steps_spec']}: {e['steps_source']} x{e['steps_count']}"),
             ("rules", f"{rules} (taxonomy {e['rules_sha256'][:12]})")]
    if e["run_json_path"]:
        args = e["server_args"]
        facts += [("run.json", e["run_json_path"]), ("model", e["model"]),
                  ("backend", f"requested {e['backend_requested']}, resolved {e['backend_resolved']}"),
                  ("tp / batch", f"{e['tp']} / {e['batch']}"),
                  ("server flags", " ".join(map(str, args)) if isinstance(args, list) else args),
                  ("ms/token", f"{_cell(e['ms_per_token_unprofiled'])} unprofiled, "
                               f"{_cell(e['ms_per_token_profiled'])} profiled")]
        for g in shown["gpus"]:
            clocks = ", ".join(f"{k} {g[k]}" for k in ("clocks_sm_mhz", "clocks_mem_mhz", "clocks_max_sm_mhz",
                                                       "clocks_max_mem_mhz") if g.get(k) is not None)
            facts.append((f"GPU {g['gpu_index']}", f"{g['name']}, driver {g['driver_version']}"
                                                   + (f"; {clocks}" if clocks else "")))
        facts.append(("packages", ", ".join(f"{k} {v}" for k, v in shown["packages"].items() if v)))
    return [(k, "" if v is None else str(v)) for k, v in facts]


def show_view(shown: dict, fmt: str) -> str:
    """`ledger show`: the entry's facts, then its budget as `profattr budget` renders it (CSV: the budget only)."""
    shown = clean_tree(shown)
    if fmt == "csv":
        return budget_view.render_csv(shown["budget"]).rstrip("\n")
    facts = _facts(shown)
    if fmt == "markdown":
        lines = [f"## Entry {shown['entry']['id']}: {md_escape(shown['entry']['label'])}", ""]
        lines += [f"- {md_escape(k)}: {md_escape(v)}" for k, v in facts]
        return "\n".join(lines + ["", budget_view.render_markdown(shown["budget"])])
    width = max(len(k) for k, _ in facts)
    lines = [f"{k + ':':<{width + 1}} {v}" for k, v in facts]
    return "\n".join(lines + ["", budget_view.render_table(shown["budget"])])


def trend_view(rows: list, fmt: str) -> str:
    """`ledger trend`: one row per entry (and GPU); the value's unit heads its column (CSV: a column of its own)."""
    if fmt == "csv":
        keys = ("entry_id", "label", "device", "metric", "value", "unit", "change_vs_first")
        return render_rows(rows, [(k, "") for k in keys], fmt)
    unit = rows[0]["unit"] if rows else "value"
    return render_rows(rows, [("entry_id", "entry"), ("label", "label"), ("device", "GPU"), ("value", unit),
                              ("change_vs_first", "change vs first")], fmt)


def compare_view(diff: dict, fmt: str) -> str:
    """`ledger compare`: as `profattr diff` renders it; CSV: one row per GPU and component."""
    diff = clean_tree(diff)
    if fmt == "markdown":
        return diff_view.render_markdown(diff, a_label=diff["a"]["label"], b_label=diff["b"]["label"])
    if fmt != "csv":
        head = [f"{k.upper()}: entry {diff[k]['entry']} ({diff[k]['label']})" for k in ("a", "b")]
        return "\n".join(head + [diff_view.render_table(diff)])
    rows = []
    for d in diff["devices"]:
        for c in d["components"]:
            ci = c.get("ci95") or [None, None]
            rows.append({"device": d["device"], "component": c["component"], "a_ms_per_step": c["a_ms_per_step"],
                         "b_ms_per_step": c["b_ms_per_step"], "delta_ms_per_step": c["delta_ms_per_step"],
                         "ci95_low": ci[0], "ci95_high": ci[1], "noise": c["noise"]})
    return render_rows(rows, [(k, "") for k in ("device", "component", "a_ms_per_step", "b_ms_per_step",
                                                 "delta_ms_per_step", "ci95_low", "ci95_high", "noise")], "csv")
