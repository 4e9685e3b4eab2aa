"""Render the variance components (`profattr.variance/1`) for a person (table) or as markdown."""
from __future__ import annotations

from profattr.text import md_escape
from profattr.text import clean_tree


def _sd(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _share(x) -> str:
    return "" if x is None else f"{100.0 * x:.0f}%"


def _between(c: dict) -> list:
    lines = []
    for b in c["between_servers"]:
        text = "; ".join(f"{d['what']} {d['a']} → {d['b']}" for d in b["differences"]) or "nothing recorded"
        lines.append(f"{b['server']} vs {b['against']}: {text}")
    return lines


def render_table(data: dict) -> str:
    data = clean_tree(data)
    lines = []
    for c in data["configurations"]:
        lv = c["levels"]
        lines.append(f"{c['configuration']}: {lv['servers']} server(s), {lv['windows']} window(s), {lv['steps']} steps")
        for text in _between(c):
            lines.append(f"  differs between servers (in the server component): {text}")
        if c.get("note"):
            lines.append(f"  {c['note']}")
        for d in c["devices"]:
            for m in d["metrics"]:
                lines.append(f"  GPU {d['device']} {m['metric']}: mean {m['mean_ms']:.3f} ms; window means "
                             + " | ".join(", ".join(f"{x:.3f}" for x in s) for s in m["window_means_ms"]))
                for r in m["components"]:
                    lines.append(f"    {r['level']:<8}{_sd(r['sd_ms']):>9} ms  {_share(r['variance_share']):>5}  "
                                 f"df {r['df']:<3} {r['note']}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def render_markdown(data: dict) -> str:
    data = clean_tree(data)
    out = []
    for c in data["configurations"]:
        lv = c["levels"]
        out += [f"**{md_escape(c['configuration'])}**: {lv['servers']} server(s), {lv['windows']} window(s), "
                f"{lv['steps']} steps.", ""]
        for text in _between(c):
            out += [f"Differs between servers (so it is in the server component): {md_escape(text)}.", ""]
        if c.get("note"):
            out += [f"{md_escape(c['note'])}.", ""]
            continue
        out += ["| GPU | metric | mean ms | component | SD ms | share of a step's variance | df |",
                "|---|---|---:|---|---:|---:|---:|"]
        for d in c["devices"]:
            for m in d["metrics"]:
                for r in m["components"]:
                    out.append(f"| {md_escape(d['device'])} | {md_escape(m['metric'])} | {m['mean_ms']:.3f} | "
                               f"{md_escape(r['level'])} | {_sd(r['sd_ms'])} | {_share(r['variance_share'])} | "
                               f"{r['df']} |")
        out.append("")
    return "\n".join(out).rstrip("\n")

