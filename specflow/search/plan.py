"""What a sweep can measure (`Shape`), the engine starts of a round placed in run order, and
what the records say was spent."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from specflow.decision.aggregate import usable_starts
from specflow.decision.bands import bands_for
from specflow.decision.race import BandState
from specflow.records.measurement import Measurement, WindowKey
from specflow.search import predict
from specflow.search.budget import PlannedStart, Spent
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import BudgetSpec, PromoteSpec
from specflow.stats.replicates import Stage, start_noise

Design = Literal["grid", "race"]


Search = Literal["exhaustive", "adaptive"]


BandKey = tuple[str, str]
"""(traffic class, band label)."""


@dataclass(frozen=True)
class Shape:
    """What a sweep can measure and how (from the compiled plan and the spec)."""

    design: Design
    baseline: str
    """The baseline's engine hash."""
    candidates: tuple[str, ...]
    """Speculative engine hashes in plan order."""
    workloads: Mapping[str, str]
    """Workload -> traffic class."""
    concurrency: tuple[int, ...]
    repeats: int
    closing_repeats: int
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    baseline_every: int = 4
    """Candidate starts between two baseline starts."""
    start_s: float = 60.0
    """Assumed engine start cost before one is measured (seconds)."""
    window_s: float = 30.0
    """Assumed window cost before one is measured (seconds)."""
    engines: Mapping[str, EngineConfig] = field(default_factory=dict)
    """The plan's engine configs by key (an emitted schedule is derived from them and measured;
    empty: schedules are not measured)."""
    search: Search = "exhaustive"
    """`adaptive` (racing only): the first round measures each chain drafter at its largest N
    only; the others are predicted from it (`predict`) and measured only if they can win."""
    chains: Mapping[str, predict.Chain] = field(default_factory=dict)
    """Candidates an adaptive search predicts from a probe (`predict.chains`)."""
    kv_capacity: Mapping[str, int] = field(default_factory=dict)
    """Engine hash -> requests its KV cache holds at the workloads' context length (headroom);
    a candidate is predicted as capped above it (`predict.kv_capped`)."""

    @property
    def points(self) -> tuple[tuple[str, int], ...]:
        return tuple((w, c) for w in self.workloads for c in self.concurrency)

    @property
    def check_points(self) -> tuple[tuple[str, int], ...]:
        """Where an adaptive search's probe round measures a series' chain check: every
        workload (acceptance is read per traffic class) at the highest concurrency level, where
        the step cost departs furthest from the predictor's line in N (the batch's tokens reach
        the compute knee there first). Elsewhere the check's config is predicted as any held-back
        member is."""
        top = max(self.concurrency)
        return tuple((w, top) for w in self.workloads)


@dataclass(frozen=True)
class EngineStart(PlannedStart):
    """One engine start of a round, placed in the run order."""

    round: int
    seq: int
    start: int

    def window_keys(self) -> list[WindowKey]:
        """Its windows: repeats outermost, so drift spreads over every point."""
        return [WindowKey(self.engine_hash, w, c, r, self.start)
                for r in range(self.repeats) for w, c in self.points]


@dataclass(frozen=True)
class Round:
    index: int
    stage: Stage
    starts: tuple[EngineStart, ...]
    states: tuple[BandState, ...] = ()
    """Band states after the round (empty while it is unfinished)."""
    spent: Spent = field(default_factory=Spent)
    """Spent by the end of the round (cumulative)."""


def spent_by(ms: Sequence[Measurement]) -> Spent:
    """Engine starts, windows and engine-seconds the records account for (headroom refusals
    started nothing)."""
    per_start: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.failure != "refused_by_headroom":
            per_start[(m.key.engine_hash, m.key.start)].append(m)
    seconds = sum(max(m.engine_s for m in w) for w in per_start.values())
    return Spent(seconds, sum(len(w) for w in per_start.values()), len(per_start))


def observed_costs(ms: Sequence[Measurement], shape: Shape) -> tuple[float, float]:
    """Observed seconds per engine start (overhead) and per planned window (a capacity search:
    all its steps' windows), or the shape's defaults."""
    planned: dict[str, float] = defaultdict(float)
    for m in ms:
        if m.ok and m.duration_s > 0:
            planned[m.key.planned.id] += m.duration_s
    window_s = sum(planned.values()) / len(planned) if planned else shape.window_s
    per_start: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.engine_s > 0:
            per_start[(m.key.engine_hash, m.key.start)].append(m)
    overheads = [max(m.engine_s for m in w) - sum(m.duration_s for m in w)
                 for w in per_start.values()]
    start_s = max(0.0, sum(overheads) / len(overheads)) if overheads else shape.start_s
    return start_s, window_s


