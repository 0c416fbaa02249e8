"""Serve the scheduled re-validation deployment of the sweep flow.

    python -m pipelines.deploy [--cron "0 3 * * *"] [--name specflow-revalidate] [OVERRIDE ...]

Needs a Prefect API (`prefect server start`, then PREFECT_API_URL=http://127.0.0.1:4200/api).
Each scheduled run re-runs the sweep: with the same plan and vLLM version every window is
already finished (nothing is re-measured); a new vLLM version or checkpoint revision makes a
new sweep id and the validation is measured again.
"""

from __future__ import annotations

import argparse
import sys

from specflow.core.errors import SpecError, report

DEFAULT_CRON = "0 3 * * *"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.deploy", description=__doc__)
    parser.add_argument("--cron", default=DEFAULT_CRON, help="schedule (default: daily 03:00)")
    parser.add_argument("--name", default="specflow-revalidate", help="deployment name")
    parser.add_argument("--limit", type=int, default=1, help="concurrent runs of this deployment")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the swept config")
    args = parser.parse_args(argv)
    from specflow.config.compose import load_plan

    try:
        load_plan(args.overrides)  # refuse an invalid config before serving it on a schedule
    except SpecError as exc:
        return report(exc, sys.stderr)
    from pipelines.sweep import sweep_flow

    sweep_flow.serve(name=args.name, cron=args.cron, limit=args.limit,
                     parameters={"overrides": args.overrides,
                                 "run_label": " ".join(args.overrides) or "defaults"},
                     tags=["specflow"], description="Re-validate the promoted speculative "
                     "decoding configs on a schedule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
