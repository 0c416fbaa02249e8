"""The sweep's rounds, replayed from its records: what has been measured, what each round
decided, and which engine starts come next.

Everything here is a function of the records (`Measurement.round`, `.seq`, `.key.block`,
`.stage`, `.engine_s`): a resumed or retried sweep replays the finished rounds to the same
states, finds the round with windows still missing and runs only those. Nothing else is stored.

A grid sweep is one round: the baseline, every candidate, the closing baseline. A racing sweep
(see `racing`) explores in rounds until every band has a selected winner, nothing left, or no
budget, then confirms the selected winners on fresh engine starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from scipy import stats

from specflow.core import analysis, predict, racing
from specflow.core.compile import EngineConfig, with_schedule
from specflow.core.records import Measurement, PointKey
from specflow.core.schema import PromoteSpec

Design = Literal["grid", "race"]
Search = Literal["grid", "adaptive"]
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
    budget: racing.Budget = field(default_factory=racing.Budget)
    baseline_every: int = 4
    """Candidate starts between two baseline starts."""
    start_s: float = 60.0
    """Assumed engine start cost before one is measured (seconds)."""
    window_s: float = 30.0
    """Assumed window cost before one is measured (seconds)."""
    engines: Mapping[str, EngineConfig] = field(default_factory=dict)
    """The plan's engine configs by key (an emitted schedule is derived from them and measured;
    empty: schedules are not measured)."""
    search: Search = "grid"
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


@dataclass(frozen=True)
class Start:
    """One engine start of a round, placed in the run order."""

    engine_hash: str
    stage: racing.Stage
    points: tuple[tuple[str, int], ...]
    repeats: int
    round: int
    seq: int
    block: int

    def window_keys(self) -> list[PointKey]:
        """Its windows: repeats outermost, so drift spreads over every point."""
        return [PointKey(self.engine_hash, w, c, r, self.block)
                for r in range(self.repeats) for w, c in self.points]


@dataclass(frozen=True)
class Round:
    index: int
    stage: racing.Stage
    starts: tuple[Start, ...]
    states: tuple[racing.BandState, ...] = ()
    """Band states after the round (empty while it is unfinished)."""
    spent: racing.Spent = field(default_factory=racing.Spent)
    """Spent by the end of the round (cumulative)."""


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


@dataclass(frozen=True)
class Progress:
    """The sweep's rounds so far and the one to run now."""

    rounds: tuple[Round, ...]
    """Finished rounds."""
    current: Round | None
    """The round with windows still missing; None when the sweep is done."""
    states: Mapping[BandKey, racing.BandState]
    """The latest band states (final when `current` is None)."""
    spent: racing.Spent
    problems: tuple[str, ...] = ()
    """Why the race cannot go on (the data cannot be analysed)."""
    schedules: Mapping[str, ScheduleCheck] = field(default_factory=dict)
    """Per traffic class: its emitted N schedule measured as one engine (racing sweeps)."""
    derived: Mapping[str, EngineConfig] = field(default_factory=dict)
    """Engine configs the race made (schedules), by hash."""


def spent(ms: Sequence[Measurement]) -> racing.Spent:
    """Engine starts, windows and engine-seconds the records account for (headroom refusals
    started nothing)."""
    per_start: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.failure != "refused_by_headroom":
            per_start[(m.key.engine_hash, m.key.block)].append(m)
    seconds = sum(max(m.engine_s for m in w) for w in per_start.values())
    return racing.Spent(seconds, sum(len(w) for w in per_start.values()), len(per_start))


def _costs(ms: Sequence[Measurement], shape: Shape) -> tuple[float, float]:
    """Observed seconds per engine start (overhead) and per window, or the shape's defaults."""
    durations = [m.duration_s for m in ms if m.ok and m.duration_s > 0]
    window_s = sum(durations) / len(durations) if durations else shape.window_s
    per_start: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.engine_s > 0:
            per_start[(m.key.engine_hash, m.key.block)].append(m)
    overheads = [max(m.engine_s for m in w) - sum(m.duration_s for m in w)
                 for w in per_start.values()]
    start_s = max(0.0, sum(overheads) / len(overheads)) if overheads else shape.start_s
    return start_s, window_s


