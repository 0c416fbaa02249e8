"""The capacity search's parts where the answer is known: the bracketing over rates, when a
window keeps the SLOs, and the estimate over engine starts (its error and coverage on simulated
servers are bench/capacity.py's)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specflow.config.compose import load
from specflow.decision.aggregate import score
from specflow.decision.capacity import (
    StartCapacity,
    Step,
    bracket,
    decided,
    dithered,
    estimate,
    holds,
    next_rate,
    next_step,
    ratio,
    replicas,
    searches,
)
from specflow.decision.choose import analyze
from specflow.decision.wording import decision_rows
from specflow.engine.runner import plan_windows
from specflow.records.measurement import STEP, Measurement, WindowKey
from specflow.results.console import decision_lines, deploy_lines
from specflow.results.report import markdown
from specflow.search.plan import Shape, observed_costs
from specflow.spec.errors import SpecError
from specflow.spec.schema import ArrivalSpec, CapacitySpec, PromoteSpec, SloSpec
from tests.builders import BASELINE, Cand, engine, sweep, window

NGRAM = engine("ngram-n8", "ngram", 8)


def _search(capacity: float, start: float = 1.0, **kw: float) -> list[Step]:
    """The search against a server that holds exactly below `capacity`."""
    steps: list[Step] = []
    while (r := next_rate(steps, start, floor=kw.get("floor", 0.1),
                          ceiling=kw.get("ceiling", 64.0))) is not None:
        steps.append(Step(r, r < capacity))
    return steps


@pytest.mark.parametrize("capacity", [0.7, 3.3, 9.0, 40.0])
def test_the_search_brackets_the_capacity_within_its_resolution(capacity: float) -> None:
    steps = _search(capacity)
    b = bracket(steps)
    assert b.low is not None and b.high is not None and not b.censored
    assert b.low < capacity <= b.high and b.high / b.low <= 1.1
    assert abs(b.estimate / capacity - 1) < 0.05
    assert len(steps) <= 12
    assert [p.rate for p in steps][:2] == ([1.0, 2.0] if capacity > 1 else [1.0, 0.5])


def test_a_search_that_never_fails_or_never_holds_is_censored_at_its_ends() -> None:
    up = bracket(_search(1000.0, ceiling=16.0))
    assert (up.low, up.high, up.censored, up.estimate) == (16.0, None, "above", 16.0)
    down = bracket(_search(0.01, floor=0.25))
    assert (down.low, down.high, down.censored, down.estimate) == (None, 0.25, "below", 0.25)


def test_a_window_keeps_the_slos_only_complete_steady_and_within_every_bound() -> None:
    slo = SloSpec(p99_e2el_ms=1500.0, p99_tpot_ms=50.0)
    ok = window(BASELINE, 100.0, latency={"p99_e2el_ms": 1400.0, "p99_tpot_ms": 40.0})
    assert holds(ok, slo)
    assert not holds(window(BASELINE, 100.0, latency={"p99_e2el_ms": 1600.0,
                                                     "p99_tpot_ms": 40.0}), slo)
    assert not holds(window(BASELINE, 100.0, latency={"p99_e2el_ms": 1400.0}), slo)
    assert not holds(dataclasses.replace(ok, overload=True), slo)
    assert not holds(window(BASELINE, 100.0, failure="crashed"), slo)
    assert not holds(window(BASELINE, 100.0, failed_requests=1,
                            latency={"p99_e2el_ms": 1.0, "p99_tpot_ms": 1.0}), slo)


def test_the_estimate_over_starts_and_the_ratio_and_replicas() -> None:
    caps = [StartCapacity(x / 1.05, x * 1.05) for x in (3.8, 4.0, 4.2)]
    e = estimate(caps)
    assert e.starts == 3 and e.censored == 0
    assert math.isclose(e.value, (3.8 * 4.0 * 4.2) ** (1 / 3), rel_tol=1e-9)
    assert e.lo is not None and e.hi is not None and e.lo < e.value < e.hi
    assert replicas(20.0, e.lo) == math.ceil(20.0 / e.lo)
    one = estimate(caps[:1])
    assert one.lo is None and replicas(20.0, one.lo) is None
    twice = [StartCapacity(2 * c.low, 2 * c.high) for c in caps]  # type: ignore[operator]
    r = ratio(twice, caps)
    assert r is not None and math.isclose(r[0], 2.0) and r[1] < 2.0 < r[2]
    assert ratio(caps[:1], caps) is None


# --------------------------------------------------------------------------------------------
# Capacity as the objective a sweep decides on: each planned window starts a search whose
# steps are windows of their own; the decision reads each search as one record.

SLO = SloSpec(p99_e2el_ms=3000.0)
CAPACITY = PromoteSpec(objective="capacity",
                       capacity=CapacitySpec(slo=SLO, resolution=0.05, target_load=40.0))
PER_REQUEST = 25.0
"""A window's throughput over its search's true capacity (tokens per request)."""


def _searched(ms: list[Measurement], start: float = 2.0, *, broken_at: int | None = None
              ) -> list[Measurement]:
    """Each builder window as the capacity search it starts: its true capacity is its
    throughput / PER_REQUEST (so a candidate `speedup` times faster takes `speedup` times the
    requests), a rate holds below it (p99 e2el 1 s) and not above (9 s; from twice it, the
    queue grows: overload); each step after the first is keyed repeat + k x STEP. The rates
    come from `next_step`, as the runner asks for them. `broken_at`: the engine dies at that
    step of the baseline's first search."""
    out: list[Measurement] = []
    for m in ms:
        cap = m.output_throughput / PER_REQUEST
        steps: list[Measurement] = []
        rate: float | None = start
        while rate is not None:
            k = len(steps)
            held, over = rate < cap, rate > 2 * cap
            p = dataclasses.replace(
                m, key=dataclasses.replace(m.key, workload="chat@capacity",
                                           repeat=m.key.repeat + STEP * k),
                request_rate=rate, overload=over, backlog_growth=0.5 if over else 0.0,
                output_throughput=min(rate, cap) * PER_REQUEST,
                latency_ms={**m.latency_ms, "p99_e2el_ms": 1000.0 if held else 9000.0})
            if broken_at == k and m.method == "none" and m.key.repeat == 0:
                p = dataclasses.replace(p, status="failed", failure="engine_down",
                                        failure_detail="the engine stopped serving")
            steps.append(p)
            rate = next_step(steps, CAPACITY)
        out += steps
    return out


