"""Capacity under the SLO: the highest request rate one replica takes while the class's SLOs hold.

Found per engine start by a bracketing search over offered rates (open loop), every window it
measured reused: from a starting rate, the rate doubles while the SLOs hold (or halves while
they do not) until a rate that holds and one that does not bracket the capacity; the bracket
is then halved geometrically until it is narrower than `resolution`. A rate holds when its
window completed every request, did not overload (`specflow.stats.queueing`) and met every p99
bound set in `promote.slo`. The start's capacity is the bracket's geometric midpoint: a p99 from
one window is noisy, so where the search crosses moves from start to start, and the engine
starts are the replicates the estimate's interval is taken over (the geometric mean, a t
interval on logs), as for every other estimate here. A candidate's capacity over the baseline's
is a Welch interval on logs; the replicas a stated load needs are counted at the capacity's
lower bound.

Used by `bench/capacity.py` (the search on the real CPU engine, and its error and coverage on
simulated servers of known capacity). Not yet an objective a sweep decides on
(docs/deciding.md: planned).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from specflow.records.measurement import Measurement
from specflow.spec.schema import SloSpec

GROWTH = 2.0
"""The factor the rate moves by until the capacity is bracketed."""


@dataclass(frozen=True)
class Probe:
    """One window of the search: the rate offered and whether the SLOs held there."""

    rate: float
    holds: bool


@dataclass(frozen=True)
class StartCapacity:
    """What one engine start's search found."""

    low: float | None
    """The highest rate that held below every rate that did not (None: none held)."""
    high: float | None
    """The lowest rate that did not hold (None: every rate held, up to the ceiling)."""

    @property
    def estimate(self) -> float:
        """The bracket's geometric midpoint; a censored search its one end."""
        if self.low is not None and self.high is not None:
            return math.sqrt(self.low * self.high)
        return self.low if self.low is not None else float(self.high or 0.0)

    @property
    def censored(self) -> str:
        """"above" (held at the ceiling), "below" (failed at the floor) or ""."""
        return "above" if self.high is None else "below" if self.low is None else ""


@dataclass(frozen=True)
class CapacityEstimate:
    """A capacity over engine starts: geometric mean and its interval (None below 2 starts)."""

    value: float
    lo: float | None
    hi: float | None
    starts: int
    censored: int
    """Starts whose search ended at the floor or the ceiling (their estimate is a bound)."""


def holds(m: Measurement, slo: SloSpec) -> bool:
    """A window keeps the SLOs: every request completed, no overload, each p99 bound set met."""
    if not m.ok or m.failed or m.overload:
        return False
    for key, bound in slo.model_dump().items():
        if bound is not None and not m.latency_ms.get(key, math.inf) <= bound:
            return False
    return True


def bracket(probes: Sequence[Probe]) -> StartCapacity:
    """The lowest rate that failed, and the highest that held below it."""
    failed = [p.rate for p in probes if not p.holds]
    high = min(failed) if failed else None
    held = [p.rate for p in probes if p.holds and (high is None or p.rate < high)]
    return StartCapacity(max(held) if held else None, high)


def next_rate(probes: Sequence[Probe], start: float, *, floor: float, ceiling: float,
              resolution: float = 0.1, max_probes: int = 12) -> float | None:
    """The rate the search offers next, or None when it is done: `start` first; then doubling
    while every rate held (up to `ceiling`) or halving while none did (down to `floor`); then
    the geometric midpoint of the bracket until high / low <= 1 + `resolution`."""
    if not probes:
        return start
    if len(probes) >= max_probes:
        return None
    b = bracket(probes)
    if b.high is None:
        top = max(p.rate for p in probes)
        return None if top >= ceiling else min(top * GROWTH, ceiling)
    if b.low is None:
        bottom = min(p.rate for p in probes)
        return None if bottom <= floor else max(bottom / GROWTH, floor)
    if b.high / b.low <= 1 + resolution:
        return None
    return math.sqrt(b.low * b.high)


def estimate(capacities: Sequence[StartCapacity], confidence: float = 0.95
             ) -> CapacityEstimate:
    """The geometric mean of the starts' capacities, with a t interval over starts."""
    x = np.log([c.estimate for c in capacities if c.estimate > 0])
    censored = sum(bool(c.censored) for c in capacities)
    if x.size == 0:
        return CapacityEstimate(0.0, None, None, 0, censored)
    value = float(np.exp(x.mean()))
    if x.size < 2:
        return CapacityEstimate(value, None, None, 1, censored)
    half = stats.t.ppf((1 + confidence) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return CapacityEstimate(value, float(np.exp(x.mean() - half)),
                            float(np.exp(x.mean() + half)), int(x.size), censored)


def ratio(candidate: Sequence[StartCapacity], baseline: Sequence[StartCapacity],
          confidence: float = 0.95) -> tuple[float, float, float] | None:
    """A candidate's capacity over the baseline's with its Welch interval on logs (None below
    two starts a side)."""
    a = np.log([c.estimate for c in candidate if c.estimate > 0])
    b = np.log([c.estimate for c in baseline if c.estimate > 0])
    if a.size < 2 or b.size < 2:
        return None
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    d = float(a.mean() - b.mean())
    se = math.sqrt(va + vb)
    if se == 0:
        return math.exp(d), math.exp(d), math.exp(d)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, df)) * se
    return math.exp(d), math.exp(d - half), math.exp(d + half)


def replicas(load: float, capacity: CapacityEstimate) -> int | None:
    """Replicas a load (requests per second) needs, at the capacity's lower bound (None
    without an interval)."""
    if capacity.lo is None or capacity.lo <= 0:
        return None
    return max(1, math.ceil(load / capacity.lo))
