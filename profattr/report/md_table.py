"""Small markdown helpers shared by the report's section writers: tables, numbers, labels, code blocks."""
from __future__ import annotations

import re

from profattr.text import md_escape, md_name  # noqa: F401

NAME_WIDTH = 80


def code_block(text: str, lang: str = "") -> list:
    """A fenced code block that nothing inside can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + lang, text, fence]


def _short(name: str, width: int = NAME_WIDTH) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _f(value, fmt: str = ".1f", none: str = "n/a") -> str:
    return none if value is None else format(value, fmt)


def _devices_label(cap, d) -> str:
    n = len(cap.budget["devices"])
    return md_name(cap.label) if n == 1 else f"{md_name(cap.label)} / GPU {d['device']}"


def _numeric(cell) -> bool:
    text = str(cell).strip("*% ").replace(",", "")
    try:
        float(text)
        return True
    except ValueError:
        return False


def _table(headers, rows) -> list:
    """A markdown table; columns whose cells are all numbers (or empty) are right-aligned."""
    align = []
    for i, _ in enumerate(headers):
        cells = [r[i] for r in rows if str(r[i]).strip()]
        align.append("---:" if cells and all(_numeric(c) for c in cells) else "---")
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _multi_device(data) -> bool:
    return any(len(c.budget["devices"]) > 1 for c in data.captures)
