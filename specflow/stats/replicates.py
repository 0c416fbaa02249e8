"""The sweep as an experiment: engine starts as replicates, a time-local baseline, error control
per deployment, and racing rounds that spend engine starts only where a decision is still open.

Numbers in, numbers out (numpy and scipy). The decision turns measured windows into
`StartWindows` and asks this module for speedup estimates.

Model, per point (workload x concurrency), on log output throughput:
    y = mu_config + drift(t) + start effect (per engine start) + window noise.
- The replicate unit is the engine start (`StartWindows`): windows inside one start share its
  effect, so a start's mean is the unit and its variance V is estimated from the successive
  differences of each config's start means in run order (von Neumann's mean square successive
  difference), pooled over every config measured more than once at the point. A slow drift barely
  inflates it, where the spread around a config's mean would carry the drift over a long race
  (the contrast itself is drift-free: it is taken against the time-local baseline). Its df is
  Satterthwaite's over the configs, each carrying 2(n-1)^2/(3n-4) for n starts (n - 1 at two
  starts, ~2/3 of it for many): the successive differences share their starts. When only the
  baseline was started twice (a grid sweep: one start per candidate, the closing baseline) one
  degree of freedom cannot carry an interval, so V falls back to the within-start variance /
  windows, and the analysis says that its intervals do not include
  start-to-start variation (racing, or more starts per config, fixes that).
- Time-local baseline: each candidate start is compared with the baseline interpolated linearly
  in run order between the baseline starts around it (the nearest one where it has a neighbour
  on one side only, as in a confirmation look of one row, whose drift between the two starts
  then stays in the contrast). Between two, a linear drift cancels; the contrast's variance
  counts every start it uses.
- A speedup is exp(contrast) with a t interval (Satterthwaite-free: V's own df), and a one-sided
  p-value for "speedup <= 1 + margin".

Windows slowed by outside load (`screen_slowed`): a window far below its own start's median at
the point, on a robust scale (the larger of the point's and its config's), is left out of the
start (one-sided; never a start's fastest window); where most of a start's windows at a point
were slowed together (the point far below the start's level at its other points), against the
start's fastest window there.

Error control (what `analysis` applies, see DESIGN.md "Deciding"):
- Grid sweeps: Holm over the whole deployment's family (every class x band x candidate) at
  alpha = (1 - confidence) / 2, one-sided.
- Racing sweeps: selection and confirmation are separate. Exploration rounds select at most one
  winner per band on exploration data; the winner must then beat the baseline on fresh engine
  starts, against the look's own baseline starts (stage "confirm"); the confirmation tests are
  Holm-corrected over the bands being confirmed, and the alpha is split evenly over the allowed
  confirmation looks (Bonferroni spending), so looking again after an inconclusive confirmation
  cannot inflate the error. Exploration data never enter a confirmation test.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy import special, stats

from specflow.stats.critical import t_value

Stage = Literal["explore", "confirm", "schedule"]
"""Exploration (selection data), confirmation (fresh starts of a selected winner), schedule
(an emitted N schedule deployed as one engine and measured around its thresholds)."""


@dataclass(frozen=True)
class StartWindows:
    """The usable windows of one engine start at one point: the replicate unit."""

    engine_hash: str
    start: int
    """Index of this start among the config's starts (0, 1, ...)."""
    seq: int
    """Position of the engine start in the sweep's run order (time)."""
    stage: Stage
    logs: tuple[float, ...]
    """Log output throughput of each usable window."""
    repeats: tuple[int, ...] = ()
    """Each window's repeat number (as `logs`; empty where the caller did not say)."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.logs))

    @property
    def m(self) -> int:
        return len(self.logs)


@dataclass(frozen=True)
class StartNoise:
    """The noise at one point: the variance of a start's mean between engine starts (pooled over
    configs) and each config's variance between windows."""

    v_start_mean: float
    """Variance of a start's mean log throughput between engine starts (m_bar windows)."""
    df: float
    replicated: bool
    """False when the starts cannot carry an interval (see `start_noise`): windows are then
    treated as independent (Welch over each config's windows)."""
    within: Mapping[str, tuple[float, int]]
    """Per engine hash: variance of log throughput between windows of one start, and its df."""
    m_bar: float = 1.0

    @property
    def cv(self) -> float:
        """Pooled within-start coefficient of variation (sd of log throughput)."""
        df = sum(d for _, d in self.within.values())
        return math.sqrt(sum(v * d for v, d in self.within.values()) / df) if df else 0.0

    def window_var(self, engine_hash: str) -> float:
        v, df = self.within.get(engine_hash, (0.0, 0))
        if df:
            return v
        pooled_df = sum(d for _, d in self.within.values())
        return self.cv ** 2 if pooled_df else 0.0

    def start_mean_var(self, engine_hash: str, m: int) -> tuple[float, float]:
        """Variance of one start's mean of `m` windows, and the df it is known with."""
        w = self.window_var(engine_hash) / m
        if not self.replicated:
            return w, float(max(1, self.within.get(engine_hash, (0.0, 0))[1]))
        # The start effect plus this config's window noise over its m windows (starts may differ
        # in size: racing adapts the windows per start to the noise).
        return self.start_var + w, self.df

    @property
    def start_var(self) -> float:
        """Variance of the engine-start effect: the spread of start means beyond what their
        windows explain (method of moments, floored at 0)."""
        return max(0.0, self.v_start_mean - self.cv ** 2 / self.m_bar)

    def start_var_upper(self, level: float) -> float:
        """A `level` upper confidence bound of the start variance (chi-square on the start
        means' variance's df): what sizing a measurement should assume when few starts back it."""
        if not self.replicated or self.df < 1:
            return self.start_var
        v_ub = self.v_start_mean * self.df / float(stats.chi2.ppf(1 - level, self.df))
        return max(0.0, v_ub - self.cv ** 2 / self.m_bar)

    def windows_per_start(self, start_s: float, window_s: float) -> float:
        """The windows per start that minimise cost x variance: sqrt(start cost / window cost x
        window variance / start variance) (the classic two-stage sampling optimum)."""
        if self.start_var <= 0:
            return math.inf
        return math.sqrt(start_s / max(window_s, 1e-9) * self.cv ** 2 / self.start_var)


