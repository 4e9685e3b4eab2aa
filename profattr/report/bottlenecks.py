"""The ranked list of bottlenecks: what costs the most time per step, each with a one-line reason built from the
numbers (no fixed sentence that the numbers could contradict: every claim below is guarded by the value it states).

`rank_bottlenecks(captures, diffs)` takes plain structures:
- captures: dicts with `label`, `budget` (`profattr.budget/1`), `launches` (list from `report.launches`),
  `gap` (`profattr.gap/1` or None) and optionally `why_slow` ({category: sentence from an ncu drill}) and
  `run` (the capture's RunRecord or None: the kernel configs SGLang fell back to its defaults for, profiled vs
  unprofiled time per token);
- diffs: dicts with `a` and `b` (labels) and `diff` (`profattr.diff/1`); only those whose verdict is a regression
  or improvement rank (a diff over fewer than 3 windows per side, or between confounded runs, establishes no
  difference: the captures' own budgets rank instead).
It returns dicts {rank, capture, device, kind, ms_per_step, share_of_step, title, reason, also}, largest first: one
entry per category (or idle) across captures, taken from the capture where it costs most, with `also` listing the
other captures where the same category is a bottleneck. Strings are raw (the renderer escapes them).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from profattr.attribute.graph_launch import describe as describe_tracing
from profattr.report.budget_view import category_share, exclusive_ms
from profattr.report.shapes import shape_rows
from profattr.run_record import RunRecord, or_empty

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - 3.9/3.10
    import tomli as _toml

IDLE_MIN_SHARE = 0.10  # idle below this share of the step is not a bottleneck
CATEGORY_MIN_SHARE = 0.05  # nor is a category below this share
SPREAD_IDLE = 0.25  # idle is "spread over many gaps" when the largest gap per step holds less than this of it
MANY_KERNELS = 64  # a category launching at least this many kernels per step ...
SHORT_KERNEL_US = 10.0  # ... of at most this mean duration is "many short kernels"
KERNEL_COUNT_CHANGE = 0.10  # a diff's kernel count changes when it moves by at least this fraction
OFFSET_SHARE = 0.05  # idle offsets kernel time when it moves the other way by at least this share of it
PER_CAPTURE = 5
LIMIT = 15


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _us(ms: float) -> str:
    us = 1e3 * ms
    return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"


def _ms(ms: float) -> str:
    return f"{ms:.3f} ms" if ms >= 0.1 else f"{1e3 * ms:.2g} µs"


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def idle_reason(s: dict) -> str | None:
    """Why a device idles (None when idle is below IDLE_MIN_SHARE of the step)."""
    if s["idle_share"] < IDLE_MIN_SHARE or s["idle_ms_per_step"] <= 0:
        return None
    idle = s["idle_ms_per_step"]
    graph_launches = s.get("graph_launches_per_step")
    if s["mode"] == "eager":
        if s["largest_gap_share_of_idle"] < SPREAD_IDLE:
            return (f"the GPU waits on the CPU between kernels: {s['ops_per_step']:.0f} ops/step launched one by "
                    f"one, a median gap of {s['median_gap_us']:.1f} µs before each, the largest gap per step only "
                    f"{100.0 * s['largest_gap_share_of_idle']:.1f}% of the idle: launch-bound; use CUDA graphs or "
                    "launch fewer, larger kernels")
        syncs = s.get("sync_calls_per_step")
        sync_text = f", {syncs:.1f} synchronizations/step" if syncs else ""
        return (f"one gap of {s['largest_gap_us']:.0f} µs per step holds {_pct(s['largest_gap_share_of_idle'])} of "
                f"the idle{sync_text}: the CPU is busy with host work between launches, not launching")
    eager_idle, graph_idle = s["idle_before_eager_ops_ms"], s["idle_before_graph_ops_ms"]
    replay = (f"{graph_launches:.1f} graph launches/step replay {s['graph_ops_per_step']:.0f} ops"
              if graph_launches is not None else f"{s['graph_ops_per_step']:.0f} ops/step replayed from a graph")
    if eager_idle >= 0.5 * idle:
        return (f"{replay}, yet {eager_idle:.3f} ms/step of idle precedes the {s['eager_ops_per_step']:.1f} ops "
                f"launched outside the graph (largest gap {s['largest_gap_us']:.0f} µs/step) and only "
                f"{graph_idle:.3f} ms falls inside the replay: the GPU waits on host work between replays; overlap "
                "or shorten it, or move those ops into the graph" + _tracing_clause(s))
    before = s.get("idle_before_replay_ms") or 0.0
    if before >= 0.5 * idle:
        return _replay_start_reason(s, replay, before)
    inside = graph_idle - before
    return (f"{replay}; {inside:.3f} ms/step of idle falls between replayed nodes (median gap "
            f"{s['median_gap_us']:.1f} µs, largest {s['largest_gap_us']:.0f} µs/step): dependencies or waits "
            "inside the graph, not CPU launches")


def _replay_start_reason(s: dict, replay: str, before: float) -> str:
    """The GPU idles before each replay's first node: it waits for the host to launch the graph. The wait splits
    into host work before the cudaGraphLaunch call and the call's own latency to the first node."""
    text = (f"{replay}; {before:.3f} ms/step of the idle is the GPU waiting for a replay to start (median "
            f"{s['replay_wait_us']:.0f} µs before the first replayed node")
    late, call_part = s.get("replay_before_call_us"), s.get("replay_call_to_node_us")
    if late is None or call_part is None:
        return text + "; the launch calls were not recorded): the GPU ran out of work before the graph was launched"
    call = s.get("graph_launch_call_us")
    call_text = f", the call itself {call:.0f} µs on the host" if call is not None else ""
    text += (f": {late:.0f} µs before the host called cudaGraphLaunch, {call_part:.0f} µs from that call to the "
             f"first node{call_text})")
    if late >= call_part:
        return text + (": the host is behind the GPU (CPU-bound between replays): shorten the host work of a step "
                       "(scheduling, metadata, sampling), overlap it with the GPU's work, or run more per step"
                       + _tracing_clause(s))
    return text + (": the graph launch holds the GPU back: a launch of many nodes costs host time before its first "
                   "node runs; fewer nodes or fewer launches per step would help" + _tracing_clause(s))


