"""Escaping for strings that come from captures (kernel names, NVTX text) before they enter markdown."""
from __future__ import annotations

import re

from profattr.text import clean

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~$])")  # inline markup anywhere; $ starts inline math on GitHub
_LINE_START = re.compile(r"^(\s*)(?:([#+\-=])|(\d+)([.)]))")  # headings, list items, setext underlines


def md_escape(text) -> str:
    """Text safe inside a markdown paragraph or table cell: no markup, no HTML, no line breaks.

    Characters that make markup anywhere are backslash-escaped, `<`, `>` and `&` become entities (no HTML can
    open), and what only matters at the start of a line (a heading `#`, a list `-`/`1.`) is escaped there.
    """
    s = clean(text)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _LINE_START.sub(lambda m: m.group(1) + ("\\" + m.group(2) if m.group(2) else m.group(3) + "\\" + m.group(4)), s)


def md_code(text) -> str:
    """Text as an inline code span that cannot be closed early by backticks in it."""
    s = clean(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"
