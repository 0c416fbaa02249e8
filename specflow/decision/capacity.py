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

In a sweep (`promote.objective: capacity`) each planned window of a capacity class's workload
starts one search on its engine start: the runner measures the rate `next_step` names after
each window, on the same engine, until the search ends (step k is numbered repeat + k x
`STEP`). The decision reads every search as one record (`searches`): its capacity as the
score, so the speedup of a candidate is its capacity over the baseline's, under the decision
rule every objective shares (replicates, intervals, margin, futility, error control, racing).
`bench/capacity.py` measures the search on the real CPU engine, and its error and coverage on
simulated servers of known capacity.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from specflow.records.measurement import Measurement
from specflow.spec.schema import PromoteSpec, SloSpec

GROWTH = 2.0
"""The factor the rate moves by until the capacity is bracketed."""


@dataclass(frozen=True)
class Step:
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


def bracket(steps: Sequence[Step]) -> StartCapacity:
    """The lowest rate that failed, and the highest that held below it."""
    failed = [p.rate for p in steps if not p.holds]
    high = min(failed) if failed else None
    held = [p.rate for p in steps if p.holds and (high is None or p.rate < high)]
    return StartCapacity(max(held) if held else None, high)


def next_rate(steps: Sequence[Step], start: float, *, floor: float, ceiling: float,
              resolution: float = 0.1, max_steps: int = 12) -> float | None:
    """The rate the search offers next, or None when it is done: `start` first; then doubling
    while every rate held (up to `ceiling`) or halving while none did (down to `floor`); then
    the geometric midpoint of the bracket until high / low <= 1 + `resolution`."""
    if not steps:
        return start
    if len(steps) >= max_steps:
        return None
    b = bracket(steps)
    if b.high is None:
        top = max(p.rate for p in steps)
        return None if top >= ceiling else min(top * GROWTH, ceiling)
    if b.low is None:
        bottom = min(p.rate for p in steps)
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


def replicas(load: float, lower_bound: float | None) -> int | None:
    """Replicas a load (requests per second) needs, at a capacity's lower bound (None without
    an interval)."""
    if lower_bound is None or lower_bound <= 0:
        return None
    return max(1, math.ceil(load / lower_bound))


def dithered(rate: float, key: str) -> float:
    """Where a search starts: `rate` moved by a factor between 1/sqrt(2) and sqrt(2) drawn from
    the search's key (reproducible, so a resumed search starts where it did). Without it every
    search of every engine offers the same rates, and searches that end on the same bracket
    report the same capacity: an interval of zero width however coarse the bracket. Dithered,
    where the bracket falls around the capacity varies from search to search, and the interval
    over searches carries the bracket's width (its quantisation) with the rest of the noise."""
    u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return rate * 2 ** (u - 0.5)


LOAD_FAILURES = frozenset({"requests_failed", "timeout"})
"""A step's failures that are the offered load's doing (requests refused or timed out under
it): the rate does not hold. Any other failure (the engine down, a bench error) ends the search
without an answer."""


def _step(m: Measurement, slo: SloSpec) -> Step | None:
    """What a window tells its search (None: a failure that is not the load's)."""
    if m.request_rate is None or (not m.ok and m.failure not in LOAD_FAILURES):
        return None
    return Step(m.request_rate, holds(m, slo))


def next_step(steps: Sequence[Measurement], promote: PromoteSpec) -> float | None:
    """The rate a search offers next after its windows so far (in step order), or None: the
    search is over (bracketed to the resolution, at the floor or ceiling, out of steps, or
    ended by a failure that is not the load's)."""
    seen = [p for m in steps if (p := _step(m, promote.capacity_slo)) is not None]
    if not seen or len(seen) < len(steps):
        return None
    c = promote.capacity
    return next_rate(seen, seen[0].rate, floor=c.floor, ceiling=c.ceiling,
                     resolution=c.resolution, max_steps=c.max_steps)


def searches(measurements: Iterable[Measurement], promote: PromoteSpec | None
             ) -> list[Measurement]:
    """The windows with each capacity search's steps replaced by one record of the search
    (`search_record`, under `promote`'s SLOs and search; None: the defaults); every other
    window as it is, and a search's record left as it is (a second pass changes nothing)."""
    promote = promote or PromoteSpec()
    out: list[Measurement] = []
    groups: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.search_rates or not m.searched:
            out.append(m)
        else:
            groups[(m.key.planned.id, m.stage)].append(m)
    out += [search_record(sorted(ms, key=lambda m: m.key.step), promote)
            for ms in groups.values()]
    return out


def decided(measurements: Iterable[Measurement], promote: PromoteSpec | None
            ) -> list[Measurement]:
    """The windows that answer their class's objective (`Measurement.answers`; `promote`
    None: throughput), each capacity search as one record (`searches`): what a class is
    decided on. The others are answered beside it (`decision.beside`)."""
    return searches((m for m in measurements if m.answers == (
        promote.objective_for(m.traffic_class) if promote is not None else "throughput")),
        promote)


def search_record(steps: Sequence[Measurement], promote: PromoteSpec) -> Measurement:
    """One search as one record, keyed as its planned window: `request_rate` is the capacity it
    found (the bracket's geometric midpoint; the ceiling where every rate held), `steps` the
    rates offered; its latency, throughput, acceptance and outputs are those of the highest rate
    that held. Failed where no rate held down to the floor (`no_capacity`), where a failure that
    is not the load's ended it (that failure), or where it is unfinished (`search_incomplete`:
    the sweep stopped mid-search; the next run goes on with it)."""
    first = steps[0]
    key = first.key.planned
    rates = tuple(m.request_rate or 0.0 for m in steps)
    seen = [_step(m, promote.capacity_slo) for m in steps]
    broken = next((m for m, p in zip(steps, seen, strict=True) if p is None), None)
    if broken is not None:
        return replace(broken, key=key, search_rates=rates, overload=False, failure_detail=(
            f"capacity search stopped at step {broken.key.step} "
            f"({broken.request_rate or 0:g} req/s): {broken.failure_detail}"))
    b = bracket([p for p in seen if p is not None])
    if next_step(steps, promote) is not None:
        return replace(first, key=key, search_rates=rates, status="failed",
                       failure="search_incomplete", overload=False, failure_detail=(
                           f"capacity search unfinished after {len(steps)} steps "
                           f"({', '.join(f'{r:g}' for r in rates)} req/s)"))
    if b.low is None:
        return replace(first, key=key, search_rates=rates, status="failed", failure="no_capacity",
                       overload=False, failure_detail=(
                           f"no offered rate kept the SLOs, down to {min(rates):g} req/s"))
    held = max((m for m, p in zip(steps, seen, strict=True) if p is not None and p.holds
                and p.rate == b.low), key=lambda m: m.key.step)
    return replace(held, key=key, search_rates=rates, request_rate=b.estimate,
                   backlog_growth=None, overload=False)
