"""Is the window's timing trustworthy: kernels slow only on their first call (JIT, autotuning), step times that
still drift (warm-up not finished), profiler overhead, and the number of steps against what was asked for."""
from __future__ import annotations

import numpy as np

from profattr.attribute.steady import steady_state
from profattr.check import FAIL, PASS, SKIP, WARN, Finding, short
from profattr.check.first_calls import FirstCalls
from profattr.run_record import RunRecord, or_empty

# first-call outliers: a kernel's first run this many times its median, and longer than the median by this much
FIRST_CALL_RATIO = 10.0
FIRST_CALL_MIN_EXCESS_NS = 50_000
FIRST_CALL_MIN_RUNS = 3
# a one-off kernel this long, early in the window (first share of it), also looks like JIT or autotuning
ONE_OFF_MIN_NS = 1_000_000
ONE_OFF_EARLY_SHARE = 0.1
# outliers costing more than this share of all kernel time make the budget wrong, not just noisy
OUTLIER_FAIL_SHARE = 0.01
# profiled / unprofiled ms per token
OVERHEAD_WARN = 1.3
OVERHEAD_FAIL = 3.0
# profiled and unprofiled steps agree within their noise, and at least this share of the step
STEP_AGREE_SHARE = 0.02
# steps that drift cost more than this share of the step time: the budget's means are off
DRIFT_FAIL_SHARE = 0.05


def _is_collective(name: str) -> bool:
    """A communication kernel (the taxonomy files it under comm.*): its duration includes waiting for peers."""
    from profattr.taxonomy.classify import load_rules

    return str(load_rules().classify(name or "")).startswith("comm.")


def _late_peer(calls: FirstCalls, names: dict, outlier: tuple) -> tuple:
    """For a collective's slow first call: (wait_ns, late devices, the latest device's own first-call ns) when
    another device reached its first call of the same kernel later, so the slow call was this device waiting for
    that rank; (0, [], 0) otherwise."""
    _excess, name_id, dev, first_ns, _med = outlier
    if not _is_collective(names.get(name_id) or ""):
        return 0, [], 0
    first = calls.first_calls_of(name_id)  # device -> (start, duration) of its first call of this kernel
    if dev not in first:
        return 0, [], 0
    mine = first[dev][0]
    late = {d: s - mine for d, (s, _du) in first.items() if d != dev and s > mine}
    if not late:
        return 0, [], 0
    latest = max(late, key=late.get)
    wait = min(late[latest], first_ns)
    return wait, sorted(d for d, lag in late.items() if lag >= wait / 2), first[latest][1]


