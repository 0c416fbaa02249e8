"""What a sweep spends: engine-seconds, windows and engine starts, projected per round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specflow.decision.race import ContenderEstimate
from specflow.spec.schema import BudgetSpec
from specflow.stats.replicates import Stage


@dataclass(frozen=True)
class Spent:
    """What a sweep has spent so far."""

    engine_seconds: float = 0.0
    windows: int = 0
    engine_starts: int = 0

    def plus(self, other: Spent) -> Spent:
        return Spent(self.engine_seconds + other.engine_seconds, self.windows + other.windows,
                     self.engine_starts + other.engine_starts)

    def within(self, budget: BudgetSpec) -> bool:
        return ((budget.engine_seconds is None or self.engine_seconds <= budget.engine_seconds)
                and (budget.windows is None or self.windows <= budget.windows)
                and (budget.engine_starts is None or self.engine_starts <= budget.engine_starts))


@dataclass(frozen=True)
class PlannedStart:
    """One engine start of a round: what it measures (`plan.EngineStart` adds its place in the
    run order)."""

    engine_hash: str
    stage: Stage
    points: tuple[tuple[str, int], ...]
    """(workload, concurrency) measured on this start."""
    repeats: int


def dominated(estimates: Mapping[str, ContenderEstimate]) -> dict[str, str]:
    """Contenders outranked: upper bound below another's lower bound (why, by hash)."""
    if not estimates:
        return {}
    best = max(estimates, key=lambda h: estimates[h].lo)
    best_lo = estimates[best].lo
    return {h: f"outranked (upper bound {e.hi:.3f} < the best lower bound {best_lo:.3f})"
            for h, e in estimates.items() if e.hi < best_lo}


def clear_leader(estimates: Mapping[str, ContenderEstimate]) -> str | None:
    """The contender whose lower bound is above every other's upper bound, if any."""
    if not estimates:
        return None
    best = max(estimates, key=lambda h: estimates[h].lo)
    if all(estimates[best].lo > e.hi for h, e in estimates.items() if h != best):
        return best
    return None


def round_cost(starts: Sequence[PlannedStart], start_s: float, window_s: float) -> Spent:
    """Projected cost of a round from the observed cost of a start and of a window."""
    windows = sum(len(s.points) * s.repeats for s in starts)
    return Spent(len(starts) * start_s + windows * window_s, windows, len(starts))