def _band_keys(shape: Shape, promote: PromoteSpec) -> dict[BandKey, tuple[tuple[str, int], ...]]:
    """Every (class, band) with its points."""
    bands, _, _ = analysis.bands_for(promote, shape.concurrency)
    out = {}
    for cls in sorted(set(shape.workloads.values())):
        ws = [w for w, c in shape.workloads.items() if c == cls]
        for b in bands:
            out[(cls, b.label)] = tuple((w, c) for w in ws for c in shape.concurrency if c in b)
    return out


def _place(plan: Sequence[tuple[str, racing.Stage, tuple[tuple[str, int], ...], int]],
           index: int, seq: int, blocks: Counter[str]) -> tuple[Start, ...]:
    out = []
    for h, stage, points, repeats in plan:
        out.append(Start(h, stage, points, repeats, index, seq, blocks[h]))
        blocks[h] += 1
        seq += 1
    return tuple(out)


def replay(shape: Shape, promote: PromoteSpec, measurements: Sequence[Measurement],
           refused: frozenset[str] = frozenset()) -> Progress:
    """Replay the finished rounds from the records and find the round to run now."""
    recorded = {m.key.id for m in measurements}
    bands = _band_keys(shape, promote)
    held = _held_back(shape, refused)
    alive = tuple(h for h in shape.candidates if h not in refused and h not in held)
    states: dict[BandKey, racing.BandState] = {
        k: racing.BandState(k[0], k[1], "exploring" if alive else "off", alive,
                            tuple((h, "refused by the headroom check") for h in shape.candidates
                                  if h in refused))
        for k in bands}
    plan = _first_round(shape, alive, held)
    rounds: list[Round] = []
    blocks: Counter[str] = Counter()
    seq, index, stage = 0, 0, plan[0][1] if plan else "explore"
    total = racing.Spent()
    checks: dict[str, ScheduleCheck] = {}
    pending: dict[str, tuple[ScheduleCheck, EngineConfig]] = {}
    derived: dict[str, EngineConfig] = {}
    probe_rounds = 0  # 1 once the probe round added predicted contenders (not a racing round)
    while plan:
        starts = _place(plan, index, seq, blocks)
        seq += len(starts)
        current = Round(index, stage, starts)
        if any(k.id not in recorded for s in starts for k in s.window_keys()):
            return Progress(tuple(rounds), current, states, total, (), checks, derived)
        data = [m for m in measurements if m.round <= index]
        total = spent(data)
        if shape.design == "grid":
            rounds.append(replace(current, spent=total))
            return Progress(tuple(rounds), None, states, total)
        decided = [m for m in data if m.stage != "schedule"]
        try:
            if stage == "schedule":
                checks = _check_schedules(shape, promote, pending, data)
            elif held and index == 0:
                states, added = _after_probes(shape, promote, bands, states, decided, refused,
                                              held)
                probe_rounds = int(added)
            else:
                states = _after_round(shape, promote, bands, states, decided, refused, stage,
                                      index - probe_rounds)
            # right after the probe round, only the contenders it added are started: the probes
            # already have their start, and the race re-measures every contender only in a
            # further round (max_rounds), as it does any candidate
            stage, plan = _next_round(shape, promote, bands, states, decided, index + 1,
                                      new_only=index == 0 and probe_rounds == 1)
            if not plan and not checks and shape.engines:
                pending = _pending_schedules(shape, promote, states, decided, refused)
                stage, plan = "schedule", _schedule_round(shape, pending.values(), decided)
                derived = {c.engine_hash: e for c, e in pending.values()}
        except analysis.AnalysisError as exc:
            rounds.append(replace(current, states=tuple(states.values()), spent=total))
            return Progress(tuple(rounds), None, states, total, tuple(exc.problems),
                            checks, derived)
        if plan:
            plan, cost = _affordable(shape, stage, plan, total, _costs(data, shape))
            if cost is not None:
                states = _out_of_budget(states, total, cost)
                plan = []
        rounds.append(replace(current, states=tuple(states.values()), spent=total))
        index += 1
    return Progress(tuple(rounds), None, states, total, (), checks, derived)


def split_baseline(data: Sequence[Measurement], baseline: str
                   ) -> tuple[list[Measurement], list[Measurement]]:
    """Every window but the baseline's later engine starts, and those (what `analyze` takes as
    measurements and closing_baseline)."""
    later = [m for m in data if m.key.engine_hash == baseline and m.key.block > 0]
    opening = [m for m in data if not (m.key.engine_hash == baseline and m.key.block > 0)]
    return opening, later


