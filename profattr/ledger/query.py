"""Reading the ledger: entries by number or label, an entry's budget as `profattr.budget/1`, comparisons of two
entries (the `profattr diff` of their stored budgets and per-step rows) and a metric across entries."""
from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

from profattr.attribute.budget import SCHEMA as BUDGET_SCHEMA
from profattr.attribute.diff import BOOTSTRAP_SAMPLES, Side, compute_diff
from profattr.attribute.step_table import StepCategories
from profattr.errors import ProfattrError
from profattr.ledger.schema import TABLES, checked, has_columns, ledger_path, stored_json
from profattr.run_record import RunRecord

JSON_COLUMNS = ("rules_files", "nvtx_placement", "comm_summary", "export_gpus", "backend_json", "server_resolved",
                "server_args")
ENTRY_SCHEMA = "profattr.ledger.entry/1"  # `ledger show --format json`
TOP_CATEGORIES = 3
# trend metrics: name -> (table, column, unit)
METRICS = {
    "step_ms": ("devices", "step_ms", "ms/step"),
    "mean_step_ms": ("devices", "mean_step_ms", "ms/step"),
    "busy": ("devices", "busy_ms_per_step", "ms/step"),
    "idle": ("devices", "idle_ms_per_step", "ms/step"),
    "overlap": ("devices", "overlap_ms_per_step", "ms/step"),
    "kernels_per_step": ("devices", "kernels_per_step", "kernels/step"),
    "ms_per_token": ("entries", "ms_per_token_unprofiled", "ms/token"),
    "ms_per_token_profiled": ("entries", "ms_per_token_profiled", "ms/token"),
}


def _rows(db, table: str, sql: str, params=()) -> list:
    """The rows of a query on `table`, each checked against the schema (schema.checked): a damaged value is one
    error naming the entry, never a wrong figure or a traceback further on."""
    return [checked(db, table, r) for r in db.query(sql, list(params))]


def entry_rows(db) -> list:
    """Every entry (all its columns), in insertion order."""
    return _rows(db, "entries", "SELECT * FROM entries ORDER BY id")


def resolve_entry(db, ref, path) -> dict:
    """The entry addressed by `ref`: its number (id) or its label."""
    text = str(ref).strip()
    if text.isdigit():
        rows = _rows(db, "entries", "SELECT * FROM entries WHERE id = ?", [int(text)])
    else:
        rows = _rows(db, "entries", "SELECT * FROM entries WHERE label = ?", [str(ref)])
    if rows:
        return rows[0]
    known = [f"{r['id']} {r['label']}" for r in db.query("SELECT id, label FROM entries ORDER BY id LIMIT 11")]
    listed = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
    raise ProfattrError(f"{path}: no entry {str(ref)!r} (entries: {listed or 'none yet'}); address an entry by its "
                        "number or label, as `profattr ledger list` shows them")


def _by_device(rows) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(r["device"], []).append(r)
    return out


