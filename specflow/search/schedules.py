"""Emitted N schedules measured deployed: one engine per traffic class, measured against the
baseline at the concurrency levels on both sides of each threshold."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from specflow.decision.aggregate import usable_starts
from specflow.decision.choose import analyze
from specflow.decision.model import Analysis
from specflow.decision.race import BandState
from specflow.records.measurement import Measurement
from specflow.search.plan import BandKey, Shape, race_rules, split_baseline, windows_per_start
from specflow.spec.compile import EngineConfig, with_schedule
from specflow.spec.schema import PromoteSpec
from specflow.stats.replicates import contrast, start_noise


@dataclass(frozen=True)
class SchedulePoint:
    workload: str
    concurrency: int
    n: int
    """The schedule's N at this batch size."""
    speedup: float
    lo: float
    hi: float
    starts: int


@dataclass(frozen=True)
class ScheduleCheck:
    """An emitted schedule deployed as one engine, measured against the baseline at the
    concurrency levels on both sides of each threshold (vLLM issue 49548: throughput can
    collapse right at a threshold)."""

    traffic_class: str
    engine_hash: str
    schedule: tuple[tuple[int, int, int], ...]
    levels: tuple[int, ...]
    points: tuple[SchedulePoint, ...] = ()
    passed: bool = False
    why: str = ""


def schedule_levels(schedule: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Batch sizes on both sides of every threshold: the last of each range and the first of
    the next."""
    out: set[int] = set()
    for (_, end, _), (start, _, _) in zip(schedule, schedule[1:], strict=False):
        out.update({end, start})
    return tuple(sorted(c for c in out if c >= 1))


def _n_at(schedule: Sequence[Sequence[int]], c: int) -> int:
    return next((n for a, b, n in schedule if a <= c <= b), 0)


def pending_schedules(shape: Shape, promote: PromoteSpec,
                       states: Mapping[BandKey, BandState], data: Sequence[Measurement],
                       refused: frozenset[str]) -> dict[str, tuple[ScheduleCheck, EngineConfig]]:
    """The classes whose decided deployment is an N schedule, with the engine it deploys as."""
    opening, later = split_baseline(data, shape.baseline)
    result = analyze(opening, race_rules(promote), closing_baseline=later,
                              refused_by_headroom=refused, race=dict(states))
    out = {}
    for r in result.classes:
        dep = r.deployment
        top = shape.engines.get(dep.engine_hash)
        if dep.schedule is None or top is None:
            continue
        ec = with_schedule(top, dep.schedule)
        out[r.traffic_class] = (ScheduleCheck(r.traffic_class, ec.hash, dep.schedule,
                                              schedule_levels(dep.schedule)), ec)
    return out


def schedule_round(shape: Shape, pending: Iterable[tuple[ScheduleCheck, EngineConfig]],
                    data: Sequence[Measurement]) -> list:
    """Each schedule engine started `confirm_starts` times (at least twice) at the levels around
    its thresholds, with baseline starts at the same points around every start."""
    pending = list(pending)
    if not pending:
        return []
    points = {c.engine_hash: tuple((w, lvl) for w, cls in shape.workloads.items()
                                   if cls == c.traffic_class for lvl in c.levels)
              for c, _ in pending}
    every = tuple(sorted({p for ps in points.values() for p in ps}))
    repeats = windows_per_start(shape, data)
    base = (shape.baseline, "schedule", every, repeats)
    plan = [base]
    for _ in range(max(2, shape.budget.confirm_starts)):
        plan += [*((c.engine_hash, "schedule", points[c.engine_hash], repeats)
                   for c, _ in pending), base]
    return plan


def check_emitted_schedules(shape: Shape, promote: PromoteSpec,
                     pending: Mapping[str, tuple[ScheduleCheck, EngineConfig]],
                     data: Sequence[Measurement]) -> dict[str, ScheduleCheck]:
    """A schedule fails where it falls short beyond noise: its upper bound below 1 + margin at
    a level where it speculates (what its bands were promoted on), below 1 - margin where its N
    is 0 (the drafter is loaded but idle there)."""
    per_point = usable_starts(m for m in data if m.stage == "schedule")
    out = {}
    for cls, (check, _) in pending.items():
        pts, losses = [], []
        for (w, c), bs in sorted(per_point.items()):
            if shape.workloads.get(w) != cls or c not in check.levels:
                continue
            noise = start_noise(bs, shape.baseline)
            con = contrast([b for b in bs if b.engine_hash == check.engine_hash],
                                  [b for b in bs if b.engine_hash == shape.baseline], noise)
            if con is None:
                continue
            lo, hi = con.interval(promote.confidence)
            n = _n_at(check.schedule, c)
            pts.append(SchedulePoint(w, c, n, con.speedup, lo, hi, con.n_starts))
            floor = 1.0 + promote.margin if n > 0 else 1.0 - promote.margin
            if hi < floor:
                losses.append(f"{w} c={c} (N={n}): speedup {con.speedup:.3f} "
                              f"[{lo:.3f}, {hi:.3f}] < {floor:.2f}")
        want = {(w, c) for w, k in shape.workloads.items() if k == cls for c in check.levels}
        missing = sorted(want - {(p.workload, p.concurrency) for p in pts})
        if missing:
            why = ("the schedule was not measured at " + ", ".join(f"{w} c={c}"
                                                                  for w, c in missing)
                   + " (its engine failed or vLLM refused it)")
        elif losses:
            why = "the schedule falls short around a threshold: " + "; ".join(losses)
        else:
            why = "measured around every threshold: " + "; ".join(
                f"{p.workload} c={p.concurrency} (N={p.n}) {p.speedup:.3f} "
                f"[{p.lo:.3f}, {p.hi:.3f}]" for p in pts)
        out[cls] = replace(check, points=tuple(pts), passed=not missing and not losses, why=why)
    return out


def measured_schedules(result: Analysis, checks: Mapping[str, ScheduleCheck]
                       ) -> tuple[Analysis, list[str]]:
    """Drop the classes whose emitted schedule was not measured as one engine, or lost to the
    baseline around a threshold when it was (a racing sweep measures every emitted schedule)."""
    kept, problems = [], []
    for r in result.classes:
        check = checks.get(r.traffic_class)
        if r.deployment.schedule is None or (check is not None and check.passed):
            kept.append(r)
        else:
            why = check.why if check is not None else ("it was not measured as one engine "
                                                       "(the budget ran out before it)")
            problems.append(f"{r.traffic_class}: the emitted schedule "
                            f"{[list(x) for x in r.deployment.schedule]} is not promoted: {why}")
    return dataclasses.replace(result, classes=tuple(kept)), problems
