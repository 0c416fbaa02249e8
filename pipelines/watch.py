"""Watch a champion in production as a Prefect flow, and serve it on a schedule.

    python -m pipelines.watch CLASS [--interval SECONDS] [--name NAME] [OVERRIDE ...]

The flow reads the servers (`watch.metrics_url` or `watch.prometheus_url`), holds their windows
against the champion's profile (specflow.steps.watch) and publishes the table as a Prefect table
artifact (key `specflow-watch-<class>`). A drop beyond noise ends the run Failed (an automation
on the Failed state notifies); with `watch.policy=resweep` it first re-sweeps the class's
workloads as a subflow, which alone may replace the champion: nothing is demoted on production
data alone. No traffic ends it Completed, saying so.

Needs a Prefect API for `serve` (as pipelines.deploy); the flow itself runs anywhere.
"""

import argparse
import re
import sys
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from specflow.spec.errors import SpecError, report


class AcceptanceDropped(RuntimeError):
    """The champion's acceptance dropped beyond noise (the flow run's Failed state)."""


def artifact_key(traffic_class: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes."""
    return "specflow-watch-" + re.sub(r"[^a-z0-9-]+", "-", traffic_class.lower()).strip("-")


def resweep_overrides(overrides: list[str], workloads: tuple[str, ...]) -> list[str]:
    """The sweep that re-decides a class after a drop: the watch's own overrides (the experiment,
    the promote settings), its `watch.*` ones left out, measuring the class's workloads only."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("watch.", "workload="))]
    return [*kept, f"workload=[{','.join(workloads)}]"] if workloads else kept


@flow(name="specflow-watch", flow_run_name="watch {traffic_class}", log_prints=True)
def watch_flow(traffic_class: str, overrides: list[str]) -> dict[str, Any]:
    """One watch of a class's champion; Failed when its acceptance dropped beyond noise."""
    from specflow.config.compose import load
    from specflow.steps import watch

    log = get_run_logger()
    spec = load(overrides).spec
    target = watch.resolve(spec, traffic_class)
    got = watch.run(spec, target, lambda w: log.info(watch.window_line(w)))
    line = watch.summary(target, got)
    create_table_artifact(key=artifact_key(traffic_class), table=watch.rows(got),
                          description=line)
    log.info("\n" + watch.table(target, got))
    if got.dropped:
        if spec.watch.policy == "resweep":
            from pipelines.sweep import sweep_flow

            again = resweep_overrides(overrides, target.workloads)
            log.warning("acceptance dropped: re-sweeping %s (%s)", traffic_class, again)
            sweep_flow(again, run_label=f"re-sweep {traffic_class} after a watch")
        raise AcceptanceDropped(line)
    return watch.as_json(target, got)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.watch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traffic_class")
    parser.add_argument("--interval", type=float, default=3600.0,
                        help="seconds between two watches (default 3600)")
    parser.add_argument("--name", default=None, help="deployment name (specflow-watch-CLASS)")
    parser.add_argument("--reconnect-max", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (watch.*, promote.*)")
    args = parser.parse_args(argv)
    from specflow.config.compose import load
    from specflow.steps import watch

    try:
        watch.resolve(load(args.overrides).spec, args.traffic_class)  # refuse before serving
    except SpecError as exc:
        return report(exc, sys.stderr)
    from pipelines.deploy import FIRST_RECONNECT_S, api_problem, api_url, serve_through_outages

    def serve() -> None:
        watch_flow.serve(name=args.name or artifact_key(args.traffic_class),
                         interval=args.interval, limit=1,
                         parameters={"traffic_class": args.traffic_class,
                                     "overrides": args.overrides},
                         tags=["specflow", "watch"],
                         description="Hold a champion's live acceptance against its profile")

    problem = api_problem()
    if problem is not None:
        print(f"Prefect API at {api_url()} unreachable: {problem}", file=sys.stderr)
        return 1
    return serve_through_outages(serve, max(args.reconnect_max, FIRST_RECONNECT_S))


if __name__ == "__main__":
    sys.exit(main())
