"""Kernel taxonomy: rules (data, in rules/*.toml) that map GPU kernel names to attribution categories."""
from profattr.taxonomy.classify import load_rules
from profattr.taxonomy.ruleset import UNCLASSIFIED, Category, Rule, RuleSet

__all__ = ["UNCLASSIFIED", "Category", "Rule", "RuleSet", "load_rules"]
