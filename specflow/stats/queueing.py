"""Overload: whether a window's requests arrived faster than the server finished them.

An open-loop window offers requests at a rate whatever the server does. Where the server keeps
up, the number of requests in the system (queued at the client under the concurrency cap, or
waiting and running in the engine) hovers around rate x latency (Little's law) after a ramp
of about one request's latency; where it cannot, that backlog keeps growing at the offered
rate minus the rate the server finishes at, and each request waits longer than the one
before. The window is overload when, after the ramp, the backlog grows by more than `GROWTH`
of the offered rate, the time each request spends in the system rises with its arrival
beyond the arrivals' own fluctuations (`TREND_P`), and the last third of the requests spend
over `SOJOURN` times what the first ones did: its latencies then measure how long the queue
had grown by the end of the window, which depends on the window's length, not the setting,
and are not scored. On simulated servers (`bench/decision_quality.py`, docs/benchmarks.md) it
calls a window of 32 requests at half the capacity overload under 1% of the time, at three
quarters of it 8.5%, and at twice the capacity 98.5%; a window of a dozen requests tells only
larger overloads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

GROWTH = 0.1
"""The backlog's growth, as a fraction of the offered rate, beyond which a window is overload:
the server finished under 90% of what arrived."""
TREND_P = 0.01
"""The one-sided p-value the rise of time in the system with arrival (Spearman's rank
correlation) must reach: a burst of Poisson arrivals is not a growing queue."""
SOJOURN = 1.5
"""How many times the first requests' time in the system the last third must spend."""


@dataclass(frozen=True)
class Backlog:
    """How the number of requests in the system moved over one open-loop window."""

    growth: float
    """Least-squares slope of the backlog over the arrivals after the ramp, in requests per
    second, as a fraction of the offered rate (0: steady; 1: nothing finished)."""
    p_value: float
    """One-sided p-value of the time in the system rising with arrival (every request);
    1.0 where too few."""
    sojourn_ratio: float = 1.0
    """The last third's mean time in the system over the first quarter's median."""

    @property
    def overload(self) -> bool:
        return self.growth > GROWTH and self.p_value < TREND_P and self.sojourn_ratio > SOJOURN


def backlog(arrivals: Sequence[float], finishes: Sequence[float], rate: float) -> Backlog:
    """The backlog of a window from each request's arrival (when it was due to be sent) and
    finish time, in seconds on one clock; `rate`: the offered requests per second."""
    a = np.asarray(arrivals, dtype=float)
    f = np.asarray(finishes, dtype=float)
    if a.size < 4 or rate <= 0:
        return Backlog(0.0, 1.0)
    order = np.argsort(a, kind="stable")
    a, f = a[order], f[order]
    # requests in the system when request i arrives: arrived by then (i itself included) and
    # not finished before it
    arrived = np.arange(1, a.size + 1)
    finished = np.searchsorted(np.sort(f), a, side="right")
    n = arrived - finished
    # skip the ramp: the first requests' latency (a quarter of them), at most half the window
    sojourn = f - a
    first = float(np.median(sojourn[: max(1, a.size // 4)]))
    start = min(a[0] + first, a[0] + (a[-1] - a[0]) / 2)
    keep = a >= start
    t, y, s = a[keep], n[keep], sojourn[keep]
    if t.size < 4 or np.ptp(t) == 0:
        return Backlog(0.0, 1.0)
    slope = float(np.polyfit(t, y, 1)[0])
    rho = stats.spearmanr(a, sojourn, alternative="greater")  # a time in system, not a count:
    # it has no ramp of its own where the server keeps up
    p = float(rho.pvalue) if np.isfinite(rho.pvalue) else 1.0
    last = float(np.mean(s[-max(1, s.size // 3):]))
    return Backlog(slope / rate, p, last / first if first > 0 else math.inf)


def served(arrivals: Sequence[float], slots: int, service: Sequence[float]) -> np.ndarray:
    """Finish times of requests served first come first served by `slots` servers, each
    request taking its `service` seconds: the simulated server the overload detector and the
    capacity search are measured on (bench/decision_quality.py, bench/capacity.py)."""
    free = np.zeros(slots)
    out = np.empty(len(arrivals))
    for i, (a, s) in enumerate(zip(arrivals, service, strict=True)):
        k = int(np.argmin(free))
        out[i] = max(a, free[k]) + s
        free[k] = out[i]
    return out