def _capacity_sweep(gain: float, seed: int, **kw: Any) -> list[Measurement]:
    opening, _ = sweep([Cand(NGRAM, gain)], workloads=("chat",), cls="chat", repeats=5,
                       cv=0.03, rng=np.random.default_rng(seed))
    return _searched(opening, **kw)


def test_a_search_reads_as_one_record_of_its_capacity() -> None:
    """The steps of one search become one record keyed as its planned window: its score is
    the bracket's geometric midpoint, its latency that of the highest rate that held; a second
    pass changes nothing; a search the engine's death ended, or one still under way, fails
    with why, and one that held nowhere down to the floor has no capacity."""
    ms = _searched([window(BASELINE, 100.0, workload="chat", cls="chat")], start=1.0)
    rates = [m.request_rate or 0.0 for m in ms]
    assert rates[:3] == [1.0, 2.0, 4.0] and [m.key.repeat for m in ms] == [
        k * STEP for k in range(len(ms))]  # doubling until 4 fails, then halving the bracket
    low, high = max(r for r in rates if r < 4.0), min(r for r in rates if r >= 4.0)
    assert high / low <= 1.05 and len(ms) <= 10
    (one,) = searches(ms, CAPACITY)
    assert one.key == ms[0].key and one.search_rates == tuple(rates)
    assert one.ok and one.request_rate == pytest.approx(math.sqrt(low * high))
    assert one.latency_ms["p99_e2el_ms"] == 1000.0
    held = next(m for m in ms if m.request_rate == low)
    assert one.output_throughput == held.output_throughput
    assert score(one, CAPACITY) == one.request_rate and math.isnan(score(ms[0], CAPACITY))
    assert searches([one], CAPACITY) == [one]
    # a throughput class decides on none of it (a search beside its objective, `beside`)
    assert decided(ms, PromoteSpec()) == [] and decided(ms, CAPACITY) == [one]
    # an engine that died mid-search: the search failed with that failure
    broken = _searched([window(BASELINE, 100.0, workload="chat", cls="chat")], start=1.0,
                       broken_at=2)
    assert len(broken) == 3  # nothing offered after the failure
    (b,) = searches(broken, CAPACITY)
    assert not b.ok and b.failure == "engine_down" and "step 2 (4 req/s)" in b.failure_detail
    assert next_step(broken, CAPACITY) is None
    # under way (the sweep stopped mid-search): failed as unfinished, never a capacity
    (u,) = searches(ms[:4], CAPACITY)
    assert not u.ok and u.failure == "search_incomplete"
    # nothing held, down to the floor
    low = _searched([window(BASELINE, 0.1, workload="chat", cls="chat")], start=1.0)
    (n,) = searches(low, CAPACITY)
    assert min(n.search_rates) == CAPACITY.capacity.floor
    assert not n.ok and n.failure == "no_capacity"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_capacity_class_promotes_the_setting_that_takes_more_requests(seed: int) -> None:
    """n-gram takes 1.4x the requests within the SLO: promoted on capacity with a speedup
    near 1.4 (the search's resolution is 5%), the console saying each engine's capacity in
    req/s and the report the replicas a target load needs; the same drafter without a gain is
    never promoted."""
    r = analyze(_capacity_sweep(1.4, seed), CAPACITY).result("chat")
    assert r.objective == "capacity (p99_e2el_ms <= 3000)"
    d = r.decisions[0]
    assert d.outcome == "promote" and d.winner is not None and d.winner.worst is not None
    assert 1.3 < d.winner.worst.speedup.value < 1.5
    base, mine = r.capacity(r.deployment.baseline_hash), r.capacity(NGRAM.hash)
    assert base is not None and mine is not None
    assert 3.8 < base.value < 4.2 and 5.4 < mine.value < 5.9, (base, mine)
    (line,) = deploy_lines(decision_rows(r))
    assert line.startswith(f"chat: ngram with N=8 at concurrency 1: one replica takes "
                           f"{mine.value:.3g} [{mine.lo:.3g}, {mine.hi:.3g}] req/s within "
                           f"p99_e2el_ms <= 3000; without it {base.value:.3g} ")
    assert "x the requests per replica (interval [" in line
    assert decision_lines(decision_rows(r))[0]["class"] == \
        "chat [capacity (p99_e2el_ms <= 3000)]"
    a = analyze(_capacity_sweep(1.4, seed), CAPACITY)
    report = markdown(a)
    assert "### Capacity within the SLOs" in report and "replicas for 40 req/s" in report
    need = math.ceil(40.0 / base.lo)
    assert re.search(rf"^\| baseline \| chat@capacity \| 1 \| [\d.]+ \[[\d.]+, [\d.]+\] \| "
                     rf"5 of 5 \| {need} \|$", report, re.M), report
    flat = analyze(_capacity_sweep(1.0, seed), CAPACITY).result("chat")
    assert flat.decisions[0].outcome != "promote"


