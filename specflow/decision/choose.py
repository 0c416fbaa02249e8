"""Deciding: per traffic class and concurrency band, does speculation pay, and with what.

Pure (numpy and scipy only): frozen `Measurement`s in, frozen decisions out, every rejection with
its reason. The chain is aggregate -> compare with the baseline -> gate -> pick -> schedule.

Statistics, and why:
- A *point* is one engine config x workload x concurrency. Its OK windows are summarised by the
  median and MAD (what a human reads) and by the geometric mean with a bootstrap CI (display).
- Speedup is candidate / baseline at the same workload and concurrency, on log throughput (noise
  is multiplicative). The replicate unit is the engine start and the baseline is time-local:
  `contrast` compares each candidate start with the baseline interpolated in run order
  between the baseline starts around it, with a t interval whose variance counts starts (see
  `racing`). Without replicated starts (one start per config) the interval is Welch's over the
  configs' windows, and the class notes say the interval cannot include start-to-start noise.
- Consecutive baseline starts that differ beyond noise are flagged (`Drift`); racing re-measures
  what ran between them.
- A band's speedup is its *worst* point (every workload of the class, every level in the band);
  its test's p-value is the largest of its points' (intersection-union).
- Errors per deployment: a grid is Holm-corrected over every class x band x candidate
  (`family="holm"`); a race judges each band's selected winner on its confirmation starts only
  (on its exploration starts where the race confirmed it early) (`race=`), the race itself
  having corrected over the bands it confirmed.

Decision rule: a candidate is eligible in a band when it was not refused by headroom, ran without
failing at every point, keeps temperature-0 outputs equal to the baseline's (at every concurrency
level, the share of its (run, request) pairs whose output differs from the baseline's majority
output may exceed the baseline's own share there by at most `quality.max_mismatch_fraction`, at
the lower confidence bound of Newcombe's interval for the difference, so more repeats alone
never make rejection likelier), meets every latency SLO at its worst repeat, and its speedup
lower bound is >= 1 + margin at every point; among eligible candidates the highest lower bound
wins, where bounds within `tie_tolerance` are ties that go to the smaller N, then the cheaper
method (`METHODS[m].cost_rank`). With no eligible candidate, "off" wins.

Calibration: tests/decision/test_analysis.py (hand-built grids, 1,000 seeded trials: an A/A pair is
promoted < 1% of the time at CV up to 10%; a true 10% gain >= 95% at CV 1.5% with 5 + 5 windows)
and tests/search/test_racing.py (simulated racing and grid sweeps); bench/decision_quality.py
measures false promotion, power and cost per deployment. A rejection that is only inconclusive
says how many engine starts would settle it at the observed noise.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from specflow.decision.aggregate import (
    aggregate,
    median_curve,
    objective_label,
    screened_starts,
)
from specflow.decision.bands import bands_for
from specflow.decision.deployment import class_deployment, pick, tie_key
from specflow.decision.gates import (
    QualityReference,
    quality_check,
    quality_references,
    slo_violations,
)
from specflow.decision.model import (
    BASELINE_METHOD,
    Analysis,
    AnalysisError,
    Band,
    ClassResult,
    Decision,
    Drift,
    Estimate,
    PointSpeedup,
    PointStats,
    QualityCheck,
    Reason,
    Verdict,
)
from specflow.decision.race import BandState
from specflow.decision.wording import (
    band_p_value,
    leader,
    off_reasons,
    open_why,
    settle_phrase,
    starts_needed,
    winner_reasons,
)
from specflow.records.measurement import Measurement
from specflow.spec.schema import PromoteSpec
from specflow.stats.multiplicity import holm
from specflow.stats.replicates import (
    Stage,
    StartNoise,
    StartWindows,
    contrast,
    drift_steps,
    filter_stage,
    start_noise,
)


@dataclass(frozen=True)
class _BandInputs:
    """What every band of one traffic class is decided from."""

    traffic_class: str
    workloads: tuple[str, ...]
    candidates: Mapping[str, list[PointStats]]
    """Candidate points by engine hash."""
    baseline_points: tuple[PointStats, ...]
    """The baseline points of the class (every baseline start pooled)."""
    baseline_hash: str
    blocks: Mapping[tuple[str, int], list[StartWindows]]
    """Every engine start's usable windows at (workload, concurrency)."""
    noise: Mapping[tuple[str, int], StartNoise]
    refs: Mapping[str, QualityReference]
    missing_refs: Mapping[str, str]
    """Workloads without a usable baseline reference, with why."""
    refused: Collection[str]
    """Engine hashes the headroom check refused."""
    drift: tuple[Drift, ...]
    promote: PromoteSpec
    stage: Stage | None = None
    """Which engine starts the speedups use (None: all of them)."""


