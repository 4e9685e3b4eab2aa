"""`profattr classify`: show the category each kernel name lands in, and which rule put it there."""
from __future__ import annotations

import json

import click

from profattr.outputs import check_output, emit, output_options
from profattr.taxonomy.classify import load_rules
from profattr.text import clean, clean_tree


@click.command("classify")
@click.argument("names", nargs=-1, required=True)
@click.option("--rules", "rules_files", multiple=True, metavar="FILE",
              help="Extra rules file (TOML); its rules take precedence over the shipped ones. Repeatable.")
@click.option("--nvtx", "nvtx_ranges", multiple=True, metavar="NAME",
              help="Name of an NVTX range that encloses the kernels (e.g. model.layers.0.mlp.experts). Repeatable.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table for people, json for tools (a list of {name, category, family, rule, weight_dtype, math} "
                   "in input order).")
@output_options()
def classify(names, rules_files, nvtx_ranges, fmt, output, force):
    """Classify kernel NAMEs (demangled, as nsys prints them). Use `-` to read one name per line from stdin
    (UTF-8; an undecodable byte becomes U+FFFD)."""
    given = list(rules_files)
    if output:
        check_output(output, force, given)
    kernel_names = []
    for name in names:
        if name == "-":
            kernel_names.extend(line.rstrip("\r\n") for line in _stdin_lines() if line.strip())
        else:
            kernel_names.append(name)

    ruleset = load_rules(rules_files)
    contexts = ruleset.contexts_for(nvtx_ranges)
    rows = []
    for name in kernel_names:
        rule = ruleset.match(name, contexts)
        rows.append({"name": name,
                     "category": rule.category if rule else "unclassified",
                     "family": rule.family if rule else None,
                     "rule": rule.id if rule else None,
                     "weight_dtype": (rule.weight_dtype or None) if rule else None,
                     "math": (rule.math or None) if rule else None})

    if fmt == "json":
        emit(json.dumps(clean_tree(rows), indent=2), output, force, given)
        return
    headers = ("category", "family", "rule", "name")
    cells = [[clean(row[h] or "-") for h in headers] for row in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers[:-1])]
    lines = ["  ".join(value.ljust(widths[i]) for i, value in enumerate(line[:-1])) + "  " + line[-1]
             for line in [list(headers)] + cells]
    emit("\n".join(lines), output, force, given)


def _stdin_lines():
    """Lines of stdin as text: UTF-8, with undecodable bytes replaced (names piped from anywhere)."""
    stream = click.get_binary_stream("stdin")
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")
