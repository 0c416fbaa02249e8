"""Two sweeps compared: what changed from sweep A to sweep B, beyond noise, per traffic class,
workload, concurrency and engine (`compare`). Measurements and identities in, rows out.

Per point present in both sweeps (the same workload and concurrency, engines matched by name,
so a drafter whose checkpoint changed is the same row):
- **speedup** of each speculative engine over its own sweep's time-local baseline (the
  decision's contrast), B / A;
- **acceptance length** of each speculative engine (1 + accepted / drafts), B / A, and its
  **acceptance at each position** (B - A);
- **throughput** of the baseline (output tokens/s), B / A: the engine itself got faster or
  slower.

Engine starts are the replicates. Speedups use the start-to-start variance pooled over both
sweeps' repeated starts at the point (the baseline's opening and closing starts at least), so a
start effect counts even where a candidate was started once; acceptance and throughput use one
value per engine start where both sweeps started the engine at least twice, and the windows
otherwise (said in the row). Each change gets a two-sided interval at `confidence`; the rows are
one family, Holm-corrected. The finding, in the decision's words:
- *regression*: worse beyond noise (the Holm test rejects) and by more than `tolerance`;
- *improvement*: the same, better;
- *no change beyond noise*: neither;
- *workload changed*: the requests differ (sampling settings, prompts or the workload's
  settings): the two sweeps did not measure the same thing, so no finding is given (a changed
  default temperature reads as this, never as a regression: vLLM issue 33497).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import computed_field
from scipy import stats

from specflow.decision.aggregate import usable_starts
from specflow.decision.capacity import searches
from specflow.records.measurement import Measurement
from specflow.spec.schema import CapacitySpec, PromoteSpec
from specflow.stats.critical import t_value
from specflow.stats.multiplicity import holm
from specflow.stats.replicates import StartWindows, contrast, start_noise

Finding = Literal["regression", "improvement", "no change beyond noise", "workload changed"]
Metric = Literal["speedup", "acceptance length", "throughput", "acceptance at position"]

NOT_SENT = "not sent (vLLM's default)"

NOT_REQUESTS = frozenset({"production_temperature", "traffic_class", "needs_hub"})
"""Workload settings that do not change a request (said nowhere as a workload change)."""


@dataclass(frozen=True)
class SweepSide:
    """One side of a comparison: a sweep's windows and identity."""

    label: str
    """How the report names it (the sweep id, run id or champion version)."""
    measurements: tuple[Measurement, ...]
    pins: Mapping[str, str] = field(default_factory=dict)
    """Versions and revisions (`sweep.json` or the MLflow parent run's `pin.*` tags)."""
    measured: Mapping[str, Any] = field(default_factory=dict)
    """The sweep's measured settings (workloads, warm-up, design); empty when unknown."""
    repeats: int | None = None
    """`sweep.repeats`: in a grid sweep (no run order recorded) a baseline window with a
    higher repeat index is the closing baseline, an engine start of its own."""
    sweep_id: str = ""


@dataclass(frozen=True)
class Change:
    """One row: a metric of one engine at one point, in A and in B."""

    traffic_class: str
    workload: str
    concurrency: int
    engine: str
    metric: Metric
    position: int | None
    """1-based position for `acceptance at position`."""
    a: float
    b: float
    change: float
    """B / A (`scale` ratio) or B - A (`scale` difference)."""
    lo: float
    hi: float
    scale: Literal["ratio", "difference"]
    p: float
    """Two-sided p-value of no change (1.0 where no finding is given)."""
    replicates: str
    """What the interval treats as replicates, e.g. `3 + 3 engine starts`."""
    finding: Finding = "no change beyond noise"

    @property
    def label(self) -> str:
        return f"{self.metric} {self.position}" if self.position else self.metric