def _failed_reasons(pts: Sequence[PointStats]) -> list[Reason]:
    """Points where every repeat failed."""
    return [Reason("failed", f"every repeat failed at {p.workload} c={p.concurrency} "
                             f"({', '.join(f'{r} x{n}' for r, n in p.failures.items())})")
            for p in pts if not p.n_ok]


def _quality_gate(ok: Sequence[PointStats], inputs: _BandInputs
                  ) -> tuple[QualityCheck | None, list[Reason]]:
    """The output-equality check of a candidate's usable points, and its rejection if any."""
    if not ok:
        return None, []
    quality = quality_check(ok, inputs.refs, inputs.missing_refs, inputs.promote)
    if quality.passed:
        return quality, []
    detail = quality.problem or _quality_detail(quality, inputs.promote.confidence)
    return quality, [Reason("quality", detail)]


def _quality_detail(q: QualityCheck, confidence: float) -> str:
    """Each failing level with both rates, the bound that failed and the tolerance."""
    parts = []
    for lv in (lv for lv in q.levels if not lv.passed):
        base = (f"the baseline's own {lv.baseline_mismatches} of {lv.baseline_pairs} "
                f"({lv.baseline_rate:.1%})" if q.calibrated
                else "a baseline taken as exact (calibration off)")
        parts.append(f"at c={lv.concurrency} {lv.candidate_mismatches} of {lv.candidate_pairs} "
                     f"(run, request) pairs differ from the baseline's reference "
                     f"({lv.candidate_rate:.1%}) vs {base}: the {confidence:.0%} lower bound of "
                     f"the excess, {lv.diff_lo:.1%}, exceeds the tolerance {q.tolerance:.1%}")
    detail = "; ".join(parts) or "no requests were compared"
    return detail + (f"; e.g. {', '.join(q.examples)}" if q.examples else "")


def _speedups(ok: Sequence[PointStats], inputs: _BandInputs) -> list[PointSpeedup]:
    """Candidate vs the time-local baseline at each usable point (engine starts as replicates).

    Each point's rule-out bound is at 1 - futility / P over the P points measured
    (`rule_out_level`): the band takes its worst point, so a band value of 2 x margin means a
    gain that large at every point, and ruling it out at any one of P points is P chances."""
    promote = inputs.promote
    measured = []
    for p in ok:
        key = (p.workload, p.concurrency)
        blocks = filter_stage(inputs.blocks.get(key, []), inputs.stage)
        c = contrast([b for b in blocks if b.engine_hash == p.engine_hash],
                            [b for b in blocks if b.engine_hash == inputs.baseline_hash],
                            inputs.noise[key])
        if c is not None:
            measured.append((p, c))
    level = rule_out_level(promote, len(measured))
    out = []
    for p, c in measured:
        lo, hi = c.interval(promote.confidence)
        out.append(PointSpeedup(
            p.workload, p.concurrency, Estimate(c.speedup, lo, hi, promote.confidence),
            c.n_windows, c.n_baseline_windows, c.cv, c.p_above(1 + promote.margin),
            c.n_starts, c.n_baseline_starts, c.replicated,
            c.interval(2 * level - 1)[1]))
    return out


