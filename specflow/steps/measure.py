"""Measure one engine config (every missing window on one engine start) and the closing
baseline."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

from specflow.decision.aggregate import to_measure_again
from specflow.decision.capacity import LOAD_FAILURES, dithered, next_step
from specflow.engine import device, vllm_check
from specflow.engine.runner import Window, run_engine
from specflow.engine.server import EngineFailure, EngineStartError, FailureKind
from specflow.records.measurement import AGAIN, STEP, Measurement, WindowKey
from specflow.records.summaries import UnitResult
from specflow.search import rounds
from specflow.search.plan import EngineStart
from specflow.spec.compile import EngineConfig
from specflow.spec.memory import Headroom, headroom
from specflow.steps.context import Context, OnWindow

RETRYABLE_START_FAILURES = frozenset({"start_failed", "hang", "busy_port"})
"""Engine start failures a second attempt can cure (OOM and bad configs cannot)."""


HOST = socket.gethostname()


class DevicesShort(RuntimeError):
    """This worker owns fewer devices than the target's tensor parallel size (another may not)."""


def check_devices(ctx: Context) -> None:
    """Raise DevicesShort when this process's device set cannot hold one engine of the plan."""
    ids, need = device.owned(), ctx.spec.target.tensor_parallel_size
    if ids is not None and len(ids) < need:
        raise DevicesShort(f"this worker owns devices [{','.join(ids)}] ({len(ids)}); "
                           f"target.tensor_parallel_size is {need}: start a worker per {need} "
                           "devices (CUDA_VISIBLE_DEVICES)")


def _failed(ec: EngineConfig, w: Window, failure: str, detail: str,
            start: EngineStart | None = None) -> Measurement:
    """Window `w` of `ec` recorded as failed without being measured (`failure`: why)."""
    m = Measurement(key=w.key(ec), engine=ec.name, drafter=ec.series, method=ec.method,
                    num_speculative_tokens=ec.num_speculative_tokens,
                    traffic_class=w.traffic_class, status="failed", failure=failure,
                    failure_detail=detail)
    return m if start is None else replace(m, seq=start.seq, stage=start.stage,
                                           round=start.round)


def _record_failed(ctx: Context, ec: EngineConfig, windows: Sequence[Window], failure: str,
                   detail: str, start: EngineStart | None = None,
                   on_window: OnWindow | None = None) -> int:
    """Record (and log) each window of `windows` as failed; returns how many."""
    for w in windows:
        m = _failed(ec, w, failure, detail, start)
        ctx.ledger.record(m)
        ctx.log(m)
        if on_window is not None:
            on_window(m)
    return len(windows)


def give_up(ctx: Context, ec: EngineConfig, windows: Sequence[Window], failure: str,
            detail: str, start: EngineStart | None = None) -> int:
    """Record the unfinished windows of `windows` as failed (`failure`): a config that could
    not be measured anywhere. A later run measures them again. Returns how many."""
    finished = ctx.ledger.finished()
    return _record_failed(ctx, ec, [w for w in windows if w.key(ec).id not in finished],
                          failure, detail, start)


def _refused(ec: EngineConfig, windows: Sequence[Window], h: Headroom) -> list[Measurement]:
    return [_failed(ec, w, "refused_by_headroom", "; ".join(h.reasons + h.fixes))
            for w in windows]


