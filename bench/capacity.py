"""Capacity under the SLO: the bracketing search (`specflow.decision.capacity`) on simulated servers
of known capacity, and on the real CPU engine with the demo's models.

Run: .venv/bin/python bench/capacity.py [--trials 200] [--starts 3] [--engine-starts 3]
     [--window-s 6] [--max-tokens 160] [--p99-e2el-ms 1000] [--models DIR] [--workdir DIR]
     [--no-engine] [--smoke]
(the full run: ~15 min on this 2-core machine, nearly all of it the engine's; --smoke: 2
simulated trials, and one engine start of the baseline with 2 windows of 16 requests x 16
tokens)

Simulated servers: 4 slots serving first come first served, gamma(8) service times of mean 1 s
(4 req/s at full use), each engine start's service 3% faster or slower (lognormal); windows of 64
Poisson arrivals spanning 64 / rate, as vLLM's bench scales them; the SLO p99 end-to-end latency
<= 3 s. A rate holds when the window's p99 is within it and it did not overload. The true
capacity is the rate at which a window at the median start holds half the time, found by
bisection on 400 windows per rate. Each trial runs the search on `--starts` engine starts (each
from 1 req/s dithered by its key, as a sweep's searches start: `decision.capacity.dithered`) and
takes the estimate over them: `capacity_error_median` is the median over trials of
|found / true - 1| (target <= 0.05), `capacity_coverage` the share of trials whose 95% interval
holds the truth (target >= 0.90).

The real engine: the CPU demo's agreeing target, the baseline and n-gram N=8 (the code class's
winner), `--engine-starts` engine starts each; each start searches the rates from about 2 req/s
(dithered by its key) at most 8 requests in flight (the engine's max_num_seqs), each window
about `--window-s` long (rate x that many code prompts, at least 16) answered in
`--max-tokens` tokens, the SLO p99 end-to-end latency <= `--p99-e2el-ms`, counted from each
request's arrival (the wait under the cap included, `specflow.engine.runner.latency_stats`).
Prints
each start's steps, each config's capacity with its interval and engine starts spent,
`capacity_ratio` (n-gram over baseline) with its interval, and the replicas 20 req/s would need;
the last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from specflow.config.compose import load_plan
from specflow.decision.capacity import (
    StartCapacity,
    Step,
    bracket,
    dithered,
    estimate,
    holds,
    next_rate,
    ratio,
    replicas,
)
from specflow.demo import tiny
from specflow.engine.launcher import vllm_command
from specflow.engine.loadgen import BenchDriver, bench_env, driver_python
from specflow.engine.runner import Window, measure_window
from specflow.engine.server import LocalEngine
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import SloSpec
from specflow.stats.queueing import backlog, served

SLOTS, SERVICE_S, SHAPE, START_SD = 4, 1.0, 8.0, 0.03
"""Simulated servers: slots, mean service seconds, gamma shape, start effect SD."""
SIM_REQUESTS, SIM_P99_S = 64, 3.0
TARGETS = {"capacity_error_median": 0.05, "capacity_coverage": 0.90}
LOAD = 20.0
"""The load (req/s) the replicas are counted for."""


def sim_holds(rate: float, effect: float, rng: np.random.Generator) -> bool:
    """One simulated window at `rate` on a start whose service takes `effect` times the mean."""
    gaps = np.cumsum(rng.exponential(1 / rate, SIM_REQUESTS))
    arrivals = gaps * (SIM_REQUESTS / rate) / gaps[-1]
    service = rng.gamma(SHAPE, SERVICE_S * effect / SHAPE, SIM_REQUESTS)
    finish = served(arrivals, SLOTS, service)
    if backlog(arrivals, finish, rate).overload:
        return False
    return float(np.percentile(finish - arrivals, 99)) <= SIM_P99_S


def true_capacity(rng: np.random.Generator, windows: int = 400) -> float:
    """The rate at which a median start's window holds half the time (bisection on logs)."""
    lo, hi = 0.5, 8.0
    for _ in range(14):
        mid = math.sqrt(lo * hi)
        share = sum(sim_holds(mid, 1.0, rng) for _ in range(windows)) / windows
        lo, hi = (mid, hi) if share >= 0.5 else (lo, mid)
    return math.sqrt(lo * hi)


