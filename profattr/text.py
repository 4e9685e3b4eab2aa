"""Strings that come from captures (kernel names, NVTX text, server logs) before they reach a terminal, a CSV, JSON
or markdown: control characters (ESC sequences, NUL, line breaks) are replaced, so a name can neither move the
cursor nor split a table row."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text) -> str:
    """`text` as one line of printable characters (each control character becomes a space)."""
    return _CONTROL.sub(" ", str(text))