def _tracing_clause(s: dict) -> str:
    """Whether the wait before replays holds without per-node graph tracing (a graph-level twin says so), or that
    nothing checked it."""
    info = s.get("graph_tracing") or {}
    if info.get("tracing") != "node":
        return ""
    cost = info.get("cost")
    if not cost:
        return ("; measured under per-node graph tracing, which lengthens every cudaGraphLaunch, and not checked "
                "against a twin without it (`profattr capture --cuda-graph-trace graph`, then `report --graph-twin`)")
    return "; " + describe_tracing(cost)


def category_reason(device: dict, category: str, gap_device: dict | None = None) -> str:
    """The category's top kernel with count and mean duration, its other kernels, and its efficiency vs floor."""
    kernels = [k for k in device["kernels"] if k["category"] == category]
    if not kernels:
        return "no kernels"
    # the category's longest launch shape speaks for it: a per-name mean over shapes (an lm_head among small GEMMs
    # of the same kernel) describes none of its launches
    shapes = shape_rows({"kernels": kernels})
    top = shapes[0]
    mean_ms = top["ms_per_step"] / top["count_per_step"] if top["count_per_step"] else 0.0
    label = f" ({top['label']})" if top["label"] and top["shapes_of_name"] > 1 else ""
    text = f"{_short(top['name'])}{label} ×{top['count_per_step']:.0f}/step at {_us(mean_ms)} each"
    rest = shapes[1:]
    if rest:
        text += (f", plus {len(rest)} other kernel launch shape{'s' if len(rest) > 1 else ''} "
                 f"({sum(r['ms_per_step'] for r in rest):.3f} ms)")
    count = sum(k["count_per_step"] for k in kernels)
    total = sum(k["ms_per_step"] for k in kernels)
    if count >= MANY_KERNELS and count and 1e3 * total / count <= SHORT_KERNEL_US:
        text += (f"; {count:.0f} short kernels/step (mean {1e3 * total / count:.1f} µs): a grouped or fused kernel "
                 "would do this work in fewer launches")
    comm = next((c for c in (device.get("comm") or {}).get("by_category", []) if c["category"] == category), None)
    if comm and comm.get("wait_ms_per_step", 0.0) > 0.0 and total:
        text += (f"; {comm['wait_ms_per_step']:.3f} ms of it ({_pct(comm['wait_ms_per_step'] / total)}) is this GPU "
                 "waiting inside the collective for the other ranks, not transfer")
    row = _gap_row(gap_device, category)
    if row and row.get("efficiency_pct") is not None and row.get("floor_ms"):
        text += (f"; runs at {row['efficiency_pct']:.1f}% of its hardware limit (floor {_ms(row['floor_ms'])}, "
                 f"{row.get('bound') or '?'}-bound)")
    return text


