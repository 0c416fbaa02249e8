"""What a finished round changes for each band: candidates dropped, a winner selected or
confirmed, and the probe round's predictions for the series it held back."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

from specflow.decision.choose import analyze, gate_reasons
from specflow.decision.model import Analysis, Verdict
from specflow.decision.race import BandState, ContenderEstimate
from specflow.decision.wording import band_p_value, settle_phrase, starts_needed
from specflow.records.measurement import Measurement
from specflow.search import predict
from specflow.search.budget import clear_leader, dominated
from specflow.search.plan import (
    BandKey,
    Shape,
    confirm_alpha,
    early_alpha,
    early_looks,
    race_rules,
    split_baseline,
)
from specflow.spec.schema import PromoteSpec
from specflow.stats.critical import z_upper
from specflow.stats.multiplicity import holm
from specflow.stats.replicates import Stage


def _band_estimates(result: Analysis) -> dict[BandKey, dict[str, Verdict]]:
    return {(r.traffic_class, d.band.label): {v.engine_hash: v for v in d.candidates}
            for r in result.classes for d in r.decisions}


def _interval(v: Verdict) -> ContenderEstimate | None:
    if not v.speedups:
        return None
    w = min(v.speedups, key=lambda s: s.speedup.lo)
    return ContenderEstimate(w.speedup.value, w.speedup.lo, min(s.speedup.hi for s in v.speedups),
                           f"{w.workload} c={w.concurrency}", w.starts)


def _gate_reasons(v: Verdict) -> str:
    return gate_reasons(v.rejected)


def _drift_protected(result: Analysis, key: BandKey, verdicts: Mapping[str, object],
                     measurements: Sequence[Measurement]) -> set[str]:
    """Candidates with a start between two baseline starts that moved beyond noise."""
    r = result.result(key[0])
    steps = [(d.seq_from, d.seq_to) for d in r.drift if d.flagged
             and any(d.concurrency in dec.band for dec in r.decisions if dec.band.label == key[1])]
    return {m.key.engine_hash for m in measurements if m.key.engine_hash in verdicts
            and any(a < m.seq < b for a, b in steps)}


def after_round(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                 states: dict[BandKey, BandState], data: Sequence[Measurement],
                 refused: frozenset[str], stage: Stage, index: int
                 ) -> dict[BandKey, BandState]:
    """The band states after an exploration or a confirmation round."""
    opening, later = split_baseline(data, shape.baseline)
    result = analyze(opening, race_rules(promote, shape.budget), closing_baseline=later,
                     refused_by_headroom=refused, family="none", stage=stage, partial=True)
    verdicts = _band_estimates(result)
    out = dict(states)
    if stage == "explore":
        protected: dict[BandKey, set[str]] = {}
        for key, st in states.items():
            if st.status == "exploring":
                protected[key] = _drift_protected(result, key, verdicts.get(key, {}), data)
                out[key] = _explore_step(st, verdicts.get(key, {}), protected[key], promote,
                                         index, shape.budget.max_rounds)
        if 1 <= index < 1 + early_looks(shape.budget):
            out = _confirm_early(shape, promote, bands, states, out, verdicts, protected)
        return out
    out = _confirm_step(shape, promote, states, verdicts)
    if open_after_exploring(states):  # ruling out may use every start, exploration's too
        every = analyze(opening, race_rules(promote, shape.budget), closing_baseline=later,
                        refused_by_headroom=refused, family="none", partial=True)
        out = _rejudge_open(states, out, _band_estimates(every))
    return out


def open_after_exploring(states: Mapping[BandKey, BandState]) -> dict[BandKey, BandState]:
    """The bands `BandState.left_open`: a confirmation's starts measure them too."""
    return {k: st for k, st in states.items() if st.left_open}