def test_a_failed_search_counts_as_a_failed_window() -> None:
    """The baseline's first search ended by the engine's death is left out (four of five
    found a capacity), and the decision still stands on the others."""
    a = analyze(_capacity_sweep(1.4, 0, broken_at=2), CAPACITY)
    base = next(p for p in a.points if p.is_baseline)
    assert base.n_ok == 4 and base.failures == {"engine_down": 1}
    assert a.result("chat").decisions[0].outcome == "promote"


def test_a_workload_measured_every_way_is_its_points_and_says_what_it_needs() -> None:
    """One workload measured three ways: at offered rates (latency), by a capacity search from
    a rate (one point, `<workload>@capacity`) and closed loop (`closed_loop: true`); each
    window knows what it answers, and the class is decided on its objective's points. A class
    without a point of its objective, a service decided on capacity, or capacity in an adaptive
    race is a problem naming the field, all at once; the search's settings are checked."""
    spec = load(["experiment=cpu_demo", "workload=[code_completion,classify]",
                 "workload.code_completion.arrival={request_rate: [2], capacity_from: 4, "
                 "closed_loop: true}", "+promote.objectives.code=capacity",
                 "promote.capacity.slo={p99_e2el_ms: 900}", "promote.capacity.target_load=30",
                 "sweep.search=exhaustive"]).spec
    points = {n: w.arrival for n, w in spec.workload.items() if w.traffic_class == "code"}
    assert points == {"code_completion": None,
                      "code_completion@2rps": ArrivalSpec(request_rate=[2.0], burstiness=1.0),
                      "code_completion@capacity": ArrivalSpec(capacity_from=4.0,
                                                              burstiness=1.0)}
    assert spec.promote.objective_for("code") == "capacity"
    assert spec.promote.capacity_slo == SloSpec(p99_e2el_ms=900)
    windows = plan_windows(spec.workload, dict.fromkeys(spec.workload, Path("x.jsonl")),
                           [4], 2, 0)
    code = {(w.workload, w.request_rate, w.search) for w in windows if w.traffic_class == "code"}
    assert code == {("code_completion", None, False), ("code_completion@2rps", 2.0, False),
                    ("code_completion@capacity", 4.0, True)}
    answers = {w: dataclasses.replace(window(BASELINE, 1.0, workload=w, cls="code"),
                                      request_rate=r).answers for w, r, _ in code}
    assert answers == {
        "code_completion": "throughput", "code_completion@2rps": "latency",
        "code_completion@capacity": "capacity"}
    with pytest.raises(SpecError) as err:
        load(["experiment=cpu_demo", "workload=[code_completion,classify]",
              "workload.code_completion.arrival={request_rate: [2, 4]}",
              "+promote.objectives.code=capacity", "+promote.objectives.classify=capacity"])
    got = {p.path: p for p in err.value.problems}
    assert set(got) == {"workload.code_completion.arrival", "workload.classify.arrival",
                        "sweep.search"}, got
    assert "decided on capacity" in got["workload.code_completion.arrival"].problem
    assert "capacity_from: req/s" in got["workload.classify.arrival"].expected
    assert "decided on capacity" in got["sweep.search"].problem
    with pytest.raises(SpecError) as err:  # throughput, with nothing closed loop
        load(["experiment=cpu_demo", "workload=[code_completion]",
              "workload.code_completion.arrival={capacity_from: 4}"])
    (p,) = err.value.problems
    assert p.path == "workload.code_completion.arrival" and p.got == {"capacity_from": 4.0}
    assert "arrival.closed_loop: true" in p.expected
    with pytest.raises(SpecError) as err:
        load(["experiment=cpu_demo", "promote.capacity.floor=5", "promote.capacity.ceiling=2"])
    assert [(p.path, p.got) for p in err.value.problems] == [
        ("promote.capacity.floor", {"floor": 5.0, "ceiling": 2.0})]
    with pytest.raises(SpecError) as err:
        load(["experiment=cpu_demo", "workload=[code_completion,classify]",
              "service=[assistant]", "+promote.objectives.assistant=capacity",
              "sweep.search=exhaustive"])
    assert [p.path for p in err.value.problems] == ["promote.objectives.assistant"]
    assert "capacity is measured at offered rates" in err.value.problems[0].problem


