"""Engine configs fanned out to a Prefect work pool: one flow run of the engine-config
deployment per engine start, on whichever worker is free; each worker owns a device set.

The sweep flow (`pipelines.sweep`) submits a round's units with `run_deployment` (linked to it
as subflow runs, so the Prefect UI shows them under the sweep), then reads their states until
each has ended. A unit's worker renews a lease in the sweep's ledger while it measures; a
running unit whose lease is older than `dispatch.lease_s` lost its worker (a killed process, a
dead node): the sweep sets its flow run Crashed and submits the unit again, like one that
crashed or failed, up to `dispatch.retries` times. The worker writes every window to the
shared ledger and to MLflow itself; a resubmitted unit measures only the windows the ledger
does not hold, so nothing is measured or logged twice. A unit that could not be measured
anywhere has its missing windows recorded as failed (`worker_lost`, `no_worker`) and the sweep
goes on to its decision, which says what is missing. A sweep that stops (Ctrl-C, SIGTERM)
cancels the flow runs it has in flight; their leases' fence stops their engines.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import PrefectHTTPStatusError
from prefect.runtime import flow_run as this_run
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from prefect.states import Cancelled, Crashed
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_fixed,
)

from specflow import steps
from specflow.engine.device import owned
from specflow.engine.server import die_with_parent
from specflow.results import console
from specflow.results.ledger import renew_lease

ENGINE_FLOW = "specflow-engine-config"
WAITING = frozenset({"SCHEDULED", "PAUSED"})
"""Submitted, no worker has taken it yet (a late run stays SCHEDULED)."""
T = TypeVar("T")


@dataclass(frozen=True)
class Unit:
    """One engine start a worker measures (see steps.UNIT_KINDS)."""

    kind: str
    key: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.key}"


@dataclass
class _Submitted:
    unit: Unit
    run: FlowRun
    attempt: int
    submitted: float = field(default_factory=time.time)


@contextmanager
def _lease(path: str, every_s: float, **fields: Any) -> Iterator[None]:
    """Renew the lease at `path` every `every_s` seconds until the block ends. The lease is
    also a fence: once this flow run is no longer RUNNING (the sweep declared it lost and set
    it Crashed, or a person cancelled it), this process stops itself (SIGTERM: its engine is
    stopped), so a unit submitted again is never measured twice at once."""
    stop = threading.Event()
    run_id = fields.get("flow_run_id")

    def renew() -> None:
        while not stop.wait(every_s):
            try:
                renew_lease(path, **fields)
            except Exception as exc:  # noqa: BLE001 - the store unreachable: the next tick tries
                print(f"lease not renewed ({' '.join(str(exc).split())[:200]}); trying again")
            if run_id and not _still_running(run_id, max(every_s, 1.0)):
                print(f"flow run {run_id} is no longer running: stopping this engine config")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    renew_lease(path, **fields)
    thread = threading.Thread(target=renew, name="specflow-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_s + 5)


def _still_running(run_id: str, timeout_s: float) -> bool:
    """Whether the API says this flow run is RUNNING (True when the API cannot be reached: an
    outage must not stop a measurement; the sweep decides what is lost). One try, at most
    `timeout_s`: the lease it shares a thread with must not wait on the client's retries."""
    try:
        with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), \
                get_client(sync_client=True, httpx_settings={"timeout": timeout_s}) as client:
            state = client.read_flow_run(run_id).state
    except Exception:  # noqa: BLE001 - unreachable API, timeouts: keep measuring
        return True
    return state is None or state.type.value in ("RUNNING", "PENDING")


def _die_with_worker() -> None:
    """A worker's flow-run process ends with its worker (SIGTERM: its engine is stopped), so a
    killed worker leaves no run measuring without anyone watching it."""
    if os.environ.get("PREFECT__FLOW_RUN_ID"):
        die_with_parent()
        if os.getppid() == 1:  # the worker died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)


@flow(name=ENGINE_FLOW, flow_run_name="{kind} {engine_name}", log_prints=True)
def engine_config_flow(overrides: list[str], kind: str, key: str, engine_name: str = "",
                       lease: str = "", lease_every_s: float = 20.0) -> steps.UnitResult:
    """Measure one unit of a sweep on this worker's device set (CUDA_VISIBLE_DEVICES),
    renewing its lease (a file in the sweep's ledger) from the first moment."""
    _die_with_worker()
    if kind not in steps.UNIT_KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {', '.join(steps.UNIT_KINDS)}")
    devices = owned()
    host = socket.gethostname()
    run_id = this_run.get_id()
    shown = ",".join(devices) if devices is not None else "all"
    with _lease(lease, lease_every_s, flow_run_id=str(run_id) if run_id else None, host=host,
                devices=devices) if lease else nullcontext():
        if run_id is not None:
            with get_client(sync_client=True) as client:
                current = client.read_flow_run(run_id)
                client.update_flow_run(run_id, tags=[*current.tags, f"host:{host}",
                                                     f"devices:{shown}"])
        ctx = steps.open_sweep(overrides, sync=False)
        print(f"engine start: {engine_name} on {host}, devices {shown}")
        summary = steps.run_unit(ctx, kind, key, lambda m: print(console.window_line(m)))
    return summary.model_copy(update={"host": host, "flow_run_id": str(run_id),
                                      "devices": list(devices) if devices is not None else None})


