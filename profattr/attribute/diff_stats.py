"""How sure a diff is: 95 % intervals by a hierarchical bootstrap over the levels a side was measured at (servers,
windows within a server, steps within a window), and the practical threshold below which a change is not called one.

Each side is one or more captures (windows). Windows are grouped by server: a server is one launch of the serving
process, which run.json records (`session`: the windows one `profattr capture` run opened in one server; otherwise
each capture started its own). A bootstrap sample resamples a side's servers (with replacement), then within each
chosen server its windows, then within each chosen window its steps; a component's value is the mean over the
chosen servers of the mean over their chosen windows of the per-step means (the step time: of the median spans).

An interval covers only the levels a side has more than one of. Steps vary less than windows do (two windows of one
server, same configuration, differ by far more than their steps' interval says), so an interval over one or two
windows per side does not cover window-to-window variance (WINDOWS_FOR_VARIANCE), and one server per side does not
cover server-to-server variance (SERVERS_FOR_VARIANCE): `coverage` says which, and such a diff establishes no
change (diff.py's verdict).

A component is called a change only when its interval excludes 0 AND its size is at least the practical threshold:
max(PRACTICAL_MS, PRACTICAL_SHARE x A's step time). Smaller changes are real at best in the statistical sense and
never worth acting on (an A/A pair had a category "significant" for a 0.3 us change).
"""
from __future__ import annotations

import numpy as np

from profattr import cores
from profattr.run_record import RunRecord

NS_PER_MS = 1e6
PRACTICAL_MS = 0.001  # 1 us per step
PRACTICAL_SHARE = 0.005  # 0.5 % of the step
COMM_WAIT = "comm_wait"
WINDOWS_FOR_VARIANCE = 3  # windows per side from which resampling them says something about their spread
SERVERS_FOR_VARIANCE = 2  # servers per side for the interval to hold any server-to-server variance


def practical_ms(step_ms_a: float) -> float:
    return max(PRACTICAL_MS, PRACTICAL_SHARE * abs(step_ms_a))


def is_change(delta: float, ci, threshold: float) -> bool:
    """A change: beyond the interval's reach of 0 (when there is one) and at least the practical threshold."""
    if abs(delta) < threshold:
        return False
    return ci is None or not (ci[0] <= 0.0 <= ci[1])


def step_matrix(side, device: int, names: list) -> np.ndarray | None:
    """Steps x components matrix (ms) of one replicate, plus the span (last column), for bootstrapping. Category
    columns are the steps' exclusive time (`exclusive_ns`), or their op time when the components have `overlap`
    (budgets from before exclusive time)."""
    ps, psc = side.per_step, side.per_step_category
    if ps is None or psc is None:
        return None
    steps = ps[ps["device"] == device].set_index("step")
    if steps.empty:
        return None
    value = "ns" if "overlap" in names else "exclusive_ns"
    if value not in psc.columns:
        return None
    cat = psc.table(device, steps.index.to_numpy(), value)  # steps x categories (step_table.py), 0: did not run
    column = {name: j for j, name in enumerate(psc.categories)}
    wait = None
    d = next((x for x in side.budget["devices"] if x["device"] == device), {})
    if d.get("comm") and side.per_step_comm is None:
        return None  # the comm_wait split needs per-step waits; without them no interval is better than a wrong one
    if side.per_step_comm is not None:
        pc = side.per_step_comm[side.per_step_comm["device"] == device]
        if len(pc):
            wait = pc.pivot_table(index="step", columns="category", values="wait_ns", aggfunc="sum",
                                  fill_value=0).reindex(steps.index, fill_value=0)
    cols = []
    for name in names:
        if name.startswith("category:"):
            c = name.split(":", 1)[1]
            col = cat[:, column[c]].astype(float) if c in column else np.zeros(len(steps))
            if wait is not None and c in wait.columns:
                col = col - wait[c].to_numpy(dtype=float)
            cols.append(col)
        elif name == COMM_WAIT:
            cols.append(wait.to_numpy(dtype=float).sum(axis=1) if wait is not None else np.zeros(len(steps)))
        elif name == "idle":
            cols.append((steps["span_ns"] - steps["busy_ns"]).to_numpy(dtype=float))
        elif name == "overlap":
            cols.append(-(steps["op_ns"] - steps["busy_ns"]).to_numpy(dtype=float))
        else:  # step_variability is computed from the span column
            cols.append(np.zeros(len(steps)))
    cols.append(steps["span_ns"].to_numpy(dtype=float))
    return np.stack(cols, axis=1) / NS_PER_MS


BOOTSTRAP_CHUNK_CELLS = 1 << 18  # resampled cells (resamples x steps) drawn and worked on at once: 2 MB of indices,
# which stay in the core's cache while every component is gathered through them