def _fast(promote: PromoteSpec) -> PromoteSpec:
    """The rules the race decides under, with the display-only throughput bootstrap at its
    minimum: the race reads speedups and gates, never the throughput intervals."""
    return promote.model_copy(update={"bootstrap_samples": 100})


def _pending_schedules(shape: Shape, promote: PromoteSpec,
                       states: Mapping[BandKey, racing.BandState], data: Sequence[Measurement],
                       refused: frozenset[str]) -> dict[str, tuple[ScheduleCheck, EngineConfig]]:
    """The classes whose decided deployment is an N schedule, with the engine it deploys as."""
    opening, later = split_baseline(data, shape.baseline)
    result = analysis.analyze(opening, _fast(promote), closing_baseline=later,
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


def _schedule_round(shape: Shape, pending: Iterable[tuple[ScheduleCheck, EngineConfig]],
                    data: Sequence[Measurement]) -> list:
    """Each schedule engine started `confirm_starts` times at the levels around its thresholds,
    with baseline starts at the same points around every start."""
    pending = list(pending)
    if not pending:
        return []
    points = {c.engine_hash: tuple((w, lvl) for w, cls in shape.workloads.items()
                                   if cls == c.traffic_class for lvl in c.levels)
              for c, _ in pending}
    every = tuple(sorted({p for ps in points.values() for p in ps}))
    repeats = _windows_per_start(shape, data)
    base = (shape.baseline, "schedule", every, repeats)
    plan = [base]
    for _ in range(shape.budget.confirm_starts):
        plan += [*((c.engine_hash, "schedule", points[c.engine_hash], repeats)
                   for c, _ in pending), base]
    return plan


def _check_schedules(shape: Shape, promote: PromoteSpec,
                     pending: Mapping[str, tuple[ScheduleCheck, EngineConfig]],
                     data: Sequence[Measurement]) -> dict[str, ScheduleCheck]:
    """A schedule fails where it falls short beyond noise: its upper bound below 1 + margin at
    a level where it speculates (what its bands were promoted on), below 1 - margin where its N
    is 0 (the drafter is loaded but idle there)."""
    blocks = analysis.usable_blocks(m for m in data if m.stage == "schedule")
    out = {}
    for cls, (check, _) in pending.items():
        pts, losses = [], []
        for (w, c), bs in sorted(blocks.items()):
            if shape.workloads.get(w) != cls or c not in check.levels:
                continue
            noise = racing.block_noise(bs, shape.baseline)
            con = racing.contrast([b for b in bs if b.engine_hash == check.engine_hash],
                                  [b for b in bs if b.engine_hash == shape.baseline], noise)
            if con is None:
                continue
            lo, hi = con.interval(promote.confidence)
            n = _n_at(check.schedule, c)
            pts.append(SchedulePoint(w, c, n, con.speedup, lo, hi, con.n_blocks))
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


def _affordable(shape: Shape, stage: racing.Stage, plan: list, total: racing.Spent,
                costs: tuple[float, float]) -> tuple[list, racing.Spent | None]:
    """The plan if it fits the budget; a confirmation look shrinks to the largest that fits
    (never below `confirm_starts`). Otherwise the cost that does not fit."""

    def cost(p: list) -> racing.Spent:
        return racing.round_cost([racing.PlannedStart(h, st, pts, r) for h, st, pts, r in p],
                                 *costs)

    if total.plus(cost(plan)).within(shape.budget):
        return plan, None
    if stage == "confirm":
        base, winners = plan[0], [x for x in plan[1:] if x[0] != shape.baseline]
        per = len({x[0] for x in winners})
        first, unit = cost([base]), cost([*winners[:per], base])

        def fits(k: int) -> bool:  # a look's cost is linear in its starts per winner
            return total.plus(first).plus(racing.Spent(
                k * unit.engine_seconds, k * unit.windows, k * unit.engine_starts)).within(
                shape.budget)

        lo, hi = shape.budget.confirm_starts, len(winners) // max(1, per) - 1
        if hi >= lo and fits(lo):
            while lo < hi:  # the largest k that fits (binary search: k can be large)
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
            return confirm_plan(base, winners[:per], lo), None
    return plan, cost(plan)


def _held_back(shape: Shape, refused: frozenset[str]) -> frozenset[str]:
    """Candidates an adaptive search does not measure in its first round: those predicted from
    a probe that the headroom check let start."""
    if shape.search != "adaptive" or shape.design != "race":
        return frozenset()
    return frozenset(h for h, ch in shape.chains.items()
                     if h not in refused and ch.probe not in refused)


def _first_round(shape: Shape, alive: Sequence[str], held: frozenset[str] = frozenset()
                 ) -> list[tuple[str, racing.Stage, tuple[tuple[str, int], ...], int]]:
    """Grid: baseline, every candidate, closing baseline. Race: the same with a baseline start
    after every `baseline_every` candidates (an adaptive search holds back the candidates it
    predicts from a probe)."""
    base = (shape.baseline, "explore", shape.points, shape.repeats)
    cands = [(h, "explore", shape.points, shape.repeats) for h in shape.candidates
             if h not in held]
    if shape.design == "grid":
        closing = ([(shape.baseline, "explore", shape.points, shape.closing_repeats)]
                   if shape.closing_repeats else [])
        return [base, *cands, *closing]  # type: ignore[list-item]
    if not alive:
        return [base]  # type: ignore[list-item]
    return _with_baselines(cands, base, shape.baseline_every, opening=True)


def _with_baselines(cands: list, base: tuple, every: int, *, opening: bool) -> list:
    out = [base] if opening else []
    for i in range(0, len(cands), max(1, every)):
        out += [*cands[i:i + every], base]
    return out


def _band_estimates(result: analysis.Analysis) -> dict[BandKey, dict[str, analysis.Verdict]]:
    return {(r.traffic_class, d.band.label): {v.engine_hash: v for v in d.candidates}
            for r in result.classes for d in r.decisions}


def _interval(v: analysis.Verdict) -> racing.Interval | None:
    if not v.speedups:
        return None
    w = min(v.speedups, key=lambda s: s.speedup.lo)
    return racing.Interval(w.speedup.value, w.speedup.lo, min(s.speedup.hi for s in v.speedups),
                           f"{w.workload} c={w.concurrency}", w.starts)


def _gate_reasons(v: analysis.Verdict) -> str:
    return "; ".join(str(r) for r in v.rejected if r.gate not in ("speedup", "family", "race"))


def _drift_protected(result: analysis.Analysis, key: BandKey, verdicts: Mapping[str, object],
                     measurements: Sequence[Measurement]) -> set[str]:
    """Candidates with a start between two baseline starts that moved beyond noise."""
    r = result.result(key[0])
    steps = [(d.seq_from, d.seq_to) for d in r.drift if d.flagged
             and any(d.concurrency in dec.band for dec in r.decisions if dec.band.label == key[1])]
    return {m.key.engine_hash for m in measurements if m.key.engine_hash in verdicts
            and any(a < m.seq < b for a, b in steps)}


def _after_round(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, object],
                 states: dict[BandKey, racing.BandState], data: Sequence[Measurement],
                 refused: frozenset[str], stage: racing.Stage, index: int
                 ) -> dict[BandKey, racing.BandState]:
    """The band states after an exploration or a confirmation round."""
    opening, later = split_baseline(data, shape.baseline)
    result = analysis.analyze(opening, _fast(promote), closing_baseline=later,
                              refused_by_headroom=refused, family="none", stage=stage,
                              partial=True)
    verdicts = _band_estimates(result)
    out = dict(states)
    if stage == "explore":
        for key, st in states.items():
            if st.status == "exploring":
                protected = _drift_protected(result, key, verdicts.get(key, {}), data)
                out[key] = _explore_step(st, verdicts.get(key, {}), protected, promote, index,
                                         shape.budget.max_rounds)
        return out
    return _confirm_step(shape, promote, states, verdicts)