def _gap_row(gap_device: dict | None, category: str) -> dict | None:
    if not gap_device:
        return None
    rows = gap_device.get("categories") or []
    exact = next((r for r in rows if r.get("category") == category), None)
    if exact:
        return exact
    family = category.split(".")[0]  # the gap rolls some categories up (gemm.bf16 -> gemm)
    return next((r for r in rows if r.get("category") == family), None)


@lru_cache(maxsize=None)
def config_warnings() -> tuple:
    """(kind, kernel regex, how to tune) of SGLang's default-kernel-config warnings (data/config_warnings.toml)."""
    with open(Path(__file__).resolve().parent / "data" / "config_warnings.toml", "rb") as handle:
        data = _toml.load(handle)
    return tuple((w["kind"], re.compile(w["kernels"]), w["tune"]) for w in data["warning"])


def config_reason(run: RunRecord, kernel: str) -> str | None:
    """Why a kernel may run slow by its configuration: SGLang used its default config for it (server log)."""
    configs = [str(c) for c in run.default_kernel_configs]
    for kind, kernels, tune in config_warnings():
        shapes = [c for c in configs if c.startswith(kind + ":")]
        if shapes and kernels.search(kernel):
            return (f"SGLang ran it with its default config: no tuned config on this GPU for {len(shapes)} of its "
                    f"shapes (server log: 'Using default {kind} kernel config'); tune them with {tune}")
    return None


OVERHEAD_CAUTION = 1.10  # profiled over unprofiled step time above which idle may be the profiler's


def profiler_overhead(run: RunRecord) -> float | None:
    """Profiled over unprofiled time per token when it is at least OVERHEAD_CAUTION, else None."""
    a, b = run.ms_per_token_profiled, run.ms_per_token_unprofiled
    if a is not None and b is not None and b > 0 and a / b >= OVERHEAD_CAUTION:
        return a / b
    return None


def capture_items(cap: dict) -> list:
    """Bottleneck candidates of one capture: idle, large categories, unclassified time."""
    items = []
    launches = {s["device"]: s for s in cap.get("launches") or []}
    gap_devices = {g["device"]: g for g in (cap.get("gap") or {}).get("devices", [])}
    for d in cap["budget"]["devices"]:
        step = d["mean_step_ms"] or 1e-12
        s = launches.get(d["device"])
        if s is not None:
            reason = idle_reason(s)
            overhead = profiler_overhead(or_empty(cap.get("run")))
            if reason and overhead:
                reason += (f"; caution: this capture's steps ran {overhead:.2f}x their unprofiled time (run.json "
                           "timing), so part of this idle may be the profiler's own")
            if reason:
                items.append(_item(cap["label"], d["device"], "idle", d["idle_ms_per_step"], step,
                                   f"idle {_pct(s['idle_share'])} of the step", reason, key="idle"))
        for c in d["categories"]:
            share = category_share(c, d)  # its exclusive time: what the step pays for it, as the budget says
            if share < CATEGORY_MIN_SHARE:
                continue
            if c["category"] == "unclassified":
                top = next(k for k in d["kernels"] if k["category"] == "unclassified")
                reason = (f"{_short(top['name'])} ×{top['count_per_step']:.0f}/step ({top['ms_per_step']:.3f} ms) "
                          "matches no taxonomy rule: add one (--rules FILE) so its time lands in a category")
            else:
                reason = category_reason(d, c["category"], gap_devices.get(d["device"]))
            why = (cap.get("why_slow") or {}).get(c["category"])  # the verdict of an ncu drill of its kernels
            top = next((k for k in d["kernels"] if k["category"] == c["category"]), None)
            tuned = config_reason(or_empty(cap.get("run")), top["name"]) if top else None
            if tuned and not (why and "SGLang's log" in why):  # the drill's verdict already cites the log
                reason += f"; {tuned}"
            if why:
                reason += f"; {why}"
            items.append(_item(cap["label"], d["device"], "category", exclusive_ms(c), step,
                               f"{c['category']} {_pct(share)} of the step", reason, key=c["category"]))
            items[-1]["why"] = why
    return items


