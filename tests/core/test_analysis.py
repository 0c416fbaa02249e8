"""Deciding on hand-built sweep records: statistics, gates, tie rules, bands and schedules."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from specflow.core.analysis import (
    AnalysisError,
    Band,
    aggregate,
    analyze,
    build_schedule,
    decision_rows,
    ratio_ci,
    to_json,
)
from specflow.core.schema import PromoteSpec, QualitySpec, SloSpec
from specflow.engine import probe
from tests.builders import BASELINE, DIGESTS, LATENCY, Cand, engine, sweep, window

E3N2 = engine("eagle3-n2", "eagle3", 2)
E3N3 = engine("eagle3-n3", "eagle3", 3)
E3N4 = engine("eagle3-n4", "eagle3", 4)
NG2 = engine("ngram-n2", "ngram", 2)
NG4 = engine("ngram-n4", "ngram", 4)


def _promoted(ms, spec: PromoteSpec, closing=()) -> bool:
    return analyze(ms, spec, closing_baseline=closing).classes[0].deployment.outcome == "speculate"


# --------------------------------------------------------------------------------------------
# Aggregation


def test_failed_windows_are_excluded_and_counted() -> None:
    ms = [window(BASELINE, v, r=i) for i, v in enumerate([100.0, 104.0, 98.0])]
    ms += [window(BASELINE, 0.0, r=3, failure="oom"),
           window(BASELINE, 250.0, r=4, failed_requests=2)]
    (p,) = aggregate(ms, PromoteSpec())
    assert p.values == (100.0, 104.0, 98.0)
    assert p.failures == {"failed_requests": 1, "oom": 1}
    assert (p.n_ok, p.n_failed) == (3, 2)
    assert p.median == 100.0 and p.mad == 2.0
    t = p.throughput
    assert t is not None and t.lo < t.value < t.hi
    assert t.value == pytest.approx(np.exp(np.mean(np.log([100.0, 104.0, 98.0]))))
    assert p.latency_worst == LATENCY


def test_too_few_repeats_refuses_naming_every_point_to_remeasure() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 8), repeats=3)
    ms = [m for m in ms if not (m.key.concurrency == 8 and m.key.repeat == 2)]  # 2 left at c=8
    ms.append(window(E3N3, 0.0, c=8, r=2, failure="crashed"))
    with pytest.raises(AnalysisError) as err:
        analyze(ms, PromoteSpec())
    problems = err.value.problems
    assert len(problems) == 2, problems
    assert any(p.startswith("the baseline (") and "c=8: 2 usable repeats" in p for p in problems)
    assert any("eagle3-n3" in p and "crashed x1 excluded" in p and "re-measure" in p
               for p in problems)


def test_a_candidate_missing_a_point_refuses() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 8), repeats=3)
    ms = [m for m in ms if not (m.engine == "eagle3-n3" and m.key.concurrency == 8)]
    with pytest.raises(AnalysisError, match=r"eagle3-n3 \(\w+\) has no window at gsm8k c=8"):
        analyze(ms, PromoteSpec())


def test_a_candidate_failing_every_repeat_is_rejected_in_that_band_only() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 32), repeats=3)
    ms = [m for m in ms if not (m.engine == "eagle3-n3" and m.key.concurrency == 32)]
    ms += [window(E3N3, 0.0, c=32, r=r, failure="oom") for r in range(3)]
    r = analyze(ms, PromoteSpec()).result("math")
    low, high = r.decisions
    assert low.outcome == "speculate"
    assert high.outcome == "off"
    (v,) = high.candidates
    assert [x.gate for x in v.rejected] == ["failed"]
    assert "oom x3" in v.rejected[0].detail


def test_seeded_and_independent_of_record_order() -> None:
    ms, close = sweep([Cand(E3N3, 1.2), Cand(NG4, 1.1)], levels=(1, 4), repeats=3, closing=3,
                      cv=0.05, rng=np.random.default_rng(3))
    a = json.dumps(to_json(analyze(ms, PromoteSpec(), closing_baseline=close)))
    random.Random(0).shuffle(ms)
    b = json.dumps(to_json(analyze(ms, PromoteSpec(), closing_baseline=close)))
    assert a == b
    c = json.dumps(to_json(analyze(ms, PromoteSpec(seed=1), closing_baseline=close)))
    assert c != a  # the seed is what makes it reproducible


def test_ratio_ci_resamples_both_sides_and_covers_the_truth() -> None:
    rng = np.random.default_rng(0)
    spec = PromoteSpec()
    covered = 0
    for i in range(200):
        a = 120 * (1 + 0.05 * rng.standard_normal(5))
        b = 100 * (1 + 0.05 * rng.standard_normal(5))
        est, _ = ratio_ci(a, b, spec, i)
        covered += est.lo <= 1.2 <= est.hi
    assert covered >= 0.93 * 200  # 95% nominal; the plain percentile bootstrap gets ~85% here


# --------------------------------------------------------------------------------------------
# Calibration (the acceptance bar: 1,000 seeded trials each)


@pytest.mark.parametrize("cv", [0.03, 0.10, (0.03, 0.10)], ids=["cv3", "cv10", "cv3-10"])
def test_a_a_promotes_nothing(cv: float | tuple[float, float]) -> None:
    """One config measured twice, 3 repeats each (the floor), realistic noise: < 1% promoted."""
    rng = np.random.default_rng(20240611)
    same = Cand(engine("same-as-baseline", "eagle3", 3), 1.0)
    spec = PromoteSpec()
    promoted = 0
    for _ in range(1000):
        noise = rng.uniform(*cv) if isinstance(cv, tuple) else cv
        ms, _ = sweep([same], repeats=3, cv=noise, rng=rng)
        promoted += _promoted(ms, spec)
    assert promoted <= 10, promoted


def test_true_ten_percent_gain_is_promoted() -> None:
    """The repeats the defaults assume: 5 per point, the baseline bracketing the sweep (5 + 5);
    run-to-run CV 1.5% (a dedicated GPU). >= 95% promoted."""
    rng = np.random.default_rng(7)
    gain = Cand(E3N3, 1.10)
    spec = PromoteSpec()
    promoted = 0
    for _ in range(1000):
        ms, close = sweep([gain], repeats=5, closing=5, cv=0.015, rng=rng)
        promoted += _promoted(ms, spec, close)
    assert promoted >= 950, promoted


def test_an_inconclusive_gain_says_how_many_repeats_would_settle_it() -> None:
    ms, _ = sweep([Cand(E3N3, 1.10)], repeats=3, cv=0.03, rng=np.random.default_rng(1))
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    (v,) = d.candidates
    if v.eligible:
        pytest.skip("this draw happened to be conclusive")
    assert "inconclusive: about" in str(v.rejected[-1]) and "repeats per side" in str(
        v.rejected[-1])


# --------------------------------------------------------------------------------------------
# Gates


def test_faster_but_breaking_the_slo_is_not_promoted() -> None:
    slow_tokens = {**LATENCY, "p99_tpot_ms": 80.0}
    ms, _ = sweep([Cand(E3N4, 1.6, latency={1: slow_tokens}), Cand(E3N2, 1.3)])
    spec = PromoteSpec(slo=SloSpec(p99_tpot_ms=50))
    (d,) = analyze(ms, spec).result("math").decisions
    assert d.winner is not None and d.winner.engine == "eagle3-n2"
    (bad,) = [v for v in d.candidates if v.engine == "eagle3-n4"]
    assert [r.gate for r in bad.rejected] == ["slo"]
    assert "p99_tpot_ms 80.0 > 50" in bad.rejected[0].detail

    ms, _ = sweep([Cand(E3N4, 1.6, latency={1: slow_tokens})])
    (d,) = analyze(ms, spec).result("math").decisions
    assert d.outcome == "off"


def test_the_slo_is_judged_by_the_worst_repeat() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)])
    ms[-1] = window(E3N3, 150.0, r=4, latency={**LATENCY, "p99_ttft_ms": 2500.0})
    (d,) = analyze(ms, PromoteSpec(slo=SloSpec(p99_ttft_ms=2000))).result("math").decisions
    assert d.outcome == "off"
    assert "p99_ttft_ms 2500.0 > 2000" in str(d.candidates[0].rejected[0])


def test_faster_but_changing_outputs_is_not_promoted() -> None:
    changed = (*DIGESTS[:17], "x" * 64, "y" * 64, "z" * 64)
    ms, _ = sweep([Cand(E3N3, 1.5, digests=changed)])
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.outcome == "off"
    (v,) = d.candidates
    q = v.quality
    assert q is not None and (q.requests, q.mismatched, q.unexcused, q.excused) == (20, 3, 3, 0)
    assert "3 of 20 requests differ" in str(v.rejected[0])
    # A stated tolerance lets it through, and the table reports the counts.
    (d,) = analyze(ms, PromoteSpec(quality=QualitySpec(max_mismatch_fraction=0.15))
                   ).result("math").decisions
    assert d.outcome == "speculate"
    assert "quality: 3 of 20 requests differ unexcused (tolerance 15.0%" in " ".join(d.reasons)
    assert d.winner.quality.unexcused == 3


def test_mismatches_where_the_baseline_disagrees_with_itself_are_excused() -> None:
    changed = (*DIGESTS[:18], "x" * 64, "y" * 64)
    ms, _ = sweep([Cand(E3N3, 1.5, digests=changed)])
    # The baseline's own repeat diverged on the last two prompts (bf16 near-ties).
    unstable = (*DIGESTS[:18], "u" * 64, "v" * 64)
    ms = [window(BASELINE, m.output_throughput, r=m.key.repeat, digests=unstable)
          if m.method == "none" and m.key.repeat == 1 else m for m in ms]
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.outcome == "speculate"
    q = d.winner.quality
    assert (q.mismatched, q.excused, q.unexcused, q.unstable_baseline) == (2, 2, 0, 2)
    # Without calibration the same mismatches count.
    spec = PromoteSpec(quality=QualitySpec(calibrate_with_baseline_repeat=False))
    (d,) = analyze(ms, spec).result("math").decisions
    assert d.outcome == "off"


def test_without_output_digests_the_quality_gate_fails_closed() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5, digests=())])
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.outcome == "off"
    assert "recorded no output digests" in str(d.candidates[0].rejected[0])


def test_headroom_refusal_rejects_a_candidate() -> None:
    ms, _ = sweep([Cand(E3N4, 1.6), Cand(E3N2, 1.3)])
    a = analyze(ms, PromoteSpec(), refused_by_headroom={E3N4.hash})
    (d,) = a.result("math").decisions
    assert d.winner.engine == "eagle3-n2"
    (v,) = [v for v in d.candidates if v.engine == "eagle3-n4"]
    assert [r.gate for r in v.rejected] == ["headroom"]
    assert a.headroom_refused == (E3N4.hash,)


def test_all_slower_promotes_off_with_every_reason() -> None:
    ms, _ = sweep([Cand(E3N3, 0.8), Cand(NG4, 0.9)], levels=(1, 8), repeats=3, cv=0.02)
    r = analyze(ms, PromoteSpec()).result("math")
    assert r.deployment.outcome == "off"
    assert r.deployment.engine_hash == BASELINE.hash and r.deployment.schedule is None
    for d in r.decisions:
        assert d.outcome == "off"
        assert "speculation off: none of 2 candidates passed (rejected by speedup x2)" in d.reasons
        for v in d.candidates:
            assert v.status == "rejected"
            assert "slower than the baseline" in str(v.rejected[0])
    rows = decision_rows(r)
    offs = [row for row in rows if row["engine"] == "off (baseline)"]
    assert [row["verdict"] for row in offs] == ["winner", "winner"]


# --------------------------------------------------------------------------------------------
# Ranking and ties


def test_the_conservative_score_not_the_best_run_wins() -> None:
    # eagle3-n4: higher mean but wild; eagle3-n2: a bit lower and steady.
    ms, _ = sweep([Cand(E3N2, 1.40)], repeats=5, cv=0.0)
    wild = [1.9, 1.05, 1.5, 1.95, 1.1]
    ms += [window(E3N4, 100 * s, r=i) for i, s in enumerate(wild)]
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.winner.engine == "eagle3-n2"


def test_ties_go_to_the_smaller_n_then_the_cheaper_method() -> None:
    # Noise-free: scores are the true speedups; all within 2% of the best.
    ms, _ = sweep([Cand(E3N4, 1.50), Cand(E3N2, 1.48), Cand(NG4, 1.49), Cand(NG2, 1.40)])
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.winner.engine == "eagle3-n2"  # smaller N beats a higher score within the tie
    others = {v.engine: v for v in d.candidates}
    assert others["eagle3-n4"].status == "eligible" and "tied with eagle3-n2" in others[
        "eagle3-n4"].note
    assert "lower bound 1.400 < winner's 1.480" in others["ngram-n2"].note

    ms, _ = sweep([Cand(E3N2, 1.50), Cand(NG2, 1.48)])
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.winner.engine == "ngram-n2"  # same N: the cheaper method (cost_rank 1 < 3)

    ms, _ = sweep([Cand(E3N2, 1.50), Cand(NG2, 1.40)])
    (d,) = analyze(ms, PromoteSpec()).result("math").decisions
    assert d.winner.engine == "eagle3-n2"  # outside the tolerance the score decides


def test_a_band_is_judged_by_its_worst_workload() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], workloads=("gsm8k",))
    ms2, _ = sweep([Cand(E3N3, 1.0)], workloads=("math500",))
    (d,) = analyze(ms + ms2, PromoteSpec()).result("math").decisions
    assert d.outcome == "off"
    assert "math500 c=1" in str(d.candidates[0].rejected[0])


def test_each_traffic_class_is_decided_separately() -> None:
    math, _ = sweep([Cand(E3N3, 1.5)], workloads=("gsm8k",), cls="math")
    chat, _ = sweep([Cand(E3N3, 0.9)], workloads=("chat",), cls="chat")
    a = analyze(math + chat, PromoteSpec())
    assert a.result("math").deployment.outcome == "speculate"
    assert a.result("chat").deployment.outcome == "off"


# --------------------------------------------------------------------------------------------
# Drift


def test_baseline_drift_between_the_brackets_is_flagged_and_pooled() -> None:
    rng = np.random.default_rng(5)
    ms, close = sweep([Cand(E3N3, 1.5)], repeats=5, closing=5, cv=0.01, rng=rng)
    close = [window(BASELINE, m.output_throughput * 0.85, r=m.key.repeat) for m in close]
    r = analyze(ms, PromoteSpec(), closing_baseline=close).result("math")
    (drift,) = r.drift
    assert drift.flagged and drift.ratio.value == pytest.approx(0.85, abs=0.02)
    (d,) = r.decisions
    assert any(re.match(r"the baseline drifted -1[45]\.\d% between the start and the end", n)
               for n in d.notes)
    assert d.winner.worst.n_baseline == 10

    ms, close = sweep([Cand(E3N3, 1.5)], repeats=5, closing=5, cv=0.01, rng=rng)
    r = analyze(ms, PromoteSpec(), closing_baseline=close).result("math")
    assert not r.drift[0].flagged and not r.decisions[0].notes


def test_a_single_closing_run_is_checked_against_the_opening_runs_prediction_interval() -> None:
    rng = np.random.default_rng(6)
    ms, close = sweep([Cand(E3N3, 1.5)], levels=(1, 8), repeats=5, closing=1, cv=0.01, rng=rng)
    close = [window(BASELINE, m.output_throughput * (0.85 if m.key.concurrency == 8 else 1.0),
                    c=m.key.concurrency, r=m.key.repeat) for m in close]
    r = analyze(ms, PromoteSpec(), closing_baseline=close).result("math")
    assert [(d.concurrency, d.n_end, d.flagged) for d in r.drift] == [(1, 1, False),
                                                                     (8, 1, True)]
    assert [bool(d.notes) for d in r.decisions] == [False, True]


def test_without_a_closing_baseline_drift_is_reported_unchecked() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)])
    r = analyze(ms, PromoteSpec()).result("math")
    assert r.drift == ()
    assert any("drift unchecked" in n for n in r.notes)


# --------------------------------------------------------------------------------------------
# Bands and schedules


def test_bands_default_to_one_per_measured_level() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 8, 32), repeats=3)
    r = analyze(ms, PromoteSpec()).result("math")
    assert [d.band.label for d in r.decisions] == ["c1", "c8", "c32"]


def test_configured_bands_group_levels_and_must_each_be_measured() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 2, 8), repeats=3)
    r = analyze(ms, PromoteSpec(concurrency_bands=[[1, 4], [5, 16]])).result("math")
    assert [(d.band.label, d.levels) for d in r.decisions] == [("c1-4", (1, 2)), ("c5-16", (8,))]
    with pytest.raises(AnalysisError, match=r"band \[17, 256\] has no measured concurrency level"):
        analyze(ms, PromoteSpec(concurrency_bands=[[1, 4], [5, 16], [17, 256]]))
    with pytest.raises(AnalysisError, match="overlaps"):
        analyze(ms, PromoteSpec(concurrency_bands=[[1, 4], [4, 16]]))


@pytest.mark.engine
def test_schedule_turns_speculation_off_where_it_loses_and_vllm_accepts_it() -> None:
    """Speculation wins at concurrency 1-4 and loses at 32: N=0 in the losing band."""
    cands = [Cand(E3N2, {1: 1.45, 4: 1.30, 32: 0.85}), Cand(E3N3, {1: 1.60, 4: 1.40, 32: 0.80}),
             Cand(NG4, {1: 1.10, 4: 1.04, 32: 0.90})]
    ms, close = sweep(cands, levels=(1, 4, 32), repeats=5, closing=5, cv=0.02,
                      rng=np.random.default_rng(11))
    spec = PromoteSpec(concurrency_bands=[[1, 4], [5, 32]])
    dep = analyze(ms, spec, closing_baseline=close).result("math").deployment
    assert dep.outcome == "speculate" and dep.drafter == "eagle3"
    assert dep.engine_hash == E3N3.hash and dep.num_speculative_tokens == 3
    assert dep.schedule == ((1, 4, 3), (5, 32, 0))

    auto = analyze(ms, PromoteSpec(), closing_baseline=close).result("math").deployment
    assert auto.schedule == ((1, 31, 3), (32, 32, 0))

    for schedule in (dep.schedule, auto.schedule):
        assert probe.check_schedule(schedule) is None  # the installed vLLM's own validation


def test_one_n_everywhere_needs_no_schedule() -> None:
    ms, _ = sweep([Cand(E3N3, 1.5)], levels=(1, 8), repeats=3)
    dep = analyze(ms, PromoteSpec()).result("math").deployment
    assert (dep.num_speculative_tokens, dep.schedule) == (3, None)


def test_build_schedule_fills_unmeasured_batch_sizes_from_the_band_below() -> None:
    schedule, notes = build_schedule([(Band(2, 4), 3), (Band(8, 16), 2), (Band(17, 64), 0)])
    assert schedule == [[1, 7, 3], [8, 16, 2], [17, 64, 0]]
    assert notes == ["batch sizes 1-1 were not measured; they use band c2-4's N=3",
                     "batch sizes 5-7 were not measured; they use band c2-4's N=3"]
    assert build_schedule([(Band(1, 4), 2), (Band(5, 8), 2)])[0] is None
