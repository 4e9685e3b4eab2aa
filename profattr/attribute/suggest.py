"""The kernels of a capture that no certain name rule covers: explained one by one (`classify --capture`), and
drafted into a rules file for review (`taxonomy suggest`).

Both read a capture's attribution (budget.attribute): each distinct (kernel, launch context) with its op time, the
NVTX module and torch operator around its launches, and the decision taxonomy/contexts.py made for it.
"""
from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np

from profattr.attribute.context import launch_ops, launch_stack_bits, op_modules, torch_op_bits
from profattr.errors import ProfattrError
from profattr.regexguard import compile_user
from profattr.text import clean

SUGGESTED_FAMILY = "suggested"
PLACEHOLDER_CATEGORY = "other"


def kernel_contexts(path, ruleset, force: bool = False) -> list:
    """Per distinct (demangled name, context bits) of the capture at ``path``: name, demangled, ns, count, the
    context keys, the innermost NVTX module and torch operator seen most, and the decision."""
    from profattr.attribute.budget import attribute
    from profattr.trace.source import open_trace

    with open_trace(path, force=force) as export:
        att = attribute(export, "auto", ruleset)
        ops = att.ops
        patterns = list(ruleset.context_patterns)
        keys, _ = torch_op_bits(export, ops, ruleset, len(patterns))
        patterns += keys
        keys, _ = launch_stack_bits(export, ops, ruleset, len(patterns))
        patterns += keys
        torch_names = launch_ops(export, ops)
        modules = op_modules(att, np.ones(len(ops), dtype=bool))
        out = []
        ns = (ops.end - ops.start).astype(np.int64)
        order = np.argsort(att.combo, kind="stable")
        combos, starts = np.unique(att.combo[order], return_index=True)
        for combo, sel in zip(combos, np.split(order, starts[1:])):  # sel: the ops of one combination
            row = att.combos.iloc[int(combo)]
            bits = int(att.mask[sel[0]])
            contexts = frozenset(p for b, p in enumerate(patterns) if (bits >> b) & 1)
            out.append({"name": row["name"], "demangled": row["demangled"], "ns": int(ns[sel].sum()),
                        "count": int(len(sel)), "contexts": contexts,
                        "torch_op": _most(torch_names[sel]), "nvtx_module": _most(modules[sel]),
                        "category": row["category"], "evidence": row["evidence"], "rule": row["rule"] or None,
                        "context_rule": row["context"] or None, "conflict": row["conflict"] or None})
        total = float(ns.sum()) or 1.0
        for r in out:
            r["share"] = r["ns"] / total
        return sorted(out, key=lambda r: -r["ns"])


def explain_capture(path, kernel_regex: str, ruleset, force: bool = False) -> list:
    """kernel_contexts rows whose name or demangled name matches ``kernel_regex``."""
    rx = compile_user(kernel_regex, "--kernel")
    rows = [r for r in kernel_contexts(path, ruleset, force) if rx.search(r["name"]) or rx.search(r["demangled"])]
    if not rows:
        raise ProfattrError(f"{path}: no kernel matches --kernel {kernel_regex!r}; give a regex that matches a "
                            "kernel name of the capture (profattr budget lists them)")
    return rows


def suggest_rules(path, ruleset, force: bool = False) -> tuple:
    """(TOML text, number of rules): one draft rule per kernel whose category no certain name rule gave, built
    from its launch context; every rule says `review`."""
    rows = [r for r in kernel_contexts(path, ruleset, force)
            if r["evidence"] != "name" and not r["demangled"].startswith("[CUDA mem")]
    merged: dict = {}
    for r in rows:  # one rule per kernel name, its contexts pooled
        merged.setdefault(r["name"], []).append(r)
    lines = [f"# Rules drafted by `profattr taxonomy suggest` from {clean(str(path))} for the kernels that no",
             "# certain name rule covered. review: each rule is a guess from the kernel's launch context (the torch",
             "# operator that launched it, the NVTX module around it); check each category against the library that",
             "# launched the kernel, edit what is wrong, then pass this file with --rules.",
             f"# {len(merged)} kernel(s).", ""]
    used: set = set()
    for name, group in sorted(merged.items(), key=lambda kv: -sum(r["ns"] for r in kv[1])):
        share = sum(r["share"] for r in group)
        best = max(group, key=lambda r: r["ns"])
        category = best["category"] if best["evidence"].startswith("context:") else PLACEHOLDER_CATEGORY
        why = (f"the context ({best['context_rule']}) says {category}" if best["evidence"].startswith("context:")
               else f"no context rule matched: '{PLACEHOLDER_CATEGORY}' is a placeholder, choose the category")
        where = "; ".join(x for x in (f"launched by {best['torch_op']}" if best["torch_op"] else "",
                                      f"inside {best['nvtx_module']}" if best["nvtx_module"] else "") if x)
        rid = _rule_id(name, used)
        lines += ["[[rule]]",
                  f"# review: {100.0 * share:.2f}% of op time; {where or 'no launch context recorded'}; {why}",
                  f"id = {_toml(rid)}",
                  f"category = {_toml(category)}",
                  f"pattern = {_toml(_name_pattern(name))}",
                  f"family = {_toml(SUGGESTED_FAMILY)}",
                  f"source = {_toml(clean('profattr taxonomy suggest: ' + (where or 'no context') + ' in ' + str(path)))}",
                  'evidence = "user"', ""]
    return "\n".join(lines), len(merged)


def _name_pattern(name: str) -> str:
    """A pattern for the kernel's own name: at a name boundary, the name, then not more identifier. No lookaround:
    a --rules file's patterns run on RE2 (regexguard.py)."""
    return r"(^|::|\s)" + re.escape(name) + r"(\W|$)"


def _rule_id(name: str, used: set) -> str:
    base = "suggested." + (re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:60] or "kernel")
    rid, n = base, 2
    while rid in used:
        rid, n = f"{base}_{n}", n + 1
    used.add(rid)
    return rid


def _toml(text: str) -> str:
    return json.dumps(str(text), ensure_ascii=False)  # a JSON string is a TOML basic string


def _most(values: np.ndarray):
    kept = [v for v in values.tolist() if v]
    return clean(Counter(kept).most_common(1)[0][0]) if kept else None