UNRANKED_VERDICTS = ("within noise", "not comparable")


def ranks_diff(diff: dict) -> bool:
    """Whether a diff may rank: its verdict is a regression or improvement, i.e. its intervals cover window
    variance and the runs differ only in what the comparison changes (a diff without a verdict: by its
    intervals alone)."""
    return diff.get("verdict") not in UNRANKED_VERDICTS


def diff_items(entry: dict) -> list:
    """One candidate per device of a diff: what explains B - A, when the change is beyond noise and the comparison
    establishes it (ranks_diff).

    `entry` may carry `a_modes` / `b_modes` ({device: launch mode}) to say when the launch mode changed too."""
    items = []
    if not ranks_diff(entry["diff"]):
        return items
    a, b = entry["a"], entry["b"]
    for d in entry["diff"]["devices"]:
        s = d["step_ms"]
        ci = s.get("ci95")
        if ci is not None and ci[0] <= 0.0 <= ci[1]:
            continue
        parts = split_delta(d)
        delta = s["delta"]
        if abs(delta) < 1e-9:
            continue
        ka, kb = d["kernels_per_step"]["a"], d["kernels_per_step"]["b"]
        mode_a = (entry.get("a_modes") or {}).get(d["device"])
        mode_b = (entry.get("b_modes") or {}).get(d["device"])
        slower, faster = (b, a) if delta > 0 else (a, b)
        title = f"{slower} is {abs(delta):.3f} ms/step slower than {faster}"
        wait = (f", waiting inside collectives {parts['comm_wait']:+.3f} ms"
                if any(c["component"] == "comm_wait" for c in d["components"]) else "")
        facts = [f"idle {parts['idle']:+.3f} ms, kernel time {parts['kernel']:+.3f} ms{wait} ({b} minus {a})"]
        if mode_a and mode_b and mode_a != mode_b:
            facts.append(f"{a} runs {mode_a}, {b} {mode_b}")
        if abs(kb - ka) >= KERNEL_COUNT_CHANGE * max(ka, kb, 1e-12):
            facts.append(f"kernels/step {ka:.0f} → {kb:.0f}")
        launch_bound = (abs(kb - ka) >= KERNEL_COUNT_CHANGE * max(ka, kb, 1e-12) and mode_a == mode_b
                        and abs(parts["idle"]) >= 0.5 * abs(delta) and parts["idle"] * delta > 0)
        if launch_bound:
            more, fewer = (b, a) if kb > ka else (a, b)
            title = f"{more} launches {max(ka, kb):.0f} kernels/step vs {min(ka, kb):.0f} in {fewer}"
            facts.append(f"{_pct(abs(parts['idle']) / abs(delta))} of the {abs(delta):.3f} ms/step difference is "
                         "idle/launch time: the extra time is launching, not kernel work")
        else:
            sentence = kernel_idle_sentence(parts, delta, a, b)
            if sentence:
                facts.append(sentence)
        cats = [c for c in d["components"] if not c["noise"] and c["component"].startswith("category:")
                and abs(c["delta_ms_per_step"]) >= 0.05 * abs(delta)]
        cats.sort(key=lambda c: -abs(c["delta_ms_per_step"]))
        facts += [f"{c['component'].split(':', 1)[1]} {component_reason(c)}" for c in cats[:2]]
        items.append(_item(f"{b} vs {a}", d["device"], "diff", abs(delta), max(s["a"], s["b"]) or 1e-12, title,
                           "; ".join(facts)))
    return items


def kernel_idle_sentence(parts: dict, delta: float, a: str, b: str) -> str | None:
    """When kernel time and idle moved in opposite directions, say which one the step followed (None otherwise)."""
    kernel, idle = parts["kernel"], parts["idle"]
    if abs(idle) < OFFSET_SHARE * abs(kernel) or abs(idle) < 1e-3 or abs(kernel) < 1e-3:
        return None  # idle (or kernel time) barely moved: nothing to reconcile
    if kernel > 0 > idle:
        if delta > 0:
            return (f"{-idle:.3f} ms of {b}'s extra kernel time ran while the GPU sat idle in {a}: the step grew by "
                    f"{delta:.3f} ms, less than the kernel time ({kernel:+.3f} ms)")
        return (f"{b} spends {kernel:.3f} ms more in kernels yet its step is {-delta:.3f} ms shorter: the GPU waits "
                f"{-idle:.3f} ms less, so the gain is in launch/host time, not in kernels")
    if kernel < 0 < idle:
        if delta < 0:
            return (f"{idle:.3f} ms of the kernel time {b} saves became idle time: the step shrank by {-delta:.3f} "
                    f"ms, less than the kernel time ({kernel:+.3f} ms)")
        return (f"{b} spends {-kernel:.3f} ms less in kernels yet its step is {delta:.3f} ms longer: the GPU waits "
                f"{idle:.3f} ms more")
    return None


