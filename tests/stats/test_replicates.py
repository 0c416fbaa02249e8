"""The statistics of engine-start replicates (`specflow.stats.replicates`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from specflow.stats import replicates
from specflow.stats.replicates import (
    MIN_RESIDUALS,
    SLOWED_Z,
    Stage,
    StartWindows,
    baseline_weights,
    contrast,
    screen_slowed,
    start_noise,
)


def _start(h: str, seq: int, values: list[float], start: int = 0,
           stage: Stage = "explore") -> StartWindows:
    return StartWindows(h, start, seq, stage, tuple(math.log(v) for v in values))


def test_the_time_local_baseline_cancels_a_linear_drift() -> None:
    """Baseline 100 at start #0, 90 at #2 (a -10% drift, linear in log throughput); the
    candidate at #1 runs 1.2x the baseline of its time (sqrt(100 * 90)): the speedup is 1.2
    exactly, not 1.2 * 94.9/100 or 1.2 * 94.9/90."""
    base = [_start("b", 0, [100.0, 100.0]), _start("b", 2, [90.0, 90.0], start=1)]
    cand = [_start("c", 1, [1.2 * math.sqrt(9000.0)] * 2)]
    noise = start_noise([*base, *cand], "b")
    c = contrast(cand, base, noise)
    assert c is not None and c.speedup == pytest.approx(1.2)
    assert baseline_weights(1, base) == {0: 0.5, 1: 0.5}
    assert baseline_weights(5, base) == {1: 1.0}  # after the last: the nearest


def test_engine_starts_are_the_replicate_unit() -> None:
    """Two starts that disagree by 20% with steady windows inside each: the interval is wide
    (it counts starts, not windows), where treating 10 windows as independent would be tight."""
    base = [_start("b", 0, [100.0, 100.5, 99.5, 100.0, 100.2]),
            _start("b", 3, [100.0, 99.8, 100.1, 100.0, 99.9], start=1)]
    cand = [_start("c", 1, [130.0, 130.5, 129.8, 130.2, 130.1]),
            _start("c", 2, [108.0, 108.3, 107.9, 108.1, 108.0], start=1)]
    noise = start_noise([*base, *cand], "b")
    assert noise.replicated and noise.df == 2
    c = contrast(cand, base, noise)
    assert c is not None
    lo, hi = c.interval(0.95)
    assert lo < 1.05 < 1.18 < hi  # a lucky start cannot promote the config
    unreplicated = start_noise([base[0], cand[0]], "b")
    assert not unreplicated.replicated


def test_a_slow_drift_over_a_long_race_barely_moves_the_start_to_start_variance() -> None:
    """Ten baseline and nine candidate starts alternating, start effects of SD 2%, and a drift of
    0.2% per engine start (7% over the run): the pooled start-to-start variance (successive
    differences, per config) moves by under 20%, where the spread around the candidate's own mean
    would carry the drift (about 4x). The speedup is the same (the time-local baseline cancels
    the drift). Its df is Satterthwaite's over each config's 2(n-1)^2/(3n-4): (9 + 8)^2 /
    ((3*10 - 4)/2 + (3*9 - 4)/2), not 9 + 8."""
    effects = 0.02 * np.random.default_rng(0).standard_normal(19)

    def run(drift: float) -> tuple[replicates.StartNoise, float, float]:
        base = [StartWindows("b", i, 4 * i, "explore", (drift * 4 * i + effects[i],) * 2)
                for i in range(10)]
        cand = [StartWindows("c", i, 4 * i + 2, "explore",
                             (math.log(1.2) + drift * (4 * i + 2) + effects[10 + i],) * 2)
                for i in range(9)]
        noise = start_noise([*base, *cand], "b")
        c = contrast(cand, base, noise)
        assert c is not None
        return noise, c.speedup, float(np.var([b.mean for b in cand], ddof=1))

    still, speedup, spread = run(0.0)
    drifting, drifted_speedup, drifted_spread = run(0.002)
    assert drifted_speedup == pytest.approx(speedup)
    assert 1.0 < drifting.v_start_mean / still.v_start_mean < 1.2
    assert drifted_spread / spread > 3.5
    assert drifting.df == pytest.approx(17 ** 2 / (26 / 2 + 23 / 2))
    # at two starts per config the successive difference is the variance: n - 1 each
    two = [StartWindows(h, i, 2 * i + (h == "c"), "explore", (effects[i] + (h == "c"),) * 2)
           for h in "bc" for i in range(2)]
    assert start_noise(two, "b").df == 2


def test_a_window_slowed_by_outside_load_is_screened_one_sided() -> None:
    """Nine starts of three windows at one point, CV ~1%: the window at 0.7x its start's others
    is the only one left out; a fast window never is (outside load only slows), nor the last
    window of a start; too few residuals, or none with spread, screen nothing."""
    rng = np.random.default_rng(0)
    blocks = [_start(f"h{i}", i, list(100 * (1 + 0.01 * rng.standard_normal(3))))
              for i in range(9)]
    slow = dataclasses.replace(blocks[4], logs=(blocks[4].logs[0] + math.log(0.7),
                                                *blocks[4].logs[1:]), repeats=(0, 1, 2))
    fast = dataclasses.replace(blocks[6], logs=(blocks[6].logs[0] + math.log(1.5),
                                                *blocks[6].logs[1:]))
    p = ("w", 1)
    kept, slowed = screen_slowed({p: [*blocks[:4], slow, blocks[5], fast, *blocks[7:]]})
    assert [(w.point, w.engine_hash, w.start, w.repeat) for w in slowed] == [(p, "h4", 0, 0)]
    assert slowed[0].ratio == pytest.approx(0.7, abs=0.03) and slowed[0].z < -SLOWED_Z
    assert kept[p][4].logs == slow.logs[1:] and kept[p][4].repeats == (1, 2)
    assert kept[p][6] == fast and [b.m for b in kept[p]] == [3] * 4 + [2] + [3] * 4
    # every window of a start slowed is that start's effect, not a window's: kept
    whole = dataclasses.replace(blocks[4], logs=tuple(x + math.log(0.7) for x in blocks[4].logs))
    assert screen_slowed({p: [*blocks[:4], whole, *blocks[5:]]})[1] == []
    few = {p: [blocks[0], dataclasses.replace(slow, engine_hash="h1")]}
    assert MIN_RESIDUALS > 2 * 3 and screen_slowed(few) == (few, [])
    flat = [_start(f"h{i}", i, [100.0, 100.0, 70.0 if i == 0 else 100.0]) for i in range(9)]
    assert screen_slowed({p: flat})[1] == []  # no spread: no scale to call anything slowed by


def test_windows_slowed_together_are_found_by_their_start_s_other_points() -> None:
    """Three configs x three starts x four points, three windows each, CV ~1%, start effects of
    3%. Two of one start's three windows at one point slowed to 0.6x (one block in
    ~140 at 5% of windows hit): their median is slowed too, so a start's own median misses them.
    Its other points show the start's level; against the config's other starts that point sits
    far below it, and its windows are judged against the start's fastest there: exactly the two
    are left out, marked `together`. A point all of whose windows are slowed leaves nothing to
    judge them by (kept); a point that runs fast is never a finding; a start slowed at every
    point is its start effect (kept)."""
    rng = np.random.default_rng(1)
    points = [("w0", 1), ("w0", 8), ("w1", 1), ("w1", 8)]

    def sweep(factors: dict[tuple[str, int, tuple[str, int]], tuple[float, ...]]
              ) -> dict[tuple[str, int], list[StartWindows]]:
        out: dict[tuple[str, int], list[StartWindows]] = {p: [] for p in points}
        for h in ("h0", "h1", "h2"):
            for start in range(3):
                effect = math.exp(rng.normal(0, 0.03))
                for p in points:
                    f = factors.get((h, start, p), (1.0, 1.0, 1.0))
                    values = 100 * effect * np.asarray(f) * (1 + 0.01 * rng.standard_normal(3))
                    out[p].append(dataclasses.replace(
                        _start(h, 3 * start, list(values), start), repeats=(0, 1, 2)))
        return out

    p = points[2]
    hit = sweep({("h1", 1, p): (0.6, 1.0, 0.6)})
    alone = {p: hit[p]}  # one point: nothing shows the start's level, the median is slowed
    assert screen_slowed(alone)[1] == []
    kept, slowed = screen_slowed(hit)
    assert [(w.point, w.engine_hash, w.start, w.repeat, w.together) for w in slowed] == [
        (p, "h1", 1, 0, True), (p, "h1", 1, 2, True)]
    assert [round(w.ratio, 1) for w in slowed] == [0.6, 0.6] and all(
        w.z < -SLOWED_Z for w in slowed)
    block = next(b for b in kept[p] if (b.engine_hash, b.start) == ("h1", 1))
    assert block.repeats == (1,)
    assert sum(b.m for bs in kept.values() for b in bs) == 3 * 3 * 4 * 3 - 2
    for factors in ({("h1", 1, p): (0.6, 0.6, 0.6)}, {("h1", 1, p): (1.5, 1.5, 1.5)},
                    {("h1", 1, q): (0.6, 0.6, 0.6) for q in points}):
        assert screen_slowed(sweep(factors))[1] == []


def test_a_noisier_config_keeps_its_own_slow_windows() -> None:
    """A config whose windows vary 8x more than the others' (CV 25% against 3%), on three
    starts at four points: the point's scale alone would cut its ordinary slow windows and raise
    its mean; its own scale, the larger, keeps them. The same slowed window in a quiet config
    beside it is still found."""
    rng = np.random.default_rng(5)

    def start(h: str, k: int, cv: float) -> StartWindows:
        return StartWindows(h, k, k, "explore", tuple(np.log(
            100 * np.clip(1 + cv * rng.standard_normal(3), 0.2, None))), (0, 1, 2))

    points = {("w", c): [start("noisy", k, 0.25) for k in range(3)]
              + [start(f"q{i}", 0, 0.03) for i in range(8)] for c in (1, 2, 4, 8)}
    quiet = points[("w", 4)][5]
    points[("w", 4)][5] = dataclasses.replace(quiet, logs=(quiet.logs[0] + math.log(0.6),
                                                           *quiet.logs[1:]))
    kept, slowed = screen_slowed(points)
    assert [(w.point, w.engine_hash, w.repeat) for w in slowed] == [(("w", 4), "q2", 0)]
    assert all(kept[p][:3] == points[p][:3] for p in points)
