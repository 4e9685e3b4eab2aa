"""Kernel taxonomy: map a GPU kernel name, and the NVTX ranges around it, to an attribution category.

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

Matching is deterministic, first match wins: user rules before shipped rules; within each, rules with an
``nvtx`` condition before plain rules; then by priority, file name and position in the file. Callers work
out which ``nvtx`` patterns an enclosing NVTX range matches (``RuleSet.contexts_for``) and pass that set
as ``contexts``; rules whose pattern is not in the set are skipped. When the first matching rule is a shipped weak
rule or a naming convention (rules/conventions.toml, rules/generic.toml), or no rule matches, the kernel inventories (profattr/taxonomy/lookup.py: the kernels each library's source
defines, by function identifier) decide if they know the kernel, as a strong rule with id ``inventory.LIBRARY``.
"""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from profattr.errors import ProfattrError
from profattr.regexguard import capped, compile_user
from profattr.taxonomy import contexts as ctxrules
from profattr.taxonomy import lookup

RULES_DIR = Path(__file__).with_name("rules")
UNCLASSIFIED = "unclassified"
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

PathLike = Union[str, Path]


@dataclass(frozen=True)
class Category:
    """One category id with its one-line description and the file:line that declared it."""

    id: str
    description: str
    origin: str


@dataclass(frozen=True)
class Rule:
    """One classification rule; ``origin`` is ``file:line`` of its ``[[rule]]`` table."""

    id: str
    category: str
    pattern: str
    family: str
    source: str
    evidence: str
    nvtx: Optional[str]
    priority: int
    origin: str
    user: bool = False
    note: str = ""
    strength: str = "strong"
    weight_dtype: str = ""
    math: str = ""
    regex: "re.Pattern[str]" = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    nvtx_regex: "re.Pattern[str] | None" = field(repr=False, compare=False, default=None)


