"""Measure one engine config (every missing window on one engine start) and the closing
baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from specflow.core.compile import EngineConfig
from specflow.core.memory import Headroom
from specflow.core.records import Measurement, PointKey
from specflow.engine.runner import Window, run_engine
from specflow.steps.context import Context, OnPoint

RETRYABLE_START_FAILURES = frozenset({"start_failed", "hang", "busy_port"})
"""Engine start failures a second attempt can cure (OOM and bad configs cannot)."""


class EngineStartFailed(RuntimeError):
    """The engine config's engine did not start; its windows are recorded as failed."""


def _refused(ec: EngineConfig, windows: Sequence[Window], h: Headroom) -> list[Measurement]:
    return [Measurement(key=w.key(ec), engine=ec.name, drafter=ec.drafter, method=ec.method,
                        num_speculative_tokens=ec.num_speculative_tokens,
                        traffic_class=w.traffic_class, status="failed",
                        failure="refused_by_headroom",
                        failure_detail="; ".join(h.reasons + h.fixes)) for w in windows]


def run_config(ctx: Context, ec: EngineConfig, windows: Sequence[Window],
               on_point: OnPoint | None = None) -> dict[str, Any]:
    """Measure the windows of `ec` that are not finished yet; finished ones are not redone."""
    finished = ctx.ledger.finished()
    todo = [w for w in windows if w.key(ec).id not in finished]
    summary = {"engine": ec.name, "hash": ec.hash, "skipped": len(windows) - len(todo),
               "ok": 0, "failed": 0, "started": False}
    if not todo:
        return summary
    h = ctx.headroom[ec.hash]
    if h.verdict == "refuse":
        results: Any = _refused(ec, todo, h)
    else:
        if ctx.spec.backend.kind == "local":
            ctx.ledger.event("engine_start", engine=ec.name, hash=ec.hash)
            summary["started"] = True
        results = run_engine(ec, ctx.spec.backend, todo, ctx.workdir / "runs", skip=finished,
                             tokenizer=ctx.spec.target.tokenizer or ctx.spec.target.model)
    for m in results:
        m = replace(m, prompt_hash=m.prompt_hash or ctx.datasets[m.key.workload].prompt_hash)
        ctx.ledger.record(m)
        ctx.log(m)
        summary["ok" if m.ok else "failed"] += 1
        if on_point is not None:
            on_point(m)
    return summary


def measure(ctx: Context, engine_hash: str, on_point: OnPoint | None = None) -> dict[str, Any]:
    """Every opening window of one engine config; raises EngineStartFailed when a retry may help."""
    ec = ctx.engine(engine_hash)
    summary = run_config(ctx, ec, ctx.windows, on_point)
    if summary["started"] and summary["ok"] == 0 and summary["failed"]:
        kinds = {e.measurement.failure for e in ctx.ledger.entries()
                 if e.measurement.key.engine_hash == ec.hash and not e.measurement.ok}
        if kinds and kinds <= RETRYABLE_START_FAILURES:
            raise EngineStartFailed(f"engine {ec.name} did not start ({', '.join(sorted(kinds))})")
    return summary


def run_closing_baseline(ctx: Context, on_point: OnPoint | None = None) -> dict[str, Any]:
    """Measure the baseline again after the candidates (skipped when already done)."""
    ec = ctx.baseline()
    if ec is None or not ctx.spec.sweep.closing_baseline_repeats:
        return {"engine": None, "skipped": 0, "ok": 0, "failed": 0, "started": False}
    return run_config(ctx, ec, ctx.closing_windows(), on_point)


def missing(ctx: Context) -> list[PointKey]:
    """Opening windows of the plan without a successful measurement."""
    finished = ctx.ledger.finished()
    return [w.key(ec) for ec in ctx.plan.engine_configs for w in ctx.windows
            if w.key(ec).id not in finished]


def measurements(ctx: Context) -> list[Measurement]:
    """This plan's opening measurements (latest per point)."""
    keys = {w.key(ec).id for ec in ctx.plan.engine_configs for w in ctx.windows}
    return [m for m in ctx.ledger.measurements() if m.key.id in keys]
