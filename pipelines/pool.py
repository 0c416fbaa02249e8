"""Register the engine-config deployment on a Prefect work pool (created when missing).

    python -m pipelines.pool deploy [--pool gpu] [--slots N] [--source DIR]

Then start one worker per device set, each owning its devices:

    CUDA_VISIBLE_DEVICES=0 prefect worker start --pool gpu --type process --limit 1 --name gpu-0

and run a sweep with `dispatch.deployment=specflow-engine-config/<pool>` (README, "Many GPUs").
`--slots` sets the pool's concurrency limit (the number of device sets, so at most one engine
per device set runs even if a worker is started without `--limit 1`). Needs a Prefect API
(PREFECT_API_URL); exits 1 when it does not answer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "pipelines/dispatch.py:engine_config_flow"


def ensure_pool(name: str, slots: int | None) -> str:
    """The process work pool `name`, created with the process worker's base job template when
    missing; its concurrency limit set to `slots` when given. Returns what was done."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
            did = f"work pool {name!r} ({pool.type}) exists"
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=name, type="process", concurrency_limit=slots,
                base_job_template=ProcessWorker.get_default_base_job_template()))
            return f"work pool {name!r} (process) created" + (
                f", {slots} slots" if slots else "")
        if slots is not None:
            client.update_work_pool(name, WorkPoolUpdate(concurrency_limit=slots))
            did += f", {slots} slots"
        return did


def deploy(pool: str, source: Path, image: str | None = None) -> str:
    """The engine-config deployment `specflow-engine-config/<pool>` on `pool`; its id. With
    `image`, the workers run the flow from that image (a Kubernetes pool: the checkout is in
    the image, nothing is built or pushed here); without, from the checkout at `source`."""
    from pipelines.dispatch import engine_config_flow

    about = {"name": pool, "work_pool_name": pool, "print_next_steps": False,
             "tags": ["specflow"],
             "description": "One engine config of a specflow sweep, measured on this worker's "
                            "device set"}
    if image is not None:
        return str(engine_config_flow.deploy(image=image, build=False, push=False,
                                             job_variables={"image": image}, **about))
    flow = engine_config_flow.from_source(source=str(source), entrypoint=ENTRYPOINT)
    return str(flow.deploy(**about))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.pool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deploy", help="create the pool if missing, register the deployment")
    d.add_argument("--pool", default="gpu", help="work pool name (default gpu)")
    d.add_argument("--slots", type=int, default=None,
                   help="the pool's concurrency limit: how many device sets its workers own")
    d.add_argument("--source", type=Path, default=ROOT,
                   help="the specflow checkout the workers run from (default: this one)")
    d.add_argument("--image", default=None,
                   help="an image with specflow installed, for a Kubernetes pool created with "
                        "pipelines/k8s/base-job-template.json (then the pool must exist)")
    args = parser.parse_args(argv)
    from pipelines.deploy import api_problem, api_url

    problem = api_problem()
    if problem is not None:
        print(f"Prefect API at {api_url()} unreachable: {problem}", file=sys.stderr)
        return 1
    if args.image is None:
        print(ensure_pool(args.pool, args.slots))
    deployment_id = deploy(args.pool, args.source.resolve(), args.image)
    print(f"deployment specflow-engine-config/{args.pool} ({deployment_id}); sweep with "
          f"dispatch.deployment=specflow-engine-config/{args.pool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
