"""The sweep's rounds, replayed from its records: what has been measured, what each round
decided, and which engine starts come next.

Everything here is a function of the records (`Measurement.round`, `.seq`, `.key.start`,
`.stage`, `.engine_s`): a resumed or retried sweep replays the finished rounds to the same
states, finds the round with windows still missing and runs only those. Nothing else is stored.

A grid sweep is one round: the baseline, every candidate, the closing baseline. A racing sweep
(see `racing`) explores in rounds until every band has a selected winner, nothing left, or no
budget, then confirms the selected winners on fresh engine starts.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from specflow.decision.aggregate import usable_starts
from specflow.decision.choose import rule_out_level
from specflow.decision.model import AnalysisError
from specflow.decision.race import BandState
from specflow.records.measurement import Measurement
from specflow.search.advance import after_probes, after_round, open_after_exploring
from specflow.search.budget import PlannedStart, Spent, round_cost
from specflow.search.plan import (
    BandKey,
    Round,
    Shape,
    band_keys,
    confirm_alpha,
    final_rules,
    observed_costs,
    place_starts,
    spent_by,
    windows_per_start,
)
from specflow.search.schedules import (
    ScheduleCheck,
    check_emitted_schedules,
    pending_schedules,
    schedule_round,
)
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import PromoteSpec
from specflow.stats.critical import z_upper, z_value
from specflow.stats.power import starts_for_power
from specflow.stats.replicates import Stage, start_noise


@dataclass(frozen=True)
class SearchState:
    """The sweep's rounds so far and the one to run now."""

    rounds: tuple[Round, ...]
    """Finished rounds."""
    current: Round | None
    """The round with windows still missing; None when the sweep is done."""
    states: Mapping[BandKey, BandState]
    """The latest band states (final when `current` is None)."""
    spent: Spent
    problems: tuple[str, ...] = ()
    """Why the race cannot go on (the data cannot be analysed)."""
    schedules: Mapping[str, ScheduleCheck] = field(default_factory=dict)
    """Per traffic class: its emitted N schedule measured as one engine (racing sweeps)."""
    derived: Mapping[str, EngineConfig] = field(default_factory=dict)
    """Engine configs the race made (schedules), by hash."""


def replay(shape: Shape, promote: PromoteSpec, measurements: Sequence[Measurement],
           refused: frozenset[str] = frozenset()) -> SearchState:
    """Replay the finished rounds from the records and find the round to run now."""
    recorded = {m.key.id for m in measurements}
    bands = band_keys(shape, promote)
    held = held_back(shape, refused)
    alive = tuple(h for h in shape.candidates if h not in refused and h not in held)
    states: dict[BandKey, BandState] = {
        k: BandState(k[0], k[1], "exploring" if alive else "off", alive,
                            tuple((h, "refused by the headroom check") for h in shape.candidates
                                  if h in refused))
        for k in bands}
    plan = first_round(shape, alive, held)
    rounds: list[Round] = []
    started: Counter[str] = Counter()
    seq, index, stage = 0, 0, plan[0][1] if plan else "explore"
    total = Spent()
    checks: dict[str, ScheduleCheck] = {}
    pending: dict[str, tuple[ScheduleCheck, EngineConfig]] = {}
    derived: dict[str, EngineConfig] = {}
    probe_rounds = 0  # 1 once the probe round added predicted contenders (not a racing round)
    while plan:
        starts = place_starts(plan, index, seq, started)
        seq += len(starts)
        current = Round(index, stage, starts)
        if any(k.id not in recorded for s in starts for k in s.window_keys()):
            return SearchState(tuple(rounds), current, states, total, (), checks, derived)
        data = [m for m in measurements if m.round <= index]
        total = spent_by(data)
        if shape.design == "grid":
            rounds.append(replace(current, spent=total))
            return SearchState(tuple(rounds), None, states, total)
        decided = [m for m in data if m.stage != "schedule"]
        try:
            if stage == "schedule":
                checks = check_emitted_schedules(shape, promote, pending, data)
            elif held and index == 0:
                states, added = after_probes(shape, promote, bands, states, decided, refused,
                                              held)
                probe_rounds = int(added)
            else:
                states = after_round(shape, promote, bands, states, decided, refused, stage,
                                      index - probe_rounds)
            # right after the probe round, only the contenders it added are started: the probes
            # already have their start, and the race re-measures every contender only in a
            # further round (max_rounds), as it does any candidate
            stage, plan = next_round(shape, promote, bands, states, decided, index + 1,
                                      new_only=index == 0 and probe_rounds == 1)
            if not plan and not checks and shape.engines:
                pending = pending_schedules(shape, promote, states, decided, refused)
                stage, plan = "schedule", schedule_round(shape, pending.values(), decided)
                derived = {c.engine_hash: e for c, e in pending.values()}
        except AnalysisError as exc:
            rounds.append(replace(current, states=tuple(states.values()), spent=total))
            return SearchState(tuple(rounds), None, states, total, tuple(exc.problems),
                            checks, derived)
        if plan:
            plan, cost = _affordable(shape, stage, plan, total, observed_costs(data, shape),
                                     _open_contenders(states))
            if cost is not None:
                states = _out_of_budget(states, total, cost)
                plan = []
        rounds.append(replace(current, states=tuple(states.values()), spent=total))
        index += 1
    return SearchState(tuple(rounds), None, states, total, (), checks, derived)


