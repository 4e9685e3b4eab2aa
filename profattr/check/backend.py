"""Did the MoE backend the user asked for really run, and what did the server say about itself? The kernels are
fingerprinted by the taxonomy's families; the server log (serverlog.py) tells what SGLang resolved (a requested
`auto` or a backend the GPU lacks can resolve elsewhere), whether it used untuned default kernel configs, fell
back, or compiled/autotuned inside the window."""
from __future__ import annotations

from profattr.check import FAIL, PASS, SKIP, WARN, Finding, get

RESOLVED_ARGS = {"moe_runner_backend": "MoE runner", "fp8_gemm_runner_backend": "FP8 GEMM",
                 "attention_backend": "attention"}


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


def check_backend(run: dict | None, names: list) -> Finding:
    from profattr.capture.sglang import BACKEND_FAMILIES

    backend = get(run, "server_log", "resolved", "moe_runner_backend") or get(run, "backend", "sglang")
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


def check_server_log(run: dict | None) -> Finding:
    """What the server log says: resolved backends (against the request), default kernel configs, fallbacks,
    JIT compilation or autotuning inside the window, errors."""
    ev = get(run, "server_log")
    if not isinstance(ev, dict):
        return Finding("server_log", SKIP, "no server log evidence in run.json (not an SGLang capture, or made "
                       "before profattr read server logs)")
    if ev.get("source") == "server_info":
        said = ", ".join(f"{k} {v}" for k, v in (ev.get("resolved") or {}).items() if v)
        return Finding("server_log", SKIP, "an attached server's log is not read (capture --server): JIT "
                       "compilation, kernel-config fallbacks and errors inside the window are not checked; its "
                       f"server info says {said or 'no backends'}", {"resolved": ev.get("resolved") or {}})
    resolved = ev.get("resolved") or {}
    requested = get(run, "backend", "sglang")
    data = {"resolved": resolved, "default_kernel_configs": ev.get("default_kernel_configs") or [],
            "counts": ev.get("counts") or {}, "in_window": ev.get("in_window") or {}}
    said = ", ".join(f"{RESOLVED_ARGS[k]} {v}" for k, v in resolved.items() if k in RESOLVED_ARGS and v)
    problems, status = [], PASS
    if requested and resolved.get("moe_runner_backend") and requested not in ("auto",) \
            and resolved["moe_runner_backend"] != requested:
        problems.append(f"the MoE runner {requested!r} was asked for but the server resolved "
                        f"{resolved['moe_runner_backend']!r}")
        status = FAIL
    in_window = ev.get("in_window") or {}
    if in_window.get("jit_compile"):
        first = next((e["text"] for e in ev["events"].get("jit_compile", []) if e.get("in_window")), "")
        problems.append(f"{in_window['jit_compile']} compilation/autotuning line(s) inside the window (\"{first[:90]}\")")
        status = FAIL
    if in_window.get("error"):
        problems.append(f"{in_window['error']} error line(s) inside the window")
        status = FAIL
    configs = ev.get("default_kernel_configs") or []
    if (ev.get("counts") or {}).get("default_kernel_config"):
        names = ", ".join(configs[:3]) + (" ..." if len(configs) > 3 else "")
        shapes = names or "see the log"
        problems.append(f"{len(configs) or 'some'} kernel shape(s) without a tuned config for this GPU ({shapes}): "
                        "those Triton kernels run SGLang's default tile config; tune them (SGLang's benchmark/kernels "
                        "tuning scripts) or expect slower kernels")
        status = status if status == FAIL else WARN
    fallbacks = [e["text"] for e in ev["events"].get("fallback", [])]
    if fallbacks:
        problems.append(f"fallback reported: \"{fallbacks[0][:120]}\"")
        status = status if status == FAIL else WARN
    text = f"server resolved {said}" if said else "server log read"
    if problems:
        return Finding("server_log", status, text + "; " + "; ".join(problems), data)
    return Finding("server_log", PASS, text + "; no default kernel configs, fallbacks or compilation in the window",
                   data)
