"""Watch: a serving engine's speculative-decoding counters, in windows, held against what was
measured when its setting was chosen.

vLLM counts, per engine and since it started: drafts, draft tokens, accepted tokens, accepted
tokens per draft position, and generated tokens. A **reading** is their values at one time
(`Reading`); a **window** (`Window`) is the increments between the readings that fall in it, per
series, with Prometheus's counter-reset rule (a value below the one before it means the server
restarted: the increment is the new value, counted from zero), summed over series.

Per window: per-position acceptance (accepted at position i / drafts), acceptance length
(1 + accepted / drafts) and **tokens per step** (generated / (generated - accepted): what a
target forward pass yields on this traffic, drafting or not; a drafter that finds nothing to
propose leaves acceptance length untouched but brings tokens per step to 1). Over windows: the
pooled ratio with its interval (a ratio estimator over windows, t quantile). Each figure is held
against its reference band: `as measured`, `better` or `worse beyond noise` (the difference's
interval beyond zero and the change beyond `tolerance` of the reference), with the throughput
the change predicts (the speedup scales with tokens per step at a fixed N: the step's cost is the
hardware's and N's, not the traffic's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specflow.spec.profile import AcceptanceProfile, Interval, ReferenceCurve
from specflow.stats.critical import t_value

DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATED, POSITION = (
    "drafts", "draft_tokens", "accepted", "generated", "position")
"""The counters a reading holds (POSITION: one series per draft position)."""

Series = tuple[str, int, str]
"""(counter, draft position or -1, the series' identity: its labels)."""

Verdict = Literal["as measured", "better", "worse beyond noise"]
AS_MEASURED: Verdict = "as measured"
BETTER: Verdict = "better"
WORSE: Verdict = "worse beyond noise"


@dataclass(frozen=True)
class Reading:
    """The counters' values at one time (seconds since the epoch); `values` is empty when the
    server could not be read then (`problem` says why)."""

    t: float
    values: Mapping[Series, float]
    problem: str = ""


@dataclass(frozen=True)
class Window:
    """The counters' increments over [start, end), summed over series."""

    start: float
    end: float
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    generated: int = 0
    per_position: tuple[int, ...] = ()
    """Accepted tokens at draft position 0, 1, ..."""
    resets: int = 0
    """Readings at which some counter went down: the server restarted."""
    unread: int = 0
    """Readings at which the server could not be read."""

    @property
    def traffic(self) -> bool:
        return self.generated > 0

    @property
    def acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_step(self) -> float | None:
        steps = self.generated - self.accepted
        return self.generated / steps if self.generated and steps > 0 else None

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(a / self.drafts for a in self.per_position) if self.drafts else ()

    def note(self) -> str:
        out = []
        if not self.traffic:
            out.append("no traffic")
        elif not self.drafts:
            out.append("no drafts")
        if self.resets:
            out.append("server restarted")
        if self.unread:
            out.append(f"{self.unread} readings failed")
        return ", ".join(out)


def windows(readings: Sequence[Reading], start: float, width: float, count: int
            ) -> list[Window]:
    """`count` windows of `width` seconds from `start`: each reading's increments (against the
    series' previous reading) go to the window its time falls in."""
    incs: list[dict[Series, float]] = [{} for _ in range(count)]
    resets, unread = [0] * count, [0] * count
    last: dict[Series, float] = {}
    for r in sorted(readings, key=lambda r: r.t):
        k = math.floor((r.t - start) / width)
        inside = 0 <= k < count
        if not r.values:
            if inside:
                unread[k] += 1
            continue
        went_down = False
        for s, v in r.values.items():
            before = last.get(s)
            last[s] = v
            if before is None:
                continue  # its first reading: where it started is not known
            if v < before:
                went_down, inc = True, v
            else:
                inc = v - before
            if inside:
                incs[k][s] = incs[k].get(s, 0.0) + inc
        if inside and went_down:
            resets[k] += 1
    return [_window(start + i * width, start + (i + 1) * width, inc, resets[i], unread[i])
            for i, inc in enumerate(incs)]


def _window(lo: float, hi: float, inc: Mapping[Series, float], resets: int, unread: int
            ) -> Window:
    tot: dict[str, float] = {}
    pos: dict[int, float] = {}
    for (name, p, _), v in inc.items():
        if name == POSITION:
            pos[p] = pos.get(p, 0.0) + v
        else:
            tot[name] = tot.get(name, 0.0) + v
    n = max(pos, default=-1) + 1
    return Window(lo, hi, drafts=round(tot.get(DRAFTS, 0)),
                  draft_tokens=round(tot.get(DRAFT_TOKENS, 0)),
                  accepted=round(tot.get(ACCEPTED, 0)), generated=round(tot.get(GENERATED, 0)),
                  per_position=tuple(round(pos.get(i, 0)) for i in range(n)), resets=resets,
                  unread=unread)


# --------------------------------------------------------------------------------------------
# Estimates and verdicts


@dataclass(frozen=True)
class Band:
    """A value with its interval and standard error (df: its t quantile's degrees of freedom;
    0: known exactly, e.g. a published curve without an interval)."""

    value: float
    lo: float
    hi: float
    se: float = 0.0
    df: int = 0

    @classmethod
    def of(cls, value: float, lo: float, hi: float, confidence: float, n: int) -> Band:
        """A reference's band from its interval over `n` windows (its se read back from the
        interval's width)."""
        if n < 2 or hi <= lo:
            return cls(value, lo, hi)
        return cls(value, lo, hi, (hi - lo) / (2 * t_value(confidence, n - 1)), n - 1)


def ratio_band(num: Sequence[float], den: Sequence[float], confidence: float, offset: float = 0.0
               ) -> Band | None:
    """offset + sum(num) / sum(den) over windows with den > 0, its se from the windows' spread
    (the ratio estimator's linearisation); None without any such window."""
    pairs = [(a, b) for a, b in zip(num, den, strict=True) if b > 0]
    if not pairs:
        return None
    k, total = len(pairs), sum(b for _, b in pairs)
    r = sum(a for a, _ in pairs) / total
    if k < 2:
        return Band(offset + r, offset + r, offset + r)
    se = math.sqrt(k / (k - 1) * sum((a - r * b) ** 2 for a, b in pairs)) / total
    half = t_value(confidence, k - 1) * se
    return Band(offset + r, offset + r - half, offset + r + half, se, k - 1)


@dataclass(frozen=True)
class Row:
    """One figure: live against its reference."""

    figure: str
    """`tokens per step`, `acceptance length` or `position i` (1-based, as vLLM prints)."""
    live: Band | None
    reference: Band | None
    verdict: Verdict | None
    """None: nothing to hold (no drafts live, or no reference for this figure)."""
    why: str = ""

    @property
    def change(self) -> float | None:
        if self.live is None or self.reference is None or not self.reference.value:
            return None
        return self.live.value / self.reference.value - 1


def verdict(live: Band, ref: Band, confidence: float, tolerance: float) -> Verdict:
    """worse / better beyond noise (the difference's interval excludes zero, and the change is
    beyond `tolerance` of the reference), else as measured."""
    d = live.value - ref.value
    se = math.hypot(live.se, ref.se)
    dfs = [df for df in (live.df, ref.df) if df > 0]
    half = t_value(confidence, min(dfs)) * se if dfs else 0.0
    tol = tolerance * abs(ref.value)
    if d + half < -tol:
        return WORSE
    if d - half > tol:
        return BETTER
    return AS_MEASURED


@dataclass(frozen=True)
class Expected:
    """What the counters are held against, at the N the servers run."""

    label: str
    """Where it comes from (a profile's sweep, class and drafter; a reference curve's name)."""
    n: int
    acceptance_length: Band | None
    tokens_per_step: Band | None = None
    rates: tuple[Band, ...] = ()
    speedup: float | None = None
    """The setting's measured speedup (the champion's worst point), when known."""


@dataclass(frozen=True)
class Watched:
    """A watch's answer."""

    expected: Expected
    windows: tuple[Window, ...]
    rows: tuple[Row, ...]
    outcome: Literal["as measured", "better", "worse beyond noise", "no traffic",
                     "too few windows", "nothing to hold"]
    """`nothing to hold`: no figure had both a live value and a reference (a reference curve
    has acceptance length only, and the servers drafted nothing)."""
    predicted: float | None = None
    """The live over the reference tokens per step (else acceptance length): the factor the
    change predicts for the speedup."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def dropped(self) -> bool:
        return self.outcome == WORSE

    @property
    def predicted_speedup(self) -> float | None:
        if self.predicted is None or self.expected.speedup is None:
            return None
        return self.predicted * self.expected.speedup


def watch(ws: Sequence[Window], expected: Expected, *, confidence: float = 0.95,
          tolerance: float = 0.05) -> Watched:
    """The windows held against `expected` (see the module docstring)."""
    live = [w for w in ws if w.traffic]
    notes = []
    n_live = max((len(w.per_position) for w in live), default=0)
    if n_live and n_live != expected.n:
        notes.append(f"the servers draft {n_live} tokens; the reference is at N={expected.n}: "
                     f"positions beyond {min(n_live, expected.n)} are not held")
    if not live:
        return Watched(expected, tuple(ws), (), "no traffic", notes=tuple(notes))
    if len(live) < 2:
        return Watched(expected, tuple(ws), (), "too few windows", notes=tuple(
            [*notes, "one window with traffic: an interval needs two"]))
    rows = []
    steps = [float(w.generated - w.accepted) for w in live]
    tps = ratio_band([float(w.accepted) for w in live], steps, confidence, 1.0)
    al = ratio_band([float(w.accepted) for w in live], [float(w.drafts) for w in live],
                    confidence, 1.0)
    rows.append(_row("tokens per step", tps, expected.tokens_per_step, confidence, tolerance))
    rows.append(_row("acceptance length", al, expected.acceptance_length, confidence,
                     tolerance))
    for i in range(min(n_live, expected.n)):
        live_i = ratio_band([float(w.per_position[i]) if i < len(w.per_position) else 0.0
                             for w in live], [float(w.drafts) for w in live], confidence)
        ref_i = expected.rates[i] if i < len(expected.rates) else None
        rows.append(_row(f"position {i + 1}", live_i, ref_i, confidence, tolerance))
    held = [r.verdict for r in rows if r.verdict is not None]
    outcome: Literal["as measured", "better", "worse beyond noise", "nothing to hold"] = (
        WORSE if WORSE in held else BETTER if BETTER in held else AS_MEASURED if held
        else "nothing to hold")
    if not held:
        notes.append("no figure has both a live value and a reference")
    coverage = sum(w.drafts for w in live) / max(1.0, sum(steps))
    return Watched(expected, tuple(ws), tuple(rows), outcome,
                   _predicted(expected, tps, al, coverage), tuple(notes))


def _predicted(e: Expected, tps: Band | None, al: Band | None, coverage: float
               ) -> float | None:
    """The factor the live figures predict for the setting's speedup.

    With tokens per step on both sides and the setting's speedup: a step that drafted costs
    what the measured speedup implies (cost = tokens per step / speedup, split between the
    steps that drafted, share (tps - 1) / (AL - 1) of them, and those that did not, which cost a
    plain decode step); the live speedup is the live tokens per step over the live mix of the
    two. Without the speedup: live / measured tokens per step (else acceptance length), the
    step's cost taken as unchanged."""
    ref_tps, ref_al = e.tokens_per_step, e.acceptance_length
    if tps is not None and ref_tps is not None and ref_tps.value > 0:
        if (e.speedup and ref_al is not None and ref_al.value > 1
                and ref_tps.value > 1):
            share = min(1.0, (ref_tps.value - 1) / (ref_al.value - 1))
            drafted = (ref_tps.value / e.speedup - (1 - share)) / share
            live_cost = coverage * drafted + (1 - coverage)
            if drafted > 0 and live_cost > 0:
                return tps.value / live_cost / e.speedup
        return tps.value / ref_tps.value
    if al is not None and ref_al is not None and ref_al.value > 0:
        return al.value / ref_al.value
    return None


def _row(figure: str, live: Band | None, ref: Band | None, confidence: float, tolerance: float
         ) -> Row:
    if live is None:
        return Row(figure, None, ref, None, "no drafts in these windows")
    if ref is None:
        return Row(figure, live, None, None, "the reference has no such figure")
    return Row(figure, live, ref, verdict(live, ref, confidence, tolerance))


# --------------------------------------------------------------------------------------------
# What is expected


def from_profile(p: AcceptanceProfile, n: int, speedup: float | None = None) -> Expected:
    """A profile at N = n: acceptance length (measured there, else a chain's prediction), the
    first n per-position rates, tokens per step where it was measured at that N."""
    def band(i: Interval | None) -> Band | None:
        return None if i is None else Band.of(i.value, i.lo, i.hi, p.confidence, p.windows)

    return Expected(
        label=f"{p.traffic_class}/{p.drafter} of sweep {p.sweep_id}", n=n,
        acceptance_length=band(p.acceptance_length(n)),
        tokens_per_step=band(p.tokens_per_step) if n == p.n_max else None,
        rates=tuple(b for r in p.rates[:n] if (b := band(r)) is not None), speedup=speedup)


def from_reference(c: ReferenceCurve, n: int, speedup: float | None = None) -> Expected | None:
    """A reference curve at N = n (None: it has no such N)."""
    point = c.at(n)
    if point is None:
        return None
    lo = point.acceptance_length if point.lo is None else point.lo
    hi = point.acceptance_length if point.hi is None else point.hi
    # a published interval's width, read as a 95% normal one
    se = (hi - lo) / (2 * 1.96) if hi > lo else 0.0
    return Expected(label=f"reference {c.name}", n=n, acceptance_length=Band(
        point.acceptance_length, lo, hi, se, 10_000 if se else 0), speedup=speedup)


@dataclass(frozen=True)
class CurveRow:
    """A sweep's measured acceptance length at one N held against a reference curve's."""

    traffic_class: str
    drafter: str
    n: int
    row: Row


def against_reference(found: Sequence[AcceptanceProfile], ref: ReferenceCurve, *,
                      confidence: float = 0.95, tolerance: float = 0.05) -> list[CurveRow]:
    """Every measured N of every profile (of the reference's drafter or method, where it names
    one) that the reference has, held against it."""
    out = []
    for p in found:
        if (ref.drafter and ref.drafter != p.drafter) or (ref.method and ref.method != p.method):
            continue
        for point in p.curve:
            expected = from_reference(ref, point.n)
            if point.measured is None or expected is None or \
                    expected.acceptance_length is None:
                continue
            m = point.measured
            live = Band.of(m.value, m.lo, m.hi, p.confidence, p.windows)
            out.append(CurveRow(p.traffic_class, p.drafter, point.n, Row(
                "acceptance length", live, expected.acceptance_length,
                verdict(live, expected.acceptance_length, confidence, tolerance))))
    return out