def budget_dict(db, entry: dict) -> dict:
    """The entry's budget as `profattr budget --format json` gave it when added (without per-layer rows)."""
    eid = entry["id"]
    extra = (", exclusive_ms_per_step, overlapped_ms_per_step"
             if has_columns(db, "categories", ("exclusive_ms_per_step", "overlapped_ms_per_step")) else "")
    cats = _by_device(_rows(db, "categories", f"SELECT device, category, ms_per_step, count_per_step{extra} "
                                              "FROM categories WHERE entry_id = ? ORDER BY device, position", [eid]))
    precision = ", weight_dtype, math" if has_columns(db, "kernels", ("weight_dtype", "math")) else ""
    kernels = _by_device(_rows(db, "kernels", "SELECT device, name, demangled, category, family, ms_per_step, "
                                              f"count_per_step{precision} FROM kernels WHERE entry_id = ? ORDER BY "
                                              "device, position", [eid]))
    shapes = _shapes_by_kernel(db, eid)
    short = ({r["device"]: r for r in db.query("SELECT * FROM short_kernels WHERE entry_id = ?", [eid])}
             if "short_kernels" in db.table_names() else {})
    comm = {r["device"]: r for r in _rows(db, "comm", "SELECT * FROM comm WHERE entry_id = ?", [eid])}
    comm_cats = _by_device(_rows(db, "comm_categories", "SELECT device, category, collective_ms_per_step, "
                                                        "wait_ms_per_step FROM comm_categories WHERE entry_id = ? "
                                                        "ORDER BY device, position", [eid]))
    devices = []
    for d in _rows(db, "devices", "SELECT * FROM devices WHERE entry_id = ? ORDER BY device", [eid]):
        dev = d["device"]
        out = {k: d[k] for k in ("device", "steps", "step_ms", "mean_step_ms", "busy_ms_per_step", "idle_ms_per_step",
                                 "overlap_ms_per_step", "kernels_per_step", "memops_per_step")}
        out["categories"] = _category_rows(cats.get(dev, []), out["mean_step_ms"])
        if all("share" in c for c in out["categories"]):
            out["idle_share"] = out["idle_ms_per_step"] / out["mean_step_ms"] if out["mean_step_ms"] else 0.0
        out["kernels"] = [{**_precision_keys(_drop_device(k)), "mean_us": 1e3 * k["ms_per_step"] / k["count_per_step"]
                           if k["count_per_step"] else 0.0, "shapes": shapes.get((dev, i), [])}
                          for i, k in enumerate(kernels.get(dev, []))]
        out["unclassified_share"] = d["unclassified_share"]
        if dev in short:
            out["short_kernels"] = {k: short[dev][k] for k in ("under_us", "count_per_step", "ms_per_step", "share")}
        out["outside_steps"] = {"ops": d["outside_steps_ops"], "ms": d["outside_steps_ms"]}
        out.update(stored_json(db, "devices", d, "evidence_json") or {})
        if dev in comm:
            out["comm"] = {k: comm[dev][k] for k in TABLES["comm"][0] if k not in ("entry_id", "device")}
            out["comm"]["by_category"] = [_drop_device(c) for c in comm_cats.get(dev, [])]
        devices.append(out)
    budget = {
        "schema": BUDGET_SCHEMA,
        "capture": {"path": entry["export_path"], "format": entry["capture_format"],
                    "nsys_version": entry["nsys_version"], "export_schema_version": entry["export_schema_version"],
                    "profiler_version": entry["profiler_version"],
                    "gpus": stored_json(db, "entries", entry, "export_gpus") or []},
        "steps": {"source": entry["steps_source"], "count": entry["steps_count"], "reason": entry["steps_reason"],
                  "excluded": stored_json(db, "entries", entry, "steps_excluded") or {}},
        "nvtx_context": entry["nvtx_context"],
        "devices": devices,
    }
    if entry.get("skipped_rows"):
        budget["capture"]["skipped_rows"] = stored_json(db, "entries", entry, "skipped_rows")
    if entry["nvtx_placement"] is not None:
        budget["nvtx_placement"] = stored_json(db, "entries", entry, "nvtx_placement")
    if entry["comm_summary"] is not None:
        budget["comm"] = stored_json(db, "entries", entry, "comm_summary")
    return budget


def _category_rows(rows: list, mean_step_ms: float) -> list:
    """Category rows as the budget gives them: with exclusive and overlapped time and the share of the step where
    the entry recorded them (NULL in entries added before they were stored: then op time only)."""
    out = []
    for r in rows:
        c = _drop_device(r)
        if c.get("exclusive_ms_per_step") is None or c.get("overlapped_ms_per_step") is None:
            c.pop("exclusive_ms_per_step", None)
            c.pop("overlapped_ms_per_step", None)
        else:
            c["share"] = c["exclusive_ms_per_step"] / mean_step_ms if mean_step_ms else 0.0
        out.append(c)
    return out


def _precision_keys(k: dict) -> dict:
    """A kernel row as the budget gives it: `weight_dtype` and `math` on GEMM kernels only (attribute/precision.py)."""
    from profattr.attribute.precision import is_gemm_category

    if not is_gemm_category(k.get("category") or ""):
        k.pop("weight_dtype", None)
        k.pop("math", None)
    return k


def _shapes_by_kernel(db, eid: int) -> dict:
    """(device, kernel position) -> its shapes as the budget lists them (none in ledgers made before shapes)."""
    if "kernel_shapes" not in db.table_names():
        return {}
    out: dict = {}
    for r in db.query("SELECT * FROM kernel_shapes WHERE entry_id = ? ORDER BY device, kernel_position, position",
                      [eid]):
        shape = None if r["grid_x"] is None else {
            "grid": [r["grid_x"], r["grid_y"], r["grid_z"]], "block": [r["block_x"], r["block_y"], r["block_z"]],
            "registers_per_thread": r["registers_per_thread"]}
        if shape is not None and r.get("gemm_n") is not None:  # gemm_m NULL: N and K borrowed, M not known
            shape["gemm"] = {"m": r["gemm_m"], "n": r["gemm_n"], "k": r["gemm_k"]}
        out.setdefault((r["device"], r["kernel_position"]), []).append({
            "shape": shape, "label": r["label"], **{c: r[c] for c in ("ms_per_step", "count_per_step", "mean_us",
                                                                       "share")}})
    return out


