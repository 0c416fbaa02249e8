"""Decide and promote: analyse every finished window, check emitted N schedules with the
installed vLLM, write the report, promote per traffic class and mirror champions in MLflow."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specflow.champions import promote
from specflow.decision import beside
from specflow.decision.choose import analyze
from specflow.decision.model import BASELINE_METHOD, Analysis, AnalysisError
from specflow.decision.services import ServiceRouting, routing
from specflow.decision.wording import decision_rows
from specflow.engine import vllm_check
from specflow.records.fsio import atomic_write
from specflow.records.measurement import Measurement
from specflow.records.summaries import ComparisonLine, PromotionLine, SearchCost, SweepSummary
from specflow.results import console, report
from specflow.search import predict, profiles, rounds
from specflow.search.plan import BandKey, final_rules, spent_by, split_baseline
from specflow.search.schedules import measured_schedules
from specflow.spec import profile
from specflow.spec.schema import MixSource
from specflow.steps import measure
from specflow.steps.context import Context, experiment_name
from specflow.steps.measure import measurements, missing
from specflow.steps.revalidate import (
    Revalidation,
    compare_with_previous,
    position_drops,
    regressed_message,
    revalidate,
)


@dataclass
class Decided:
    """What the decision step produced."""

    decided: bool
    problems: list[str]
    report: Path | None
    plots: list[Path]
    promotions: list[promote.Promotion]
    table: list[dict[str, Any]]
    revalidation: Revalidation = dataclasses.field(default_factory=Revalidation)
    """The comparison with the last sweep of the same plan and what the policy did."""
    slowed: tuple[str, ...] = ()
    """Windows left out of the speedups as slowed by outside load (`Analysis.slowed`)."""
    services: tuple[str, ...] = ()
    """Per service and band: its answer beside routing each class to its own champion."""
    realism: tuple[str, ...] = ()
    """What the measured windows show unlike the traffic they replay (`output_realism`)."""
    beside: tuple[str, ...] = ()
    """Per class and band measured for other objectives too: each one's answer beside the
    decision, and whether they agree (`decision.beside.lines`)."""


def _no_decision(ctx: Context, problems: list[str]) -> Decided:
    path = ctx.workdir / "report" / "report.md"
    atomic_write(path, "# specflow decision report\n\nNo decision: the data cannot carry one.\n\n"
                 + "\n".join(f"- {p}" for p in problems) + "\n")
    ctx.ledger.publish([path])
    return Decided(False, problems, path, [], [], [])


def check_schedules(result: Analysis, vllm_command: Sequence[str] | None, vllm_label: str
                    ) -> tuple[Analysis, list[str]]:
    """Drop the classes whose emitted N schedule the installed vLLM rejects (not promoted)."""
    kept, problems = [], []
    for r in result.classes:
        schedule = r.deployment.schedule
        error = vllm_check.check_schedule(schedule, vllm_command) if schedule else None
        if error is None:
            kept.append(r)
        else:
            problems.append(f"{r.traffic_class}: {vllm_label} rejects the emitted "
                            f"num_speculative_tokens_per_batch_size {[list(x) for x in schedule]}"
                            f" ({error}); the class is not promoted")
    return dataclasses.replace(result, classes=tuple(kept)), problems


def windows(ctx: Context) -> tuple[list[Measurement], list[Measurement]]:
    """The windows a decision reads: the opening ones and the baseline's later starts (a grid's
    closing baseline; a race's later baseline starts)."""
    base = ctx.baseline()
    if ctx.spec.sweep.design == "race":
        ms = [m for m in measure.plan_measurements(ctx) if m.stage != "schedule"]
        return split_baseline(ms, base.hash if base is not None else "")
    r0 = ctx.spec.sweep.repeats
    closing = [m for m in ctx.ledger.measurements()
               if base is not None and m.key.engine_hash == base.hash
               and m.key.planned.repeat >= r0]
    return measurements(ctx), closing


def _grid(ctx: Context, opening: list[Measurement], closing: list[Measurement]) -> Analysis:
    """A grid sweep: the opening windows, the closing baseline, Holm over the family."""
    return analyze(opening, ctx.spec.promote, closing_baseline=closing,
                   refused_by_headroom=measure.refused(ctx))