def check_first_calls(source, devices: list, run: RunRecord | None = None, calls: FirstCalls | None = None) -> Finding:
    """Kernels whose first call of a launch configuration ran far longer than its others (JIT, autotuning), or,
    called once, long and early in the window. `calls`: the figures already summed (first_calls.py FirstCalls,
    window by window), else they come from the reader's kernel_configs."""
    if not devices:
        return Finding("first_calls", SKIP, "no kernels")
    if calls is None or not calls.usable:
        calls = FirstCalls.of_configs(source.kernel_configs())
    if not calls.configs:
        return Finding("first_calls", SKIP, "no kernels")
    total_ns = calls.total_ns
    window_start = {d["deviceId"]: d["first_start_ns"] for d in devices}
    window_len = {d["deviceId"]: max(1, d["last_end_ns"] - d["first_start_ns"]) for d in devices}
    median_all = calls.durations.median()
    outliers = []
    for key, (first, first_start, n_calls, rest) in calls.configs.items():
        dev, name_id = key[0], key[1]
        if dev not in window_start:
            continue
        if n_calls >= FIRST_CALL_MIN_RUNS:
            med = rest.median()
            if first > FIRST_CALL_RATIO * med and first - med > FIRST_CALL_MIN_EXCESS_NS:
                outliers.append((first - med, name_id, dev, first, med))
        elif n_calls == 1:
            early = (first_start - window_start[dev]) <= ONE_OFF_EARLY_SHARE * window_len[dev]
            if early and first >= ONE_OFF_MIN_NS and first > FIRST_CALL_RATIO * median_all:
                outliers.append((first - median_all, name_id, dev, first, median_all))
    if not outliers:
        return Finding("first_calls", PASS, "no first-call outliers (JIT, autotuning) inside the window")
    outliers.sort(reverse=True)
    excess = sum(o[0] for o in outliers)
    share = excess / max(1, total_ns)
    names = source.strings(o[1] for o in outliers)
    worst = outliers[0]
    name = short(names.get(worst[1], f"<string {worst[1]}>"))
    wait_ns, late, late_own_ns = _late_peer(calls, names, worst)
    data = {"outliers": len(outliers), "excess_ms": excess / 1e6, "share_of_kernel_time": share,
            "worst": [{"name": names.get(o[1]), "device": o[2], "first_ms": o[3] / 1e6, "median_ms": o[4] / 1e6}
                      for o in outliers[:3]]}
    status = FAIL if share > OUTLIER_FAIL_SHARE else WARN
    head = (f"{len(outliers)} kernel(s) ran much longer on their first call ({excess / 1e6:.2f} ms extra, "
            f"{share:.1%} of kernel time)")
    if wait_ns >= worst[0] / 2:
        # a collective's first call that spans another rank's late arrival: the ranks entered the window out of
        # step; the kernel itself was not slow, and only this device's budget counts the wait as communication
        data["worst_is_wait_for"] = {"devices": late, "wait_ms": wait_ns / 1e6,
                                     "late_device_first_ms": late_own_ns / 1e6}
        peers = ", ".join(str(d) for d in late)
        why = ("; the CUDA graph was captured inside the window (graph_captured_in_window), so the ranks "
               "finished capturing at different times" if or_empty(run).graph_captured_in_window
               else "")
        return Finding("first_calls", status, f"{head}; worst: the first {name} on device {worst[2]} took "
                       f"{worst[3] / 1e6:.3f} ms (median {worst[4] / 1e6:.3f}) because it waited "
                       f"{wait_ns / 1e6:.2f} ms for device(s) {peers} to reach the same collective (whose own first "
                       f"call took {late_own_ns / 1e6:.3f} ms, so it is not the collective's set-up): the ranks "
                       f"entered the window out of step{why}. Device {worst[2]}'s budget counts the wait as "
                       "communication; open the window once every rank is ready (e.g. --graph-window after)",
                       data)
    full = names.get(worst[1]) or ""
    if "marlin" in full.lower():
        # SGLang JIT-builds its Marlin modules (dense device::marlin, experts device::marlin_moe) with nvcc on first
        # use (tvm-ffi cache); a window opened while they were compiling or loading starts with such a call
        data["jit_module"] = "marlin_moe" if "marlin_moe" in full else "marlin"
        return Finding("first_calls", status, f"{head}; worst: {name} {worst[3] / 1e6:.3f} ms vs median "
                       f"{worst[4] / 1e6:.3f} ms: the window opened while the JIT-built Marlin module "
                       f"({data['jit_module']}) was still compiling or loading; warm up until the server has built "
                       "both Marlin modules (dense and MoE), or reuse their built cache", data)
    return Finding("first_calls", status, f"{head}; worst: {name} {worst[3] / 1e6:.3f} ms vs median "
                   f"{worst[4] / 1e6:.3f} ms: warm-up did not cover the window's shapes", data)


def check_steady_state(budget) -> Finding:
    """Warn when the step times still drift: a slow start (warm-up not finished) or a trend through the window."""
    if budget is None or not budget.devices:
        return Finding("steady_state", SKIP, "no steps")
    worst = None
    per_device = {}
    for d in budget.devices:
        spans = budget.per_step.loc[budget.per_step["device"] == d["device"]].sort_values("start_ns")
        result = steady_state(spans["span_ns"].to_numpy())
        per_device[str(d["device"])] = result.to_dict()
        if result.unsteady and (worst is None or result.excess_share > worst[1].excess_share):
            worst = (d["device"], result)
    if worst is None:
        n = min(d["steps"] for d in budget.devices)
        if n < 6:
            return Finding("steady_state", SKIP, f"only {n} steps: too few to tell a drift", {"devices": per_device})
        return Finding("steady_state", PASS, "step times show no warm-up or trend", {"devices": per_device})
    dev, r = worst
    status = FAIL if r.excess_share > DRIFT_FAIL_SHARE and r.warmup_steps else WARN
    return Finding("steady_state", status, f"device {dev}: {r.describe()}; budget, diff and report can leave them "
                   f"out with --skip-steps {r.warmup_steps or 'auto'}", {"devices": per_device})


