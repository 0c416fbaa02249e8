"""`specflow compare` on hand-built sweeps: the statistics and findings (the real-engine scenario
is tests/results/test_compare_sweeps.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from specflow.decision.compare import NOT_SENT, SweepSide, compare
from specflow.records.measurement import Measurement, WindowKey
from tests.builders import BASELINE, engine
from tests.decision.test_capacity import CAPACITY
from tests.decision.test_capacity import _searched as searched

CAND = engine("draft_model-n3", "draft_model", 3)
SAMPLING = {"temperature": 0.0, "seed": 0, "max_tokens": 64, "ignore_eos": False,
            "chat_template": "as materialised", "order": "dataset order", "stop": "[]"}


def _window(ec, tput: float, start: int, seq: int, r: int, ppa: tuple[float, ...],
            sampling: dict) -> Measurement:
    spec = ec.method != "none"
    drafts = 100
    accepted = round(drafts * sum(ppa)) if spec else None
    return Measurement(
        key=WindowKey(ec.hash, "code", 4, r, start), engine=ec.name, drafter=ec.series,
        method=ec.method, num_speculative_tokens=ec.num_speculative_tokens, traffic_class="code",
        completed=16, duration_s=10.0, output_throughput=tput,
        acceptance_rate=sum(ppa) / len(ppa) if spec else None,
        mean_acceptance_length=1 + accepted / drafts if spec else None,
        per_position_acceptance=ppa if spec else (), num_drafts=drafts if spec else None,
        draft_tokens=3 * drafts if spec else None, accepted_tokens=accepted,
        prompt_hash="p" * 64, sampling=sampling, seq=seq)


def side(label: str, rng: np.random.Generator, *, speedup: float = 1.5,
         ppa: tuple[float, ...] = (0.8, 0.6, 0.4), starts: int = 3, cv: float = 0.03,
         start_cv: float = 0.03, sampling: dict | None = None, vllm: str = "0.32.0"
         ) -> SweepSide:
    """Baseline and candidate started alternately `starts` times each (baseline first and last),
    two windows per start; multiplicative start and window noise."""
    ms: list[Measurement] = []
    order = [BASELINE, CAND] * starts + [BASELINE]
    count: dict[str, int] = {}
    for seq, ec in enumerate(order):
        start = count.get(ec.hash, 0)
        count[ec.hash] = start + 1
        effect = rng.normal(0, start_cv)
        mean = 100.0 * (speedup if ec.method != "none" else 1.0)
        for r in range(2):
            tput = mean * math.exp(effect + rng.normal(0, cv))
            pp = tuple(min(1.0, max(0.0, p + rng.normal(0, 0.01))) for p in ppa)
            ms.append(_window(ec, tput, start, seq, r, pp, sampling or SAMPLING))
    return SweepSide(label, tuple(ms), {"vllm": vllm, "drafter.draft_model": "m@r1"},
                     {"workload": {"code": {"temperature": 0.0, "max_tokens": 64}}})


def test_the_same_plan_twice_is_no_change_beyond_noise() -> None:
    rng = np.random.default_rng(0)
    flagged = 0
    for _ in range(20):
        cmp = compare(side("A", rng), side("B", rng))
        assert cmp.compared and not cmp.workload_changes and not cmp.pins
        assert {c.metric for c in cmp.changes} == {"speedup", "acceptance length",
                                                   "acceptance at position", "throughput"}
        flagged += bool(cmp.regressions or cmp.improvements)
        for c in cmp.changes:
            assert c.lo <= c.change <= c.hi
    assert flagged <= 2  # Holm over each comparison's rows: at most ~5% of comparisons
    cmp = compare(side("A", rng), side("B", rng))
    if not (cmp.regressions or cmp.improvements):
        assert cmp.summary.startswith("no change beyond noise in ")


def test_a_worse_drafter_revision_is_an_acceptance_and_speedup_regression() -> None:
    rng = np.random.default_rng(1)
    a = side("A", rng)
    b = side("B", rng, speedup=1.1, ppa=(0.6, 0.35, 0.2))
    b = SweepSide("B", b.measurements, {**b.pins, "drafter.draft_model": "m@r2"}, b.measured)
    cmp = compare(a, b)
    regs = {(c.metric, c.position) for c in cmp.regressions}
    assert {("speedup", None), ("acceptance length", None), ("acceptance at position", 1),
            ("acceptance at position", 2), ("acceptance at position", 3)} <= regs
    speed = next(c for c in cmp.changes if c.metric == "speedup")
    assert speed.hi < 1 and speed.lo < speed.change < speed.hi
    assert math.isclose(speed.change, speed.b / speed.a)
    assert speed.replicates == "7 + 7 engine starts"  # 3 candidate + 4 baseline starts a side
    al = next(c for c in cmp.changes if c.metric == "acceptance length")
    assert al.a > 2.7 and al.b < 2.2 and al.hi < 1
    assert cmp.pins == (("drafter.draft_model", "m@r1", "m@r2"),)
    assert cmp.summary.startswith("regression: ")
    # the baseline's own throughput did not move: that row is no change
    (tput,) = [c for c in cmp.changes if c.metric == "throughput"]
    assert tput.engine == "baseline" and tput.finding == "no change beyond noise"


def test_a_changed_request_is_the_workload_changing_never_a_regression() -> None:
    """vLLM issue 33497: `vllm bench serve` stopped sending temperature 0 by default; a sweep
    whose requests carried no temperature measured something else."""
    rng = np.random.default_rng(2)
    a = side("A", rng)
    b = side("B", rng, speedup=1.1, ppa=(0.5, 0.3, 0.1), sampling={**SAMPLING,
                                                                    "temperature": None})
    cmp = compare(a, b)
    assert cmp.changes and not cmp.compared and not cmp.regressions
    assert {c.finding for c in cmp.changes} == {"workload changed"}
    assert cmp.workload_changes == (f"code: requests' temperature 0.0 -> {NOT_SENT}",)
    assert cmp.summary.startswith("not comparable")
    # not sent on both sides is a change too once vLLM itself changed (its default may have)
    a2 = side("A", rng, sampling={**SAMPLING, "temperature": None}, vllm="0.31.0")
    b2 = side("B", rng, sampling={**SAMPLING, "temperature": None})
    cmp2 = compare(a2, b2)
    assert cmp2.workload_changes == (f"code: requests' temperature {NOT_SENT} under vLLM "
                                     "0.31.0 and 0.32.0",)
    assert cmp2.pins == (("vllm", "0.31.0", "0.32.0"),)
    # and a workload setting that changes the requests, from the sweeps' identities
    a3 = side("A", rng)
    b3 = side("B", rng)
    b3 = SweepSide("B", b3.measurements, b3.pins, {"workload": {"code": {
        "temperature": 0.0, "max_tokens": 128, "production_temperature": 0.7}}})
    assert compare(a3, b3).workload_changes == ("code: workload.code.max_tokens 64 -> 128",)


def test_one_start_a_side_says_its_interval_lacks_the_start_effect() -> None:
    rng = np.random.default_rng(3)
    cmp = compare(side("A", rng, starts=1), side("B", rng, starts=1))
    al = next(c for c in cmp.changes if c.metric == "acceptance length")
    assert al.replicates.startswith("2 + 2 windows (an engine started once")
    speed = next(c for c in cmp.changes if c.metric == "speedup")
    # the baselines' opening and closing starts of both sweeps carry the start variance
    assert speed.replicates == "3 + 3 engine starts"
    only = compare(side("A", rng), SweepSide("B", ()))
    assert not only.changes and only.summary.startswith("nothing to compare")
    assert only.only == ("code c=4: measured by A only",)


def _open_loop(s: SweepSide, latency: bool = True) -> SweepSide:
    """A side's windows as open-loop ones of a class decided on mean end-to-end latency: each
    window completes what it was offered (the same throughput everywhere) in the time its
    throughput said (latency = 1 / throughput)."""
    ms = tuple(dataclasses.replace(m, output_throughput=50.0, request_rate=2.0,
                                   latency_ms={"mean_e2el_ms": 1e5 / m.output_throughput})
               for m in s.measurements)
    measured = {**s.measured, **({"latency": {"classes": ["code"],
                                              "statistic": "mean_e2el_ms"}} if latency else {})}
    return SweepSide(s.label, ms, s.pins, measured)


def test_a_latency_class_is_compared_on_its_latency() -> None:
    """A class decided on latency (the sweep's measured settings say so): its speedup is the
    baseline's latency over the candidate's, so a drafter that lost its latency gain is a
    speedup regression although every window's throughput is the rate it was offered; the
    baseline's throughput (that rate) is no row at all."""
    rng = np.random.default_rng(1)
    a, b = _open_loop(side("A", rng)), _open_loop(side("B", rng, speedup=1.1))
    cmp = compare(a, b)
    (speed,) = [c for c in cmp.changes if c.metric == "speedup"]
    assert speed.finding == "regression" and 1.4 < speed.a < 1.6 and 1.0 < speed.b < 1.2
    assert not [c for c in cmp.changes if c.metric == "throughput"]
    blind = compare(_open_loop(a, latency=False), _open_loop(b, latency=False))
    (flat,) = [c for c in blind.changes if c.metric == "speedup"]
    assert math.isclose(flat.a, 1.0) and math.isclose(flat.b, 1.0)  # throughput cannot tell


def _searched(s: SweepSide) -> SweepSide:
    """A side's windows as capacity searches of a class decided on capacity (the sweep's
    measured settings say so): each window's true capacity is its throughput / 25 req/s, the
    search (from 2 req/s) finds it as the runner would, every step a window of its own."""
    ms = tuple(dataclasses.replace(m, traffic_class="chat") for m in s.measurements)
    settings = {"classes": ["chat"], **CAPACITY.capacity.model_dump(
        mode="json", exclude={"target_load", "slo"}),
        "slo": CAPACITY.capacity_slo.model_dump(mode="json")}
    return SweepSide(s.label, tuple(searched(list(ms))), s.pins,
                     {**s.measured, "capacity": settings})


def test_a_capacity_class_is_compared_on_its_capacity() -> None:
    """A class decided on capacity: its speedup is the candidate's capacity over the
    baseline's, read from each search's steps (each a window, most of them at rates that did
    not hold), so a drafter whose capacity gain fell from 1.5x to 1.1x is a speedup regression."""
    rng = np.random.default_rng(2)
    a, b = _searched(side("A", rng)), _searched(side("B", rng, speedup=1.1))
    assert len(a.measurements) > 5 * 14  # several steps per search
    cmp = compare(a, b)
    (speed,) = [c for c in cmp.changes if c.metric == "speedup"]
    assert speed.finding == "regression" and 1.35 < speed.a < 1.65 and 0.95 < speed.b < 1.25
    assert speed.workload == "chat@capacity"