def _raced(ctx: Context, progress: rounds.SearchState, opening: list[Measurement],
           later: list[Measurement]) -> tuple[Analysis, dict[BandKey, Any]]:
    """A racing sweep: every round's windows, decided under the race's final band states."""
    if progress.current is not None:
        left = sum(1 for s in progress.current.starts for k in s.window_keys()
                   if k.id not in ctx.ledger.finished())
        raise AnalysisError([f"round {progress.current.index} is unfinished: {left} "
                                      "windows missing; run the sweep again to finish it"])
    if progress.problems:
        raise AnalysisError(list(progress.problems))
    states = dict(progress.states)
    return analyze(opening, final_rules(ctx.spec.promote), closing_baseline=later,
                   refused_by_headroom=measure.refused(ctx), race=states), states


def analyse(ctx: Context, found: tuple[list[Measurement], list[Measurement]] | None = None
            ) -> tuple[Analysis, rounds.SearchState | None]:
    """The sweep's analysis from its records (`found`: its `windows`, read here when None; a
    racing sweep's rounds replayed); raises AnalysisError when the data cannot carry a
    decision."""
    opening, later = found if found is not None else windows(ctx)
    if ctx.spec.sweep.design == "race":
        progress = measure.progress(ctx)
        return _raced(ctx, progress, opening, later)[0], progress
    return _grid(ctx, opening, later), None


def decide(ctx: Context) -> Decided:
    """Analyse every finished window, write the report and plots, promote per traffic class."""
    opening, later = windows(ctx)
    try:
        result, progress = analyse(ctx, (opening, later))
    except AnalysisError as exc:
        return _no_decision(ctx, list(getattr(exc, "problems", None) or [str(exc)]))
    versus = predict.versus(predict.point_speedups(result), ctx.ledger.measurements(),
                            ctx.plan.engine_configs, kv_capacity=ctx.kv_capacity())
    routed = service_routing(ctx, result)
    others = beside.beside(opening, ctx.spec.promote, later)
    files = report.write_report(result, ctx.workdir / "report",
                                rounds=progress.rounds if progress is not None else (),
                                schedules=progress.schedules if progress is not None else {},
                                measurements=ctx.ledger.measurements(), versus=versus,
                                names={ec.hash: ec.name for ec in ctx.plan.engine_configs},
                                curves=predict.curves(ctx.ledger.measurements(),
                                                      ctx.plan.engine_configs),
                                services=routed, beside=others)
    promotable, problems = check_schedules(result, ctx.spec.backend.vllm_command,
                                           ctx.facts.label)
    if progress is not None:
        promotable, more = measured_schedules(promotable, progress.schedules)
        problems += more
    engines = {ec.hash: ec for ec in ctx.plan.engine_configs}
    champions = {r.traffic_class: promote.champion(ctx.spec.promote.output_dir, r.traffic_class)
                 for r in promotable.classes}
    found = compare_with_previous(ctx)
    promotions = promote.promote_all(
        promotable, engines, ctx.spec.promote, sweep_id=ctx.sid,
        acceptance_drops=position_drops(found[1], champions) if found else None,
        on_promoted=lambda p: _register(ctx, p))
    reval = revalidate(ctx, promotable, champions, promotions, engines, found)
    table = [row for r in result.classes for row in decision_rows(r)]
    acceptance = write_profiles(ctx)
    ctx.ledger.publish([files.report, *files.plots, *acceptance,
                        *([reval.markdown] if reval.markdown else [])])
    if ctx.tracker is not None and ctx.parent_run_id is not None:
        ok = sum(1 for m in ctx.ledger.measurements() if m.ok)
        try:
            ctx.tracker.log_files(ctx.parent_run_id, acceptance, "profiles")
            ctx.tracker.log_summary(ctx.parent_run_id, {
                "windows_ok": ok, "windows_failed": len(ctx.ledger.measurements()) - ok,
                "windows_slowed": len(result.slowed),
                **band_metrics(table), **predict.summary(versus), **_compare_metrics(reval)},
                [files.report, *files.plots, *([reval.markdown] if reval.markdown else [])],
                artifact_path="report")
            if reval.comparison is not None:
                ctx.tracker.set_tags(ctx.parent_run_id, {
                    "specflow.compared_with": reval.previous or "",
                    "specflow.comparison": reval.comparison.summary,
                    **({"specflow.regressed": regressed_message(reval)} if reval.regressed
                       else {})})
            ctx.tracker.set_note(ctx.parent_run_id, report.decision_note(
                f"Decision per traffic class and concurrency band: sweep {ctx.sid}, "
                f"{ctx.plan.target} on {ctx.plan.hardware}", console.decision_lines(table),
                [(p.traffic_class, _champion(p)) for p in promotions]))
        except Exception as exc:  # noqa: BLE001 - any store failure: the report is on disk
            ctx.went_offline(exc)
    return Decided(True, problems, files.report, list(files.plots), promotions, table, reval,
                   tuple(w.text() for w in result.slowed), tuple(s.text() for s in routed),
                   tuple(output_realism(ctx)), tuple(beside.lines(result.classes, others)))