def rule_out_level(promote: PromoteSpec, points: int) -> float:
    """The one-sided level of each point's rule-out bound in a band of `points` measured points:
    1 - futility / points (Bonferroni over the points, see `_speedups`)."""
    return 1 - promote.futility / max(1, points)


def rule_out_threshold(promote: PromoteSpec) -> float:
    """A gain this large excluded rules a candidate out: 1 + 2 x margin."""
    return 1 + 2 * promote.margin


def gate_reasons(reasons: Sequence[Reason]) -> str:
    """The gates that reject a candidate whatever its speedup (failed windows, quality, SLO,
    headroom), joined; "" when none does."""
    return "; ".join(str(r) for r in reasons if r.gate not in ("speedup", "family", "race"))


def _ruled_out(reasons: Sequence[Reason], speedups: Sequence[PointSpeedup],
               promote: PromoteSpec) -> str:
    """Why a candidate cannot be the band's answer, or "" while it may: a gate it fails, or at
    some point of the band (the band takes its worst point) a gain of 2 x margin excluded at
    1 - futility / (points measured)."""
    gates = gate_reasons(reasons)
    if gates:
        return gates
    bar = rule_out_threshold(promote)
    below = [s for s in speedups if s.rule_out_hi < bar]
    if not below:
        return ""
    s = min(below, key=lambda s: s.rule_out_hi)
    level = rule_out_level(promote, len(speedups))
    return (f"a gain of {bar - 1:.0%} or more is excluded at {s.workload} c={s.concurrency} "
            f"(speedup {s.speedup.value:.3f}, {level:.1%} upper bound {s.rule_out_hi:.3f} < "
            f"{bar:.3f})")


def _speedup_reason(s: PointSpeedup, promote: PromoteSpec) -> Reason | None:
    """Why a point's speedup lower bound misses 1 + margin, and what would settle it."""
    threshold = 1 + promote.margin
    e = s.speedup
    if e.lo >= threshold:
        return None
    detail = (f"lower bound {e.lo:.3f} < {threshold:.3f} at {s.workload} c={s.concurrency} "
              f"(speedup {e.value:.3f}, {e.confidence:.0%} CI [{e.lo:.3f}, {e.hi:.3f}], "
              f"{s.starts}/{s.baseline_starts} engine starts, {s.n_candidate}/{s.n_baseline} "
              "windows)")
    need = starts_needed(s, threshold, promote.confidence)
    if e.hi < 1:
        detail += "; slower than the baseline"
    elif need is None:
        detail += f"; the gain is below the {promote.margin:.0%} margin"
    else:
        detail += f"; still open: {settle_phrase(need, 'it')}"
    return Reason("speedup", detail)


def _median_acceptance(ok: Sequence[PointStats]) -> float | None:
    rates = [p.acceptance_rate for p in ok if p.acceptance_rate is not None]
    return float(np.median(rates)) if rates else None


def _verdict(inputs: _BandInputs, pts: Sequence[PointStats]) -> Verdict:
    """Gate one candidate in one band (its points: every workload x level of the band)."""
    engine = pts[0]
    reasons: list[Reason] = []
    if engine.engine_hash in inputs.refused:
        reasons.append(Reason("headroom", "refused by the headroom check (does not fit)"))
    reasons += _failed_reasons(pts)
    ok = [p for p in pts if p.n_ok]
    quality, quality_reasons = _quality_gate(ok, inputs)
    reasons += quality_reasons
    reasons += [Reason("slo", v) for v in slo_violations(ok, inputs.promote)]
    speedups = _speedups(ok, inputs)
    reasons += [r for s in speedups if (r := _speedup_reason(s, inputs.promote)) is not None]
    if ok and len(speedups) < len(ok):
        reasons.append(Reason("speedup", f"not measured on {inputs.stage or 'any'} engine starts "
                                         "at every point of the band"))
    return Verdict(
        engine_hash=engine.engine_hash, engine=engine.engine, drafter=engine.drafter,
        method=engine.method, num_speculative_tokens=engine.num_speculative_tokens,
        speedups=tuple(speedups),
        worst=min(speedups, key=lambda s: s.speedup.lo) if speedups else None,
        quality=quality, rejected=tuple(reasons),
        per_position_acceptance=median_curve(p.per_position_acceptance for p in ok),
        acceptance_rate=_median_acceptance(ok),
        ruled_out=_ruled_out(reasons, speedups, inputs.promote),
    )


