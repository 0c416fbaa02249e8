"""Windows -> per-point statistics: usable windows grouped per engine start, medians, MAD and
the geometric mean with its interval."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
from scipy import stats

from specflow.decision.capacity import decided
from specflow.decision.model import Estimate, PointStats, SlowedWindow
from specflow.records.measurement import AGAIN, Measurement, WindowKey
from specflow.spec.schema import CAPACITY_POINT, PromoteSpec
from specflow.stats.critical import t_value, z_value
from specflow.stats.intervals import bootstrap_means, seeded_rng, widened_percentile
from specflow.stats.replicates import StartWindows, screen_slowed, starts_by_point


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
    boot = bootstrap_means(x, promote.bootstrap_samples, seeded_rng(promote.seed, "tput", *key))
    # The bootstrap variance of a mean is (n-1)/n of the usual estimate; t replaces z.
    k = t_value(promote.confidence, n - 1) / z_value(promote.confidence) * math.sqrt(n / (n - 1))
    lo, hi = widened_percentile(theta, boot, promote.confidence, k)
    return Estimate(math.exp(theta), math.exp(lo), math.exp(hi), promote.confidence)


def score(m: Measurement, promote: PromoteSpec | None = None) -> float:
    """What a window scores for its class's objective, higher is better: output tokens per
    second (throughput), or the inverse of `promote.latency_statistic` (latency: a candidate's
    score over the baseline's is then the baseline's latency over its own), or a capacity
    search's capacity in requests per second (`capacity.searches`; a step of one scores
    nothing on its own). nan where the window has no such figure. `promote` None: throughput."""
    objective = "throughput" if promote is None else promote.objective_for(m.traffic_class)
    if objective != m.answers:  # a window answered beside its class's objective
        return math.nan
    if objective == "throughput":
        return m.output_throughput
    if objective == "capacity":
        return m.request_rate if m.search_rates and m.request_rate else math.nan
    assert promote is not None
    ms = m.latency_ms.get(promote.latency_statistic)
    return 1000.0 / ms if ms is not None and math.isfinite(ms) and ms > 0 else math.nan


def objective_label(promote: PromoteSpec, traffic_class: str) -> str:
    """The objective a class is decided for, in words: `throughput`, `latency (mean_tpot_ms)`
    with the statistic estimated, or `capacity (p99_tpot_ms <= 50)` with the SLOs held
    (`capacity (no overload)` without one)."""
    objective = promote.objective_for(traffic_class)
    if objective == "capacity":
        bounds = [f"{k} <= {v:g}" for k, v in promote.capacity_slo.model_dump().items()
                  if v is not None]
        return f"capacity ({', '.join(bounds) or 'no overload'})"
    return objective if objective == "throughput" else \
        f"{objective} ({promote.latency_statistic})"


def label_statistic(label: str) -> str:
    """The statistic an `objective_label` names (`mean_tpot_ms` of `latency (mean_tpot_ms)`,
    the SLOs of a capacity); "" for throughput."""
    return label.partition("(")[2].rstrip(")")


def _exclusion(m: Measurement, promote: PromoteSpec | None = None) -> str | None:
    """Why a window is unusable, or None."""
    if not m.ok:
        return m.failure or "failed"
    if m.failed:
        return "failed_requests"
    if m.overload:
        return "overload"
    value = score(m, promote)
    if not (math.isfinite(value) and value > 0):
        objective = "throughput" if promote is None else promote.objective_for(m.traffic_class)
        return {"throughput": "no_throughput", "latency": "no_latency"}.get(objective,
                                                                           "no_capacity")
    return None


def usable_starts(measurements: Iterable[Measurement], promote: PromoteSpec | None = None
                  ) -> dict[tuple[str, int], list[StartWindows]]:
    """The usable windows (see `_exclusion`) as engine-start blocks per (workload, concurrency),
    without the windows outside load slowed (`screened_starts`): what every speedup, noise
    estimate and drift check reads, each window as its class's objective scores it (`score`;
    `promote` None: throughput)."""
    return screened_starts(measurements, promote)[0]


def screened_starts(measurements: Iterable[Measurement], promote: PromoteSpec | None = None
                    ) -> tuple[dict[tuple[str, int], list[StartWindows]], list[SlowedWindow]]:
    """`usable_starts`, and the windows it left out as slowed by outside load, per point: the
    windows answering their class's objective, a capacity search as one record
    (`capacity.decided`)."""
    ms = [m for m in decided(measurements, promote) if _exclusion(m, promote) is None]
    names = {m.key.engine_hash: m.engine for m in ms}
    blocks = starts_by_point(
        (m.key.engine_hash, m.key.workload, m.key.concurrency, m.key.start, m.key.repeat, m.seq,
         m.stage, score(m, promote)) for m in ms)
    ids = {m.key.id for m in ms}
    kept, found = screen_slowed(blocks)
    slowed = []
    for s in found:
        (w, c) = s.point
        again = WindowKey(s.engine_hash, w, c, s.repeat + AGAIN, s.start)
        slowed.append(SlowedWindow(s.engine_hash, names[s.engine_hash], w, c, s.start,
                                   s.repeat, s.ratio, s.z,
                                   again.repeat if again.id in ids else None, s.together))
    return kept, slowed


def to_measure_again(measurements: Iterable[Measurement], engine_hash: str, start: int,
                     promote: PromoteSpec | None = None) -> list[tuple[str, int, int]]:
    """(workload, concurrency, repeat) of each window of one engine start that outside load
    slowed (`screened_starts` over the sweep's records) and that was not measured again yet: the
    start measures each once more before its engine stops (repeat + `AGAIN`), never twice. A
    capacity search is not measured again (its windows are its answer at each rate)."""
    _, slowed = screened_starts(measurements, promote)
    return [(s.workload, s.concurrency, s.repeat) for s in slowed
            if s.engine_hash == engine_hash and s.start == start and s.again is None
            and s.repeat < AGAIN and not s.workload.endswith(CAPACITY_POINT)]


def aggregate(measurements: Iterable[Measurement], promote: PromoteSpec, role: str = "open"
              ) -> list[PointStats]:
    """Group windows by engine x workload x concurrency; summarise usable ones, count the rest."""
    groups: dict[tuple[str, str, int], list[Measurement]] = defaultdict(list)
    for m in decided(measurements, promote):
        groups[(m.key.engine_hash, m.key.workload, m.key.concurrency)].append(m)
    out = []
    for (engine_hash, workload, concurrency), ms in sorted(groups.items()):
        ms.sort(key=lambda m: m.key.repeat)
        if any(m.overload for m in ms):  # the server does not keep up at this rate
            ms = [replace(m, overload=True) for m in ms]
        usable = [m for m in ms if _exclusion(m, promote) is None]
        failures = Counter(r for m in ms if (r := _exclusion(m, promote)) is not None)
        values = tuple(score(m, promote) for m in usable)
        arr = np.asarray(values, dtype=float)
        median = float(np.median(arr)) if values else None
        mad = float(stats.median_abs_deviation(arr, scale=1.0)) if values else None
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
            per_position_acceptance=median_curve(m.per_position_acceptance for m in usable),
            request_rate=first.request_rate,
            digests=tuple(m.output_digests for m in usable),
            prompt_hashes=tuple(m.prompt_hash for m in usable),
        ))
    return out


def median_curve(curves: Iterable[Sequence[float]]) -> tuple[float, ...]:
    """Position-wise median of acceptance curves, over the positions all of them have."""
    curves = [c for c in curves if c]
    if not curves:
        return ()
    n = min(len(c) for c in curves)
    return tuple(float(v) for v in np.median(np.asarray([c[:n] for c in curves]), axis=0))
