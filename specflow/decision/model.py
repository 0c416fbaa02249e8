"""The decision's records: per-point statistics, speedups, gates' reasons, candidate verdicts,
band decisions, deployments per traffic class, and the analysis that holds them.

`specflow.spec.serialize.as_json` serialises any of them with pydantic: the fields, then the
properties marked `computed_field` (the JSON's derived values); fields marked
`Field(exclude=True)` stay out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, computed_field

BASELINE_METHOD = "none"
"""`Measurement.method` of the no-speculation baseline."""


Gate = Literal["headroom", "failed", "quality", "slo", "speedup", "family", "race"]
"""The gates a candidate can be rejected by, in the order they are checked."""

Outcome = Literal["promote", "off", "unresolved"]
"""A band's outcome (the glossary's words): promote its winner, serve it without speculation,
or unresolved (never promoted; the champion stays)."""

VerdictWord = Literal["wins", "passes", "ruled out", "open"]
"""A candidate's verdict in its band (the glossary's words): wins (chosen), passes (clears every
gate, another candidate was chosen), ruled out (cannot be the band's answer), open (neither shown
to win nor ruled out; more engine starts settle it)."""


class AnalysisError(ValueError):
    """The measurements cannot be decided on; each problem says what to measure."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"cannot decide: {n} problem{'s' if n != 1 else ''}"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


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
    """Each usable repeat's score for the class's objective (`decision.aggregate.score`):
    output throughput (tokens/s), or 1000 / the latency statistic (ms)."""
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
    request_rate: float | None = None
    """Open loop: the requests offered per second (None: closed loop)."""
    digests: Annotated[tuple[tuple[str, ...], ...], Field(exclude=True)] = ()
    """Per usable repeat: per-request output digests (quality gate; not in the JSON)."""
    prompt_hashes: Annotated[tuple[str, ...], Field(exclude=True)] = ()
    """Per usable repeat: the prompt content hash (not in the JSON)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return f"{self.engine} ({self.engine_hash}) at {self.workload} c={self.concurrency}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def n_ok(self) -> int:
        return len(self.values)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def n_failed(self) -> int:
        return sum(self.failures.values())

    @property
    def is_baseline(self) -> bool:
        return self.method == BASELINE_METHOD


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
    rule_out_hi: float = math.inf
    """One-sided upper bound at 1 - `promote.futility` / (the band's points measured): below
    1 + 2 x margin rules it out."""


@dataclass(frozen=True)
class SlowedWindow:
    """A window left out of the speedups: its engine start's other windows at the point show
    outside load slowed it (`specflow.stats.replicates.screen_slowed`). It stays in the ledger
    and in its point's statistics; the start's other windows carry the speedup."""

    engine_hash: str
    engine: str
    workload: str
    concurrency: int
    start: int
    repeat: int
    ratio: float
    """Its throughput over the median of its start's other windows (`together`: of those left
    in)."""
    z: float
    """How many robust SDs below its start's median (`together`: its fastest window)
    (negative)."""
    again: int | None = None
    """The repeat of the window measured again in its place on the same engine start (a racing
    sweep's start measures each slowed window once more); None where it was not."""
    together: bool = False
    """Slowed with most of its start's windows at the point: found by the point's level against
    the start's other points, and judged against the start's fastest window there."""

    def text(self) -> str:
        then = (f"; measured again as repeat {self.again}" if self.again is not None
                else "")
        basis = ("its start's windows left in (slowed with others there; "
                 f"{self.z:.1f} robust SDs below its fastest)" if self.together
                 else f"its start's other windows ({self.z:.1f} robust SDs)")
        return (f"{self.engine} at {self.workload} c={self.concurrency}, start {self.start} "
                f"repeat {self.repeat}: {self.ratio:.2f}x {basis}{then}")


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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def candidate_rate(self) -> float:
        return self.candidate_mismatches / self.candidate_pairs if self.candidate_pairs else 0.0

    @computed_field  # type: ignore[prop-decorator]
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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fraction(self) -> float:
        """The worst level's candidate mismatch rate."""
        return max((lv.candidate_rate for lv in self.levels), default=0.0)

    @computed_field  # type: ignore[prop-decorator]
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
    chosen: Annotated[bool, Field(exclude=True)] = False
    """The band's winner (its `verdict` says so in the JSON)."""
    note: str = ""
    """For eligible non-winners: why another candidate was preferred."""
    per_position_acceptance: tuple[float, ...] = ()
    acceptance_rate: float | None = None
    ruled_out: str = ""
    """Why it cannot be the band's answer (a gate it fails, or a gain of twice the margin
    excluded); empty while it wins or is still open."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> VerdictWord:
        """wins: chosen; passes: clears every gate, another was chosen; ruled out: see
        `ruled_out`; open: neither shown to win nor ruled out (more engine starts settle it)."""
        if self.chosen:
            return "wins"
        if self.eligible:
            return "passes"
        return "ruled out" if self.ruled_out else "open"

    @computed_field  # type: ignore[prop-decorator]
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

    @computed_field  # type: ignore[prop-decorator]
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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> Outcome:
        if self.winner is not None:
            return "promote"
        return "unresolved" if self.unresolved else "off"


@dataclass(frozen=True)
class Deployment:
    """What one traffic class should be served with: one engine, possibly with an N schedule."""

    traffic_class: str
    outcome: Literal["promote", "off"]
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
    objective: str = "throughput"
    """What the class was decided for (`objective_label`): its speedups are gains in it."""
    capacities: tuple[tuple[str, Estimate], ...] = ()
    """A class decided on capacity: each engine's capacity (requests per second, geometric
    mean over its searches with its interval) at its lowest point, by engine hash."""

    def capacity(self, engine_hash: str) -> Estimate | None:
        """An engine's capacity (`capacities`), None where none was found."""
        return dict(self.capacities).get(engine_hash)


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
    slowed: tuple[SlowedWindow, ...] = ()
    """Windows outside load slowed, left out of the speedups (they still count as repeats)."""

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