def test_a_planned_capacity_window_costs_its_steps() -> None:
    """The race projects a round's engine seconds per planned window: a search costs its steps'
    windows together (here a closed-loop window of 10 s and a search of 3 steps of 4 s: 11 s
    a planned window on average), so a budget in engine seconds holds for capacity classes."""
    closed = dataclasses.replace(window(BASELINE, 100.0, workload="chat", cls="chat"),
                                 duration_s=10.0)
    steps = [dataclasses.replace(
        window(BASELINE, 100.0, workload="chat@capacity", cls="chat"), duration_s=4.0,
        key=WindowKey(BASELINE.hash, "chat@capacity", 1, k * STEP)) for k in range(3)]
    shape = Shape(design="race", baseline=BASELINE.hash, candidates=(),
                  workloads={"chat": "chat", "chat@capacity": "chat"}, concurrency=(1,),
                  repeats=2, closing_repeats=0)
    assert observed_costs([closed, *steps], shape)[1] == pytest.approx((10.0 + 12.0) / 2)


def test_a_search_starts_near_its_rate_dithered_by_its_key() -> None:
    """Each search starts within a factor sqrt(2) of the stated rate, the same for the same key
    (a resumed search starts where it did), spread over that range across searches."""
    starts = [dithered(16.0, f"e/chat@capacity/c4/r{r}") for r in range(400)]
    assert all(16.0 / math.sqrt(2) <= s < 16.0 * math.sqrt(2) for s in starts)
    assert dithered(16.0, "e/chat@capacity/c4/r0") == starts[0]
    logs = np.log2(np.asarray(starts) / 16.0)
    assert abs(float(logs.mean())) < 0.05 and 0.25 < float(logs.std()) < 0.33  # uniform: 0.29
