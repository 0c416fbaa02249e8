"""A service (one server, several classes) decided like a class, and routing beside it, where the
answer is known: one class wins big (n-gram on long agent answers, 2.5x), the other loses (0.7x
on one-token router answers), and the mix must come out each way with the shares."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specflow.decision.choose import analyze
from specflow.decision.services import routing
from specflow.spec.schema import PromoteSpec
from tests.builders import Cand, engine, sweep

NGRAM = engine("ngram-n8", "ngram", 8)
AGENT, ROUTER = 2.5, 0.7
"""True speedups of the two classes."""
SECONDS = {"agent": 10.0, "router": 1.0}
"""The baseline's seconds per request: an agent answer takes ten times a router's."""


def mixed(agent_share: float) -> float:
    """The true speedup of one server serving both: each class's time divided by its speedup."""
    t = {"agent": agent_share * SECONDS["agent"], "router": (1 - agent_share) * SECONDS["router"]}
    return sum(t.values()) / (t["agent"] / AGENT + t["router"] / ROUTER)


def _windows(agent_share: float, seed: int) -> list:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    out = []
    for workload, cls, speedup in (("agent", "sql-agent", AGENT), ("router", "router", ROUTER),
                                   ("shared", "shared", mixed(agent_share))):
        opening, _ = sweep([Cand(NGRAM, speedup)], workloads=(workload,), cls=cls, repeats=5,
                           cv=0.03, rng=rng)
        out += opening
    return out


@pytest.mark.parametrize("agent_share, outcome", [(0.5, "promote"), (0.02, "off")])
def test_the_service_is_decided_on_its_mix_and_routing_is_set_beside_it(
        agent_share: float, outcome: str) -> None:
    """Half the requests agent: 91% of the time is the agent's, the mix gains ~2.0x: promote,
    although the router class alone is off. Two percent agent: 83% of the time is the router's,
    the mix loses (~0.8x): off, although the agent class alone wins. Either way routing each
    class to its own champion (n-gram for the agent, off for the router) beats the one server,
    and says by how much."""
    truth = mixed(agent_share)
    assert (truth > 1.5) if outcome == "promote" else (truth < 0.85)
    for seed in range(3):
        a = analyze(_windows(agent_share, seed), PromoteSpec())
        outcomes = {r.traffic_class: r.deployment.outcome for r in a.classes}
        assert outcomes == {"sql-agent": "promote", "router": "off", "shared": outcome}
        (s,) = routing(a, {"shared": {"agent": agent_share, "router": 1 - agent_share}},
                       {"agent": "sql-agent", "router": "router"},
                       {("agent", 1): SECONDS["agent"], ("router", 1): SECONDS["router"]})
        agent, router = s.routes
        assert (agent.engine, router.engine) == ("ngram-n8", "off")
        assert router.speedup == 1.0 and agent.speedup == pytest.approx(AGENT, rel=0.05)
        time_agent = agent_share * 10 / (agent_share * 10 + (1 - agent_share))
        assert agent.time_share == pytest.approx(time_agent)
        routed = 1 / (time_agent / agent.speedup + (1 - time_agent))
        assert s.routed == pytest.approx(routed) and s.gain > 0.05
        if outcome == "promote":
            assert s.speedup is not None and s.speedup.value == pytest.approx(truth, rel=0.05)
            assert s.text().startswith("shared c1: one server: ngram-n8 ")
        else:
            assert s.speedup is None and s.one_server == 1.0 and s.gain == pytest.approx(
                routed - 1)
            assert s.text().startswith("shared c1: one server: off; routing each class to its "
                                       "own champion: ")
        assert f"routing would add {s.gain:+.0%}" in s.text() and not s.unresolved


def test_unresolved_bands_stand_in_with_their_best_gain_and_say_so() -> None:
    """A race that ran out of budget: each band's best open estimate stands in where it is a
    gain (the agent's n-gram), off where its candidates are ruled out (the router's), and the
    line says these are estimates of unresolved bands."""
    a = analyze(_windows(0.5, 0), PromoteSpec())

    def unresolved(r):  # noqa: ANN001, ANN202
        d = dataclasses.replace(r.decisions[0], winner=None, unresolved="the budget is spent")
        return dataclasses.replace(r, decisions=(d,))

    a = dataclasses.replace(a, classes=tuple(unresolved(r) for r in a.classes))
    (s,) = routing(a, {"shared": {"agent": 0.5, "router": 0.5}},
                   {"agent": "sql-agent", "router": "router"},
                   {("agent", 1): SECONDS["agent"], ("router", 1): SECONDS["router"]})
    agent, router = s.routes
    assert (agent.engine, router.engine, router.speedup) == ("ngram-n8 (unresolved)", "off",
                                                             1.0)
    assert s.unresolved and s.outcome == "unresolved" and s.speedup is not None
    assert s.text().endswith("(estimates of unresolved bands: more engine starts settle them)")
    assert "router: off, 50% of requests" in s.text()