def _rejudge_open(before: Mapping[BandKey, BandState], after: dict[BandKey, BandState],
                  verdicts: Mapping[BandKey, Mapping[str, Verdict]]) -> dict[BandKey, BandState]:
    """A band left open by the exploration concludes off once the confirmation's further starts
    rule out every contender it still had (at this look's futility share)."""
    for k, st in open_after_exploring(before).items():
        vs = verdicts.get(k, {})
        why = {h: v.ruled_out for h in st.contenders if (v := vs.get(h)) is not None
               and v.ruled_out}
        earlier = {h for h, _ in st.dropped}
        if len(why) == len(st.contenders) and earlier <= set(st.ruled_out):
            after[k] = replace(st, status="off", contenders=(), ruled_out=(
                *st.ruled_out, *st.contenders), dropped=(*st.dropped, *(
                    (h, f"confirmation round: ruled out: {w}") for h, w in why.items())),
                why="every candidate is ruled out")
    return after


def after_probes(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                  states: dict[BandKey, BandState], data: Sequence[Measurement],
                  refused: frozenset[str], held: frozenset[str]
                  ) -> tuple[dict[BandKey, BandState], bool]:
    """After an adaptive search's probe round: per band, predict every held-back candidate from
    its probe and add those that can still win as contenders (measured next round, beside the
    probes); drop the rest with their prediction. A chain check's config is predicted so in the
    bands it was not measured in (`Shape.check_points`), and a series whose check missed at any
    point is measured in every band. A band with nothing to add takes an ordinary exploration
    step. Returns the states and whether any band added a contender."""
    opening, later = split_baseline(data, shape.baseline)
    result = analyze(opening, race_rules(promote, shape.budget), closing_baseline=later,
                     refused_by_headroom=refused, family="none", stage="explore", partial=True)
    verdicts = _band_estimates(result)
    windows: dict[tuple[str, str, int], list[Measurement]] = defaultdict(list)
    for m in data:
        windows[(m.key.engine_hash, m.key.workload, m.key.concurrency)].append(m)
    threshold = 1 + promote.margin
    z = z_upper((1 - promote.confidence) / 2)
    # a drafter is a chain or not whatever the band: its check at every point it was measured
    checks = _chain_checks(shape.chains, windows, shape.points, z)
    broken = {probe for probe, cs in checks.items() if not all(c.holds for c in cs)}
    out = dict(states)
    added = False
    for key, st in states.items():
        if st.status != "exploring":
            continue
        vs = verdicts.get(key, {})
        # held back, and the chain checks not measured in this band: predicted here
        band_held = held | {h for h in st.contenders if h in shape.chains and h not in vs}
        measured = {h: iv for h in st.contenders if (v := vs.get(h)) is not None
                    and not _gate_reasons(v) and (iv := _interval(v)) is not None}
        best_lo = max((iv.lo for iv in measured.values()), default=-math.inf)
        pending, pruned = [], []
        predictable = [h for h in sorted(band_held, key=shape.candidates.index)
                       if shape.chains[h].probe not in broken]
        outranked = _outranked(predictable, shape.chains, vs, windows, bands[key], z,
                               promote.tie_tolerance)
        for h in sorted(band_held, key=shape.candidates.index):
            ch = shape.chains[h]
            iv = predicted_ratios(ch, vs.get(ch.probe), windows, bands[key], z,
                            shape.kv_capacity.get(h))
            if iv is None or ch.probe in broken:
                pending.append(h)  # nothing to predict from, or not a chain: measure it
            elif iv.hi < threshold or iv.hi < best_lo:
                bound = threshold if iv.hi < threshold else best_lo
                pruned.append((h, f"round 0: ruled out: predicted {iv.value:.3f} "
                                  f"[{iv.lo:.3f}, {iv.hi:.3f}] at {iv.point} from "
                                  f"{vs[ch.probe].engine}: cannot win (upper bound < "
                                  f"{bound:.3f}); not started"))
            elif h in outranked:
                pruned.append((h, f"round 0: ruled out: {outranked[h]}; not started"))
            else:
                pending.append(h)
        ruled = (*st.ruled_out, *(h for h, _ in pruned))
        if pending:
            added = True
            unmeasured = [h for h in st.contenders if h not in measured and h not in band_held]
            failing = {h: gates for h in unmeasured if h in vs and (gates := _gate_reasons(vs[h]))}
            gated = [(h, f"round 0: ruled out: {failing[h]}" if h in failing
                      else "round 0: not measured") for h in unmeasured]
            keep = tuple(h for h in shape.candidates if h in measured or h in pending)
            out[key] = replace(st, contenders=keep, dropped=(*st.dropped, *gated, *pruned),
                               estimates=measured, ruled_out=(*ruled, *failing),
                               notes=(*st.notes, *_check_notes(checks, broken)))
        else:
            stepped = _explore_step(replace(st, contenders=tuple(
                                                h for h in st.contenders if h not in band_held),
                                            dropped=(*st.dropped, *pruned), ruled_out=ruled,
                                            notes=(*st.notes, *_check_notes(checks, broken))),
                                    vs,
                                    _drift_protected(result, key, vs, data), promote, 0,
                                    shape.budget.max_rounds)
            out[key] = stepped
    return out, added


