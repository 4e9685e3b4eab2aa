"""Launch-context rules: what a kernel's launch context says it is, for kernels no certain name rule covers.

A kernel's name is not always enough: a new library's kernel matches no rule, and a generic name (``elementwise``,
``_topk_kernel``, a bare ``Marlin``) matches only a weak one. Its launch context then decides: the torch operator
that launched it (torch-profiler traces: ``sgl_kernel::moe_align_block_size``, ``aten::mm``) or the NVTX module
range around the launch (SGLang's layerwise NVTX: ``model.layers.3.mlp.experts``; for a CUDA-graph replay, the
range around the node's capture). Context rules are data, TOML files in ``profattr/taxonomy/context/`` plus the
``[[context]]`` tables of files given with ``--rules``::

    [[context]]
    id = "nvtx.moe_experts"
    kind = "nvtx_module"             # nvtx_module (NVTX range text), torch_op (the launching torch operator) or
                                     # python_frame (a frame of the launch's Python stack, torch traces with_stack)
    pattern = '\\.mlp\\.experts\\b'  # regex searched in the range text or the operator name (a user
                                     # file's on RE2, the shipped ones on Python re: regexguard.py)
    category = "moe.permute"         # the category of a kernel that no name rule covers here
    strength = "strong"              # strong (default) or weak
    priority = 200                   # lower is checked first (default 500); more specific contexts first
    refine = { gemm = "moe.gemm" }   # optional: a weak name rule of this family (or category) becomes this
    contradicts = ["comm"]           # optional: families a certain name rule is reported for, inside this context
    source = "..."                   # where the module/operator name comes from
    evidence = "observed"            # as for name rules

The decision (``decide``): a strong name rule decides (``name``), and is reported when a strong context lists its
family under ``contradicts``; otherwise the first matching context decides (``context:torch_op`` or
``context:nvtx_module``), refining a weak rule's category where it says how; otherwise a weak name rule decides
(``name``); otherwise nothing does (``none``, unclassified).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from profattr.errors import ProfattrError
from profattr.regexguard import compile_user

CONTEXT_DIR = Path(__file__).with_name("context")
KINDS = ("nvtx_module", "torch_op", "python_frame")
TORCH_OP_PREFIX = "torch_op:"
PYTHON_FRAME_PREFIX = "python_frame:"
EVIDENCE_KINDS = ("name", "context:torch_op", "context:python_frame", "context:nvtx_module",
                  "context:graph_capture_nvtx", "none")
_KEYS = ("id", "kind", "pattern", "category", "strength", "priority", "refine", "contradicts", "source", "evidence",
         "note")
_REQUIRED_SHIPPED = ("id", "kind", "pattern", "category", "source", "evidence")
_REQUIRED_USER = ("id", "kind", "pattern", "category")
DEFAULT_PRIORITY = 500


@dataclass(frozen=True)
class ContextRule:
    """One context rule; ``origin`` is ``file:line`` of its ``[[context]]`` table."""

    id: str
    kind: str
    pattern: str
    category: str
    strength: str
    priority: int
    source: str
    origin: str
    user: bool = False
    refine: tuple = ()  # (family or category, category) pairs
    contradicts: tuple = ()
    regex: "re.Pattern[str]" = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def key(self) -> str:
        """The context key a caller puts in ``contexts``: the NVTX regex itself, ``torch_op:`` or ``python_frame:``
        + regex."""
        if self.kind == "nvtx_module":
            return self.pattern
        return (TORCH_OP_PREFIX if self.kind == "torch_op" else PYTHON_FRAME_PREFIX) + self.pattern

    def refined(self, category: str) -> Optional[str]:
        table = dict(self.refine)
        return table.get(category) or table.get(family(category))


@dataclass(frozen=True)
class Decision:
    """What decided a kernel's category: ``evidence`` is one of EVIDENCE_KINDS (less graph_capture_nvtx, which the
    budget tells from how the op's context was placed)."""

    category: str
    family: str
    evidence: str
    rule: object = None  # classify.Rule or None
    context: Optional[ContextRule] = None
    conflict: Optional[ContextRule] = None


def family(category: str) -> str:
    """Level-1 family of a category id: ``moe.gemm`` -> ``moe``."""
    return category.split(".", 1)[0]