class RuleSet:
    """Ordered rules plus the category table. ``match``/``classify`` answer per kernel name."""

    def __init__(self, rules: Sequence[Rule], categories: dict[str, Category], context_rules: Sequence = (),
                 inventory: Optional["lookup.Inventory"] = None):
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.inventory = inventory if inventory is not None else lookup.Inventory(())
        self._inventory_rules: dict[str, Rule] = {}
        self.categories = dict(categories)
        self.context_rules = tuple(ctxrules.order(context_rules))
        self._plain = tuple(r for r in self.rules if r.nvtx is None)
        self._context_patterns = list(dict.fromkeys(
            [r.nvtx for r in self.rules if r.nvtx is not None]
            + [c.pattern for c in self.context_rules if c.kind == "nvtx_module"]))
        compiled: dict = {}  # pattern -> its regex as its file compiled it (a user's on RE2)
        for r in self.rules:
            if r.nvtx is not None and r.nvtx_regex is not None:
                compiled.setdefault(r.nvtx, r.nvtx_regex)
        for c in self.context_rules:
            if c.kind == "nvtx_module" and c.regex is not None:
                compiled.setdefault(c.pattern, c.regex)
        self._context_regexes = [(p, compiled.get(p) or re.compile(p)) for p in self._context_patterns]
        self._cache: dict[tuple, Optional[Rule]] = {}
        self._decisions: dict[tuple, ctxrules.Decision] = {}

    @property
    def context_patterns(self) -> list[str]:
        """Distinct NVTX regexes: the ``nvtx`` conditions of the rules, then the nvtx_module context rules'."""
        return list(self._context_patterns)

    @property
    def context_regexes(self) -> list:
        """The compiled context_patterns, in the same order (a user's on RE2, the shipped ones on re)."""
        return [rx for _, rx in self._context_regexes]

    @property
    def torch_op_rules(self) -> list:
        """The torch_op context rules, in match order (their ``key`` goes into ``contexts``)."""
        return [c for c in self.context_rules if c.kind == "torch_op"]

    def torch_op_contexts(self, op_names: Iterable[str]) -> frozenset[str]:
        """The torch_op context keys that the launching operator name(s) ``op_names`` match."""
        names = [capped(n) for n in op_names if n]
        return frozenset(c.key for c in self.torch_op_rules if any(c.regex.search(n) for n in names))

    @property
    def python_frame_rules(self) -> list:
        """The python_frame context rules, in match order."""
        return [c for c in self.context_rules if c.kind == "python_frame"]

    def python_frame_contexts(self, frames: Iterable[str]) -> frozenset[str]:
        """The python_frame context keys that any frame of a launch's Python stack ``frames`` matches."""
        names = [capped(n) for n in frames if n]
        return frozenset(c.key for c in self.python_frame_rules if any(c.regex.search(n) for n in names))

    def decide(self, name: str, contexts: Iterable[str] = frozenset(), short: Optional[str] = None
               ) -> "ctxrules.Decision":
        """Category of ``name`` and the evidence that decided it (contexts.decide): a certain name rule, else the
        launch context (``contexts`` holds NVTX patterns, see contexts_for, and torch_op keys), else a weak rule."""
        ctx = contexts if isinstance(contexts, frozenset) else frozenset(contexts)
        key = (name, ctx, short)
        found = self._decisions.get(key)
        if found is None:
            rule = self.match(name, ctx, short)
            matched = [c for c in self.context_rules if c.key in ctx]
            found = self._decisions[key] = ctxrules.decide(rule, matched, UNCLASSIFIED)
        return found

    def matches(self, name: str, contexts: Iterable[str] = frozenset()) -> list:
        """Every rule whose pattern matches ``name`` under ``contexts``, in match order (for --explain)."""
        ctx = frozenset(contexts)
        text = capped(name or "")
        return [r for r in self.rules if (r.nvtx is None or r.nvtx in ctx) and r.regex.search(text)]

    def contexts_for(self, range_names: Iterable[str]) -> frozenset[str]:
        """The ``nvtx`` patterns that at least one of ``range_names`` (enclosing NVTX ranges) matches."""
        names = [capped(n) for n in range_names if n]
        return frozenset(p for p, rx in self._context_regexes if any(rx.search(n) for n in names))

    def match(self, name: str, contexts: Iterable[str] = frozenset(), short: Optional[str] = None) -> Optional[Rule]:
        """First rule matching ``name`` (the demangled name) under ``contexts``; tries ``short`` if none does.

        Returns None when no rule matches.
        """
        ctx = contexts if isinstance(contexts, frozenset) else frozenset(contexts)
        key = (name, ctx, short)
        try:
            return self._cache[key]
        except KeyError:
            pass
        rule = self._first(capped(name or ""), ctx)
        if rule is None and short and short != name:
            rule = self._first(capped(short), ctx)
        if rule is None or (not rule.user and (rule.strength == "weak" or _convention(rule))):
            rule = self.inventory_rule(capped(name or ""), short) or rule
        self._cache[key] = rule
        return rule

    def inventory_rule(self, name: str, short: Optional[str] = None) -> Optional[Rule]:
        """The kernel inventories' answer for ``name`` as a strong rule (id ``inventory.LIBRARY``), or None when the
        inventories do not know its identifier, or give it several categories (lookup.Inventory.find)."""
        entry = self.inventory.find(name, short)
        if entry is None or entry.category not in self.categories:
            return None
        found = self._inventory_rules.get(entry.origin)
        if found is None:
            found = self._inventory_rules[entry.origin] = Rule(
                id=f"inventory.{entry.library}", category=entry.category, pattern=re.escape(entry.identifier),
                family=entry.family, source=f"{entry.library} {entry.version}: {entry.source}", evidence="source",
                nvtx=None, priority=0, origin=f"inventory/{entry.origin}", strength="strong",
                note="the kernel inventory: the library's source defines this kernel",
                regex=re.compile(re.escape(entry.identifier)))
        return found

    def classify(self, name: str, contexts: Iterable[str] = frozenset(), short: Optional[str] = None) -> str:
        """Category id of ``name``, or ``unclassified`` when no rule matches."""
        rule = self.match(name, contexts, short)
        return rule.category if rule is not None else UNCLASSIFIED

    def classify_many(self, names: Iterable[str], contexts: Iterable[str] = frozenset()) -> list[str]:
        """Category ids for ``names`` in order; each distinct name is matched once."""
        ctx = frozenset(contexts)
        seen: dict[str, str] = {}
        out = []
        for name in names:
            category = seen.get(name)
            if category is None:
                category = seen[name] = self.classify(name, ctx)
            out.append(category)
        return out

    def rule(self, rule_id: str) -> Optional[Rule]:
        """The rule with id ``rule_id``, or None."""
        return next((r for r in self.rules if r.id == rule_id), None)

    def _first(self, name: str, contexts: frozenset) -> Optional[Rule]:
        candidates = self.rules if contexts else self._plain
        for rule in candidates:
            if rule.nvtx is not None and rule.nvtx not in contexts:
                continue
            if rule.regex.search(name):
                return rule
        return None


