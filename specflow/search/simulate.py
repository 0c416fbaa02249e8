"""Simulated sweeps: the real round planner and decision code on synthetic measurements.

Used by `bench/decision_quality.py` (false promotion, power, cost of each design) and by the
tests that pin the decision's properties. The noise model, per window, on output throughput:

    tput = base * gain(config, point) * drift(seq) * start_effect(config start) * noise

- noise: Student-t(3) scaled to the CV (`1 + cv * t3 / sqrt(3)`), or lognormal with that CV;
- start effect: lognormal with SD `start_sd`, one draw per engine start (the replicate unit);
- drift: linear over the run order, `drift` in total from the first engine start to the
  `horizon`-th;
- outside load (`hit`): each window, with probability `hit`, slowed by a factor drawn uniformly
  from `slowdown` (a background job sharing the host's cores for the window's duration). As a
  racing sweep's start does (`steps.measure`), a planned start then measures each of its windows
  the screen calls slowed (`decision.aggregate.to_measure_again` on the records so far) once
  more before its engine stops, numbered `AGAIN` + its repeat, with its own noise and its own
  chance of being hit. Without outside load this is skipped (for the benches' time: the screen
  then flags only the noise's own tail, well under 1% of windows, which stay left out);
- costs: `start_s` per engine start and `window_s` per window (engine-seconds).

Open-loop latency windows (`latency_requests` > 0, a class decided on latency): a window's
`mean_e2el_ms` is the mean of that many requests' latencies, each lognormal (right-skewed, as a
vLLM server's per-request latencies are) with the spread that gives the mean the CV `cv`,
scaled by 1 / (gain x drift x start effect): a candidate `gain` times faster takes 1 / gain of
the time. Every window completes what it was offered, so its throughput is the same for all.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from specflow.decision.aggregate import to_measure_again
from specflow.records.measurement import AGAIN, Measurement, WindowKey
from specflow.search import rounds
from specflow.search.plan import Design, EngineStart, Round, Shape
from specflow.spec.schema import BudgetSpec, PromoteSpec


@dataclass(frozen=True)
class NoiseModel:
    cv: float = 0.03
    kind: Literal["t3", "lognormal"] = "t3"
    start_sd: float = 0.0
    drift: float = 0.0
    """Total relative drift over `horizon` engine starts (e.g. 0.05 or -0.05)."""
    horizon: int = 30
    start_s: float = 25.0
    window_s: float = 4.0
    hit: float = 0.0
    """Share of windows slowed by outside load."""
    slowdown: tuple[float, float] = (0.5, 0.8)
    """The factor a hit window's throughput is multiplied by, drawn uniformly from this range."""
    latency_requests: int = 0
    """0: throughput windows; n: open-loop windows whose score is a mean latency over n
    requests (see the module's docstring)."""


@dataclass(frozen=True)
class Engine:
    engine_hash: str
    name: str
    method: str
    n: int


@dataclass(frozen=True)
class Scenario:
    """Configs with their true speedups (1.0 unless given) per point."""

    shape: Shape
    engines: Mapping[str, Engine]
    gains: Mapping[str, float] = field(default_factory=dict)
    """True speedup per engine hash (every point)."""
    base_tput: float = 100.0
    level_gains: Mapping[tuple[str, int], float] = field(default_factory=dict)
    """True speedup per (engine hash, concurrency), over `gains`."""
    point_gains: Mapping[tuple[str, str, int], float] = field(default_factory=dict)
    """True speedup per (engine hash, workload, concurrency), over `level_gains`."""
    rates: Mapping[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)
    """True per-position acceptance per (engine hash, workload): its windows report them (with
    `rate_sd` relative noise per window) and `num_drafts`."""
    rate_sd: float = 0.01

    def gain(self, engine_hash: str, concurrency: int, workload: str = "") -> float:
        if (engine_hash, workload, concurrency) in self.point_gains:
            return self.point_gains[(engine_hash, workload, concurrency)]
        return self.level_gains.get((engine_hash, concurrency),
                                    self.gains.get(engine_hash, 1.0))