def search(measure: Callable[[float], bool], start: float, floor: float, ceiling: float,
           max_steps: int = 12) -> tuple[StartCapacity, list[Step]]:
    """One start's bracketing search; `measure(rate)` runs a window and says if it held."""
    steps: list[Step] = []
    while (rate := next_rate(steps, start, floor=floor, ceiling=ceiling,
                             max_steps=max_steps)) is not None:
        steps.append(Step(rate, measure(rate)))
    return bracket(steps), steps


def simulated(trials: int, starts: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    truth = true_capacity(rng)
    errors, covered, steps = [], 0, []
    for t in range(trials):
        caps = []
        for s in range(starts):
            effect = math.exp(rng.normal(0, START_SD))
            cap, ps = search(lambda r, e=effect: sim_holds(r, e, rng),
                             dithered(1.0, f"sim/{seed}/{t}/{s}"), 0.05, 64.0)
            caps.append(cap)
            steps.append(len(ps))
        est = estimate(caps)
        errors.append(abs(est.value / truth - 1))
        covered += est.lo is not None and est.hi is not None and est.lo <= truth <= est.hi
    return {"true_capacity": truth, "capacity_error_median": float(np.median(errors)),
            "capacity_coverage": covered / trials, "steps_per_start": float(np.mean(steps)),
            "trials": trials, "starts": starts}


PROMPTS = 1024
"""Code prompts in the dataset; a window sends the first `rate x --window-s` of them."""


def code_window(work: Path, max_tokens: int) -> Window:
    dataset = work / "dataset.jsonl"
    dataset.parent.mkdir(parents=True, exist_ok=True)
    dataset.write_text("".join(
        json.dumps({"prompt": f"def f{i}(x):\n    y = x * {i}\n    return y + {i}\n"}) + "\n"
        for i in range(PROMPTS)))
    return Window("code", "code", dataset, PROMPTS, max_tokens, 8, warmup_requests=WARMUPS)


START_RATE = 2.0
"""Where each engine start's search on the real engine begins (req/s)."""
WARMUPS = 4
"""Requests sent before a start's first window."""


def _step(engine: LocalEngine, driver: BenchDriver, ec: EngineConfig, base: Window, out: Path,
         slo: SloSpec, window_s: float, start: float, rate: float) -> bool:
    """One window of a start's search at `rate` on the running engine, about `window_s` long
    (at least 16 requests): whether it held (the first, at the `start` rate, after the
    warm-up)."""
    n = min(PROMPTS, max(16, round(rate * window_s)))
    w = replace(base, workload=f"code@{rate:.3g}rps", request_rate=rate, num_prompts=n,
                warmup_requests=base.warmup_requests if rate == start else 0)
    m = measure_window(engine, driver, ec, w, out / w.workload, 600)
    ok = holds(m, slo)
    p99 = m.latency_ms.get("p99_e2el_ms")
    print(f"  {ec.name} start {base.start}: {rate:.3g} req/s: "
          f"{'holds' if ok else 'does not hold'} (p99 e2el "
          f"{'-' if p99 is None else round(p99)} ms{', overload' if m.overload else ''}"
          f"{'' if m.ok else ', ' + str(m.failure)})", flush=True)
    return ok


def engine_capacity(args: argparse.Namespace, work: Path, models: Path) -> dict[str, object]:
    tiny.build("mimo_mtp2", models)
    loaded, plan = load_plan(["experiment=cpu_demo", f"paths.models={models}",
                              "target.max_model_len=512", "backend.engine.max_num_seqs=8"])
    python = driver_python(vllm_command())
    if python is None:
        raise SystemExit("cannot derive the vLLM interpreter for the long-lived driver")
    slo = SloSpec(p99_e2el_ms=args.p99_e2el_ms)
    base = code_window(work, args.max_tokens)
    names = ["baseline"] if args.smoke else ["baseline", "ngram-n8"]
    found: dict[str, list[StartCapacity]] = {}
    spent: dict[str, float] = {}
    for name in names:
        ec = next(e for e in plan.engine_configs if e.name == name)
        for s in range(args.engine_starts):
            t0 = time.perf_counter()
            with LocalEngine(ec, loaded.spec.backend, work / "engines") as engine:
                driver = BenchDriver(python, bench_env(), work / f"driver-{name}-{s}.log")
                driver.launch()
                driver.wait_ready()
                start = dithered(START_RATE, f"{name}/b{s}")
                try:
                    cap, _ = search(partial(_step, engine, driver, ec, replace(base, start=s),
                                            work / name / f"b{s}", slo, args.window_s, start),
                                    start, 0.25, 128.0, max_steps=2 if args.smoke else 12)
                finally:
                    driver.close()
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            found.setdefault(name, []).append(cap)
            print(f"{name} start {s}: capacity {cap.estimate:.2f} req/s "
                  f"(bracket {cap.low} - {cap.high}{', ' + cap.censored if cap.censored else ''})",
                  flush=True)
    out: dict[str, object] = {"p99_e2el_ms": args.p99_e2el_ms, "engine_starts": {
        n: len(c) for n, c in found.items()}, "engine_s": {n: round(v) for n, v in spent.items()}}
    for name, caps in found.items():
        e = estimate(caps)
        out[f"capacity_{name}"] = {"value": e.value, "lo": e.lo, "hi": e.hi,
                                   "censored": e.censored,
                                   "replicas_for_20rps": replicas(LOAD, e.lo),
                                   "per_start": [c.estimate for c in caps]}
    if "ngram-n8" in found:
        r = ratio(found["ngram-n8"], found["baseline"])
        out["capacity_ratio"] = r[0] if r else None
        out["capacity_ratio_interval"] = [r[1], r[2]] if r else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-starts", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=6.0,
                        help="each window's length: rate x this many requests (at least 16)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--p99-e2el-ms", type=float, default=1000.0)
    parser.add_argument("--models", type=Path, default=None, help="tiny model dir (default: temp)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: temp)")
    parser.add_argument("--no-engine", action="store_true", help="the simulated servers only")
    parser.add_argument("--smoke", action="store_true",
                        help="2 simulated trials; one engine start of the baseline, 2 windows "
                             "of 4 requests x 16 tokens")
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.engine_starts, args.window_s, args.max_tokens = 2, 1, 1.0, 16
    t0 = time.perf_counter()
    sim = simulated(args.trials, args.starts, args.seed)
    print(f"simulated servers ({SLOTS} slots, {SERVICE_S:g} s mean service, p99 e2el <= "
          f"{SIM_P99_S:g} s; {args.starts} engine starts per search, {args.trials} trials): "
          f"true capacity {sim['true_capacity']:.3f} req/s")
    print(f"{'figure':<28}{'value':>10}{'target':>10}")
    for key, target in TARGETS.items():
        op = "<=" if key == "capacity_error_median" else ">="
        print(f"{key:<28}{sim[key]:>10.3f}{op + ' ' + format(target, 'g'):>10}")
    print(f"{'steps per start':<28}{sim['steps_per_start']:>10.1f}")
    figures: dict[str, object] = {**sim, "targets_met": {
        "capacity_error_median": sim["capacity_error_median"] <= TARGETS["capacity_error_median"],
        "capacity_coverage": sim["capacity_coverage"] >= TARGETS["capacity_coverage"]}}
    if not args.no_engine:
        tmp = Path(tempfile.mkdtemp(prefix="specflow-capacity-"))
        real = engine_capacity(args, args.workdir or tmp / "work", args.models or tmp / "models")
        print(f"\nreal CPU engine, p99 e2el <= {args.p99_e2el_ms:g} ms, at most 8 in flight:")
        print(f"{'engine':<12}{'capacity req/s':>16}{'95% interval':>20}{'starts':>8}"
              f"{'replicas for 20 req/s':>24}")
        for name in ("baseline", "ngram-n8"):
            c = real.get(f"capacity_{name}")
            if isinstance(c, dict):
                iv = f"[{c['lo']:.2f}, {c['hi']:.2f}]" if c["lo"] is not None else "-"
                print(f"{name:<12}{c['value']:>16.2f}{iv:>20}{len(c['per_start']):>8}"
                      f"{str(c['replicas_for_20rps']):>24}")
        if real.get("capacity_ratio") is not None:
            iv = real["capacity_ratio_interval"]
            assert isinstance(iv, list)
            print(f"capacity_ratio (n-gram / baseline): {real['capacity_ratio']:.2f} "
                  f"[{iv[0]:.2f}, {iv[1]:.2f}]")
        figures["engine"] = real
        figures["capacity_ratio"] = real.get("capacity_ratio")
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
