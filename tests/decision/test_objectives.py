"""A class decided for latency at offered request rates (open loop), where the answer is known:
the decision scores each window on the latency statistic and never on the throughput an open
loop cannot show; a rate the server cannot keep up with is overload, found from the backlog of
the window's requests, reported and never scored; and the configuration says what it needs."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from specflow.config.compose import load
from specflow.decision.choose import AnalysisError, analyze
from specflow.decision.wording import decision_rows
from specflow.demo import traces
from specflow.engine.runner import latency_stats
from specflow.records.measurement import Measurement
from specflow.results.console import decision_lines, deploy_lines
from specflow.results.report import markdown
from specflow.spec.compile import compile_plan
from specflow.spec.errors import SpecError
from specflow.spec.schema import PromoteSpec
from specflow.stats.queueing import GROWTH, backlog, served
from tests.builders import Cand, engine, sweep

NGRAM = engine("ngram-n8", "ngram", 8)
LATENCY = PromoteSpec(objective="latency", latency_statistic="mean_e2el_ms")
E2EL_MS = 2000.0
"""The baseline's mean end-to-end latency."""


def _open_loop(ms: list[Measurement], rate: float, *, overload: bool = False
               ) -> list[Measurement]:
    """The builders' windows as open-loop ones: each window's latency is its score's inverse
    (a candidate `speedup` times faster has 1/speedup of the baseline's latency), and every
    window completes what it was offered, so the throughput is the same for all."""
    return [dataclasses.replace(
        m, key=dataclasses.replace(m.key, workload=f"{m.key.workload}@{rate:g}rps"),
        output_throughput=rate * 100.0, request_rate=rate, overload=overload,
        backlog_growth=0.8 if overload else 0.0,
        latency_ms={**m.latency_ms, "mean_e2el_ms": E2EL_MS * 100.0 / m.output_throughput
                    * (30.0 if overload else 1.0)}) for m in ms]


def _windows(gain: float, seed: int, rate: float = 2.0, overload: bool = False
             ) -> list[Measurement]:
    opening, _ = sweep([Cand(NGRAM, gain)], workloads=("chat",), cls="chat", repeats=5,
                       cv=0.03, rng=np.random.default_rng(seed))
    return _open_loop(opening, rate, overload=overload)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_latency_class_is_decided_on_its_latency_not_its_throughput(seed: int) -> None:
    """25% lower latency, the same throughput (open loop: what arrives completes): promoted on
    latency with a gain of ~1.25 (baseline latency over the candidate's), while the same
    windows judged on throughput promote nothing."""
    ms = _windows(1.25, seed)
    a = analyze(ms, LATENCY)
    r = a.result("chat")
    assert r.objective == "latency (mean_e2el_ms)"
    d = r.decisions[0]
    assert d.outcome == "promote" and d.winner is not None
    assert d.winner.worst is not None and 1.15 < d.winner.worst.speedup.value < 1.35
    lines = deploy_lines(decision_rows(r))
    assert lines == [f"chat: ngram with N=8 at concurrency 1: mean_e2el_ms "
                     f"{1 / d.winner.worst.speedup.value:.2f}x of its value without it "
                     f"(interval [{1 / d.winner.worst.speedup.hi:.2f}, "
                     f"{1 / d.winner.worst.speedup.lo:.2f}]) at the offered rates"]
    assert decision_lines(decision_rows(r))[0]["class"] == "chat [latency (mean_e2el_ms)]"
    # judged for throughput, open-loop windows decide nothing (their throughput is the rate
    # offered): they are answered beside the class's objective, never scored on it
    assert analyze(ms, PromoteSpec()).classes == ()


def test_overload_is_reported_never_scored() -> None:
    """A second rate both sides overload (their latency 30x: the queue's length, not the
    setting's) changes nothing in the decision: the band is decided on the rate the baseline
    keeps up with, and a note says where it did not. A candidate that overloads where the
    baseline keeps up fails that point."""
    steady = _windows(1.25, 0)
    alone = analyze(steady, LATENCY).result("chat")
    both = analyze([*steady, *_windows(1.25, 1, rate=50.0, overload=True)], LATENCY)
    r = both.result("chat")
    assert r.decisions[0].outcome == alone.decisions[0].outcome == "promote"
    assert r.decisions[0].winner.worst.speedup == alone.decisions[0].winner.worst.speedup
    assert [s.workload for s in r.decisions[0].winner.speedups] == ["chat@2rps"]
    assert any(n.startswith("overload: the baseline does not keep up at chat@50rps c=1")
               for n in r.notes), r.notes
    over = [p for p in both.points if p.workload == "chat@50rps"]
    assert over and all(p.n_ok == 0 and p.failures == {"overload": 5} for p in over)
    # one overloaded window makes the point overload: the server does not reliably keep up
    one = [dataclasses.replace(m, overload=True) if m.key.repeat == 0 and m.engine == "baseline"
           else m for m in _windows(1.25, 1, rate=50.0)]
    r = analyze([*steady, *one], LATENCY).result("chat")
    assert any("chat@50rps" in n for n in r.notes)
    # the candidate cannot keep up where the baseline can: it fails that point
    cand_over = [dataclasses.replace(m, overload=True) if m.engine == "ngram-n8" else m
                 for m in _windows(1.25, 1, rate=8.0)]
    r = analyze([*steady, *cand_over], LATENCY).result("chat")
    d = r.decisions[0]
    assert d.outcome == "off"
    assert any(x.gate == "failed" and "every repeat failed at chat@8rps c=1 (overload x5)"
               in x.detail for v in d.candidates for x in v.rejected), d.candidates


