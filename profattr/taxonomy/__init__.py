"""Kernel taxonomy: rules (data, in rules/*.toml) that map GPU kernel names to attribution categories."""
from profattr.taxonomy.classify import UNCLASSIFIED, Category, Rule, RuleSet, load_rules

__all__ = ["UNCLASSIFIED", "Category", "Rule", "RuleSet", "load_rules"]
