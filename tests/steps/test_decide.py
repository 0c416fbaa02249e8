"""The decision step checks an emitted N schedule with the installed vLLM before promoting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specflow.decision.choose import analyze
from specflow.decision.wording import decision_rows
from specflow.spec.schema import PromoteSpec
from specflow.steps.decide import band_metrics, check_schedules
from tests.builders import Cand, engine, sweep

E3N3 = engine("eagle3-n3", "eagle3", 3)


@pytest.mark.engine
def test_a_schedule_vllm_rejects_is_not_promoted() -> None:
    ms, close = sweep([Cand(E3N3, {1: 1.60, 4: 1.40, 32: 0.80})], levels=(1, 4, 32),
                      repeats=5, closing=5, cv=0.02, rng=np.random.default_rng(11))
    result = analyze(ms, PromoteSpec(concurrency_bands=[[1, 4], [5, 32]]), closing_baseline=close)
    (math,) = result.classes
    assert math.deployment.schedule == ((1, 4, 3), (5, 32, 0))
    kept, problems = check_schedules(result, None, "vLLM (installed)")
    assert kept.classes == result.classes and problems == []

    # the same decision with a schedule vLLM's own validation refuses (ranges overlap)
    bad = dataclasses.replace(math, deployment=dataclasses.replace(
        math.deployment, schedule=((1, 8, 3), (4, 32, 0))))
    kept, problems = check_schedules(dataclasses.replace(result, classes=(bad,)), None,
                                     "vLLM (installed)")
    assert kept.classes == ()
    (problem,) = problems
    assert problem.startswith("math: vLLM (installed) rejects the emitted "
                              "num_speculative_tokens_per_batch_size [[1, 8, 3], [4, 32, 0]]")
    assert "non-overlapping" in problem and problem.endswith("the class is not promoted")


def test_band_metrics_chart_what_each_band_deploys() -> None:
    """One set of parent-run metrics per class x band: the winner where one passed (eagle3 at
    low load), the baseline where speculation is off (N=0 at c=32)."""
    ms, close = sweep([Cand(E3N3, {1: 1.60, 4: 1.40, 32: 0.80})], levels=(1, 4, 32),
                      repeats=5, closing=5, cv=0.02, rng=np.random.default_rng(11))
    result = analyze(ms, PromoteSpec(concurrency_bands=[[1, 4], [5, 32]]), closing_baseline=close)
    rows = [row for r in result.classes for row in decision_rows(r)]
    m = band_metrics(rows)
    assert {k.rsplit(".", 1)[0] for k in m} == {"band.math.c1-4", "band.math.c5-32"}
    assert m["band.math.c1-4.N"] == 3 and m["band.math.c1-4.outcome"] == 1.0
    assert 1.3 < m["band.math.c1-4.speedup_lo"] <= m["band.math.c1-4.speedup"] \
        <= m["band.math.c1-4.speedup_hi"]
    assert m["band.math.c5-32.N"] == 0 and m["band.math.c5-32.outcome"] == 0.0
    assert m["band.math.c5-32.speedup"] == 1.0 and "band.math.c5-32.acceptance_rate" not in m
