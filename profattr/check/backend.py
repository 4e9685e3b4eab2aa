"""Did the MoE backend the user asked for really run, and what did the server say about itself? The kernels are
fingerprinted by the taxonomy's families; the server log (serverlog.py) tells what SGLang resolved (a requested
`auto` or a backend the GPU lacks can resolve elsewhere), whether it used untuned default kernel configs, fell
back, or compiled/autotuned inside the window."""
from __future__ import annotations

from profattr.check import FAIL, PASS, SKIP, WARN, Finding
from profattr.run_record import RunRecord, or_empty

RESOLVED_ARGS = {"moe_runner_backend": "MoE runner", "fp8_gemm_runner_backend": "FP8 GEMM",
                 "fp4_gemm_runner_backend": "FP4 GEMM", "attention_backend": "attention"}
# Dense FP4 GEMM kernel families (taxonomy `family` of gemm.fp4 rules) of each SGLang --fp4-gemm-backend
# (python/sglang/srt/layers/quantization/fp4_utils.py Fp4GemmRunnerBackend; `auto` is flashinfer_cutedsl on SM100,
# marlin on SM80-SM9x (weight-only W4A16 Marlin, no FP4 tensor cores), else flashinfer_cutlass; flashinfer_cudnn
# is not fingerprinted: cuDNN's kernel names are not in the taxonomy)
FP4_GEMM_FAMILIES = {"marlin": ("marlin_dense",), "flashinfer_cutlass": ("cutlass_gemm",),
                     "flashinfer_trtllm": ("trtllm_gen_gemm",), "flashinfer_cutedsl": ("cute_dsl_gemm", "b12x_gemm")}


def moe_families(names: list) -> tuple:
    """({family: ns} of expert GEMM kernels, {family: ns} of all MoE kernels), classified by the taxonomy."""
    from profattr.taxonomy.classify import load_rules

    rules = load_rules()
    gemm_ns: dict = {}
    moe_ns: dict = {}
    for demangled, short_name, _count, kernel_ns in names:
        rule = rules.match(demangled or short_name or "", frozenset())
        if rule is None and short_name and short_name != demangled:
            rule = rules.match(short_name, frozenset())
        if rule is None or not rule.family or not str(rule.category).startswith("moe."):
            continue
        moe_ns[rule.family] = moe_ns.get(rule.family, 0) + int(kernel_ns or 0)
        if rule.category == "moe.gemm":
            gemm_ns[rule.family] = gemm_ns.get(rule.family, 0) + int(kernel_ns or 0)
    return gemm_ns, moe_ns


def check_backend(run: RunRecord | None, names: list) -> Finding:
    from profattr.engines.sglang import BACKEND_FAMILIES

    run = or_empty(run)
    backend = run.resolved.get("moe_runner_backend") or run.backend_sglang
    if not backend:
        return Finding("backend", SKIP, "no MoE runner backend recorded in run.json")
    if backend not in BACKEND_FAMILIES:
        return Finding("backend", SKIP, f"no kernel fingerprint known for backend {backend!r}")
    if not names:
        return Finding("backend", SKIP, "no kernels to fingerprint")
    gemm_ns, moe_ns = moe_families(names)
    gemms, markers = (set(x) for x in BACKEND_FAMILIES[backend])
    # families that only other backends launch: their expert GEMMs, and their marker kernels
    foreign_gemm: dict = {}
    foreign_marker: dict = {}
    for other, (o_gemms, o_markers) in BACKEND_FAMILIES.items():
        for fam in set(o_gemms) - gemms:
            foreign_gemm.setdefault(fam, other)
        for fam in set(o_markers) - markers - gemms:
            foreign_marker.setdefault(fam, other)
    owners = {**foreign_marker, **foreign_gemm}
    foreign = sorted({f for f in gemm_ns if f in foreign_gemm} | {f for f in moe_ns if f in foreign_marker})
    data = {"backend": backend, "gemm_families": sorted(gemms), "marker_families": sorted(markers),
            "moe_gemm_ms": {k: v / 1e6 for k, v in sorted(gemm_ns.items())},
            "moe_ms": {k: v / 1e6 for k, v in sorted(moe_ns.items())}}
    if foreign:
        which = ", ".join(f"{f} ({owners[f]})" for f in foreign)
        return Finding("backend", FAIL, f"MoE kernels of other backends present: {which}; {backend} did not run "
                       "alone (fallback, or a second MoE path)", data)
    present = sorted(gemms & set(gemm_ns))
    if not present:
        seen = ", ".join(sorted(gemm_ns)) or "none the taxonomy knows"
        return Finding("backend", FAIL, f"no expert GEMM of family {'/'.join(sorted(gemms))} ({backend}) in the "
                       f"window (expert GEMM families seen: {seen}): silent fallback, or the runner never ran", data)
    missing = sorted(markers - set(moe_ns))
    if missing:
        return Finding("backend", FAIL, f"expert GEMM {'/'.join(present)} ran, but not the {'/'.join(missing)} "
                       f"kernels that {backend} launches around it: another runner with the same GEMM ran", data)
    ms = sum(gemm_ns[f] for f in present) / 1e6
    return Finding("backend", PASS, f"{backend}: expert GEMM family {'/'.join(present)} present ({ms:.2f} ms), "
                   "no other backend's MoE kernels", data)


