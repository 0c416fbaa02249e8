"""Deciding: per traffic class and concurrency band, does speculation pay, and with what.

Pure (numpy and scipy only): frozen `Measurement`s in, frozen decisions out, every rejection with
its reason. The chain is aggregate -> compare with the baseline -> gate -> pick -> schedule.

Statistics, and why:
- A *point* is one engine config x workload x concurrency. Its OK windows are summarised by the
  median and MAD (what a human reads) and by the geometric mean with a bootstrap CI (display).
- Speedup is candidate / baseline at the same workload and concurrency, on log throughput (noise
  is multiplicative). The replicate unit is the engine start and the baseline is time-local:
  `racing.contrast` compares each candidate start with the baseline interpolated in run order
  between the baseline starts around it, with a t interval whose variance counts starts (see
  `racing`). Without replicated starts (one start per config) the interval is Welch's over the
  configs' windows, and the class notes say the interval cannot include start-to-start noise.
- Consecutive baseline starts that differ beyond noise are flagged (`Drift`); racing re-measures
  what ran between them.
- A band's speedup is its *worst* point (every workload of the class, every level in the band);
  its test's p-value is the largest of its points' (intersection-union).
- Errors per deployment: a grid is Holm-corrected over every class x band x candidate
  (`family="holm"`); a race judges each band's selected winner on its confirmation starts only
  (`race=`), the race itself having corrected over the bands it confirmed.

Decision rule: a candidate is eligible in a band when it was not refused by headroom, ran without
failing at every point, keeps temperature-0 outputs equal to the baseline's (at every concurrency
level, the share of its (run, request) pairs whose output differs from the baseline's majority
output may exceed the baseline's own share there by at most `quality.max_mismatch_fraction`, at
the lower confidence bound of Newcombe's interval for the difference, so more repeats alone
never make rejection likelier), meets every latency SLO at its worst repeat, and its speedup
lower bound is >= 1 + margin at every point; among eligible candidates the highest lower bound
wins, where bounds within `tie_tolerance` are ties that go to the smaller N, then the cheaper
method (`METHODS[m].cost_rank`). With no eligible candidate, "off" wins.

Calibration: tests/core/test_analysis.py (hand-built grids, 1,000 seeded trials: an A/A pair is
promoted < 1% of the time at CV up to 10%; a true 10% gain >= 95% at CV 1.5% with 5 + 5 windows)
and tests/core/test_racing.py (simulated racing and grid sweeps); bench/decision_quality.py
measures false promotion, power and cost per deployment. A rejection that is only inconclusive
says how many engine starts would settle it at the observed noise.
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

from specflow.core import racing
from specflow.core.methods import METHODS
from specflow.core.records import Measurement
from specflow.core.schema import PromoteSpec

BASELINE_METHOD = "none"
"""`Measurement.method` of the no-speculation baseline."""

Gate = Literal["headroom", "failed", "quality", "slo", "speedup", "family", "race"]
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
    """Candidate vs the time-local baseline at one workload and concurrency."""

    workload: str
    concurrency: int
    speedup: Estimate
    n_candidate: int
    """Candidate windows used."""
    n_baseline: int
    """Baseline windows the time-local baseline was interpolated from."""
    cv: float
    """Within-start coefficient of variation (sd of log throughput between windows)."""
    p_value: float = 1.0
    """One-sided p-value of "speedup <= 1 + margin" (before any family correction)."""
    starts: int = 1
    """Candidate engine starts used."""
    baseline_starts: int = 1
    replicated: bool = True
    """False when no config had two engine starts: the CI treats windows as independent."""


@dataclass(frozen=True)
class Drift:
    """Two consecutive baseline engine starts at one workload and concurrency."""

    workload: str
    concurrency: int
    seq_from: int
    seq_to: int
    ratio: float
    """Later / earlier baseline (geometric means)."""
    z: float
    flagged: bool
    """The step is beyond noise (two-sided t at 99% on two start means)."""


@dataclass(frozen=True)
class QualityLevel:
    """Output mismatches at one concurrency level, counted over (run, request) pairs against the
    baseline's reference (the class's workloads pooled): the candidate's and the baseline's own."""

    concurrency: int
    candidate_pairs: int
    candidate_mismatches: int
    baseline_pairs: int
    baseline_mismatches: int
    diff_lo: float
    """Lower confidence bound of candidate rate - baseline rate (Newcombe); without calibration,
    the candidate rate's Wilson lower bound (the baseline taken as exact)."""
    passed: bool
    """`diff_lo` does not exceed the tolerance."""

    @property
    def candidate_rate(self) -> float:
        return self.candidate_mismatches / self.candidate_pairs if self.candidate_pairs else 0.0

    @property
    def baseline_rate(self) -> float:
        return self.baseline_mismatches / self.baseline_pairs if self.baseline_pairs else 0.0


