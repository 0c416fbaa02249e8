"""Sample size: the engine starts a comparison needs to detect a gap at a given power."""

from __future__ import annotations


def starts_for_power(var: float, gap: float, z_alpha: float, z_power: float) -> float:
    """Engine starts per side for a one-sided test at level alpha to detect `gap` (on the log
    scale) with the power whose normal quantile is `z_power`, when one start's contribution to
    the contrast's variance is `var`: var * ((z_alpha + z_power) / gap)^2 (normal approximation;
    callers round up and apply their floor)."""
    return var * ((z_alpha + z_power) / gap) ** 2
