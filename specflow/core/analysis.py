"""Deciding: per traffic class and concurrency band, does speculation pay, and with what.

Pure (numpy and scipy only): frozen `Measurement`s in, frozen decisions out, every rejection with
its reason. The chain is aggregate -> compare with the baseline -> gate -> pick -> schedule.

Statistics, and why:
- A *point* is one engine config x workload x concurrency. Its OK repeats are summarised by the
  median and MAD (what a human reads) and by the geometric mean with a bootstrap CI.
- Speedup is candidate / baseline at the same workload and concurrency, as a ratio of geometric
  means (throughput noise is multiplicative; the mean of logs is the efficient estimate at 3-5
  repeats, where a median throws away most of the information). Its CI resamples both sides
  independently (percentile bootstrap of the log-ratio, `bootstrap_samples`, seeded) and is then
  widened by the factor that gives it the width of Welch's t interval: a plain bootstrap of 3-5
  values is far too narrow and promotes noise.
- The baseline sample is every baseline run at that point: the runs opening the sweep and, when
  given, the runs closing it. If the two brackets differ beyond noise (their ratio's CI excludes
  1; with a single closing run, the prediction interval of a new run) the drift is flagged;
  pooling both brackets already widens every speedup CI by the drift.
- A band's speedup is its *worst* point (every workload of the class, every level in the band).

Decision rule: a candidate is eligible in a band when it was not refused by headroom, ran without
failing at every point, keeps temperature-0 outputs equal to the baseline's (mismatches on
requests where the baseline disagrees with itself are excused; the rest may not exceed
`quality.max_mismatch_fraction`), meets every latency SLO at its worst repeat, and its speedup
lower bound is >= 1 + margin at every point; among eligible candidates the highest lower bound
wins, where bounds within `tie_tolerance` are ties that go to the smaller N, then the cheaper
method (`METHODS[m].cost_rank`). With no eligible candidate, "off" wins.

Calibration (tests/core/test_analysis.py, 1,000 seeded trials each): the defaults (margin 0.05,
confidence 0.95) assume 5 repeats per point with the baseline bracketing the sweep (5 + 5). An
A/A pair is promoted in < 1% of trials for run-to-run CV up to 10%, even at the 3-repeat floor
(about 0.5% at CV 10%). A true 10% gain is promoted in >= 95% of trials at CV <= 1.5% (99.6%);
about 94% at CV 2% and 68% at CV 3%, where some 10 repeats are needed. No test can do much
better: with the 5% margin, the lower bound must clear a gap of half the effect. A rejection that
is only inconclusive says how many repeats would settle it at the observed noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

from specflow.core.methods import METHODS
from specflow.core.records import Measurement
from specflow.core.schema import PromoteSpec

BASELINE_METHOD = "none"
"""`Measurement.method` of the no-speculation baseline."""

Gate = Literal["headroom", "failed", "quality", "slo", "speedup"]
"""The gates a candidate can be rejected by, in the order they are checked."""

_CHUNK = 4_000_000
"""Bootstrap indices drawn per chunk (bounds memory at large `bootstrap_samples`)."""


class AnalysisError(ValueError):
    """The measurements cannot be decided on; each problem says what to measure."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"cannot decide: {n} problem{'s' if n != 1 else ''}"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


# --------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval."""

    value: float
    lo: float
    hi: float
    confidence: float

    def excludes(self, x: float) -> bool:
        return not self.lo <= x <= self.hi


@dataclass(frozen=True)
class PointStats:
    """The OK repeats of one engine config x workload x concurrency, summarised."""

    engine_hash: str
    engine: str
    drafter: str
    method: str
    num_speculative_tokens: int
    traffic_class: str
    workload: str
    concurrency: int
    values: tuple[float, ...]
    """Output throughput of each usable repeat (tokens/s)."""
    failures: dict[str, int]
    """Excluded windows by reason (failed windows, windows with failed requests)."""
    median: float | None
    mad: float | None
    """Median absolute deviation of `values` (unscaled)."""
    throughput: Estimate | None
    """Geometric mean with its CI; None below 2 usable repeats."""
    latency_worst: dict[str, float]
    """Worst (largest) value over usable repeats of each latency key every repeat recorded."""
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position_acceptance: tuple[float, ...]
    """Median over repeats of accepted_at_position_i / drafts."""
    digests: tuple[tuple[str, ...], ...] = field(default=(), metadata={"json": False})
    """Per usable repeat: per-request output digests (quality gate)."""
    prompt_hashes: tuple[str, ...] = field(default=(), metadata={"json": False})
    """Per usable repeat: the prompt content hash."""

    @property
    def n_ok(self) -> int:
        return len(self.values)

    @property
    def n_failed(self) -> int:
        return sum(self.failures.values())

    @property
    def is_baseline(self) -> bool:
        return self.method == BASELINE_METHOD

    @property
    def label(self) -> str:
        return f"{self.engine} ({self.engine_hash}) at {self.workload} c={self.concurrency}"


@dataclass(frozen=True)
class PointSpeedup:
    """Candidate vs baseline at one workload and concurrency."""

    workload: str
    concurrency: int
    speedup: Estimate
    n_candidate: int
    n_baseline: int
    cv: float
    """Pooled run-to-run coefficient of variation (sd of log throughput)."""


@dataclass(frozen=True)
class Drift:
    """Baseline at the end of the sweep vs at its start, at one workload and concurrency."""

    workload: str
    concurrency: int
    ratio: Estimate
    n_start: int
    n_end: int

    @property
    def flagged(self) -> bool:
        """The brackets differ beyond noise (the ratio's CI excludes 1)."""
        return self.ratio.excludes(1.0)