@dataclass(frozen=True)
class Comparison:
    """What changed from A to B."""

    a: str
    b: str
    changes: tuple[Change, ...]
    pins: tuple[tuple[str, str, str], ...]
    """(pin, in A, in B) for every pin that differs (`-`: absent)."""
    workload_changes: tuple[str, ...]
    """One line per difference in what the requests were: such rows get no finding."""
    settings: tuple[str, ...]
    """Other measured settings that differ (warm-up, design): said, rows still compared."""
    only: tuple[str, ...]
    """Points and engines measured by one sweep only."""
    confidence: float
    tolerance: float

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.finding == "regression"]

    @property
    def improvements(self) -> list[Change]:
        return [c for c in self.changes if c.finding == "improvement"]

    @property
    def compared(self) -> list[Change]:
        """Rows that got a finding (the workload was the same)."""
        return [c for c in self.changes if c.finding != "workload changed"]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def summary(self) -> str:
        if not self.changes:
            return "nothing to compare: no point and engine was measured by both sweeps"
        if not self.compared:
            return "not comparable: the workload changed at every point both sweeps measured"
        regs, imps = self.regressions, self.improvements
        if regs:
            return (f"regression: {len(regs)} of {len(self.compared)} rows worse beyond noise"
                    + (f", {len(imps)} better" if imps else ""))
        if imps:
            return f"improvement: {len(imps)} of {len(self.compared)} rows better beyond noise"
        return f"no change beyond noise in {len(self.compared)} rows"


# --------------------------------------------------------------------------------------------
# What the requests were


def _requests(side: SweepSide) -> dict[str, dict[str, set[str]]]:
    """Per workload: the distinct sampling settings and prompt hashes of its usable windows."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for m in side.measurements:
        if not m.ok:
            continue
        w = out[m.key.workload]
        for k, v in m.sampling.items():
            w[k].add(NOT_SENT if v is None else json.dumps(v))
        if m.prompt_hash:
            w["prompts"].add(m.prompt_hash[:12])
    return out


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True, default=str)
    return out


def _differ(a: Mapping[str, str], b: Mapping[str, str]) -> list[tuple[str, str, str]]:
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def workload_changes(a: SweepSide, b: SweepSide) -> dict[str, list[str]]:
    """Per workload measured by both: how its requests differ (empty: the same requests).

    The requests each window sent (sampling settings and prompts) where both sweeps recorded
    them, and the workload's settings where both sweeps' identities are known. A setting not
    sent on both sides, under two vLLM versions, is a change too: vLLM's default applied and
    may have moved."""
    ra, rb = _requests(a), _requests(b)
    wa = (a.measured.get("workload") or {}) if a.measured else {}
    wb = (b.measured.get("workload") or {}) if b.measured else {}
    vllm_moved = a.pins.get("vllm") != b.pins.get("vllm")
    out: dict[str, list[str]] = {}
    for w in sorted(set(ra) & set(rb)):
        lines: list[str] = []
        keys = set(ra[w]) & set(rb[w]) if ra[w] and rb[w] else set()
        for k in sorted(keys):
            va, vb = sorted(ra[w][k]), sorted(rb[w][k])
            if va != vb:
                lines.append(f"{w}: requests' {k} {', '.join(va)} -> {', '.join(vb)}")
            elif vllm_moved and NOT_SENT in va:
                lines.append(f"{w}: requests' {k} {NOT_SENT} under vLLM "
                             f"{a.pins.get('vllm')} and {b.pins.get('vllm')}")
        if w in wa and w in wb:
            lines += [f"{w}: workload.{w}.{k} {x} -> {y}"
                      for k, x, y in _differ(_flat(wa[w]), _flat(wb[w]))
                      if k.split(".")[0] not in NOT_REQUESTS]
        out[w] = lines
    return out


# --------------------------------------------------------------------------------------------
# The rows


def _welch(xa: Sequence[float], xb: Sequence[float]) -> tuple[float, float, float] | None:
    """mean(B) - mean(A), its standard error and Welch's df (None below 2 values a side)."""
    if len(xa) < 2 or len(xb) < 2:
        return None
    va, vb = float(np.var(xa, ddof=1)) / len(xa), float(np.var(xb, ddof=1)) / len(xb)
    se = math.sqrt(va + vb)
    den = (va * va / (len(xa) - 1) if va else 0.0) + (vb * vb / (len(xb) - 1) if vb else 0.0)
    df = (va + vb) ** 2 / den if den else float(len(xa) + len(xb) - 2)
    return float(np.mean(xb) - np.mean(xa)), se, max(df, 1.0)


def _p(d: float, se: float, df: float) -> float:
    if se == 0:
        return 0.0 if abs(d) > 1e-12 else 1.0
    return float(2 * stats.t.sf(abs(d) / se, df))