def fan_out(overrides: Sequence[str], units: Sequence[Unit], tags: Sequence[str] = (),
            on_window: steps.OnWindow | None = None) -> list[steps.UnitResult]:
    """Submit `units` to the engine-config deployment, wait for all, submit again what crashed,
    failed or lost its worker; give up on a unit after `dispatch.retries` resubmissions. Returns
    one summary per unit (its last flow run, state, attempts). `on_window` is called with each
    window the workers record meanwhile (read from the shared ledger)."""
    ctx = steps.open_sweep(overrides, tracking=False)
    d = ctx.spec.dispatch
    log = get_run_logger()
    name = d.deployment
    assert name is not None  # the sweep fans out only with a deployment

    def submit(unit: Unit, attempt: int) -> _Submitted:
        run = _patiently(lambda: run_deployment(
            name, parameters={"overrides": list(overrides), "kind": unit.kind, "key": unit.key,
                              "engine_name": unit.name,
                              "lease": str(ctx.ledger.lease_path(unit.id)),
                              "lease_every_s": d.lease_s / 6},
            timeout=0, tags=["specflow", *tags, f"attempt:{attempt}"],
            job_variables=dict(d.job_variables) or None,
            idempotency_key=f"{parent}/{unit.id}/{attempt}"),
            f"submitting {unit.kind} {unit.name}", d)
        log.info("submitted %s %s (attempt %d): flow run %s", unit.kind, unit.name, attempt,
                 run.name)
        return _Submitted(unit, run, attempt)

    def measured(unit: Unit) -> bool:
        ec, windows, _ = steps.unit_of(ctx, unit.kind, unit.key)
        return ec is None or not steps.to_measure(ctx, ec, windows)

    parent = this_run.get_id() or "local"
    todo = [submit(u, 0) for u in units if not measured(u)]
    done: list[steps.UnitResult] = []
    seen = {e.measurement.key.id: e.measurement for e in ctx.ledger.entries()}
    failing_since: float | None = None
    with get_client(sync_client=True) as client:
        try:
            while todo:
                time.sleep(d.poll_s)
                if on_window is not None:
                    seen = _report_new(ctx, seen, on_window)
                todo, error = _poll(ctx, client, todo, done, submit, d)
                failing_since = None if error is None else failing_since or time.monotonic()
                if failing_since is not None and time.monotonic() - failing_since > \
                        d.server_grace_s:
                    raise RuntimeError(_gave_up(error, d))
        except BaseException:  # Ctrl-C, SIGTERM, a bug: nothing measures on without the sweep
            for s in todo:
                try:
                    client.set_flow_run_state(s.run.id, Cancelled(
                        message="the sweep that submitted it stopped"), force=True)
                except Exception as exc:  # noqa: BLE001 - the API is down: its lease fence
                    if not _transient(exc):  # stops it once the API answers again
                        raise
                    log.error("could not cancel flow run %s: %s", s.run.name, _short(exc))
            raise
    if on_window is not None:
        _report_new(ctx, seen, on_window)
    return done


def _poll(ctx: Any, client: Any, todo: list[_Submitted], done: list[steps.UnitResult],
          submit: Any, d: Any) -> tuple[list[_Submitted], Exception | None]:
    """One look at every unit in flight: the ones still in flight (resubmitted ones too), and
    the last server error of this look (its units are looked at again next time)."""
    log = get_run_logger()
    still, error = [], None
    for s in todo:
        try:
            run = client.read_flow_run(s.run.id)
            state = run.state.type.value if run.state is not None else "SCHEDULED"
            problem = _problem(ctx, client, s, run, state, d)
            if state == "COMPLETED":
                done.append(_summary(ctx, s, run, state))
            elif problem is None:
                still.append(s)
            elif problem[0] == "no_worker" or s.attempt >= d.retries:
                done.append(_abandon(ctx, s, run, *problem))
            else:
                log.warning("%s %s: %s; submitting it again", s.unit.kind, s.unit.name,
                            problem[1])
                still.append(submit(s.unit, s.attempt + 1))
        except Exception as exc:  # noqa: BLE001 - only a server's hiccup is waited out
            if not _transient(exc):
                raise
            log.warning("%s %s: the Prefect API failed (%s); looking again in %g s",
                        s.unit.kind, s.unit.name, _short(exc), d.poll_s)
            still.append(s)
            error = exc
    return still, error


