"""Intervals: a seeded, chunked bootstrap of the mean and its percentile interval widened for
small samples (scipy.stats.bootstrap has no such widening), Wilson's interval for a rate and
Newcombe's for a difference of two rates."""

from __future__ import annotations

import hashlib
import math

import numpy as np

_CHUNK = 4_000_000
"""Bootstrap indices drawn per chunk (bounds memory at large `bootstrap_samples`)."""


def seeded_rng(seed: int, *key: object) -> np.random.Generator:
    """A generator seeded by the spec's seed and the point's identity (order-independent)."""
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return np.random.default_rng([seed, *np.frombuffer(digest[:16], dtype=np.uint32).tolist()])


def bootstrap_means(x: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `samples` resamples (with replacement) of x, vectorised in bounded chunks."""
    n = x.size
    out = np.empty(samples)
    step = max(1, _CHUNK // n)
    for start in range(0, samples, step):
        stop = min(samples, start + step)
        out[start:stop] = x[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return out


def widened_percentile(theta: float, boot: np.ndarray, confidence: float, k: float
                       ) -> tuple[float, float]:
    """Percentile interval of `boot`, widened about theta by k (never narrower than it)."""
    # Written out: scipy.stats.bootstrap's intervals (percentile, basic, BCa) have no widening.
    alpha = 1.0 - confidence
    q_lo, q_hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return min(q_lo, theta - k * (theta - q_lo)), max(q_hi, theta + k * (q_hi - theta))


def wilson_interval(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of the binomial proportion p = successes / n at normal quantile z
    (E. B. Wilson, JASA 22:209-212, 1927): centre (p + z^2/2n) / (1 + z^2/n), half-width
    z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2). Unlike the Wald interval it keeps its coverage
    at 0 or n successes, the usual counts of output mismatches. With n = 0 nothing is known:
    (0, 1)."""
    # Written out: scipy's binomtest(...).proportion_ci("wilson") takes no z and refuses n = 0.
    if n == 0:
        return 0.0, 1.0
    p, k = successes / n, z * z / n
    centre = (p + k / 2) / (1 + k)
    half = z / (1 + k) * math.sqrt(p * (1 - p) / n + k / (4 * n))
    # At 0 or n the bound is exact in theory; pin it so rounding cannot fake a mismatch.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def newcombe_interval(x1: int, n1: int, x2: int, n2: int, z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of the difference of proportions x1/n1 - x2/n2
    (R. G. Newcombe, Statistics in Medicine 17:873-890, 1998, method 10): with (l_i, u_i) the
    Wilson interval of p_i, d = p1 - p2, it is [d - sqrt((p1 - l1)^2 + (u2 - p2)^2),
    d + sqrt((u1 - p1)^2 + (p2 - l2)^2)]. Near-nominal coverage at small counts and rates near
    0, where the Wald difference interval collapses to a point."""
    # Written out: scipy has no interval for a difference of two proportions.
    p1 = x1 / n1 if n1 else 0.0
    p2 = x2 / n2 if n2 else 0.0
    l1, u1 = wilson_interval(x1, n1, z)
    l2, u2 = wilson_interval(x2, n2, z)
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)