def start_noise(starts: Sequence[StartWindows], baseline_hash: str) -> StartNoise:
    """The noise at one point (see the module docstring). The between-start variance pools, over
    every config started more than once, the successive differences of its start means in run
    order (von Neumann), which a slow drift barely inflates; its df is Satterthwaite's over the
    configs, n starts carrying 2(n-1)^2/(3n-4) (`mssd_var` sums (n-1)^2 / that per config)."""
    ss, starts_df, mssd_var, df_cand = 0.0, 0, 0.0, 0
    by_config: dict[str, list[StartWindows]] = defaultdict(list)
    for b in starts:
        if b.m:
            by_config[b.engine_hash].append(b)
    within: dict[str, tuple[float, int]] = {}
    for h, bs in by_config.items():
        ssw = sum(float(np.sum((np.asarray(b.logs) - b.mean) ** 2)) for b in bs)
        dfw = sum(b.m - 1 for b in bs)
        within[h] = (ssw / dfw if dfw else 0.0, dfw)
        n = len(bs)
        if n < 2:
            continue
        means = np.array([b.mean for b in sorted(bs, key=lambda b: b.seq)])
        ss += float(np.sum(np.diff(means) ** 2)) / 2
        starts_df += n - 1
        mssd_var += (3 * n - 4) / 2
        if h != baseline_hash:
            df_cand += n - 1
    m_bar = float(np.mean([b.m for bs in by_config.values() for b in bs])) if by_config else 1.0
    replicated = bool(df_cand or starts_df >= 2)
    df = starts_df ** 2 / mssd_var if mssd_var else 0.0
    return StartNoise(ss / starts_df if starts_df else 0.0, df, replicated, within, m_bar)


def baseline_weights(seq: int, baseline: Sequence[StartWindows]) -> dict[int, float]:
    """Weights over baseline starts (by index in `baseline`) interpolating it at time `seq`."""
    order = sorted(range(len(baseline)), key=lambda i: baseline[i].seq)
    before = [i for i in order if baseline[i].seq <= seq]
    after = [i for i in order if baseline[i].seq > seq]
    if before and after:
        i, j = before[-1], after[0]
        gap = baseline[j].seq - baseline[i].seq
        wj = (seq - baseline[i].seq) / gap
        return {i: 1 - wj, j: wj}
    nearest = before[-1] if before else after[0]
    return {nearest: 1.0}


