"""Escaping for strings that come from captures (kernel names, NVTX text) before they enter markdown."""
from __future__ import annotations

import re

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$])")  # $ starts inline math on GitHub


def md_escape(text) -> str:
    """Text safe inside a markdown paragraph or table cell: no markup, no HTML, no line breaks."""
    s = str(text).replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return s.replace("\\<", "&lt;").replace("\\>", "&gt;")


def md_code(text) -> str:
    """Text as an inline code span that cannot be closed early by backticks in it."""
    s = str(text).replace("\r", " ").replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"