def test_a_class_overloaded_everywhere_is_a_problem_that_says_what_to_do() -> None:
    with pytest.raises(AnalysisError) as err:
        analyze(_windows(1.25, 0, rate=50.0, overload=True), LATENCY)
    assert any("the baseline does not keep up at any point (chat@50rps c=1: overload" in p
               and "offer lower request rates (arrival.request_rate)" in p
               for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("seed", range(8))
def test_the_backlog_tells_a_queue_that_keeps_growing_from_poisson_bursts(seed: int) -> None:
    """4 slots, 1 s per request (capacity 4 req/s), 32 Poisson arrivals: at 2 req/s the queue
    stays steady (bursts and all), at 8 req/s it keeps growing (at most at the offered rate),
    and all 32 sent at once is the extreme of overload."""
    rng = np.random.default_rng(seed)
    service = rng.gamma(8.0, 1 / 8.0, 32)
    for rate, overload in ((2.0, False), (8.0, True)):
        gaps = np.cumsum(rng.exponential(1 / rate, 32))
        arrivals = gaps * (32 / rate) / gaps[-1]  # as vLLM's bench scales them: N / rate
        q = backlog(arrivals, served(arrivals, 4, service), rate)
        assert q.overload is overload, (rate, q)
        if overload:
            assert GROWTH < q.growth < 1.0, q
        else:
            assert q.growth < GROWTH, q
    at_once = np.linspace(0, 0.01, 32)
    q = backlog(at_once, served(at_once, 4, service), 3200.0)
    assert q.overload and q.sojourn_ratio > 3
    assert not backlog([0.0, 1.0, 2.0], [5.0, 6.0, 7.0], 1.0).overload  # too few to tell
    assert math.isclose(backlog([], [], 1.0).growth, 0.0)


def test_rates_are_points_and_a_class_arrives_as_its_objective_measures() -> None:
    """Each offered rate is a workload of its own (`<name>@<rate>rps`) with the class's name;
    every mismatch of objective and arrival is a problem naming its field, all at once."""
    spec = load(["experiment=cpu_demo", "workload=[code_completion,classify]",
                 "workload.code_completion.arrival={request_rate: [1.5, 4], burstiness: 0.5}",
                 "+promote.objectives.code=latency", "sweep.search=exhaustive"]).spec
    opened = {n: w for n, w in spec.workload.items() if w.arrival is not None}
    assert sorted(opened) == ["code_completion@1.5rps", "code_completion@4rps"]
    assert {w.traffic_class for w in opened.values()} == {"code"}
    assert [w.arrival.request_rate for w in opened.values()] == [[1.5], [4.0]]
    assert all(w.arrival.burstiness == 0.5 for w in opened.values())
    assert spec.promote.objective_for("code") == "latency"
    assert spec.promote.objective_for("classify") == "throughput"
    with pytest.raises(SpecError) as err:  # found as the workloads are expanded, at load
        load(["experiment=cpu_demo", "workload=[code_completion,classify]",
              "workload.code_completion.arrival={request_rate: [2]}",
              "+promote.objectives.classify=latency", "+promote.objectives.chatty=latency"])
    got = {p.path: p for p in err.value.problems}
    assert set(got) == {"workload.code_completion.arrival", "workload.classify.arrival",
                        "promote.objectives.chatty", "sweep.search"}, got
    assert "throughput is the rate it is offered" in got["workload.code_completion.arrival"].problem
    assert "decided on latency" in got["workload.classify.arrival"].problem
    assert got["sweep.search"].got == "adaptive"
    with pytest.raises(SpecError) as err:
        load(["experiment=cpu_demo", "workload=[code_completion,classify]",
              "workload.code_completion.arrival={request_rate: [2]}",
              "+promote.objectives.code=latency", "sweep.search=exhaustive",
              "service=[assistant]"])
    assert [p.path for p in err.value.problems] == ["service.assistant.classes"]
    assert "cannot be part of a mix" in err.value.problems[0].problem


def test_a_trace_is_offered_at_multiples_of_its_own_rate(tmp_path: Path) -> None:
    """`trace_speed`: each class of a split trace offered at 1x and 4x its own arrival rate
    (its requests over their timestamps' span), with its gaps' burstiness; the ways an arrival
    cannot be stated are problems naming the field."""
    trace = traces.write(tmp_path / "trace.jsonl", per_class=24)
    base = ["experiment=cpu_demo", "workload=[trace]", f"workload.trace.source.path={trace}",
            "workload.trace.num_prompts=16", "sweep.search=exhaustive"]
    spec = load([*base, "workload.trace.arrival={trace_speed: [1, 4]}",
                 "promote.objective=latency"]).spec
    assert sorted(spec.workload) == ["router@1x", "router@4x", "sql-agent@1x", "sql-agent@4x"]
    compile_plan(spec)  # every class decided on latency, every workload open loop
    rows = [json.loads(x) for x in trace.read_text().splitlines()]
    for cls in ("router", "sql-agent"):
        times = sorted(datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
                       for r in rows if r["metadata"]["route"] == cls)
        rate = (len(times) - 1) / (times[-1] - times[0])
        one, four = spec.workload[f"{cls}@1x"].arrival, spec.workload[f"{cls}@4x"].arrival
        assert one.request_rate[0] == pytest.approx(rate, rel=1e-5)
        assert four.request_rate[0] == pytest.approx(4 * rate, rel=1e-5)
        gaps = np.diff(times)
        assert one.burstiness == four.burstiness == pytest.approx(
            (gaps.mean() / gaps.std()) ** 2, rel=1e-2)
    stated = load([*base, "workload.trace.arrival={trace_speed: [2], burstiness: 1.0}",
                   "promote.objective=latency"]).spec
    assert {w.arrival.burstiness for w in stated.workload.values()} == {1.0}
    for arrival, path in (("{trace_speed: [2]}", "workload.code_completion.arrival.trace_speed"),
                          ("{request_rate: [1], trace_speed: [2]}",
                           "workload.code_completion.arrival.request_rate"),
                          ("{burstiness: 2}", "workload.code_completion.arrival.request_rate")):
        with pytest.raises(SpecError) as err:
            load(["experiment=cpu_demo", "workload=[code_completion]",
                  f"workload.code_completion.arrival={arrival}", "promote.objective=latency",
                  "sweep.search=exhaustive"])
        assert [p.path for p in err.value.problems] == [path], err.value.problems
    # a split trace's classes name the trace workload's field, once
    with pytest.raises(SpecError) as err:
        load([*base, "promote.objective=latency"])
    assert [p.path for p in err.value.problems] == ["workload.trace.arrival"]
    assert "decided on latency" in err.value.problems[0].problem


def test_the_report_shows_a_latency_class_s_latency_per_engine_and_rate(tmp_path: Path) -> None:
    """The report's class section says what the class was decided for and tables the latency
    measured per engine and offered rate, overloaded points with nothing usable."""
    ms = [*_windows(1.25, 0), *_windows(1.25, 1, rate=50.0, overload=True)]
    a = analyze(ms, LATENCY)
    text = markdown(a)
    assert "Decided for latency (mean_e2el_ms): each speedup is the baseline's mean_e2el_ms " \
           "over the candidate's" in text
    assert "### Latency at the offered rates" in text
    base = re.search(r"^\| baseline \| 2 \| 1 \| ([\d.]+) \[([\d.]+), ([\d.]+)\] \| .* "
                     r"\| 5 \| 0 \|$", text, re.M)
    cand = re.search(r"^\| ngram-n8 \| 2 \| 1 \| ([\d.]+) \[", text, re.M)
    assert base and cand, text
    assert float(base[2]) <= float(base[1]) <= float(base[3])
    assert 1.15 < float(base[1]) / float(cand[1]) < 1.35  # 25% faster: 1/1.25 of the latency
    assert re.search(r"^\| baseline \| 50 \| 1 \| - \| .* \| 0 \| 5 \|$", text, re.M), text


def test_open_loop_latency_counts_the_wait_at_the_client() -> None:
    """Under the concurrency cap an open-loop request waits at the load generator before it is
    sent, as it would at a gateway; vLLM's bench leaves that out of TTFT and end-to-end
    latency, the window's statistics count it (over the requests that succeeded); TPOT stays
    vLLM's."""
    result = {"mean_e2el_ms": 500.0, "p99_e2el_ms": 600.0, "mean_tpot_ms": 3.0,
              "latencies": [0.5, 0.5, 0.6, 0.0], "ttfts": [0.1, 0.1, 0.1, 0.0],
              "queue_times": [0.0, 1.0, 2.0, 0.0], "errors": ["", "", "", "refused"]}
    closed = latency_stats(result)
    assert closed == {"mean_e2el_ms": 500.0, "p99_e2el_ms": 600.0, "mean_tpot_ms": 3.0}
    opened = latency_stats(result, open_loop=True)
    assert opened["mean_e2el_ms"] == pytest.approx((500 + 1500 + 2600) / 3)
    assert opened["median_ttft_ms"] == pytest.approx(1100.0)
    assert opened["p99_e2el_ms"] == pytest.approx(float(np.percentile([500, 1500, 2600], 99)))
    assert opened["mean_tpot_ms"] == 3.0