@dataclass(frozen=True)
class QualityCheck:
    """Temperature-0 outputs of a candidate against the baseline's, request by request."""

    requests: int
    """Distinct requests compared (over the class's workloads)."""
    mismatched: int
    """Requests where some candidate run's output differs from the baseline's reference."""
    excused: int
    """Mismatches on requests where the baseline disagrees with itself."""
    unexcused: int
    unstable_baseline: int
    """Requests on which the baseline's own runs disagree."""
    tolerance: float
    """`quality.max_mismatch_fraction`."""
    passed: bool
    examples: tuple[str, ...] = ()
    """Some unexcused mismatches, as `workload#request`."""
    problem: str | None = None
    """Why the gate could not be evaluated (it then fails)."""

    @property
    def fraction(self) -> float:
        return self.unexcused / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Reason:
    """Why a candidate was rejected by one gate."""

    gate: Gate
    detail: str

    def __str__(self) -> str:
        return f"{self.gate}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    """One candidate engine config in one band."""

    engine_hash: str
    engine: str
    drafter: str
    method: str
    num_speculative_tokens: int
    speedups: tuple[PointSpeedup, ...]
    worst: PointSpeedup | None
    """The point with the lowest speedup lower bound (the band's speedup)."""
    quality: QualityCheck | None
    rejected: tuple[Reason, ...]
    status: Literal["winner", "eligible", "rejected"] = "rejected"
    note: str = ""
    """For eligible non-winners: why another candidate was preferred."""
    per_position_acceptance: tuple[float, ...] = ()
    acceptance_rate: float | None = None

    @property
    def score(self) -> float | None:
        """Conservative score: the band's speedup lower bound."""
        return self.worst.speedup.lo if self.worst is not None else None

    @property
    def eligible(self) -> bool:
        return not self.rejected


@dataclass(frozen=True)
class Band:
    """Concurrency levels [lo, hi] (inclusive) decided together."""

    lo: int
    hi: int

    @property
    def label(self) -> str:
        return f"c{self.lo}" if self.lo == self.hi else f"c{self.lo}-{self.hi}"

    def __contains__(self, concurrency: object) -> bool:
        return isinstance(concurrency, int) and self.lo <= concurrency <= self.hi


@dataclass(frozen=True)
class Decision:
    """The decision for one traffic class in one concurrency band."""

    traffic_class: str
    band: Band
    levels: tuple[int, ...]
    """Measured concurrency levels in the band."""
    workloads: tuple[str, ...]
    winner: Verdict | None
    candidates: tuple[Verdict, ...]
    reasons: tuple[str, ...]
    """Why the outcome (the winner's evidence, or why nothing passed)."""
    notes: tuple[str, ...] = ()
    """Things to know: drift, a baseline that breaks the SLO itself."""

    @property
    def outcome(self) -> Literal["speculate", "off"]:
        return "off" if self.winner is None else "speculate"


@dataclass(frozen=True)
class Deployment:
    """What one traffic class should be served with: one engine, possibly with an N schedule."""

    traffic_class: str
    outcome: Literal["speculate", "off"]
    engine_hash: str
    """The measured engine config to deploy (the baseline's for "off"; for a schedule, the drafter
    at the largest N in it, which is the global num_speculative_tokens)."""
    engine: str
    drafter: str
    method: str
    num_speculative_tokens: int
    schedule: tuple[tuple[int, int, int], ...] | None
    """vLLM `num_speculative_tokens_per_batch_size` ranges [start, end, N]; None for a fixed N."""
    baseline_hash: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClassResult:
    """Everything decided for one traffic class."""

    traffic_class: str
    bands: tuple[Band, ...]
    decisions: tuple[Decision, ...]
    deployment: Deployment
    drift: tuple[Drift, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Analysis:
    """The result of `analyze`: per-class decisions and every aggregated point."""

    classes: tuple[ClassResult, ...]
    points: tuple[PointStats, ...]
    closing: tuple[PointStats, ...]
    """Baseline points from the runs closing the sweep."""
    settings: dict[str, Any]
    """The PromoteSpec the decision was made under."""
    headroom_refused: tuple[str, ...] = ()

    def result(self, traffic_class: str) -> ClassResult:
        for r in self.classes:
            if r.traffic_class == traffic_class:
                return r
        raise KeyError(f"no decision for traffic class {traffic_class!r}; "
                       f"decided: {[r.traffic_class for r in self.classes]}")

    @property
    def excluded(self) -> int:
        """Windows excluded as failed, over all points."""
        return sum(p.n_failed for p in (*self.points, *self.closing))


def to_json(obj: Any) -> Any:
    """Plain JSON data for any record of this module (fields marked json=False are left out)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)
               if f.metadata.get("json", True)}
        for prop in ("label", "outcome", "score", "fraction", "flagged", "n_ok", "n_failed"):
            if hasattr(type(obj), prop):
                out[prop] = to_json(getattr(obj, prop))
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [to_json(v) for v in obj]
        return sorted(items) if isinstance(obj, (set, frozenset)) else items
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, np.generic):
        return to_json(obj.item())
    return obj


# --------------------------------------------------------------------------------------------
# Bootstrap


def _rng(seed: int, *key: object) -> np.random.Generator:
    """A generator seeded by the spec's seed and the point's identity (order-independent)."""
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return np.random.default_rng([seed, *np.frombuffer(digest[:16], dtype=np.uint32).tolist()])


def bootstrap_means(x: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Means of `samples` resamples (with replacement) of x, vectorised in bounded chunks."""
    n = x.size
    out = np.empty(samples)
    step = max(1, _CHUNK // n)
    for start in range(0, samples, step):
        stop = min(samples, start + step)
        out[start:stop] = x[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    return out


def _widen(theta: float, boot: np.ndarray, confidence: float, k: float) -> tuple[float, float]:
    """Percentile interval of `boot`, widened about theta by k (never narrower than it)."""
    alpha = 1.0 - confidence
    q_lo, q_hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return min(q_lo, theta - k * (theta - q_lo)), max(q_hi, theta + k * (q_hi - theta))


def _z(confidence: float) -> float:
    return float(stats.norm.ppf(0.5 + confidence / 2))


def _t(confidence: float, df: float) -> float:
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def geometric_mean_ci(values: Sequence[float], promote: PromoteSpec, *key: object
                      ) -> Estimate | None:
    """Geometric mean of positive values with a t-calibrated bootstrap CI (None below 2 values)."""
    x = np.log(np.asarray(values, dtype=float))
    n = x.size
    if n < 2:
        return None
    theta = float(x.mean())
    if np.ptp(x) == 0:
        return Estimate(math.exp(theta), math.exp(theta), math.exp(theta), promote.confidence)
    boot = bootstrap_means(x, promote.bootstrap_samples, _rng(promote.seed, "tput", *key))
    # The bootstrap variance of a mean is (n-1)/n of the usual estimate; t replaces z.
    k = _t(promote.confidence, n - 1) / _z(promote.confidence) * math.sqrt(n / (n - 1))
    lo, hi = _widen(theta, boot, promote.confidence, k)
    return Estimate(math.exp(theta), math.exp(lo), math.exp(hi), promote.confidence)


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], promote: PromoteSpec,
             *key: object) -> tuple[Estimate, float]:
    """Ratio of geometric means, both sides resampled, CI widened to Welch's t width.

    Returns the estimate and the pooled coefficient of variation (sd of the log values)."""
    a = np.log(np.asarray(numerator, dtype=float))
    b = np.log(np.asarray(denominator, dtype=float))
    na, nb = a.size, b.size
    if na < 2 or nb < 2:
        raise ValueError(f"a ratio CI needs >= 2 values per side; got {na} and {nb}")
    theta = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / na, b.var(ddof=1) / nb
    cv = math.sqrt(((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2))
    if va + vb == 0:
        point = math.exp(theta)
        return Estimate(point, point, point, promote.confidence), 0.0
    rng = _rng(promote.seed, "ratio", *key)
    boot = (bootstrap_means(a, promote.bootstrap_samples, rng)
            - bootstrap_means(b, promote.bootstrap_samples, rng))
    df = (va + vb) ** 2 / ((va**2 / (na - 1) if va else 0.0) + (vb**2 / (nb - 1) if vb else 0.0))
    df = min(max(df, min(na, nb) - 1), na + nb - 2)
    boot_var = va * (na - 1) / na + vb * (nb - 1) / nb
    k = _t(promote.confidence, df) / _z(promote.confidence) * math.sqrt((va + vb) / boot_var)
    lo, hi = _widen(theta, boot, promote.confidence, k)
    return Estimate(math.exp(theta), math.exp(lo), math.exp(hi), promote.confidence), cv


def drift_ratio(start: Sequence[float], end: Sequence[float], promote: PromoteSpec,
                *key: object) -> Estimate:
    """End / start of the baseline's bracketing runs. With one closing run the interval is the
    prediction interval of a new run from the opening ones (t, n-1 df); otherwise `ratio_ci`."""
    if len(end) >= 2:
        return ratio_ci(end, start, promote, "drift", *key)[0]
    x = np.log(np.asarray(start, dtype=float))
    n = x.size
    value = math.exp(math.log(end[0]) - float(x.mean()))
    half = _t(promote.confidence, n - 1) * float(x.std(ddof=1)) * math.sqrt(1 + 1 / n)
    return Estimate(value, value * math.exp(-half), value * math.exp(half), promote.confidence)


def repeats_needed(speedup: float, threshold: float, cv: float, confidence: float,
                   power: float = 0.8) -> int | None:
    """Repeats per side that would put the lower bound above `threshold` with `power`, if the
    observed speedup and noise hold (None when the speedup itself is below the threshold)."""
    gap = math.log(speedup) - math.log(threshold)
    if gap <= 0:
        return None
    if cv == 0:
        return 2
    return max(2, math.ceil(2 * ((_z(confidence) + _z(2 * power - 1)) * cv / gap) ** 2))


# --------------------------------------------------------------------------------------------
# Aggregation


def _exclusion(m: Measurement) -> str | None:
    """Why a window is unusable, or None."""
    if not m.ok:
        return m.failure or "failed"
    if m.failed:
        return "failed_requests"
    if not (math.isfinite(m.output_throughput) and m.output_throughput > 0):
        return "no_throughput"
    return None


def aggregate(measurements: Iterable[Measurement], promote: PromoteSpec, role: str = "open"
              ) -> list[PointStats]:
    """Group windows by engine x workload x concurrency; summarise usable ones, count the rest."""
    groups: dict[tuple[str, str, int], list[Measurement]] = defaultdict(list)
    for m in measurements:
        groups[(m.key.engine_hash, m.key.workload, m.key.concurrency)].append(m)
    out = []
    for (engine_hash, workload, concurrency), ms in sorted(groups.items()):
        ms.sort(key=lambda m: m.key.repeat)
        usable = [m for m in ms if _exclusion(m) is None]
        failures = Counter(r for m in ms if (r := _exclusion(m)) is not None)
        values = tuple(m.output_throughput for m in usable)
        arr = np.asarray(values, dtype=float)
        median = float(np.median(arr)) if values else None
        mad = float(np.median(np.abs(arr - median))) if values else None
        latency: dict[str, float] = {}
        if usable:
            keys = set.intersection(*(set(m.latency_ms) for m in usable))
            latency = {k: max(m.latency_ms[k] for m in usable) for k in sorted(keys)}
        rates = [m.acceptance_rate for m in usable if m.acceptance_rate is not None]
        mals = [m.mean_acceptance_length for m in usable if m.mean_acceptance_length is not None]
        first = ms[0]
        out.append(PointStats(
            engine_hash=engine_hash, engine=first.engine, drafter=first.drafter,
            method=first.method, num_speculative_tokens=first.num_speculative_tokens,
            traffic_class=first.traffic_class, workload=workload, concurrency=concurrency,
            values=values, failures=dict(sorted(failures.items())), median=median, mad=mad,
            throughput=geometric_mean_ci(values, promote, role, engine_hash, workload,
                                         concurrency),
            latency_worst=latency,
            acceptance_rate=float(np.median(rates)) if rates else None,
            mean_acceptance_length=float(np.median(mals)) if mals else None,
            per_position_acceptance=_median_curve(m.per_position_acceptance for m in usable),
            digests=tuple(m.output_digests for m in usable),
            prompt_hashes=tuple(m.prompt_hash for m in usable),
        ))
    return out


def _median_curve(curves: Iterable[Sequence[float]]) -> tuple[float, ...]:
    """Position-wise median of acceptance curves, over the positions all of them have."""
    curves = [c for c in curves if c]
    if not curves:
        return ()
    n = min(len(c) for c in curves)
    return tuple(float(v) for v in np.median(np.asarray([c[:n] for c in curves]), axis=0))


# --------------------------------------------------------------------------------------------
# Bands and schedules


def bands_for(promote: PromoteSpec, levels: Sequence[int]
              ) -> tuple[tuple[Band, ...], list[str], list[str]]:
    """The bands to decide (configured, or one per measured level), with problems and notes."""
    levels = sorted(set(levels))
    if not promote.concurrency_bands:
        return tuple(Band(c, c) for c in levels), [], []
    problems, notes = [], []
    bands = []
    for i, (lo, hi) in enumerate(promote.concurrency_bands):
        if lo > hi:
            problems.append(f"promote.concurrency_bands[{i}]: low {lo} > high {hi}; "
                            "expected [low, high] with low <= high")
        else:
            bands.append(Band(lo, hi))
    bands.sort(key=lambda b: b.lo)
    for a, b in itertools.pairwise(bands):
        if b.lo <= a.hi:
            problems.append(f"promote.concurrency_bands: {[a.lo, a.hi]} overlaps {[b.lo, b.hi]}; "
                            "expected disjoint bands")
    for b in bands:
        if not any(c in b for c in levels):
            problems.append(f"promote.concurrency_bands: band {[b.lo, b.hi]} has no measured "
                            f"concurrency level (measured: {levels}); add one to sweep.concurrency")
    outside = [c for c in levels if not any(c in b for b in bands)]
    if outside:
        notes.append(f"concurrency levels {outside} lie outside every band and are not decided on")
    return tuple(bands), problems, notes


def build_schedule(n_by_band: Sequence[tuple[Band, int]], max_batch_size: int | None = None
                   ) -> tuple[list[list[int]] | None, list[str]]:
    """vLLM `num_speculative_tokens_per_batch_size` from the N chosen per band.

    Ranges run contiguously from batch size 1 to the last band's end (or `max_batch_size`);
    batch sizes below the first band or between bands take the band below (vLLM carries N
    forward the same way). Returns None when one N serves every band, and notes on what was
    filled in rather than measured."""
    if not n_by_band:
        raise ValueError("a schedule needs at least one band")
    ordered = sorted(n_by_band, key=lambda bn: bn[0].lo)
    end = max_batch_size if max_batch_size is not None else ordered[-1][0].hi
    notes = []
    ranges: list[list[int]] = []
    for i, (band, n) in enumerate(ordered):
        start = 1 if i == 0 else band.lo
        stop = ordered[i + 1][0].lo - 1 if i + 1 < len(ordered) else max(end, band.hi)
        if i == 0 and band.lo > 1:
            notes.append(f"batch sizes 1-{band.lo - 1} were not measured; they use band "
                         f"{band.label}'s N={n}")
        if stop > band.hi:
            notes.append(f"batch sizes {band.hi + 1}-{stop} were not measured; they use band "
                         f"{band.label}'s N={n}")
        if ranges and ranges[-1][2] == n:
            ranges[-1][1] = stop
        else:
            ranges.append([start, stop, n])
    return (ranges if len(ranges) > 1 else None), notes


# --------------------------------------------------------------------------------------------
# Gates


@dataclass(frozen=True)
class _Reference:
    """The baseline's outputs for one workload: the reference digest per request, and which
    requests it does not reproduce itself."""

    prompt_hash: str
    digests: tuple[str, ...]
    unstable: frozenset[int]
    runs: int


def _references(baseline: Sequence[PointStats]) -> tuple[dict[str, _Reference], dict[str, str]]:
    """Per workload, the baseline's reference outputs (or why there are none)."""
    runs: dict[str, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    for p in baseline:
        for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
            runs[p.workload].append((ph, d))
    refs, missing = {}, {}
    for workload in sorted({p.workload for p in baseline}):
        rs = [(ph, d) for ph, d in runs[workload] if d]
        if not rs:
            missing[workload] = f"the baseline recorded no output digests for {workload}"
            continue
        if len({(ph, len(d)) for ph, d in rs}) > 1:
            missing[workload] = (f"the baseline's runs of {workload} used different prompts "
                                 "(prompt_hash or count differs); re-measure it")
            continue
        per_request = list(zip(*(d for _, d in rs), strict=True))
        reference = tuple(min(Counter(seen).most_common(), key=lambda kv: (-kv[1], kv[0]))[0]
                          for seen in per_request)
        unstable = frozenset(i for i, seen in enumerate(per_request) if len(set(seen)) > 1)
        refs[workload] = _Reference(rs[0][0], reference, unstable, len(rs))
    return refs, missing


def quality_check(candidate: Sequence[PointStats], refs: Mapping[str, _Reference],
                  missing: Mapping[str, str], promote: PromoteSpec) -> QualityCheck:
    """Compare a candidate's outputs in one band with the baseline's, request by request."""
    q = promote.quality
    requests = mismatched = excused = unstable = 0
    examples: list[str] = []
    problems: list[str] = []
    for workload in sorted({p.workload for p in candidate}):
        if workload in missing:
            problems.append(missing[workload])
            continue
        ref = refs[workload]
        excusable = ref.unstable if q.calibrate_with_baseline_repeat else frozenset()
        if q.calibrate_with_baseline_repeat and ref.runs < 2:
            problems.append(f"the baseline has one run with digests for {workload}; "
                            "calibration needs two")
        bad: set[int] = set()
        for p in (p for p in candidate if p.workload == workload):
            for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
                if not d:
                    problems.append(f"{p.label} recorded no output digests")
                elif len(d) != len(ref.digests) or (ph and ref.prompt_hash
                                                    and ph != ref.prompt_hash):
                    problems.append(f"{p.label} was sent different prompts than the baseline")
                else:
                    pairs = enumerate(zip(d, ref.digests, strict=False))
                    bad.update(i for i, (x, y) in pairs if x != y)
        requests += len(ref.digests)
        mismatched += len(bad)
        excused += len(bad & excusable)
        unstable += len(ref.unstable)
        examples += [f"{workload}#{i}" for i in sorted(bad - excusable)]
    unexcused = mismatched - excused
    problem = "; ".join(dict.fromkeys(problems)) or None
    passed = problem is None and requests > 0 and unexcused <= q.max_mismatch_fraction * requests
    return QualityCheck(requests, mismatched, excused, unexcused, unstable,
                        q.max_mismatch_fraction, passed, tuple(examples[:8]), problem)


def slo_violations(points: Iterable[PointStats], promote: PromoteSpec) -> list[str]:
    """Each latency SLO broken (or not recorded) at a point, judged by its worst repeat."""
    out = []
    for key, bound in promote.slo.model_dump().items():
        if bound is None:
            continue
        for p in points:
            if not p.n_ok:
                continue
            worst = p.latency_worst.get(key)
            if worst is None:
                out.append(f"{key} not recorded at {p.workload} c={p.concurrency}")
            elif worst > bound:
                out.append(f"{key} {worst:.1f} > {bound:g} at {p.workload} c={p.concurrency}")
    return out


# --------------------------------------------------------------------------------------------
# Deciding


def _cost(method: str) -> int:
    info = METHODS.get(method)
    return info.cost_rank if info is not None else len(METHODS)


def _tie_key(v: Verdict) -> tuple[Any, ...]:
    return (v.num_speculative_tokens, _cost(v.method), -(v.score or 0.0), v.engine, v.engine_hash)


def pick(eligible: Sequence[Verdict], tie_tolerance: float) -> tuple[Verdict, list[Verdict]]:
    """The winner among eligible verdicts, and the others with a note on why they lost."""
    best = max(v.score or 0.0 for v in eligible)
    tied = [v for v in eligible if (v.score or 0.0) >= best * (1 - tie_tolerance)]
    winner = min(tied, key=_tie_key)
    others = []
    for v in eligible:
        if v is winner:
            continue
        if any(v is t for t in tied):
            note = (f"tied with {winner.engine} (lower bounds within {tie_tolerance:.0%}); "
                    "the smaller N, then the cheaper method is preferred")
        else:
            note = f"lower bound {v.score:.3f} < winner's {winner.score:.3f}"
        others.append(dataclasses.replace(v, status="eligible", note=note))
    return dataclasses.replace(winner, status="winner"), others


@dataclass(frozen=True)
class _BandInputs:
    """What every band of one traffic class is decided from."""

    traffic_class: str
    workloads: tuple[str, ...]
    candidates: Mapping[str, list[PointStats]]
    """Candidate points by engine hash."""
    baseline_points: tuple[PointStats, ...]
    """The opening baseline points of the class."""
    baseline: Mapping[tuple[str, int], list[float]]
    """Baseline throughput at (workload, concurrency), opening and closing runs pooled."""
    refs: Mapping[str, _Reference]
    missing_refs: Mapping[str, str]
    """Workloads without a usable baseline reference, with why."""
    refused: Collection[str]
    """Engine hashes the headroom check refused."""
    drift: tuple[Drift, ...]
    promote: PromoteSpec


def _failed_reasons(pts: Sequence[PointStats]) -> list[Reason]:
    """Points where every repeat failed."""
    return [Reason("failed", f"every repeat failed at {p.workload} c={p.concurrency} "
                             f"({', '.join(f'{r} x{n}' for r, n in p.failures.items())})")
            for p in pts if not p.n_ok]


def _quality_gate(ok: Sequence[PointStats], inputs: _BandInputs
                  ) -> tuple[QualityCheck | None, list[Reason]]:
    """The output-equality check of a candidate's usable points, and its rejection if any."""
    if not ok:
        return None, []
    quality = quality_check(ok, inputs.refs, inputs.missing_refs, inputs.promote)
    if quality.passed:
        return quality, []
    detail = quality.problem or (
        f"{quality.unexcused} of {quality.requests} requests differ from the baseline "
        f"({quality.fraction:.1%} > {quality.tolerance:.1%}; {quality.excused} more "
        f"excused as baseline-unstable); e.g. {', '.join(quality.examples)}")
    return quality, [Reason("quality", detail)]


def _speedups(ok: Sequence[PointStats], inputs: _BandInputs) -> list[PointSpeedup]:
    """Candidate vs pooled baseline at each usable point."""
    out = []
    for p in ok:
        b = inputs.baseline[(p.workload, p.concurrency)]
        est, cv = ratio_ci(p.values, b, inputs.promote, p.engine_hash, p.workload, p.concurrency)
        out.append(PointSpeedup(p.workload, p.concurrency, est, p.n_ok, len(b), cv))
    return out


def _speedup_reason(s: PointSpeedup, promote: PromoteSpec) -> Reason | None:
    """Why a point's speedup lower bound misses 1 + margin, and what would settle it."""
    threshold = 1 + promote.margin
    e = s.speedup
    if e.lo >= threshold:
        return None
    detail = (f"lower bound {e.lo:.3f} < {threshold:.3f} at {s.workload} c={s.concurrency} "
              f"(speedup {e.value:.3f}, {e.confidence:.0%} CI [{e.lo:.3f}, {e.hi:.3f}], "
              f"n={s.n_candidate}/{s.n_baseline})")
    need = repeats_needed(e.value, threshold, s.cv, promote.confidence)
    if e.hi < 1:
        detail += "; slower than the baseline"
    elif need is None:
        detail += f"; the gain is below the {promote.margin:.0%} margin"
    else:
        detail += (f"; inconclusive: about {need} repeats per side would settle it at the "
                   f"observed noise (CV {s.cv:.1%})")
    return Reason("speedup", detail)


def _median_acceptance(ok: Sequence[PointStats]) -> float | None:
    rates = [p.acceptance_rate for p in ok if p.acceptance_rate is not None]
    return float(np.median(rates)) if rates else None


def _verdict(inputs: _BandInputs, pts: Sequence[PointStats]) -> Verdict:
    """Gate one candidate in one band (its points: every workload x level of the band)."""
    engine = pts[0]
    reasons: list[Reason] = []
    if engine.engine_hash in inputs.refused:
        reasons.append(Reason("headroom", "refused by the headroom check (does not fit)"))
    reasons += _failed_reasons(pts)
    ok = [p for p in pts if p.n_ok]
    quality, quality_reasons = _quality_gate(ok, inputs)
    reasons += quality_reasons
    reasons += [Reason("slo", v) for v in slo_violations(ok, inputs.promote)]
    speedups = _speedups(ok, inputs)
    reasons += [r for s in speedups if (r := _speedup_reason(s, inputs.promote)) is not None]
    return Verdict(
        engine_hash=engine.engine_hash, engine=engine.engine, drafter=engine.drafter,
        method=engine.method, num_speculative_tokens=engine.num_speculative_tokens,
        speedups=tuple(speedups),
        worst=min(speedups, key=lambda s: s.speedup.lo) if speedups else None,
        quality=quality, rejected=tuple(reasons),
        per_position_acceptance=_median_curve(p.per_position_acceptance for p in ok),
        acceptance_rate=_median_acceptance(ok),
    )


def _band_verdicts(inputs: _BandInputs, band: Band) -> list[Verdict]:
    """A verdict for every candidate measured in the band where the baseline was too."""
    verdicts = []
    for _, pts in sorted(inputs.candidates.items()):
        in_band = [p for p in pts
                   if p.concurrency in band and (p.workload, p.concurrency) in inputs.baseline]
        if in_band:
            verdicts.append(_verdict(inputs, in_band))
    return verdicts


def _band_notes(inputs: _BandInputs, band: Band) -> list[str]:
    """Baseline drift in the band, and SLOs the baseline itself breaks there."""
    notes = [f"the baseline drifted {d.ratio.value - 1:+.1%} between the start and the end of "
             f"the sweep at {d.workload} c={d.concurrency} (CI [{d.ratio.lo - 1:+.1%}, "
             f"{d.ratio.hi - 1:+.1%}]); both brackets are pooled as the baseline, which widens "
             "every speedup CI"
             for d in inputs.drift if d.concurrency in band and d.flagged]
    in_band = [p for p in inputs.baseline_points if p.concurrency in band]
    notes += [f"the baseline itself breaks an SLO ({v}): this band needs capacity, which "
              "speculation alone may not give" for v in slo_violations(in_band, inputs.promote)]
    return notes


def _winner_reasons(winner: Verdict, promote: PromoteSpec) -> tuple[str, ...]:
    """The winner's evidence: its worst point's speedup, its quality check, the SLOs."""
    w, q = winner.worst, winner.quality
    assert w is not None  # eligible implies measured speedups
    return (
        f"{winner.engine} ({winner.method}, N={winner.num_speculative_tokens}): speedup lower "
        f"bound {w.speedup.lo:.3f} >= {1 + promote.margin:.3f} at its worst point "
        f"{w.workload} c={w.concurrency} (speedup {w.speedup.value:.3f}, "
        f"{w.speedup.confidence:.0%} CI [{w.speedup.lo:.3f}, {w.speedup.hi:.3f}])",
        f"quality: {q.unexcused} of {q.requests} requests differ unexcused "
        f"(tolerance {q.tolerance:.1%}; {q.excused} excused as baseline-unstable)"
        if q is not None else "quality: not evaluated",
        "latency SLOs met at the worst repeat"
        if any(b is not None for b in promote.slo.model_dump().values())
        else "no latency SLOs set",
    )


def _off_reasons(verdicts: Sequence[Verdict]) -> tuple[str, ...]:
    """Why speculation is off in a band: nothing measured, or the gates every candidate failed."""
    if not verdicts:
        return ("no speculative candidate was measured in this band",)
    by_gate = Counter(g for v in verdicts for g in dict.fromkeys(r.gate for r in v.rejected))
    return (f"speculation off: none of {len(verdicts)} candidates passed "
            f"(rejected by {', '.join(f'{g} x{n}' for g, n in by_gate.items())})",)


def _decide_band(inputs: _BandInputs, band: Band) -> Decision:
    """The winner of one band (or "off"), every candidate ranked, with the reasons."""
    levels = tuple(sorted({p.concurrency for p in inputs.baseline_points if p.concurrency in band}))
    verdicts = _band_verdicts(inputs, band)
    eligible = [v for v in verdicts if v.eligible]
    rejected = sorted((v for v in verdicts if not v.eligible), key=_tie_key)
    winner: Verdict | None = None
    if eligible:
        winner, others = pick(eligible, inputs.promote.tie_tolerance)
        reasons = _winner_reasons(winner, inputs.promote)
        candidates = (winner, *sorted(others, key=lambda v: -(v.score or 0.0)), *rejected)
    else:
        reasons = _off_reasons(verdicts)
        candidates = tuple(rejected)
    return Decision(traffic_class=inputs.traffic_class, band=band, levels=levels,
                    workloads=inputs.workloads, winner=winner, candidates=candidates,
                    reasons=reasons, notes=tuple(_band_notes(inputs, band)))


def _n_per_band(decisions: Sequence[Decision], drafter: str, tie_tolerance: float
                ) -> tuple[list[tuple[Band, int]], dict[int, Verdict], list[str]]:
    """The drafter's N in each band (0 where none of its engines is eligible), its engine per N,
    and notes on bands another drafter won."""
    notes = []
    n_by_band: list[tuple[Band, int]] = []
    engines: dict[int, Verdict] = {}
    for d in decisions:
        if d.winner is not None and d.winner.drafter == drafter:
            chosen: Verdict | None = d.winner
        else:
            mine = [v for v in d.candidates if v.drafter == drafter and v.eligible]
            chosen = pick(mine, tie_tolerance)[0] if mine else None
        n = chosen.num_speculative_tokens if chosen is not None else 0
        if chosen is not None:
            engines[n] = chosen
        if d.winner is not None and d.winner.drafter != drafter:
            notes.append(f"band {d.band.label}: {d.winner.engine} won, but one engine serves one "
                         f"drafter; {drafter} runs N={n} there")
        n_by_band.append((d.band, n))
    return n_by_band, engines, notes


def _deployment(traffic_class: str, decisions: Sequence[Decision], baseline: PointStats,
                max_batch_size: int | None, tie_tolerance: float
                ) -> tuple[Deployment, list[str]]:
    """One engine per class: the drafter winning most bands, with its best N per band."""
    baseline_hash = baseline.engine_hash
    off = Deployment(traffic_class, "off", baseline_hash, baseline.engine, baseline.drafter,
                     BASELINE_METHOD, 0, None, baseline_hash,
                     ("speculation loses or is unproven in every band",))
    winners = [(i, d.winner) for i, d in enumerate(decisions) if d.winner is not None]
    if not winners:
        return off, []
    wins = Counter(w.drafter for _, w in winners)
    first = {w.drafter: i for i, w in reversed(winners)}
    method = {w.drafter: w.method for _, w in winners}
    drafter = min(wins, key=lambda d: (-wins[d], first[d], _cost(method[d]), d))
    n_by_band, engines, notes = _n_per_band(decisions, drafter, tie_tolerance)
    n_max = max(n for _, n in n_by_band)
    top = engines[n_max]
    reasons = [f"{drafter} wins {wins[drafter]} of {len(decisions)} bands"]
    if len({n for _, n in n_by_band}) == 1:
        return Deployment(traffic_class, "speculate", top.engine_hash, top.engine, drafter,
                          top.method, n_max, None, baseline_hash, tuple(reasons)), notes
    schedule, fill = build_schedule(n_by_band, max_batch_size)
    notes += fill
    if schedule is not None:
        reasons.append("N changes with load: " + ", ".join(
            f"{b.label}: N={n}" for b, n in n_by_band))
        notes.append("the schedule was assembled from fixed-N measurements; sweep it as one "
                     "engine before relying on it (vLLM drops full CUDA graphs to piecewise for "
                     "a dynamic N, and the drafter's memory is held even where N=0)")
    ranges = tuple((start, end, k) for start, end, k in schedule) if schedule else None
    return Deployment(traffic_class, "speculate", top.engine_hash, top.engine, drafter,
                      top.method, n_max, ranges, baseline_hash, tuple(reasons)), notes


def analyze(measurements: Iterable[Measurement], promote: PromoteSpec, *,
            closing_baseline: Iterable[Measurement] = (),
            refused_by_headroom: Collection[str] = frozenset()) -> Analysis:
    """Decide every traffic class and band of a sweep.

    `measurements`: every window of the sweep, the baseline's opening runs included.
    `closing_baseline`: baseline windows measured again at the end of the sweep (drift check;
    pooled into the baseline). `refused_by_headroom`: engine hashes the headroom check refused.
    Raises AnalysisError, listing every point to (re-)measure, when the data cannot carry a
    decision."""
    points = aggregate(measurements, promote, "open")
    closing = aggregate(closing_baseline, promote, "close")
    refused = frozenset(refused_by_headroom)
    problems = [f"closing_baseline holds {p.label}, which is not the baseline"
                for p in closing if not p.is_baseline]
    results = []
    for traffic_class in sorted({p.traffic_class for p in points}):
        pts = [p for p in points if p.traffic_class == traffic_class]
        base_pts, problem = _class_baseline(traffic_class, pts)
        if problem is not None:
            problems.append(problem)
            continue
        cand = _candidates(pts)
        problems += _coverage_problems(base_pts, cand, refused, promote)
        bands, band_problems, band_notes = bands_for(promote, [p.concurrency for p in base_pts])
        problems += band_problems
        if problems:
            continue  # keep checking the other classes, but decide nothing
        close_pts = [p for p in closing if p.engine_hash == base_pts[0].engine_hash
                     and p.traffic_class == traffic_class]
        results.append(_decide_class(traffic_class, bands, band_notes, base_pts, close_pts,
                                     cand, refused, promote))
    if problems:
        raise AnalysisError(problems)
    return Analysis(tuple(results), tuple(points), tuple(closing),
                    promote.model_dump(mode="json"), tuple(sorted(refused)))


def _class_baseline(traffic_class: str, pts: Sequence[PointStats]
                    ) -> tuple[list[PointStats], str | None]:
    """The class's baseline points, or why there is no single baseline to compare with."""
    base_pts = [p for p in pts if p.is_baseline]
    if not base_pts:
        return [], (f"traffic class {traffic_class}: the no-speculation baseline was not "
                    "measured; measure it (sweep.include_baseline: true)")
    base_hashes = sorted({p.engine_hash for p in base_pts})
    if len(base_hashes) > 1:
        return [], (f"traffic class {traffic_class}: {len(base_hashes)} baseline engines "
                    f"({', '.join(base_hashes)}); expected one")
    return base_pts, None


def _candidates(pts: Sequence[PointStats]) -> dict[str, list[PointStats]]:
    """Speculative points by engine hash."""
    cand: dict[str, list[PointStats]] = defaultdict(list)
    for p in pts:
        if not p.is_baseline:
            cand[p.engine_hash].append(p)
    return cand


def _coverage_problems(base_pts: Sequence[PointStats], cand: Mapping[str, list[PointStats]],
                       refused: Collection[str], promote: PromoteSpec) -> list[str]:
    """Points with too few repeats, and points one side measured but the other did not."""
    problems = [_too_few(p, promote, "the baseline") for p in base_pts
                if p.n_ok < promote.min_repeats]
    grid = sorted({(p.workload, p.concurrency) for p in base_pts})
    for engine_hash, cps in sorted(cand.items()):
        if engine_hash in refused:
            continue
        have = {(p.workload, p.concurrency): p for p in cps}
        for w, c in grid:
            point = have.get((w, c))
            if point is None:
                problems.append(f"{cps[0].engine} ({engine_hash}) has no window at {w} c={c}; "
                                f"measure it ({promote.min_repeats} repeats)")
            elif 0 < point.n_ok < promote.min_repeats:
                problems.append(_too_few(point, promote, point.engine))
        for w, c in sorted(set(have) - set(grid)):
            problems.append(f"the baseline has no window at {w} c={c}, where {cps[0].engine} "
                            "was measured; measure the baseline there")
    return problems


def _too_few(p: PointStats, promote: PromoteSpec, who: str) -> str:
    failed = f" ({', '.join(f'{r} x{n}' for r, n in p.failures.items())} excluded)" \
        if p.failures else ""
    return (f"{who} ({p.engine_hash}) at {p.workload} c={p.concurrency}: {p.n_ok} usable "
            f"repeat{'s' if p.n_ok != 1 else ''}{failed}; need >= {promote.min_repeats}: "
            "re-measure this point")


def _pooled_baseline(base_pts: Sequence[PointStats], close_pts: Sequence[PointStats],
                     promote: PromoteSpec
                     ) -> tuple[dict[tuple[str, int], list[float]], list[Drift], list[str]]:
    """Opening and closing baseline runs pooled per point, the drift between them, and notes."""
    closing = {(p.workload, p.concurrency): p for p in close_pts}
    base: dict[tuple[str, int], list[float]] = {}
    drift, notes = [], []
    for p in base_pts:
        end = closing.get((p.workload, p.concurrency))
        base[(p.workload, p.concurrency)] = [*p.values, *(end.values if end else ())]
        if end is not None and end.n_ok:
            drift.append(Drift(p.workload, p.concurrency,
                               drift_ratio(p.values, end.values, promote, p.workload,
                                           p.concurrency), p.n_ok, end.n_ok))
        elif end is not None:
            notes.append(f"every closing baseline run at {p.workload} c={p.concurrency} failed: "
                         "drift unchecked there")
    if not close_pts:
        notes.append("the baseline was not measured again at the end of the sweep: drift "
                     "unchecked")
    return base, drift, notes


def _decide_class(traffic_class: str, bands: Sequence[Band], band_notes: Sequence[str],
                  base_pts: Sequence[PointStats], close_pts: Sequence[PointStats],
                  cand: Mapping[str, list[PointStats]], refused: Collection[str],
                  promote: PromoteSpec) -> ClassResult:
    """Drift, quality references, every band's decision and the deployment of one class."""
    base, drift, drift_notes = _pooled_baseline(base_pts, close_pts, promote)
    refs, missing = _references([*base_pts, *close_pts])
    inputs = _BandInputs(
        traffic_class=traffic_class, workloads=tuple(sorted({p.workload for p in base_pts})),
        candidates=cand, baseline_points=tuple(base_pts), baseline=base, refs=refs,
        missing_refs=missing, refused=refused, drift=tuple(drift), promote=promote)
    decisions = tuple(_decide_band(inputs, band) for band in bands)
    explicit = bool(promote.concurrency_bands)
    deployment, dep_notes = _deployment(traffic_class, decisions, base_pts[0],
                                        bands[-1].hi if explicit else None, promote.tie_tolerance)
    return ClassResult(traffic_class, tuple(bands), decisions, deployment, tuple(drift),
                       tuple([*band_notes, *drift_notes, *dep_notes]))


# --------------------------------------------------------------------------------------------
# Tables


def decision_rows(result: ClassResult) -> list[dict[str, Any]]:
    """The decision table: one row per band x candidate, plus the "off" row of every band."""
    rows = []
    for d in result.decisions:
        for v in d.candidates:
            s = v.worst.speedup if v.worst is not None else None
            q = v.quality
            rows.append({
                "traffic_class": d.traffic_class, "band": d.band.label, "engine": v.engine,
                "engine_hash": v.engine_hash, "method": v.method, "N": v.num_speculative_tokens,
                "verdict": v.status,
                "speedup": s.value if s else None, "lo": s.lo if s else None,
                "hi": s.hi if s else None,
                "worst_point": f"{v.worst.workload} c={v.worst.concurrency}" if v.worst else None,
                "quality": f"{q.unexcused}/{q.requests} (+{q.excused} excused)" if q else None,
                "acceptance_rate": v.acceptance_rate,
                "why": "; ".join(str(r) for r in v.rejected) or v.note,
            })
        rows.append({
            "traffic_class": d.traffic_class, "band": d.band.label, "engine": "off (baseline)",
            "engine_hash": result.deployment.baseline_hash, "method": BASELINE_METHOD, "N": 0,
            "verdict": "winner" if d.winner is None else "eligible",
            "speedup": 1.0, "lo": 1.0, "hi": 1.0, "worst_point": None, "quality": None,
            "acceptance_rate": None,
            "why": "; ".join(d.reasons) if d.winner is None else "a candidate passed every gate",
        })
    return rows