def _after_probes(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                  states: dict[BandKey, racing.BandState], data: Sequence[Measurement],
                  refused: frozenset[str], held: frozenset[str]
                  ) -> tuple[dict[BandKey, racing.BandState], bool]:
    """After an adaptive search's probe round: per band, predict every held-back candidate from
    its probe and add those that can still win as contenders (measured next round, beside the
    probes); drop the rest with their prediction. A band with nothing to add takes an ordinary
    exploration step. Returns the states and whether any band added a contender."""
    opening, later = split_baseline(data, shape.baseline)
    result = analysis.analyze(opening, _fast(promote), closing_baseline=later,
                              refused_by_headroom=refused, family="none", stage="explore",
                              partial=True)
    verdicts = _band_estimates(result)
    windows: dict[tuple[str, str, int], list[Measurement]] = defaultdict(list)
    for m in data:
        windows[(m.key.engine_hash, m.key.workload, m.key.concurrency)].append(m)
    threshold = 1 + promote.margin
    z = float(stats.norm.isf((1 - promote.confidence) / 2))
    out = dict(states)
    added = False
    for key, st in states.items():
        if st.status != "exploring":
            continue
        vs = verdicts.get(key, {})
        measured = {h: iv for h in st.contenders if (v := vs.get(h)) is not None
                    and not _gate_reasons(v) and (iv := _interval(v)) is not None}
        best_lo = max((iv.lo for iv in measured.values()), default=-math.inf)
        pending, pruned = [], []
        outranked = _outranked(sorted(held, key=shape.candidates.index), shape.chains, vs,
                               windows, bands[key], z, promote.tie_tolerance)
        for h in sorted(held, key=shape.candidates.index):
            ch = shape.chains[h]
            iv = _predicted(ch, vs.get(ch.probe), windows, bands[key], z,
                            shape.kv_capacity.get(h))
            if iv is None:
                pending.append(h)  # nothing to predict from: measure it
            elif iv.hi < threshold or iv.hi < best_lo:
                bound = threshold if iv.hi < threshold else best_lo
                pruned.append((h, f"round 0: predicted {iv.value:.3f} [{iv.lo:.3f}, "
                                  f"{iv.hi:.3f}] at {iv.point} from {vs[ch.probe].engine}: "
                                  f"cannot win (upper bound < {bound:.3f}); not started"))
            elif h in outranked:
                pruned.append((h, f"round 0: {outranked[h]}; not started"))
            else:
                pending.append(h)
        if pending:
            added = True
            gated = [(h, f"round 0: {_gate_reasons(vs[h]) if h in vs else 'not measured'}")
                     for h in st.contenders if h not in measured]
            keep = tuple(h for h in shape.candidates if h in measured or h in pending)
            out[key] = replace(st, contenders=keep, dropped=(*st.dropped, *gated, *pruned),
                               estimates=measured)
        else:
            stepped = _explore_step(replace(st, dropped=(*st.dropped, *pruned)), vs,
                                    _drift_protected(result, key, vs, data), promote, 0,
                                    shape.budget.max_rounds)
            out[key] = stepped
    return out, added


