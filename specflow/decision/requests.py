"""Per-request acceptance and speedup, by prompt length: the request as the unit.

Every window keeps its requests in dataset order (`Measurement.requests`): lengths, latency and,
for a speculative engine, the request's own acceptance from vLLM's response. Per traffic class
and concurrency level this module

- splits the class's requests into prompt-length buckets (terciles of the prompt tokens, fewer
  buckets where lengths repeat);
- per speculative engine and bucket, estimates the mean acceptance length (1 + accepted /
  verify steps, pooled over the bucket's requests) with a CI that resamples requests;
- per engine and bucket, estimates the speedup on request latency per output token against the
  baseline, pairing each request with the same prompt (same workload, concurrency and dataset
  position) on the baseline: the baseline's summed time per token over the bucket / the
  engine's, with a CI
  that resamples the pairs;
- names the best engine per bucket and, where it differs between buckets, what a length-keyed
  choice (each bucket served by its own best engine) would gain over the single best engine on
  the same requests, with a CI. vLLM 0.32 has no length-keyed N (its schedule keys on batch
  size), so this is evidence for or against asking for one, measured, not assumed. The choice
  per bucket is made on the same data: the gain is optimistic by that selection, which the
  report says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specflow.decision.model import Estimate
from specflow.records.measurement import Measurement, RequestStats

SAMPLES = 2000
"""Bootstrap resamples of the requests."""


@dataclass(frozen=True)
class Bucket:
    label: str
    lo: int
    """Prompt tokens above this (exclusive; -1 for the first bucket)."""
    hi: int
    """Prompt tokens up to this (inclusive)."""

    def holds(self, tokens: int) -> bool:
        return self.lo < tokens <= self.hi


@dataclass(frozen=True)
class EngineBucket:
    engine: str
    bucket: str
    requests: int
    acceptance_length: Estimate | None
    """Mean acceptance length of the bucket's requests (None: no per-request metrics)."""
    speedup: Estimate | None
    """Baseline time per output token / this engine's, over the bucket's paired requests."""


@dataclass(frozen=True)
class LevelRequests:
    """One traffic class at one concurrency level."""

    traffic_class: str
    concurrency: int
    buckets: tuple[Bucket, ...]
    rows: tuple[EngineBucket, ...]
    best: dict[str, str]
    """Best engine per bucket label, by speedup (point estimate)."""
    single_best: str | None
    """Best engine over all buckets together."""
    keyed_gain: Estimate | None
    """Length-keyed choice / single best - 1 (None when one engine is best everywhere)."""
    acceptance: dict[str, tuple[float, ...]]
    """Per engine, every request's acceptance length (the distribution plotted)."""


def buckets(tokens: Sequence[int]) -> tuple[Bucket, ...]:
    """Prompt-length terciles; fewer buckets where the lengths do not split."""
    if not tokens:
        return ()
    edges = sorted({int(np.quantile(tokens, q, method="lower")) for q in (1 / 3, 2 / 3)})
    edges = [e for e in edges if e < max(tokens)]
    bounds = [-1, *edges, max(tokens)]
    return tuple(Bucket(f"<= {hi}" if lo < 0 else f"{lo + 1}-{hi}", lo, hi)
                 for lo, hi in zip(bounds, bounds[1:], strict=False))


def _interval(boot: np.ndarray, value: float, confidence: float) -> Estimate:
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return Estimate(value, float(lo), float(hi), confidence)


def ratio_interval(num: np.ndarray, den: np.ndarray, rng: np.random.Generator,
                   confidence: float) -> Estimate | None:
    """sum(num) / sum(den) with a CI resampling the (num, den) pairs."""
    if len(num) < 2 or den.sum() <= 0:
        return None
    idx = rng.integers(0, len(num), size=(SAMPLES, len(num)))
    boot = num[idx].sum(axis=1) / np.maximum(den[idx].sum(axis=1), 1e-12)
    return _interval(boot, float(num.sum() / den.sum()), confidence)


Key = tuple[str, int]
"""A request's identity within a class and level: (workload, dataset position)."""


def _per_key(ms: Iterable[Measurement]) -> dict[str, dict[Key, list[RequestStats]]]:
    """Per engine, each request (by workload and position) over the engine's repeats."""
    out: dict[str, dict[Key, list[RequestStats]]] = defaultdict(lambda: defaultdict(list))
    for m in ms:
        for i, r in enumerate(m.requests):
            out[m.engine][(m.key.workload, i)].append(r)
    return out


def _per_token(rs: Sequence[RequestStats]) -> float | None:
    """A request's latency per output token, averaged over the engine's repeats of it."""
    values = [t for r in rs if (t := r.s_per_token)]
    return float(np.mean(values)) if values else None