def _chain_checks(chains: Mapping[str, predict.Chain],
                  windows: Mapping[tuple[str, str, int], Sequence[Measurement]],
                  points: Sequence[tuple[str, int]], z: float
                  ) -> dict[str, list[predict.ChainCheck]]:
    """Per probe (engine hash), its series' chain check at every one of `points` where both the
    probe and the check were measured."""
    out: dict[str, list[predict.ChainCheck]] = {}
    for h, ch in chains.items():
        if not ch.check:
            continue
        for w, c in points:
            probe = predict.acceptance([m for m in windows.get((ch.probe, w, c), ())
                                        if m.stage != "schedule"])
            got = predict.acceptance(windows.get((h, w, c), ()))
            if probe is not None and got is not None and (
                    check := predict.check_chain(probe, got, ch.n, ch.probe_n, z)) is not None:
                out.setdefault(ch.probe, []).append(check)
    return out


def _check_notes(checks: Mapping[str, Sequence[predict.ChainCheck]], broken: set[str]
                 ) -> tuple[tuple[str, str], ...]:
    """(probe hash, what its series' chain check found and what the search did about it)."""
    out = []
    for probe, cs in checks.items():
        worst = max(cs, key=lambda c: abs(c.measured - c.predicted) - c.allowed)
        then = ("not a chain: its other N are measured, not predicted" if probe in broken
                else "its other N are predicted from the probe")
        out.append((probe, f"{worst.text()}; {then}"))
    return tuple(out)