BASE_LATENCY_MS = 2000.0
"""The baseline's mean end-to-end latency in simulated open-loop windows."""


def window(scn: Scenario, start: EngineStart, key_index: int, value: float, duration_s: float,
           engine_s: float, rates: tuple[float, ...] = (), key: WindowKey | None = None,
           latency_ms: float | None = None) -> Measurement:
    """One simulated window (the start's `key_index`-th, or `key`): identical outputs
    everywhere (the quality gate passes)."""
    e = scn.engines.get(start.engine_hash) or Engine(start.engine_hash, "schedule",
                                                      "ngram", 0)
    key = key or start.window_keys()[key_index]
    return Measurement(
        key=key, engine=e.name, drafter=e.method, method=e.method, num_speculative_tokens=e.n,
        traffic_class=scn.shape.workloads[key.workload], output_throughput=value,
        duration_s=duration_s, completed=8, output_digests=("same",) * 8,
        prompt_hash="p", seq=start.seq, stage=start.stage, round=start.round,
        engine_s=engine_s, per_position_acceptance=rates,
        num_drafts=1000 if rates else None,
        latency_ms={"mean_e2el_ms": latency_ms} if latency_ms is not None else {},
        request_rate=1.0 if latency_ms is not None else None)


def _latency(noise: NoiseModel, rng: np.random.Generator, size: int) -> np.ndarray:
    """Each window's mean latency factor over `latency_requests` lognormal requests (mean 1)."""
    n = noise.latency_requests
    cv = noise.cv * math.sqrt(n)  # one request's CV, for the mean's to be `cv`
    s = math.sqrt(math.log(1 + cv**2))
    return np.exp(rng.normal(-s * s / 2, s, (size, n))).mean(axis=1)


def _draw(noise: NoiseModel, rng: np.random.Generator, size: int) -> np.ndarray:
    if noise.kind == "lognormal":
        s = math.sqrt(math.log(1 + noise.cv**2))
        return np.exp(rng.normal(-s * s / 2, s, size))
    return np.clip(1 + noise.cv * rng.standard_t(3, size) / math.sqrt(3), 0.05, None)


def run_round(scn: Scenario, noise: NoiseModel, current: Round, rng: np.random.Generator,
              before: Sequence[Measurement] = (), again: bool = False) -> list[Measurement]:
    """Every window of a round, as the engine would have measured them. `again` (a planned
    sweep's rounds, with outside load in `noise`): each start then measures once more the
    windows the screen calls slowed, on the records `before` the round and the round's own."""
    out: list[Measurement] = []
    for start in current.starts:
        keys = start.window_keys()
        effect = math.exp(rng.normal(0, noise.start_sd)) if noise.start_sd else 1.0
        drift = 1 + noise.drift * start.seq / max(1, noise.horizon)
        clock = noise.start_s
        for batch in (keys, None):
            if batch is None:  # the planned windows are done: those to measure once more
                if not (again and noise.hit):
                    break
                todo = to_measure_again([*before, *out], start.engine_hash, start.start)
                batch = [WindowKey(start.engine_hash, w, c, r + AGAIN, start.start)
                         for w, c, r in todo]
            gain = np.array([scn.gain(start.engine_hash, k.concurrency, k.workload)
                             for k in batch])
            if noise.latency_requests:
                latency = BASE_LATENCY_MS / (gain * effect * drift) * _latency(
                    noise, rng, len(batch))
                for i, (k, ms) in enumerate(zip(batch, latency, strict=True)):
                    clock += noise.window_s
                    out.append(window(scn, start, i, scn.base_tput, noise.window_s, clock, (),
                                      k, float(ms)))
                continue
            values = scn.base_tput * gain * effect * drift * _draw(noise, rng, len(batch))
            if noise.hit:  # drawn only then: the other noise models keep their streams
                hit = rng.random(len(batch)) < noise.hit
                values[hit] *= rng.uniform(*noise.slowdown, int(hit.sum()))
            for i, (k, v) in enumerate(zip(batch, values, strict=True)):
                clock += noise.window_s
                true = scn.rates.get((start.engine_hash, k.workload), ())
                rates = tuple(float(r) for r in np.clip(
                    np.array(true) * (1 + scn.rate_sd * rng.standard_normal(len(true))), 0, 1)
                    ) if true else ()
                out.append(window(scn, start, i, float(v), noise.window_s, clock, rates, k))
    return out