def _predicted(ch: predict.Chain, probe: analysis.Verdict | None,
               windows: Mapping[tuple[str, str, int], Sequence[Measurement]],
               points: Sequence[tuple[str, int]], z: float, kv_capacity: int | None = None
               ) -> racing.Interval | None:
    """A held-back candidate's band interval predicted from its probe (its worst point, capped
    where its KV cache holds fewer requests than the level), or None where the probe has no
    usable estimate at every point of the band."""
    if probe is None or _gate_reasons(probe):
        return None
    speedups = {(s.workload, s.concurrency): (s.speedup.value, s.speedup.lo, s.speedup.hi)
                for s in probe.speedups if (s.workload, s.concurrency) in set(points)}
    probe_windows = {p: [m for m in windows.get((ch.probe, *p), ()) if m.stage != "schedule"]
                     for p in speedups}
    preds = predict.point_predictions(ch, probe_windows, speedups, z, kv_capacity)
    if not preds or len(preds) < len(speedups):
        return None
    worst = min(preds, key=lambda p: preds[p].lo)
    capped = preds[worst].kv_capacity
    where = f"{worst[0]} c={worst[1]}" + (f", KV holds {capped}" if capped else "")
    return racing.Interval(preds[worst].value, preds[worst].lo,
                           min(p.hi for p in preds.values()), where, 0)


def _series_ratios(held: Sequence[str], chains: Mapping[str, predict.Chain], probe: str,
                   speedups: Mapping[tuple[str, int], float],
                   windows: Mapping[tuple[str, str, int], Sequence[Measurement]],
                   points: Sequence[tuple[str, int]], z: float
                   ) -> dict[str, dict[tuple[str, int], tuple[float, float, float]]]:
    """The held-back members of one probe's series over a band: per point, each one's
    predicted speedup over the probe (value, lo, hi; `predict.ratio_to_probe`), the probe
    itself at exactly 1. A member that cannot be predicted at every point is left out."""
    accs = {(w, c): acc for w, c in points
            if (acc := predict.acceptance([m for m in windows.get((probe, w, c), ())
                                           if m.stage != "schedule"])) is not None}
    out = {probe: {p: (1.0, 1.0, 1.0) for p in points}}
    for h in held:
        ch = chains[h]
        if all(p in speedups and p in accs and len(accs[p].rates) >= ch.probe_n
               for p in points):
            out[h] = {p: predict.ratio_to_probe(accs[p], speedups[p], ch.n, ch.probe_n, z)
                      for p in points}
    return out