def predicted_ratios(ch: predict.Chain, probe: Verdict | None,
               windows: Mapping[tuple[str, str, int], Sequence[Measurement]],
               points: Sequence[tuple[str, int]], z: float, kv_capacity: int | None = None
               ) -> ContenderEstimate | None:
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
    return ContenderEstimate(preds[worst].value, preds[worst].lo,
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
               verdicts: Mapping[str, Verdict],
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


def _explore_step(st: BandState, verdicts: Mapping[str, Verdict],
                  protected: set[str], promote: PromoteSpec, index: int, max_rounds: int
                  ) -> BandState:
    """Rule out what cannot be the band's answer (on a gate at once; a gain of 2 x margin
    excluded at this look's futility share, or outranked, after two engine starts); select a
    winner when one is left, leads clearly or is already above the margin."""
    threshold = 1 + promote.margin
    dropped = list(st.dropped)
    ruled = list(st.ruled_out)
    estimates: dict[str, ContenderEstimate] = {}
    for h in st.contenders:
        v = verdicts.get(h)
        gates = _gate_reasons(v) if v is not None else ""
        iv = _interval(v) if v is not None else None
        if gates:
            dropped.append((h, f"round {index}: ruled out: {gates}"))
            ruled.append(h)
        elif iv is None:
            dropped.append((h, f"round {index}: no speedup measured"))
        else:
            estimates[h] = iv
    # a contender gets two engine starts before its speedup can rule it out: one start's
    # effect (shared by every band) must not decide
    settled = {h for h in estimates if h not in protected and estimates[h].starts >= 2}
    why_out = {h: f"ruled out: {verdicts[h].ruled_out}" for h in settled
               if verdicts[h].ruled_out}
    why_out.update({h: f"ruled out: {why}" for h, why in dominated(
        {h: estimates[h] for h in estimates if h not in why_out}).items() if h in settled})
    for h in (h for h in st.contenders if h in why_out):
        dropped.append((h, f"round {index}: {why_out[h]}"))
        ruled.append(h)
        del estimates[h]
    contenders = tuple(h for h in st.contenders if h in estimates)
    now = replace(st, contenders=contenders, dropped=tuple(dropped), estimates=estimates,
                  ruled_out=tuple(ruled))
    if not contenders:
        if len(ruled) == len(dropped):
            return replace(now, status="off", why="every candidate is ruled out")
        return replace(now, status="unresolved", why="no contender left to measure")
    leader = clear_leader(estimates) if len(contenders) > 1 else contenders[0]
    best = max(contenders, key=lambda h: estimates[h].lo)
    if leader is None and estimates[best].lo >= threshold:
        # Already above the margin on exploration data: confirmation (fresh starts, corrected)
        # decides; a lucky pick fails there and costs power, never a false promotion.
        leader = best
    if protected & set(contenders) and index + 1 < max_rounds:
        leader = None  # nothing is selected on data a baseline step may have distorted
    if leader is None and index + 1 >= max_rounds:
        # the last round selects the best lower bound among the contenders whose estimate
        # clears the margin: a narrow interval below it must not hide a wide one above it (the
        # confirmation on fresh starts decides)
        clearing = [h for h in contenders if estimates[h].value >= threshold]
        leader = max(clearing, key=lambda h: estimates[h].lo) if clearing else best
    if leader is not None and estimates[leader].value >= threshold:
        name = verdicts[leader].engine if leader in verdicts else leader[:8]
        others = tuple((h, f"round {index}: {name} selected instead")
                       for h in contenders if h != leader)
        return replace(st, status="confirming", contenders=(leader,),
                       dropped=(*dropped, *others), estimates=estimates, ruled_out=tuple(ruled),
                       why=f"selected in round {index}: speedup {estimates[leader].value:.3f} "
                           f"[{estimates[leader].lo:.3f}, {estimates[leader].hi:.3f}] on "
                           "exploration data")
    if index + 1 >= max_rounds:
        rounds_run = f"{max_rounds} exploration round{'s' * (max_rounds != 1)}"
        return replace(now, status="unresolved", why=f"after {rounds_run} no contender's "
                       f"estimate clears {threshold:.3f}")
    return now


def _early_p(v: Verdict | None, points: int) -> float | None:
    """A contender's band p-value (speedup <= 1 + margin, its worst point) on its exploration
    starts, where it may confirm it early: no gate rejects it, every point of the band is
    measured on at least two of its starts, with the start-to-start variance known there."""
    if v is None or _gate_reasons(v) or len(v.speedups) < points:
        return None
    if any(s.starts < 2 or not s.replicated for s in v.speedups):
        return None
    return band_p_value(v)


def _confirm_early(shape: Shape, promote: PromoteSpec, bands: Mapping[BandKey, tuple],
                   before: Mapping[BandKey, BandState], after: dict[BandKey, BandState],
                   verdicts: Mapping[BandKey, Mapping[str, Verdict]],
                   protected: Mapping[BandKey, set[str]]) -> dict[BandKey, BandState]:
    """A clear winner confirmed on its exploration starts, with no confirmation look: a band
    that selects its winner in this round, on at least two of the winner's starts at every
    point, confirms it when its band p-value multiplied by the band's candidates (the selection
    among them: Bonferroni's bound on every intersection of a closed test) passes Holm at this
    look's share of the error (`early_alpha`) over every band of the race, a band not tested
    entering with p = 1 (a family fixed before the data: one chosen by which bands look
    convincing would make Holm too lenient). Only a selecting band can pass: a p-value that
    small puts the contender's lower bound above the margin, which selects it. A band a
    baseline step may have distorted waits."""
    alpha = early_alpha(promote, shape.budget)
    tested: dict[BandKey, tuple[str, float, float, int]] = {}
    for key, st in before.items():
        now = after[key]
        if st.status != "exploring" or now.status != "confirming":
            continue
        if protected.get(key, set()) & set(st.contenders):
            continue
        h = now.contenders[0]
        p = _early_p(verdicts.get(key, {}).get(h), len(bands[key]))
        if p is not None:
            m = len(set(st.contenders) | {g for g, _ in st.dropped})
            tested[key] = (h, p, min(1.0, m * p), m)
    keys = list(before)
    passed = holm([tested[k][2] if k in tested else 1.0 for k in keys], alpha)
    for key, ok in zip(keys, passed, strict=True):
        if not ok or key not in tested:
            continue
        h, p, adjusted, m = tested[key]
        now = after[key]
        after[key] = replace(
            now, status="promote", evidence="explore",
            estimates={g: iv for g, iv in now.estimates.items() if g == h},
            why=f"confirmed on its exploration engine starts (p = {p:.2g} x {m} candidates "
                f"= {adjusted:.2g} <= Holm's threshold over the race's {len(keys)} bands at "
                f"alpha {alpha:.3g}, this look's share of the error)")
    return after


def _confirm_step(shape: Shape, promote: PromoteSpec, states: Mapping[BandKey, BandState],
                  verdicts: Mapping[BandKey, Mapping[str, Verdict]]
                  ) -> dict[BandKey, BandState]:
    """Holm over the bands being confirmed, at `confirm_alpha` (one look's share of what the
    early looks leave), on confirmation data only.

    The family is fixed by the confirmations, not by their outcomes: a band an earlier look
    failed (ruled out, or left unresolved) stays in it with p = 1, and only a band confirmed
    leaves it (Holm's step-down). Dropping the failed ones would let a later look test fewer
    bands because of what the earlier one measured, a family chosen by the data it tests:
    with the true nulls not confirmed so far all still in it, each look's false confirmation
    stays within its alpha, and the looks within their sum."""
    out = dict(states)
    confirming = [k for k, st in states.items() if st.status == "confirming"]
    failed = [k for k, st in states.items() if st.looks and st.status in ("off", "unresolved")]
    alpha = confirm_alpha(promote, shape.budget)
    pvals, gates = [], []
    for k in confirming:
        v = verdicts.get(k, {}).get(states[k].contenders[0])
        pvals.append(band_p_value(v) if v is not None else 1.0)
        gates.append(_gate_reasons(v) if v is not None else "not measured on confirmation")
    family = len(confirming) + len(failed)
    passed = holm([*pvals, *[1.0] * len(failed)], alpha)[:len(confirming)]
    for k, p, ok, gate in zip(confirming, pvals, passed, gates, strict=True):
        st = states[k]
        looks = st.looks + 1
        v = verdicts.get(k, {}).get(st.contenders[0])
        iv = _interval(v) if v is not None else None
        ests = {st.contenders[0]: iv} if iv is not None else {}
        if ok and not gate:
            out[k] = replace(st, status="promote", looks=looks, estimates=ests,
                             why=f"confirmed on fresh engine starts (p = {p:.2g} <= Holm's "
                                 f"threshold over {family} bands at alpha {alpha:.3g})")
        elif v is not None and v.ruled_out:
            out[k] = replace(st, status="off", looks=looks, estimates=ests,
                             ruled_out=(*st.ruled_out, st.contenders[0]),
                             why=f"failed confirmation: ruled out: {v.ruled_out}")
        elif gate or (iv is not None and iv.hi < 1 + promote.margin):
            out[k] = replace(st, status="unresolved", looks=looks, estimates=ests,
                             why=f"failed confirmation ({gate or 'upper bound below the margin'})"
                                 " without being ruled out")
        elif looks >= shape.budget.confirm_looks:
            out[k] = replace(st, status="unresolved", looks=looks, estimates=ests,
                             why=f"not confirmed after {looks} look{'s' * (looks != 1)} "
                                 f"(p = {p:.2g}); " + _settle_cost(v, promote))
        else:
            out[k] = replace(st, looks=looks, estimates=ests)
    return out


def _settle_cost(v: Verdict | None, promote: PromoteSpec) -> str:
    if v is None or v.worst is None:
        return "measure it again"
    need = starts_needed(v.worst, 1 + promote.margin, promote.confidence)
    if need is None:
        return "its estimate is below the margin"
    return settle_phrase(need, "it", "confirmation engine starts")
