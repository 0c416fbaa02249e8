"""The soak's trend on hand-built windows (the real engine soaks in
tests/results/test_compare_sweeps.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from specflow.stats.trend import log_trend
from specflow.steps.soak import analyse
from tests.builders import engine, window

CAND = engine("eagle3-n3", "eagle3", 3)


def _series(rng: np.random.Generator, *, drift_per_hour: float, al_drift_per_hour: float = 0.0,
            n: int = 60, every_s: float = 120.0, cv: float = 0.03):
    """Windows every `every_s` seconds for n windows, throughput and acceptance length
    drifting by the given fractions per hour, multiplicative noise of CV `cv`."""
    ms, t_s = [], []
    for i in range(n):
        t = i * every_s
        tput = 300.0 * (1 + drift_per_hour) ** (t / 3600) * math.exp(rng.normal(0, cv))
        al = 2.5 * (1 + al_drift_per_hour) ** (t / 3600) * math.exp(rng.normal(0, 0.01))
        ms.append(dataclasses.replace(window(CAND, tput, r=100_000 + i),
                                      mean_acceptance_length=al))
        t_s.append(t)
    return ms, t_s


def test_acceptance_falling_over_hours_is_a_trend_beyond_noise() -> None:
    """vLLM issue 41838: acceptance drifting down over hours of serving until a restart."""
    ms, t_s = _series(np.random.default_rng(0), drift_per_hour=-0.05, al_drift_per_hour=-0.10)
    trends, findings = analyse(ms, t_s, 0.95, 0.02)
    assert findings["acceptance length"].startswith("falling beyond noise: ")
    assert findings["throughput"].startswith("falling beyond noise: ")
    al = trends["acceptance length"]
    assert al is not None and al.lo < -0.10 < al.hi and al.hi < 0 and al.n == 60
    assert math.isclose(al.span_s, 59 * 120)


def test_a_steady_engine_shows_no_trend() -> None:
    flagged = 0
    for seed in range(20):
        ms, t_s = _series(np.random.default_rng(seed), drift_per_hour=0.0)
        _, findings = analyse(ms, t_s, 0.95, 0.02)
        flagged += any(not v.startswith("no trend beyond noise") for v in findings.values())
    assert flagged <= 2  # the two series one family at 5%: about 1 in 20 soaks


def test_a_small_trend_within_tolerance_is_not_flagged_and_few_windows_say_so() -> None:
    ms, t_s = _series(np.random.default_rng(1), drift_per_hour=-0.01, cv=0.001, n=30,
                      every_s=60)
    trends, findings = analyse(ms, t_s, 0.95, 0.02)
    t = trends["throughput"]
    assert t is not None and t.p < 0.05 and abs(t.over_run) < 0.02  # real, but under 2%
    assert findings["throughput"].startswith("no trend beyond noise")
    assert log_trend([0.0, 1.0], [1.0, 2.0], 0.95) is None
    flat = log_trend([0.0, 1.0, 2.0], [5.0, 5.0, 5.0], 0.95)  # the copy's acceptance length
    assert flat is not None and (flat.per_hour, flat.lo, flat.hi, flat.p) == (0.0, 0.0, 0.0, 1.0)
    # a two-hour soak also states the hourly rate; a short one only its change over the run
    long_ms, long_t = _series(np.random.default_rng(2), drift_per_hour=0.0)
    assert "per hour" in analyse(long_ms, long_t, 0.95, 0.02)[1]["throughput"]
    short_ms, short_t = _series(np.random.default_rng(3), drift_per_hour=0.0, n=10, every_s=5)
    assert "per hour" not in analyse(short_ms, short_t, 0.95, 0.02)[1]["throughput"]
    _, few = analyse(ms[:2], t_s[:2], 0.95, 0.02)
    assert few["throughput"] == "too few windows for a trend"