def _outranked(held: Sequence[str], chains: Mapping[str, predict.Chain],
               verdicts: Mapping[str, analysis.Verdict],
               windows: Mapping[tuple[str, str, int], Sequence[Measurement]],
               points: Sequence[tuple[str, int]], z: float, tie: float) -> dict[str, str]:
    """Held-back candidates that a member of their own series beats at every point of the
    band by more than a tie, on the predicted ratios to their common probe (why, by hash).

    Every member of a series is predicted from the same engine start of its probe, compared
    with the same baseline: their ranking carries neither that start's effect nor the
    baseline's noise, only the MAL sampling error and the cost fit's (`predict.ratio_to_probe`),
    so it holds where a prediction against the baseline is too wide to prune. The series'
    leader (the highest predicted worst point; the probe, at ratio 1, when nothing beats it)
    keeps its place; a member whose upper bound stays below the leader's predicted ratio x (1 +
    tie) at every point would at best tie with the leader there (the band takes each
    candidate's worst point): screened out, as indifference-zone selection does."""
    out: dict[str, str] = {}
    by_probe: dict[str, list[str]] = defaultdict(list)
    for h in held:
        by_probe[chains[h].probe].append(h)
    for probe_hash, members in by_probe.items():
        probe = verdicts.get(probe_hash)
        if probe is None or _gate_reasons(probe):
            continue
        speedup = {(s.workload, s.concurrency): s.speedup.value for s in probe.speedups}
        ratios = _series_ratios(members, chains, probe_hash, speedup, windows, points, z)
        # the predicted band value: the worst point's predicted speedup over the baseline
        leader = max(ratios, key=lambda h: min(r[0] * speedup.get(p, 1.0)
                                               for p, r in ratios[h].items()))
        for h in members:
            if h == leader or h not in ratios:
                continue
            if all(ratios[h][p][2] < ratios[leader][p][0] * (1 + tie) for p in points):
                p = max(points, key=lambda p: ratios[h][p][2] / ratios[leader][p][0])
                v, _, hi = ratios[h][p]
                lv = ratios[leader][p][0]
                lead = ("the probe" if leader == probe_hash
                        else f"N={chains[leader].n}'s {lv:.3f}x")
                out[h] = (f"predicted {v:.3f}x its probe {probe.engine} (at most {hi:.3f}x) at "
                          f"{p[0]} c={p[1]}: at best a tie ({tie:.0%}) with {lead}")
    return out


def _explore_step(st: racing.BandState, verdicts: Mapping[str, analysis.Verdict],
                  protected: set[str], promote: PromoteSpec, index: int, max_rounds: int
                  ) -> racing.BandState:
    """Drop what cannot win (on a gate at once; on its speedup after two engine starts); select
    a winner when one is left, leads clearly or is already above the margin."""
    threshold = 1 + promote.margin
    dropped = list(st.dropped)
    estimates: dict[str, racing.Interval] = {}
    for h in st.contenders:
        v = verdicts.get(h)
        gates = _gate_reasons(v) if v is not None else "not measured"
        iv = _interval(v) if v is not None else None
        if gates or iv is None:
            dropped.append((h, f"round {index}: {gates or 'no speedup measured'}"))
        else:
            estimates[h] = iv
    for h, why in racing.cannot_win(estimates, threshold).items():
        # a contender gets two engine starts before its speedup can drop it: one start's
        # effect (shared by every band) must not decide
        if h not in protected and estimates[h].starts >= 2:
            dropped.append((h, f"round {index}: cannot win ({why})"))
            del estimates[h]
    contenders = tuple(h for h in st.contenders if h in estimates)
    now = replace(st, contenders=contenders, dropped=tuple(dropped), estimates=estimates)
    if not contenders:
        return replace(now, status="off", why="every candidate was dropped")
    leader = racing.clear_leader(estimates) if len(contenders) > 1 else contenders[0]
    best = max(contenders, key=lambda h: estimates[h].lo)
    if leader is None and estimates[best].lo >= threshold:
        # Already above the margin on exploration data: confirmation (fresh starts, corrected)
        # decides; a lucky pick fails there and costs power, never a false promotion.
        leader = best
    if protected & set(contenders) and index + 1 < max_rounds:
        leader = None  # nothing is selected on data a baseline step may have distorted
    if leader is None and index + 1 >= max_rounds:
        leader = best
    if leader is not None and estimates[leader].value >= threshold:
        name = verdicts[leader].engine if leader in verdicts else leader[:8]
        others = tuple((h, f"round {index}: {name} selected instead")
                       for h in contenders if h != leader)
        return replace(st, status="confirming", contenders=(leader,),
                       dropped=(*dropped, *others), estimates=estimates,
                       why=f"selected in round {index}: speedup {estimates[leader].value:.3f} "
                           f"[{estimates[leader].lo:.3f}, {estimates[leader].hi:.3f}] on "
                           "exploration data")
    if index + 1 >= max_rounds:
        rounds_run = f"{max_rounds} exploration round{'s' * (max_rounds != 1)}"
        return replace(now, status="unresolved", why=f"after {rounds_run} no contender's "
                       f"estimate clears {threshold:.3f}")
    return now