def _band_verdicts(inputs: _BandInputs, band: Band) -> list[Verdict]:
    """A verdict for every candidate measured in the band where the baseline was too."""
    verdicts = []
    for _, pts in sorted(inputs.candidates.items()):
        in_band = [p for p in pts if p.concurrency in band
                   and any(b.concurrency == p.concurrency and b.workload == p.workload
                           for b in inputs.baseline_points)]
        if in_band:
            verdicts.append(_verdict(inputs, in_band))
    return verdicts


def _band_notes(inputs: _BandInputs, band: Band) -> list[str]:
    """Baseline drift in the band, and SLOs the baseline itself breaks there."""
    notes = [f"the baseline moved {d.ratio - 1:+.1%} between engine starts #{d.seq_from} and "
             f"#{d.seq_to} at {d.workload} c={d.concurrency} (beyond noise, z={d.z:.1f}); "
             "candidates are compared with the baseline interpolated in time, and racing "
             "re-measures what ran between them"
             for d in inputs.drift if d.concurrency in band and d.flagged]
    in_band = [p for p in inputs.baseline_points if p.concurrency in band]
    notes += [f"the baseline itself breaks an SLO ({v}): this band needs capacity, which "
              "speculation alone may not give" for v in slo_violations(in_band, inputs.promote)]
    return notes


def _decide_band(inputs: _BandInputs, band: Band, verdicts: Sequence[Verdict],
                 unresolved: str = "") -> Decision:
    """The winner of one band (or "off"/"unresolved"), every candidate ranked, with reasons."""
    levels = tuple(sorted({p.concurrency for p in inputs.baseline_points if p.concurrency in band}))
    eligible = [v for v in verdicts if v.eligible]
    rejected = sorted((v for v in verdicts if not v.eligible), key=tie_key)
    winner: Verdict | None = None
    if eligible and not unresolved:
        winner, others = pick(eligible, inputs.promote.tie_tolerance)
        reasons = winner_reasons(winner, inputs.promote)
        candidates = (winner, *sorted(others, key=lambda v: -(v.score or 0.0)), *rejected)
    else:
        # off is concluded only when every candidate is ruled out
        still_open = [v for v in verdicts if v.verdict == "open"]
        if still_open and unresolved:  # the race's why (budget, looks): and its leader
            lead = leader(still_open, inputs.promote)
            unresolved += f"; {lead}" if lead else ""
        unresolved = (unresolved or open_why(still_open, inputs.promote)) if still_open else ""
        reasons = (f"unresolved: {unresolved}",) if unresolved else off_reasons(verdicts)
        candidates = (*sorted(eligible, key=tie_key), *rejected)
    return Decision(traffic_class=inputs.traffic_class, band=band, levels=levels,
                    workloads=inputs.workloads, winner=winner, candidates=candidates,
                    reasons=reasons, notes=tuple(_band_notes(inputs, band)),
                    unresolved=unresolved)