def profiled_timing(budget) -> dict:
    """Profiled ms/token measured in the capture: the median step span per device (at batch B one step decodes one
    token of each request, so it is the per-request ms/token) and the slowest device's, with where it came from.
    Empty when there is no budget."""
    if budget is None or not budget.devices:
        return {}
    per_device = [{"device": int(d["device"]), "step_ms": float(d["step_ms"]), "steps": int(d["steps"])}
                  for d in budget.devices]
    slowest = max(per_device, key=lambda d: d["step_ms"])
    return {"ms_per_token_profiled": slowest["step_ms"],
            "profiled_source": (f"capture: median step span ({budget.steps_source} steps), slowest of "
                                f"{len(per_device)} device(s): device {slowest['device']}"),
            "profiled_per_device": per_device}


def _client_profiled(run: RunRecord | None):
    """The client-side profiled ms/token of a run, if it recorded one (older runs kept it under
    ms_per_token_profiled without a profiled_source)."""
    run = or_empty(run)
    value = run.ms_per_token_profiled_client
    if value is None and not run.profiled_source:
        value = run.ms_per_token_profiled
    return value


def _step_spread_ms(budget, device: int) -> float:
    """Half the interquartile range of a device's step spans (ms): the capture's own step-to-step noise."""
    spans = budget.per_step.loc[budget.per_step["device"] == device, "span_ns"].to_numpy(dtype=float)
    if len(spans) < 2:
        return 0.0
    q25, q75 = np.percentile(spans, [25, 75])
    return float(q75 - q25) / 2e6


def check_step_overhead(run: RunRecord, budget, measured: dict) -> Finding:
    """Profiled against unprofiled as the same quantity: the capture's median step against the server's own
    unprofiled decode step at the window's batch (timing.unprofiled_step). They disagree when they differ by more
    than their noise (half the interquartile range of each, and at least STEP_AGREE_SHARE of the step): a profiled
    step shorter than the unprofiled one means the capture's steps leave out part of what decode takes (host time
    between steps, say), and a longer one is the profiler's cost."""
    step = run.unprofiled_step
    unprof = float(step["ms_per_step"])
    prof = measured["ms_per_token_profiled"]
    slowest = max(measured["profiled_per_device"], key=lambda d: d["step_ms"])["device"]
    noise = max(STEP_AGREE_SHARE * unprof,
                (float(step.get("p75_ms", unprof)) - float(step.get("p25_ms", unprof))) / 2
                + _step_spread_ms(budget, slowest))
    ratio = prof / unprof
    data = {"ms_per_step_unprofiled": unprof, "ms_per_step_profiled": prof, "ratio": ratio, "noise_ms": noise,
            "unprofiled_source": f"{step.get('method', 'server log')}; {step.get('lines', '?')} lines from "
                                 f"{step.get('lines_from', 'the log')}",
            "profiled_source": measured["profiled_source"], "profiled_per_device": measured["profiled_per_device"],
            "ms_per_token_unprofiled_client": run.ms_per_token_unprofiled}
    text = (f"median step {prof:.3f} ms under the profiler vs {unprof:.3f} ms per unprofiled decode step at batch "
            f"{step.get('batch', '?')} from the server's decode lines ({ratio:.2f}x; noise +/-{noise:.3f} ms)")
    if prof < unprof - noise:
        return Finding("overhead", FAIL, f"{text}: the capture's steps are shorter than decode steps without the "
                       "profiler, so they leave out part of a step (host work between steps, outside every step's "
                       "GPU span); absolute ms/step understate decode", data)
    if prof <= unprof + noise:
        return Finding("overhead", PASS, f"{text}: they agree", data)
    if ratio <= OVERHEAD_WARN:
        return Finding("overhead", WARN, f"{text}: the profiler costs {prof - unprof:.3f} ms/step; compare shares "
                       "of the step, not absolute ms", data)
    return Finding("overhead", FAIL, f"{text}: the profiler changes the step beyond its noise; absolute times are "
                   "not representative (fewer traced APIs, or --cuda-graph-trace=node overhead)", data)


