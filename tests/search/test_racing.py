"""Racing and its statistics on simulated sweeps: the real planner (`rounds.replay`) and the real
decision (`analysis.analyze`) on synthetic windows (`specflow.search.simulate`)."""

from __future__ import annotations

import dataclasses
import math
import re
import types

import numpy as np
import pytest

from specflow.champions import promote
from specflow.decision.aggregate import to_measure_again
from specflow.decision.choose import analyze
from specflow.decision.model import Analysis
from specflow.decision.race import BandState
from specflow.records.measurement import AGAIN, Measurement
from specflow.results.console import round_lines
from specflow.results.report import rounds_table, write_report
from specflow.search import advance, rounds, simulate
from specflow.search.plan import (
    confirm_alpha,
    early_alpha,
    early_looks,
    final_rules,
    look_futility,
)
from specflow.search.schedules import measured_schedules
from specflow.spec.compile import with_schedule
from specflow.spec.schema import BudgetSpec, PromoteSpec
from specflow.stats import replicates
from tests.builders import engine

FAST = PromoteSpec(bootstrap_samples=100)


def _decide(scn: simulate.Scenario, prog: rounds.SearchState, ms: list[Measurement],
            rules: PromoteSpec = FAST) -> Analysis:
    """The final decision, as `steps.decide` makes it."""
    later = [m for m in ms if m.key.engine_hash == scn.shape.baseline and m.key.start > 0]
    opening = [m for m in ms if m not in later]
    if scn.shape.design == "race":
        return analyze(opening, final_rules(rules), closing_baseline=later,
                       race=dict(prog.states))
    return analyze(opening, rules, closing_baseline=later)


def _winners(result: Analysis) -> set[str]:
    return {d.winner.engine_hash for r in result.classes for d in r.decisions if d.winner}


# --------------------------------------------------------------------------------------------
# Racing


def test_a_simulated_racing_start_measures_its_slowed_windows_once_more() -> None:
    """As a racing sweep's start does (`steps.measure`), a simulated one with 5% of windows
    slowed by outside load measures each window the screen calls slowed once more before its
    engine stops: numbered AGAIN + its repeat, on the same start, after its planned windows,
    paid for in engine-seconds; the final decision names them as measured again. Without
    outside load nothing is measured again (the other noise models keep their streams)."""
    scn = simulate.scenario("race", gains={3: 1.10})
    noise = simulate.NoiseModel(cv=0.03, start_sd=0.01, hit=0.05)
    prog, ms = simulate.run_sweep(scn, noise, FAST, 0)
    again = [m for m in ms if m.key.repeat >= AGAIN]
    first = {m.key.id: m for m in ms if m.key.repeat < AGAIN}
    assert len(again) >= 10
    for m in again:
        origin = first[dataclasses.replace(m.key, repeat=m.key.repeat - AGAIN).id]
        planned = max(x.engine_s for x in first.values() if (x.key.engine_hash, x.key.start)
                      == (m.key.engine_hash, m.key.start))
        assert m.seq == origin.seq and m.stage == origin.stage and m.engine_s > planned
    assert len({m.key.id for m in again}) == len(again)
    result = _decide(scn, prog, ms)
    named = {(w.engine_hash, w.workload, w.concurrency, w.start, w.again) for w in result.slowed}
    redone = {(m.key.engine_hash, m.key.workload, m.key.concurrency, m.key.start, m.key.repeat)
              for m in again}
    assert len(redone & named) >= 0.9 * len(redone)
    assert _winners(result) == {"c3"}
    quiet = simulate.run_sweep(scn, dataclasses.replace(noise, hit=0.0), FAST, 0)[1]
    assert all(m.key.repeat < AGAIN for m in quiet)


def test_a_a_family_of_eight_candidates_and_four_bands_promotes_nothing() -> None:
    """8 candidates x 2 classes x 2 bands, all equal to the baseline, noise CV 10% with a 3%
    engine-start effect and a 5% drift: neither design promotes anything at these seeds."""
    noise = simulate.NoiseModel(cv=0.10, start_sd=0.03, drift=0.05)
    for design in ("race", "grid"):
        scn = simulate.scenario(design, budget=BudgetSpec(engine_seconds=4000))
        for seed in range(6):
            prog, ms = simulate.run_sweep(scn, noise, FAST, seed)
            assert _winners(_decide(scn, prog, ms)) == set(), (design, seed)


