"""A trend over time: the least-squares slope of a series against time, with its t interval
(scipy's linregress). Numbers in, numbers out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from specflow.stats.critical import t_value


@dataclass(frozen=True)
class Trend:
    """The change of a series per hour, on the log scale (so a relative change)."""

    per_hour: float
    """Relative change per hour (exp(slope x 3600) - 1)."""
    lo: float
    hi: float
    """Its two-sided interval at `confidence`."""
    over_run: float
    """Relative change over the observed span."""
    run_lo: float
    run_hi: float
    """The interval of `over_run`."""
    n: int
    span_s: float
    p: float
    """Two-sided p-value of no trend."""


def log_trend(t_s: Sequence[float], values: Sequence[float], confidence: float
              ) -> Trend | None:
    """The trend of log(values) against time `t_s` (seconds); None below 3 points or with no
    spread in time."""
    pts = [(t, math.log(v)) for t, v in zip(t_s, values, strict=True) if v > 0]
    if len(pts) < 3 or max(t for t, _ in pts) == min(t for t, _ in pts):
        return None
    span = max(t for t, _ in pts) - min(t for t, _ in pts)
    if max(y for _, y in pts) == min(y for _, y in pts):  # a constant: no trend, exactly
        return Trend(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, len(pts), span, 1.0)
    fit = stats.linregress([t for t, _ in pts], [y for _, y in pts])
    half = t_value(confidence, len(pts) - 2) * fit.stderr
    return Trend(math.expm1(fit.slope * 3600), math.expm1((fit.slope - half) * 3600),
                 math.expm1((fit.slope + half) * 3600), math.expm1(fit.slope * span),
                 math.expm1((fit.slope - half) * span), math.expm1((fit.slope + half) * span),
                 len(pts), span, float(fit.pvalue))