def analyze(measurements: Iterable[Measurement], promote: PromoteSpec, *,
            closing_baseline: Iterable[Measurement] = (),
            refused_by_headroom: Collection[str] = frozenset(),
            family: Literal["holm", "none"] = "holm",
            stage: Stage | None = None,
            race: Mapping[tuple[str, str], BandState] | None = None,
            partial: bool = False) -> Analysis:
    """Decide every traffic class and band of a sweep.

    `measurements`: every window of the sweep, the baseline's first start included.
    `closing_baseline`: the baseline's later engine starts (drift, time-local baseline, output
    self-agreement). `refused_by_headroom`: engine hashes the headroom check refused.
    `family="holm"` (a grid sweep) corrects the speedup tests over every class x band x
    candidate; "none" leaves them per comparison (racing's exploration views). `stage` limits the
    speedups to exploration or confirmation starts. `race`: racing's final band states; the
    selected candidate of each band is then judged on its confirmation starts only (on its
    exploration starts where it was confirmed early) and the others by how the race eliminated
    them. `partial`: a race in progress, whose candidates may be
    measured only at the points of the bands they contend in (as with `race`).
    Raises AnalysisError, listing every point to (re-)measure, when the data cannot carry a
    decision."""
    opening, closing_ms = _placed(list(measurements), list(closing_baseline))
    points = aggregate(opening, promote, "open")
    closing = aggregate(closing_ms, promote, "close")
    blocks, slowed = screened_starts((*opening, *closing_ms), promote)
    refused = frozenset(refused_by_headroom)
    problems = [f"closing_baseline holds {p.label}, which is not the baseline"
                for p in closing if not p.is_baseline]
    staged = []
    for traffic_class in sorted({p.traffic_class for p in points}):
        pts = [p for p in points if p.traffic_class == traffic_class]
        base_pts, problem = _class_baseline(traffic_class, pts)
        if problem is not None:
            problems.append(problem)
            continue
        base_pts, cand, overload_notes, problem = _without_overload(
            traffic_class, base_pts, _candidates(pts))
        if problem is not None:
            problems.append(problem)
            continue
        problems += _coverage_problems(base_pts, cand, refused, promote,
                                       race is not None or partial)
        bands, band_problems, band_notes = bands_for(promote, [p.concurrency for p in base_pts])
        band_notes = [*overload_notes, *band_notes]
        problems += band_problems
        if problems:
            continue  # keep checking the other classes, but decide nothing
        close_pts = [p for p in closing if p.engine_hash == base_pts[0].engine_hash
                     and p.traffic_class == traffic_class]
        staged.append(_class_verdicts(traffic_class, bands, band_notes, base_pts, close_pts,
                                      cand, refused, promote, blocks, stage, race))
    if problems:
        raise AnalysisError(problems)
    if family == "holm" and race is None:
        staged = _family_corrected(staged, promote)
    results = [_decide_class(s, race) for s in staged]
    return Analysis(tuple(results), tuple(points), tuple(closing),
                    promote.model_dump(mode="json"), tuple(sorted(refused)), tuple(slowed))


def _class_baseline(traffic_class: str, pts: Sequence[PointStats]
                    ) -> tuple[list[PointStats], str | None]:
    """The class's baseline points, or why there is no single baseline to compare with."""
    base_pts = [p for p in pts if p.is_baseline]
    if not base_pts:
        return [], (f"traffic class {traffic_class}: the no-speculation baseline was not "
                    "measured; measure it (sweep.include_baseline: true)")
    base_hashes = sorted({p.engine_hash for p in base_pts})
    if len(base_hashes) > 1:
        return [], (f"traffic class {traffic_class}: {len(base_hashes)} baseline engines "
                    f"({', '.join(base_hashes)}); expected one")
    return base_pts, None