def test_a_true_gain_is_selected_then_confirmed_on_fresh_starts_or_early_when_clear() -> None:
    """A true +25% at CV 3%. Three bands select c3 on its one exploration start and confirm it
    on fresh starts alone. The fourth keeps exploring; on c3's second start its p-value, times
    the band's 8 candidates (the selection among them), passes the exploration look's share of
    the error, and it is confirmed there with no confirmation look: judged on its exploration
    starts. With `early_share` 0 every band is confirmed on fresh starts."""
    scn = simulate.scenario("race", gains={3: 1.25})
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.03, start_sd=0.01), FAST, 1)
    stages = [r.stage for r in prog.rounds]
    assert stages[0] == "explore" and stages[-1] == "confirm"
    assert {b.status for b in prog.states.values()} == {"promote"}
    early = {k for k, b in prog.states.items() if b.evidence == "explore"}
    assert early == {("class0", "c8")}, prog.states
    why = prog.states[("class0", "c8")].why
    assert why.startswith("confirmed on its exploration engine starts (p = ") and \
        "x 8 candidates" in why, why
    result = _decide(scn, prog, ms)
    assert _winners(result) == {"c3"}
    c3 = {(m.key.start, m.stage) for m in ms if m.key.engine_hash == "c3"}
    for r in result.classes:
        for d in r.decisions:
            stage = prog.states[(r.traffic_class, d.band.label)].evidence
            # judged on its confirmation starts only (fresh ones, with fresh baseline starts
            # around), or on its exploration starts where it was confirmed early
            assert d.winner.worst.starts == sum(1 for _, s in c3 if s == stage) >= 2, stage
            # the decision says how it was shown, in the console's, report's and MLflow's words
            assert any(r.startswith("confirmed on its exploration engine starts")
                       for r in d.reasons) == (stage == "explore"), d.reasons
    # the rounds spent engine starts only on what could still win
    assert len({s.engine_hash for s in prog.rounds[0].starts}) == 9
    assert all(s.engine_hash in ("c3", "base") for s in prog.rounds[-1].starts)
    # no early share: every band waits for its confirmation look
    late = simulate.scenario("race", gains={3: 1.25}, budget=BudgetSpec(early_share=0))
    prog, ms = simulate.run_sweep(late, simulate.NoiseModel(cv=0.03, start_sd=0.01), FAST, 1)
    assert {(b.status, b.evidence) for b in prog.states.values()} == {("promote", "confirm")}
    assert _winners(_decide(late, prog, ms)) == {"c3"}


