"""profattr: where every millisecond of a decoded token goes, from Nsight Systems captures.

Flow, one direction: capture -> trace (read an export) -> attribute (budget, diff, limit, gap) -> report.

As a library (profattr/api.py): `profattr.open(path).budget()`, `profattr.diff(a, b)`, `profattr.gap(capture)`,
`profattr.check(capture)`, `profattr.report(captures, out)`, `profattr.classify(names)`, `profattr.Ledger(path)`;
bad input raises `profattr.ProfattrError`.
"""
import sys
import types

__version__ = "0.1.0"

from profattr.errors import ProfattrError  # noqa: E402
from profattr.api import Budget, Capture, Ledger, Result, check, classify, diff, gap, open, report  # noqa: E402,A004

__all__ = ["Budget", "Capture", "Ledger", "ProfattrError", "Result", "check", "classify", "diff", "gap", "open",
           "report", "__version__"]


class _Package(types.ModuleType):
    """`profattr.check` and `profattr.report` are the functions, also once the subpackages of the same name are
    imported (an import sets the parent's attribute; here it does not replace an API name). The subpackages stay
    importable as `profattr.check.run`, `profattr.report.collect`."""

    def __setattr__(self, name, value):
        if name in __all__ and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