SHORT_OUTPUTS = 0.5
"""A replayed log whose baseline answers average less than this fraction of the recorded
lengths is warned about."""


def output_realism(ctx: Context) -> list[str]:
    """Replayed logs whose answers came out much shorter than the log's: the model stopped early
    (EOS, a stop string), so acceptance was measured on shorter answers than production's."""
    out = []
    for name, ds in ctx.datasets.items():
        recorded = [n for n in ds.recorded_output if n is not None]
        if not recorded:
            continue
        got = [r.output_tokens for m in ctx.ledger.measurements()
               if m.ok and m.method == BASELINE_METHOD and m.key.workload == name
               for r in m.requests]
        logged = sum(recorded) / len(recorded)
        if got and sum(got) / len(got) < SHORT_OUTPUTS * logged:
            out.append(f"workload.{name}: the baseline's answers average "
                       f"{sum(got) / len(got):.0f} tokens; got {len(got)} answers; expected "
                       f"about the log's {logged:.0f} (the model stops earlier than production's "
                       "did: longer answers repeat more, so acceptance may differ)")
    return out


def service_routing(ctx: Context, result: Analysis) -> list[ServiceRouting]:
    """Each service's answer beside routing its classes (`decision.services`), with the
    baseline's measured seconds per request of each class at each level."""
    services = {w.traffic_class or n: dict(w.source.parts) for n, w in ctx.spec.workload.items()
                if isinstance(w.source, MixSource)}
    if not services:
        return []
    per: dict[tuple[str, int], list[float]] = {}
    for m in ctx.ledger.measurements():
        if m.ok and m.method == BASELINE_METHOD and m.completed:
            per.setdefault((m.key.workload, m.key.concurrency), []).append(
                m.duration_s / m.completed)
    seconds = {k: statistics.median(v) for k, v in per.items()}
    classes = {n: w.traffic_class or n for n, w in ctx.spec.workload.items()}
    return routing(result, services, classes, seconds)


def write_profiles(ctx: Context) -> list[Path]:
    """The sweep's acceptance profiles, one file each under report/profiles/ (`python -m
    specflow profile` exports them; an MLflow artifact of the parent run)."""
    found = profiles.build(
        ctx.ledger.measurements(), ctx.pins, sweep_id=ctx.sid,
        temperatures={n: w.temperature for n, w in ctx.spec.workload.items()},
        confidence=ctx.spec.promote.confidence)
    out = []
    for p in found:
        path = ctx.workdir / "report" / "profiles" / profiles.file_name(p)
        atomic_write(path, profile.dumps(p))
        out.append(path)
    return out


def _compare_metrics(r: Revalidation) -> dict[str, float]:
    """The comparison with the previous sweep, charted across re-validations."""
    if r.comparison is None:
        return {}
    return {"compare.regressions": float(len(r.comparison.regressions)),
            "compare.improvements": float(len(r.comparison.improvements)),
            "compare.champion_regressed": float(bool(r.regressed))}


def band_metrics(table: list[dict[str, Any]]) -> dict[str, float]:
    """Per class and band, what is deployed (the winner, or the baseline when off or
    unresolved): `band.<class>.<band>.speedup` with `_lo` / `_hi`, `.N`, `.acceptance_rate`
    and `.outcome` (1 promote, 0 off, -1 unresolved), so the MLflow UI charts each band
    across re-validations."""
    out: dict[str, float] = {}
    for row in table:
        unresolved = row["method"] == BASELINE_METHOD and row["verdict"] == "open"
        if row["verdict"] != "wins" and not unresolved:
            continue
        key = f"band.{row['traffic_class']}.{row['band']}"
        out |= {f"{key}.speedup": row["speedup"], f"{key}.speedup_lo": row["lo"],
                f"{key}.speedup_hi": row["hi"], f"{key}.N": row["N"],
                f"{key}.outcome": -1.0 if unresolved
                else float(row["N"] > 0)}
        if row["acceptance_rate"] is not None:
            out[f"{key}.acceptance_rate"] = row["acceptance_rate"]
    return out


