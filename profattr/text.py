"""Strings that come from captures (kernel names, NVTX text, server logs) before they reach a terminal or markdown:
control characters (ESC sequences, NUL, line breaks) are replaced, so a name can neither move the cursor nor split
a table row.

Every renderer for people cleans the structure it renders (`clean_tree`) before it lays it out; what leaves the CLI
is cleaned once more as a block (`clean_block`: line breaks kept, every other control character replaced). The
budget's and diff's JSON and the budget's CSV are exact instead: JSON escapes control characters, CSV quotes them
(outputs.emit with exact=True)."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")  # CSV's \r\n stays


def clean(text) -> str:
    """`text` as one line of printable characters (each control character becomes a space)."""
    return _CONTROL.sub(" ", str(text))


def clean_tree(value):
    """`value` (dicts, lists, tuples, strings, numbers) with every string, keys included, cleaned; other values as
    they are. A new structure: the input is not changed."""
    if isinstance(value, str):
        return clean(value) if _CONTROL.search(value) else value
    if isinstance(value, dict):
        return {clean_tree(k): clean_tree(v) for k, v in value.items()}
    if isinstance(value, list) or type(value) is tuple:
        return type(value)(clean_tree(v) for v in value)
    return value


def clean_block(text: str) -> str:
    """Rendered text (several lines) with every control character but the line break (\\n, \\r\\n) replaced by a space."""
    return _CONTROL_BUT_NEWLINE.sub(" ", text)