def _without_overload(traffic_class: str, base_pts: Sequence[PointStats],
                      cand: Mapping[str, list[PointStats]]
                      ) -> tuple[list[PointStats], dict[str, list[PointStats]], list[str],
                                 str | None]:
    """The class's points without those the baseline could not keep up with (overload: its
    latency there is how long the queue grew, not a score), with a note for each; a candidate
    overloaded where the baseline was not keeps its point, and fails it. A problem where every
    point overloads the baseline."""
    over = {(p.workload, p.concurrency) for p in base_pts
            if not p.n_ok and "overload" in p.failures}
    if not over:
        return list(base_pts), dict(cand), [], None
    kept = [p for p in base_pts if (p.workload, p.concurrency) not in over]
    where = ", ".join(f"{w} c={c}" for w, c in sorted(over))
    if not kept:
        return [], {}, [], (f"traffic class {traffic_class}: the baseline does not keep up at "
                            f"any point ({where}: overload, the queue grew through every "
                            "window); offer lower request rates (arrival.request_rate)")
    keeps_up = sorted({p.engine for ps in cand.values() for p in ps
                       if (p.workload, p.concurrency) in over and p.n_ok})
    note = (f"overload: the baseline does not keep up at {where} (the queue grew through its "
            "windows); not scored there")
    if keeps_up:
        note += f"; {', '.join(keeps_up)} kept up there (more capacity, not a measured latency)"
    return kept, {h: [p for p in ps if (p.workload, p.concurrency) not in over]
                  for h, ps in cand.items()}, [note], None


def _candidates(pts: Sequence[PointStats]) -> dict[str, list[PointStats]]:
    """Speculative points by engine hash."""
    cand: dict[str, list[PointStats]] = defaultdict(list)
    for p in pts:
        if not p.is_baseline:
            cand[p.engine_hash].append(p)
    return cand


def _coverage_problems(base_pts: Sequence[PointStats], cand: Mapping[str, list[PointStats]],
                       refused: Collection[str], promote: PromoteSpec, raced: bool = False
                       ) -> list[str]:
    """Points with too few repeats, and points one side measured but the other did not (a race
    measures a candidate only where it still contends, so there only the baseline must cover)."""
    problems = [_too_few(p, promote, "the baseline") for p in base_pts
                if p.n_ok < promote.min_repeats]
    grid = sorted({(p.workload, p.concurrency) for p in base_pts})
    for engine_hash, cps in sorted(cand.items()):
        if engine_hash in refused:
            continue
        have = {(p.workload, p.concurrency): p for p in cps}
        for w, c in grid:
            point = have.get((w, c))
            if point is None and raced:
                continue
            if point is None:
                problems.append(f"{cps[0].engine} ({engine_hash}) has no window at {w} c={c}; "
                                f"measure it ({promote.min_repeats} repeats)")
            elif 0 < point.n_ok < promote.min_repeats:
                problems.append(_too_few(point, promote, point.engine))
        for w, c in sorted(set(have) - set(grid)):
            problems.append(f"the baseline has no window at {w} c={c}, where {cps[0].engine} "
                            "was measured; measure the baseline there")
    return problems


def _too_few(p: PointStats, promote: PromoteSpec, who: str) -> str:
    failed = f" ({', '.join(f'{r} x{n}' for r, n in p.failures.items())} excluded)" \
        if p.failures else ""
    return (f"{who} ({p.engine_hash}) at {p.workload} c={p.concurrency}: {p.n_ok} usable "
            f"repeat{'s' if p.n_ok != 1 else ''}{failed}; need >= {promote.min_repeats}: "
            "re-measure this point")


def _decide_class(staged: _ClassVerdicts,
                  race: Mapping[tuple[str, str], BandState] | None) -> ClassResult:
    """Every band's decision and the deployment of one class."""
    inputs, promote = staged.inputs, staged.inputs.promote
    decisions = []
    for band, verdicts in zip(staged.bands, staged.verdicts, strict=True):
        state = race.get((inputs.traffic_class, band.label)) if race is not None else None
        unresolved = state.why if state is not None and state.status == "unresolved" else ""
        d = _decide_band(inputs, band, verdicts, unresolved)
        if d.winner is not None and state is not None and state.evidence == "explore":
            d = dataclasses.replace(d, reasons=(*d.reasons, (
                f"{state.why}; its interval is on the exploration starts it was selected on, "
                "high by the selection, which the test paid for (x candidates)")))
        decisions.append(d)
    explicit = bool(promote.concurrency_bands)
    deployment, dep_notes = class_deployment(inputs.traffic_class, decisions,
                                             inputs.baseline_points[0],
                                             staged.bands[-1].hi if explicit else None,
                                             promote.tie_tolerance)
    return ClassResult(inputs.traffic_class, staged.bands, tuple(decisions), deployment,
                       inputs.drift, tuple([*staged.notes, *dep_notes]),
                       objective_label(promote, inputs.traffic_class), _capacities(inputs))