def test_windows_slowed_by_outside_load_neither_sink_a_winner_nor_are_lost(tmp_path,
                                                                         monkeypatch) -> None:
    """A true +10% at CV 3%, then one window at every point of every confirmation start of the
    winner slowed to 0.6x (a background job on the host). Read without the screen, the winner
    falls below the margin; with it, exactly those windows (and a handful of the noise's own
    tail, under 1% of windows) are left out and named in the analysis and the report, the
    rounds replay to the same plan and states, and the winner is promoted. The records keep
    every window: the slowed ones still count as repeats."""
    scn = simulate.scenario("race", gains={3: 1.10})
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.03, start_sd=0.01), FAST, 0)
    assert _winners(_decide(scn, prog, ms)) == {"c3"}
    hit = {m.key.id for m in ms if m.key.engine_hash == "c3" and m.stage == "confirm"
           and m.key.repeat == 0}
    assert len(hit) >= 40
    slowed_ms = [dataclasses.replace(m, output_throughput=0.6 * m.output_throughput)
                 if m.key.id in hit else m for m in ms]
    again = rounds.replay(scn.shape, FAST, slowed_ms)
    assert again.current is None
    assert [r.starts for r in again.rounds] == [r.starts for r in prog.rounds]
    assert {k: b.status for k, b in again.states.items()} == {
        k: b.status for k, b in prog.states.items()} == dict.fromkeys(prog.states, "promote")
    result = _decide(scn, again, slowed_ms)
    assert _winners(result) == {"c3"}
    named = {(w.engine_hash, w.workload, w.concurrency, w.start, w.repeat)
             for w in result.slowed}
    injected = {(m.key.engine_hash, m.key.workload, m.key.concurrency, m.key.start,
                 m.key.repeat) for m in slowed_ms if m.key.id in hit}
    assert injected <= named and len(named - injected) < 0.01 * len(ms)
    assert all(w.ratio < 0.8 for w in result.slowed if (
        w.engine_hash, w.workload, w.concurrency, w.start, w.repeat) in injected)
    repeats = {(p.engine_hash, p.workload, p.concurrency): p.n_ok for p in result.points}
    assert repeats == {(p.engine_hash, p.workload, p.concurrency): p.n_ok
                       for p in _decide(scn, prog, ms).points}
    files = write_report(result, tmp_path, rounds=again.rounds, measurements=slowed_ms)
    text = files.report.read_text()
    assert "### Excluded windows" in text and "Slowed by outside load" in text
    first = min(s for _, w, c, s, _ in injected if (w, c) == ("w0", 1))
    assert f"| {scn.engines['c3'].name} | w0 | 1 | {first} | 0 | 0.6" in text
    assert f"Windows slowed by outside load, left out of the speedups: {len(named)}" in text
    # what a racing start measures once more before its engine stops: its own slowed windows,
    # once (a window measured again in a slowed one's place is numbered AGAIN + its repeat)
    start = min(k[3] for k in injected)
    todo = to_measure_again(slowed_ms, "c3", start)
    assert {("c3", w, c, start, r) for w, c, r in todo} == {k for k in injected if k[3] == start}
    redone = [dataclasses.replace(m, key=dataclasses.replace(m.key, repeat=m.key.repeat + AGAIN),
                                  output_throughput=m.output_throughput / 0.6)
              for m in slowed_ms if m.key.id in hit and m.key.start == start]
    assert to_measure_again([*slowed_ms, *redone], "c3", start) == []
    with_again = _decide(scn, again, [*slowed_ms, *redone])
    assert {w.again for w in with_again.slowed if w.start == start
            and w.engine_hash == "c3"} == {AGAIN}
    text = write_report(with_again, tmp_path / "again", rounds=again.rounds,
                        measurements=[*slowed_ms, *redone]).report.read_text()
    assert f"| {scn.engines['c3'].name} | w0 | 1 | {start} | 0 | 0.6" in text
    assert "| repeat 1000 |" in text
    monkeypatch.setattr(replicates, "SLOWED_Z", math.inf)  # the same records, unscreened
    assert _winners(_decide(scn, again, slowed_ms)) == set()


def test_a_race_under_outside_load_still_concludes() -> None:
    """5% of windows slowed to 0.5-0.8x at random (the bench's interference model), CV 3%:
    the race still promotes a true +10% and concludes off where nothing helps."""
    for gains, status in (({3: 1.10}, "promote"), ({}, "off")):
        scn = simulate.scenario("race", gains=gains)
        noise = simulate.NoiseModel(cv=0.03, start_sd=0.01, hit=0.05)
        prog, ms = simulate.run_sweep(scn, noise, FAST, 0)
        assert {b.status for b in prog.states.values()} == {status}, gains
        result = _decide(scn, prog, ms)
        assert _winners(result) == ({"c3"} if gains else set())
        assert len(result.slowed) > 0.02 * len(ms)


def test_a_a_race_concludes_off_and_off_is_promoted(tmp_path) -> None:
    """No candidate helps (CV 3%): every candidate is ruled out (a +10% gain excluded at its
    look's futility share), every band concludes off, and off becomes each class's champion."""
    scn = simulate.scenario("race")
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.03, start_sd=0.01), FAST, 0)
    assert {b.status for b in prog.states.values()} == {"off"}
    assert all(set(b.ruled_out) == {h for h, _ in b.dropped} for b in prog.states.values())
    result = _decide(scn, prog, ms)
    spec = FAST.model_copy(update={"output_dir": str(tmp_path)})
    engines = {h: engine(e.name, e.method if e.method != "none" else "none", e.n)
               for h, e in scn.engines.items()}
    for r in result.classes:
        assert {d.outcome for d in r.decisions} == {"off"} and r.deployment.outcome == "off"
        for d in r.decisions:
            assert d.reasons[0] == "speculation off: every one of 8 candidates is ruled out"
            assert {v.verdict for v in d.candidates} == {"ruled out"}
            assert all("ruled out" in v.ruled_out or "excluded" in v.ruled_out
                       for v in d.candidates), [v.ruled_out for v in d.candidates]
        p = promote.promote_class(r, engines, spec)
        assert p.status == "promoted"
        record = promote.champion(tmp_path, r.traffic_class)
        assert record is not None and record.outcome == "off"
        assert {b.outcome for b in record.bands} == {"off"}


