"""Multiple-testing corrections (`specflow.stats.multiplicity`)."""

from __future__ import annotations

from specflow.stats.multiplicity import holm


def test_holm_steps_down() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.001, 0.012, 0.03], 0.05) == [True, True, True]
    assert holm([], 0.05) == []
