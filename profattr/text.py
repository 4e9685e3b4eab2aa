"""Strings that come from captures (kernel names, NVTX text, server logs) before they reach a terminal or markdown:
control characters (ESC sequences, NUL, line breaks) are replaced, so a name can neither move the cursor nor split
a table row.

Every renderer for people cleans the structure it renders (`clean_tree`) before it lays it out; what leaves the CLI
is cleaned once more as a block (`clean_block`: line breaks kept, every other control character replaced). The
budget's and diff's JSON and the budget's CSV are exact instead: JSON escapes control characters, CSV quotes them
(outputs.emit with exact=True).

Markdown (md_escape, md_code, md_name): identifiers (kernel names, paths, labels) go into inline code spans rather
than collecting backslashes: a word that holds a character markdown would read as markup (`_`, `*`, a backtick, a
backslash) becomes a code span, the rest of the text is escaped. A `|` always stays outside code spans, escaped as
`\\|`, so that a table cell cannot be split by it (GitHub splits table rows on `|` before it reads code spans) and a
paragraph still shows it plainly."""
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


# --- markdown ------------------------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~$])")  # inline markup anywhere; $ starts inline math on GitHub
_CODE_WORTHY = re.compile(r"[_*`\\]")  # a word holding one of these is an identifier: it goes into a code span
_WORD = re.compile(r"\S+")
_EDGE_OPEN = "('\"[{"
_EDGE_CLOSE = ")'\",;:.!?]}"
# what only matters at the start of a line: an ATX heading, a list item, a setext underline or thematic break
_HEADING = re.compile(r"^(\s*)(#{1,6})(?=\s|$)")
_BULLET = re.compile(r"^(\s*)([+\-])(?=\s|$)")
_ORDERED = re.compile(r"^(\s*)(\d{1,9})([.)])(?=\s|$)")
_RULE = re.compile(r"^(\s*)([=\-])(?=[=\-\s]*$)")


def md_escape(text) -> str:
    """Text safe inside a markdown paragraph or table cell: no markup, no HTML, no line breaks.

    Words that look like identifiers (see the module's doc) become code spans; elsewhere characters that make markup
    anywhere are backslash-escaped, `<`, `>` and `&` become entities (no HTML can open), and what only matters at the
    start of a line (a heading `# `, a list `- `/`1. `, a line of `-` or `=`) becomes a numeric character
    reference there (`&#45;`), which shows as the character and is never markup.
    """
    s = clean(text)
    s = _WORD.sub(lambda m: _word(m.group(0)), s)
    if s.startswith("`"):
        return s
    for pattern in (_HEADING, _BULLET, _RULE):
        s = pattern.sub(lambda m: m.group(1) + _entity(m.group(2)[0]) + m.group(2)[1:], s, count=1)
    return _ORDERED.sub(lambda m: m.group(1) + m.group(2) + _entity(m.group(3)), s, count=1)


def _entity(ch: str) -> str:
    """A character as a numeric reference: it shows as itself, and CommonMark never reads it as markup."""
    return f"&#{ord(ch)};"


def _word(word: str) -> str:
    return "\\|".join(_piece(p) for p in word.split("|"))


def _piece(piece: str) -> str:
    if not _CODE_WORTHY.search(piece):
        return _plain(piece)
    head = len(piece) - len(piece.lstrip(_EDGE_OPEN))
    tail = len(piece) - len(piece.rstrip(_EDGE_CLOSE))
    core = piece[head:len(piece) - tail] if head + tail < len(piece) else ""
    if core.endswith("'s") and len(core) > 2:  # a possessive: the name without its 's
        core, tail = core[:-2], tail + 2
    if not core or not _CODE_WORTHY.search(core):
        return _plain(piece)
    return _plain(piece[:head]) + md_code(core) + _plain(piece[len(piece) - tail:])


def _plain(s: str) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def md_code(text) -> str:
    """Text as an inline code span that cannot be closed early by backticks in it. For a paragraph; in a table
    cell use `md_name`, which keeps `|` outside the span."""
    s = clean(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_name(text) -> str:
    """An identifier (a capture label, a category, a kernel name) as code, safe anywhere: in a paragraph, a heading
    or a table cell. Whitespace inside stays inside the span; a `|` is written between spans, escaped."""
    s = clean(text)
    if not s:
        return ""
    return "\\|".join(md_code(p) if p else "" for p in s.split("|"))


def qualified_name(demangled: str) -> str:
    """A demangled kernel name's function, qualified: no return type, template arguments or argument list
    (``void a::b::K<int>(float*)`` -> ``a::b::K``; ``(anonymous namespace)`` becomes ``anonymous_namespace``)."""
    text = str(demangled).strip().replace("(anonymous namespace)", "anonymous_namespace")
    depth, cut = 0, len(text)
    for i, c in enumerate(text):  # the argument list starts at the first '(' outside template brackets
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "(" and depth == 0 and i > 0:
            cut = i
            break
    out, depth = [], 0
    for c in text[:cut]:  # drop template arguments
        if c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    head = "".join(out).strip()
    return head.split()[-1] if head.split() else head  # drop "void" and qualifiers