def _confirm_step(shape: Shape, promote: PromoteSpec, states: Mapping[BandKey, racing.BandState],
                  verdicts: Mapping[BandKey, Mapping[str, analysis.Verdict]]
                  ) -> dict[BandKey, racing.BandState]:
    """Holm over the bands being confirmed, at alpha / looks, on confirmation data only."""
    out = dict(states)
    confirming = [k for k, st in states.items() if st.status == "confirming"]
    alpha = (1 - promote.confidence) / 2 / shape.budget.confirm_looks
    pvals, gates = [], []
    for k in confirming:
        v = verdicts.get(k, {}).get(states[k].contenders[0])
        pvals.append(analysis.band_p_value(v) if v is not None else 1.0)
        gates.append(_gate_reasons(v) if v is not None else "not measured on confirmation")
    passed = racing.holm(pvals, alpha)
    for k, p, ok, gate in zip(confirming, pvals, passed, gates, strict=True):
        st = states[k]
        looks = st.looks + 1
        v = verdicts.get(k, {}).get(st.contenders[0])
        iv = _interval(v) if v is not None else None
        ests = {st.contenders[0]: iv} if iv is not None else {}
        if ok and not gate:
            out[k] = replace(st, status="confirmed", looks=looks, estimates=ests,
                             why=f"confirmed on fresh engine starts (p = {p:.2g} <= Holm's "
                                 f"threshold over {len(confirming)} bands at alpha {alpha:.3g})")
        elif gate or (iv is not None and iv.hi < 1 + promote.margin):
            out[k] = replace(st, status="off", looks=looks, estimates=ests,
                             why=f"failed confirmation: {gate or 'upper bound below the margin'}")
        elif looks >= shape.budget.confirm_looks:
            out[k] = replace(st, status="unresolved", looks=looks, estimates=ests,
                             why=f"not confirmed after {looks} look{'s' * (looks != 1)} "
                                 f"(p = {p:.2g}); " + _settle_cost(v, promote))
        else:
            out[k] = replace(st, looks=looks, estimates=ests)
    return out


def _settle_cost(v: analysis.Verdict | None, promote: PromoteSpec) -> str:
    if v is None or v.worst is None:
        return "measure it again"
    need = analysis.starts_needed(v.worst, 1 + promote.margin, promote.confidence)
    if need is None:
        return "its estimate is below the margin"
    return f"about {need} confirmation engine starts per side would settle it"


def _next_round(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                states: Mapping[BandKey, racing.BandState], data: Sequence[Measurement],
                index: int, new_only: bool = False) -> tuple[racing.Stage, list]:
    """Exploration while any band explores (contenders only, at their bands' points; with
    `new_only`, only those not measured yet); then one confirmation look for every selected
    winner, with fresh baseline starts around it."""
    repeats = _windows_per_start(shape, data)
    exploring = {k: st for k, st in states.items() if st.status == "exploring"}
    if exploring:
        per: dict[str, set[tuple[str, int]]] = defaultdict(set)
        open_points: set[tuple[str, int]] = set()
        for k, st in exploring.items():
            for h in st.contenders:
                if not (new_only and h in st.estimates):
                    per[h].update(bands[k])
                    open_points.update(bands[k])
        cands = [(h, "explore", tuple(sorted(per[h])), repeats)
                 for h in shape.candidates if h in per]
        base = (shape.baseline, "explore", tuple(sorted(open_points)), repeats)
        return "explore", _with_baselines(cands, base, shape.baseline_every, opening=False)
    confirming = {k: st for k, st in states.items() if st.status == "confirming"}
    if not confirming:
        return "confirm", []
    per = defaultdict(set)
    for k, st in confirming.items():
        per[st.contenders[0]].update(bands[k])
    base = (shape.baseline, "confirm", tuple(sorted({p for k in confirming for p in bands[k]})),
            repeats)
    winners = [(h, "confirm", tuple(sorted(per[h])), repeats)
               for h in shape.candidates if h in per]
    starts = _confirm_size(shape, promote, bands, confirming, data, repeats)
    return "confirm", confirm_plan(base, winners, starts)