def run_config(ctx: Context, ec: EngineConfig, windows: Sequence[Window],
               on_window: OnWindow | None = None, start: EngineStart | None = None
               ) -> UnitResult:
    """Measure the windows of `ec` that are not finished yet; finished ones are not redone.
    With a planned `start`, each window records its place in the run order and its round."""
    finished = done(ctx)
    todo = [replace(w, request_rate=dithered(w.request_rate, w.key(ec).id))
            if w.search and w.request_rate is not None else w
            for w in windows if w.key(ec).id not in finished]
    summary = UnitResult(engine=ec.name, hash=ec.hash, skipped=len(windows) - len(todo))
    todo += steps(ctx, ec, windows)
    if not todo:
        return summary
    h = ctx.headroom[ec.hash]
    if h.fit == "refuse":
        results: Any = _refused(ec, todo, h)
    else:
        if ctx.spec.backend.kind == "local":
            ctx.ledger.engine_started(ec.name, ec.hash, HOST, device.owned())
            summary.started = True
        results = run_engine(ec, ctx.spec.backend, todo, ctx.workdir / "runs", skip=finished,
                             tokenizer=ctx.spec.target.tokenizer or ctx.spec.target.model,
                             again=measure_after(ctx, ec, windows, start))
    t0 = time.monotonic()
    for m in results:
        m = replace(m, prompt_hash=m.prompt_hash or ctx.datasets[m.key.workload].prompt_hash,
                    engine_s=round(time.monotonic() - t0, 3) if summary.started else 0.0)
        if start is not None:
            m = replace(m, seq=start.seq, stage=start.stage, round=start.round)
        ctx.ledger.record(m)
        ctx.log(m)
        if m.ok:
            summary.ok += 1
        else:
            summary.failed += 1
        if on_window is not None:
            on_window(m)
    return summary


def done(ctx: Context) -> set[str]:
    """Windows not to measure again: those that succeeded, and a capacity search's windows that
    failed under their load (a rate that does not hold is the search's answer there)."""
    return {m.key.id for m in ctx.ledger.measurements()
            if m.ok or (m.failure in LOAD_FAILURES and m.searched)}


def to_measure(ctx: Context, ec: EngineConfig, windows: Sequence[Window]) -> list[Window]:
    """What is left of `windows` on `ec`: the unfinished ones and the capacity searches' next
    windows (`steps`)."""
    finished = done(ctx)
    return [w for w in windows if w.key(ec).id not in finished] + steps(ctx, ec, windows)


def steps(ctx: Context, ec: EngineConfig, windows: Sequence[Window]) -> list[Window]:
    """The next window of each capacity search among `windows` that has begun and is not over
    (its rate from `decision.capacity.next_step` on the search's windows in the ledger): what
    the engine start measures after its planned windows, and what a run that was stopped
    mid-search goes on with."""
    promote = ctx.spec.promote
    searching = [w for w in windows if w.search]
    if not searching:
        return []
    found: dict[str, list[Measurement]] = {}
    for m in ctx.ledger.measurements():
        if m.key.engine_hash == ec.hash:
            found.setdefault(m.key.planned.id, []).append(m)
    out = []
    for w in searching:
        ms = sorted(found.get(w.key(ec).id, []), key=lambda m: m.key.step)
        rate = next_step(ms, promote) if ms else None
        if rate is not None:
            out.append(replace(w, request_rate=rate,
                               repeat=w.repeat + STEP * (ms[-1].key.step + 1)))
    return out


def measure_after(ctx: Context, ec: EngineConfig, windows: Sequence[Window],
                  start: EngineStart | None) -> Callable[[Sequence[Measurement]], list[Window]]:
    """What an engine start measures after its planned windows, until there is none: each
    capacity search's next rate (`steps`), and on a racing start, once, right after the planned
    windows, each window outside load slowed (`slowed_again`, as the race's simulation has it)."""
    slowed = [slowed_again(ctx, ec, windows, start)] if start is not None else []

    def pick(measured: Sequence[Measurement]) -> list[Window]:
        return steps(ctx, ec, windows) + (slowed.pop()(measured) if slowed else [])

    return pick