def analyze_level(traffic_class: str, concurrency: int, ms: Sequence[Measurement],
                  confidence: float = 0.95, seed: int = 0) -> LevelRequests | None:
    """The per-request view of one class at one concurrency level (None without requests)."""
    ok = [m for m in ms if m.ok and m.requests]
    if not ok:
        return None
    per = _per_key(ok)
    tokens = {k: rs[0].prompt_tokens for by_key in per.values() for k, rs in by_key.items()}
    bks = buckets(list(tokens.values()))
    label = {k: next(b.label for b in bks if b.holds(t)) for k, t in tokens.items()}
    baseline = next((m.engine for m in ok if m.method == "none"), None)
    base_time = {k: t for k, rs in per.get(baseline or "", {}).items()
                 if (t := _per_token(rs)) is not None}
    rng = np.random.default_rng([seed, concurrency])
    rows, acceptance = [], {}
    pairs: dict[str, dict[Key, tuple[float, float]]] = {}
    for engine, by_key in sorted(per.items()):
        if engine == baseline:
            continue
        accept = [a for rs in by_key.values() for r in rs
                  if (a := r.acceptance_length) is not None]
        if accept:
            acceptance[engine] = tuple(accept)
        pairs[engine] = {k: (base_time[k], t) for k, rs in by_key.items()
                         if k in base_time and (t := _per_token(rs)) is not None}
        for b in bks:
            mine = [r for k, rs in by_key.items() if label[k] == b.label for r in rs]
            spec = [r for r in mine if r.spec_steps]
            acc = ratio_interval(np.array([r.accepted or 0 for r in spec], dtype=float),
                                 np.array([r.spec_steps or 0 for r in spec], dtype=float),
                                 rng, confidence)
            paired = [v for k, v in pairs[engine].items() if label[k] == b.label]
            speed = ratio_interval(np.array([p[0] for p in paired]),
                                   np.array([p[1] for p in paired]), rng, confidence)
            length = (replace(acc, value=1 + acc.value, lo=1 + acc.lo, hi=1 + acc.hi)
                      if acc else None)  # 1 + accepted / steps
            rows.append(EngineBucket(engine, b.label, len(mine), length, speed))
    best = {}
    for b in bks:
        ranked = [(r.speedup.value, r.engine) for r in rows
                  if r.bucket == b.label and r.speedup is not None]
        if ranked:
            best[b.label] = max(ranked)[1]
    single, gain = _keyed_gain(pairs, label, best, rng, confidence)
    return LevelRequests(traffic_class, concurrency, bks, tuple(rows), best, single, gain,
                         acceptance)


def _keyed_gain(pairs: dict[str, dict[Key, tuple[float, float]]], label: dict[Key, str],
                best: dict[str, str], rng: np.random.Generator, confidence: float
                ) -> tuple[str | None, Estimate | None]:
    """The single best engine over all paired requests, and what serving each bucket with its
    own best engine would gain over it: the single engine's summed time per token over the
    length-keyed choice's, minus 1, on the requests every engine involved has."""
    totals = {e: sum(b for b, _ in p.values()) / sum(c for _, c in p.values())
              for e, p in pairs.items() if len(p) >= 2}
    if not totals:
        return None, None
    single = max(totals, key=lambda e: totals[e])
    if len(set(best.values())) < 2:
        return single, None
    keys = sorted(set.intersection(*(set(pairs[e]) for e in {single, *best.values()})))
    if len(keys) < 2:
        return single, None
    one = np.array([pairs[single][k][1] for k in keys])
    keyed = np.array([pairs[best.get(label[k], single)][k][1] for k in keys])
    ratio = ratio_interval(one, keyed, rng, confidence)
    return single, replace(ratio, value=ratio.value - 1, lo=ratio.lo - 1,
                           hi=ratio.hi - 1) if ratio else None


def analyze_requests(ms: Sequence[Measurement], confidence: float = 0.95, seed: int = 0
                     ) -> list[LevelRequests]:
    """Every class and concurrency level whose windows kept their requests (an overloaded
    window's latencies are its queue's length: left out)."""
    groups: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in ms:
        if m.overload:
            continue
        groups[(m.traffic_class, m.key.concurrency)].append(m)
    out = []
    for (cls, c), group in sorted(groups.items()):
        level = analyze_level(cls, c, group, confidence, seed)
        if level is not None and level.rows:
            out.append(level)
    return out


def request_sums(requests: Iterable[RequestStats]) -> dict[str, int] | None:
    """The per-request metrics summed and named as the window's counters (`num_drafts`,
    `draft_tokens`, `accepted_tokens`); None when no request carried them."""
    read = [r for r in requests if r.spec_steps is not None]
    if not read:
        return None
    return {"num_drafts": sum(r.spec_steps or 0 for r in read),
            "draft_tokens": sum(r.drafted or 0 for r in read),
            "accepted_tokens": sum(r.accepted or 0 for r in read)}


def agreement(ms: Iterable[Measurement]) -> tuple[int, int, list[str]]:
    """Speculative windows whose per-request sums equal their /metrics deltas: (agreeing,
    windows with per-request metrics, a line per difference)."""
    agree, total, diffs = 0, 0, []
    for m in ms:
        sums = request_sums(m.requests)
        if not m.ok or sums is None or m.num_drafts is None:
            continue
        total += 1
        counted = {"num_drafts": m.num_drafts, "draft_tokens": m.draft_tokens,
                   "accepted_tokens": m.accepted_tokens}
        if sums == counted:
            agree += 1
        else:
            diffs.append(f"{m.key.id}: per request {sums} vs counted {counted}")
    return agree, total, diffs
