"""One class measured for throughput, latency and capacity at once: decided and promoted on its
objective's windows only, the other two answered beside it under the same rule, and where they
disagree said so (the answer is known: the windows are built with the gains they show)."""

from __future__ import annotations

import numpy as np

from specflow.decision.beside import beside, lines
from specflow.decision.choose import analyze
from specflow.records.measurement import Measurement
from specflow.results.report import beside_section, markdown
from specflow.spec.schema import PromoteSpec
from tests.builders import Cand, engine, sweep
from tests.decision.test_capacity import CAPACITY, _searched
from tests.decision.test_objectives import _open_loop

NGRAM = engine("ngram-n8", "ngram", 8)


def _windows(seed: int, *, throughput: float, latency: float, capacity: float
             ) -> list[Measurement]:
    """The class `chat` measured three ways, n-gram's gain in each as stated."""
    def built(gain: float, s: int) -> list[Measurement]:
        return sweep([Cand(NGRAM, gain)], workloads=("chat",), cls="chat", repeats=5, cv=0.03,
                     rng=np.random.default_rng(seed * 10 + s))[0]

    return [*built(throughput, 0), *_open_loop(built(latency, 1), 2.0),
            *_searched(built(capacity, 2))]


def test_each_objective_is_answered_on_its_own_windows_and_disagreement_is_said() -> None:
    """n-gram gains 40% throughput and 40% capacity but nothing in latency: the class, decided
    for throughput, promotes it on its closed-loop windows alone; beside it, latency says off
    (ruled out) and capacity would promote it too: they disagree. Decided for latency instead,
    the same windows promote nothing, and throughput is then the answer beside."""
    ms = _windows(0, throughput=1.4, latency=1.0, capacity=1.4)
    rules = PromoteSpec(latency_statistic="mean_e2el_ms", capacity=CAPACITY.capacity)
    a = analyze(ms, rules)
    (r,) = a.classes
    assert r.objective == "throughput" and r.decisions[0].outcome == "promote"
    assert {s.workload for s in r.decisions[0].winner.speedups} == {"chat"}
    assert {p.workload for p in a.points} == {"chat"}  # the others are not in the decision
    found = beside(ms, rules)
    assert [(b.traffic_class, b.objective) for b in found] == [
        ("chat", "capacity (p99_e2el_ms <= 3000)"), ("chat", "latency (mean_e2el_ms)")]
    capacity, latency = (b.result for b in found)
    assert capacity is not None and capacity.decisions[0].outcome == "promote"
    assert latency is not None and latency.decisions[0].outcome == "off"
    (line,) = lines(a.classes, found)
    assert line.startswith("chat c1: decided for throughput: promote ngram-n8 (1.")
    assert "; capacity (p99_e2el_ms <= 3000): promote ngram-n8 (1." in line
    assert line.endswith("; latency (mean_e2el_ms): off: they disagree"), line
    report = markdown(a) + "\n".join(beside_section(a, found))
    assert "## Throughput, latency and capacity side by side" in report
    assert "### `chat` decided for latency (mean_e2el_ms), beside" in report
    assert "### Capacity within the SLOs" in report and "### Latency at the offered rates" in report
    # decided for latency: nothing promoted; throughput beside would promote
    as_latency = rules.model_copy(update={"objectives": {"chat": "latency"}})
    b = analyze(ms, as_latency)
    assert b.classes[0].decisions[0].outcome == "off"
    (line,) = lines(b.classes, beside(ms, as_latency))
    assert line.startswith("chat c1: decided for latency (mean_e2el_ms): off; capacity (")
    assert "; throughput: promote ngram-n8 (1." in line and line.endswith("they disagree")


def test_the_same_answer_everywhere_agrees() -> None:
    ms = _windows(1, throughput=1.5, latency=1.5, capacity=1.5)
    rules = PromoteSpec(latency_statistic="mean_e2el_ms", capacity=CAPACITY.capacity)
    (line,) = lines(analyze(ms, rules).classes, beside(ms, rules))
    assert line.count("promote ngram-n8") == 3 and line.endswith(": they agree"), line
    closed_only = _windows(1, throughput=1.5, latency=1.5, capacity=1.5)[:10]
    assert {m.answers for m in closed_only} == {"throughput"} and beside(closed_only, rules) == []