def _row(key: tuple[str, str, int, str], metric: Metric, a: float, b: float,
         est: tuple[float, float, float], confidence: float, replicates: str, *,
         log: bool, position: int | None = None) -> Change:
    d, se, df = est
    half = t_value(confidence, df) * se if se else 0.0
    if log:
        change, lo, hi = math.exp(d), math.exp(d - half), math.exp(d + half)
    else:
        change, lo, hi = d, d - half, d + half
    return Change(*key, metric, position, a, b, change, lo, hi, "ratio" if log else "difference",
                  _p(d, se, df), replicates)


def _per_start(ms: Iterable[Measurement], value: Any) -> dict[int, list[float]]:
    out: dict[int, list[float]] = defaultdict(list)
    for m in ms:
        v = value(m)
        if v is not None and math.isfinite(v):
            out[m.key.start].append(v)
    return out


def _replicated(xa: Mapping[int, list[float]], xb: Mapping[int, list[float]], *,
                pooled: Any) -> tuple[list[float], list[float], str]:
    """One value per engine start where both sides have two or more, else every window."""
    if len(xa) >= 2 and len(xb) >= 2:
        return ([pooled(v) for v in xa.values()], [pooled(v) for v in xb.values()],
                f"{len(xa)} + {len(xb)} engine starts")
    flat_a = [v for vs in xa.values() for v in vs]
    flat_b = [v for vs in xb.values() for v in vs]
    return flat_a, flat_b, (f"{len(flat_a)} + {len(flat_b)} windows (an engine started once: "
                            "its start effect is not in the interval)")


def _usable(m: Measurement) -> bool:
    return m.ok and not m.failed and m.output_throughput > 0 and not m.overload


def _scoring(measured: Mapping[str, Any]) -> PromoteSpec | None:
    """What the speedups are scored on: the latency statistic for the classes the sweep decided
    on latency, the capacity for those it decided on capacity (its measured settings name them,
    with the statistic or the search), throughput for the others."""
    latency = (measured or {}).get("latency") or {}
    searched = dict((measured or {}).get("capacity") or {})
    if not latency and not searched:
        return None
    classes = searched.pop("classes", [])
    return PromoteSpec(objectives={**dict.fromkeys(latency.get("classes", []), "latency"),
                                   **dict.fromkeys(classes, "capacity")},
                       latency_statistic=latency.get("statistic", "mean_tpot_ms"),
                       capacity=CapacitySpec.model_validate(searched) if classes else
                       CapacitySpec())


