"""Reading and checking one rules file: its ``[[rule]]`` and ``[[category]]`` tables, each with the file:line
it came from, and each rule built (checked, its regexes compiled) against the known categories.

The rules are data, not code: TOML files in ``profattr/taxonomy/rules/`` (shipped) plus any files a user
names with ``--rules``. A rules file holds::

    priority = 500                  # default priority of the file's rules; lower is checked first

    [[category]]                    # optional: declare more category ids
    id = "gemm.fp4"
    description = "..."

    [[rule]]
    id = "cublas.nvjet.fp8"         # unique; a user rule with a shipped rule's id replaces it
    category = "gemm.fp8"           # a declared category id
    pattern = '^nvjet_(sm\\d+_)?qq'  # regex (RE2 syntax in a user file), case-sensitive, searched in the demangled name
    family = "cublas_nvjet"         # kernel library/backend label, used for backend fingerprints
    source = "repo path or issue"   # where the name comes from
    evidence = "observed"           # observed | source | derived (user files may also say "user")
    nvtx = '(?i)moe|experts'        # optional: applies only inside an NVTX range matching this regex
    priority = 240                  # optional: overrides the file's priority
    strength = "weak"               # optional: strong (default) or weak; a weak rule is a naming-convention
                                    # guess or a generic fallback, and the launch context may overrule it
    note = "..."                    # optional
    weight_dtype = "fp4"            # optional, GEMM rules: the precision of the weights the kernel reads
    math = "native FP4 tensor cores"  # optional, GEMM rules: how the math ran ("W4A16: unpacked to BF16 in the kernel")

User patterns (``pattern`` and ``nvtx`` of files given with ``--rules``) are compiled by RE2, which matches in time
linear in the name whatever the pattern; one RE2 cannot run (a backreference, lookaround) is refused with its
file:line. The shipped patterns stay on Python ``re`` (some use lookaround): profattr/regexguard.py says why. Kernel
names and NVTX text are matched on their first ``regexguard.MAX_MATCH_CHARS`` (4096) characters.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from profattr.errors import ProfattrError
from profattr.regexguard import compile_user
from profattr.taxonomy.ruleset import Category, Rule

EVIDENCE = ("observed", "source", "derived", "user")
STRENGTHS = ("strong", "weak")
DEFAULT_PRIORITY = 500

_RULE_KEYS = ("id", "category", "pattern", "family", "source", "evidence", "nvtx", "priority", "note", "strength",
              "weight_dtype", "math")
_REQUIRED_SHIPPED = ("id", "category", "pattern", "family", "source", "evidence")
_REQUIRED_USER = ("id", "category", "pattern")
_TOP_KEYS = ("priority", "rule", "category", "context")
_CATEGORY_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
_KEY_LINE = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


@dataclass(frozen=True)
class RawRule:
    """One ``[[rule]]`` table as read, not yet checked: its keys, file:line, the line of each key, whose file it is
    and where it sorts (file, then position in the file)."""

    table: dict
    origin: str
    lines: dict
    user: bool
    file_priority: int
    sort_key: tuple


def read_file(path: Path, user: bool, file_index: int) -> tuple[tuple[RawRule, ...], list[Category]]:
    """The file's rule tables (unchecked) and the categories it declares; ProfattrError with file:line for a file
    that cannot be read, bad TOML, an unknown top-level key or a bad category."""
    if user:
        from profattr import inputs

        try:
            inputs.regular_file(path, "a rules file (TOML)")
        except ProfattrError as exc:
            raise ProfattrError(f"cannot read rules file {exc.format_message()}") from None
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ProfattrError(f"cannot read rules file {path}: {exc.strerror or exc}; check the path") from None
    except UnicodeDecodeError:
        raise ProfattrError(f"{path}: rules file is not UTF-8 text; save it as UTF-8 TOML") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"at line (\d+)", message)
        if found:
            where = f"{path}:{found.group(1)}"
        elif "end of document" in message:
            where = f"{path}:{max(1, len(text.splitlines()))}"
        else:
            where = str(path)
        message = re.sub(r"\s*\((at line \d+, column \d+|at end of document)\)", "", message)
        raise ProfattrError(f"{where}: invalid TOML: {message}; fix the rules file") from None

    for key in data:
        if key not in _TOP_KEYS:
            raise ProfattrError(f"{path}: unknown top-level key '{key}'; a rules file holds priority, "
                                "[[rule]] and [[category]] tables")
    file_priority = data.get("priority", DEFAULT_PRIORITY)
    if not isinstance(file_priority, int) or isinstance(file_priority, bool):
        raise ProfattrError(f"{path}: priority must be an integer, got {file_priority!r}")

    rule_lines = _table_lines(text, "rule")
    category_lines = _table_lines(text, "category")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise ProfattrError(f"{path}: 'rule' must be an array of tables ([[rule]])")
    raws = []
    for position, table in enumerate(tables):
        lines = rule_lines[position] if position < len(rule_lines) else {}
        origin = f"{path}:{lines.get('', 0)}"
        if not isinstance(table, dict):
            raise ProfattrError(f"{origin}: each rule must be a [[rule]] table")
        raws.append(RawRule(table=table, origin=origin, lines=lines, user=user, file_priority=file_priority,
                             sort_key=(file_index, position)))

    categories = []
    declared = data.get("category", [])
    if not isinstance(declared, list):
        raise ProfattrError(f"{path}: 'category' must be an array of tables ([[category]])")
    for position, table in enumerate(declared):
        lines = category_lines[position] if position < len(category_lines) else {}
        origin = f"{path}:{lines.get('', 0)}"
        cid = table.get("id") if isinstance(table, dict) else None
        if not isinstance(cid, str) or not _CATEGORY_ID.match(cid):
            raise ProfattrError(f"{origin}: category id must look like 'family' or 'family.kind' "
                                f"(lower case, digits, underscores), got {cid!r}")
        description = table.get("description", "")
        if not isinstance(description, str):
            raise ProfattrError(f"{origin}: category '{cid}' description must be a string")
        categories.append(Category(cid, description, origin))
    return tuple(raws), categories


def _table_lines(text: str, table: str) -> list[dict]:
    """Per ``[[table]]`` in file order: {'': header line, key: line of that key}. Lines count from 1."""
    header = f"[[{table}]]"
    blocks: list[dict] = []
    current: Optional[dict] = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            current = {"": number} if stripped.replace(" ", "").startswith(header) else None
            if current is not None:
                blocks.append(current)
            continue
        if current is not None:
            found = _KEY_LINE.match(line)
            if found:
                current.setdefault(found.group(1).strip("\"'"), number)
    return blocks


def build_rule(raw: RawRule, categories: dict[str, Category]) -> Rule:
    """The checked rule, its regexes compiled; ProfattrError with file:line for an unknown or missing key, a wrong
    type, an unknown category, evidence or strength, or a bad regex."""
    table = raw.table
    path = raw.origin.rsplit(":", 1)[0]

    def where(key: str = "") -> str:
        return f"{path}:{raw.lines.get(key, raw.lines.get('', 0))}"

    rid = table.get("id")
    label = f"rule '{rid}'" if isinstance(rid, str) else "rule"
    for key in table:
        if key not in _RULE_KEYS:
            raise ProfattrError(f"{where(key)}: {label}: unknown key '{key}'; allowed keys: {', '.join(_RULE_KEYS)}")
    for key in (_REQUIRED_USER if raw.user else _REQUIRED_SHIPPED):
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise ProfattrError(f"{where(key)}: {label}: '{key}' is required and must be a non-empty string")
    for key in ("family", "source", "evidence", "nvtx", "note", "strength", "weight_dtype", "math"):
        if key in table and not isinstance(table[key], str):
            raise ProfattrError(f"{where(key)}: {label}: '{key}' must be a string")

    category = table["category"]
    if category not in categories:
        raise ProfattrError(f"{where('category')}: {label}: unknown category '{category}'; use one of "
                            f"{', '.join(sorted(categories))} or declare it in a [[category]] table")
    evidence = table.get("evidence", "user")
    if evidence not in EVIDENCE:
        raise ProfattrError(f"{where('evidence')}: {label}: evidence must be one of {', '.join(EVIDENCE)}, "
                            f"got '{evidence}'")
    strength = table.get("strength", "strong")
    if strength not in STRENGTHS:
        raise ProfattrError(f"{where('strength')}: {label}: strength must be strong or weak, got '{strength}'")
    priority = table.get("priority", raw.file_priority)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ProfattrError(f"{where('priority')}: {label}: priority must be an integer, got {priority!r}")

    regex = _compile(table["pattern"], where("pattern"), label, "pattern", raw.user)
    nvtx = table.get("nvtx")
    nvtx_regex = None
    if nvtx is not None:
        if not nvtx:
            raise ProfattrError(f"{where('nvtx')}: {label}: 'nvtx' must be a non-empty regex when present")
        nvtx_regex = _compile(nvtx, where("nvtx"), label, "nvtx", raw.user)
    return Rule(id=rid, category=category, pattern=table["pattern"], family=table.get("family", "user"),
                source=table.get("source", ""), evidence=evidence, nvtx=nvtx, priority=priority,
                origin=raw.origin, user=raw.user, note=table.get("note", ""), strength=strength,
                weight_dtype=table.get("weight_dtype", ""), math=table.get("math", ""), regex=regex,
                nvtx_regex=nvtx_regex)


def _compile(pattern: str, where: str, label: str, key: str, user: bool = False) -> "re.Pattern[str]":
    """A user file's pattern on RE2 (regexguard.compile_user), a shipped one on Python re."""
    if user:
        return compile_user(pattern, f"{where}: {label}: '{key}'")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ProfattrError(f"{where}: {label}: bad regex in '{key}' {pattern!r}: {exc.msg} at position {exc.pos}; "
                            "write a Python re pattern") from None
    except (RecursionError, OverflowError, ValueError) as exc:
        raise ProfattrError(f"{where}: {label}: bad regex in '{key}' {pattern!r}: {exc}; write a simpler pattern"
                            ) from None