def check_server_log(run: RunRecord | None) -> Finding:
    """What the server log says: resolved backends (against the request), default kernel configs, fallbacks,
    JIT compilation or autotuning inside the window, errors."""
    run = or_empty(run)
    if not run.has("server_log"):
        return Finding("server_log", SKIP, "no server log evidence in run.json (not an SGLang capture, or made "
                       "before profattr read server logs)")
    if run.log_source == "server_info":
        said = ", ".join(f"{k} {v}" for k, v in run.resolved.items() if v)
        return Finding("server_log", SKIP, "an attached server's log is not read (capture --server): JIT "
                       "compilation, kernel-config fallbacks and errors inside the window are not checked; its "
                       f"server info says {said or 'no backends'}", {"resolved": run.resolved})
    resolved = run.resolved
    requested = run.backend_sglang
    data = {"resolved": resolved, "default_kernel_configs": run.default_kernel_configs,
            "counts": run.log_counts, "in_window": run.log_in_window}
    said = ", ".join(f"{RESOLVED_ARGS[k]} {v}" for k, v in resolved.items() if k in RESOLVED_ARGS and v)
    problems, status = [], PASS
    if requested and resolved.get("moe_runner_backend") and requested not in ("auto",) \
            and resolved["moe_runner_backend"] != requested:
        problems.append(f"the MoE runner {requested!r} was asked for but the server resolved "
                        f"{resolved['moe_runner_backend']!r}")
        status = FAIL
    in_window = run.log_in_window
    if in_window.get("jit_compile"):
        first = next((e["text"] for e in run.log_events("jit_compile") if e.get("in_window")), "")
        problems.append(f"{in_window['jit_compile']} compilation/autotuning line(s) inside the window (\"{first[:90]}\")")
        status = FAIL
    if in_window.get("error"):
        problems.append(f"{in_window['error']} error line(s) inside the window")
        status = FAIL
    configs = run.default_kernel_configs
    if run.log_counts.get("default_kernel_config"):
        names = ", ".join(configs[:3]) + (" ..." if len(configs) > 3 else "")
        shapes = names or "see the log"
        problems.append(f"{len(configs) or 'some'} kernel shape(s) without a tuned config for this GPU ({shapes}): "
                        "those Triton kernels run SGLang's default tile config; tune them (SGLang's benchmark/kernels "
                        "tuning scripts) or expect slower kernels")
        status = status if status == FAIL else WARN
    fallbacks = [e["text"] for e in run.log_events("fallback")]
    if fallbacks:
        problems.append(f"fallback reported: \"{fallbacks[0][:120]}\"")
        status = status if status == FAIL else WARN
    text = f"server resolved {said}" if said else "server log read"
    if problems:
        return Finding("server_log", status, text + "; " + "; ".join(problems), data)
    return Finding("server_log", PASS, text + "; no default kernel configs, fallbacks or compilation in the window",
                   data)


