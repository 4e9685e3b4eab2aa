"""`profattr check`: is a capture worth analysing? Each check gives pass / warn / fail (or skip, when it does not
apply to this capture) with one line of explanation, the numbers behind it, the likely cause and what to do.

Families of checks, one module each: recording.py (kernels, graph nodes, devices, NVTX), completeness.py (records
lost, window coverage, steps without GPU work, graphs the server used but the capture lacks, a twin capture),
backend.py (the MoE backend's kernels, the server log's evidence), timing.py (first calls, steady state, profiler
overhead, steps counted). `evaluate` runs them all on one capture (an nsys export or torch-profiler traces).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
SEVERITY = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}


@dataclass
class Finding:
    check: str
    status: str
    message: str
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def overall(findings) -> str:
    """The worst status: fail, warn, or pass."""
    worst = max((SEVERITY[f.status] for f in findings), default=0)
    return {0: PASS, 1: WARN, 2: FAIL}[worst]


def render_table(findings) -> str:
    """Plain-text table: status, check, one line each, and the overall status last."""
    from profattr.text import clean

    width = max([len(f.check) for f in findings] + [5])
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  FINDING"]
    lines += [f"{f.status:<6}  {f.check:<{width}}  {clean(f.message)}" for f in findings]
    lines.append(f"overall: {overall(findings)}")
    return "\n".join(lines)


def to_json(findings, capture=None) -> dict:
    return {"schema": "profattr.check/1",
            "capture": {"path": str(capture.path) if capture and capture.path else None,
                        "run": str(capture.run_path) if capture and capture.run_path else None},
            "status": overall(findings), "findings": [f.to_dict() for f in findings]}


def short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