def test_the_promotion_error_is_spent_across_early_and_confirmation_looks() -> None:
    """`early_share` of the one-sided error goes to the exploration looks after the first, the
    rest to the confirmation looks: over all of them a false promotion stays within alpha
    (Bonferroni). With one exploration round there is no early look and confirmation keeps it
    all. A confirmation look starts each winner as often as its band needs, a baseline start
    after each row and, in a look of several rows, a fresh one before the first (the round
    before closed with one)."""
    alpha = (1 - FAST.confidence) / 2
    for budget in (BudgetSpec(), BudgetSpec(max_rounds=3, confirm_looks=1, early_share=0.5),
                   BudgetSpec(max_rounds=1), BudgetSpec(early_share=0)):
        spent = (early_alpha(FAST, budget) * early_looks(budget)
                 + confirm_alpha(FAST, budget) * budget.confirm_looks)
        assert math.isclose(spent, alpha), budget
    assert early_looks(BudgetSpec()) == 5 and early_looks(BudgetSpec(max_rounds=1)) == 0
    assert confirm_alpha(FAST, BudgetSpec(max_rounds=1)) == alpha / 2
    base, a, b = ("base",), ("a",), ("b",)
    assert rounds.confirm_plan(base, [(a, 3), (b, 1)]) == [base, a, b, base, a, base, a, base]
    assert rounds.confirm_plan(base, [(a, 1), (b, 1)]) == [a, b, base]


def test_a_later_confirmation_look_keeps_the_bands_an_earlier_one_failed(monkeypatch) -> None:
    """Holm's family at a confirmation look is fixed by the confirmations, not their outcomes:
    a band the first look ruled out stays in it (p = 1) at the second, so a p-value between
    alpha / 2 and alpha confirms nothing there; a band out before any look (exploration) or
    confirmed at the first is not in it. Only what `_confirm_step` reads of a verdict is
    built: its p-value, gates and rule-out."""
    budget = BudgetSpec(confirm_looks=3)
    alpha = confirm_alpha(FAST, budget)
    p = 0.75 * alpha
    monkeypatch.setattr(advance, "band_p_value", lambda v: v.p)
    monkeypatch.setattr(advance, "_interval", lambda v: None)
    monkeypatch.setattr(advance, "_gate_reasons", lambda v: "")
    verdict = types.SimpleNamespace(p=p, ruled_out="", worst=None)
    shape = simulate.scenario("race", budget=budget).shape
    live = BandState("class0", "c1", status="confirming", contenders=("c3",), looks=1)

    def look(other: BandState) -> BandState:
        states = {("class0", "c1"): live, ("class1", "c1"): other}
        return advance._confirm_step(shape, FAST, states, {("class0", "c1"): {"c3": verdict}})[
            ("class0", "c1")]

    failed = look(BandState("class1", "c1", "off", ("c5",), looks=1, ruled_out=("c5",)))
    assert failed.status == "confirming" and failed.looks == 2
    for other in (BandState("class1", "c1", "off", (), looks=0),
                  BandState("class1", "c1", "promote", ("c5",), looks=1)):
        now = look(other)
        assert now.status == "promote", other
        assert "Holm's threshold over 1 bands" in now.why
    unresolved = look(BandState("class1", "c1", "unresolved", ("c5",), looks=1))
    assert unresolved.status == "confirming"