def load_rules(extra: Sequence[PathLike] = (), inventory_exclude: Sequence[str] = ()) -> RuleSet:
    """Shipped rules plus the user files in ``extra`` (which take precedence) as one ordered RuleSet, with the
    shipped kernel inventories (less the libraries in ``inventory_exclude``) deciding what no certain rule does.

    Raises ProfattrError naming the file and line for a file that cannot be read, bad TOML, a bad regex,
    an unknown category or key, or a duplicate rule id.
    """
    shipped_tables, shipped_categories = _shipped()
    categories = dict(shipped_categories)
    user_tables: list[tuple[_RawRule, ...]] = []
    user_context_files = []
    for index, path in enumerate(extra):
        raw, declared = _read_file(Path(path), user=True, file_index=index)
        for category in declared:
            categories.setdefault(category.id, category)
        user_tables.append(raw)
        user_context_files.append(Path(path))
    context_rules = list(_shipped_contexts())
    for path in user_context_files:
        text = path.read_bytes().decode("utf-8")
        context_rules.extend(ctxrules.build(path, tomllib.loads(text), text, categories, user=True))
    seen_contexts: dict[str, str] = {}
    for c in context_rules:
        if c.id in seen_contexts and c.user:
            context_rules = [x for x in context_rules if not (x.id == c.id and not x.user)]
        elif c.id in seen_contexts:
            raise ProfattrError(f"{c.origin}: context id '{c.id}' is already defined at {seen_contexts[c.id]}")
        seen_contexts[c.id] = c.origin

    user_rules: dict[str, Rule] = {}
    for raw_rules in user_tables:
        for raw in raw_rules:
            rule = _build_rule(raw, categories)
            if rule.id in user_rules:
                raise ProfattrError(
                    f"{raw.origin}: rule id '{rule.id}' is already defined at {user_rules[rule.id].origin}; "
                    "give each rule its own id")
            user_rules[rule.id] = rule
    shipped_rules = [r for r in shipped_tables if r.id not in user_rules]
    ordered = _order(list(user_rules.values())) + _order(shipped_rules)
    return RuleSet(ordered, categories, context_rules, lookup.shipped(tuple(sorted(inventory_exclude))))


# --- internals ---------------------------------------------------------------------------------------

CONVENTION_FILES = ("conventions.toml", "generic.toml")  # rules that read generic words, not one library's names


def _convention(rule: Rule) -> bool:
    """A plain naming-convention rule: the inventories decide before it. A convention that holds inside an NVTX
    range (``nvtx``) is the launch context's word and stays first."""
    return rule.nvtx is None and Path(rule.origin.rsplit(":", 1)[0]).name in CONVENTION_FILES


@dataclass(frozen=True)
class _RawRule:
    table: dict
    origin: str
    lines: dict
    user: bool
    file_priority: int
    sort_key: tuple


def _order(rules: list[Rule]) -> list[Rule]:
    # nvtx-conditioned rules first, then priority; sorted() is stable, so file and position break ties
    return sorted(rules, key=lambda r: (r.nvtx is None, r.priority))


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[Rule, ...], dict[str, Category]]:
    raws: list[_RawRule] = []
    categories: dict[str, Category] = {}
    for index, path in enumerate(sorted(RULES_DIR.glob("*.toml"))):
        raw, declared = _read_file(path, user=False, file_index=index)
        for category in declared:
            if category.id in categories:
                raise ProfattrError(f"{category.origin}: category '{category.id}' is already declared at "
                                    f"{categories[category.id].origin}")
            categories[category.id] = category
        raws.extend(raw)
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for raw in sorted(raws, key=lambda r: r.sort_key):
        rule = _build_rule(raw, categories)
        if rule.id in seen:
            raise ProfattrError(f"{rule.origin}: rule id '{rule.id}' is already defined at {seen[rule.id]}")
        seen[rule.id] = rule.origin
        rules.append(rule)
    return tuple(rules), categories


@functools.lru_cache(maxsize=1)
def _shipped_contexts() -> tuple:
    categories = _shipped()[1]
    out = []
    for path, data, text in ctxrules.shipped_tables():
        out.extend(ctxrules.build(path, data, text, categories, user=False))
    return tuple(out)


def _read_file(path: Path, user: bool, file_index: int) -> tuple[tuple[_RawRule, ...], list[Category]]:
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
        raws.append(_RawRule(table=table, origin=origin, lines=lines, user=user, file_priority=file_priority,
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


def _build_rule(raw: _RawRule, categories: dict[str, Category]) -> Rule:
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