@dataclass(frozen=True)
class Contrast:
    """log(candidate / time-local baseline) at one point, with its standard error."""

    log_ratio: float
    se: float
    df: float
    n_starts: int
    n_baseline_starts: int
    n_windows: int
    n_baseline_windows: int
    replicated: bool
    cv: float

    def interval(self, confidence: float) -> tuple[float, float]:
        """Two-sided interval of the speedup (ratio scale)."""
        if self.se == 0:
            return math.exp(self.log_ratio), math.exp(self.log_ratio)
        half = t_value(confidence, self.df) * self.se
        return math.exp(self.log_ratio - half), math.exp(self.log_ratio + half)

    def p_above(self, threshold: float) -> float:
        """One-sided p-value of H0: speedup <= threshold."""
        gap = self.log_ratio - math.log(threshold)
        if self.se == 0:
            return 0.0 if gap > 0 else 1.0
        return float(stats.t.sf(gap / self.se, self.df))

    @property
    def speedup(self) -> float:
        return math.exp(self.log_ratio)


def contrast(candidate: Sequence[StartWindows], baseline: Sequence[StartWindows], noise: StartNoise
             ) -> Contrast | None:
    """Candidate starts vs the baseline interpolated at each of their times (None without data).

    Each candidate start weighs 1/B; the baseline starts weigh what the interpolation gives them.
    The variance sums each start's, with Satterthwaite's degrees of freedom."""
    # Written out: no library has a contrast against a baseline interpolated in run order.
    cand = [b for b in candidate if b.m]
    base = [b for b in baseline if b.m]
    if not cand or not base:
        return None
    coef: dict[int, float] = defaultdict(float)
    for b in cand:
        for i, w in baseline_weights(b.seq, base).items():
            coef[i] += w / len(cand)
    theta = (sum(b.mean for b in cand) / len(cand)
             - sum(c * base[i].mean for i, c in coef.items()))
    parts = [noise.start_mean_var(b.engine_hash, b.m) for b in cand]
    terms = [(v / len(cand) ** 2, d) for v, d in parts]
    terms += [(c * c * v, d) for (v, d), c in
              ((noise.start_mean_var(base[i].engine_hash, base[i].m), c) for i, c in coef.items())]
    var = sum(t for t, _ in terms)
    if noise.replicated:
        df = noise.df
    else:  # Welch-Satterthwaite over the configs' window variances
        by_df: dict[float, float] = defaultdict(float)
        for t, d in terms:
            by_df[d] += t
        den = sum(t * t / d for d, t in by_df.items())
        df = var * var / den if den else float(sum(by_df))
    return Contrast(theta, math.sqrt(var), max(df, 1.0), len(cand), len(coef),
                    sum(b.m for b in cand), sum(base[i].m for i in coef), noise.replicated,
                    noise.cv)


@dataclass(frozen=True)
class DriftStep:
    """Two consecutive baseline starts at one point."""

    seq_from: int
    seq_to: int
    ratio: float
    z: float
    flagged: bool


def drift_steps(baseline: Sequence[StartWindows], noise: StartNoise, confidence: float = 0.99
                ) -> list[DriftStep]:
    """Consecutive baseline starts compared; a step beyond noise (two-sided t at `confidence`
    on two start means) is flagged: what was measured between them is re-measured."""
    base = sorted((b for b in baseline if b.m), key=lambda b: b.seq)
    out = []
    for a, b in zip(base, base[1:], strict=False):
        (va, dfa), (vb, _) = noise.start_mean_var(a.engine_hash, a.m), noise.start_mean_var(
            b.engine_hash, b.m)
        crit = t_value(confidence, dfa)
        se = math.sqrt(va + vb)
        d = b.mean - a.mean
        z = d / se if se else (0.0 if d == 0 else math.inf)
        out.append(DriftStep(a.seq, b.seq, math.exp(d), z, abs(z) > crit))
    return out


def starts_by_point(rows: Iterable[tuple[str, str, int, int, int, int, Stage, float]]
                    ) -> dict[tuple[str, int], list[StartWindows]]:
    """Engine starts per point from (engine_hash, workload, concurrency, start, repeat, seq, stage,
    throughput) rows of usable windows (in any order: windows are sorted by repeat)."""
    groups: dict[tuple[str, int], dict[tuple[str, int], list[tuple[int, int, Stage, float]]]] = \
        defaultdict(lambda: defaultdict(list))
    for h, w, c, start, repeat, seq, stage, tput in rows:
        groups[(w, c)][(h, start)].append((repeat, seq, stage, math.log(tput)))
    out: dict[tuple[str, int], list[StartWindows]] = {}
    for point, per in sorted(groups.items()):
        out[point] = [StartWindows(h, start, xs[0][1], xs[0][2], tuple(x[3] for x in xs),
                                   tuple(x[0] for x in xs))
                      for (h, start), xs in ((k, sorted(v)) for k, v in sorted(per.items()))]
    return out


