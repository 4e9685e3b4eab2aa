"""Projection of a decode step measured on one GPU to another GPU, tensor-parallel size or layer count.

`project_budget(budget, source, target, host, ...)` is pure: it takes a `profattr.budget/1` dict (the source
capture), the source and target ModelSpecs (the same model at the source's and the target's per-rank shapes), both
HardwareSpecs and the host figures of the source (attribute/host_cycle.py), and returns `profattr.project/1`.

The model, per launch shape of every kernel in the source (the budget's shape rows):
- bytes: a launch of a category whose floor row moves bytes (specs/category_floors.toml) moves, on the target, its
  source bytes times the row's per-launch byte ratio: (row bytes on the target / row bytes on the source) /
  (launches on the target / launches on the source); rows are the same floor rows `profattr gap` uses (floor.py);
- GEMM kernels whose launch grids a tile width explains over the model's linear layers: the launch model of
  limits/launch_model.py (t = t0 + max(W / c x waves / r_cta, W / BW_agg), roofs learned from the source's shapes,
  moved to the target GPU by the SM clock ratio and the DRAM bandwidth ratio; a tuned config the engine ships for
  the target's key sets the target's tile), anchored by each measured launch group of the source;
- other launches of a byte row: t = t_fixed + (d_source - t_fixed) x byte_ratio x BW_source / BW_target, t_fixed
  the smaller of the GPU's launch floor t0 (the median launch of the source's byte-free categories) and the kernel
  name's shortest mean duration over its launch shapes, x the SM clock ratio (source / target); in a GEMM category
  the byte ratio is the launch's own layers' (limits/layer_match.py: the grid ties each launch shape to the linear
  layers it runs, so a replicated layer keeps its bytes and a sharded one shrinks; a split-K reduce streams no
  weights and keeps its duration; a layer the target's engine does not run, none), and a GEMM launch on at most a
  quarter as many CTAs as SMs scales with the SM clock ratio instead of the bandwidth ratio (one CTA's rate binds);
- categories with no bytes floor (elementwise, quantization, rope, ...), and rows whose bytes at the source's
  bandwidth explain under 5% of their source time (latency-bound), keep their source duration per launch, scaled
  by the clock ratio;
- a category's time is at least its FLOPs over the target's dense peak for its precision;
- launches per step: per layer, times target layers / source layers (MoE categories: MoE layers); shapes that run
  once per step (lm_head, sampling) stay once;
- the step's GPU busy time keeps the source's overlap: each category's exclusive time scales with its time;
- collectives: an all-reduce per attention and per MLP block, and one more per step ((2 x layers + 1) per step) of
  hidden_size x batch x 2 bytes, from the target's measured small-message all-reduce latencies (limits/hardware.py;
  ring NCCL or one-shot), kept apart from compute; the source's own comm kernels are left out;
- host: the source's idle inside the step is carried over; when the host's measured cycle (graph launch to graph
  launch, less synchronizing waits) is longer than the projected GPU step, the step is host-bound and takes the
  measured host lead (step range start to the end of the graph launch call) plus the projected GPU time.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

from profattr.limits.gap import fit_precision_rows, floor_loads, row_of
from profattr.limits import launch_model as lm
from profattr.limits import layer_match
from profattr.limits.hardware import HardwareSpec
from profattr.limits.model import ModelSpec, tensor_category

SCHEMA = "profattr.project/1"
COMM_PREFIX = "comm"
# a row whose bytes explain under this share of its source time is latency-bound: its launches keep their duration
LATENCY_BOUND_EFFICIENCY = 0.05
INTERCONNECTS = {"pcie5": "pcie", "nvlink": "nvlink", "none": None}


def _moe_layers(spec: ModelSpec) -> int:
    cfg = spec.config or {}
    dense = int(cfg.get("first_k_dense_replace", 0) or 0)
    return max(spec.num_layers - dense, 1) if cfg.get("n_routed_experts") else spec.num_layers


def _count_ratio(category: str, source: ModelSpec, target: ModelSpec) -> float:
    if category.startswith("moe"):
        return _moe_layers(target) / _moe_layers(source)
    return target.num_layers / source.num_layers


def _gpu(budget: Mapping[str, Any], device: Any) -> Dict[str, Any]:
    for g in (budget.get("capture") or {}).get("gpus") or []:
        if g.get("id") == device:
            return g
    return {}


def _row_efficiency(device: Mapping[str, Any], row: str, loads: Mapping[str, Mapping[str, float]],
                    bandwidth_bytes_per_s: float) -> float:
    """Achieved share of the source's bandwidth by a floor row: its bytes over its measured time."""
    ms = sum(float(c["ms_per_step"]) for c in device.get("categories", []) if row_of(str(c["category"]), loads) == row)
    nbytes = loads.get(row, {}).get("bytes", 0.0)
    return nbytes / (ms * 1e-3) / bandwidth_bytes_per_s if ms > 0 and nbytes > 0 else 0.0