def _champion(p: promote.Promotion) -> str:
    """What a class's champion became, in words."""
    if p.status == "unresolved":
        return "unresolved: the champion is kept as it was"
    if p.status == "refused":
        return f"refused by the regression gate (record: {p.path})"
    return f"{p.status}, version {p.version}: {p.path}"


def _register(ctx: Context, promotion: promote.Promotion) -> None:
    """Mirror a champion in the MLflow model registry; offline is not fatal."""
    if ctx.tracker is None or ctx.parent_run_id is None:
        return
    try:
        ctx.tracker.register_champion(ctx.parent_run_id, promotion, ctx.plan.target,
                                      ctx.plan.hardware)
    except Exception as exc:  # noqa: BLE001 - any store failure: the champion file is in place
        ctx.went_offline(exc)


def _run_link(ctx: Context) -> str | None:
    if ctx.tracker is None or ctx.parent_run_id is None:
        return None
    try:
        return ctx.tracker.run_link(ctx.parent_run_id)
    except Exception as exc:  # noqa: BLE001 - any store failure: the summary goes on without it
        ctx.went_offline(exc)
        return None


def outcome_summary(ctx: Context, outcome: Decided) -> SweepSummary:
    """The sweep's decision for the CLI and the flow's return value."""
    entries = list(ctx.ledger.entries())
    return SweepSummary(
        decided=outcome.decided, problems=outcome.problems,
        report=str(outcome.report) if outcome.report else None,
        plots=[str(p) for p in outcome.plots],
        promotions=[PromotionLine(traffic_class=p.traffic_class, status=p.status,
                                  version=p.version, path=str(p.path))
                    for p in outcome.promotions],
        table=outcome.table,
        windows=len(entries), ok=sum(e.measurement.ok for e in entries),
        slowed=list(outcome.slowed), services=list(outcome.services),
        realism=list(outcome.realism), beside=list(outcome.beside),
        unlogged=sum(not e.logged for e in entries),
        tracking_uri=ctx.spec.tracking.uri, tracking_error=ctx.tracking_error,
        experiment=experiment_name(ctx.loaded), parent_run_id=ctx.parent_run_id,
        run_link=_run_link(ctx),
        missing=[k.id for k in missing(ctx)],
        cost=search_cost(ctx),
        comparison=_comparison(outcome.revalidation),
    )


def _comparison(r: Revalidation) -> ComparisonLine | None:
    if r.comparison is None:
        return None
    return ComparisonLine(previous=r.previous, summary=r.comparison.summary,
                          markdown=str(r.markdown) if r.markdown else None,
                          regressions=len(r.comparison.regressions),
                          champion_regressed=sorted(r.regressed), applied=r.applied,
                          message=regressed_message(r) if r.regressed else None)


def search_cost(ctx: Context) -> SearchCost:
    """Engine starts and windows spent, against what the grid of the same plan costs (every
    engine config started once, its windows at every point, the closing baseline)."""
    sweep = ctx.spec.sweep
    ms = ctx.ledger.measurements()
    base = ctx.baseline()
    if sweep.design != "race" and base is not None:
        # a grid's closing baseline is an engine start of its own, recorded under the opening
        # start's key (its repeats numbered after the opening's)
        closing_ids = {w.key(base).id for w in ctx.closing_windows()}
        ms = [dataclasses.replace(m, key=dataclasses.replace(m.key, start=m.key.start + 1))
              if m.key.id in closing_ids else m for m in ms]
    s = spent_by(ms)
    points = len(ctx.spec.workload) * len(set(sweep.concurrency))
    configs = len(ctx.plan.engine_configs)
    closing = int(sweep.closing_baseline_repeats > 0 and base is not None)
    return SearchCost(search=sweep.search if sweep.design == "race" else "exhaustive",
                      engine_starts=s.engine_starts, windows=s.windows,
                      engine_seconds=round(s.engine_seconds, 1),
                      grid_engine_starts=configs + closing,
                      grid_windows=points * (configs * sweep.repeats
                                             + closing * sweep.closing_baseline_repeats))
