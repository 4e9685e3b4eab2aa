"""Kernel taxonomy: map a GPU kernel name, and the NVTX ranges around it, to an attribution category.

``load_rules`` reads the rules, which are data, not code: TOML files in ``profattr/taxonomy/rules/`` (shipped) plus
any files a user names with ``--rules`` (taxonomy/rulefile.py reads and checks each file and says what one holds),
the context rules of taxonomy/contexts.py and the kernel inventories of taxonomy/lookup.py, and returns them as one
ordered ``RuleSet`` (taxonomy/ruleset.py: how a name is matched). A user rule with a shipped rule's id replaces it.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Sequence, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from profattr.errors import ProfattrError
from profattr.taxonomy import contexts as ctxrules
from profattr.taxonomy import lookup
from profattr.taxonomy.rulefile import RawRule, build_rule, read_file
from profattr.taxonomy.ruleset import Category, Rule, RuleSet

RULES_DIR = Path(__file__).with_name("rules")

PathLike = Union[str, Path]


def load_rules(extra: Sequence[PathLike] = (), inventory_exclude: Sequence[str] = ()) -> RuleSet:
    """Shipped rules plus the user files in ``extra`` (which take precedence) as one ordered RuleSet, with the
    shipped kernel inventories (less the libraries in ``inventory_exclude``) deciding what no certain rule does.

    Raises ProfattrError naming the file and line for a file that cannot be read, bad TOML, a bad regex,
    an unknown category or key, or a duplicate rule id.
    """
    shipped_tables, shipped_categories = _shipped()
    categories = dict(shipped_categories)
    user_tables: list[tuple[RawRule, ...]] = []
    user_context_files = []
    for index, path in enumerate(extra):
        raw, declared = read_file(Path(path), user=True, file_index=index)
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
            rule = build_rule(raw, categories)
            if rule.id in user_rules:
                raise ProfattrError(
                    f"{raw.origin}: rule id '{rule.id}' is already defined at {user_rules[rule.id].origin}; "
                    "give each rule its own id")
            user_rules[rule.id] = rule
    shipped_rules = [r for r in shipped_tables if r.id not in user_rules]
    ordered = _order(list(user_rules.values())) + _order(shipped_rules)
    return RuleSet(ordered, categories, context_rules, lookup.shipped(tuple(sorted(inventory_exclude))))


# --- internals ---------------------------------------------------------------------------------------


def _order(rules: list[Rule]) -> list[Rule]:
    # nvtx-conditioned rules first, then priority; sorted() is stable, so file and position break ties
    return sorted(rules, key=lambda r: (r.nvtx is None, r.priority))


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[Rule, ...], dict[str, Category]]:
    raws: list[RawRule] = []
    categories: dict[str, Category] = {}
    for index, path in enumerate(sorted(RULES_DIR.glob("*.toml"))):
        raw, declared = read_file(path, user=False, file_index=index)
        for category in declared:
            if category.id in categories:
                raise ProfattrError(f"{category.origin}: category '{category.id}' is already declared at "
                                    f"{categories[category.id].origin}")
            categories[category.id] = category
        raws.extend(raw)
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for raw in sorted(raws, key=lambda r: r.sort_key):
        rule = build_rule(raw, categories)
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