def _capacities(inputs: _BandInputs) -> tuple[tuple[str, Estimate], ...]:
    """Each engine's capacity at its lowest point (a class decided on capacity; else none)."""
    if inputs.promote.objective_for(inputs.traffic_class) != "capacity":
        return ()
    out = []
    for pts in (inputs.baseline_points, *inputs.candidates.values()):
        found = [p.throughput for p in pts if p.throughput is not None]
        if found:
            out.append((pts[0].engine_hash, min(found, key=lambda e: e.value)))
    return tuple(out)


def _placed(opening: list[Measurement], closing: list[Measurement]
            ) -> tuple[list[Measurement], list[Measurement]]:
    """Windows with a run-order position. Records without one (`seq` -1) are placed as a grid
    sweep runs them: the baseline first, candidates in hash order, the closing baseline last
    (as the baseline's next engine start)."""
    hashes = sorted({m.key.engine_hash for m in opening if m.method != BASELINE_METHOD})
    order = {h: i + 1 for i, h in enumerate(hashes)}
    last = len(hashes) + 1
    first_start = {m.key.engine_hash: m.key.start for m in opening}

    def place(m: Measurement, is_closing: bool) -> Measurement:
        if m.seq >= 0:
            return m
        if is_closing:
            start = max(m.key.start, first_start.get(m.key.engine_hash, 0) + 1)
            return dataclasses.replace(m, seq=last, key=dataclasses.replace(m.key, start=start))
        return dataclasses.replace(m, seq=order.get(m.key.engine_hash, 0))

    return [place(m, False) for m in opening], [place(m, True) for m in closing]


@dataclass(frozen=True)
class _ClassVerdicts:
    """One class's verdicts per band, before the family correction and the pick."""

    inputs: _BandInputs
    bands: tuple[Band, ...]
    verdicts: tuple[tuple[Verdict, ...], ...]
    """Per band."""
    notes: tuple[str, ...]


def _class_verdicts(traffic_class: str, bands: Sequence[Band], band_notes: Sequence[str],
                    base_pts: Sequence[PointStats], close_pts: Sequence[PointStats],
                    cand: Mapping[str, list[PointStats]], refused: Collection[str],
                    promote: PromoteSpec, blocks: Mapping[tuple[str, int], list[StartWindows]],
                    stage: Stage | None,
                    race: Mapping[tuple[str, str], BandState] | None) -> _ClassVerdicts:
    """StartNoise, drift and quality references of one class, and every candidate's verdicts."""
    baseline_hash = base_pts[0].engine_hash
    workloads = tuple(sorted({p.workload for p in base_pts}))
    mine = {k: v for k, v in blocks.items() if k[0] in workloads}
    noise = {k: start_noise(v, baseline_hash) for k, v in mine.items()}
    drift = [Drift(w, c, d.seq_from, d.seq_to, d.ratio, d.z, d.flagged)
             for (w, c), bs in sorted(mine.items())
             for d in drift_steps([b for b in bs if b.engine_hash == baseline_hash],
                                         noise[(w, c)])]
    notes = list(band_notes)
    if not any(b.engine_hash == baseline_hash and b.start > 0 for bs in mine.values()
               for b in bs):
        notes.append("the baseline was measured on one engine start only: drift unchecked")
    if not all(n.replicated for n in noise.values()):
        notes.append("no engine config was started twice at some points: their intervals treat "
                     "windows as independent (measure the baseline again to fix this)")
    refs, missing = quality_references([*base_pts, *close_pts])
    inputs = _BandInputs(
        traffic_class=traffic_class, workloads=workloads, candidates=cand,
        baseline_points=tuple(base_pts), baseline_hash=baseline_hash, blocks=mine, noise=noise,
        refs=refs, missing_refs=missing, refused=refused, drift=tuple(drift), promote=promote,
        stage=stage)
    verdicts = []
    for band in bands:
        state = race.get((traffic_class, band.label)) if race is not None else None
        verdicts.append(tuple(_raced(inputs, band, state) if race is not None
                              else _band_verdicts(inputs, band)))
    return _ClassVerdicts(inputs, tuple(bands), tuple(verdicts), tuple(notes))