def band_keys(shape: Shape, promote: PromoteSpec) -> dict[BandKey, tuple[tuple[str, int], ...]]:
    """Every (class, band) with its points."""
    bands, _, _ = bands_for(promote, shape.concurrency)
    out = {}
    for cls in sorted(set(shape.workloads.values())):
        ws = [w for w, c in shape.workloads.items() if c == cls]
        for b in bands:
            out[(cls, b.label)] = tuple((w, c) for w in ws for c in shape.concurrency if c in b)
    return out


def place_starts(plan: Sequence[tuple[str, Stage, tuple[tuple[str, int], ...], int]],
           index: int, seq: int, started: Counter[str]) -> tuple[EngineStart, ...]:
    out = []
    for h, stage, points, repeats in plan:
        out.append(EngineStart(h, stage, points, repeats, index, seq, started[h]))
        started[h] += 1
        seq += 1
    return tuple(out)


def split_baseline(data: Sequence[Measurement], baseline: str
                   ) -> tuple[list[Measurement], list[Measurement]]:
    """Every window but the baseline's later engine starts, and those (what `analyze` takes as
    measurements and closing_baseline)."""
    later = [m for m in data if m.key.engine_hash == baseline and m.key.start > 0]
    opening = [m for m in data if not (m.key.engine_hash == baseline and m.key.start > 0)]
    return opening, later


def race_rules(promote: PromoteSpec, budget: BudgetSpec | None = None) -> PromoteSpec:
    """The rules the race decides under, with the display-only throughput bootstrap at its
    minimum: the race reads speedups and gates, never the throughput intervals. With `budget`:
    one look's share of the futility error (`look_futility`)."""
    update: dict[str, float] = {"bootstrap_samples": 100}
    if budget is not None:
        update["futility"] = look_futility(promote, budget)
    return promote.model_copy(update=update)


def look_futility(promote: PromoteSpec, budget: BudgetSpec) -> float:
    """The futility error one look of a race may spend: half of `promote.futility` is shared
    evenly by its exploration rounds and confirmation looks, the other half is the final
    decision's (`final_rules`). A candidate truly gaining 2 x margin is then ruled out at some
    look with probability at most `promote.futility` (Bonferroni over the looks: valid however
    the looks depend on each other, and however the race chose what to measure)."""
    return promote.futility / 2 / (budget.max_rounds + budget.confirm_looks)


def early_looks(budget: BudgetSpec) -> int:
    """Exploration looks that may confirm a winner early: every round but the first (a
    candidate has one engine start there, and one start's effect must not decide)."""
    return budget.max_rounds - 1 if budget.early_share > 0 else 0


def early_alpha(promote: PromoteSpec, budget: BudgetSpec) -> float:
    """The one-sided error one exploration look may spend on confirming a winner on its
    exploration starts (Holm over the bands; each p-value multiplied by its band's candidates
    for the selection among them): `early_share` of it, evenly over `early_looks`."""
    looks = early_looks(budget)
    return (1 - promote.confidence) / 2 * budget.early_share / looks if looks else 0.0


def confirm_alpha(promote: PromoteSpec, budget: BudgetSpec) -> float:
    """The one-sided error one confirmation look spends (Holm over the bands it confirms): what
    the exploration looks leave, evenly over `confirm_looks`. With `early_alpha`'s looks the
    chance of confirming a winner that does not beat 1 + margin stays within the error rate
    (Bonferroni over every look)."""
    early = budget.early_share if early_looks(budget) else 0.0
    return (1 - promote.confidence) / 2 * (1 - early) / budget.confirm_looks


def final_rules(promote: PromoteSpec) -> PromoteSpec:
    """A race's final decision: the rules with the final look's half of the futility error."""
    return promote.model_copy(update={"futility": promote.futility / 2})


def windows_per_start(shape: Shape, data: Sequence[Measurement],
                      promote: PromoteSpec | None = None) -> int:
    """Windows per engine start for the next round: the cost-optimal number for the noise
    measured so far (median over points), between `repeats` and `budget.max_repeats`."""
    cap = shape.budget.max_repeats or 4 * shape.repeats
    per_point = usable_starts(data, promote)
    start_s, window_s = observed_costs(data, shape)
    best = [start_noise(bs, shape.baseline).windows_per_start(start_s, window_s)
            for bs in per_point.values()]
    if not best:
        return shape.repeats
    m = float(np.median(best))
    return int(min(cap, max(shape.repeats, round(m) if math.isfinite(m) else cap)))