def slowed_again(ctx: Context, ec: EngineConfig, windows: Sequence[Window], start: EngineStart
                  ) -> Callable[[Sequence[Measurement]], list[Window]]:
    """What a racing start measures once more before its engine stops: each of its planned
    windows that outside load slowed (`decision.aggregate.to_measure_again` on the sweep's
    records, this start's windows among them: the caller records each before the next)."""
    planned = {(w.workload, w.concurrency, w.repeat): w for w in windows}

    def pick(measured: Sequence[Measurement]) -> list[Window]:
        if not any(m.ok for m in measured):
            return []
        again = to_measure_again(plan_measurements(ctx), ec.hash, start.start,
                                 ctx.spec.promote)
        return [replace(planned[p], repeat=p[2] + AGAIN) for p in again if p in planned]

    return pick


def measure(ctx: Context, engine_hash: str, on_window: OnWindow | None = None) -> UnitResult:
    """Every opening window of one engine config; raises EngineStartError when a retry may help."""
    ec = ctx.engine(engine_hash)
    summary = run_config(ctx, ec, ctx.windows, on_window)
    if summary.started and summary.ok == 0 and summary.failed:
        kinds = {e.measurement.failure for e in ctx.ledger.entries()
                 if e.measurement.key.engine_hash == ec.hash and not e.measurement.ok}
        if kinds and kinds <= RETRYABLE_START_FAILURES:
            raise EngineStartError(EngineFailure(
                cast(FailureKind, min(kinds)),
                f"engine {ec.name} did not start ({', '.join(sorted(kinds))})"))
    return summary


def run_closing_baseline(ctx: Context, on_window: OnWindow | None = None) -> UnitResult:
    """Measure the baseline again after the candidates (skipped when already done)."""
    ec = ctx.baseline()
    if ec is None or not ctx.spec.sweep.closing_baseline_repeats:
        return UnitResult(engine=None)
    return run_config(ctx, ec, ctx.closing_windows(), on_window)


def missing(ctx: Context) -> list[WindowKey]:
    """Windows the sweep still has to measure: a grid's opening and closing windows without a
    successful measurement; a race's windows of the round still running."""
    finished = done(ctx)
    if ctx.spec.sweep.design == "race":
        current = progress(ctx).current
        return [k for s in current.starts for k in s.window_keys()
                if k.id not in finished] if current is not None else []
    base = ctx.baseline()
    left = [w.key(ec) for ec in ctx.plan.engine_configs for w in to_measure(ctx, ec, ctx.windows)]
    return left + ([w.key(base) for w in to_measure(ctx, base, ctx.closing_windows())]
                   if base is not None else [])


def measurements(ctx: Context) -> list[Measurement]:
    """This plan's opening measurements (latest per point)."""
    keys = {w.key(ec).id for ec in ctx.plan.engine_configs for w in ctx.windows}
    return [m for m in ctx.ledger.measurements() if m.key.planned.id in keys]


def plan_measurements(ctx: Context) -> list[Measurement]:
    """Every window of this plan's engine configs in the ledger (latest per window)."""
    hashes = {ec.hash for ec in ctx.plan.engine_configs}
    return [m for m in ctx.ledger.measurements()
            if m.key.engine_hash in hashes or m.stage == "schedule"]


def refused(ctx: Context) -> frozenset[str]:
    """Engine hashes the headroom check refused."""
    return frozenset(h for h, r in ctx.headroom.items() if r.fit == "refuse")


def progress(ctx: Context) -> rounds.SearchState:
    """The sweep's rounds replayed from the ledger, and the round to run now."""
    return rounds.replay(ctx.shape(), ctx.spec.promote, plan_measurements(ctx), refused(ctx))


def run_start(ctx: Context, seq: int, on_window: OnWindow | None = None) -> UnitResult:
    """Measure the engine start at position `seq` of the current round (nothing when that round
    is over: a retried task finds its windows finished)."""
    return _run_start(ctx, seq, *unit_of(ctx, "start", str(seq)), on_window)