def _bytes_per_param(spec: ModelSpec, dtype: str) -> float:
    if dtype == "bf16":
        return 2.0
    quant = [g.bytes_per_param for g in spec.groups if g.category.startswith("gemm") and g.dtype != "bf16"]
    return quant[0] if quant else 2.0


def _launch_floor_us(kernels, loads_s) -> float:
    """Median duration (us) of the source step's launches in categories that move no bytes: the GPU's launch floor."""
    pts = sorted((float(s["mean_us"]), float(s["count_per_step"])) for k in kernels
                 if not loads_s.get(row_of(str(k["category"]), loads_s), {}).get("bytes")
                 for s in (k.get("shapes") or []))
    half, seen = sum(c for _, c in pts) / 2, 0.0
    for us, c in pts:
        seen += c
        if seen >= half:
            return us
    return 0.0


def _matched_families(kernels, source: ModelSpec, sms: int, t0_us: float) -> Dict[str, Dict[str, Any]]:
    """Per kernel name of a GEMM category whose grid a tile width explains: its groups, tile and roofs."""
    layers = {l["name"]: l for l in lm.linear_layers(source)}
    out: Dict[str, Dict[str, Any]] = {}
    for k in kernels:
        cat = str(k["category"])
        if not (cat.startswith("gemm") or cat == "moe.gemm") or not k.get("shapes") or \
                layer_match.is_helper(str(k["name"])):  # a split-K reduce streams no weights: no layer to match
            continue
        m = lm.match_shapes(cat, k["shapes"], list(layers.values()))
        if not m:
            continue
        groups = []
        for s, names in zip(k["shapes"], m["groups"]):
            g = s["shape"]["grid"]
            groups.append({"ctas": int(g[0]) * int(g[1]) * int(g[2]), "mean_us": float(s["mean_us"]),
                           "names": names, "layers": [(layers[n]["count"], lm.weight_bytes(
                               layers[n], _bytes_per_param(source, layers[n]["dtype"]))) for n in names]})
        out[str(k["name"])] = {"tile": m["tile"], "groups": groups, **lm.fit_family(groups, sms, t0_us)}
    pooled = sorted(f["rate_cta"] for f in out.values() if f["rate_cta"])
    for f in out.values():
        f["rate_cta_borrowed"] = not f["rate_cta"]
        if not f["rate_cta"] and pooled:
            f["rate_cta"] = pooled[len(pooled) // 2]
    return out


def _timed(fam: Optional[Mapping[str, Any]], target_layers: Mapping[str, Any]) -> bool:
    """Whether a kernel family takes the launch model: matched, and every layer it runs laid out on the target."""
    return bool(fam) and all(n in target_layers for g in fam["groups"] for n in g["names"])


def _shape_layers(kernels, families, source: ModelSpec, target: ModelSpec, target_layers) -> Dict[Any, Dict[str, Any]]:
    """{(kernel, shape index): byte ratio and layers} for the GEMM launches the launch model does not time, from
    the layers their grids run (limits/layer_match.py); the layers the launch model's families run are left out."""
    timed = {n for f in families.values() if _timed(f, target_layers) for g in f["groups"] for n in g["names"]}
    free = {l["name"]: l for l in lm.linear_layers(source) if l["name"] not in timed}
    by_cat: Dict[str, list] = {}
    for k in kernels:
        if str(k["category"]).startswith("gemm") and k.get("shapes") and \
                not _timed(families.get(str(k["name"])), target_layers):
            by_cat.setdefault(str(k["category"]), []).append(k)

    def per_param(side: str, dtype: str) -> float:
        return _bytes_per_param(source if side == "source" else target, dtype)

    out: Dict[Any, Dict[str, Any]] = {}
    for ks in by_cat.values():
        out.update(layer_match.shape_ratios(ks, free, target_layers, per_param, lm.TILE_WIDTHS))
    return out


def project_device(device: Mapping[str, Any], gpu: Mapping[str, Any], source: ModelSpec, target: ModelSpec,
                   src_hw: HardwareSpec, dst_hw: HardwareSpec, experts_touched: Optional[int] = None) -> Dict[str, Any]:
    """Per category: source ms, projected ms, and how (bytes ratio, bandwidth ratio, latency floors)."""
    bw_s = float(gpu.get("memoryBandwidth") or src_hw.memory_bandwidth_bytes_per_s.value)
    clock_s = float(gpu.get("clockRate") or (src_hw.clock_hz.value if src_hw.clock_hz else 0) or 0)
    clock_t = dst_hw.clock_hz.value if dst_hw.clock_hz else clock_s
    clock_ratio = clock_s / clock_t if clock_s and clock_t else 1.0
    bw_ratio = bw_s / dst_hw.memory_bandwidth_bytes_per_s.value
    cats = [str(c["category"]) for c in device.get("categories", [])]
    loads_s = fit_precision_rows(floor_loads(source, src_hw), cats)
    loads_t = fit_precision_rows(floor_loads(target, dst_hw), cats)
    kernels = [k for k in device.get("kernels") or [] if not str(k["category"]).startswith(COMM_PREFIX)]
    if source.dsa_runs and not target.dsa_runs:  # the target's engine runs dense MLA: no indexer kernels
        indexer = tensor_category("indexer_keys_read")
        kernels = [k for k in kernels if row_of(str(k["category"]), {indexer: {}}) != indexer]
    sms_s = int(gpu.get("smCount") or (src_hw.sm_count.value if src_hw.sm_count else 132))
    sms_t = int(dst_hw.sm_count.value) if dst_hw.sm_count else sms_s
    t0_us = _launch_floor_us(kernels, loads_s)
    families = _matched_families(kernels, source, sms_s, t0_us)
    target_layers = {l["name"]: l for l in lm.linear_layers(target, experts_touched)}
    shape_layers = _shape_layers(kernels, families, source, target, target_layers)
    by_cat: Dict[str, Dict[str, Any]] = {}
    for k in kernels:
        cat = str(k["category"])
        row = row_of(cat, loads_s)
        src_bytes = loads_s.get(row, {}).get("bytes", 0.0)
        tgt_bytes = loads_t.get(row, {}).get("bytes", 0.0)
        ratio_n = _count_ratio(cat, source, target)
        row_eff = _row_efficiency(device, row, loads_s, bw_s)
        latency_bound = src_bytes > 0 and row_eff < LATENCY_BOUND_EFFICIENCY
        byte_ratio = (tgt_bytes / src_bytes) / ratio_n if src_bytes > 0 and not latency_bound else None
        shapes = k.get("shapes") or [{"count_per_step": k["count_per_step"], "mean_us": k["mean_us"],
                                      "ms_per_step": k["ms_per_step"]}]
        t_fixed_us = min(t0_us, min(float(s["mean_us"]) for s in shapes)) * clock_ratio
        fam = families.get(str(k["name"]))
        entry = by_cat.setdefault(cat, {"category": cat, "row": row if src_bytes > 0 else None,
                                        "source_efficiency": row_eff if src_bytes > 0 else None,
                                        "latency_bound": latency_bound,
                                        "source_ms": 0.0, "bandwidth_ms": 0.0, "projected_ms": 0.0,
                                        "launches_source": 0.0, "launches_target": 0.0, "at_latency_floor": 0.0,
                                        "byte_ratio_per_launch": byte_ratio, "t_fixed_us": t_fixed_us,
                                        "launch_model": {}, "shape_layers": []})
        if _timed(fam, target_layers):
            roofs = lm.target_roofs(fam["rate_cta"] or 0.0, fam["bw_agg"] or 0.0, clock_s, clock_t, bw_s,
                                    dst_hw.memory_bandwidth_bytes_per_s.value)
            # a config the engine ships for the target's key: its tile, and one CTA's rate x its bytes in flight
            tuned = lm.target_config(str(k["name"]), source, target, src_hw.id, dst_hw.id,
                                     (source.derive_args or {}).get("engine", "sglang"))
            tile_t = tuned["tile_n"] if tuned else fam["tile"]
            if tuned:
                roofs["rate_cta"] *= tuned["inflight_ratio"]
            entry["launch_model"][str(k["name"])] = {
                "tile_n": fam["tile"], "target_tile_n": tile_t, "target_config_source": tuned and tuned["source"],
                "t0_us": t_fixed_us, "rate_cta_bytes_per_s": fam["rate_cta"],
                "rate_cta_borrowed": fam["rate_cta_borrowed"], "bw_agg_bytes_per_s": fam["bw_agg"],
                "target_rate_cta_bytes_per_s": roofs["rate_cta"], "target_bw_agg_bytes_per_s": roofs["bw_agg"]}
            src_layers = {l["name"]: l for l in lm.linear_layers(source)}

            def model_us(layer):
                w = lm.weight_bytes(layer, _bytes_per_param(source, layer["dtype"]))
                return lm.launch_us(w, lm._ctas(layer, fam["tile"]), sms_s, t_fixed_us / clock_ratio,
                                    fam["rate_cta"] or 0.0, fam["bw_agg"] or 0.0)

            for s, g in zip(shapes, fam["groups"]):
                n_s = float(s["count_per_step"])
                src_ms = n_s * float(s["mean_us"]) / 1e3
                entry["source_ms"] += src_ms
                entry["launches_source"] += n_s
                # the model gives the change; the source's measured time of the group anchors it (same shapes: same)
                model_src_ms = sum(src_layers[n]["count"] * model_us(src_layers[n]) for n in g["names"]) / 1e3
                model_tgt_ms = 0.0
                for name in g["names"]:
                    lt = target_layers[name]
                    if not lt["runs"]:  # the target's engine does not run this layer (the DSA indexer's)
                        continue
                    w_t = lm.weight_bytes(lt, _bytes_per_param(target, lt["dtype"]))
                    c_t = lm._ctas(lt, tile_t)
                    model_tgt_ms += lt["count"] * lm.launch_us(w_t, c_t, sms_t, t_fixed_us, roofs["rate_cta"],
                                                                 roofs["bw_agg"]) / 1e3
                    entry["bandwidth_ms"] += lt["count"] * w_t / dst_hw.memory_bandwidth_bytes_per_s.value * 1e3
                    entry["launches_target"] += lt["count"]
                entry["projected_ms"] += src_ms * model_tgt_ms / model_src_ms if model_src_ms > 0 else model_tgt_ms
            continue
        for i, s in enumerate(shapes):
            n_s = float(s["count_per_step"])
            n_t = n_s if abs(n_s - 1.0) < 1e-9 else n_s * ratio_n
            d_s = float(s["mean_us"])
            ratio = byte_ratio
            tied = shape_layers.get((str(k["name"]), i)) if byte_ratio is not None else None
            if tied is not None:  # the launch's own layers: a replicated one keeps its bytes, a sharded one shrinks
                ratio = tied["byte_ratio"]
                if ratio == 0.0:  # layers the target's engine does not run (the DSA indexer's projections)
                    n_t = 0.0
                tied = {"kernel": str(k["name"]), "grid": (s.get("shape") or {}).get("grid"), "count_per_step": n_s,
                        "source_us": d_s, **tied}
                entry["shape_layers"].append(tied)
            if ratio is None:
                d_t = bw_part = d_s * clock_ratio
            else:
                # t = t0 + bytes / BW_eff: the launch floor stays, the part above it scales with the bytes, at the
                # DRAM bandwidth ratio; a GEMM launch on at most a quarter as many CTAs as SMs is bound by one CTA's
                # rate, which moves with the SM clock (the launch model's per-CTA roof)
                grid = (s.get("shape") or {}).get("grid")
                per_cta = cat.startswith("gemm") and grid is not None and \
                    int(grid[0]) * int(grid[1]) * int(grid[2]) <= lm.PER_CTA_SHARE * sms_s
                bw_part = max(d_s - t_fixed_us / clock_ratio, 0.0) * ratio * (clock_ratio if per_cta else bw_ratio)
                d_t = t_fixed_us + bw_part
                if t_fixed_us >= bw_part:
                    entry["at_latency_floor"] += n_t
            if tied is not None:
                tied["projected_us"] = d_t
            entry["source_ms"] += n_s * d_s / 1e3
            entry["bandwidth_ms"] += n_t * bw_part / 1e3
            entry["projected_ms"] += n_t * d_t / 1e3
            entry["launches_source"] += n_s
            entry["launches_target"] += n_t
    rows = []
    for c in device.get("categories", []):
        cat = str(c["category"])
        if cat not in by_cat:
            continue
        e = by_cat[cat]
        compute_ms = loads_t.get(e["row"], {}).get("compute_s", 0.0) * 1e3 if e["row"] else 0.0
        e["compute_floor_ms"] = compute_ms
        e["projected_ms"] = max(e["projected_ms"], compute_ms)
        src_ms = float(c["ms_per_step"])
        excl = float(c.get("exclusive_ms_per_step", src_ms))
        e["exclusive_projected_ms"] = e["projected_ms"] * (excl / src_ms if src_ms > 0 else 1.0)
        e["target_floor_bytes"] = loads_t.get(e["row"], {}).get("bytes") if e["row"] else None
        rows.append(e)
    rows.sort(key=lambda r: -r["projected_ms"])
    return {"device": device.get("device"), "categories": rows, "bandwidth_ratio": bw_ratio,
            "clock_ratio": clock_ratio, "source_bandwidth_bytes_per_s": bw_s,
            "target_bandwidth_bytes_per_s": dst_hw.memory_bandwidth_bytes_per_s.value,
            "gpu_ms": math.fsum(r["exclusive_projected_ms"] for r in rows),
            "source_step_ms": float(device.get("step_ms", 0.0)),
            "source_mean_step_ms": float(device.get("mean_step_ms", 0.0)),
            "source_busy_ms": float(device.get("busy_ms_per_step", 0.0)),
            "source_idle_ms": float(device.get("idle_ms_per_step", 0.0)),
            "launch_floor_us": t0_us, "sm_count_source": sms_s, "sm_count_target": sms_t,
            "experts_touched": experts_touched}


def _launch_model_assumptions(dev: Mapping[str, Any]) -> list:
    """The launch model's assumptions, with the roofs it learned from the source for each matched kernel family."""
    out = [f"launch floor t0 = {dev['launch_floor_us']:.2f} us on the source: the median launch of its categories "
           "that move no bytes; x SM clock source/target on the target"]
    families = [(r["category"], name, f) for r in dev["categories"] for name, f in (r.get("launch_model") or {}).items()]
    if not families:
        return out + ["no GEMM kernel family's grid is explained by a tile width over the model's linear layers: "
                      "no launch model (every GEMM shape scales as a byte row)"]
    out.append("GEMM kernels whose every launch shape a tile width explains (one CTA per tile_n output columns, per "
               "expert) are matched to the model's linear layers and timed as t = t0 + max(W / c x ceil(c / SMs) / "
               "r_cta, W / BW_agg) (W weight bytes, c CTAs; SMs source "
               f"{dev['sm_count_source']}, target {dev['sm_count_target']}); r_cta = one CTA's streaming rate, the "
               "median over the family's source shapes with at most a quarter as many CTAs as SMs (a family with "
               "none borrows the median of the others); BW_agg = the family's rate on its source shape with the most "
               "bytes; the model's time target / source scales each measured launch group (same shapes: the source "
               "back); a kernel config the engine picks only at the target's shapes is not seen")
    out.append("on another GPU: r_cta x SM clock target/source (Little's law: the bytes one CTA keeps in flight are "
               "the kernel's own, the memory latency is taken as the same number of SM cycles on both GPUs; DRAM "
               "bandwidth does not set one CTA's rate); BW_agg x DRAM bandwidth target/source")
    for cat, name, f in families:
        borrowed = " (borrowed)" if f.get("rate_cta_borrowed") else ""
        tile = f"tile_n {f['tile_n']}" + (f" -> {f['target_tile_n']} on the target ({f['target_config_source']})"
                                          if f.get("target_tile_n") != f["tile_n"] else "")
        out.append(f"{name} ({cat}): {tile}, r_cta {(f['rate_cta_bytes_per_s'] or 0) / 1e9:.1f} GB/s "
                   f"per CTA{borrowed} -> {(f['target_rate_cta_bytes_per_s'] or 0) / 1e9:.1f} on the target, BW_agg "
                   f"{(f['bw_agg_bytes_per_s'] or 0) / 1e9:.0f} GB/s -> {(f['target_bw_agg_bytes_per_s'] or 0) / 1e9:.0f}")
    if dev.get("experts_touched"):
        out.append(f"routed experts touched per step: {dev['experts_touched']} (top_k): the source ran dummy weights "
                   "(--load-format dummy), which route every sequence of a batch to the same experts")
    return out


def collectives(target: ModelSpec, hw: HardwareSpec, interconnect: Optional[str], impl: str) -> Dict[str, Any]:
    """All-reduces per step on the target: count, message, latency each (measured points) and ms per step."""
    n = (2 * target.num_layers + 1) if target.tp > 1 else 0
    message = target.hidden_size * target.batch * 2
    if not n or interconnect is None:
        return {"ms": 0.0, "count": n, "message_bytes": message, "impl": impl, "interconnect": interconnect or "none",
                "detail": "no tensor parallelism" if not n else "--interconnect none: collectives not counted"}
    us, how = hw.allreduce_us(impl, target.tp, message)
    return {"ms": n * us / 1e3, "count": n, "message_bytes": message, "impl": impl, "us_each": us,
            "interconnect": interconnect, "detail": how, "source": hw.allreduce[impl].source}


def project_budget(budget: Mapping[str, Any], source: ModelSpec, target: ModelSpec, src_hw: HardwareSpec,
                   dst_hw: HardwareSpec, host: Optional[Mapping[str, Any]], *, interconnect: Optional[str],
                   allreduce: str = "oneshot", host_mode: str = "measured",
                   experts_touched: Optional[int] = None) -> Dict[str, Any]:
    """`profattr.project/1`: the predicted ms per decode step on the target and every assumption."""
    devices = budget.get("devices") or []
    if not devices:
        from profattr.errors import ProfattrError

        raise ProfattrError("the capture's budget has no device with decode steps; project a decode capture")
    projected = [project_device(d, _gpu(budget, d.get("device")), source, target, src_hw, dst_hw, experts_touched)
                 for d in devices]
    dev = max(projected, key=lambda p: p["gpu_ms"])  # the slowest rank sets the step
    comm = collectives(target, dst_hw, interconnect, allreduce)
    gpu_ms = dev["gpu_ms"]
    host_ms, host_bound, host_detail = 0.0, False, "--host none: host time dropped"
    if host_mode == "measured":
        host_ms = dev["source_idle_ms"]
        host_detail = "GPU idle inside the source's steps, carried over as measured"
        if host and host.get("host_lead_ms") is not None and host["host_cycle_ms"] > gpu_ms + comm["ms"] + host_ms:
            host_bound = True
            host_ms = float(host["host_lead_ms"])
            host_detail = (f"host-bound: the source host's cycle {host['host_cycle_ms']:.3f} ms exceeds the projected "
                           f"GPU step; the step takes the host lead {host_ms:.3f} ms (step range start to end of "
                           "the graph launch call) plus the GPU time")
    predicted = gpu_ms + comm["ms"] + host_ms
    floor_ms = math.fsum((r["target_floor_bytes"] or 0.0) for r in dev["categories"]) / \
        dst_hw.memory_bandwidth_bytes_per_s.value * 1e3
    waterfall = [{"component": "floor (bytes at peak bandwidth)", "ms": floor_ms}]
    for r in dev["categories"]:
        floor_r = (r["target_floor_bytes"] or 0.0) / dst_hw.memory_bandwidth_bytes_per_s.value * 1e3
        waterfall.append({"component": r["category"], "ms": r["exclusive_projected_ms"] - floor_r})
    waterfall.append({"component": f"collectives ({comm['impl']}, {comm['interconnect']})", "ms": comm["ms"]})
    waterfall.append({"component": "host (" + ("host-bound lead" if host_bound else "idle inside the step") + ")",
                      "ms": host_ms})
    band = None  # set by the caller from the projections of replicate captures
    assumptions = [
        *_launch_model_assumptions(dev),
        "other launch shapes of a row that moves bytes: t = t_fixed + (d_source - t_fixed) x byte ratio per launch x "
        "BW_source / BW_target; t_fixed = the smaller of the GPU's launch floor t0 and the kernel's shortest mean "
        "duration over its launch shapes in the source, x SM clock source/target",
        "byte ratio per launch: floor-row bytes on the target / on the source (profattr gap's rows), over the "
        "launch-count ratio; in a GEMM category, a launch shape whose grid ties it to linear layers (experts x "
        "ceil(n / tile) CTAs, x splits for split-K; tile widths from the kernel name, specs/gemm_kernels.toml; by "
        "launch count alone where no grid fits) takes its own layers' bytes ratio: replicated layers (sharding.toml: "
        "q_a/kv_a, the DSA indexer's wq_b, wk, weights_proj) keep their bytes, sharded ones shrink; split-K reduce "
        "kernels stream no weights and keep their duration; a GEMM launch on at most a quarter as many CTAs as SMs "
        "scales with the SM clock (one CTA's rate), not the DRAM bandwidth",
        "categories without a bytes floor, and rows whose bytes explain under "
        f"{LATENCY_BOUND_EFFICIENCY:.0%} of their source time (latency-bound: norms, decode attention at short "
        "context), keep their source duration per launch, x the clock ratio",
        "a category takes at least its FLOPs over the target's dense peak for its precision",
        f"launches per step scale with layers ({source.num_layers} -> {target.num_layers}; MoE categories with MoE "
        "layers); shapes run once per step stay once",
        "each category keeps its source share of time overlapped with other streams",
        f"model at the target: tp {target.tp}, {target.num_layers} layers, {target.quant}, batch {target.batch}, "
        f"context {target.context_len}; weights split as sharding.toml says (heads, expert intermediate, vocab "
        "split; q_a/kv_a, indexer, router, norms replicated)",
        f"collectives: {comm['count']} all-reduces of {comm['message_bytes']} B per step ({comm['detail']})",
        f"host: {host_detail}; host figures are measured under the profiler (node-level graph tracing makes each "
        "cudaGraphLaunch slower than unprofiled) and assume the target's host is as fast as the source's",
        f"bandwidth: source {dev['source_bandwidth_bytes_per_s'] / 1e12:.3f} TB/s (capture), target "
        f"{dst_hw.memory_bandwidth_bytes_per_s.value / 1e12:.3f} TB/s ({dst_hw.memory_bandwidth_bytes_per_s.source})",
        *source.notes,
    ]
    if source.dsa_runs and not target.dsa_runs:
        assumptions.append(f"{dst_hw.id}: the engine does not run the DSA indexer there (hardware preset dsa_runs); "
                           "the source's attention.indexer kernels and the GEMM launches of the indexer's projections "
                           "are left out and attention reads the whole context")
    return {
        "schema": SCHEMA,
        "capture": {"path": (budget.get("capture") or {}).get("path"), "steps": (budget.get("steps") or {}).get("count"),
                    "device": dev["device"], "measured_step_ms": dev["source_step_ms"]},
        "source": {"hardware": src_hw.id, "model": source.describe(), "layers": source.num_layers},
        "target": {"hardware": dst_hw.id, "name": dst_hw.name, "model": target.describe(),
                   "layers": target.num_layers, "interconnect": comm["interconnect"], "host": host_mode},
        "predicted_ms_per_step": predicted,
        "tokens_per_s": 1e3 / predicted * target.batch if predicted > 0 else None,
        "gpu_ms": gpu_ms, "collectives": comm,
        "host": {"ms": host_ms, "host_bound": host_bound, "measured": dict(host) if host else None},
        "floor_ms": floor_ms,
        "band": band,
        "categories": dev["categories"],
        "waterfall": waterfall,
        "bandwidth_ratio": dev["bandwidth_ratio"], "clock_ratio": dev["clock_ratio"],
        "assumptions": assumptions,
    }