@dataclass(frozen=True)
class QualityCheck:
    """Temperature-0 outputs of a candidate against the baseline's: per concurrency level, is the
    candidate's mismatch rate above the baseline's own by more than the tolerance?"""

    requests: int
    """Distinct requests compared (over the class's workloads)."""
    tolerance: float
    """`quality.max_mismatch_fraction`."""
    passed: bool
    levels: tuple[QualityLevel, ...] = ()
    """One rate test per concurrency level of the band; the gate needs every one passed."""
    calibrated: bool = True
    """`quality.calibrate_with_baseline_repeat`: False tests against a baseline rate of 0."""
    examples: tuple[str, ...] = ()
    """Some requests where a candidate run differs from the reference, as `workload#request`."""
    problem: str | None = None
    """Why the gate could not be evaluated (it then fails)."""

    @property
    def fraction(self) -> float:
        """The worst level's candidate mismatch rate."""
        return max((lv.candidate_rate for lv in self.levels), default=0.0)

    @property
    def summary(self) -> str:
        """One line: mismatched / compared pairs per level, the candidate's vs the baseline's."""
        if not self.levels:
            return self.problem or "nothing compared"
        return "; ".join(
            f"c={lv.concurrency}: {lv.candidate_mismatches}/{lv.candidate_pairs} "
            + (f"vs baseline {lv.baseline_mismatches}/{lv.baseline_pairs}" if self.calibrated
               else "(uncalibrated)")
            for lv in self.levels)


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
    unresolved: str = ""
    """Why the band is undecided (racing ran out of budget or looks); never promoted."""

    @property
    def outcome(self) -> Literal["speculate", "off", "unresolved"]:
        if self.winner is not None:
            return "speculate"
        return "unresolved" if self.unresolved else "off"


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
        for prop in ("label", "outcome", "score", "fraction", "flagged", "n_ok", "n_failed",
                     "candidate_rate", "baseline_rate", "summary"):
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


def _exclusion(m: Measurement) -> str | None:
    """Why a window is unusable, or None."""
    if not m.ok:
        return m.failure or "failed"
    if m.failed:
        return "failed_requests"
    if not (math.isfinite(m.output_throughput) and m.output_throughput > 0):
        return "no_throughput"
    return None


def usable_blocks(measurements: Iterable[Measurement]
                  ) -> dict[tuple[str, int], list[racing.Block]]:
    """The usable windows (see `_exclusion`) as engine-start blocks per (workload, concurrency):
    what every speedup, noise estimate and drift check reads."""
    return racing.blocks_by_point(
        (m.key.engine_hash, m.key.workload, m.key.concurrency, m.key.block, m.key.repeat, m.seq,
         m.stage, m.output_throughput) for m in measurements if _exclusion(m) is None)


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
    """The baseline's outputs for one workload: the reference (majority) digest per request, and
    per concurrency level how often the baseline's own runs differ from it (batching changes the
    numerics per level, so its self-disagreement is measured where the candidate is)."""

    prompt_hash: str
    digests: tuple[str, ...]
    baseline: Mapping[int, tuple[int, int]]
    """Per concurrency level: (run, request) pairs of the baseline, and how many differ."""


def _mismatches(digests: Sequence[str], reference: Sequence[str]) -> list[int]:
    """Indices of the requests whose output digest differs from the reference's."""
    return [i for i, (x, y) in enumerate(zip(digests, reference, strict=True)) if x != y]