def _affordable(shape: Shape, stage: Stage, plan: list, total: Spent,
                costs: tuple[float, float], extra: frozenset[str] = frozenset()
                ) -> tuple[list, Spent | None]:
    """The plan if it fits the budget; a confirmation look shrinks to the largest that fits
    (never below `confirm_starts`; `extra`: the open bands' contenders, whose starts make a
    look a settling look, `settle_plan`). Otherwise the cost that does not fit."""

    def cost(p: list) -> Spent:
        return round_cost([PlannedStart(h, st, pts, r) for h, st, pts, r in p],
                                 *costs)

    if total.plus(cost(plan)).within(shape.budget):
        return plan, None
    if stage == "confirm" and all(x[0] == shape.baseline or x[0] in extra for x in plan):
        return _settle_affordable(plan, cost, total, shape)
    if stage == "confirm":
        base = next(x for x in plan if x[0] == shape.baseline)
        sized = list(Counter(x for x in plan if x[0] != shape.baseline).items())

        def capped(k: int) -> list:  # each winner's starts capped at k
            return confirm_plan(base, [(w, min(n, k)) for w, n in sized])

        def fits(k: int) -> bool:
            return total.plus(cost(capped(k))).within(shape.budget)

        lo, hi = shape.budget.confirm_starts, max((n for _, n in sized), default=0) - 1
        if hi >= lo and fits(lo):
            return capped(_largest(lo, hi, fits)), None
    return plan, cost(plan)


def _largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The largest k in [lo, hi] that `fits` (which holds at `lo` and, once false, stays so):
    a binary search, as k can be large."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _settle_affordable(plan: list, cost: Callable[[list], Spent], total: Spent,
                       shape: Shape) -> tuple[list, Spent | None]:
    """A settling look (`settle_plan`) shrunk to the most rounds that fit the budget, at least
    one; otherwise the cost of one round that does not fit."""
    base = plan[0]
    counts = Counter(x for x in plan[1:] if x[0] != shape.baseline)
    extras = list(counts.items())

    def fits(k: int) -> bool:
        return total.plus(cost(settle_plan(base, extras, k))).within(shape.budget)

    if not fits(1):
        return plan, cost(settle_plan(base, extras, 1))
    return settle_plan(base, extras, _largest(1, max(counts.values()), fits)), None


def _open_contenders(states: Mapping[BandKey, BandState]) -> frozenset[str]:
    """Contenders of the bands left open that no band is confirming (a settling look's)."""
    winners = {st.contenders[0] for st in states.values() if st.status == "confirming"}
    return frozenset(h for st in open_after_exploring(states).values() for h in st.contenders
                     if h not in winners)


def held_back(shape: Shape, refused: frozenset[str]) -> frozenset[str]:
    """Candidates an adaptive search does not measure in its first round: those predicted from
    a probe that the headroom check let start (a series' chain check is measured beside its
    probe, at `Shape.check_points`)."""
    if shape.search != "adaptive" or shape.design != "race":
        return frozenset()
    return frozenset(h for h, ch in shape.chains.items()
                     if h not in refused and ch.probe not in refused and not ch.check)


