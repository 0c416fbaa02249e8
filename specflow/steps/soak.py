"""The soak (`sweep.soak`, off by default): one engine measured window after window for a set
time, and the trend of its throughput and acceptance length over that time. Drift within one
engine's life (acceptance falling over hours of serving until a restart, vLLM issue 41838) is
invisible to a sweep whose engine starts last minutes.

The windows go to `soak/windows.jsonl` in the sweep directory, not into the ledger: they are
not part of any decision. A sweep whose soak report exists does not soak again on resume.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel

from specflow.engine.runner import run_engine
from specflow.records.fsio import atomic_write
from specflow.records.measurement import Measurement
from specflow.spec.compile import EngineConfig
from specflow.stats.trend import Trend, log_trend
from specflow.steps.context import Context, OnWindow

SOAK_REPEAT_BASE = 100_000
"""Soak windows' repeat indices start here (their cache salts differ from the sweep's)."""
HOURLY_FROM_S = 600.0
"""A soak this long or longer also states its trend per hour (a shorter one would extrapolate)."""
MAX_WINDOWS = 10_000
"""Windows planned for a soak; it stops at its duration long before (a window of seconds on the
CPU engine, tens of seconds on a GPU node)."""


@dataclass(frozen=True)
class SoakResult:
    engine: str
    windows: int
    failed: int
    span_s: float
    trends: dict[str, Trend | None]
    """`throughput` and, for a speculative engine, `acceptance length`."""
    findings: dict[str, str]
    report: Path

    def lines(self) -> list[str]:
        return [f"soak of {self.engine}: {self.windows} windows over {self.span_s:.0f} s "
                f"({self.failed} failed)"] + [f"  {k}: {v}" for k, v in self.findings.items()]


class SoakRecord(BaseModel):
    """One line of the soak's `windows.jsonl`: a window and its end time from the first's."""

    t_s: float
    window: Measurement


def soak_engine(ctx: Context) -> EngineConfig:
    """The engine to soak: `sweep.soak.engine` by name, else the first speculative one."""
    name = ctx.spec.sweep.soak.engine if ctx.spec.sweep.soak else None
    configs = ctx.plan.engine_configs
    found = [ec for ec in configs if ec.name == name] if name else [
        ec for ec in configs if ec.method != "none"] or list(configs)
    return found[0]  # the plan's checks name a soak engine that is not one of its configs


def finding(trend: Trend | None, alpha: float, tolerance: float) -> str:
    """A trend in words: beyond noise (its p-value below `alpha`) and larger than `tolerance`
    over the soak, or not."""
    if trend is None:
        return "too few windows for a trend"
    hourly = (f", {trend.per_hour:+.1%} per hour [{trend.lo:+.1%}, {trend.hi:+.1%}]"
              if trend.span_s >= HOURLY_FROM_S else "")
    text = (f"{trend.over_run:+.1%} over {trend.span_s:.0f} s [{trend.run_lo:+.1%}, "
            f"{trend.run_hi:+.1%}]{hourly} ({trend.n} windows)")
    beyond = trend.p < alpha and abs(trend.over_run) > tolerance
    if not beyond:
        return f"no trend beyond noise: {text}"
    return f"{'falling' if trend.over_run < 0 else 'rising'} beyond noise: {text}"


def analyse(ms: Sequence[Measurement], t_s: Sequence[float], confidence: float,
            tolerance: float) -> tuple[dict[str, Trend | None], dict[str, str]]:
    """Trends of throughput and acceptance length against each window's end time; the series
    are one family (Bonferroni), so a steady engine is flagged in at most 1 - `confidence` of
    soaks."""
    ok = [(t, m) for t, m in zip(t_s, ms, strict=True) if m.ok and m.output_throughput > 0]
    trends: dict[str, Trend | None] = {
        "throughput": log_trend([t for t, _ in ok], [m.output_throughput for _, m in ok],
                                confidence)}
    with_al = [(t, m.mean_acceptance_length) for t, m in ok if m.mean_acceptance_length]
    if with_al:
        trends["acceptance length"] = log_trend([t for t, _ in with_al],
                                                [a for _, a in with_al if a], confidence)
    alpha = (1 - confidence) / len(trends)  # Bonferroni over the soak's series
    return trends, {k: finding(v, alpha, tolerance) for k, v in trends.items()}


def run_soak(ctx: Context, on_window: OnWindow | None = None) -> SoakResult | None:
    """Soak one engine for `sweep.soak.duration_s` (None when no soak is configured); a soak
    already reported is read back, not run again."""
    soak = ctx.spec.sweep.soak
    if soak is None:
        return None
    ec = soak_engine(ctx)
    out = ctx.workdir / "soak"
    records = out / "windows.jsonl"
    if (out / "soak.md").is_file() and records.is_file():
        rows = [SoakRecord.model_validate_json(line)
                for line in records.read_text().splitlines() if line]
        return _result(ctx, ec, [r.window for r in rows], [r.t_s for r in rows], out)
    workload = soak.workload or next(iter(ctx.spec.workload))
    level = soak.concurrency or max(ctx.spec.sweep.concurrency)
    base = next(w for w in ctx.windows if w.workload == workload and w.concurrency == level)
    windows = [replace(base, repeat=SOAK_REPEAT_BASE + i, start=0) for i in range(MAX_WINDOWS)]
    out.mkdir(parents=True, exist_ok=True)
    records.unlink(missing_ok=True)
    ms: list[Measurement] = []
    t_s: list[float] = []
    runs = run_engine(ec, ctx.spec.backend, windows, out)
    t0: float | None = None
    try:
        for m in runs:
            now = time.monotonic()
            t0 = now if t0 is None else t0  # the clock starts at the first window's end
            ms.append(m)
            t_s.append(now - t0)
            with records.open("a", encoding="utf-8") as fh:
                fh.write(SoakRecord(t_s=t_s[-1], window=m).model_dump_json() + "\n")
            if on_window is not None:
                on_window(m)
            if t_s[-1] >= soak.duration_s or not m.ok:  # a failed window ends the soak
                break
    finally:
        runs.close()  # stops the engine
    return _result(ctx, ec, ms, t_s, out)


def _result(ctx: Context, ec: EngineConfig, ms: list[Measurement], t_s: list[float],
            out: Path) -> SoakResult:
    promote = ctx.spec.promote
    trends, findings = analyse(ms, t_s, promote.confidence, promote.tie_tolerance)
    report = out / "soak.md"
    lines = [f"# Soak of {ec.name}", "",
             f"{len(ms)} windows, one engine start, over {t_s[-1] if t_s else 0:.0f} s; the "
             f"trend of each series against time, {promote.confidence:.0%} interval, a change "
             f"beyond noise and over {promote.tie_tolerance:.0%} across the soak flagged.", ""]
    lines += [f"- {k}: {v}" for k, v in findings.items()]
    lines += ["", "| window | t (s) | output tok/s | acceptance length |", "|---|---|---|---|"]
    lines += [f"| {i} | {t:.0f} | {m.output_throughput:.1f} | "
              f"{m.mean_acceptance_length or '-'} |" for i, (t, m) in enumerate(zip(t_s, ms,
                                                                                    strict=True))]
    atomic_write(report, "\n".join(lines) + "\n")
    return SoakResult(ec.name, len(ms), sum(not m.ok for m in ms), t_s[-1] if t_s else 0.0,
                      trends, findings, report)
