"""The kernel inventories as a classifier: a kernel whose own function name a library defines gets the category
that library's source gives it.

The inventories (``profattr/taxonomy/inventory/LIBRARY.tsv``, built by scripts/build-kernel-inventory from the
libraries' published sources and wheels) list one row per kernel a library defines: its function identifier, the
category where the library keeps it (inventory/sources.toml), the library, its version and the source file. A
name rule generalises from names seen before; the inventory knows the exact kernels of each release, so it decides
a kernel that no library's own name rule covers: before the naming conventions (rules/conventions.toml and
rules/generic.toml, which read generic words), the launch context and the weak rules.

The key is the kernel's function identifier: the demangled name without return type, namespaces, template
arguments and arguments (``void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)`` ->
``FusedAddRMSNormKernel``), as nsys's shortName gives it; Triton kernels are their function name already.
An identifier is not looked up when:

* the inventories give it more than one category (``_fwd_kernel``, a bare ``Marlin``): the name rules and the
  launch context decide;
* it is a CUB kernel (``DeviceRadixSort...Kernel``) that a library compiled in (GENERIC_IDENTIFIERS);
* the demangled name puts it in a namespace of a generic library that other libraries instantiate (``cub::``,
  ``at::``, ``thrust::``, ``cutlass::``, ``cute::``, ``std::``): a ``cub::DeviceRadixSortOnesweepKernel`` built into
  vLLM's MoE module is not vLLM's MoE kernel. ATen and CUTLASS are inventoried too, but their kernels are building
  blocks (a reduction, an elementwise op, a GEMM template) whose role in a decode only the launch context or a
  name rule tells (an ``at::native::reduce_kernel`` under ``aten::argmax`` is sampling), so their rows score the
  rules (scripts/score-kernel-inventory) and do not decide.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from profattr.text import qualified_name

INVENTORY_DIR = Path(__file__).with_name("inventory")
GENERIC_NAMESPACES = ("cub", "at", "thrust", "cutlass", "cute", "std", "c10", "cuda", "__cxxabiv1")
# older Triton appended the pointer-argument signature to the kernel name: _fwd_kernel_0d1d2d3de
_TRITON_SIGNATURE = re.compile(r"_\d+d(?:\d+[dc])*(?:e)?$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# kernels of CUB that a library's shared object instantiates (DeviceRadixSortOnesweepKernel inside vLLM's MoE
# module): CUB's, whichever library compiled them in; the launch context tells what they sorted or scanned
GENERIC_IDENTIFIERS = re.compile(r"^(Device[A-Z][A-Za-z]*Kernel|EmptyKernel)$")


@dataclass(frozen=True)
class Entry:
    """One inventoried kernel: its identifier, category and where it comes from (``library`` ``version``: file)."""

    identifier: str
    category: str
    family: str
    library: str
    version: str
    source: str
    origin: str  # inventory file:line


def identifier(demangled: str) -> str:
    """The kernel's function identifier (the last part of its qualified name), or "" when there is none."""
    name = qualified_name(demangled).rsplit("::", 1)[-1]
    return name if _IDENTIFIER.match(name) else ""


def namespaces(demangled: str) -> tuple:
    """The namespaces (and enclosing classes) the kernel's qualified name puts it in, outermost first."""
    parts = qualified_name(demangled).split("::")
    return tuple(p for p in parts[:-1] if p)


class Inventory:
    """Identifier -> the inventoried kernels of that identifier, over the libraries loaded."""

    def __init__(self, entries: Iterable[Entry]):
        by_id: dict[str, list[Entry]] = {}
        for entry in entries:
            if GENERIC_IDENTIFIERS.match(entry.identifier):
                continue
            by_id.setdefault(entry.identifier, []).append(entry)
        self._by_id = by_id
        # the categories each bare identifier has under any namespace (marlin::Marlin, marlin_moe::Marlin -> Marlin)
        self._bare_categories: dict[str, set] = {}
        for key, group in by_id.items():
            self._bare_categories.setdefault(key.rsplit("::", 1)[-1], set()).update(e.category for e in group)

    def entries_named(self, ident: str) -> list:
        """Every inventoried kernel whose identifier is ``ident``, bare or under a namespace (``Marlin``:
        ``marlin::Marlin`` and ``marlin_moe::Marlin`` too)."""
        return [e for key, group in self._by_id.items() if key == ident or key.endswith("::" + ident) for e in group]

    def find(self, demangled: str, short: Optional[str] = None) -> Optional[Entry]:
        """The inventoried kernel ``demangled`` is, when exactly one category is known for its identifier and its
        namespace is not a generic library's; else None."""
        spaces = namespaces(demangled) if demangled else ()
        if any(ns in GENERIC_NAMESPACES for ns in spaces[:1]):
            return None
        for ident in _keys(demangled, short):
            # a namespaced row first (marlin::Marlin), from the innermost namespace out; then the bare identifier,
            # which decides only when every row of that identifier, namespaced or not, has one category
            for depth in range(1, len(spaces) + 1):
                found = self._by_id.get("::".join(spaces[-depth:] + (ident,)))
                if found and len({e.category for e in found}) == 1:
                    return found[0]
            found = self._by_id.get(ident)
            if not found and ident not in self._bare_categories:
                continue
            if len(self._bare_categories.get(ident, ())) == 1 and found:
                return found[0]
            return None  # known, with several categories: not the inventory's to say
        return None


def _keys(demangled: str, short: Optional[str]) -> list:
    keys = []
    for ident in (short, identifier(demangled or "")):
        if ident and ident not in keys:
            keys.append(ident)
            bare = _TRITON_SIGNATURE.sub("", ident)
            if bare != ident and bare not in keys:
                keys.append(bare)
    return keys


def read(path: Path) -> list:
    """The entries of one inventory TSV (``name category family library version source``; ``#`` comments)."""
    out = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 6:
                continue
            out.append(Entry(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], f"{path.name}:{number}"))
    return out


def files(directory: Path = INVENTORY_DIR) -> list:
    """The inventory TSVs, sorted by name."""
    return sorted(directory.glob("*.tsv"))


@functools.lru_cache(maxsize=8)
def shipped(exclude: tuple = ()) -> Inventory:
    """The shipped inventories, without the libraries (file stems) in ``exclude``."""
    entries = []
    for path in files():
        if path.stem not in exclude:
            entries.extend(read(path))
    return Inventory(entries)