def _majority(runs: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """Per request, the digest most runs produced (ties: the smallest digest, so that the
    reference does not depend on record order)."""
    return tuple(min(Counter(seen).most_common(), key=lambda kv: (-kv[1], kv[0]))[0]
                 for seen in zip(*runs, strict=True))


def _references(baseline: Sequence[PointStats]) -> tuple[dict[str, _Reference], dict[str, str]]:
    """Per workload, the baseline's reference outputs over all its runs and levels, with its own
    mismatch counts per level (or why there is no reference)."""
    runs: dict[str, list[tuple[int, str, tuple[str, ...]]]] = defaultdict(list)
    for p in baseline:
        for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
            if d:
                runs[p.workload].append((p.concurrency, ph, d))
    refs, missing = {}, {}
    for workload in sorted({p.workload for p in baseline}):
        rs = runs[workload]
        if not rs:
            missing[workload] = f"the baseline recorded no output digests for {workload}"
            continue
        if len({(ph, len(d)) for _, ph, d in rs}) > 1:
            missing[workload] = (f"the baseline's runs of {workload} used different prompts "
                                 "(prompt_hash or count differs); re-measure it")
            continue
        reference = _majority([d for _, _, d in rs])
        counts: dict[int, tuple[int, int]] = {}
        for c, _, d in rs:
            pairs, bad = counts.get(c, (0, 0))
            counts[c] = (pairs + len(d), bad + len(_mismatches(d, reference)))
        refs[workload] = _Reference(rs[0][1], reference, counts)
    return refs, missing


def wilson_interval(successes: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval of the binomial proportion p = successes / n at normal quantile z
    (E. B. Wilson, JASA 22:209-212, 1927): centre (p + z^2/2n) / (1 + z^2/n), half-width
    z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2). Unlike the Wald interval it keeps its coverage
    at 0 or n successes, the usual counts of output mismatches. With n = 0 nothing is known:
    (0, 1)."""
    if n == 0:
        return 0.0, 1.0
    p, k = successes / n, z * z / n
    centre = (p + k / 2) / (1 + k)
    half = z / (1 + k) * math.sqrt(p * (1 - p) / n + k / (4 * n))
    # At 0 or n the bound is exact in theory; pin it so rounding cannot fake a mismatch.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def newcombe_interval(x1: int, n1: int, x2: int, n2: int, z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval of the difference of proportions x1/n1 - x2/n2
    (R. G. Newcombe, Statistics in Medicine 17:873-890, 1998, method 10): with (l_i, u_i) the
    Wilson interval of p_i, d = p1 - p2, it is [d - sqrt((p1 - l1)^2 + (u2 - p2)^2),
    d + sqrt((u1 - p1)^2 + (p2 - l2)^2)]. Near-nominal coverage at small counts and rates near
    0, where the Wald difference interval collapses to a point."""
    p1 = x1 / n1 if n1 else 0.0
    p2 = x2 / n2 if n2 else 0.0
    l1, u1 = wilson_interval(x1, n1, z)
    l2, u2 = wilson_interval(x2, n2, z)
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


def _rate_test(concurrency: int, candidate: tuple[int, int], baseline: tuple[int, int],
               promote: PromoteSpec) -> QualityLevel:
    """One level's test on (pairs, mismatches) counts: the lower confidence bound of the
    candidate's excess mismatch rate over the baseline's own must not exceed the tolerance. A
    bound on a rate, not a count of mismatches, so that more repeats of a candidate sharpen the
    estimate instead of making rejection likelier by themselves."""
    q, z = promote.quality, _z(promote.confidence)
    (n1, x1), (n2, x2) = candidate, baseline
    lo = (newcombe_interval(x1, n1, x2, n2, z)[0] if q.calibrate_with_baseline_repeat
          else wilson_interval(x1, n1, z)[0])
    return QualityLevel(concurrency, n1, x1, n2, x2, lo, lo <= q.max_mismatch_fraction)


def _add(counts: dict[int, tuple[int, int]], level: int, pairs: int, bad: int) -> None:
    """Add (pairs, mismatches) to a level's counts."""
    n, x = counts.get(level, (0, 0))
    counts[level] = (n + pairs, x + bad)


def _compare_runs(points: Sequence[PointStats], ref: _Reference
                  ) -> tuple[dict[int, tuple[int, int]], set[int], list[str]]:
    """A candidate's runs of one workload against the reference: (pairs, mismatches) per level,
    the requests some run got wrong, and the runs that cannot be compared."""
    counts: dict[int, tuple[int, int]] = {}
    bad: set[int] = set()
    problems: list[str] = []
    for p in points:
        for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
            if not d:
                problems.append(f"{p.label} recorded no output digests")
            elif len(d) != len(ref.digests) or (ph and ref.prompt_hash
                                                and ph != ref.prompt_hash):
                problems.append(f"{p.label} was sent different prompts than the baseline")
            else:
                idx = _mismatches(d, ref.digests)
                _add(counts, p.concurrency, len(d), len(idx))
                bad.update(idx)
    return counts, bad, problems


def quality_check(candidate: Sequence[PointStats], refs: Mapping[str, _Reference],
                  missing: Mapping[str, str], promote: PromoteSpec) -> QualityCheck:
    """Test a candidate's output mismatch rate in one band against the baseline's, at every
    concurrency level of the band (the class's workloads pooled per level)."""
    calibrated = promote.quality.calibrate_with_baseline_repeat
    cand: dict[int, tuple[int, int]] = {}
    base: dict[int, tuple[int, int]] = {}
    bad: set[tuple[str, int]] = set()
    problems: list[str] = []
    requests = 0
    for workload in sorted({p.workload for p in candidate}):
        if workload in missing:
            problems.append(missing[workload])
            continue
        ref = refs[workload]
        mine = [p for p in candidate if p.workload == workload]
        for c in sorted({p.concurrency for p in mine}):
            _add(base, c, *ref.baseline.get(c, (0, 0)))
            if calibrated and c not in ref.baseline:
                problems.append(f"the baseline recorded no output digests for {workload} at "
                                f"c={c}: its own mismatch rate there is unknown")
        counts, wrong, run_problems = _compare_runs(mine, ref)
        for c, (n, x) in counts.items():
            _add(cand, c, n, x)
        bad.update((workload, i) for i in wrong)
        problems += run_problems
        requests += len(ref.digests)
    levels = tuple(_rate_test(c, cand.get(c, (0, 0)), base[c], promote) for c in sorted(base))
    problem = "; ".join(dict.fromkeys(problems)) or None
    passed = problem is None and requests > 0 and all(lv.passed for lv in levels)
    return QualityCheck(requests, promote.quality.max_mismatch_fraction, passed, levels,
                        calibrated, tuple(f"{w}#{i}" for w, i in sorted(bad)[:8]), problem)


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
    """The baseline points of the class (every baseline start pooled)."""
    baseline_hash: str
    blocks: Mapping[tuple[str, int], list[racing.Block]]
    """Every engine start's usable windows at (workload, concurrency)."""
    noise: Mapping[tuple[str, int], racing.Noise]
    refs: Mapping[str, _Reference]
    missing_refs: Mapping[str, str]
    """Workloads without a usable baseline reference, with why."""
    refused: Collection[str]
    """Engine hashes the headroom check refused."""
    drift: tuple[Drift, ...]
    promote: PromoteSpec
    stage: racing.Stage | None = None
    """Which engine starts the speedups use (None: all of them)."""


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
    detail = quality.problem or _quality_detail(quality, inputs.promote.confidence)
    return quality, [Reason("quality", detail)]


def _quality_detail(q: QualityCheck, confidence: float) -> str:
    """Each failing level with both rates, the bound that failed and the tolerance."""
    parts = []
    for lv in (lv for lv in q.levels if not lv.passed):
        base = (f"the baseline's own {lv.baseline_mismatches} of {lv.baseline_pairs} "
                f"({lv.baseline_rate:.1%})" if q.calibrated
                else "a baseline taken as exact (calibration off)")
        parts.append(f"at c={lv.concurrency} {lv.candidate_mismatches} of {lv.candidate_pairs} "
                     f"(run, request) pairs differ from the baseline's reference "
                     f"({lv.candidate_rate:.1%}) vs {base}: the {confidence:.0%} lower bound of "
                     f"the excess, {lv.diff_lo:.1%}, exceeds the tolerance {q.tolerance:.1%}")
    detail = "; ".join(parts) or "no requests were compared"
    return detail + (f"; e.g. {', '.join(q.examples)}" if q.examples else "")


def _speedups(ok: Sequence[PointStats], inputs: _BandInputs) -> list[PointSpeedup]:
    """Candidate vs the time-local baseline at each usable point (engine starts as replicates)."""
    out = []
    promote = inputs.promote
    for p in ok:
        key = (p.workload, p.concurrency)
        blocks = racing.filter_stage(inputs.blocks.get(key, []), inputs.stage)
        c = racing.contrast([b for b in blocks if b.engine_hash == p.engine_hash],
                            [b for b in blocks if b.engine_hash == inputs.baseline_hash],
                            inputs.noise[key])
        if c is None:
            continue
        lo, hi = c.interval(promote.confidence)
        out.append(PointSpeedup(
            p.workload, p.concurrency, Estimate(c.speedup, lo, hi, promote.confidence),
            c.n_windows, c.n_baseline_windows, c.cv, c.p_above(1 + promote.margin),
            c.n_blocks, c.n_baseline_blocks, c.replicated))
    return out


def _speedup_reason(s: PointSpeedup, promote: PromoteSpec) -> Reason | None:
    """Why a point's speedup lower bound misses 1 + margin, and what would settle it."""
    threshold = 1 + promote.margin
    e = s.speedup
    if e.lo >= threshold:
        return None
    detail = (f"lower bound {e.lo:.3f} < {threshold:.3f} at {s.workload} c={s.concurrency} "
              f"(speedup {e.value:.3f}, {e.confidence:.0%} CI [{e.lo:.3f}, {e.hi:.3f}], "
              f"{s.starts}/{s.baseline_starts} engine starts, {s.n_candidate}/{s.n_baseline} "
              "windows)")
    need = starts_needed(s, threshold, promote.confidence)
    if e.hi < 1:
        detail += "; slower than the baseline"
    elif need is None:
        detail += f"; the gain is below the {promote.margin:.0%} margin"
    else:
        detail += (f"; inconclusive: about {need} engine starts per side would settle it at the "
                   f"observed noise")
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
    if ok and len(speedups) < len(ok):
        reasons.append(Reason("speedup", f"not measured on {inputs.stage or 'any'} engine starts "
                                         "at every point of the band"))
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
        in_band = [p for p in pts if p.concurrency in band
                   and any(b.concurrency == p.concurrency and b.workload == p.workload
                           for b in inputs.baseline_points)]
        if in_band:
            verdicts.append(_verdict(inputs, in_band))
    return verdicts


def _band_notes(inputs: _BandInputs, band: Band) -> list[str]:
    """Baseline drift in the band, and SLOs the baseline itself breaks there."""
    notes = [f"the baseline moved {d.ratio - 1:+.1%} between engine starts #{d.seq_from} and "
             f"#{d.seq_to} at {d.workload} c={d.concurrency} (beyond noise, z={d.z:.1f}); "
             "candidates are compared with the baseline interpolated in time, and racing "
             "re-measures what ran between them"
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
        f"quality: mismatched (run, request) pairs {q.summary}; the {promote.confidence:.0%} "
        f"lower bound of the excess over the baseline's rate is within the tolerance "
        f"{q.tolerance:.1%} at every level"
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


def _decide_band(inputs: _BandInputs, band: Band, verdicts: Sequence[Verdict],
                 unresolved: str = "") -> Decision:
    """The winner of one band (or "off"/"unresolved"), every candidate ranked, with reasons."""
    levels = tuple(sorted({p.concurrency for p in inputs.baseline_points if p.concurrency in band}))
    eligible = [v for v in verdicts if v.eligible]
    rejected = sorted((v for v in verdicts if not v.eligible), key=_tie_key)
    winner: Verdict | None = None
    if eligible and not unresolved:
        winner, others = pick(eligible, inputs.promote.tie_tolerance)
        reasons = _winner_reasons(winner, inputs.promote)
        candidates = (winner, *sorted(others, key=lambda v: -(v.score or 0.0)), *rejected)
    else:
        reasons = (f"unresolved: {unresolved}",) if unresolved else _off_reasons(verdicts)
        candidates = (*sorted(eligible, key=_tie_key), *rejected)
    return Decision(traffic_class=inputs.traffic_class, band=band, levels=levels,
                    workloads=inputs.workloads, winner=winner, candidates=candidates,
                    reasons=reasons, notes=tuple(_band_notes(inputs, band)),
                    unresolved=unresolved)


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
            refused_by_headroom: Collection[str] = frozenset(),
            family: Literal["holm", "none"] = "holm",
            stage: racing.Stage | None = None,
            race: Mapping[tuple[str, str], racing.BandState] | None = None,
            partial: bool = False) -> Analysis:
    """Decide every traffic class and band of a sweep.

    `measurements`: every window of the sweep, the baseline's first start included.
    `closing_baseline`: the baseline's later engine starts (drift, time-local baseline, output
    self-agreement). `refused_by_headroom`: engine hashes the headroom check refused.
    `family="holm"` (a grid sweep) corrects the speedup tests over every class x band x
    candidate; "none" leaves them per comparison (racing's exploration views). `stage` limits the
    speedups to exploration or confirmation starts. `race`: racing's final band states; the
    selected candidate of each band is then judged on its confirmation starts only and the others
    by how the race eliminated them. `partial`: a race in progress, whose candidates may be
    measured only at the points of the bands they contend in (as with `race`).
    Raises AnalysisError, listing every point to (re-)measure, when the data cannot carry a
    decision."""
    opening, closing_ms = _placed(list(measurements), list(closing_baseline))
    points = aggregate(opening, promote, "open")
    closing = aggregate(closing_ms, promote, "close")
    blocks = usable_blocks((*opening, *closing_ms))
    refused = frozenset(refused_by_headroom)
    problems = [f"closing_baseline holds {p.label}, which is not the baseline"
                for p in closing if not p.is_baseline]
    staged = []
    for traffic_class in sorted({p.traffic_class for p in points}):
        pts = [p for p in points if p.traffic_class == traffic_class]
        base_pts, problem = _class_baseline(traffic_class, pts)
        if problem is not None:
            problems.append(problem)
            continue
        cand = _candidates(pts)
        problems += _coverage_problems(base_pts, cand, refused, promote,
                                       race is not None or partial)
        bands, band_problems, band_notes = bands_for(promote, [p.concurrency for p in base_pts])
        problems += band_problems
        if problems:
            continue  # keep checking the other classes, but decide nothing
        close_pts = [p for p in closing if p.engine_hash == base_pts[0].engine_hash
                     and p.traffic_class == traffic_class]
        staged.append(_class_verdicts(traffic_class, bands, band_notes, base_pts, close_pts,
                                      cand, refused, promote, blocks, stage, race))
    if problems:
        raise AnalysisError(problems)
    if family == "holm" and race is None:
        staged = _family_corrected(staged, promote)
    results = [_decide_class(s, race) for s in staged]
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
                       refused: Collection[str], promote: PromoteSpec, raced: bool = False
                       ) -> list[str]:
    """Points with too few repeats, and points one side measured but the other did not (a race
    measures a candidate only where it still contends, so there only the baseline must cover)."""
    problems = [_too_few(p, promote, "the baseline") for p in base_pts
                if p.n_ok < promote.min_repeats]
    grid = sorted({(p.workload, p.concurrency) for p in base_pts})
    for engine_hash, cps in sorted(cand.items()):
        if engine_hash in refused:
            continue
        have = {(p.workload, p.concurrency): p for p in cps}
        for w, c in grid:
            point = have.get((w, c))
            if point is None and raced:
                continue
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


