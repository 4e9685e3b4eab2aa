"""Report sections on how the GPU's time is spent outside kernels: idle time and launches (with what the host did
meanwhile: CUDA calls, NVTX ranges and, where the capture has CPU samples, the functions of the step's CPU thread)
and, with several ranks, tensor parallelism (transfer vs wait per rank)."""
from __future__ import annotations

from profattr.report import host_gaps
from profattr.report.bottlenecks import idle_reason
from profattr.text import md_escape, md_name
from profattr.report.md_table import _devices_label, _f, _pct, _table


def launch_section(data) -> list:
    out = ["## Idle time and launches", "",
           "Launch calls are counted per step on the step's CPU thread; gaps are between consecutive GPU ops of a "
           "step (their sum is the idle time), each charged to the op that ends it: the first node of a CUDA-graph "
           "replay (the GPU waiting for the host's cudaGraphLaunch), a later node of a replay, or an op launched by "
           "itself.", ""]
    rows, gap_rows, notes, sample_rows, short_rows = [], [], [], [], []
    for cap in data.captures:
        devices = {d["device"]: d for d in cap.budget["devices"]}
        for s in cap.launches:
            d = devices[s["device"]]
            label = _devices_label(cap, d)
            short = d.get("short_kernels")
            if short:
                short_rows.append([label, f"{d['kernels_per_step']:.1f}", f"{short['count_per_step']:.1f}",
                                   _pct(short["count_per_step"] / d["kernels_per_step"] if d["kernels_per_step"]
                                        else 0.0), f"{short['ms_per_step']:.3f}", _pct(short["share"])])
            rows.append([label, md_escape(s["mode"]), _f(s["graph_launches_per_step"], ".2f"),
                         _f(s["kernel_launches_per_step"], ".1f"), _f(s["memory_calls_per_step"], ".1f"),
                         _f(s["sync_calls_per_step"], ".1f"), f"{s['kernels_per_step']:.1f}",
                         f"{s['graph_ops_per_step']:.1f}", f"{s['eager_ops_per_step']:.1f}"])
            gap_rows.append([label, f"{s['mean_step_ms']:.3f}", f"{s['idle_ms_per_step']:.3f}",
                             _pct(s["idle_share"]), f"{s.get('idle_before_replay_ms', 0.0):.3f}",
                             f"{s['idle_before_graph_ops_ms'] - s.get('idle_before_replay_ms', 0.0):.3f}",
                             f"{s['idle_before_eager_ops_ms']:.3f}", f"{s['mean_gap_us']:.2f}",
                             f"{s['median_gap_us']:.2f}", f"{s['largest_gap_us']:.1f}"])
            reason = idle_reason(s)
            notes.append(f"- **{label}**: " + (md_escape(f"idle {100 * s['idle_share']:.0f}% of the step: {reason}")
                                               if reason else
                                               md_escape(f"idle {100 * s['idle_share']:.1f}% of the step: the GPU "
                                                         "runs kernels nearly back to back; the step is kernel "
                                                         "time")))
            host = host_gaps.describe(s.get("host_in_idle") or {})
            if host:
                notes[-1] += md_escape(f"; {host}")
            sample_rows += _sample_rows(label, (s.get("host_in_idle") or {}).get("cpu_samples"))
    out += _table(["capture", "mode", "graph launches/step", "kernel launches/step", "memcpy/memset calls/step",
                   "sync calls/step", "kernels/step", "ops replayed from a graph/step", "ops launched eagerly/step"],
                  rows)
    out += [""]
    if short_rows:
        under = next(d["short_kernels"]["under_us"] for cap in data.captures for d in cap.budget["devices"]
                     if d.get("short_kernels"))
        out += [f"Short kernels: launches per step that run under {under:g} µs (their launch and tail cost about as "
                "much as their work; fusing them or replaying them in a graph is what shortens them) and what they "
                "cost.", ""]
        out += _table(["capture", "kernels/step", f"under {under:g} µs/step", "share of launches", "their ms/step",
                       "share of GPU op time"], short_rows)
        out += [""]
    out += _table(["capture", "mean step ms", "idle ms", "idle share", "idle waiting for a replay to start ms",
                   "idle between replayed nodes ms",
                   "idle before eager ops ms", "mean gap µs", "median nonzero gap µs", "largest gap per step µs"],
                  gap_rows)
    out += [""] + notes + [""]
    if sample_rows:
        out += ["CPU samples (nsys `--sample`) of each step's CPU thread, the thread that launches the step's GPU "
                "work, that fall inside the step's idle gaps: by leaf function (and the innermost Python function "
                "of the call chain, where it has Python frames); a sample stands for one sampling period of CPU "
                "time, so its share of the idle is samples × period over the idle time.", ""]
        out += _table(["capture", "leaf function", "module", "Python function", "samples/step", "share of idle"],
                      sample_rows)
        out += [""]
    name = data.charts.get("launches")
    if name:
        out += [f"![busy vs idle time and how the ops are launched, per capture]({name})", ""]
    return out