def _run_start(ctx: Context, seq: int, ec: EngineConfig | None, windows: Sequence[Window],
               start: EngineStart | None, on_window: OnWindow | None) -> UnitResult:
    if ec is None or start is None:
        return UnitResult(engine=None, seq=seq)
    if ec.hash not in ctx.headroom:  # an N schedule derived by the race
        ctx.headroom[ec.hash] = headroom(ctx.spec, ec)
        schedule = (ec.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
        error = (vllm_check.check_schedule(schedule, ctx.spec.backend.vllm_command)
                 if schedule else None)
        if error is not None:  # the installed vLLM rejects it: its windows fail, no start
            failed = _record_failed(ctx, ec, windows, "schedule_rejected", error, start,
                                    on_window)
            return UnitResult(engine=ec.name, hash=ec.hash, seq=start.seq, failed=failed)
    summary = run_config(ctx, ec, windows, on_window, start)
    return summary.model_copy(update={"seq": seq, "start": start.start, "stage": start.stage})


def log_round(ctx: Context, progress: rounds.SearchState) -> None:
    """The last finished round's trail on the sweep's MLflow parent run (offline: skipped)."""
    if ctx.tracker is None or ctx.parent_run_id is None or not progress.rounds:
        return
    r = progress.rounds[-1]
    more = progress.current is not None
    status = Counter(b.word(more) for b in r.states)
    metrics = {"race.exploring_bands": status["exploring"],
               "race.confirming_bands": status["confirming"],
               "race.promote_bands": status["promote"], "race.off_bands": status["off"],
               "race.unresolved_bands": status["unresolved"],
               "race.contenders": sum(len(b.contenders) for b in r.states
                                      if b.status == "exploring"),
               "race.engine_starts": r.spent.engine_starts, "race.windows": r.spent.windows,
               "race.engine_seconds": r.spent.engine_seconds}
    names = {ec.hash: ec.name for ec in ctx.plan.engine_configs}
    bands = [f"{b.traffic_class} {b.band} {b.word(more)} "
             f"[{', '.join(names.get(h, h) for h in b.contenders)}]" for b in r.states]
    tags = {f"specflow.round.{r.index}": f"{r.stage}: " + "; ".join(bands)}
    try:
        ctx.tracker.log_round(ctx.parent_run_id, r.index, metrics, tags)
    except Exception as exc:  # noqa: BLE001 - any store failure: the trail is in the report
        ctx.went_offline(exc)


UNIT_KINDS = ("engine", "start", "closing")
"""What one worker measures on one engine start: an engine config's opening windows (grid), a
planned start of the current round (race), or the closing baseline."""


def unit_of(ctx: Context, kind: str, key: str
            ) -> tuple[EngineConfig | None, list[Window], EngineStart | None]:
    """The engine config, windows and planned start of a unit (None, [], None: nothing to do,
    e.g. a start of a round that is over)."""
    if kind == "engine":
        return ctx.engine(key), list(ctx.windows), None
    if kind == "closing":
        base = ctx.baseline()
        if base is None or not ctx.spec.sweep.closing_baseline_repeats:
            return None, [], None
        return base, ctx.closing_windows(), None
    p = progress(ctx)
    current = p.current
    start = next((s for s in current.starts if s.seq == int(key)), None) if current else None
    if start is None:
        return None, [], None
    return p.derived.get(start.engine_hash) or ctx.engine(start.engine_hash), \
        ctx.start_windows(start), start


def run_unit(ctx: Context, kind: str, key: str, on_window: OnWindow | None = None
             ) -> UnitResult:
    """Measure one unit (see UNIT_KINDS) after pushing what an earlier attempt at it left
    unlogged; raises EngineStartError when a retry may help and DevicesShort when this
    worker's device set cannot hold the engine."""
    check_devices(ctx)
    ec, windows, start = unit_of(ctx, kind, key)
    if ec is not None:
        ctx.synced = ctx.push_unlogged({ec.hash})
    if kind == "engine":
        return measure(ctx, key, on_window)
    if kind == "closing":
        return run_closing_baseline(ctx, on_window)
    return _run_start(ctx, int(key), ec, windows, start, on_window)