def test_futility_is_spent_across_the_looks() -> None:
    """Half of `promote.futility` is shared by the race's exploration rounds and confirmation
    looks, half is the final decision's: a candidate gaining +10% (twice the 5% margin) is ruled
    out at some look with probability at most 5% (Bonferroni over the looks). At CV 3% it is
    never ruled out at these seeds, and is promoted."""
    budget = BudgetSpec()
    assert look_futility(FAST, budget) == pytest.approx(0.05 / 2 / (6 + 2))
    assert final_rules(FAST).futility == pytest.approx(0.025)
    total = look_futility(FAST, budget) * (budget.max_rounds + budget.confirm_looks)
    assert total + final_rules(FAST).futility == pytest.approx(FAST.futility)
    scn = simulate.scenario("race", gains={3: 1.10})
    for seed in range(2):
        prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.03, start_sd=0.01), FAST,
                                      seed)
        assert all("c3" not in b.ruled_out for b in prog.states.values()), seed
        result = _decide(scn, prog, ms)
        assert _winners(result) == {"c3"}, seed
        assert "off" not in {d.outcome for r in result.classes for d in r.decisions}


def test_an_unresolved_band_is_never_promoted(tmp_path) -> None:
    """A budget that runs out before the race is decided: every open band is unresolved, the
    report says what settling it would cost, and nothing, not even "off", becomes champion."""
    scn = simulate.scenario("race", gains={3: 1.08}, budget=BudgetSpec(engine_starts=14))
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.10, start_sd=0.03), FAST, 2)
    assert {b.status for b in prog.states.values()} == {"unresolved"}
    assert all("budget spent" in b.why for b in prog.states.values())
    result = _decide(scn, prog, ms)
    assert _winners(result) == set()
    assert {d.outcome for r in result.classes for d in r.decisions} == {"unresolved"}
    for d in (d for r in result.classes for d in r.decisions):
        # the budget's why, then the band's leader: its estimate, how likely it clears the
        # margin, what holds meanwhile and the starts that would settle it
        assert d.unresolved.startswith("budget spent: the next round needs "), d.unresolved
        assert re.search(r"; best \S+ \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] at w\d c=\d+, "
                         r"clearing 1\.050 with (<1|>99|\d{1,2})% confidence so far; meanwhile "
                         r"the class keeps its champion; (about \d+ engine starts per side would "
                         r"settle|more engine starts would rule|its estimate sits too close to "
                         r"the margin for engine starts to settle) ", d.unresolved), d.unresolved
    # past 100 starts per side the advice is that the estimate sits on the margin, not a count
    assert any("(over 100 per side; about " in d.unresolved
               for r in result.classes for d in r.decisions)
    engines = {h: engine(e.name, e.method if e.method != "none" else "none", e.n)
               for h, e in scn.engines.items()}
    spec = FAST.model_copy(update={"output_dir": str(tmp_path)})
    for r in result.classes:
        p = promote.promote_class(r, engines, spec)
        assert p.status == "unresolved" and "unresolved" in p.path.parts
        assert promote.champion(tmp_path, r.traffic_class) is None


def test_a_drifted_baseline_triggers_re_measurement() -> None:
    """A candidate that loses clearly is dropped after round 0, unless the baseline stepped
    beyond noise around its start: then it is measured again, and nothing is selected on the
    drifted data."""
    scn = simulate.scenario("race", candidates=2, classes=1, levels=(1,),
                            gains={0: 0.80, 1: 1.3})
    noise = simulate.NoiseModel(cv=0.01)
    prog = rounds.replay(scn.shape, FAST, [])
    assert prog.current is not None
    ms = simulate.run_round(scn, noise, prog.current, np.random.default_rng(0))
    after = rounds.replay(scn.shape, FAST, ms)
    assert "c0" not in {s.engine_hash for s in after.current.starts}
    # the closing baseline start (#3) reads 30% low: a step beyond noise after c0 (#1)
    stepped = [dataclasses.replace(m, output_throughput=m.output_throughput * 0.7)
               if m.key.engine_hash == "base" and m.seq == 3 else m for m in ms]
    after = rounds.replay(scn.shape, FAST, stepped)
    assert after.current.stage == "explore"
    assert {"c0", "c1"} <= {s.engine_hash for s in after.current.starts}


def test_rounds_replay_from_the_records_alone() -> None:
    """Resuming mid-round plans the same round and leaves only its missing windows."""
    scn = simulate.scenario("race", candidates=4, classes=1)
    noise = simulate.NoiseModel(cv=0.05)
    rng = np.random.default_rng(3)
    prog = rounds.replay(scn.shape, FAST, [])
    ms = simulate.run_round(scn, noise, prog.current, rng)
    second = rounds.replay(scn.shape, FAST, ms).current
    assert second is not None and second.index == 1
    part = simulate.run_round(scn, noise, second, rng)[: len(second.starts[0].window_keys())]
    again = rounds.replay(scn.shape, FAST, [*ms, *part])
    assert again.current == second and len(again.rounds) == 1
    assert {s.seq for s in second.starts} == set(range(len(prog.current.starts),
                                                       len(prog.current.starts)
                                                       + len(second.starts)))