_NORMAL_MAD = float(special.ndtri(0.75))
"""The MAD of a standard normal: a MAD over it is normal-consistent."""
SLOWED_Z = 5.0
"""A window this many robust SDs below its start's other windows was slowed by outside load."""
MIN_RESIDUALS = 8
"""Residuals a point needs before its scale is trusted to call a window slowed."""
Point = tuple[str, int]
"""(workload, concurrency)."""


@dataclass(frozen=True)
class Slowed:
    """A window its own engine start's other windows show was slowed by outside load."""

    point: Point
    engine_hash: str
    start: int
    repeat: int
    ratio: float
    """Its throughput over the median of its start's other windows at the point (`together`:
    of those left in)."""
    z: float
    """Its residual from its start's median (`together`: from its start's fastest window at the
    point), in robust SDs (negative: slower)."""
    together: bool = False
    """Slowed with others of its start at the point, which moved the start's median there: found
    by that point's level against the start's other points (`screen_slowed`, second pass)."""


def screen_slowed(points: Mapping[Point, Sequence[StartWindows]]
                  ) -> tuple[dict[Point, list[StartWindows]], list[Slowed]]:
    """The starts of every point without the windows outside load slowed, and those windows.

    Interference from outside (a background job on the host, a noisy neighbour on the node)
    slows single windows far more than the engine's own noise moves them, and only ever slows.
    Each window of a start with at least two at a point is compared with the median of its
    start's windows there (the start's effect cancels). Its scale is the larger of two robust
    ones (normal-consistent MAD of the residuals, which the slowed windows barely move): the
    point's, over every config's starts there, and its config's, over every point it was
    measured at; a window more than `SLOWED_Z` of it below its start's median is left out of the
    speedups. The larger scale keeps a config noisier than the rest (or a noisier point) from
    losing its ordinary slow windows, which would raise its mean; a point's scale with fewer
    than `MIN_RESIDUALS` residuals, or a config's with fewer than twice that (or either with
    none that differ), is not used, and a window with neither is not screened. One-sided, so a
    start's fastest window is never left out (nor, therefore, all of its windows). A whole
    engine start slowed is a start effect, which the replicate model and the baseline's drift
    check already carry.

    Second pass (`_slowed_together`): when outside load slows most of a start's windows at one
    point (two of three: one engine start in ~140 at 5% of windows hit), their median is slowed
    too and the first pass sees nothing. Such a point sits far below the level its start keeps
    at its other points, against what the config's other starts show there; its windows are
    then compared with the start's fastest one there instead, on the same scale and threshold."""
    kept, slowed, scales = _screen_pass(points, {})
    rest, more, _ = _screen_pass(kept, scales, _slowed_together(kept))
    return rest, [*slowed, *more]


