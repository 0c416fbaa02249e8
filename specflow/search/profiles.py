"""Build acceptance profiles (`specflow.spec.profile`) from a sweep's windows.

One profile per (drafter series, traffic class, temperature) that measured per-position
acceptance: the rates at its largest measured N with intervals over the windows, the acceptance
length at every N (measured where an engine ran, predicted from the largest N where the series
is a chain), the model that holds (`chain`, or `measured per N` with the reason from
`predict.check_chain` / `predict.chain_curve`), the per-request acceptance-length histogram and
the acceptance by prompt-length tercile. Acceptance is pooled over the class's workloads and
concurrency levels: it is the drafter's property on the traffic, not the batch's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

from specflow.decision.requests import buckets, ratio_interval
from specflow.decision.watch import ratio_band
from specflow.records.measurement import Measurement
from specflow.search import predict
from specflow.spec.profile import AcceptanceProfile, CurvePoint, Interval, LengthBin
from specflow.stats.critical import t_value, z_value
from specflow.stats.intervals import seeded_rng

HISTOGRAM_STEP = 0.5
"""Width of a histogram bin in tokens per verify step."""


def _band(value: float, se: float, df: int, confidence: float, top: float = math.inf
          ) -> Interval:
    half = t_value(confidence, df) * se if df >= 1 else 0.0
    return Interval(value=round(value, 4), lo=round(max(0.0, value - half), 4),
                hi=round(min(top, value + half), 4))


def _rates(probe: predict.Acceptance, confidence: float) -> tuple[Interval, ...]:
    k = len(probe.windows)
    out = []
    for i, rate in enumerate(probe.rates):
        se = float(stats.sem([w[i] for w in probe.windows])) if k >= 2 else 0.0
        out.append(_band(rate, se, k - 1, confidence, top=1.0))
    return tuple(out)


def _histogram(windows: Sequence[Measurement]) -> dict[str, int]:
    lengths = [a for m in windows for r in m.requests if (a := r.acceptance_length) is not None]
    if not lengths:
        return {}
    top = math.ceil(max(lengths) / HISTOGRAM_STEP) * HISTOGRAM_STEP
    edges = np.arange(1.0, max(top, 1.0) + HISTOGRAM_STEP / 2 + HISTOGRAM_STEP, HISTOGRAM_STEP)
    counts, _ = np.histogram(lengths, bins=edges)
    return {f"{lo:.1f}-{lo + HISTOGRAM_STEP:.1f}": int(c)
            for lo, c in zip(edges[:-1], counts, strict=True)}


def _by_length(windows: Sequence[Measurement], confidence: float, key: str
               ) -> tuple[LengthBin, ...]:
    requests = [r for m in windows for r in m.requests if r.spec_steps]
    out = []
    rng = seeded_rng(0, "profile", key)
    for b in buckets([r.prompt_tokens for r in requests]):
        mine = [r for r in requests if b.holds(r.prompt_tokens)]
        est = ratio_interval(np.array([r.accepted or 0 for r in mine], dtype=float),
                             np.array([r.spec_steps or 0 for r in mine], dtype=float), rng,
                             confidence)
        out.append(LengthBin(prompt_tokens=b.label, requests=len(mine), acceptance_length=None
                             if est is None else Interval(value=round(1 + est.value, 4),
                                                      lo=round(1 + est.lo, 4),
                                                      hi=round(1 + est.hi, 4))))
    return tuple(out)


def _curve(accs: Mapping[int, predict.Acceptance], n_max: int, chain: bool, confidence: float
           ) -> tuple[tuple[CurvePoint, ...], str]:
    """Acceptance length at N = 1..n_max, and why the series is not a chain ("" if it is)."""
    probe = accs[n_max]
    z = z_value(confidence)
    why = "" if chain else "not a chain method: every N is measured"
    points = []
    for n in range(1, n_max + 1):
        acc = accs.get(n)
        measured = (_band(acc.mal(n), acc.mal_se(n), len(acc.windows) - 1, confidence,
                          top=n + 1.0) if acc is not None else None)
        predicted = None
        if chain:
            allowed = z * probe.mal_se(n) + predict.CHAIN_TOLERANCE * probe.mal(n)
            predicted = Interval(value=round(probe.mal(n), 4),
                             lo=round(max(1.0, probe.mal(n) - allowed), 4),
                             hi=round(min(n + 1.0, probe.mal(n) + allowed), 4))
            check = (predict.check_chain(probe, acc, n, n_max, z)
                     if acc is not None and n < n_max else None)
            if check is not None and not check.holds and not why:
                why = check.text()
        points.append(CurvePoint(n=n, measured=measured, predicted=predicted))
    if chain and not why:
        why = predict.chain_curve({n: a.mal(n) for n, a in accs.items()},
                                  {n: a.mal_se(n) for n, a in accs.items()}, z)
    return tuple(points), why


def _tokens_per_step(windows: Sequence[Measurement], confidence: float) -> Interval | None:
    """Generated tokens per target step, pooled over the windows (`watch.ratio_band`: the
    same estimate `watch` makes of live counters)."""
    got = [(float(m.accepted_tokens), float(m.total_output_tokens - m.accepted_tokens))
           for m in windows if m.accepted_tokens is not None and m.total_output_tokens]
    band = ratio_band([a for a, _ in got], [s for _, s in got], confidence, 1.0) if got else None
    return None if band is None else Interval(value=round(band.value, 4),
                                              lo=round(max(1.0, band.lo), 4),
                                              hi=round(band.hi, 4))


def _temperature(m: Measurement, default: Mapping[str, float]) -> float:
    got = m.sampling.get("temperature")
    return float(got) if isinstance(got, int | float) and not isinstance(got, bool) else \
        default.get(m.key.workload, 0.0)


def build(measurements: Sequence[Measurement], pins: Mapping[str, str], *, sweep_id: str,
          temperatures: Mapping[str, float] | None = None, confidence: float = 0.95
          ) -> list[AcceptanceProfile]:
    """Every profile the sweep's windows support. `pins` as the sweep recorded them
    (`vllm`, `target_model`, `target_revision`, `drafter.<name>`); `temperatures` (workload ->
    temperature) for windows that did not record their sampling."""
    groups: dict[tuple[str, str, float], dict[int, list[Measurement]]] = defaultdict(
        lambda: defaultdict(list))
    for m in measurements:
        if (not m.ok or m.stage == "schedule" or not m.per_position_acceptance
                or m.drafter.endswith("+adaptive")):
            continue
        temp = _temperature(m, temperatures or {})
        groups[(m.drafter, m.traffic_class, temp)][m.num_speculative_tokens].append(m)
    target = (f"{pins.get('target_model', 'unknown')}@"
              f"{pins.get('target_revision', 'unpinned')}")
    out = []
    for (drafter, cls, temp), per_n in sorted(groups.items()):
        accs = {n: acc for n, ms in per_n.items()
                if (acc := predict.acceptance(ms)) is not None and len(acc.rates) >= n}
        if not accs:
            continue
        n_max = max(accs)
        top = per_n[n_max]
        method = top[0].method
        chain = method in predict.CHAIN_METHODS
        curve, why = _curve(accs, n_max, chain, confidence)
        out.append(AcceptanceProfile(
            sweep_id=sweep_id, target=target, drafter=drafter, method=method,
            drafter_model=pins.get(f"drafter.{drafter}"), traffic_class=cls,
            workloads=tuple(sorted({m.key.workload for ms in per_n.values() for m in ms})),
            temperature=temp, vllm=pins.get("vllm", "unknown"), confidence=confidence,
            n_max=n_max, rates=_rates(accs[n_max], confidence), curve=curve,
            model="chain" if chain and not why else "measured per N", why=why,
            histogram=_histogram(top), by_prompt_length=_by_length(top, confidence, drafter),
            windows=len(accs[n_max].windows), tokens_per_step=_tokens_per_step(top, confidence)))
    return out


def file_name(p: AcceptanceProfile) -> str:
    """`<class>--<drafter>--t<temperature>.json`, unique within a sweep."""
    return f"{p.traffic_class}--{p.drafter}--t{p.temperature:g}.json"