def _sample_rows(label: str, summary) -> list:
    """Table rows for one device's CPU samples in the idle gaps: all of them, then the top functions."""
    if not summary:
        return []
    def share(x):
        return _pct(x) if x is not None else "n/a"

    rows = [[label, "all samples of the thread", "", "", f"{summary['samples_per_step']:.2f}",
             share(summary["share_of_idle"])]]
    for f in summary["functions"]:
        rows.append([label, md_escape(f["function"]), md_escape(f["module"]), md_escape(f["python"] or ""),
                     f"{f['samples_per_step']:.2f}", share(f["share_of_idle"])])
    return rows


def tp_section(data) -> list:
    """Tensor parallelism: per rank, collective time split into transfer and waiting for the slowest rank."""
    caps = [c for c in data.captures if c.budget.get("comm")]
    if not caps:
        return []
    out = ["## Tensor parallelism", "",
           "The k-th collective of a step is matched on every rank: its transfer time is its duration on the rank "
           "that arrived last; on every other rank the rest is waiting for that rank (skew, not communication).", ""]
    for cap in caps:
        rows, devices = [], [d for d in cap.budget["devices"] if d.get("comm")]
        for d in devices:
            c = d["comm"]
            share = c["wait_ms_per_step"] / c["collective_ms_per_step"] if c["collective_ms_per_step"] else 0.0
            rows.append([f"GPU {md_escape(d['device'])}", f"{d['mean_step_ms']:.3f}", f"{c['collective_ms_per_step']:.3f}",
                         f"{c['transfer_ms_per_step']:.3f}", f"{c['wait_ms_per_step']:.3f}", _pct(share),
                         f"{c.get('caused_wait_ms_per_step', 0.0):.3f}", _pct(c["slowest_rank_share"])])
        out += [f"### {md_name(cap.label)}", ""]
        out += _table(["rank", "mean step ms", "collectives ms/step", "transfer ms", "wait ms", "wait share",
                       "others' wait it caused ms", "slowest in % of steps"], rows)
        if devices:
            slow = max(devices, key=lambda d: (d["comm"].get("caused_wait_ms_per_step", 0.0),
                                               d["comm"]["slowest_rank_share"]))
            others = [d for d in devices if d is not slow]
            caused = slow["comm"].get("caused_wait_ms_per_step", 0.0)
            total = sum(d["comm"]["collective_ms_per_step"] for d in others)
            out += ["", md_escape(
                f"GPU {slow['device']} is the rank the others wait for: they spend {caused:.3f} ms/step in all "
                f"waiting at collectives it reached last"
                + (f" ({100 * caused / total:.0f}% of their collective time)" if total else "")
                + f"; it was the slowest rank in {100 * slow['comm']['slowest_rank_share']:.0f}% of "
                f"{cap.budget['comm'].get('steps_compared', '?')} steps. Speed up that rank's work before the "
                "collectives (or its launches), not the all-reduce.")]
        out.append("")
    return out
