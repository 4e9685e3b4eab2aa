"""profattr: where every millisecond of a decoded token goes, from Nsight Systems captures.

Flow, one direction: capture -> trace (read an export) -> attribute (budget, diff, limit, gap) -> report.
"""
__version__ = "0.1.0"
