"""Critical values of the normal and t distributions, one helper each (cached: pure functions
of their arguments, asked for the same few values many times per analysis)."""

from __future__ import annotations

import functools

from scipy import stats


@functools.cache
def z_value(confidence: float) -> float:
    """Two-sided normal critical value: z with P(|Z| <= z) = confidence."""
    return float(stats.norm.ppf(0.5 + confidence / 2))


@functools.cache
def t_value(confidence: float, df: float) -> float:
    """Two-sided t critical value at `df` degrees of freedom."""
    return float(stats.t.ppf(0.5 + confidence / 2, df))


@functools.cache
def z_upper(alpha: float) -> float:
    """One-sided normal critical value: z with P(Z > z) = alpha."""
    return float(stats.norm.isf(alpha))