def _by_start(ms: Sequence[Measurement], repeats: int | None) -> list[Measurement]:
    """Windows with `key.start` numbering the engine's starts in run order (`seq`). A grid
    sweep records no run order, and its closing baseline shares the opening start's key: its
    windows (repeat index from `repeats` on) become a start of their own, after the others, as
    the decision takes them."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for m in ms:
        if m.seq >= 0 and m.seq not in seqs[m.key.engine_hash]:
            seqs[m.key.engine_hash].append(m.seq)
    last = max((m.seq for m in ms), default=-1)
    out = []
    for m in ms:
        if m.seq >= 0:
            m = replace(m, key=replace(m.key, start=sorted(seqs[m.key.engine_hash]).index(m.seq)))
        elif repeats and m.method == "none" and m.key.planned.repeat >= repeats:
            m = replace(m, key=replace(m.key, start=m.key.start + 1), seq=last + 1)
        out.append(m)
    return out


def _al(ms: Sequence[Measurement]) -> float | None:
    drafts = sum(m.num_drafts or 0 for m in ms)
    accepted = sum(m.accepted_tokens or 0 for m in ms)
    return 1 + accepted / drafts if drafts else None


def _engine_rows(key: tuple[str, str, int, str], wa: list[Measurement], wb: list[Measurement],
                 confidence: float) -> list[Change]:
    """Acceptance length and per-position acceptance (speculative) or throughput (baseline)."""
    rows: list[Change] = []
    if wa[0].method == "none" and wa[0].request_rate is not None:
        return rows  # open loop: its throughput is the rate offered, not the server's
    if wa[0].method == "none":
        xa = _per_start(wa, lambda m: math.log(m.output_throughput))
        xb = _per_start(wb, lambda m: math.log(m.output_throughput))
        la, lb, rep = _replicated(xa, xb, pooled=lambda v: float(np.mean(v)))
        est = _welch(la, lb)
        if est is not None:
            rows.append(_row(key, "throughput", math.exp(float(np.mean(la))),
                             math.exp(float(np.mean(lb))), est, confidence, rep, log=True))
        return rows
    xa = _per_start(wa, lambda m: m.mean_acceptance_length)
    xb = _per_start(wb, lambda m: m.mean_acceptance_length)
    by_start_a = {s: [m for m in wa if m.key.start == s] for s in xa}
    by_start_b = {s: [m for m in wb if m.key.start == s] for s in xb}
    if len(xa) >= 2 and len(xb) >= 2:  # a start's acceptance from its summed counters
        la = [math.log(v) for s in xa if (v := _al(by_start_a[s])) is not None]
        lb = [math.log(v) for s in xb if (v := _al(by_start_b[s])) is not None]
        rep = f"{len(la)} + {len(lb)} engine starts"
    else:
        la, lb, rep = _replicated({s: [math.log(v) for v in vs] for s, vs in xa.items()},
                                  {s: [math.log(v) for v in vs] for s, vs in xb.items()},
                                  pooled=lambda v: float(np.mean(v)))
    est = _welch(la, lb)
    al_a, al_b = _al(wa), _al(wb)
    if est is not None and al_a is not None and al_b is not None:
        rows.append(_row(key, "acceptance length", al_a, al_b, est, confidence, rep, log=True))
    depth = min(min((len(m.per_position_acceptance) for m in wa), default=0),
                min((len(m.per_position_acceptance) for m in wb), default=0))
    for i in range(depth):
        pa = _per_start(wa, lambda m, i=i: m.per_position_acceptance[i])
        pb = _per_start(wb, lambda m, i=i: m.per_position_acceptance[i])
        va, vb, rep = _replicated(pa, pb, pooled=lambda v: float(np.mean(v)))
        est = _welch(va, vb)
        if est is not None:
            rows.append(_row(key, "acceptance at position", float(np.mean(va)),
                             float(np.mean(vb)), est, confidence, rep, log=False,
                             position=i + 1))
    return rows


def _speedups(sa: Sequence[StartWindows], sb: Sequence[StartWindows],
              names_a: Mapping[str, str], names_b: Mapping[str, str], base: tuple[str, str]
              ) -> dict[str, tuple[float, float, float, float, float, str]]:
    """Per speculative engine measured in both: (speedup A, speedup B, log change, se, df,
    replicates), with the start noise pooled over both sweeps; `base`: the baselines' hashes."""
    base_a, base_b = [base[0]], [base[1]]
    tagged = [StartWindows("A:" + s.engine_hash, s.start, s.seq, s.stage, s.logs) for s in sa] + \
        [StartWindows("B:" + s.engine_hash, s.start, s.seq, s.stage, s.logs) for s in sb]
    noise = start_noise(tagged, "A:" + base_a[0])
    out = {}
    ba = [s for s in tagged if s.engine_hash == "A:" + base_a[0]]
    bb = [s for s in tagged if s.engine_hash == "B:" + base_b[0]]
    by_name_b = {n: h for h, n in names_b.items()}
    for ha, name in names_a.items():
        hb = by_name_b.get(name)
        if ha == base_a[0] or hb is None or hb == base_b[0]:
            continue
        ca = contrast([s for s in tagged if s.engine_hash == "A:" + ha], ba, noise)
        cb = contrast([s for s in tagged if s.engine_hash == "B:" + hb], bb, noise)
        if ca is None or cb is None:
            continue
        se = math.hypot(ca.se, cb.se)
        den = (ca.se ** 4 / ca.df if ca.se else 0.0) + (cb.se ** 4 / cb.df if cb.se else 0.0)
        df = se ** 4 / den if den else 1.0
        n_a, n_b = ca.n_starts + ca.n_baseline_starts, cb.n_starts + cb.n_baseline_starts
        rep = (f"{n_a} + {n_b} engine starts" if noise.replicated else
               f"{ca.n_windows + ca.n_baseline_windows} + {cb.n_windows + cb.n_baseline_windows}"
               " windows (no engine started twice: start effects not in the interval)")
        out[name] = (ca.speedup, cb.speedup, cb.log_ratio - ca.log_ratio, se, max(df, 1.0), rep)
    return out


