"""Collective time of each rank split into transfer and wait (skew between ranks).

A collective kernel (taxonomy category `comm.*`: NCCL, custom and fused all-reduce) starts on each rank when that
rank reaches it and ends on all ranks at about the same time, once the last rank has arrived and the data has moved.
So the last arriver's kernel time is the real transfer, and on every other rank the extra time is spent waiting for
the slowest rank. Definitions (devices are ranks; one capture holds all ranks' processes):

- steps of each device are taken in time order; step k of every device is the same decode step;
- collective instance (k, j): the j-th collective kernel, in GPU start order, of step k on each device; an instance
  is complete when every device with collectives has it;
- for a complete instance: the last arriver is the device whose kernel started last; `transfer` is that kernel's
  duration; on each device `wait = max(0, duration - transfer)` and that device's transfer is `duration - wait`
  (so on every device wait + transfer = its collective time exactly; the clip at 0 only absorbs a rank whose kernel
  ended a little earlier than the last arriver's);
- an incomplete instance (rank counts differ) is all transfer and counted as unmatched;
- the slowest rank of step k: the device the others waited for most in that step, i.e. the largest sum, over the
  instances where it arrived last, of the other devices' waits (ties: most last arrivals, then the lower id);
  `slowest_rank_share` = share of the compared steps in which a device was it; `caused_wait_ms_per_step` = the
  other ranks' wait, summed over the instances where this device arrived last, per step: who the others wait for.
"""
from __future__ import annotations

import numpy as np

from profattr.arrays import unique
import pandas as pd

COMM_PREFIX = "comm."
NS_PER_MS = 1e6


def collective_split(ops, step: np.ndarray, step_start: np.ndarray, category: np.ndarray,
                     steps_per_device: dict):
    """(per-device dict, summary dict, per-step DataFrame) or None when fewer than two devices run collectives.

    per-device: device -> {"collective_ms_per_step", "transfer_ms_per_step", "wait_ms_per_step",
    "slowest_rank_share", "instances_per_step", "unmatched_per_step", "by_category": [{"category",
    "collective_ms_per_step", "wait_ms_per_step"}]}; summary: {"ranks", "steps_compared",
    "slowest_rank_per_step"}; per-step frame: device, step, category, collective_ns, wait_ns.
    """
    inside = step >= 0
    codes, names = pd.factorize(category)  # few distinct categories: test each name once, not each op
    is_comm = inside & np.array([str(c).startswith(COMM_PREFIX) for c in names], dtype=bool)[codes]
    devices = sorted({int(d) for d in unique(ops.device[is_comm])})
    if len(devices) < 2:
        return None
    # step rank k per device: order of the device's steps (those with any work on it) by CPU start
    frames = []
    for device in devices:
        on_dev = inside & (ops.device == device)
        dev_steps = unique(step[on_dev])
        dev_steps = dev_steps[np.argsort(step_start[dev_steps], kind="stable")]
        k_of_step = pd.Series(np.arange(len(dev_steps)), index=dev_steps)
        idx = np.flatnonzero(is_comm & (ops.device == device))
        idx = idx[np.lexsort((ops.stream[idx], ops.start[idx]))]
        f = pd.DataFrame({"device": device, "step": step[idx], "start": ops.start[idx],
                          "dur": ops.duration_ns[idx], "category": category[idx]})
        f["k"] = k_of_step.loc[f["step"].to_numpy()].to_numpy()
        f["j"] = f.groupby("k").cumcount()
        frames.append(f)
    table = pd.concat(frames, ignore_index=True)
    n_dev = len(devices)
    per_instance = table.groupby(["k", "j"])["device"].transform("size")
    table["complete"] = per_instance == n_dev
    comp = table[table["complete"]]
    # last arriver per instance: the largest start (ties: the larger device id, deterministic)
    last_pos = comp.sort_values(["k", "j", "start", "device"]).groupby(["k", "j"]).tail(1)
    transfer = last_pos.set_index(["k", "j"])["dur"].rename("transfer")
    last_dev = last_pos.set_index(["k", "j"])["device"].rename("last")
    table = table.join(transfer, on=["k", "j"]).join(last_dev, on=["k", "j"])
    table["wait"] = np.where(table["complete"], np.clip(table["dur"] - table["transfer"].fillna(0), 0, None), 0)
    table["wait"] = table["wait"].astype(np.int64)

    # slowest rank per step k: the wait it caused (others' wait in the instances it arrived last), then arrivals
    comp = table[table["complete"]]
    step_ks = sorted(set(comp["k"].tolist()))
    caused = comp.groupby(["k", "j", "last"])["wait"].sum().rename("caused").reset_index()
    caused = caused.groupby(["k", "last"]).agg(caused=("caused", "sum"), n_last=("caused", "size")).reset_index()
    caused = caused.sort_values(["k", "caused", "n_last", "last"], ascending=[True, False, False, True])
    slowest = caused.groupby("k").head(1).set_index("k")["last"]
    slowest_per_step = [int(slowest[k]) for k in step_ks]
    caused_by = caused.groupby("last")["caused"].sum()  # the other ranks' wait each rank caused, over all steps

    per_device, per_step = {}, []
    for device in devices:
        t = table[table["device"] == device]
        n = steps_per_device[device]
        coll_ns, wait_ns = float(t["dur"].sum()), float(t["wait"].sum())
        by_cat = t.groupby("category")[["dur", "wait"]].sum().reset_index().sort_values("dur", ascending=False)
        per_device[device] = {
            "collective_ms_per_step": coll_ns / n / NS_PER_MS,
            "transfer_ms_per_step": (coll_ns - wait_ns) / n / NS_PER_MS,
            "wait_ms_per_step": wait_ns / n / NS_PER_MS,
            "slowest_rank_share": (sum(1 for d in slowest_per_step if d == device) / len(slowest_per_step)
                                   if slowest_per_step else 0.0),
            "caused_wait_ms_per_step": float(caused_by.get(device, 0.0)) / n / NS_PER_MS,
            "instances_per_step": len(t) / n,
            "unmatched_per_step": float((~t["complete"]).sum()) / n,
            "by_category": [{"category": r.category, "collective_ms_per_step": r.dur / n / NS_PER_MS,
                             "wait_ms_per_step": r.wait / n / NS_PER_MS} for r in by_cat.itertuples()],
        }
        per_step.append(t.groupby(["step", "category"])[["dur", "wait"]].sum().reset_index()
                        .assign(device=device))
    frame = pd.concat(per_step, ignore_index=True).rename(columns={"dur": "collective_ns", "wait": "wait_ns"})
    frame = frame[["device", "step", "category", "collective_ns", "wait_ns"]]
    summary = {"ranks": devices, "steps_compared": len(step_ks), "slowest_rank_per_step": slowest_per_step}
    return per_device, summary, frame
