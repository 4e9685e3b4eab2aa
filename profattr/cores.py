"""How many threads a stage's parallel work runs on."""
from __future__ import annotations

import os


def threads(variable: str, most: int) -> int:
    """The cores this process may use, at most `most`; the environment variable `variable` (a whole number above 0)
    sets it instead."""
    wanted = os.environ.get(variable, "")
    if wanted.strip().isdigit() and int(wanted) > 0:
        return int(wanted)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(most, cores))