def _decide_class(staged: _ClassVerdicts,
                  race: Mapping[tuple[str, str], racing.BandState] | None) -> ClassResult:
    """Every band's decision and the deployment of one class."""
    inputs, promote = staged.inputs, staged.inputs.promote
    decisions = []
    for band, verdicts in zip(staged.bands, staged.verdicts, strict=True):
        state = race.get((inputs.traffic_class, band.label)) if race is not None else None
        unresolved = state.why if state is not None and state.status == "unresolved" else ""
        decisions.append(_decide_band(inputs, band, verdicts, unresolved))
    explicit = bool(promote.concurrency_bands)
    deployment, dep_notes = _deployment(inputs.traffic_class, decisions,
                                        inputs.baseline_points[0],
                                        staged.bands[-1].hi if explicit else None,
                                        promote.tie_tolerance)
    return ClassResult(inputs.traffic_class, staged.bands, tuple(decisions), deployment,
                       inputs.drift, tuple([*staged.notes, *dep_notes]))


def starts_needed(s: PointSpeedup, threshold: float, confidence: float, power: float = 0.8
                  ) -> int | None:
    """Engine starts per side that would put the lower bound above `threshold` with `power`,
    if the observed speedup and noise hold (None when the speedup is below the threshold)."""
    e = s.speedup
    gap = math.log(e.value) - math.log(threshold)
    if gap <= 0:
        return None
    if e.hi == e.lo:
        return max(2, s.starts)
    se = (math.log(e.hi) - math.log(e.lo)) / (2 * _z(confidence))
    need = s.starts * (se * (_z(confidence) + _z(2 * power - 1)) / gap) ** 2
    return max(2, math.ceil(need))