def confirm_plan(base: tuple, winners: list, k: int) -> list:
    """A confirmation look: k starts of each winner, a fresh baseline start around each."""
    plan = [base]
    for _ in range(k):
        plan += [*winners, base]
    return plan


def _windows_per_start(shape: Shape, data: Sequence[Measurement]) -> int:
    """Windows per engine start for the next round: the cost-optimal number for the noise
    measured so far (median over points), between `repeats` and `budget.max_repeats`."""
    cap = shape.budget.max_repeats or 4 * shape.repeats
    blocks = analysis.usable_blocks(data)
    start_s, window_s = _costs(data, shape)
    best = [racing.block_noise(bs, shape.baseline).windows_per_start(start_s, window_s)
            for bs in blocks.values()]
    if not best:
        return shape.repeats
    m = float(np.median(best))
    return int(min(cap, max(shape.repeats, round(m) if math.isfinite(m) else cap)))


def _confirm_size(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                  confirming: Mapping[BandKey, racing.BandState], data: Sequence[Measurement],
                  repeats: int) -> int:
    """Engine starts per winner for one confirmation look: enough for 90% power at the
    exploration estimate (halfway to its lower bound, against the winner's curse), at the
    corrected alpha and the noise measured so far with `repeats` windows per start, at least
    `confirm_starts`, at most `max_confirm_starts` (see `racing.Budget`). A look of k winner
    starts has k + 1 baseline starts around them: var ~ v_winner / k + v_baseline / k."""
    budget = shape.budget
    alpha = (1 - promote.confidence) / 2 / budget.confirm_looks / max(1, len(confirming))
    z = float(stats.norm.isf(alpha)) + float(stats.norm.isf(0.1))
    blocks = analysis.usable_blocks(data)
    need = budget.confirm_starts
    for key, st in confirming.items():
        h = st.contenders[0]
        iv = st.estimates.get(h)
        if iv is None or iv.lo <= 0:
            continue
        gap = math.log((iv.value * iv.lo) ** 0.5) - math.log(1 + promote.margin)
        if gap <= 0:
            continue  # a marginal selection: the smallest look, not the largest
        for point in bands[key]:
            noise = racing.block_noise(blocks.get(point, []), shape.baseline)
            # sized on the 80% upper bound of the start variance: it rests on few starts, and
            # an estimate near 0 would size a look with no power against a start effect
            start_var = noise.start_var_upper(0.8)
            var = sum(start_var + noise.window_var(e) / repeats for e in (h, shape.baseline))
            need = max(need, math.ceil(var * (z / gap) ** 2))
    cap = budget.max_confirm_starts
    if cap is None:
        cap = 10_000 if budget.bounded else 24  # the budget shrinks it (`_affordable`)
    return min(need, cap)


def _out_of_budget(states: Mapping[BandKey, racing.BandState], total: racing.Spent,
                   cost: racing.Spent) -> dict[BandKey, racing.BandState]:
    """Every open band becomes unresolved: the next round would exceed the budget."""
    why = (f"budget spent: the next round needs {cost.engine_starts} engine starts, "
           f"{cost.windows} windows, ~{math.ceil(cost.engine_seconds)} engine-seconds beyond "
           f"the {total.engine_starts} starts / {total.windows} windows / "
           f"{math.ceil(total.engine_seconds)} s spent")
    return {k: (replace(st, status="unresolved", why=why)
                if st.status in ("exploring", "confirming") else st)
            for k, st in states.items()}


def measured_schedules(result: analysis.Analysis, checks: Mapping[str, ScheduleCheck]
                       ) -> tuple[analysis.Analysis, list[str]]:
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
