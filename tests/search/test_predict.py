"""The N-curve predictor (specflow.search.predict) and the adaptive search's pruning rule
(specflow.search).

The end-to-end check of both on the real CPU engine is bench/search_cost.py; here the arithmetic
is pinned on recorded counters and the pruning on constructed rounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from specflow.config.compose import load_plan
from specflow.decision.choose import analyze
from specflow.records.measurement import Measurement, WindowKey
from specflow.results.console import round_lines
from specflow.results.report import rounds_table
from specflow.search import predict, rounds, simulate
from specflow.search.advance import predicted_ratios
from specflow.search.plan import Round, Shape, race_rules, split_baseline
from specflow.spec.schema import PromoteSpec


def _window(engine: str, rates: tuple[float, ...], drafts: int = 100, tput: float = 100.0,
            c: int = 1, repeat: int = 0) -> Measurement:
    n = len(rates)
    return Measurement(
        key=WindowKey(engine, "chat", c, repeat), engine=engine, drafter="ngram", method="ngram",
        num_speculative_tokens=n, traffic_class="chat", output_throughput=tput,
        per_position_acceptance=rates, num_drafts=drafts,
        mean_acceptance_length=1 + sum(rates) if rates else None)


# ------------------------------------------------------------------- recorded counters

NGRAM_N5 = (0.876, 0.677, 0.549, 0.438, 0.394)
"""Per-position rates of the CPU engine's n-gram drafter at N=5 (tiny target, issue 13), with
the acceptance lengths measured on engines at N=1 and N=3: 1.909 and 3.225."""


def test_chain_acceptance_from_the_largest_n_matches_the_recorded_runs() -> None:
    acc = predict.acceptance([_window("ng5", NGRAM_N5)])
    assert acc is not None
    assert acc.mal(5) == pytest.approx(1 + sum(NGRAM_N5))
    assert acc.mal(1) == pytest.approx(1.876)
    assert acc.mal(3) == pytest.approx(3.102)
    # within 5% of what the N=1 and N=3 engines measured
    assert abs(acc.mal(1) / 1.909 - 1) < 0.05 and abs(acc.mal(3) / 3.225 - 1) < 0.05


def test_a_parallel_drafters_counters_give_its_acceptance_length_but_no_chain() -> None:
    # a published DSpark run at N=16: per-position rates summing to 3.35, acceptance length 4.35
    rates = (0.82, 0.64, 0.5, 0.38, 0.29, 0.21, 0.15, 0.11, 0.08, 0.06, 0.04, 0.03, 0.02,
             0.01, 0.005, 0.005)
    assert sum(rates) == pytest.approx(3.35)
    acc = predict.acceptance([dataclasses.replace(_window("ds16", rates), method="dspark")])
    assert acc is not None and acc.mal(16) == pytest.approx(4.35)
    # its other block sizes are measured, never predicted from this one
    _, plan = load_plan(["target=qwen3_8b", "hardware=h200", "drafter=[none,dspark,dflash]",
                         "+sweep.num_speculative_tokens.dspark=[4,7]"])
    assert predict.chains(plan.engine_configs) == {}


def test_windows_are_pooled_by_drafts_and_their_spread_is_the_sampling_error() -> None:
    a = _window("e", (0.8, 0.4), drafts=300)
    b = _window("e", (0.4, 0.2), drafts=100, repeat=1)
    acc = predict.acceptance([a, b])
    assert acc is not None
    assert acc.rates == pytest.approx((0.7, 0.35))  # draft-weighted
    assert acc.mal_se(2) == pytest.approx(0.3)  # sd of (2.2, 1.6) / sqrt(2)
    assert predict.acceptance([dataclasses.replace(a, per_position_acceptance=())]) is None


def test_the_cost_model_reproduces_the_probe_and_scales_linearly_in_n() -> None:
    acc = predict.acceptance([_window("ng5", NGRAM_N5)])
    assert acc is not None
    # at N = N_max the prediction is the probe's own speedup
    assert predict.speedup_at(acc, 1.4, 5, 5) == pytest.approx(1.4)
    # T(5)/T(0) = MAL(5)/1.4; T(k) is linear between: speedup(1) = MAL(1) / (1 + (T5 - 1)/5)
    t5 = acc.mal(5) / 1.4
    assert predict.speedup_at(acc, 1.4, 1, 5) == pytest.approx(acc.mal(1) / (1 + (t5 - 1) / 5))
    p = predict.predict(acc, (1.4, 1.3, 1.5), 2, 5)
    assert p.lo < predict.speedup_at(acc, 1.3, 2, 5) < p.value < predict.speedup_at(
        acc, 1.5, 2, 5) < p.hi
    assert p.hi / predict.speedup_at(acc, 1.5, 2, 5) == pytest.approx(1 + predict.MODEL_ERROR)


def test_the_ratio_to_the_probe_carries_only_the_fits_error_where_it_interpolates() -> None:
    acc = predict.acceptance([_window("ng5", NGRAM_N5)])
    assert acc is not None
    # at the probe's own N: exactly 1, no band (one window: no MAL sampling error either)
    assert predict.ratio_to_probe(acc, 1.4, 5, 5) == pytest.approx((1.0, 1.0, 1.0))
    # between: the prediction over the probe, MODEL_ERROR x the share of the step cost the
    # fit interpolates across (T(N)/T(N_max) = 1 + (N/N_max)(T5 - 1) over T5)
    value, lo, hi = predict.ratio_to_probe(acc, 1.4, 2, 5)
    t5 = acc.mal(5) / 1.4
    share = 1 - (1 + 0.4 * (t5 - 1)) / t5
    assert value == pytest.approx(predict.speedup_at(acc, 1.4, 2, 5) / 1.4)
    assert hi / value == pytest.approx(1 + predict.MODEL_ERROR * share)
    assert lo / value == pytest.approx(1 - predict.MODEL_ERROR * share)
    # a drafter that costs nothing (the probe's speedup is its acceptance length): the fit is
    # exact and the ratio is the acceptance lengths' ratio
    free = predict.ratio_to_probe(acc, acc.mal(5), 2, 5)
    assert free == pytest.approx((acc.mal(2) / acc.mal(5),) * 3)
    # the same N=2 on a second window that accepts less: MAL sampling error widens it
    two = predict.acceptance([_window("ng5", NGRAM_N5),
                              _window("ng5", tuple(r * 0.8 for r in NGRAM_N5), repeat=1)])
    assert two is not None
    v2, lo2, hi2 = predict.ratio_to_probe(two, 1.4, 2, 5)
    assert hi2 / v2 > hi / value and lo2 / v2 < lo / value


def test_chains_cover_one_series_at_a_time_and_skip_what_is_not_a_chain() -> None:
    _, plan = load_plan(["experiment=cpu_tiny", "drafter=[none,ngram,draft_model]",
                         "sweep.num_speculative_tokens.ngram=1..3",
                         "sweep.num_speculative_tokens.draft_model=[2,4]"])
    by_name = {e.name: e for e in plan.engine_configs}
    got = {by_name_of(plan, h): (by_name_of(plan, c.probe), c.n, c.probe_n)
           for h, c in predict.chains(plan.engine_configs).items()}
    assert got == {"ngram-n1": ("ngram-n3", 1, 3), "ngram-n2": ("ngram-n3", 2, 3),
                   "draft_model-n2": ("draft_model-n4", 2, 4)}
    assert "baseline" in by_name
    # an N schedule or adaptive verification breaks the chain: those are measured
    _, sched = load_plan(["experiment=cpu_tiny", "drafter=[none,ngram]",
                          "sweep.num_speculative_tokens.ngram=1..3",
                          "+drafter.ngram.num_speculative_tokens_per_batch_size=[[1,4,3]]"])
    assert predict.chains(sched.engine_configs) == {}


def by_name_of(plan: object, engine_hash: str) -> str:
    return next(e.name for e in plan.engine_configs if e.hash == engine_hash)  # type: ignore[attr-defined]


def test_versus_sets_each_prediction_beside_its_measurement() -> None:
    _, plan = load_plan(["experiment=cpu_tiny", "drafter=[none,ngram]",
                         "sweep.num_speculative_tokens.ngram=[1,5]"])
    e = {x.name: x for x in plan.engine_configs}
    ms = [dataclasses.replace(_window(e["ngram-n5"].hash, NGRAM_N5), engine="ngram-n5"),
          dataclasses.replace(_window(e["ngram-n1"].hash, (0.909,)), engine="ngram-n1")]
    speedups = {e["ngram-n5"].hash: {("chat", 1): (1.3, 1.2, 1.4)},
                e["ngram-n1"].hash: {("chat", 1): (1.25, 1.2, 1.3)}}
    (v,) = predict.versus(speedups, ms, plan.engine_configs)
    assert (v.engine, v.probe, v.n, v.workload, v.concurrency) == (
        "ngram-n1", "ngram-n5", 1, "chat", 1)
    assert v.predicted.mal == pytest.approx(1.876) and v.mal == pytest.approx(1.909)
    assert v.mal_error == pytest.approx(1.876 / 1.909 - 1)
    assert v.speedup_error == pytest.approx(
        predict.speedup_at(predict.acceptance([ms[0]]), 1.3, 1, 5) / 1.25 - 1)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- pruning rule


def _shape(levels: tuple[int, ...] = (1,)) -> Shape:
    chains = {"ng1": predict.Chain("ng3", 1, 3), "ng2": predict.Chain("ng3", 2, 3)}
    return Shape(design="race", baseline="base", candidates=("ng1", "ng2", "ng3"),
                        workloads={"chat": "chat"}, concurrency=levels, repeats=3,
                        closing_repeats=1, search="adaptive", chains=chains)


def _measure(current: Round, gains: Mapping[str, float], rates: tuple[float, ...],
             by_level: Mapping[int, tuple[Mapping[str, float], tuple[float, ...]]] | None = None,
             spread: float = 0.004) -> list[Measurement]:
    out = []
    for start in current.starts:
        for i, key in enumerate(start.window_keys()):
            if by_level:
                gains, rates = by_level[key.concurrency]
            spec = key.engine_hash != "base"
            out.append(Measurement(
                key=key, engine=key.engine_hash, drafter="ngram" if spec else "none",
                method="ngram" if spec else "none",
                num_speculative_tokens=int(key.engine_hash[-1]) if spec else 0,
                traffic_class="chat",
                output_throughput=100 * gains.get(key.engine_hash, 1.0) * (1 + spread * (i % 3)),
                duration_s=4, completed=8, output_digests=("same",) * 8, prompt_hash="p",
                seq=start.seq, stage=start.stage, round=start.round, engine_s=30 + 4 * i,
                per_position_acceptance=rates[:int(key.engine_hash[-1])] if spec else (),
                num_drafts=100 if spec else None))
    return out


@pytest.fixture(scope="module")
def promote_spec() -> PromoteSpec:
    return load_plan(["experiment=cpu_tiny"])[0].spec.promote


def test_the_first_round_measures_only_the_probe(promote_spec: PromoteSpec) -> None:
    progress = rounds.replay(_shape(), promote_spec, [])
    assert progress.current is not None
    assert [s.engine_hash for s in progress.current.starts] == ["base", "ng3", "base"]
    # the exhaustive search, or the grid design, measures every config
    grid = rounds.replay(dataclasses.replace(_shape(), search="exhaustive"), promote_spec, [])
    assert grid.current is not None
    assert {s.engine_hash for s in grid.current.starts} == {"base", "ng1", "ng2", "ng3"}


def test_a_config_predicted_far_below_the_baseline_is_never_started(
        promote_spec: PromoteSpec) -> None:
    shape = _shape()
    # the probe accepts little and costs a lot: N=1 and N=2 are predicted at ~0.8x
    rates = (0.05, 0.02, 0.01)
    ms: list[Measurement] = []
    started: list[str] = []
    for _ in range(10):
        progress = rounds.replay(shape, promote_spec, ms)
        if progress.current is None:
            break
        started += [s.engine_hash for s in progress.current.starts]
        ms += _measure(progress.current, {"ng3": 0.6, "ng1": 0.83, "ng2": 0.72}, rates)
    assert "ng1" not in started and "ng2" not in started
    (state,) = progress.states.values()
    why = dict(state.dropped)
    assert why["ng1"].startswith("round 0: ruled out: predicted 0.8")
    assert "not started" in why["ng1"]
    assert "from ng3: cannot win" in why["ng2"]
    table = "\n".join(rounds_table(progress.rounds, {"ng1": "ngram-n1"}))
    assert "ngram-n1 (round 0: ruled out: predicted 0.8" in table and "not started" in table


def test_a_config_predicted_close_to_winning_is_measured(promote_spec: PromoteSpec) -> None:
    shape = _shape()
    # the probe accepts well early and pays for its last positions: N=1 is predicted ~1.3x
    rates = (0.9, 0.3, 0.1)
    ms: list[Measurement] = []
    rounds_started: list[list[str]] = []
    for _ in range(12):
        progress = rounds.replay(shape, promote_spec, ms)
        if progress.current is None:
            break
        rounds_started.append([s.engine_hash for s in progress.current.starts])
        ms += _measure(progress.current, {"ng3": 1.0, "ng1": 1.33, "ng2": 1.18}, rates)
    assert rounds_started[0] == ["base", "ng3", "base"]
    # predicted able to win: measured, on its own start beside a baseline; the probe already
    # has its start and is not restarted for it
    assert rounds_started[1] == ["ng1", "base"]
    # ng2 is predicted below ng1 beyond a tie: ng1 leads the series, ng2 is not started
    assert "ng2" not in {h for r in rounds_started for h in r}
    (state,) = progress.states.values()
    assert "at best a tie (2%) with N=1's" in dict(state.dropped)["ng2"], state.dropped
    assert state.contenders == ("ng1",), state  # and the measurement, not the prediction, won
    assert state.status in ("promote", "unresolved", "confirming")


def test_a_config_its_probe_beats_is_not_started_even_when_the_probe_is_noisy(
        promote_spec: PromoteSpec) -> None:
    """Windows 25% apart give the probe a band interval so wide that no prediction against the
    baseline can prune; against its own probe (same engine start, same baseline) the shorter N
    values are predicted well below it, so they are not started, and the trail says why."""
    shape = _shape()
    rates = (0.95, 0.9, 0.85)  # accepts nearly everything: every extra position pays
    ms: list[Measurement] = []
    started: list[str] = []
    first: rounds.SearchState | None = None
    for _ in range(10):
        progress = rounds.replay(shape, promote_spec, ms)
        if progress.current is None:
            break
        started += [s.engine_hash for s in progress.current.starts]
        ms += _measure(progress.current, {"ng3": 1.6, "ng1": 1.3, "ng2": 1.45}, rates,
                       spread=0.25)
        first = first or (progress if progress.rounds else None)
    assert "ng1" not in started and "ng2" not in started
    (state,) = progress.states.values()
    why = dict(state.dropped)
    assert "x its probe ng3" in why["ng2"] and "at best a tie (2%) with the probe" in why["ng2"]
    # the baseline-band rule alone would have kept it: its predicted upper bound clears both
    # the margin and the probe's lower bound
    assert first is not None
    (after,) = first.rounds[0].states
    probe = after.estimates["ng3"]
    assert probe.lo < 1.3 < 1.6 < probe.hi, probe


def test_a_config_pruned_in_one_band_is_measured_only_where_it_can_win(
        promote_spec: PromoteSpec) -> None:
    """Pruned at c=1 (predicted far below), predicted close at c=4: started once its band
    needs it, measured there only, and the race still decides (no window is asked for at the
    band where it was pruned)."""
    shape = _shape((1, 4))
    levels = {1: ({"ng3": 0.6, "ng1": 0.83, "ng2": 0.72}, (0.05, 0.02, 0.01)),
              4: ({"ng3": 1.0, "ng1": 1.33, "ng2": 1.18}, (0.9, 0.3, 0.1))}
    ms: list[Measurement] = []
    for _ in range(12):
        progress = rounds.replay(shape, promote_spec, ms)
        assert not progress.problems, progress.problems
        if progress.current is None:
            break
        ms += _measure(progress.current, {}, (), levels)
    assert {m.key.concurrency for m in ms if m.key.engine_hash == "ng1"} == {4}
    states = {k[1]: st for k, st in progress.states.items()}
    assert dict(states["c1"].dropped)["ng1"].startswith("round 0: ruled out: predicted")
    assert states["c4"].contenders == ("ng1",)


def test_a_kv_cache_that_holds_fewer_requests_than_the_level_caps_the_prediction() -> None:
    acc = predict.acceptance([_window("ng5", NGRAM_N5)])
    assert acc is not None
    p = predict.predict(acc, (1.4, 1.3, 1.5), 2, 5)
    # it holds 2 requests at the context length: at c=8 it runs at most 2 at once
    capped = predict.kv_capped(p, 8, 2)
    assert capped.kv_capacity == 2
    assert capped.value == pytest.approx(p.value / 4) and capped.lo == pytest.approx(p.lo / 4)
    assert capped.hi == p.hi and capped.mal == p.mal  # the upper bound never prunes on its own
    assert predict.kv_capped(p, 2, 2) == p and predict.kv_capped(p, 8, None) == p
    # through the points of a chain: only the level above the capacity is capped
    ch = predict.Chain("ng5", 2, 5)
    windows = {("chat", 1): [_window("ng5", NGRAM_N5)],
               ("chat", 8): [_window("ng5", NGRAM_N5, c=8)]}
    speedups = {("chat", 1): (1.4, 1.3, 1.5), ("chat", 8): (1.4, 1.3, 1.5)}
    preds = predict.point_predictions(ch, windows, speedups, kv_capacity=2)
    assert preds[("chat", 1)].kv_capacity is None
    assert preds[("chat", 8)].kv_capacity == 2
    assert preds[("chat", 8)].value == pytest.approx(preds[("chat", 1)].value / 4)


def test_the_search_predicts_a_candidate_capped_by_its_kv_cache(
        promote_spec: PromoteSpec) -> None:
    """ng1 is predicted ~1.3x at c=4 from its probe, but its KV cache holds 1 request: the
    predicted value and lower bound drop by 4x and the trail says why; its upper bound keeps
    it in the race (a cap alone never prunes), so it is measured and decided on measurement."""
    shape = dataclasses.replace(_shape((4,)), kv_capacity={"ng1": 1})
    first = rounds.replay(shape, promote_spec, [])
    assert first.current is not None
    ms = _measure(first.current, {"ng3": 1.0}, (0.9, 0.3, 0.1))
    windows = {("ng3", "chat", 4): [m for m in ms if m.key.engine_hash == "ng3"]}
    after = rounds.replay(shape, promote_spec, ms)
    assert after.current is not None and "ng1" in {s.engine_hash for s in after.current.starts}
    iv = predicted_ratios(shape.chains["ng1"], _probe_verdict(shape, promote_spec, ms),
                           windows, [("chat", 4)], 1.96, 1)
    uncapped = predicted_ratios(shape.chains["ng1"], _probe_verdict(shape, promote_spec, ms),
                                 windows, [("chat", 4)], 1.96)
    assert iv is not None and uncapped is not None
    assert iv.value == pytest.approx(uncapped.value / 4) and iv.hi == uncapped.hi
    assert iv.point == "chat c=4, KV holds 1"


def _probe_verdict(shape: Shape, promote_spec: PromoteSpec, ms: list[Measurement]
                   ) -> object:

    opening, later = split_baseline(ms, shape.baseline)
    result = analyze(opening, race_rules(promote_spec), closing_baseline=later,
                              family="none", stage="explore", partial=True)
    return next(v for r in result.classes for d in r.decisions for v in d.candidates
                if v.engine_hash == "ng3")


# ------------------------------------------------------------- the predictor's self-check

LLAMA_EAGLE3 = (0.7296, 0.5208, 0.3545)
"""vLLM CI, spec-decode acceptance (MT-Bench, N=3, temperature 0): Llama-3.1-8B with its EAGLE-3
head, per-position rates; acceptance length 2.60."""
QWEN3_EAGLE3 = (0.6541, 0.3993, 0.2020)
"""The same CI job: Qwen3-8B with EAGLE-3; acceptance length 2.26."""
MTP_PR48892_N8 = (0.762, 0.616, 0.513, 0.424, 0.364, 0.309, 0.272, 0.237)
"""vLLM PR 48892 (a multi-layer MTP, GSM8K, temperature 0): rates at N=8 (acceptance length
4.50); its first position is accepted 0.834 at N=1 (`MTP_PR48892_N1`)."""
MTP_PR48892_N1 = 0.834
DSV4_MTP_AL = {1: 1.79, 2: 2.27, 3: 2.49, 4: 2.54, 5: 2.55, 6: 2.55, 7: 2.54, 8: 2.58}
"""InferenceX golden acceptance length of DeepSeek-V4-Pro with its MTP layer at N = 1..8."""
DSV4_DSPARK_AL = {6: 3.77, 7: 3.73, 8: 3.47}
"""InferenceX golden acceptance length of DeepSeek-V4-Pro with DSpark at N = 6..8."""


def _acc(rates: tuple[float, ...]) -> predict.Acceptance:
    acc = predict.acceptance([_window("x", rates)])
    assert acc is not None
    return acc


def test_the_chain_check_holds_on_chains_and_misses_a_multi_layer_mtp() -> None:
    for rates, al in ((LLAMA_EAGLE3, 2.60), (QWEN3_EAGLE3, 2.26)):
        probe = _acc(rates)
        assert probe.mal(3) == pytest.approx(al, abs=0.01)
        # an engine at N=1 of a chain proposes the first token of N=3's proposal
        check = predict.check_chain(probe, _acc(rates[:1]), 1, 3)
        assert check is not None and check.holds and check.measured == check.predicted
        # within the tolerance, not beyond it
        near = predict.check_chain(probe, _acc((rates[0] * 1.01,)), 1, 3)
        far = predict.check_chain(probe, _acc((rates[0] * 1.1,)), 1, 3)
        assert near is not None and near.holds and far is not None and not far.holds
    probe = _acc(MTP_PR48892_N8)
    assert probe.mal(8) == pytest.approx(4.50, abs=0.01)
    check = predict.check_chain(probe, _acc((MTP_PR48892_N1,)), 1, 8)
    assert check is not None and not check.holds
    assert check.predicted == pytest.approx(1.762) and check.measured == pytest.approx(1.834)
    assert check.text().startswith("chain check at N=1 missed: acceptance length 1.834 "
                                   "measured, 1.762 +/- 0.018 predicted from N=8")
    # the other window's spread widens what a chain may miss by
    noisy = predict.acceptance([_window("x", (0.80,)), _window("x", (0.87,), repeat=1)])
    assert noisy is not None
    wide = predict.check_chain(probe, noisy, 1, 8)
    assert wide is not None and wide.allowed > check.allowed and wide.holds


def test_a_curve_that_falls_or_bends_up_is_not_a_chain() -> None:
    # published to two decimals: each figure +/- 0.005
    assert "grows faster from N=7 to N=8" in predict.chain_curve(DSV4_MTP_AL, atol=0.01)
    assert predict.chain_curve(DSV4_DSPARK_AL, atol=0.01).startswith(
        "acceptance length falls from 3.770 at N=6 to 3.730 at N=7")
    # a chain's own curve (the prefix sums of its rates) passes, flat tail included
    for rates in (LLAMA_EAGLE3, QWEN3_EAGLE3, MTP_PR48892_N8, (0.9, 0.2, 0.0, 0.0)):
        acc = _acc(rates)
        assert predict.chain_curve({n: acc.mal(n) for n in range(1, len(rates) + 1)}) == ""
    # a fall within the windows' standard errors is noise, not a break
    assert predict.chain_curve({1: 1.8, 2: 1.78}, {1: 0.02, 2: 0.02}) == ""
    assert predict.chain_curve({1: 1.8, 2: 1.78}) != ""


def _series_shape(levels: tuple[int, ...] = (1,)) -> Shape:
    """One n-gram series at N = 1..4: N=4 the probe, N=1 its chain check, N=2 and 3 predicted."""
    chains = {"ng1": predict.Chain("ng4", 1, 4, check=True), "ng2": predict.Chain("ng4", 2, 4),
              "ng3": predict.Chain("ng4", 3, 4)}
    return Shape(design="race", baseline="base", candidates=("ng1", "ng2", "ng3", "ng4"),
                 workloads={"chat": "chat"}, concurrency=levels, repeats=3, closing_repeats=1,
                 search="adaptive", chains=chains)


def _race_series(promote_spec: PromoteSpec, first: float, levels: tuple[int, ...] = (1,),
                 starts: list[Round] | None = None
                 ) -> tuple[list[list[str]], rounds.SearchState, list[Measurement]]:
    """The series raced with the probe at PR 48892's rates and N=1's first position accepted
    `first`; the probe pays for its drafts (0.7x), so a chain predicts N=2 and 3 below 1.
    `starts` collects the rounds run."""
    started: list[list[str]] = []
    ms: list[Measurement] = []
    gains = {"ng4": 0.7, "ng1": 0.95, "ng2": 0.85, "ng3": 0.78}
    for _ in range(12):
        progress = rounds.replay(_series_shape(levels), promote_spec, ms)
        if progress.current is None:
            break
        started.append([s.engine_hash for s in progress.current.starts])
        if starts is not None:
            starts.append(progress.current)
        for m in _measure(progress.current, gains, MTP_PR48892_N8[:4]):
            if m.key.engine_hash == "ng1":
                m = dataclasses.replace(m, per_position_acceptance=(first,))
            ms.append(m)
    return started, progress, ms


def test_the_probe_round_checks_the_chain_and_measures_a_series_that_misses(
        promote_spec: PromoteSpec) -> None:
    # a chain: N=1 accepts what N=4's first position does; N=2 and 3 are predicted, not started
    started, progress, _ = _race_series(promote_spec, MTP_PR48892_N8[0])
    assert started[0] == ["base", "ng1", "ng4", "base"]
    assert not {"ng2", "ng3"} & {h for r in started for h in r}
    (state,) = progress.states.values()
    ((probe, note),) = state.notes
    assert probe == "ng4" and note.startswith("chain check at N=1 holds: acceptance length 1.762")
    assert note.endswith("its other N are predicted from the probe")
    # a multi-layer MTP's N=1 accepts more than the chain allows: N=2 and 3 are measured
    started, progress, ms = _race_series(promote_spec, MTP_PR48892_N1)
    assert started[0] == ["base", "ng1", "ng4", "base"]
    assert {"ng2", "ng3"} <= set(started[1]), started
    (state,) = progress.states.values()
    ((probe, note),) = state.notes
    assert note.startswith("chain check at N=1 missed: acceptance length 1.834 measured, 1.762")
    assert note.endswith("not a chain: its other N are measured, not predicted")
    assert not any(why.startswith("round 0: ruled out: predicted") for _, why in state.dropped)
    table = "\n".join(rounds_table(progress.rounds, {"ng4": "ngram-n4"}))
    assert "chat c1: ngram-n4's series: chain check at N=1 missed" in table
    # and the console's line after the probe round
    after_probes = rounds.replay(_series_shape(), promote_spec, [m for m in ms if m.round == 0])
    lines = round_lines(after_probes, {"ng4": "ngram-n4"})
    assert "    ngram-n4's series: chain check at N=1 missed: acceptance length 1.834" in "\n".join(
        lines), lines


def test_the_chain_check_is_measured_at_the_top_level_and_judges_the_series_in_every_band(
        promote_spec: PromoteSpec) -> None:
    """Two levels, one band each: the check (N=1) starts with the top level's windows only, is
    predicted at c=1 like any held-back N, and its verdict on the chain holds for both bands."""
    ran: list[Round] = []
    started, progress, _ = _race_series(promote_spec, MTP_PR48892_N8[0], (1, 8), ran)
    assert started[0] == ["base", "ng1", "ng4", "base"]
    first = {s.engine_hash: s.points for s in ran[0].starts}
    assert first["ng1"] == (("chat", 8),) and first["ng4"] == (("chat", 1), ("chat", 8))
    # a chain: at c=1, N=1 is predicted from the probe and never started there; N=2 and 3 nowhere
    assert all(s.points == (("chat", 8),) for r in ran for s in r.starts if s.engine_hash == "ng1")
    assert not {"ng2", "ng3"} & {h for r in started for h in r}
    low = progress.states[("chat", "c1")]
    assert any(h == "ng1" and why.startswith("round 0: ruled out: predicted")
               for h, why in low.dropped), low.dropped
    for st in progress.states.values():
        ((_, note),) = st.notes
        assert note.startswith("chain check at N=1 holds") and note.endswith("from the probe")
    # not a chain, seen at c=8 only: every N of the series is measured at c=1 as well
    ran.clear()
    started, progress, _ = _race_series(promote_spec, MTP_PR48892_N1, (1, 8), ran)
    second = {s.engine_hash: s.points for s in ran[1].starts}
    assert {"ng1", "ng2", "ng3"} <= set(second) and ("chat", 1) in second["ng1"], second
    for st in progress.states.values():
        ((_, note),) = st.notes
        assert note.startswith("chain check at N=1 missed") and note.endswith("not predicted")
        assert not any(why.startswith("round 0: ruled out: predicted") for _, why in st.dropped)


def test_a_series_of_three_or_more_is_checked_at_its_smallest_n() -> None:
    _, plan = load_plan(["experiment=cpu_tiny", "drafter=[none,ngram,draft_model]",
                         "sweep.num_speculative_tokens.ngram=1..4",
                         "sweep.num_speculative_tokens.draft_model=[2,4]"])
    checks = {by_name_of(plan, h): c.check for h, c in predict.chains(plan.engine_configs).items()}
    assert checks == {"ngram-n1": True, "ngram-n2": False, "ngram-n3": False,
                      "draft_model-n2": False}


def test_the_gpu_plan_simulated_flags_the_multi_layer_mtp_and_decides_right() -> None:
    """bench/search_cost_simulated.py's plans, one sweep each through the real planner: the
    chain drafters' checks hold within 2% and the adaptive search starts fewer engines than the
    racing grid; PR 48892's MTP is flagged and measured at every N."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import search_cost_simulated as bench

    chains = bench.trial(("chains", "adaptive", 0, 0))
    grid = bench.trial(("chains", "exhaustive", 0, 0))
    assert not chains.error and not grid.error
    assert chains.flagged and not any(chains.flagged)
    assert chains.mal_errors and max(chains.mal_errors) < predict.CHAIN_TOLERANCE
    assert chains.starts < grid.starts and chains.engine_s < grid.engine_s
    truth = bench.band_speedups("chains")
    assert all(bench.right(d, truth[b]) for b, d in chains.decisions), chains.decisions
    mixed = bench.trial(("mixed", "adaptive", 0, 0))
    assert mixed.flagged and all(mixed.flagged)
    scn, what = bench.build_scenario("mixed", "adaptive")
    prog, ms = simulate.run_sweep(scn, bench.NOISE, bench.PROMOTE, seed=3)
    started = {what[m.key.engine_hash] for m in ms if m.key.engine_hash in what}
    assert {("mtp", k) for k in range(1, 8)} <= started