def check_overhead(run: RunRecord | None, budget=None) -> Finding:
    run = or_empty(run)
    unprof = run.ms_per_token_unprofiled
    measured = profiled_timing(budget)
    if measured and run.unprofiled_step.get("ms_per_step"):
        return check_step_overhead(run, budget, measured)
    client = _client_profiled(run)
    if measured:
        prof, source = measured["ms_per_token_profiled"], "median step span in the capture"
    else:
        # no steps in the capture: fall back to what the target measured around the window
        prof = run.ms_per_token_profiled if run.profiled_source else client
        source = "client-side"
    if not unprof or not prof:
        return Finding("overhead", SKIP, "profiled and unprofiled ms/token not both recorded in run.json")
    ratio = prof / unprof
    data = {"ms_per_token_unprofiled": unprof, "ms_per_token_profiled": prof, "ratio": ratio,
            "profiled_source": measured.get("profiled_source", source)}
    if measured:
        data["profiled_per_device"] = measured["profiled_per_device"]
    if client is not None:
        data["ms_per_token_profiled_client"] = client
    where = source if len(measured.get("profiled_per_device", [])) < 2 else (
        f"{source}, slowest of {len(measured['profiled_per_device'])} devices")
    text = f"{prof:.3f} ms/token under the profiler ({where}) vs {unprof:.3f} unprofiled ({ratio:.2f}x)"
    if ratio <= OVERHEAD_WARN:
        return Finding("overhead", PASS, text, data)
    if ratio <= OVERHEAD_FAIL:
        return Finding("overhead", WARN, f"{text}: compare shares of the step, not absolute ms", data)
    return Finding("overhead", FAIL, f"{text}: the profiler dominates the step; absolute times are not "
                   "representative (fewer traced APIs, or --cuda-graph-trace=node overhead)", data)


def check_steps(run: RunRecord | None, budget, why_not: str | None, devices: list | None = None) -> Finding:
    """Steps counted per device (each tensor-parallel rank runs every step) against the steps requested."""
    requested = or_empty(run).steps_requested
    if not requested:
        return Finding("steps", SKIP, "no requested step count in run.json")
    if budget is None:
        return Finding("steps", SKIP, why_not or "no budget")
    requested = int(requested)
    per_device = {int(d["device"]): int(d["steps"]) for d in budget.devices}
    for d in devices or []:  # a device with kernels but no step
        per_device.setdefault(int(d["deviceId"]), 0)
    counts = sorted(set(per_device.values())) or [0]
    counted = counts[0]
    data = {"requested": requested, "counted": counted, "per_device": {str(k): v for k, v in per_device.items()},
            "source": budget.steps_source, "excluded": budget.steps_excluded}
    if len(per_device) <= 1:
        text = f"{counted} steps counted ({budget.steps_source}) for {requested} requested"
    elif len(counts) == 1:
        text = (f"{counted} steps counted on each of {len(per_device)} devices ({budget.steps_source}) for "
                f"{requested} requested")
    else:
        listed = ", ".join(f"device {k}: {v}" for k, v in sorted(per_device.items()))
        text = f"steps counted ({budget.steps_source}) per device differ ({listed}) for {requested} requested"
    left_out = sum(budget.steps_excluded.values())
    if left_out:
        text += f"; {left_out} left out (" + "; ".join(f"{v} {k}" for k, v in budget.steps_excluded.items()) + ")"
    if counted == 0:
        return Finding("steps", FAIL, f"{text}: no decode step found in the window"
                       + (" on some device" if len(per_device) > 1 else ""), data)
    # SGLang counts the prefill of the window's requests as a step; it is no graph replay
    if all(requested - 2 <= v + left_out <= requested + 1 for v in per_device.values()):
        return Finding("steps", PASS, text, data)
    reason = budget.steps_reason or ""
    return Finding("steps", WARN, f"{text}: the window held other work than the requested decode steps"
                   + (f" ({reason})" if reason else ""), data)
