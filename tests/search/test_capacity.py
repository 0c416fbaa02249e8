"""The capacity search's parts where the answer is known: the bracketing over rates, when a
window keeps the SLOs, and the estimate over engine starts (its error and coverage on simulated
servers are bench/capacity.py's)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from specflow.search.capacity import (
    Probe,
    StartCapacity,
    bracket,
    estimate,
    holds,
    next_rate,
    ratio,
    replicas,
)
from specflow.spec.schema import SloSpec
from tests.builders import BASELINE, window


def _search(capacity: float, start: float = 1.0, **kw: float) -> list[Probe]:
    """The search against a server that holds exactly below `capacity`."""
    probes: list[Probe] = []
    while (r := next_rate(probes, start, floor=kw.get("floor", 0.1),
                          ceiling=kw.get("ceiling", 64.0))) is not None:
        probes.append(Probe(r, r < capacity))
    return probes


@pytest.mark.parametrize("capacity", [0.7, 3.3, 9.0, 40.0])
def test_the_search_brackets_the_capacity_within_its_resolution(capacity: float) -> None:
    probes = _search(capacity)
    b = bracket(probes)
    assert b.low is not None and b.high is not None and not b.censored
    assert b.low < capacity <= b.high and b.high / b.low <= 1.1
    assert abs(b.estimate / capacity - 1) < 0.05
    assert len(probes) <= 12
    assert [p.rate for p in probes][:2] == ([1.0, 2.0] if capacity > 1 else [1.0, 0.5])


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
    assert replicas(20.0, e) == math.ceil(20.0 / e.lo)
    one = estimate(caps[:1])
    assert one.lo is None and replicas(20.0, one) is None
    twice = [StartCapacity(2 * c.low, 2 * c.high) for c in caps]  # type: ignore[operator]
    r = ratio(twice, caps)
    assert r is not None and math.isclose(r[0], 2.0) and r[1] < 2.0 < r[2]
    assert ratio(caps[:1], caps) is None