def _schedule_scenario(schedule_gain: dict[int, float]) -> tuple[simulate.Scenario, str]:
    """ngram N=2 wins at c=1 and N=1 at c=8: the class deploys the schedule [[1,7,2],[8,8,1]]
    as one engine, whose true speedup per level is `schedule_gain`."""
    scn = simulate.scenario("race", candidates=4, classes=1, levels=(1, 8),
                            measure_schedules=True,
                            level_gains={(2, 1): 1.4, (2, 8): 1.1, (0, 1): 1.15, (0, 8): 1.35})
    sched = with_schedule(scn.shape.engines["c2"], [[1, 7, 2], [8, 8, 1]])
    gains = {**scn.level_gains, **{(sched.hash, c): g for c, g in schedule_gain.items()}}
    return dataclasses.replace(scn, level_gains=gains), sched.hash


def test_an_emitted_schedule_is_measured_on_both_sides_of_its_threshold() -> None:
    scn, sched = _schedule_scenario({7: 1.4, 8: 1.35})
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.02), FAST, 0)
    last = prog.rounds[-1]
    assert last.stage == "schedule"
    assert {s.engine_hash for s in last.starts} == {"base", sched}
    assert {p for s in last.starts for p in s.points} == {("w0", 7), ("w0", 8)}
    assert sum(s.engine_hash == sched for s in last.starts) == 2  # fresh starts, baseline around
    check = prog.schedules["class0"]
    assert check.passed and check.levels == (7, 8) and prog.derived[sched].name.startswith(
        "ngram-schedule")
    result = _decide(scn, prog, [m for m in ms if m.stage != "schedule"])
    assert result.classes[0].deployment.schedule == ((1, 7, 2), (8, 8, 1))
    kept, problems = measured_schedules(result, prog.schedules)
    assert len(kept.classes) == 1 and problems == []


def test_a_schedule_that_collapses_at_its_threshold_is_not_promoted() -> None:
    scn, _ = _schedule_scenario({7: 1.4, 8: 0.8})  # vLLM issue 49548's failure mode
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.02), FAST, 0)
    check = prog.schedules["class0"]
    assert not check.passed and "w0 c=8 (N=1)" in check.why
    result = _decide(scn, prog, [m for m in ms if m.stage != "schedule"])
    kept, problems = measured_schedules(result, prog.schedules)
    assert kept.classes == () and "falls short around a threshold" in problems[0]


def _aa_left_open(budget: BudgetSpec, seed: int = 1) -> tuple[simulate.Scenario,
                                                               rounds.SearchState, list]:
    """Three candidates that gain nothing, one class, one level, two exploration rounds: the
    exploration (seed 1) leaves the band open, no contender selected and none ruled out yet."""
    scn = simulate.scenario("race", candidates=3, classes=1, levels=(1,), repeats=3,
                            closing_repeats=0, budget=budget)
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.06, start_sd=0.03), FAST, seed)
    assert not prog.problems
    return scn, prog, ms


def test_a_band_left_open_with_no_winner_gets_a_settling_look() -> None:
    """No band is confirming, so no confirmation's starts measure the open band: the race gives
    it a look of its own (stage confirm, spending one confirmation look's futility share), each
    contender started as often as ruling it out would need, a fresh baseline start around each
    round of them, and the band concludes off instead of ending unresolved with budget left."""
    budget = BudgetSpec(max_rounds=2, confirm_starts=2, confirm_looks=2)
    scn, prog, ms = _aa_left_open(budget)
    explored = prog.rounds[1]
    (st,) = explored.states
    assert explored.stage == "explore" and st.status == "unresolved" and st.left_open
    open_contenders = set(st.contenders)
    looks = [r for r in prog.rounds if r.stage == "confirm"]
    assert 1 <= len(looks) <= budget.confirm_looks
    first = [s.engine_hash for s in looks[0].starts]
    assert set(first) == {"base", *open_contenders}  # nothing ruled out is started again
    assert first[0] == first[-1] == "base"
    runs = "".join("b" if h == "base" else "c" for h in first)
    assert "bb" not in runs  # a baseline start between every round of contenders
    # sized per contender from its interval: the one nearer the rule-out bar gets more starts
    counts = {h: first.count(h) for h in open_contenders}
    assert max(counts.values()) > min(counts.values()) >= 1, counts
    assert {b.status for b in prog.states.values()} == {"off"}
    (r,) = _decide(scn, prog, ms).classes
    assert [d.outcome for d in r.decisions] == ["off"]


