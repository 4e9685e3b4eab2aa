"""`profattr classify`: show the category each kernel name lands in, which rule or launch context decided it, and
(with --explain) what else matched. `profattr taxonomy suggest`: draft a rules file for a capture's unknown kernels."""
from __future__ import annotations

import json

import click

from profattr.errors import ProfattrError
from profattr.outputs import check_output, emit, output_options
from profattr.taxonomy.classify import load_rules
from profattr.text import clean, clean_tree


@click.command("classify")
@click.argument("names", nargs=-1)
@click.option("--rules", "rules_files", multiple=True, metavar="FILE",
              help="Extra rules file (TOML); its rules take precedence over the shipped ones. Repeatable.")
@click.option("--nvtx", "nvtx_ranges", multiple=True, metavar="NAME",
              help="Name of an NVTX range that encloses the kernels (e.g. model.layers.0.mlp.experts). Repeatable.")
@click.option("--torch-op", "torch_ops", multiple=True, metavar="OP",
              help="Torch operator that launched the kernels (e.g. sgl_kernel::moe_align_block_size). Repeatable.")
@click.option("--python-frame", "python_frames", multiple=True, metavar="FRAME",
              help="A frame of the launch's Python stack (e.g. sglang/srt/layers/moe/topk.py(80): select_experts). "
                   "Repeatable.")
@click.option("--explain", is_flag=True,
              help="Say which rule or context decided each kernel, and every other rule and context that matched.")
@click.option("--capture", "capture", type=click.Path(), default=None,
              help="Explain the kernels of this capture (nsys export or torch trace) in their own launch contexts; "
                   "with --kernel.")
@click.option("--kernel", "kernel_regex", default=None, metavar="REGEX",
              help="With --capture: the kernels to explain (regex on the kernel name).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table for people, json for tools (a list of {name, category, family, rule, evidence, ...} in "
                   "input order).")
@output_options()
def classify(names, rules_files, nvtx_ranges, torch_ops, python_frames, explain, capture, kernel_regex, fmt, output,
             force):
    """Classify kernel NAMEs (demangled, as nsys prints them). Use `-` to read one name per line from stdin
    (UTF-8; an undecodable byte becomes U+FFFD). With --capture C --kernel REGEX, explain the capture's kernels."""
    given = list(rules_files) + ([capture] if capture else [])
    if capture and names:
        raise ProfattrError("give kernel NAMEs or --capture with --kernel, not both")
    if capture and not kernel_regex:
        raise ProfattrError("--capture needs --kernel REGEX: the kernels of the capture to explain")
    if kernel_regex and not capture:
        raise ProfattrError("--kernel needs --capture FILE: the capture whose kernels to explain")
    if not capture and not names:
        raise ProfattrError("missing kernel NAMES: give one or more (or - for stdin), or --capture FILE --kernel REGEX")
    if output:
        check_output(output, force, given)
    ruleset = load_rules(rules_files)
    if capture:
        from profattr.attribute.suggest import explain_capture

        rows = [_explained(ruleset, r["demangled"], r["contexts"], short=r["name"], seen=r) for r in
                explain_capture(capture, kernel_regex, ruleset)]
        emit(_render(rows, fmt, explain=True), output, force, given)
        return
    kernel_names = []
    for name in names:
        if name == "-":
            kernel_names.extend(line.rstrip("\r\n") for line in _stdin_lines() if line.strip())
        else:
            kernel_names.append(name)
    contexts = (ruleset.contexts_for(nvtx_ranges) | ruleset.torch_op_contexts(torch_ops)
                | ruleset.python_frame_contexts(python_frames))
    rows = [_explained(ruleset, name, contexts) for name in kernel_names]
    emit(_render(rows, fmt, explain), output, force, given)


def _explained(ruleset, name, contexts, short=None, seen=None) -> dict:
    decision = ruleset.decide(name, contexts, short=short if short and short != name else None)
    rule = decision.rule
    also = [r for r in ruleset.matches(name, contexts) + (ruleset.matches(short, contexts) if short else [])
            if rule is None or r.id != rule.id]
    matched_contexts = [c for c in ruleset.context_rules if c.key in contexts]
    row = {"name": name, "category": decision.category, "family": rule.family if rule else None,
           "rule": rule.id if rule else None, "evidence": decision.evidence,
           "weight_dtype": (rule.weight_dtype or None) if rule else None, "math": (rule.math or None) if rule else None,
           "strength": rule.strength if rule else None, "rule_origin": rule.origin if rule else None,
           "context_rule": decision.context.id if decision.context else None,
           "conflict": decision.conflict.id if decision.conflict else None,
           "also_matched": [{"rule": r.id, "category": r.category, "strength": r.strength}
                            for r in dict.fromkeys(also)],
           "contexts": [{"context": c.id, "kind": c.kind, "category": c.category, "strength": c.strength}
                        for c in matched_contexts],
           "inventory": _inventoried(ruleset, name, short)}
    if seen is not None:
        row.update({"short_name": seen["name"], "ms_total": seen["ns"] / 1e6, "count": seen["count"],
                    "share": seen["share"], "torch_op": seen["torch_op"], "nvtx_module": seen["nvtx_module"]})
    return row