def _drop_device(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "device"}


def _frame(db, sql: str, eid: int, columns: Sequence[str], table: str = "",
           nullable: Sequence[str] = ("exclusive_ns",)) -> Optional[pd.DataFrame]:
    """The per-step rows of one entry as a frame; every column but `category` must hold integers (else one error
    naming the entry: a damaged ledger), except that a `nullable` column (added to the schema later) may be all
    NULL, in an entry added before it."""
    rows = db.execute(sql, [eid]).fetchall()
    if not rows:
        return None
    frame = pd.DataFrame(rows, columns=list(columns))
    for column in frame.columns:
        if column == "category":
            continue
        values = frame[column]
        if column in nullable and values.isna().all():
            continue
        if values.dtype.kind not in "iu":  # text, NULL or a float among the integers: not what the ledger writes
            raise ProfattrError(f"{ledger_path(db)}: entry {eid}'s {table} rows hold a value that is not an integer "
                                f"in {column}: the ledger is damaged; add the capture again into a new ledger "
                                "(`profattr ledger add CAPTURE --ledger NEW.db`)")
    return frame


def entry_side(db, entry: dict) -> Side:
    """A diff side built from the entry's stored budget and per-step rows (as `diff.load_side` builds one from a
    capture), so `compute_diff` gives the same components and intervals."""
    eid = entry["id"]
    per_step = _frame(db, "SELECT device, step, start_ns, end_ns, span_ns, busy_ns, op_ns, kernel_count FROM steps "
                          "WHERE entry_id = ? ORDER BY device, step", eid,
                      ["device", "step", "start_ns", "end_ns", "span_ns", "busy_ns", "op_ns", "kernels"], "steps")
    exclusive = has_columns(db, "step_categories", ("exclusive_ns",))
    per_step_category = _frame(db, "SELECT device, step, category, duration_ns, count"
                                   f"{', exclusive_ns' if exclusive else ''} FROM step_categories "
                                   "WHERE entry_id = ? ORDER BY device, step, category", eid,
                               ["device", "step", "category", "ns", "count"] + (["exclusive_ns"] if exclusive else []),
                               "step_categories")
    if per_step_category is not None and "exclusive_ns" in per_step_category:
        if per_step_category["exclusive_ns"].isna().any():  # an entry added before exclusive time was stored
            per_step_category = per_step_category.drop(columns="exclusive_ns")
        else:
            per_step_category["exclusive_ns"] = per_step_category["exclusive_ns"].astype("int64")
    per_step_comm = _frame(db, "SELECT device, step, category, collective_ns, wait_ns FROM step_comm "
                               "WHERE entry_id = ? ORDER BY device, step, category", eid,
                           ["device", "step", "category", "collective_ns", "wait_ns"], "step_comm")
    # what the ledger kept of the run.json: the backend a diff compares
    run = RunRecord({"backend": stored_json(db, "entries", entry, "backend_json")}) if entry["run_json_path"] else None
    return Side(entry["export_path"], budget_dict(db, entry), per_step, StepCategories.from_frame(per_step_category),
                run, per_step_comm)


def compare(db, path, ref_a, ref_b, samples: int = BOOTSTRAP_SAMPLES, changed: Optional[str] = None) -> dict:
    """`profattr.diff/1` of entry B against entry A, with each side's entry number and label added."""
    a, b = resolve_entry(db, ref_a, path), resolve_entry(db, ref_b, path)
    result = compute_diff(entry_side(db, a), entry_side(db, b), samples=samples, changed=changed)
    for key, entry in (("a", a), ("b", b)):
        result[key].update(entry=entry["id"], label=entry["label"])
    return result