def band_p_value(v: Verdict) -> float:
    """A band's speedup test: every point must clear 1 + margin (intersection-union), so its
    p-value is the largest of its points'."""
    return max((s.p_value for s in v.speedups), default=1.0)


def _placed(opening: list[Measurement], closing: list[Measurement]
            ) -> tuple[list[Measurement], list[Measurement]]:
    """Windows with a run-order position. Records without one (`seq` -1) are placed as a grid
    sweep runs them: the baseline first, candidates in hash order, the closing baseline last
    (as the baseline's next engine start)."""
    hashes = sorted({m.key.engine_hash for m in opening if m.method != BASELINE_METHOD})
    order = {h: i + 1 for i, h in enumerate(hashes)}
    last = len(hashes) + 1
    first_block = {m.key.engine_hash: m.key.block for m in opening}

    def place(m: Measurement, is_closing: bool) -> Measurement:
        if m.seq >= 0:
            return m
        if is_closing:
            block = max(m.key.block, first_block.get(m.key.engine_hash, 0) + 1)
            return dataclasses.replace(m, seq=last, key=dataclasses.replace(m.key, block=block))
        return dataclasses.replace(m, seq=order.get(m.key.engine_hash, 0))

    return [place(m, False) for m in opening], [place(m, True) for m in closing]