def test_a_settling_look_shrinks_to_the_budget() -> None:
    """The same race with 16 engine starts in all: the exploration spent 9, so the settling look
    keeps the rounds that fit (a baseline start, then each round's contenders and a baseline
    start): 7 starts, not the 31 it asked for, which here still rule both contenders out."""
    _, unbounded, _ = _aa_left_open(BudgetSpec(max_rounds=2, confirm_starts=2,
                                               confirm_looks=2))
    asked = [s.engine_hash for s in unbounded.rounds[2].starts]
    _, prog, _ = _aa_left_open(BudgetSpec(max_rounds=2, confirm_starts=2, confirm_looks=2,
                                          engine_starts=16))
    assert prog.rounds[1].spent.engine_starts == 9
    look = [s.engine_hash for s in prog.rounds[2].starts]
    assert len(asked) > len(look) == 7 and look == asked[:7]
    assert prog.spent.engine_starts <= 16 and len(prog.rounds) == 3
    assert {b.status for b in prog.states.values()} == {"off"}


def _demo_shape(confirm_starts: int) -> tuple[simulate.Scenario, PromoteSpec,
                                               rounds.SearchState, list[Measurement]]:
    """The demo's shape raced: two candidates, one exploration round, one confirmation look;
    c1 wins at level 1 (1.4x) and loses at level 8 (0.85x), c0 loses everywhere (0.55x)."""
    budget = BudgetSpec(max_rounds=1, confirm_starts=confirm_starts, max_confirm_starts=2,
                        confirm_looks=1)
    scn = simulate.scenario("race", candidates=2, classes=1, levels=(1, 8), repeats=2,
                            closing_repeats=0, gains={0: 0.55},
                            level_gains={(1, 1): 1.4, (1, 8): 0.85}, budget=budget)
    rules = FAST.model_copy(update={"min_repeats": 2})
    prog, ms = simulate.run_sweep(scn, simulate.NoiseModel(cv=0.03, start_sd=0.03), rules, 0)
    assert not prog.problems
    return scn, rules, prog, ms


def test_a_one_row_look_confirms_on_its_own_baseline_start_after_the_winner() -> None:
    """The CPU demo's confirmation (`confirm_starts` 1): a clear winner needs one fresh start, so
    the look is that start and one baseline start after it, with no opening baseline start of its
    own and no start for the open band's other contender. The confirmation test uses the look's
    baseline start alone (the exploration's took part in the selection). The open band still
    concludes off."""
    scn, rules, prog, ms = _demo_shape(confirm_starts=1)
    explored, confirm = prog.rounds
    assert [s.engine_hash for s in explored.starts] == ["base", "c0", "c1", "base"]
    assert confirm.stage == "confirm"
    assert [s.engine_hash for s in confirm.starts] == ["c1", "base"]
    assert prog.spent.engine_starts == 6  # the grid's 4 (3 configs, closing baseline) + 2 rounds
    band = {b.band: b for b in prog.states.values()}
    assert band["c1"].status == "promote" and band["c8"].status == "off"
    assert set(band["c8"].ruled_out) == {"c0", "c1"}

    (r,) = _decide(scn, prog, ms, rules).classes
    (d,) = [d for d in r.decisions if d.band.label == "c1"]
    assert d.outcome == "promote" and d.winner is not None and d.winner.engine_hash == "c1"
    worst = d.winner.worst
    assert worst is not None and 1.2 < worst.speedup.value < 1.6
    # confirmed on the look's two starts alone: the winner's one start (2 windows at the point)
    # against the one baseline start after it (2 windows), none of the exploration's
    assert (worst.starts, worst.n_candidate, worst.n_baseline) == (1, 2, 2)


