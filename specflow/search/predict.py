"""Predict a chain drafter's speedup at every N from one measured engine at its largest N.

vLLM's per-position acceptance counters are unconditional rates: the mean acceptance length at
N is ``MAL(N) = 1 + sum_{i<N} a_i``. A chain drafter (n-gram lookup, a draft model, EAGLE,
native MTP, Gemma 4 MTP) proposes at N = k the first k tokens of what it proposes at a larger
N, so one engine at N_max gives the acceptance side of every k <= N_max.

The cost side is the engine's step time against the draft length. With ``T(c, K)`` the time of
one decoding step at concurrency c with K drafted tokens, the speedup is
``MAL(K) * T(c, 0) / T(c, K)`` (the formulation of vLLM's dynamic speculative decoding, arXiv
2406.14066). Sequential drafting adds K drafter passes and verification grows with the K + 1
tokens scored, so T is taken linear in K between the two points measured: K = 0 (the baseline)
and K = N_max (the probe, whose measured speedup ``s`` fixes ``T(c, N_max) / T(c, 0) =
MAL(N_max) / s``). Then

    speedup(k) = MAL(k) / (1 + (k / N_max) * (MAL(N_max) / s - 1)),

which equals ``s`` at ``k = N_max``. The prediction interval carries the probe's speedup interval,
the sampling error of MAL(k) between windows, and `MODEL_ERROR` for the linear cost fit.

Parallel drafters (DFlash, DSpark), suffix decoding, adaptive verification and per-batch N
schedules break the chain assumption: every engine of theirs is measured.

Pure: no I/O. The racing rounds (`rounds`) use `chains` to measure the probes first,
`predict` to decide what else can still beat the baseline and `ratio_to_probe` to rank the N
values of one series against each other (free of the probe's engine-start effect); a config is
never promoted on a prediction.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

from specflow.decision.model import Analysis
from specflow.records.measurement import Measurement
from specflow.spec.compile import EngineConfig
from specflow.spec.methods import METHODS

MODEL_ERROR = 0.05
"""Relative error allowed for the linear step-cost fit on top of the sampling error
(bench/search_cost.py measures the predictor's actual error)."""

CHAIN_METHODS = frozenset(m for m, info in METHODS.items()
                          if info.drafting == "sequential" or m == "ngram")
"""Methods whose proposal at N = k is the first k tokens of their proposal at a larger N."""


CHAIN_TOLERANCE = 0.01
"""Relative miss in acceptance length a chain may show beyond the sampling error before the
series is taken for not a chain: a chain's prediction is exact up to sampling, so this only
absorbs counter rounding; a drafter that is nearly a chain is measured per N, which costs engine
starts, never a wrong prediction."""


@dataclass(frozen=True)
class Chain:
    """A candidate predicted from its series' probe (the same drafter at its largest N)."""

    probe: str
    """Engine hash of the probe."""
    n: int
    probe_n: int
    check: bool = False
    """The series' smallest N in a series of three or more: measured beside the probe in the
    first round, at the highest concurrency level (`Shape.check_points`), its acceptance length
    checks the chain assumption (`check_chain`) before anything of the series is pruned on a
    prediction; a miss there makes every N of the series measured, in every band."""


@dataclass(frozen=True)
class Acceptance:
    """Per-position acceptance of one engine at one point, pooled over its windows."""

    rates: tuple[float, ...]
    """Unconditional rate of each position (accepted at i / drafts), draft-weighted."""
    windows: tuple[tuple[float, ...], ...]
    """Each window's own rates (for the sampling error)."""

    def mal(self, k: int) -> float:
        """Mean acceptance length at N = k: 1 + the first k rates."""
        return 1.0 + sum(self.rates[:k])

    def mal_se(self, k: int) -> float:
        """Standard error of MAL(k) between windows (0 with one window)."""
        per = [1.0 + sum(w[:k]) for w in self.windows if len(w) >= k]
        return float(stats.sem(per)) if len(per) >= 2 else 0.0


@dataclass(frozen=True)
class Prediction:
    """Predicted speedup over the baseline at one point, with its interval."""

    value: float
    lo: float
    hi: float
    mal: float
    """Predicted mean acceptance length."""
    kv_capacity: int | None = None
    """Set when the candidate's KV cache holds fewer requests than the point's concurrency
    (`kv_capped`): the requests it holds at once."""


def kv_capped(pred: Prediction, concurrency: int, capacity: int | None) -> Prediction:
    """The prediction at a concurrency level above what the candidate's KV cache holds at the
    workloads' context length (headroom's maximum concurrency, which the drafter's weights, KV
    and lookahead slots lower): the requests beyond `capacity` queue, so the engine runs at most
    `capacity` at once. Decoding throughput grows at most linearly with the requests in flight
    (about linearly while decoding is memory-bound), so the value and the lower bound are scaled
    by capacity / concurrency; the upper bound is kept, so a cap never prunes on its own."""
    if capacity is None or capacity <= 0 or concurrency <= capacity:
        return pred
    f = capacity / concurrency
    return Prediction(pred.value * f, pred.lo * f, pred.hi, pred.mal, capacity)


def chains(configs: Sequence[EngineConfig]) -> dict[str, Chain]:
    """Every candidate that can be predicted, keyed by engine hash, with its probe.

    A series (drafter entry, without adaptive verification or an N schedule) of a chain method
    with more than one N: its largest N is the probe (measured first), the others are predicted
    from it. Everything else is not in the result and is always measured."""
    series: dict[str, list[EngineConfig]] = {}
    for ec in configs:
        sc = ec.speculative_config or {}
        if (ec.method in CHAIN_METHODS and not ec.adaptive
                and sc.get("num_speculative_tokens_per_batch_size") is None):
            series.setdefault(ec.series, []).append(ec)
    out = {}
    for members in series.values():
        probe = max(members, key=lambda e: e.num_speculative_tokens)
        smallest = min(members, key=lambda e: e.num_speculative_tokens)
        for ec in members:
            if ec.num_speculative_tokens < probe.num_speculative_tokens:
                out[ec.hash] = Chain(probe.hash, ec.num_speculative_tokens,
                                     probe.num_speculative_tokens,
                                     check=len(members) >= 3 and ec is smallest)
    return out


def acceptance(windows: Sequence[Measurement]) -> Acceptance | None:
    """Pooled per-position rates of one engine's OK windows at one point (None without any)."""
    rows = [(m.per_position_acceptance, m.num_drafts or 0) for m in windows
            if m.ok and m.per_position_acceptance]
    if not rows:
        return None
    n = min(len(r) for r, _ in rows)
    weight = sum(d for _, d in rows)
    if weight > 0:
        rates = tuple(sum(r[i] * d for r, d in rows) / weight for i in range(n))
    else:
        rates = tuple(sum(r[i] for r, _ in rows) / len(rows) for i in range(n))
    return Acceptance(rates, tuple(tuple(r[:n]) for r, _ in rows))


@dataclass(frozen=True)
class ChainCheck:
    """A second N of a series measured beside the prediction its probe makes for it."""

    n: int
    probe_n: int
    predicted: float
    """MAL(n) from the probe's per-position rates (`Acceptance.mal`)."""
    measured: float
    """MAL measured at N = n."""
    allowed: float
    """The miss a chain may show: z standard errors of the difference (both sides' windows)
    plus CHAIN_TOLERANCE of the prediction."""

    @property
    def holds(self) -> bool:
        return abs(self.measured - self.predicted) <= self.allowed

    def text(self) -> str:
        word = "holds" if self.holds else "missed"
        return (f"chain check at N={self.n} {word}: acceptance length {self.measured:.3f} "
                f"measured, {self.predicted:.3f} +/- {self.allowed:.3f} predicted from "
                f"N={self.probe_n}")


def check_chain(probe: Acceptance, measured: Acceptance, n: int, probe_n: int, z: float = 1.96
                ) -> ChainCheck | None:
    """The chain assumption tested where a second N of the series was measured: the probe's
    first n rates against what N = n accepted (None when either side lacks the positions).

    The chain's acceptance length at n is exact up to sampling (no cost model enters), so a miss
    beyond sampling error and CHAIN_TOLERANCE means this drafter proposes differently at
    different N (a multi-layer MTP whose first position is accepted more at N=1 than at N=8):
    its other N are measured, not predicted."""
    if len(probe.rates) < n or len(measured.rates) < n:
        return None
    predicted, got = probe.mal(n), measured.mal(n)
    se = math.hypot(probe.mal_se(n), measured.mal_se(n))
    return ChainCheck(n, probe_n, predicted, got, z * se + CHAIN_TOLERANCE * predicted)


def chain_curve(mal: Mapping[int, float], se: Mapping[int, float] | None = None,
                z: float = 1.96, atol: float = 0.0) -> str:
    """Why a measured acceptance-length curve (N -> MAL) cannot come from a chain, or "".

    A chain's unconditional rate at position i is the chance that positions 0..i are all
    accepted, so it cannot grow with i: MAL(N) = 1 + sum of the first N rates is non-decreasing
    and concave in N. A fall, or a slope that grows, beyond z standard errors (`se` per N, from
    the windows) and `atol` (the rounding of published figures) breaks the chain: such a series
    is measured per N, never extrapolated."""
    ns = sorted(mal)
    err = se or {}

    def slack(weights: Mapping[int, float]) -> float:  # of a linear combination of MALs
        return z * math.sqrt(sum((w * err.get(k, 0.0)) ** 2 for k, w in weights.items())) + atol

    for a, b in zip(ns, ns[1:], strict=False):
        if mal[b] < mal[a] - slack({a: 1, b: 1}):
            return f"acceptance length falls from {mal[a]:.3f} at N={a} to {mal[b]:.3f} at N={b}"
    for a, b, c in zip(ns, ns[1:], ns[2:], strict=False):
        before, after = (mal[b] - mal[a]) / (b - a), (mal[c] - mal[b]) / (c - b)
        weights = {a: 1 / (b - a), b: 1 / (b - a) + 1 / (c - b), c: 1 / (c - b)}
        if after > before + slack(weights):
            return (f"acceptance length grows faster from N={b} to N={c} ({after:+.3f} a "
                    f"token) than from N={a} to N={b} ({before:+.3f})")
    return ""


def speedup_at(acc: Acceptance, probe_speedup: float, n: int, probe_n: int) -> float:
    """Predicted speedup at N = n from the probe's acceptance and speedup at N = probe_n."""
    if probe_speedup <= 0:
        return 0.0
    cost = 1.0 + (n / probe_n) * (acc.mal(probe_n) / probe_speedup - 1.0)
    return acc.mal(n) / max(cost, 1e-9)


def predict(acc: Acceptance, probe: tuple[float, float, float], n: int, probe_n: int,
            z: float = 1.96) -> Prediction:
    """The prediction at N = n from the probe's acceptance and its speedup (value, lo, hi).

    The interval: the probe's interval carried through the cost model (the prediction grows with
    the probe's speedup), MAL(n)'s sampling error at z standard errors, and MODEL_ERROR."""
    value, lo, hi = probe
    mal = acc.mal(n)
    rel = z * acc.mal_se(n) / mal if mal > 0 else 0.0
    widen_lo = max(0.0, 1.0 - rel) * (1.0 - MODEL_ERROR)
    widen_hi = (1.0 + rel) * (1.0 + MODEL_ERROR)
    return Prediction(speedup_at(acc, value, n, probe_n),
                      speedup_at(acc, lo, n, probe_n) * widen_lo,
                      speedup_at(acc, hi, n, probe_n) * widen_hi, mal)


def ratio_to_probe(acc: Acceptance, probe_speedup: float, n: int, probe_n: int,
                   z: float = 1.96) -> tuple[float, float, float]:
    """The predicted speedup at N = n over the probe's own measured speedup: (value, lower
    bound, upper bound). Both rest on the probe's engine start and the same baseline, so that
    start's effect and the baseline's noise cancel. What is left: MAL(n)'s sampling error (z
    standard errors) and the cost fit's, MODEL_ERROR of the step cost the prediction interpolates
    across (none at N = probe_n, none where drafting costs nothing: the fit is exact at both
    ends). The cost slope comes from the probe's point estimate."""
    if probe_speedup <= 0:
        return 0.0, 0.0, math.inf
    value = speedup_at(acc, probe_speedup, n, probe_n) / probe_speedup
    mal = acc.mal(n)
    rel = z * acc.mal_se(n) / mal if mal > 0 else 0.0
    top = acc.mal(probe_n) / probe_speedup  # T(N_max) / T(0)
    at_n = 1.0 + (n / probe_n) * (top - 1.0)
    fit = MODEL_ERROR * abs(1.0 - at_n / top) if top > 0 else MODEL_ERROR
    return (value, value * max(0.0, 1.0 - rel) * (1.0 - fit),
            value * (1.0 + rel) * (1.0 + fit))


def point_predictions(chain: Chain, probe_windows: Mapping[tuple[str, int], Sequence[Measurement]],
                      probe_speedups: Mapping[tuple[str, int], tuple[float, float, float]],
                      z: float = 1.96, kv_capacity: int | None = None
                      ) -> dict[tuple[str, int], Prediction]:
    """Predictions of one chained candidate at every point where its probe was measured;
    `kv_capacity` (the candidate's maximum concurrency from headroom) caps the points above
    it (`kv_capped`)."""
    out = {}
    for point, speedup in probe_speedups.items():
        acc = acceptance(probe_windows.get(point, ()))
        if acc is not None and len(acc.rates) >= chain.n:
            out[point] = kv_capped(predict(acc, speedup, chain.n, chain.probe_n, z), point[1],
                                   kv_capacity)
    return out


# --------------------------------------------------------------------------------------------
# Predicted against measured (the report, MLflow, bench/search_cost.py)


@dataclass(frozen=True)
class Versus:
    """One measured point of a chained candidate beside what its probe predicted for it."""

    engine: str
    probe: str
    """The probe's engine name."""
    series: str
    n: int
    workload: str
    concurrency: int
    predicted: Prediction
    speedup: float
    """Measured speedup (the analysis' point estimate)."""
    mal: float | None
    """Measured mean acceptance length (draft-weighted over the point's windows)."""
    check: ChainCheck | None = None
    """The chain assumption at this point (`check_chain`)."""

    @property
    def speedup_error(self) -> float:
        """Predicted / measured - 1."""
        return self.predicted.value / self.speedup - 1 if self.speedup > 0 else math.nan

    @property
    def mal_error(self) -> float | None:
        return self.predicted.mal / self.mal - 1 if self.mal else None


def _mal(windows: Sequence[Measurement]) -> float | None:
    acc = acceptance(windows)
    return acc.mal(len(acc.rates)) if acc is not None else None


def versus(speedups: Mapping[str, Mapping[tuple[str, int], tuple[float, float, float]]],
           measurements: Sequence[Measurement], configs: Sequence[EngineConfig],
           z: float = 1.96, kv_capacity: Mapping[str, int] | None = None) -> list[Versus]:
    """Every measured point of every chained candidate whose probe was measured there: the
    prediction from the probe's windows and speedup beside the measurement. `speedups`: engine
    hash -> (workload, concurrency) -> (value, lo, hi) from the analysis; `kv_capacity`: engine
    hash -> maximum concurrency (headroom), as the search predicted with it."""
    by_hash = {ec.hash: ec for ec in configs}
    windows: dict[tuple[str, str, int], list[Measurement]] = {}
    for m in measurements:
        if m.stage != "schedule":
            windows.setdefault((m.key.engine_hash, m.key.workload, m.key.concurrency),
                               []).append(m)
    out = []
    for h, ch in chains(configs).items():
        probe_points = speedups.get(ch.probe, {})
        probe_windows = {p: windows.get((ch.probe, *p), []) for p in probe_points}
        preds = point_predictions(ch, probe_windows, probe_points, z,
                                  (kv_capacity or {}).get(h))
        for (workload, c), measured in sorted(speedups.get(h, {}).items()):
            if (workload, c) in preds:
                ec = by_hash[h]
                own = windows.get((h, workload, c), [])
                probe_acc, acc = acceptance(probe_windows[(workload, c)]), acceptance(own)
                check = (check_chain(probe_acc, acc, ch.n, ch.probe_n, z)
                         if probe_acc is not None and acc is not None else None)
                out.append(Versus(ec.name, by_hash[ch.probe].name, ec.series, ch.n, workload, c,
                                  preds[(workload, c)], measured[0], _mal(own), check))
    return out


@dataclass(frozen=True)
class Curve:
    """A series' acceptance length measured at three or more N at one point, and why it cannot
    come from a chain ("" when it can)."""

    series: str
    workload: str
    concurrency: int
    mal: Mapping[int, float]
    broken: str


def curves(measurements: Sequence[Measurement], configs: Sequence[EngineConfig],
           z: float = 1.96) -> list[Curve]:
    """Every chain series measured at three or more N at a point, tested with `chain_curve`
    (the standard errors from the windows)."""
    by_hash = {ec.hash: ec for ec in configs}
    windows: dict[tuple[str, str, int], dict[int, list[Measurement]]] = {}
    for m in measurements:
        ec = by_hash.get(m.key.engine_hash)
        if ec is None or m.stage == "schedule" or ec.method not in CHAIN_METHODS:
            continue
        windows.setdefault((ec.series, m.key.workload, m.key.concurrency), {}).setdefault(
            ec.num_speculative_tokens, []).append(m)
    out = []
    for (series, w, c), per_n in sorted(windows.items()):
        accs = {n: acc for n, ms in per_n.items() if (acc := acceptance(ms)) is not None
                and len(acc.rates) >= n}
        if len(accs) >= 3:
            mal = {n: a.mal(n) for n, a in sorted(accs.items())}
            se = {n: a.mal_se(n) for n, a in accs.items()}
            out.append(Curve(series, w, c, mal, chain_curve(mal, se, z)))
    return out


Speedups = dict[str, dict[tuple[str, int], tuple[float, float, float]]]
"""Engine hash -> (workload, concurrency) -> speedup (value, lo, hi)."""


def point_speedups(result: Analysis) -> Speedups:
    """Engine hash -> (workload, concurrency) -> measured speedup (value, lo, hi), from every
    candidate's verdict in every band of an analysis."""
    out: Speedups = {}
    for r in result.classes:
        for d in r.decisions:
            for v in d.candidates:
                for s in v.speedups:
                    out.setdefault(v.engine_hash, {})[(s.workload, s.concurrency)] = (
                        s.speedup.value, s.speedup.lo, s.speedup.hi)
    return out


def summary(rows: Sequence[Versus]) -> dict[str, float]:
    """The predictor's error over the measured points (absolute relative errors; MLflow
    metrics of the parent run); empty without any point."""
    if not rows:
        return {}
    sp = sorted(abs(v.speedup_error) for v in rows if not math.isnan(v.speedup_error))
    mal = sorted(abs(e) for v in rows if (e := v.mal_error) is not None)
    out = {"predict_points": float(len(rows)),
           "predict_chain_missed": float(sum(1 for v in rows
                                             if v.check is not None and not v.check.holds))}
    for name, xs in (("speedup", sp), ("mal", mal)):
        if xs:
            out[f"predict_{name}_error_median"] = statistics.median(xs)
            out[f"predict_{name}_error_worst"] = xs[-1]
    return out
