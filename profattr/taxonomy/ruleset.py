"""The rules in match order and what they answer per kernel name: ``Rule``, ``Category`` and ``RuleSet``.

Matching is deterministic, first match wins: user rules before shipped rules; within each, rules with an
``nvtx`` condition before plain rules; then by priority, file name and position in the file (classify.load_rules
puts them in that order). Callers work out which ``nvtx`` patterns an enclosing NVTX range matches
(``RuleSet.contexts_for``) and pass that set as ``contexts``; rules whose pattern is not in the set are skipped.
When the first matching rule is a shipped weak rule or a naming convention (rules/conventions.toml,
rules/generic.toml), or no rule matches, the kernel inventories (profattr/taxonomy/lookup.py: the kernels each
library's source defines, by function identifier) decide if they know the kernel, as a strong rule with id
``inventory.LIBRARY``. Kernel names and NVTX text are matched on their first ``regexguard.MAX_MATCH_CHARS`` (4096)
characters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from profattr.regexguard import capped
from profattr.taxonomy import contexts as ctxrules
from profattr.taxonomy import lookup

UNCLASSIFIED = "unclassified"
CONVENTION_FILES = ("conventions.toml", "generic.toml")  # rules that read generic words, not one library's names


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


def _convention(rule: Rule) -> bool:
    """A plain naming-convention rule: the inventories decide before it. A convention that holds inside an NVTX
    range (``nvtx``) is the launch context's word and stays first."""
    return rule.nvtx is None and Path(rule.origin.rsplit(":", 1)[0]).name in CONVENTION_FILES