def list_rows(db) -> list:
    """Per entry: number, label, ms/token (unprofiled), and the slowest GPU's step time and largest categories."""
    devices: dict = {}
    for d in _rows(db, "devices", "SELECT entry_id, device, step_ms FROM devices ORDER BY entry_id, device"):
        devices.setdefault(d["entry_id"], []).append(d)
    out = []
    for e in entry_rows(db):
        slowest = max(devices.get(e["id"], []), key=lambda d: d["step_ms"], default=None)
        top = []
        if slowest is not None:
            top = _rows(db, "categories", "SELECT category, ms_per_step FROM categories WHERE entry_id = ? AND "
                                          "device = ? ORDER BY position LIMIT ?",
                        [e["id"], slowest["device"], TOP_CATEGORIES])
        out.append({"id": e["id"], "label": e["label"], "ms_per_token": e["ms_per_token_unprofiled"],
                    "gpus": len(devices.get(e["id"], [])), "device": slowest["device"] if slowest else None,
                    "step_ms": slowest["step_ms"] if slowest else None, "top_categories": top,
                    "backend": e["backend_requested"], "batch": e["batch"], "capture": e["capture_path"]})
    return out


def show(db, entry: dict) -> dict:
    """One entry in full: its columns (JSON ones decoded), GPUs, packages and budget."""
    facts = {k: (stored_json(db, "entries", entry, k) if k in JSON_COLUMNS else v) for k, v in entry.items()}
    gpus = [{k: v for k, v in g.items() if k != "entry_id"}
            for g in _rows(db, "gpus", "SELECT * FROM gpus WHERE entry_id = ? ORDER BY position", [entry["id"]])]
    packages = {p["package"]: p["version"] for p in
                _rows(db, "packages", "SELECT package, version FROM packages WHERE entry_id = ? ORDER BY package",
                      [entry["id"]])}
    return {"schema": ENTRY_SCHEMA, "entry": facts, "gpus": gpus, "packages": packages,
            "budget": budget_dict(db, entry)}


def trend(db, metric: str, path) -> list:
    """METRIC per entry (and GPU) in insertion order, with its change against the first entry that has it."""
    if metric.startswith("category:"):
        category = metric.split(":", 1)[1]
        if db.execute("SELECT 1 FROM categories WHERE category = ? LIMIT 1", [category]).fetchone() is None:
            known = [r[0] for r in db.execute("SELECT DISTINCT category FROM categories ORDER BY category")]
            raise ProfattrError(f"{path}: category {category!r} is in no entry of the ledger (categories here: "
                                f"{', '.join(known[:12]) or 'none'}{', ...' if len(known) > 12 else ''})")
        # a category an entry's GPU did not run costs it 0 ms/step
        rows = db.query("SELECT e.id, e.label, d.device, COALESCE(c.ms_per_step, 0.0) AS value FROM entries e "
                        "JOIN devices d ON d.entry_id = e.id LEFT JOIN categories c ON c.entry_id = e.id "
                        "AND c.device = d.device AND c.category = ? ORDER BY e.id, d.device", [category])
        unit = "ms/step"
    elif metric in METRICS:
        table, column, unit = METRICS[metric]
        if table == "entries":
            rows = db.query(f"SELECT id, label, NULL AS device, {column} AS value FROM entries ORDER BY id")
        else:
            rows = db.query(f"SELECT e.id, e.label, d.device, d.{column} AS value FROM entries e "
                            "JOIN devices d ON d.entry_id = e.id ORDER BY e.id, d.device")
    else:
        raise ProfattrError(f"trend {metric!r}: expected one of {', '.join(METRICS)} or category:<id> (e.g. "
                            "category:moe.gemm)")
    out, first = [], {}
    for r in rows:
        value = r["value"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ProfattrError(f"{path}: entry {r['id']}'s {metric} holds {str(value)[:40]!r}, not a number: the "
                                "ledger is damaged; add the capture again into a new ledger")
        if value is not None:
            first.setdefault(r["device"], value)
        base = first.get(r["device"])
        out.append({"entry_id": r["id"], "label": r["label"], "device": r["device"], "metric": metric,
                    "value": value, "unit": unit,
                    "change_vs_first": None if value is None or base is None else value - base})
    return out


def campaign(db, refs: Sequence, path) -> list:
    """The entries named by `refs` (all when empty), in that order: number, label, ms/token and budget."""
    entries = [resolve_entry(db, r, path) for r in refs] if refs else entry_rows(db)
    return [{"id": e["id"], "label": e["label"], "ms_per_token": e["ms_per_token_unprofiled"],
             "budget": budget_dict(db, e)} for e in entries]
