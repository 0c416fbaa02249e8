"""Binomial confidence intervals (`specflow.stats.intervals`)."""

from __future__ import annotations

import pytest

from specflow.stats.intervals import newcombe_interval, wilson_interval

Z95 = 1.959963984540054
"""The two-sided 95% normal quantile."""


def test_wilson_and_newcombe_reproduce_the_published_intervals() -> None:
    """Worked examples of Newcombe (1998): the Wilson score interval (Stat Med 17:857) and the
    hybrid score interval of a difference, method 10 (Stat Med 17:873)."""
    wilson = {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
              (1, 29): (0.0061, 0.1718)}
    for (x, n), want in wilson.items():
        assert wilson_interval(x, n, Z95) == pytest.approx(want, abs=5e-5)
    newcombe = {(56, 70, 48, 80): (0.0524, 0.3339), (9, 10, 3, 10): (0.1705, 0.8090),
                (5, 56, 0, 29): (-0.0381, 0.1926), (0, 10, 0, 20): (-0.1611, 0.2775)}
    for (x1, n1, x2, n2), want in newcombe.items():
        assert newcombe_interval(x1, n1, x2, n2, Z95) == pytest.approx(want, abs=5e-5)
    assert wilson_interval(0, 0, Z95) == (0.0, 1.0)  # nothing observed: nothing known
