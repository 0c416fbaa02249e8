"""Multiplicity: Holm's step-down procedure over a family of one-sided tests."""

from __future__ import annotations

from collections.abc import Sequence


def holm(pvalues: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections (strong control of the family-wise error at `alpha`)."""
    # Written out: scipy has no Holm (false_discovery_control is Benjamini-Hochberg/-Yekutieli).
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    reject = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        reject[i] = True
    return reject