@dataclass(frozen=True)
class _ClassVerdicts:
    """One class's verdicts per band, before the family correction and the pick."""

    inputs: _BandInputs
    bands: tuple[Band, ...]
    verdicts: tuple[tuple[Verdict, ...], ...]
    """Per band."""
    notes: tuple[str, ...]


def _class_verdicts(traffic_class: str, bands: Sequence[Band], band_notes: Sequence[str],
                    base_pts: Sequence[PointStats], close_pts: Sequence[PointStats],
                    cand: Mapping[str, list[PointStats]], refused: Collection[str],
                    promote: PromoteSpec, blocks: Mapping[tuple[str, int], list[racing.Block]],
                    stage: racing.Stage | None,
                    race: Mapping[tuple[str, str], racing.BandState] | None) -> _ClassVerdicts:
    """Noise, drift and quality references of one class, and every candidate's verdicts."""
    baseline_hash = base_pts[0].engine_hash
    workloads = tuple(sorted({p.workload for p in base_pts}))
    mine = {k: v for k, v in blocks.items() if k[0] in workloads}
    noise = {k: racing.block_noise(v, baseline_hash) for k, v in mine.items()}
    drift = [Drift(w, c, d.seq_from, d.seq_to, d.ratio, d.z, d.flagged)
             for (w, c), bs in sorted(mine.items())
             for d in racing.drift_steps([b for b in bs if b.engine_hash == baseline_hash],
                                         noise[(w, c)])]
    notes = list(band_notes)
    if not any(b.engine_hash == baseline_hash and b.block > 0 for bs in mine.values()
               for b in bs):
        notes.append("the baseline was measured on one engine start only: drift unchecked")
    if not all(n.replicated for n in noise.values()):
        notes.append("no engine config was started twice at some points: their intervals treat "
                     "windows as independent (measure the baseline again to fix this)")
    refs, missing = _references([*base_pts, *close_pts])
    inputs = _BandInputs(
        traffic_class=traffic_class, workloads=workloads, candidates=cand,
        baseline_points=tuple(base_pts), baseline_hash=baseline_hash, blocks=mine, noise=noise,
        refs=refs, missing_refs=missing, refused=refused, drift=tuple(drift), promote=promote,
        stage=stage)
    verdicts = []
    for band in bands:
        state = race.get((traffic_class, band.label)) if race is not None else None
        verdicts.append(tuple(_raced(inputs, band, state) if race is not None
                              else _band_verdicts(inputs, band)))
    return _ClassVerdicts(inputs, tuple(bands), tuple(verdicts), tuple(notes))