def split_delta(d: dict) -> dict:
    """A diff device's step delta as kernel time (categories' exclusive time), collective wait (ranks waiting for
    each other inside collectives), idle, and median-vs-mean drift; the four add up to the step delta."""
    out = {"kernel": 0.0, "comm_wait": 0.0, "idle": 0.0, "variability": 0.0}
    for c in d["components"]:
        name = c["component"]
        key = {"idle": "idle", "step_variability": "variability", "comm_wait": "comm_wait"}.get(name, "kernel")
        out[key] += c["delta_ms_per_step"]
    return out


def component_reason(c: dict) -> str:
    """One line for a diff component: its change, count vs duration, kernels found on one side only."""
    text = f"{c['delta_ms_per_step']:+.3f} ms"
    if "from_count_ms" in c:
        from profattr.report.diff_view import family_note

        parts = family_note(c)
        text += f" ({parts})" if parts else ""
    kernels = c.get("kernels") or {}
    only_a = [k["name"] for k in kernels.get("only_a", [])]
    only_b = [k["name"] for k in kernels.get("only_b", [])]
    if only_a or only_b:
        text += f": {_names(only_a)} → {_names(only_b)}"
    return text


def _names(names: list) -> str:
    if not names:
        return "none"
    s = ", ".join(_short(n, 40) for n in names[:2])
    return s + (f" (+{len(names) - 2})" if len(names) > 2 else "")


def _item(capture: str, device, kind: str, ms: float, step_ms: float, title: str, reason: str,
          key: str | None = None) -> dict:
    return {"capture": capture, "device": device, "kind": kind, "ms_per_step": float(ms),
            "share_of_step": float(ms) / step_ms if step_ms else 0.0, "title": title, "reason": reason,
            "key": key, "also": []}


def group_items(items: list) -> list:
    """One entry per category (or idle) across captures and devices: the largest, with the rest in `also`."""
    groups: dict = {}
    out = []
    for item in sorted(items, key=lambda i: -i["ms_per_step"]):
        if item["key"] is None:
            out.append(item)
            continue
        head = groups.get(item["key"])
        if head is None:
            groups[item["key"]] = item
            out.append(item)
        else:
            head["also"].append({"capture": item["capture"], "device": item["device"],
                                 "ms_per_step": item["ms_per_step"], "share_of_step": item["share_of_step"]})
            if item.get("why") and item["why"] != head.get("why"):  # another capture's drill says something else
                head["reason"] += f"; in {item['capture']}, {item['why']}"
    for head in groups.values():
        if head["also"]:
            shares = [head["share_of_step"]] + [a["share_of_step"] for a in head["also"]]
            many = len({head["capture"], *(a["capture"] for a in head["also"])}) > 1
            low, high = _pct(min(shares)), _pct(max(shares))
            span = low if low == high else f"{low}-{high}"
            head["title"] += f" ({span} in {len(shares)} {'captures' if many else 'GPUs'})"
    return out


def rank_bottlenecks(captures: Sequence[dict], diffs: Sequence[dict] = (), limit: int = LIMIT,
                     per_capture: int = PER_CAPTURE) -> list:
    """All candidates, largest ms/step first, at most `per_capture` per capture (or pair) and `limit` in all."""
    items = group_items([i for cap in captures for i in capture_items(cap)]) + [i for e in diffs
                                                                                for i in diff_items(e)]
    items.sort(key=lambda i: -i["ms_per_step"])
    taken: list = []
    per: dict = {}
    for item in items:
        if per.get(item["capture"], 0) >= per_capture:
            continue
        per[item["capture"]] = per.get(item["capture"], 0) + 1
        taken.append(item)
        if len(taken) >= limit:
            break
    for rank, item in enumerate(taken, 1):
        item["rank"] = rank
    return taken