def _raced(inputs: _BandInputs, band: Band, state: BandState | None) -> list[Verdict]:
    """A racing sweep's verdicts in one band: the selected candidate judged on its confirmation
    starts only (on its exploration starts when the race confirmed it there, a clear case),
    every other candidate on all its data with how the race dropped it."""
    selected = state.contenders[0] if state is not None and state.status in (
        "promote", "confirming", "unresolved") and len(state.contenders) == 1 else None
    confirm_inputs = dataclasses.replace(
        inputs, stage=state.evidence if state is not None and state.status == "promote"
        else "confirm")
    why = dict(state.dropped) if state is not None else {}
    out = []
    for v in _band_verdicts(inputs, band):
        if v.engine_hash == selected and state is not None:
            pts = [p for p in inputs.candidates[v.engine_hash] if p.concurrency in band]
            cv = _verdict(confirm_inputs, pts)
            if state.status != "promote" and cv.eligible:
                cv = dataclasses.replace(cv, rejected=(Reason("race", state.why),))
            # winning is shown on fresh starts; ruling out may use every start (selecting the
            # best only makes its estimate high, so a rule-out on all of them stays valid)
            out.append(dataclasses.replace(cv, ruled_out=cv.ruled_out or v.ruled_out))
        elif v.eligible or v.engine_hash in why:
            reason = why.get(v.engine_hash) or "not selected by the race"
            ruled = v.ruled_out or (reason if state is not None
                                    and v.engine_hash in state.ruled_out else "")
            out.append(dataclasses.replace(v, rejected=(*v.rejected, Reason("race", reason)),
                                           ruled_out=ruled))
        else:
            out.append(v)
    return out


def _family_corrected(staged: Sequence[_ClassVerdicts], promote: PromoteSpec
                      ) -> list[_ClassVerdicts]:
    """Holm over the deployment's whole family: every class x band x measured candidate.
    A candidate whose band clears 1 + margin per comparison but not after the correction is
    rejected by the "family" gate."""
    alpha = (1 - promote.confidence) / 2
    family = [(i, j, k) for i, s in enumerate(staged) for j, vs in enumerate(s.verdicts)
              for k, v in enumerate(vs) if v.speedups]
    pvals = [band_p_value(staged[i].verdicts[j][k]) for i, j, k in family]
    rejected = holm(pvals, alpha)
    out = [[list(vs) for vs in s.verdicts] for s in staged]
    for (i, j, k), p, ok in zip(family, pvals, rejected, strict=True):
        v = out[i][j][k]
        if not ok and v.eligible:
            out[i][j][k] = dataclasses.replace(v, rejected=(Reason(
                "family", f"p = {p:.2g} for speedup <= {1 + promote.margin:.3f} does not pass "
                f"Holm's correction over the deployment's {len(family)} comparisons "
                f"(alpha {alpha:.3g})"),))
    return [dataclasses.replace(s, verdicts=tuple(tuple(vs) for vs in o))
            for s, o in zip(staged, out, strict=True)]
