"""Is a window's run of step times steady? A slow start (warm-up not finished: JIT, allocator, clocks still rising)
or a trend through the window makes the budget's means describe no real step.

The steady level is the median m of the window's second half, its spread the MAD (scaled to a standard deviation).
- warm-up: the leading steps, up to the last one in the first half that lies above m + max(4 spread, 10% of m),
  provided at least two thirds of those steps lie above that line, and their time above m is at least 1% of all
  step time;
- trend: over the steps after the warm-up, a Spearman rank correlation of the step time with its position of at
  least 0.6 in size, and a change of at least 5% from the first third to the last third (medians).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MIN_STEPS = 6
SPREAD_FACTOR = 4.0
MIN_REL_EXCESS = 0.10
MIN_EXCESS_SHARE = 0.01  # a slow start costing less than 1% of the window's step time is not worth a warning
TREND_RHO = 0.6
TREND_CHANGE = 0.05
MAD_TO_SD = 1.4826
WARMUP_ABOVE_SHARE = 2 / 3  # most steps of a warm-up are slow; a single slow step among fast ones is jitter


@dataclass
class Steadiness:
    steps: int
    steady_ms: float  # m
    threshold_ms: float
    warmup_steps: int  # leading steps above the steady level (0: none)
    warmup_ms: list  # their spans
    excess_share: float  # their time above m, as a share of all step time
    trend_rho: float | None
    trend_change: float | None  # (last third - first third) / m, after the warm-up
    unsteady: bool

    def describe(self) -> str:
        parts = []
        if self.warmup_steps:
            shown = ", ".join(f"{v:.2f}" for v in self.warmup_ms[:6]) + (" ..." if self.warmup_steps > 6 else "")
            parts.append(f"the first {self.warmup_steps} of {self.steps} steps ran slower ({shown} ms vs a steady "
                         f"{self.steady_ms:.3f} ms; {self.excess_share:.1%} of the step time above it): warm-up not "
                         "finished when the window opened")
        if self.trend_rho is not None and abs(self.trend_rho) >= TREND_RHO and \
                abs(self.trend_change or 0.0) >= TREND_CHANGE:
            way = "rise" if (self.trend_change or 0) > 0 else "fall"
            parts.append(f"step times {way} through the window ({self.trend_change:+.1%} from its first third to its "
                         f"last, rank correlation {self.trend_rho:+.2f})")
        return "; ".join(parts) or f"steady at {self.steady_ms:.3f} ms"

    def to_dict(self) -> dict:
        return asdict(self)


def _spearman(y: np.ndarray) -> float | None:
    if len(y) < MIN_STEPS or np.all(y == y[0]):
        return None
    ranks = np.argsort(np.argsort(y, kind="stable"), kind="stable").astype(float)
    x = np.arange(len(y), dtype=float)
    return float(np.corrcoef(x, ranks)[0, 1])


def steady_state(spans_ns) -> Steadiness:
    """The steadiness of a window's step spans (in time order)."""
    y = np.asarray(spans_ns, dtype=float) / 1e6
    n = len(y)
    if n < MIN_STEPS:
        m = float(np.median(y)) if n else 0.0
        return Steadiness(n, m, m, 0, [], 0.0, None, None, False)
    tail = y[n // 2:]
    m = float(np.median(tail))
    spread = MAD_TO_SD * float(np.median(np.abs(tail - m)))
    threshold = m + max(SPREAD_FACTOR * spread, MIN_REL_EXCESS * m)
    warmup = 0
    above = y > threshold
    for i in range(n // 2 - 1, -1, -1):
        if above[i] and above[: i + 1].mean() >= WARMUP_ABOVE_SHARE:
            warmup = i + 1
            break
    rest = y[warmup:]
    rho = _spearman(rest)
    third = max(len(rest) // 3, 1)
    change = (float(np.median(rest[-third:])) - float(np.median(rest[:third]))) / m if m else None
    trending = rho is not None and abs(rho) >= TREND_RHO and change is not None and abs(change) >= TREND_CHANGE
    excess = float(np.clip(y[:warmup] - m, 0, None).sum() / y.sum()) if warmup and y.sum() else 0.0
    if excess < MIN_EXCESS_SHARE:
        warmup, excess = 0, 0.0
    return Steadiness(n, m, threshold, warmup, [float(v) for v in y[:warmup]], excess, rho, change,
                      bool(warmup) or trending)