def _inventoried(ruleset, name, short=None) -> list:
    """The inventory rows of the kernel's function identifier (namespaced ones included), whether or not they
    decided: what each library's source says the kernel is."""
    from profattr.taxonomy.lookup import identifier

    idents = {i for i in (short, identifier(name or "")) if i}
    rows = [e for i in sorted(idents) for e in ruleset.inventory.entries_named(i)]
    return [{"identifier": e.identifier, "library": e.library, "version": e.version, "source": e.source,
             "category": e.category} for e in rows]


def _render(rows, fmt, explain) -> str:
    if fmt == "json":
        if not explain:
            rows = [{k: r[k] for k in ("name", "category", "family", "rule", "evidence", "weight_dtype", "math")}
                    for r in rows]
        return json.dumps(clean_tree(rows), indent=2)
    if not explain:
        headers = ("category", "family", "rule", "name")
        cells = [[clean(row[h] or "-") for h in headers] for row in rows]
        widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers[:-1])]
        return "\n".join("  ".join(value.ljust(widths[i]) for i, value in enumerate(line[:-1])) + "  " + line[-1]
                         for line in [list(headers)] + cells)
    out = []
    for r in rows:
        out.append(clean(r["name"]))
        if "share" in r:
            out.append(f"  in the capture: {r['count']} launches, {r['ms_total']:.3f} ms, {100.0 * r['share']:.2f}% "
                       f"of op time; launched by {clean(r['torch_op'] or '-')}; inside {clean(r['nvtx_module'] or '-')}")
        decided = {"name": f"name rule {r['rule']} ({r['strength']})",
                   "none": "nothing: no name rule and no context rule matched"}.get(
            r["evidence"], f"{r['evidence']} rule {r['context_rule']}")
        out.append(f"  category: {r['category']}  (decided by {decided})")
        if r["rule"] and r["evidence"] != "name":
            out.append(f"  name rule {r['rule']} ({r['strength']}) matched but did not decide")
        if r["conflict"]:
            out.append(f"  conflict: the strong context {r['conflict']} contradicts this name rule")
        for c in r["contexts"]:
            out.append(f"  context: {c['context']} ({c['kind']}, {c['strength']}) -> {c['category']}")
        for a in r["also_matched"]:
            out.append(f"  also matched: {a['rule']} -> {a['category']} ({a['strength']})")
        for e in r.get("inventory") or []:
            out.append(f"  inventory: {clean(e['identifier'])} in {clean(e['library'])} {clean(e['version'])} "
                       f"({clean(e['source'])}) -> {e['category']}")
    return "\n".join(out)


@click.group("taxonomy")
def taxonomy():
    """Work on the kernel taxonomy: draft rules for the kernels a capture's rules do not cover."""


@taxonomy.command("suggest")
@click.argument("capture", type=click.Path())
@click.option("--rules", "rules_files", multiple=True, metavar="FILE",
              help="Extra rules file (TOML) to apply first; only what they leave uncovered is suggested. Repeatable.")
@output_options()
def suggest(capture, rules_files, output, force):
    """Write a rules TOML (for --rules) with one rule per kernel of CAPTURE that no certain name rule covers,
    its category taken from the kernel's launch context (or a placeholder). Every rule is marked `review`."""
    given = [capture] + list(rules_files)
    if output:
        check_output(output, force, given)
    from profattr.attribute.suggest import suggest_rules

    text, n = suggest_rules(capture, load_rules(rules_files))
    emit(text, output, force, given)
    if output:
        click.echo(f"{output}: {n} rule(s) to review", err=True)


def _stdin_lines():
    """Lines of stdin as text: UTF-8, with undecodable bytes replaced (names piped from anywhere)."""
    stream = click.get_binary_stream("stdin")
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")