def _screen_pass(points: Mapping[Point, Sequence[StartWindows]],
                 scales: Mapping[tuple[Point, int], float],
                 together: set[tuple[Point, int]] | None = None
                 ) -> tuple[dict[Point, list[StartWindows]], list[Slowed],
                            dict[tuple[Point, int], float]]:
    """One pass of `screen_slowed`: the first (`together` None) against each start's median,
    with the scales it measures; the second against the fastest window of the `together` engine
    starts only, at the first pass's `scales` (an engine start's windows are the first pass's
    survivors, in the same order)."""
    resid: list[tuple[Point, int, int, float]] = []  # (point, engine start index, window index, r)
    for point, starts in points.items():
        for b, sw in enumerate(starts):
            if together is not None:
                if (point, b) in together:
                    top = max(sw.logs)
                    resid += [(point, b, i, x - top) for i, x in enumerate(sw.logs)]
            elif sw.m >= 2:  # (statistics.median: numpy's costs more than a start's windows)
                mid = statistics.median(sw.logs)
                resid += [(point, b, i, x - mid) for i, x in enumerate(sw.logs)]
    if together is None:
        by_point: dict[Point, list[float]] = defaultdict(list)
        by_config: dict[str, list[float]] = defaultdict(list)
        for point, b, _, r in resid:
            if r != 0.0:  # an odd start's middle window sits at 0 by construction
                by_point[point].append(r)
                by_config[points[point][b].engine_hash].append(r)
        point_scale = {k: _robust_scale(v, MIN_RESIDUALS) for k, v in by_point.items()}
        # a config's own scale from fewer residuals is moved too much by the slowed ones themselves
        config_scale = {k: _robust_scale(v, 2 * MIN_RESIDUALS) for k, v in by_config.items()}
        scales = {(point, b): max(point_scale.get(point, 0.0),
                                  config_scale.get(sw.engine_hash, 0.0))
                  for point, starts in points.items() for b, sw in enumerate(starts)}
    drop: dict[tuple[Point, int], dict[int, float]] = defaultdict(dict)  # window: residual
    for point, b, i, r in resid:
        scale = scales.get((point, b), 0.0)
        if scale > 0 and r < -SLOWED_Z * scale:
            drop[(point, b)][i] = r
    slowed = []
    for (point, b), gone in sorted(drop.items()):
        sw = points[point][b]
        for i, r in sorted(gone.items()):
            ref = statistics.median(  # its start's other windows (together: those left in)
                [x for j, x in enumerate(sw.logs) if j != i and (together is None
                                                                    or j not in gone)])
            slowed.append(Slowed(point, sw.engine_hash, sw.start,
                                 sw.repeats[i] if sw.repeats else i,
                                 math.exp(sw.logs[i] - ref), r / scales[(point, b)],
                                 together is not None))
    out = {point: [_without(sw, drop[(point, b)]) if (point, b) in drop else sw
                   for b, sw in enumerate(starts)] for point, starts in points.items()}
    return out, slowed, dict(scales)


def _slowed_together(points: Mapping[Point, Sequence[StartWindows]]
                     ) -> set[tuple[Point, int]]:
    """The engine starts (point, index) whose start's median there sits more than `SLOWED_Z` robust
    SDs below the level the start keeps at its other points, given the config's other starts.

    Per config, a two-way robust fit of its engine starts' medians (log throughput): a point's
    centre, the median over the config's starts that measured it (at least two); a start's
    level, the median of its medians' distances to those centres (at least three points, so
    that one slowed point does not set it). An engine start's interaction is its distance less
    its start's level: what is left once the start's effect (drift included) and the point's
    are taken out. Its scale is the normal-consistent MAD of every config's nonzero
    interactions (at least `MIN_RESIDUALS`). One-sided: a start's point that runs fast is never
    a finding."""
    cells: dict[str, dict[int, dict[Point, tuple[int, float]]]] = defaultdict(
        lambda: defaultdict(dict))
    for point, starts in points.items():
        for b, sw in enumerate(starts):
            if sw.m:
                cells[sw.engine_hash][sw.start][point] = (b, statistics.median(sw.logs))
    inter: list[tuple[Point, int, float]] = []
    for rows in cells.values():
        cols: dict[Point, list[float]] = defaultdict(list)
        for row in rows.values():
            for point, (_, v) in row.items():
                cols[point].append(v)
        centre = {point: statistics.median(v) for point, v in cols.items() if len(v) >= 2}
        for row in rows.values():
            dist = {point: v - centre[point] for point, (_, v) in row.items() if point in centre}
            if len(dist) >= 3:
                level = statistics.median(dist.values())
                inter += [(point, row[point][0], d - level) for point, d in dist.items()]
    scale = _robust_scale([e for *_, e in inter if e != 0.0], MIN_RESIDUALS)
    return {(point, b) for point, b, e in inter if scale > 0 and e < -SLOWED_Z * scale}


def _robust_scale(residuals: Sequence[float], least: int) -> float:
    """The normal-consistent MAD, or 0 below `least` residuals."""
    if len(residuals) < least:
        return 0.0
    x = np.asarray(residuals, dtype=float)  # scipy's median_abs_deviation(scale="normal")
    return float(np.median(np.abs(x - np.median(x))) / _NORMAL_MAD)


def _without(sw: StartWindows, drop: Collection[int]) -> StartWindows:
    return replace(sw, logs=tuple(x for i, x in enumerate(sw.logs) if i not in drop),
                   repeats=tuple(x for i, x in enumerate(sw.repeats) if i not in drop))


def filter_stage(starts: Sequence[StartWindows], stage: Stage | None) -> list[StartWindows]:
    return [b for b in starts if stage is None or b.stage == stage]