def compare(a: SweepSide, b: SweepSide, *, confidence: float = 0.95, tolerance: float = 0.02
            ) -> Comparison:
    """Every point and engine measured by both sweeps, A -> B (see the module docstring).

    `tolerance`: the smallest relative change (ratios) or absolute change (acceptance at a
    position) that counts as a regression or an improvement."""
    changed = workload_changes(a, b)
    scoring = _scoring(b.measured or a.measured)
    # a capacity search is one record (its steps, overloaded or not, are what it found)
    ua = _by_start([m for m in searches(a.measurements, scoring) if _usable(m)], a.repeats)
    ub = _by_start([m for m in searches(b.measurements, scoring) if _usable(m)], b.repeats)
    names_a = {m.key.engine_hash: m.engine for m in ua}
    names_b = {m.key.engine_hash: m.engine for m in ub}
    base_a = next((m.key.engine_hash for m in ua if m.method == "none"), None)
    base_b = next((m.key.engine_hash for m in ub if m.method == "none"), None)
    starts_a, starts_b = usable_starts(ua, scoring), usable_starts(ub, scoring)
    cls = {m.key.workload: m.traffic_class for m in ua + ub}
    rows: list[Change] = []
    only: list[str] = []
    for point in sorted(set(starts_a) | set(starts_b)):
        w, c = point
        if point not in starts_a or point not in starts_b:
            only.append(f"{w} c={c}: measured by {'A' if point in starts_a else 'B'} only")
            continue
        here_a = {h: n for h, n in names_a.items() if any(s.engine_hash == h
                                                          for s in starts_a[point])}
        here_b = {h: n for h, n in names_b.items() if any(s.engine_hash == h
                                                          for s in starts_b[point])}
        for name in sorted(set(here_a.values()) ^ set(here_b.values())):
            side = "A" if name in here_a.values() else "B"
            only.append(f"{w} c={c}: {name} measured by {side} only")
        speedups = _speedups(starts_a[point], starts_b[point], here_a, here_b,
                             (base_a, base_b)) if base_a in here_a and base_b in here_b else {}
        for name, (sp_a, sp_b, d, se, df, rep) in speedups.items():
            rows.append(_row((cls[w], w, c, name), "speedup", sp_a, sp_b, (d, se, df),
                             confidence, rep, log=True))
        for name in sorted(set(here_a.values()) & set(here_b.values())):
            wa = [m for m in ua if m.engine == name and (m.key.workload, m.key.concurrency)
                  == point]
            wb = [m for m in ub if m.engine == name and (m.key.workload, m.key.concurrency)
                  == point]
            rows += _engine_rows((cls[w], w, c, name), wa, wb, confidence)
    return Comparison(a.label, b.label, tuple(_judge(rows, changed, confidence, tolerance)),
                      tuple(_differ(dict(a.pins), dict(b.pins))),
                      tuple(line for lines in changed.values() for line in lines),
                      tuple(f"{k}: {x} -> {y}" for k, x, y in _differ(
                          _flat({k: v for k, v in a.measured.items() if k != "workload"}),
                          _flat({k: v for k, v in b.measured.items() if k != "workload"}))
                          if a.measured and b.measured),
                      tuple(only), confidence, tolerance)


def _judge(rows: list[Change], changed: Mapping[str, list[str]], confidence: float,
           tolerance: float) -> list[Change]:
    """Holm over the rows whose workload is unchanged; a finding for each row."""
    family = [i for i, r in enumerate(rows) if not changed.get(r.workload)]
    reject = holm([rows[i].p for i in family], 1 - confidence)
    out = [replace(r, finding="workload changed", p=1.0) if changed.get(r.workload) else r
           for r in rows]
    for i, rejected in zip(family, reject, strict=True):
        r = out[i]
        if not rejected:
            continue
        size = r.change - 1 if r.scale == "ratio" else r.change
        if size < -tolerance:
            out[i] = replace(r, finding="regression")
        elif size > tolerance:
            out[i] = replace(r, finding="improvement")
    return out