def _raced(inputs: _BandInputs, band: Band, state: racing.BandState | None) -> list[Verdict]:
    """A racing sweep's verdicts in one band: the selected candidate judged on its confirmation
    starts only, every other candidate on all its data with how the race dropped it."""
    selected = state.contenders[0] if state is not None and state.status in (
        "confirmed", "confirming", "unresolved") and len(state.contenders) == 1 else None
    confirm_inputs = dataclasses.replace(inputs, stage="confirm")
    why = dict(state.dropped) if state is not None else {}
    out = []
    for v in _band_verdicts(inputs, band):
        if v.engine_hash == selected and state is not None:
            pts = [p for p in inputs.candidates[v.engine_hash] if p.concurrency in band]
            cv = _verdict(confirm_inputs, pts)
            if state.status != "confirmed" and cv.eligible:
                cv = dataclasses.replace(cv, rejected=(Reason("race", state.why),))
            out.append(cv)
        elif v.eligible or v.engine_hash in why:
            reason = why.get(v.engine_hash) or "not selected by the race"
            out.append(dataclasses.replace(v, rejected=(*v.rejected, Reason("race", reason))))
        else:
            out.append(v)
    return out


def _family_corrected(staged: Sequence[_ClassVerdicts], promote: PromoteSpec
                      ) -> list[_ClassVerdicts]:
    """Holm over the deployment's whole family: every class x band x measured candidate.
    A candidate whose band clears 1 + margin per comparison but not after the correction is
    rejected by the "family" gate."""
    alpha = (1 - promote.confidence) / 2
    family = [(i, j, k) for i, s in enumerate(staged) for j, vs in enumerate(s.verdicts)
              for k, v in enumerate(vs) if v.speedups]
    pvals = [band_p_value(staged[i].verdicts[j][k]) for i, j, k in family]
    rejected = racing.holm(pvals, alpha)
    out = [[list(vs) for vs in s.verdicts] for s in staged]
    for (i, j, k), p, ok in zip(family, pvals, rejected, strict=True):
        v = out[i][j][k]
        if not ok and v.eligible:
            out[i][j][k] = dataclasses.replace(v, rejected=(Reason(
                "family", f"p = {p:.2g} for speedup <= {1 + promote.margin:.3f} does not pass "
                f"Holm's correction over the deployment's {len(family)} comparisons "
                f"(alpha {alpha:.3g})"),))
    return [dataclasses.replace(s, verdicts=tuple(tuple(vs) for vs in o))
            for s, o in zip(staged, out, strict=True)]


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
                "quality": q.summary if q else None,
                "acceptance_rate": v.acceptance_rate,
                "why": "; ".join(str(r) for r in v.rejected) or v.note,
            })
        rows.append({
            "traffic_class": d.traffic_class, "band": d.band.label, "engine": "off (baseline)",
            "engine_hash": result.deployment.baseline_hash, "method": BASELINE_METHOD, "N": 0,
            "verdict": ("unresolved" if d.outcome == "unresolved" else "winner")
            if d.winner is None else "eligible",
            "speedup": 1.0, "lo": 1.0, "hi": 1.0, "worst_point": None, "quality": None,
            "acceptance_rate": None,
            "why": "; ".join(d.reasons) if d.winner is None else "a candidate passed every gate",
        })
    return rows