def _replicate_samples(m: np.ndarray, names: list, rng, samples: int) -> np.ndarray:
    """samples x (components, median span, mean span) of one replicate's step bootstrap. Resamples are drawn in
    chunks of rows, which gives the very numbers one (samples x steps) draw would, so memory stays a few chunks'
    (a capture of 100k steps would otherwise need a matrix of gigabytes). The draws stay in order on this thread;
    each chunk's gathers and means are a task on the bootstrap's threads (numpy works without Python's lock), and
    every value is computed by the same operations as on one thread."""
    n = len(m)
    columns = np.ascontiguousarray(m.T)  # each component contiguous: faster gathers, the same values
    out = np.empty((samples, len(names) + 2))
    chunk = max(1, BOOTSTRAP_CHUNK_CELLS // max(n, 1))

    def work(idx: np.ndarray, lo: int, hi: int) -> None:
        for j in range(len(names)):
            out[lo:hi, j] = columns[j][idx].mean(axis=1)
        span = columns[-1][idx]
        out[lo:hi, -2] = np.median(span, axis=1)
        out[lo:hi, -1] = span.mean(axis=1)

    workers = threads()
    if workers < 2 or samples <= chunk:
        for lo in range(0, samples, chunk):
            hi = min(samples, lo + chunk)
            work(rng.integers(0, n, size=(hi - lo, n)), lo, hi)
        return out
    from concurrent.futures import ThreadPoolExecutor

    pending: list = []  # the chunks in flight, oldest first: at most two per thread
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="profattr-bootstrap") as pool:
        try:
            for lo in range(0, samples, chunk):
                hi = min(samples, lo + chunk)
                pending.append(pool.submit(work, rng.integers(0, n, size=(hi - lo, n)), lo, hi))
                while len(pending) > 2 * workers:
                    pending.pop(0).result()
            for task in pending:
                task.result()
        finally:
            for task in pending:  # an error in one chunk: the others are not started
                task.cancel()
    return out


def threads() -> int:
    """Threads of a bootstrap: the cores this process may use, at most 4 (PROFATTR_BOOTSTRAP_THREADS sets it; 1
    works on the calling thread alone)."""
    return cores.threads("PROFATTR_BOOTSTRAP_THREADS", 4)


def server_key(run: RunRecord | None) -> tuple | None:
    """The identity of the server launch a capture was made in, from its run.json: the `profattr capture` session
    (its windows share one server) with its creation time, else the run itself (a capture that started its own
    server). None without a run.json: the server is unknown."""
    if run is None:
        return None
    created = run.created_utc
    if run.session_name:
        return ("session", run.session_name, str(created))
    if run.name or created:
        return ("run", str(run.name), str(created))
    return None


def server_groups(keys: list) -> list:
    """Indices of the windows of each server, in first-seen order; a window of an unknown server (None) is a
    server of its own."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(("window", i) if key is None else key, []).append(i)
    return list(groups.values())


def levels(members: list) -> dict:
    """How many servers, windows and steps a side has (`servers` None when a window's server is unknown)."""
    keys = [server_key(m.run) for m in members]
    steps = sum(int((m.budget.get("steps") or {}).get("count") or 0) for m in members)
    return {"servers": None if any(k is None for k in keys) else len(set(keys)), "windows": len(members),
            "steps": steps}


def coverage(levels_a: dict, levels_b: dict) -> dict:
    """Which variance a diff's intervals cover, from both sides' levels."""
    windows = min(levels_a["windows"], levels_b["windows"])
    servers = [x["servers"] for x in (levels_a, levels_b)]
    known = all(s is not None for s in servers)
    covers_windows = windows >= WINDOWS_FOR_VARIANCE
    covers_servers = known and min(servers) >= SERVERS_FOR_VARIANCE
    covered = ["steps"] + (["windows"] if covers_windows else []) + (["servers"] if covers_servers else [])
    missing = []
    if not covers_windows:
        missing.append(f"window-to-window variance (fewer than {WINDOWS_FOR_VARIANCE} windows per side)")
    if not covers_servers:
        missing.append("server-to-server variance (" + (f"fewer than {SERVERS_FOR_VARIANCE} servers per side"
                                                         if known else "a capture without run.json: its server "
                                                         "is unknown") + ")")
    return {"covers": covered, "covers_window_variance": covers_windows, "covers_server_variance": covers_servers,
            "windows_per_side": [levels_a["windows"], levels_b["windows"]],
            "servers_per_side": servers, "missing": missing}


def _side_samples(mats: list, names: list, rng, samples: int, servers: list | None = None,
                  resample_windows: bool = True) -> np.ndarray:
    """samples x (components, median, mean) of a side: servers resampled, then their windows, then the windows'
    steps. `servers` holds the window indices of each server (default: each window its own server);
    resample_windows=False keeps every window (the steps-only interval, for comparison)."""
    per = np.stack([_replicate_samples(m, names, rng, samples) for m in mats])  # windows x samples x C
    rows = np.arange(samples)[:, None]
    if not resample_windows:
        return per.mean(axis=0)
    groups = servers if servers is not None else [[i] for i in range(len(mats))]
    by_server = []
    for windows in groups:
        w = np.asarray(windows)
        picks = w[rng.integers(0, len(w), size=(samples, len(w)))]
        by_server.append(per[picks, rows, :].mean(axis=1))
    by_server = np.stack(by_server)  # servers x samples x C
    picks = rng.integers(0, len(groups), size=(samples, len(groups)))
    return by_server[picks, rows, :].mean(axis=1)


def bootstrap(sides_a: list, sides_b: list, da: int, db: int, names: list, rng, samples: int) -> dict | None:
    """95 % intervals of the step delta ("step_ms") and of every component; None when a side has no per-step
    data or fewer than two steps."""
    mats_a = [step_matrix(s, da, names) for s in sides_a]
    mats_b = [step_matrix(s, db, names) for s in sides_b]
    if any(m is None or len(m) < 2 for m in mats_a + mats_b):
        return None
    sa = _side_samples(mats_a, names, rng, samples, server_groups([server_key(m.run) for m in sides_a]))
    sb = _side_samples(mats_b, names, rng, samples, server_groups([server_key(m.run) for m in sides_b]))
    out = {"step_ms": _ci(sb[:, -2] - sa[:, -2])}
    for j, name in enumerate(names):
        if name == "step_variability":
            v = (sb[:, -2] - sb[:, -1]) - (sa[:, -2] - sa[:, -1])
        else:
            v = sb[:, j] - sa[:, j]
        out[name] = _ci(v)
    return out


def _ci(values: np.ndarray) -> list:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]