def first_round(shape: Shape, alive: Sequence[str], held: frozenset[str] = frozenset()
                 ) -> list[tuple[str, Stage, tuple[tuple[str, int], ...], int]]:
    """Grid: baseline, every candidate, closing baseline. Race: the same with a baseline start
    after every `baseline_every` candidates (an adaptive search holds back the candidates it
    predicts from a probe, and measures a series' chain check at `Shape.check_points` only)."""
    base = (shape.baseline, "explore", shape.points, shape.repeats)

    def points(h: str) -> tuple[tuple[str, int], ...]:
        ch = shape.chains.get(h)
        if ch is None or not ch.check or all(shape.chains[g].probe != ch.probe for g in held):
            return shape.points
        return shape.check_points  # a chain check whose series is predicted

    cands = [(h, "explore", points(h), shape.repeats) for h in shape.candidates
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


def next_round(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                states: Mapping[BandKey, BandState], data: Sequence[Measurement],
                index: int, new_only: bool = False) -> tuple[Stage, list]:
    """Exploration while any band explores (contenders only, at their bands' points; with
    `new_only`, only those not measured yet); then one confirmation look for every selected
    winner, against the look's own baseline starts (`confirm_plan`)."""
    repeats = windows_per_start(shape, data, promote)
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
        # No winner to confirm: the bands the exploration left open get a settling look of
        # their own while confirmation looks remain (each spends one look's futility share).
        left_open = open_after_exploring(states)
        if not left_open or _looks_taken(data) >= shape.budget.confirm_looks:
            return "confirm", []
        return "confirm", _settle_look(shape, promote, bands, left_open, repeats)
    per = defaultdict(set)
    for k, st in confirming.items():
        per[st.contenders[0]].update(bands[k])
    # The starts a confirmation pays for also measure the bands the exploration left open, for
    # the baseline and for each winner still contending there: a window costs little beside an
    # engine start, and each further start narrows the intervals that may rule a contender out.
    # An open band's other contenders get no start of their own: these starts replicate the
    # start-to-start variance at its points, so one start of theirs can rule them out there.
    left_open = open_after_exploring(states)
    for k, st in left_open.items():
        for h in st.contenders:
            if h in per:
                per[h].update(bands[k])
    base = (shape.baseline, "confirm",
            tuple(sorted({p for k in (*confirming, *left_open) for p in bands[k]})), repeats)
    winners = [(h, "confirm", tuple(sorted(per[h])), repeats)
               for h in shape.candidates if h in per]
    starts = _confirm_size(shape, promote, bands, confirming, data, repeats)
    return "confirm", confirm_plan(base, [(w, starts[w[0]]) for w in winners])


def _looks_taken(data: Sequence[Measurement]) -> int:
    """Confirmation looks the race has taken: its rounds of stage "confirm"."""
    return len({m.round for m in data if m.stage == "confirm"})


def _settle_look(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                 left_open: Mapping[BandKey, BandState], repeats: int) -> list:
    """A look at the open bands alone: each contender started as often as ruling it out would
    need if its estimate and noise hold (80% power that every contender of its band is ruled
    out at the final decision's futility share: an upper bound below 1 + 2 x margin at some
    point of the band, each point's at its share of it), at least once and at most
    `max_confirm_starts`, at its open bands' points, with a fresh baseline start before the first
    round of them and after each (`settle_plan`; the budget shrinks it in `_affordable`)."""
    final = final_rules(promote)
    limit = math.log(1 + 2 * promote.margin)
    cap = shape.budget.max_confirm_starts or (10_000 if shape.budget.bounded else 24)
    need: dict[str, int] = {}
    points: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for k, st in left_open.items():
        # a band concludes off when every contender is ruled out: 80% power for all of them
        z_power = z_upper(1 - 0.8 ** (1 / max(1, len(st.contenders))))
        z_futility = z_upper(1 - rule_out_level(final, len(bands[k])))
        for h in st.contenders:
            points[h].update(bands[k])
            more, iv = 1, st.estimates.get(h)
            if iv is not None and iv.hi > iv.value > 0:
                gap = limit - math.log(iv.value)
                # one start's share of the contrast's variance, from the interval's width
                var = iv.starts * ((math.log(iv.hi) - math.log(iv.value))
                                   / z_value(promote.confidence)) ** 2
                more = (cap if gap <= 0 else
                        math.ceil(starts_for_power(var, gap, z_futility, z_power)) - iv.starts)
            need[h] = max(need.get(h, 1), min(cap, max(1, more)))
    base = (shape.baseline, "confirm", tuple(sorted({p for ps in points.values() for p in ps})),
            repeats)
    extras = [((h, "confirm", tuple(sorted(points[h])), repeats), need[h])
              for h in shape.candidates if h in need]
    return settle_plan(base, extras, max(need.values()))


def settle_plan(base: tuple, extras: Sequence[tuple[tuple, int]], k: int) -> list:
    """A settling look of at most `k` rounds: each contender (with the starts it needs) started
    in the first rounds, up to k; a fresh baseline start before the first and after each."""
    plan = [base]
    for i in range(k):
        plan += [*(x for x, n in extras if n > i), base]
    return plan


def confirm_plan(base: tuple, winners: Sequence[tuple[tuple, int]]) -> list:
    """A confirmation look: each winner started as often as its band needs (front-loaded: the
    i-th row holds the winners needing more than i starts), a baseline start after each row and,
    in a look of several rows, a fresh one before the first."""
    k = max([1, *(n for _, n in winners)])
    # the round before closed with a baseline start; a fresh one opens a look of several rows
    # (each winner start between two); a one-row look's winners take the one after them
    plan: list = [base] if k > 1 else []
    for i in range(k):
        plan += [*(w for w, n in winners if n > i), base]
    return plan


def _confirm_size(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                  confirming: Mapping[BandKey, BandState], data: Sequence[Measurement],
                  repeats: int) -> dict[str, int]:
    """Engine starts of each winner for one confirmation look: enough for 90% power at the
    exploration estimate (halfway to its lower bound, against the winner's curse) in every
    band it is confirmed in, at the corrected alpha and the noise measured so far with
    `repeats` windows per start, at least `confirm_starts`, at most `max_confirm_starts` (see
    `BudgetSpec`). k winner starts are compared with about k of the look's baseline starts
    (`confirm_plan`: one after each row): var ~ v_winner / k + v_baseline / k."""
    budget = shape.budget
    alpha = confirm_alpha(promote, budget) / max(1, len(confirming))
    z_alpha, z_power = z_upper(alpha), z_upper(0.1)
    per_point = usable_starts(data, promote)
    cap = budget.max_confirm_starts
    if cap is None:
        cap = 10_000 if budget.bounded else 24  # the budget shrinks it (`_affordable`)
    need: dict[str, int] = {}
    for key, st in confirming.items():
        h = st.contenders[0]
        need[h] = max(need.get(h, 0), budget.confirm_starts)
        iv = st.estimates.get(h)
        if iv is None or iv.lo <= 0:
            continue
        gap = math.log((iv.value * iv.lo) ** 0.5) - math.log(1 + promote.margin)
        if gap <= 0:
            continue  # a marginal selection: the smallest look, not the largest
        for point in bands[key]:
            noise = start_noise(per_point.get(point, []), shape.baseline)
            # sized on the 80% upper bound of the start variance: it rests on few starts, and
            # an estimate near 0 would size a look with no power against a start effect
            start_var = noise.start_var_upper(0.8)
            var = sum(start_var + noise.window_var(e) / repeats for e in (h, shape.baseline))
            need[h] = max(need[h], math.ceil(starts_for_power(var, gap, z_alpha, z_power)))
    return {h: min(n, cap) for h, n in need.items()}


def _out_of_budget(states: Mapping[BandKey, BandState], total: Spent,
                   cost: Spent) -> dict[BandKey, BandState]:
    """Every open band becomes unresolved: the next round would exceed the budget."""
    why = (f"budget spent: the next round needs {cost.engine_starts} engine starts, "
           f"{cost.windows} windows, ~{math.ceil(cost.engine_seconds)} engine-seconds beyond "
           f"the {total.engine_starts} starts / {total.windows} windows / "
           f"{math.ceil(total.engine_seconds)} s spent")
    return {k: (replace(st, status="unresolved", why=why)
                if st.status in ("exploring", "confirming") else st)
            for k, st in states.items()}
