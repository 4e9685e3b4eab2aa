"""How much a decode step varies, level by level: between the steps of one window, between the windows of one
server, and between servers (launches) of the same configuration.

Captures are grouped into configurations (what the server ran: SGLang's resolved server arguments as its log line
records them, the request batch, the model, tensor parallelism; or the built-in workload's spec), and within one into
servers (diff_stats.server_key: the windows one `profattr capture` run opened in one launch) and windows (one capture
each). The components are the method-of-moments estimates of a nested random-effects model on the per-step values
y[server, window, step]:

    step variance   s2_step = within-window variance of the steps, pooled over windows
    window variance s2_win  = variance of a server's window means, pooled over servers with 2+ windows,
                              minus what the steps put in a mean of n steps (s2_step x mean 1/n); 0 when negative
    server variance s2_srv  = variance of the server means (each the mean of its windows), minus what windows and
                              steps put in them; 0 when negative; only with 2+ servers of the configuration

Each is given as a standard deviation (ms) and as its share of the variance of one step, with its degrees of
freedom: with two windows per server and two servers these rest on 1-2 degrees of freedom each, which is a rough
estimate, and the output says so. What else differs between the servers of a configuration (confounds.py: flags the
log line leaves out, the CUDA graphs the server captured, versions, clocks) is listed with them, since the server
component then holds it too.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from profattr.attribute.confounds import IGNORED_SERVER_ARGS, compare_runs
from profattr.attribute.diff_stats import NS_PER_MS, server_key
from profattr.errors import ProfattrError
from profattr.run_record import RunRecord

SCHEMA = "profattr.variance/1"
METRICS = ("step_ms", "busy_ms", "idle_ms")  # the step's span, the GPU's busy time in it, and its idle time


def configuration_key(run: Optional[RunRecord]) -> str:
    """What a server ran, as a JSON string: captures with the same key are the same configuration."""
    if run is None:
        return json.dumps({"run": None})
    args = {k: v for k, v in run.logged_server_args.items() if k not in IGNORED_SERVER_ARGS}
    workload = run.workload
    key = {"model": run.model, "tp": run.tp, "batch": run.batch, "backend": run.backend_requested,
           "server_args": args,
           "workload": {k: v for k, v in workload.items() if k not in ("seed", "name", "output")} if workload
           else None}
    return json.dumps(key, sort_keys=True, default=str)


def describe_configuration(run: Optional[RunRecord]) -> str:
    """A short name for a configuration: MoE runner, FP8 GEMM backend, batch (or the run's name)."""
    if run is None:
        return "unknown (no run.json)"
    resolved = run.resolved
    batch = run.batch
    parts = []
    if resolved.get("moe_runner_backend"):
        parts.append(f"MoE runner {resolved['moe_runner_backend']}")
    if resolved.get("fp8_gemm_runner_backend"):
        parts.append(f"FP8 GEMM {resolved['fp8_gemm_runner_backend']}")
    if batch is not None:
        parts.append(f"batch {batch}")
    return ", ".join(parts) or str(run.name or "?")


def window_values(side, device) -> dict | None:
    """{metric: per-step values (ms)} of one window on one device, or None without per-step data there."""
    ps = side.per_step
    if ps is None:
        return None
    steps = ps[ps["device"] == device]
    if len(steps) < 2:
        return None
    span = steps["span_ns"].to_numpy(dtype=float) / NS_PER_MS
    busy = steps["busy_ns"].to_numpy(dtype=float) / NS_PER_MS
    return {"step_ms": span, "busy_ms": busy, "idle_ms": span - busy}


def components(servers: list) -> dict:
    """Variance components of one metric. `servers`: a list per server of its windows' per-step arrays."""
    windows = [w for s in servers for w in s]
    within_df = sum(len(w) - 1 for w in windows)
    s2_step = sum(float(np.var(w, ddof=1)) * (len(w) - 1) for w in windows) / within_df if within_df else 0.0
    inv_n = float(np.mean([1.0 / len(w) for w in windows]))
    multi = [s for s in servers if len(s) >= 2]
    window_df = sum(len(s) - 1 for s in multi)
    s2_win = None
    if multi:
        v = sum(float(np.var([w.mean() for w in s], ddof=1)) * (len(s) - 1) for s in multi) / window_df
        s2_win = max(0.0, v - s2_step * inv_n)
    s2_srv = None
    if len(servers) >= 2:
        means = [np.mean([w.mean() for w in s]) for s in servers]
        # what windows and steps put in a server's mean of k windows of n steps
        carried = float(np.mean([((s2_win or 0.0) + s2_step * np.mean([1.0 / len(w) for w in s])) / len(s)
                                 for s in servers]))
        s2_srv = max(0.0, float(np.var(means, ddof=1)) - carried)
    total = s2_step + (s2_win or 0.0) + (s2_srv or 0.0)
    rows = []
    for level, s2, df, note in (
            ("step", s2_step, within_df, "steps of one window around its mean"),
            ("window", s2_win, window_df, "windows of one server, beyond their steps' share"
             if s2_win is not None else "needs a server with 2+ windows"),
            ("server", s2_srv, len(servers) - 1, "servers (launches) of one configuration, beyond their windows"
             if s2_srv is not None else "needs 2+ servers of the configuration")):
        rows.append({"level": level, "sd_ms": None if s2 is None else float(np.sqrt(s2)),
                     "variance_share": None if s2 is None or total <= 0 else s2 / total,
                     "df": df if s2 is not None else 0, "note": note})
    all_steps = np.concatenate(windows)
    return {"mean_ms": float(all_steps.mean()), "components": rows,
            "window_means_ms": [[float(w.mean()) for w in s] for s in servers]}


def variance_report(sides: Sequence) -> dict:
    """The `profattr.variance/1` dict of loaded captures (diff.Side, one window each)."""
    if not sides:
        raise ProfattrError("no captures given; give the windows of one or more servers")
    configs: dict = {}
    for side in sides:
        configs.setdefault(configuration_key(side.run), []).append(side)
    out = []
    for key, members in configs.items():
        servers: dict = {}
        for i, side in enumerate(members):
            sk = server_key(side.run) or ("window", i)
            servers.setdefault(sk, []).append(side)
        groups = list(servers.values())
        firsts = [g[0] for g in groups]
        differences = [{"server": Path(g[0].path).name, "against": Path(firsts[0].path).name,
                        "differences": compare_runs(firsts[0].run, g[0].run)} for g in groups[1:]]
        devices = sorted(set.intersection(*[{d["device"] for d in s.budget["devices"]} for s in members]))
        dev_out = []
        for dev in devices:
            values = [[window_values(s, dev) for s in g] for g in groups]
            if any(v is None for g in values for v in g):
                continue
            dev_out.append({"device": dev, "metrics": [
                dict(metric=m, **components([[v[m] for v in g] for g in values])) for m in METRICS]})
        note = None if dev_out else "no per-step data (budget JSON input, or too few steps): nothing to split"
        out.append({"configuration": describe_configuration(members[0].run), "key": json.loads(key), "note": note,
                    "levels": {"servers": len(groups), "windows": len(members),
                               "steps": sum(int((s.budget.get("steps") or {}).get("count") or 0) for s in members)},
                    "servers": [{"server": "unknown" if server_key(g[0].run) is None else server_key(g[0].run)[1],
                                 "windows": [s.path for s in g]} for g in groups],
                    "between_servers": differences, "devices": dev_out})
    return {"schema": SCHEMA, "metrics": {"step_ms": "the step's GPU span", "busy_ms": "GPU busy time in the step",
                                          "idle_ms": "span minus busy"},
            "configurations": out}
