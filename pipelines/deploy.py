"""Serve the scheduled re-validation deployment of the sweep flow.

    python -m pipelines.deploy [--cron "0 3 * * *"] [--name specflow-revalidate] [OVERRIDE ...]

Needs a Prefect API (`prefect server start`, then PREFECT_API_URL=http://127.0.0.1:4200/api).
Each scheduled run re-runs the sweep: with the same plan and vLLM version every window is
already finished (nothing is re-measured); a new vLLM version or checkpoint revision makes a
new sweep id and the validation is measured again.

An API outage does not end the serving. Prefect's runner stops polling after a few failed
polls in a row (it raises out of `serve`); a flow run in flight goes on measuring without the
API (task states are events, the windows go to the ledger) and only fails to report its end.
This entry point then waits for that run to end (two sweeps never run at once), says on stderr
`Prefect API at URL unreachable; serving again in N s`, checks the API with a capped backoff
(`--reconnect-max`) and serves again once it answers: the next run measures only what the
ledger is missing. Ctrl-C and SIGTERM stop it (exit 0); an invalid config exits 2 and an API
that does not answer at start-up exits 1, both before anything is served.
"""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from specflow.spec.errors import SpecError, report

DEFAULT_CRON = "0 3 * * *"
FIRST_RECONNECT_S = 2.0
"""The first wait before the API is checked again after an outage; each failed check doubles
it, up to `--reconnect-max`."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cron", default=DEFAULT_CRON, help="schedule (default: daily 03:00)")
    parser.add_argument("--name", default="specflow-revalidate", help="deployment name")
    parser.add_argument("--limit", type=int, default=1, help="concurrent runs of this deployment")
    parser.add_argument("--reconnect-max", type=float, default=60.0, metavar="SECONDS",
                        help="longest wait between two checks of an unreachable API (default 60)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the swept config")
    args = parser.parse_args(argv)
    from specflow.config.compose import load_plan

    try:
        load_plan(args.overrides)  # refuse an invalid config before serving it on a schedule
    except SpecError as exc:
        return report(exc, sys.stderr)
    from pipelines.sweep import sweep_flow

    def serve() -> None:
        sweep_flow.serve(name=args.name, cron=args.cron, limit=args.limit,
                         parameters={"overrides": args.overrides,
                                     "run_label": " ".join(args.overrides) or "defaults"},
                         tags=["specflow"], description="Re-validate the promoted speculative "
                         "decoding configs on a schedule")

    problem = api_problem()
    if problem is not None:
        print(f"Prefect API at {api_url()} unreachable: {problem}", file=sys.stderr)
        return 1
    return serve_through_outages(serve, max(args.reconnect_max, FIRST_RECONNECT_S))


def serve_through_outages(serve: Callable[[], None], reconnect_max: float) -> int:
    """`serve()` again after each API outage that stopped it; 0 once it returns (Ctrl-C) or on
    SIGTERM. Any other error propagates."""
    while True:
        try:
            serve()  # returns on Ctrl-C; Prefect's SIGTERM handler exits 0 itself
            return 0
        except Exception as exc:
            cause = _outage_cause(exc)
            if cause is None:
                raise
            reason = _one_line(cause)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the dead runner's handler
        try:
            _wait_for_runs_in_flight(reason)
            _until_api_answers(reconnect_max)
        except (KeyboardInterrupt, SystemExit):
            _stop_runs_in_flight()
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)


def _until_api_answers(reconnect_max: float) -> None:
    """Check the API until it answers, waiting FIRST_RECONNECT_S after the first failed check
    and twice as long after each next one, up to `reconnect_max`."""
    from tenacity import RetryCallState, Retrying, retry_if_result, wait_exponential

    def say(state: RetryCallState) -> None:
        why = state.outcome.result() if state.outcome else "?"
        wait = state.next_action.sleep if state.next_action else 0.0
        print(f"Prefect API at {api_url()} unreachable ({why}); serving again in {wait:g} s",
              file=sys.stderr, flush=True)

    Retrying(retry=retry_if_result(lambda problem: problem is not None),
             wait=wait_exponential(multiplier=FIRST_RECONNECT_S, max=reconnect_max),
             before_sleep=say)(api_problem)


def _wait_for_runs_in_flight(reason: str) -> None:
    """Wait for the flow runs the stopped runner left running (its subprocesses): a run goes
    on measuring without the API, and serving again meanwhile could start a second sweep."""
    runs = multiprocessing.active_children()
    if runs:
        print(f"Prefect API at {api_url()} unreachable ({reason}); waiting for "
              f"{len(runs)} flow run(s) in flight (pid {', '.join(str(p.pid) for p in runs)}) "
              "to end before serving again", file=sys.stderr, flush=True)
    for run in runs:
        run.join()


def _stop_runs_in_flight() -> None:
    """Stop what `_wait_for_runs_in_flight` waited for (SIGTERM: the flow run stops its
    engines), so that stopping the serving does not hang on them."""
    runs = multiprocessing.active_children()
    for run in runs:
        run.terminate()
    for run in runs:
        run.join(timeout=60)
        if run.is_alive():
            run.kill()


def _exit_on_sigterm(_signum: int, _frame: Any) -> NoReturn:
    raise SystemExit(0)


def _outage_cause(exc: BaseException) -> BaseException | None:
    """The error in `exc` (its causes, its grouped exceptions) that says the API is unreachable
    or failing (a transport error, a 5xx); None for a real error (a bug, a 4xx, a bad config)."""
    import httpx

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, httpx.TransportError) or (
                isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500):
            return e
        if isinstance(e, RuntimeError) and str(e) == "Service exceeded error threshold.":
            return e  # prefect.utilities.services.critical_service_loop gave up polling
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or "(ephemeral)"


def api_problem() -> str | None:
    """None when the Prefect API answers its health check, else what went wrong."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        error = client.api_healthcheck()
    return None if error is None else _one_line(error)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


if __name__ == "__main__":
    sys.exit(main())