def test_a_confirmation_also_measures_the_bands_the_exploration_left_open() -> None:
    """The demo's shape (two candidates, one exploration round): one candidate wins at level 1
    and loses at level 8, the other loses everywhere. The level-1 winner's confirmation starts,
    and the baseline starts around them, also measure level 8, which the exploration left open
    (one start each cannot rule out there); the other contender gets no start of its own: the
    look's starts replicate the start-to-start variance at level 8, so its one start rules it
    out. Level 8 concludes off, level 1 promotes the winner."""
    scn, rules, prog, ms = _demo_shape(confirm_starts=2)
    explored = prog.rounds[0].states
    assert {(b.band, b.status) for b in explored} == {("c1", "confirming"), ("c8", "unresolved")}
    confirm = prog.rounds[-1]
    assert confirm.stage == "confirm"
    for s in confirm.starts:  # the open band measured on every start the confirmation pays for
        assert s.engine_hash in ("base", "c1") and {c for _, c in s.points} == {1, 8}, s
    assert [s.engine_hash for s in confirm.starts] == ["base", "c1", "base", "c1", "base"]
    band = {b.band: b for b in prog.states.values()}
    assert band["c1"].status == "promote" and band["c8"].status == "off"
    assert set(band["c8"].ruled_out) == {"c0", "c1"}
    result = _decide(scn, prog, ms, rules)
    (r,) = result.classes
    outcome = {d.band.label: d.outcome for d in r.decisions}
    assert outcome == {"c1": "promote", "c8": "off"}
    assert _winners(result) == {"c1"}
    # said as it stands: exploring after the exploration, while the confirmation measures it
    # again;
    # off once ruled out; unresolved nowhere, as the band never was
    mid = dataclasses.replace(prog, rounds=prog.rounds[:1], current=confirm)
    (line,) = [x for x in round_lines(mid, {}) if x.startswith("  class0 c8: ")]
    assert line.startswith("  class0 c8: exploring [") and line.endswith(
        "; measured again on the next round's starts"), line
    assert [x for x in round_lines(prog, {}) if x.startswith("  class0 c8: ")] == [
        "  class0 c8: off; every candidate is ruled out"]
    table = "\n".join(rounds_table(prog.rounds))
    assert "c8: exploring (" in table and "c8: off" in table and "unresolved" not in table, table


def test_the_last_exploration_round_selects_a_contender_whose_estimate_clears_the_margin(
        ) -> None:
    """The demo's plan at CV 10% (`bench/decision_quality.py`, one level, trial 154): n-gram's two
    windows on its one start were 137 and 232 tok/s against the baseline's ~100, an estimate of
    about 1.8x in an interval wide on both sides; the random drafter's tight 0.47x has the higher
    lower bound. With no clear leader the last exploration round selects, among the contenders
    whose estimate clears the margin, the best lower bound: n-gram goes to its confirmation on a
    fresh start instead of the band ending unresolved on the random drafter's estimate."""
    budget = BudgetSpec(max_rounds=1, confirm_starts=1, max_confirm_starts=2, confirm_looks=1)
    scn = simulate.scenario("race", candidates=2, classes=1, levels=(1,), repeats=2,
                            closing_repeats=0, budget=budget)
    rules = FAST.model_copy(update={"min_repeats": 2})
    explore = rounds.replay(scn.shape, rules, []).current
    assert explore is not None
    values = {"base": ((100.0, 101.0), (90.0, 112.0)), "c0": ((47.0, 47.5),),
              "c1": ((137.0, 232.0),)}
    ms = [simulate.window(scn, s, i, values[s.engine_hash][s.start][i], 30.0, 120.0)
          for s in explore.starts for i in range(len(s.window_keys()))]
    prog = rounds.replay(scn.shape, rules, ms)
    (state,) = prog.states.values()
    assert state.status == "confirming" and state.contenders == ("c1",), state
    ests = prog.rounds[0].states[0].estimates
    assert ests["c1"].value > 1 + rules.margin > ests["c0"].value
    assert ests["c1"].lo < ests["c0"].lo  # the best lower bound alone would pick c0
    assert prog.current is not None and [s.engine_hash for s in prog.current.starts] == [
        "c1", "base"]