def _transient(exc: BaseException) -> bool:
    """A Prefect API hiccup worth waiting out: a server error (503 is a busy database), a
    timeout, a refused or dropped connection. Prefect's client has retried it already."""
    if isinstance(exc, PrefectHTTPStatusError):
        code = exc.response.status_code
        return code >= 500 or code in (408, 429)
    return isinstance(exc, httpx.TransportError)


def _short(exc: BaseException) -> str:
    if isinstance(exc, PrefectHTTPStatusError):
        return f"{exc.response.status_code} {exc.response.reason_phrase} from {exc.request.url}"
    return f"{type(exc).__name__}: {exc}"


def _gave_up(error: BaseException | None, d: Any) -> str:
    return (f"the Prefect API failed every call for over dispatch.server_grace_s="
            f"{d.server_grace_s:g} s (last: {_short(error) if error else 'unknown'}); the "
            "windows finished so far are in the ledger and are not measured again on resume")


def _patiently(call: Callable[[], T], what: str, d: Any) -> T:
    """`call()`, again every dispatch.poll_s while the API fails with a hiccup (idempotent
    calls only), for up to dispatch.server_grace_s; any other error is raised at once."""

    def say(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        get_run_logger().warning("%s: the Prefect API failed (%s); trying again in %g s",
                                 what, _short(error) if error else "?", d.poll_s)

    retrying = Retrying(retry=retry_if_exception(_transient), wait=wait_fixed(d.poll_s),
                        stop=stop_after_delay(d.server_grace_s), before_sleep=say)
    try:
        return retrying(call)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise RuntimeError(f"{what}: {_gave_up(last, d)}") from last


def _report_new(ctx: Any, seen: dict[str, Any], on_window: steps.OnWindow) -> dict[str, Any]:
    """Call `on_window` with each window recorded (or recorded again) since `seen`."""
    now = {e.measurement.key.id: e.measurement for e in ctx.ledger.entries()}
    for window_id, m in now.items():
        if seen.get(window_id) != m:
            on_window(m)
    return now


def _problem(ctx: Any, client: Any, s: _Submitted, run: FlowRun, state: str, d: Any
             ) -> tuple[str, str] | None:
    """Why a unit's flow run needs resubmitting or abandoning (None: let it go on)."""
    now = time.time()
    if state in ("FAILED", "CRASHED", "CANCELLED"):
        message = run.state.message if run.state is not None else ""
        return "worker_lost" if state == "CRASHED" else "dispatch_failed", \
            f"flow run {run.name} {state.lower()}: {message or 'no message'}"
    if state in WAITING:
        if now - s.submitted > d.wait_s:
            client.set_flow_run_state(run.id, Cancelled(message="no worker took it within "
                                                        f"dispatch.wait_s={d.wait_s:g} s"),
                                      force=True)
            return "no_worker", f"no worker took flow run {run.name} within {d.wait_s:g} s"
        return None
    since = run.state.timestamp.timestamp() if run.state is not None else s.submitted
    if state == "PENDING":  # a worker took it; its process (pod, image) is starting
        limit, field, what = d.start_s, "start_s", "taken by a worker but not running after"
    elif state == "RUNNING":
        lease = ctx.ledger.lease(s.unit.id)
        if lease is not None and lease.flow_run_id == str(run.id):
            since = max(since, lease.t)
        limit, field, what = d.lease_s, "lease_s", "no lease renewal for"
    else:
        return None
    if now - since <= limit:
        return None
    message = f"worker lost: {what} {now - since:.0f} s (dispatch.{field}={limit:g})"
    client.set_flow_run_state(run.id, Crashed(message=message), force=True)
    return "worker_lost", f"flow run {run.name}: {message}"


def _summary(ctx: Any, s: _Submitted, run: FlowRun, state: str, **more: Any
             ) -> steps.UnitResult:
    lease = ctx.ledger.lease(s.unit.id)
    devices = lease.devices if lease is not None else None
    return steps.UnitResult(engine=s.unit.name, kind=s.unit.kind, key=s.unit.key,
                            flow_run=run.name, flow_run_id=str(run.id), state=state,
                            attempts=s.attempt + 1,
                            host=lease.host if lease is not None else None,
                            devices=list(devices) if devices is not None else None, **more)


def _abandon(ctx: Any, s: _Submitted, run: FlowRun, failure: str, detail: str
             ) -> steps.UnitResult:
    """Record the unit's missing windows as failed: measured nowhere after every attempt."""
    opened = steps.open_sweep(ctx.overrides, sync=False)  # other units may be logging now
    ec, windows, start = steps.unit_of(opened, s.unit.kind, s.unit.key)
    recorded = 0
    if ec is not None:
        recorded = steps.give_up(opened, ec, windows, failure,
                                 f"{detail} (after {s.attempt + 1} attempts)", start)
    get_run_logger().error("%s %s given up after %d attempts: %s; %d windows recorded as "
                           "failed", s.unit.kind, s.unit.name, s.attempt + 1, detail, recorded)
    return _summary(ctx, s, run, "ABANDONED", error=detail, recorded_failed=recorded)