def run_sweep(scn: Scenario, noise: NoiseModel, promote: PromoteSpec, seed: int,
              max_rounds: int = 50) -> tuple[rounds.SearchState, list[Measurement]]:
    """Plan, 'measure' and replay rounds until the sweep is done."""
    rng = np.random.default_rng(seed)
    ms: list[Measurement] = []
    for _ in range(max_rounds):
        progress = rounds.replay(scn.shape, promote, ms)
        if progress.current is None:
            return progress, ms
        ms += run_round(scn, noise, progress.current, rng, ms, again=True)
    raise RuntimeError(f"sweep not done after {max_rounds} rounds")


def fixed_round(shape: Shape, copies: int, closing: bool) -> Round:
    """Uniform repeats in one round: (baseline, every candidate) x copies, then a closing
    baseline start when `closing`, in run order."""
    starts: list[EngineStart] = []
    started: Counter[str] = Counter()

    def add(h: str, repeats: int) -> None:
        starts.append(EngineStart(h, "explore", shape.points, repeats, 0, len(starts), started[h]))
        started[h] += 1

    for _ in range(copies):
        add(shape.baseline, shape.repeats)
        for h in shape.candidates:
            add(h, shape.repeats)
    if closing:
        add(shape.baseline, shape.closing_repeats)
    return Round(0, "explore", tuple(starts))


def scenario(design: Design, *, candidates: int = 8, classes: int = 2,
             levels: Sequence[int] = (1, 8), repeats: int = 3, closing_repeats: int = 3,
             gains: Mapping[int, float] | None = None, budget: object = None,
             level_gains: Mapping[tuple[int, int], float] | None = None,
             measure_schedules: bool = False) -> Scenario:
    """A sweep of `candidates` configs (two methods x N = 1..candidates/2) over `classes`
    classes of one workload each and one band per level; `gains` by candidate index,
    `level_gains` by (candidate index, concurrency). `measure_schedules`: the shape carries
    engine configs, so an emitted schedule is measured (its engine gains 1.0 unless set)."""
    from specflow.spec.compile import EngineConfig

    engines = {"base": Engine("base", "baseline", "none", 0)}
    for i in range(candidates):
        method = ("ngram", "draft_model")[i % 2]
        n = i // 2 + 1
        engines[f"c{i}"] = Engine(f"c{i}", f"{method}-n{n}", method, n)
    configs = {}
    for h, e in engines.items():
        spec = {"method": e.method, "num_speculative_tokens": e.n} if e.n else None
        argv = ("vllm", "serve", "sim", *(("--speculative-config", json.dumps(
            spec, sort_keys=True, separators=(",", ":"))) if spec else ()))
        configs[h] = EngineConfig(e.name, e.method, e.method, e.n, spec, argv, e.n)
    shape = Shape(
        design=design, baseline="base", candidates=tuple(f"c{i}" for i in range(candidates)),
        workloads={f"w{k}": f"class{k}" for k in range(classes)}, concurrency=tuple(levels),
        repeats=repeats, closing_repeats=closing_repeats,
        budget=budget if isinstance(budget, BudgetSpec) else BudgetSpec(),
        engines=configs if measure_schedules else {})
    return Scenario(shape, engines, {f"c{i}": g for i, g in (gains or {}).items()},
                    level_gains={(f"c{i}", c): g for (i, c), g in (level_gains or {}).items()})