def gemm_families(names: list) -> dict:
    """{category: {family: ns}} of the GEMM kernels (gemm.* and moe.gemm), classified by the taxonomy, with the
    `math` their rules state ({family: math})."""
    from profattr.taxonomy.classify import load_rules

    rules = load_rules()
    out: dict = {}
    math: dict = {}
    for demangled, short_name, _count, kernel_ns in names:
        rule = rules.match(demangled or short_name or "", frozenset(), short=short_name)
        if rule is None or not (rule.category.startswith("gemm.") or rule.category == "moe.gemm"):
            continue
        fams = out.setdefault(rule.category, {})
        fams[rule.family] = fams.get(rule.family, 0) + int(kernel_ns or 0)
        if rule.math:
            math.setdefault(rule.family, rule.math)
    return {"families": out, "math": math}


def check_fp4_backend(run: RunRecord | None, names: list) -> Finding:
    """The FP4 GEMM backend and MoE runner asked for (run.json server arguments, `auto` included), what the server
    resolved (its log: server_args, the `quant=... quant_algo=...` load line) and the FP4 kernels that ran."""
    run = or_empty(run)
    asked_gemm = run.server_flag("--fp4-gemm-backend") or run.logged_server_args.get("fp4_gemm_runner_backend")
    resolved_gemm = run.resolved.get("fp4_gemm_runner_backend")
    asked_moe = run.backend_sglang
    resolved_moe = run.resolved.get("moe_runner_backend")
    quant = run.loaded_quant
    seen = gemm_families(names)
    fp4 = seen["families"].get("gemm.fp4", {})
    fp4_quant = "fp4" in str(quant.get("quant") or "").lower() or str(quant.get("quant_algo") or "").upper() == "NVFP4"
    data = {"asked": {"fp4_gemm_backend": asked_gemm, "moe_runner_backend": asked_moe},
            "resolved": {"fp4_gemm_backend": resolved_gemm, "moe_runner_backend": resolved_moe,
                         "quant": quant.get("quant"), "quant_algo": quant.get("quant_algo")},
            "fp4_gemm_ms": {k: v / 1e6 for k, v in sorted(fp4.items())},
            "moe_gemm_ms": {k: v / 1e6 for k, v in sorted(seen["families"].get("moe.gemm", {}).items())},
            "math": seen["math"]}
    if not fp4 and not fp4_quant and not (asked_gemm and asked_gemm != "auto"):
        return Finding("fp4_backend", SKIP, "no FP4 GEMM kernels, no FP4 quantization in the log and no "
                       "--fp4-gemm-backend asked for", data)
    said = (f"log: quant={quant.get('quant')}" + (f", quant_algo={quant.get('quant_algo')}" if quant.get("quant_algo")
                                                   else "")) if quant else "no load line in the log"
    asked_text = (f"asked --fp4-gemm-backend {asked_gemm or '(default auto)'} (server: {resolved_gemm or '?'}), "
                  f"--moe-runner-backend {asked_moe or '?'} (server: {resolved_moe or '?'}); {said}")
    ran = ", ".join(f"{f} ({seen['math'].get(f, 'math not stated')}, {ns / 1e6:.2f} ms)"
                    for f, ns in sorted(fp4.items(), key=lambda kv: -kv[1])) or "none"
    want = resolved_gemm if resolved_gemm and resolved_gemm != "auto" else asked_gemm
    if want and want != "auto" and want in FP4_GEMM_FAMILIES:
        fams = set(FP4_GEMM_FAMILIES[want])
        if not fams & set(fp4):
            return Finding("fp4_backend", FAIL, f"{asked_text}; but no dense FP4 GEMM of family "
                           f"{'/'.join(sorted(fams))} ({want}) ran: dense FP4 GEMMs seen: {ran}", data)
        foreign = sorted(set(fp4) - fams)
        if foreign:
            return Finding("fp4_backend", FAIL, f"{asked_text}; dense FP4 GEMMs of other backends ran too: "
                           f"{', '.join(foreign)} (seen: {ran})", data)
    if fp4_quant and not fp4:
        return Finding("fp4_backend", WARN, f"{asked_text}; but no dense FP4 GEMM kernel in the window (every "
                       "dense linear ignored by the checkpoint, or kernels the taxonomy does not know)", data)
    return Finding("fp4_backend", PASS, f"{asked_text}; dense FP4 GEMMs that ran: {ran}", data)