def decide(rule, matched: Sequence[ContextRule], unclassified: str = "unclassified") -> Decision:
    """The decision for a kernel whose first name rule is ``rule`` (or None) and whose launch context matches the
    context rules ``matched`` (in match order)."""
    if rule is not None and rule.strength == "strong":
        conflict = next((c for c in matched if c.strength == "strong" and family(rule.category) in c.contradicts),
                        None)
        return Decision(rule.category, rule.family or "", "name", rule, matched[0] if matched else None, conflict)
    if matched:
        ctx = matched[0]
        if rule is not None:
            refined = ctx.refined(rule.category)
            if refined:
                return Decision(refined, rule.family or "", "context:" + ctx.kind, rule, ctx)
            if family(rule.category) == family(ctx.category):
                return Decision(rule.category, rule.family or "", "name", rule, ctx)
        return Decision(ctx.category, "context", "context:" + ctx.kind, rule, ctx)
    if rule is not None:
        return Decision(rule.category, rule.family or "", "name", rule)
    return Decision(unclassified, "", "none")


def order(rules: Sequence[ContextRule]) -> list:
    """Match order: user rules first; then torch operators, Python frames, NVTX ranges; then priority; then file
    order."""
    rank = {"torch_op": 0, "python_frame": 1, "nvtx_module": 2}
    return sorted(rules, key=lambda c: (not c.user, rank[c.kind], c.priority))


def shipped_tables() -> list:
    """(path, parsed TOML, text) of the shipped context files."""
    out = []
    for path in sorted(CONTEXT_DIR.glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        out.append((path, tomllib.loads(text), text))
    return out


def build(path: Path, data: dict, text: str, categories: dict, user: bool) -> list:
    """The context rules of one parsed file; ProfattrError with file:line for a bad table."""
    tables = data.get("context", [])
    if not isinstance(tables, list):
        raise ProfattrError(f"{path}: 'context' must be an array of tables ([[context]])")
    lines = _header_lines(text)
    out = []
    for position, table in enumerate(tables):
        where = f"{path}:{lines[position] if position < len(lines) else 0}"
        if not isinstance(table, dict):
            raise ProfattrError(f"{where}: each context rule must be a [[context]] table")
        out.append(_one(table, where, categories, user))
    return out


def _one(table: dict, where: str, categories: dict, user: bool) -> ContextRule:
    cid = table.get("id")
    label = f"context '{cid}'" if isinstance(cid, str) else "context"
    for key in table:
        if key not in _KEYS:
            raise ProfattrError(f"{where}: {label}: unknown key '{key}'; allowed keys: {', '.join(_KEYS)}")
    for key in (_REQUIRED_USER if user else _REQUIRED_SHIPPED):
        if not isinstance(table.get(key), str) or not table.get(key):
            raise ProfattrError(f"{where}: {label}: '{key}' is required and must be a non-empty string")
    kind = table["kind"]
    if kind not in KINDS:
        raise ProfattrError(f"{where}: {label}: kind must be one of {', '.join(KINDS)}, got '{kind}'")
    category = table["category"]
    if category not in categories:
        raise ProfattrError(f"{where}: {label}: unknown category '{category}'; use one of "
                            f"{', '.join(sorted(categories))}")
    strength = table.get("strength", "strong")
    if strength not in ("strong", "weak"):
        raise ProfattrError(f"{where}: {label}: strength must be strong or weak, got {strength!r}")
    priority = table.get("priority", DEFAULT_PRIORITY)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ProfattrError(f"{where}: {label}: priority must be an integer, got {priority!r}")
    refine = table.get("refine", {})
    if not isinstance(refine, dict) or not all(isinstance(v, str) for v in refine.values()):
        raise ProfattrError(f"{where}: {label}: refine must be a table of family = \"category\"")
    for target in refine.values():
        if target not in categories:
            raise ProfattrError(f"{where}: {label}: refine names unknown category '{target}'")
    contradicts = table.get("contradicts", [])
    if not isinstance(contradicts, list) or not all(isinstance(v, str) for v in contradicts):
        raise ProfattrError(f"{where}: {label}: contradicts must be a list of family names")
    pattern = table["pattern"]
    if user:
        regex = compile_user(pattern, f"{where}: {label}: 'pattern'")
    else:
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ProfattrError(f"{where}: {label}: bad regex {pattern!r}: {exc.msg}") from None
    return ContextRule(id=cid, kind=kind, pattern=pattern, category=category, strength=strength, priority=priority,
                       source=table.get("source", ""), origin=where, user=user,
                       refine=tuple(sorted(refine.items())), contradicts=tuple(contradicts), regex=regex)


def _header_lines(text: str) -> list:
    return [n for n, line in enumerate(text.splitlines(), start=1)
            if line.strip().replace(" ", "").startswith("[[context]]")]
