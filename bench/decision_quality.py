"""Decision quality: the real decision code on simulated sweeps, per deployment.

Run: .venv/bin/python bench/decision_quality.py [--trials 300] [--seed 0] [--budget 10000]
     [--uniform-trials 100] [--workers 2] [--quick] [--smoke] [--no-memo]
(the full run: ~49 min on this 2-core machine, ~38 of them the race's 13,200 sweeps; --quick:
40 trials, t3 noise, CV 3% and 10% and the other shapes and profile on t3, ~4 min; --smoke:
--quick's scenarios at one trial each (one per k in the uniform and U80 searches, k in 1, 2 and
24 only), ~12 s: the whole code path, figures that mean nothing)

Every trial simulates one sweep of 8 candidates (c0..c7) and the baseline over 2 traffic classes
x 2 concurrency bands (levels 1 and 8), 3 windows per point per engine start, with
`specflow.search.simulate`, and decides it with `specflow.decision.choose.analyze` exactly as a
sweep does (a race: `rounds.replay` round by round, then the final analysis under the race's band
states; a grid: Holm over the whole family). Noise model, per window, on output throughput:
Student-t(3) or lognormal window noise at CV 3%, 10%, 25%; an engine-start effect of SD 3%
(lognormal, one draw per engine start: the replicate unit); a linear drift of +5% or -5% (sign
drawn per trial) over run order; true gain 0 (A/A), +10% or +25% for candidate c3 at every point.
A "window noise only" variant (no start effect, no drift) is run for the +10% power figures.
Outside load ("hit5%", CV 3%, A/A and +10%): besides that noise, each window with probability 5%
is slowed to a uniform 0.5-0.8 of its throughput, independently of the others: a background job
sharing the host's cores for about one window (on this 2-core machine a concurrent test run
roughly halves a window's throughput; on a GPU node, a co-tenant's CPU-bound job or a neighbour
saturating the host's PCIe or memory bandwidth slows the scheduler and sampling steps alike).
A whole engine start slowed is the start effect above. As a racing sweep's start does, each
simulated start then measures once more the windows the screen calls slowed (their own noise, their
own 5% chance of a hit; `specflow.search.simulate`), and pays their seconds.
`power_interference_cv3_gain10` is the +10% row's power.
Other shapes: "split" (c3 +10% at level 1, -10% at level 8; right: c3 at level 1, off at level
8; a promotion at level 8 counts as wrong), "tied" (c3 +10% and c5 +9%, one N apart on the same
drafter; either is right). Cost profiles: "cpu" (above) and "gpu" (an 8B target on one H200:
engine start ~90 s, window ~20 s; `PROFILES` says where the figures come from), run on the
CV 3%/10% A/A and +10% rows and the interference rows with the race's budget scaled by the cost
of an engine start with its windows (4.5x). `max_false_off`: of the bands with a right winner
(a true gain of twice the margin), the largest share concluded off in any scenario.

Costs: engine start ~25 s, window ~4 s (engine-seconds), measured on this machine's CPU engine
with the tiny demo models (`bench/runner_overhead.py`); a sweep's engine-seconds are what
`spent` accounts from the simulated records.

Drift: in the race it is 5% per 30 engine starts (`simulate.NoiseModel.horizon`), continuing
linearly over a longer race (so at least 5% over its run); in the fixed designs below it is
exactly 5% over the run (horizon = the run's engine starts).

Three decision rules, per scenario:
- race: `simulate.scenario("race", budget=BudgetSpec(engine_seconds=--budget))`, other defaults
  (a baseline start after every 4 candidate starts, 6 exploration rounds, 2 confirmation looks).
  At the default 10000 engine-seconds the race spent ~6800 at CV 3% (+10%) and ~9800 at CV 10%
  (there it binds); an earlier 6000 cut the confirmation round at CV 3% (+10%: power ~75%).
- uniform repeats: the grid sweep run k times over (baseline, c0..c7) x k, then a closing
  baseline start (9k + 1 engine starts), decided with Holm over the family; k is the smallest of
  1, 2, 3, 4, 6, 8, 12, 16, 24 whose deployment power reaches the race's in that scenario,
  searched on --uniform-trials trials per k (default 100, for time), then measured at that k on
  --trials trials (A/A rows use the k found for +10% under the same noise). If no k reaches it
  the largest is used and the budget ratio is a lower bound (marked ">=").
- tune_speculative_k (vLLM's tuner): one engine start per config, 5 windows per point; per band
  and config, score = median - 1.4826 * MAD of its windows at the band's points; no answer
  ("refused") when the baseline's relative MAD (1.4826 * MAD / median) exceeds 0.10, else the
  config with the highest score (a promotion when it is not the baseline).

CV 10%, +10%, as the issue states the target: U80 = the engine-seconds uniform repeats need for
80% power (k in 24, 32, 48, 64, 96, 128, 192; --u80-trials trials per k), then the race on
--trials trials with 40% of U80 as its budget: `power_cv10_gain10` and `budget_ratio_cv10`
(race engine-seconds / U80) come from that run; the same figures at the default budget are
`power_cv10_gain10_at_default_budget` / `budget_ratio_cv10_at_default_budget`.

Per deployment (trial): false promotion = any band of any class promoted anything in an A/A
scenario; power = every band (2 classes x 2 bands) promoted c3; wrong candidate = any band
promoted a candidate other than c3 in a gain scenario. Per-band rates are shown too.
Resolution, per band: "off/band" is the share of bands concluded off (neither promoted nor left
unresolved). `off_resolved_cv3` / `off_resolved_cv10`: A/A bands concluded off (the worse noise
kind); `max_false_off`: the largest share of bands concluded off in a scenario where c3 truly
gains at least twice the margin (+10% or +25% against 5%); `resolved_cv3_gain10`: bands
concluded (promoted or off) at CV 3% with the +10% candidate. Where the race left its unresolved
bands (`STOPS`: the budget, the exploration, a confirmation) is printed per scenario and is each
scenario's `stopped` in the JSON line.
The demo's plan (`DEMO_GAINS`; `--demo-only` runs just it): `make demo`'s two drafters and two
classes, with its budget, windows and rules read from `conf/sweep/cpu_demo.yaml` and
`conf/experiment/cpu_demo.yaml`, at its one concurrency level and at two, under t3 noise at CV 3%
(the demo's windows vary 1-5% within an engine start) and 10%, with the start effect and drift
above. Per row: the race's engine starts against the grid's (one start per config and the closing
baseline, as `steps.decide` counts it) plus one baseline start per round, false and wrong
promotion, every band right (code: n-gram; classify: off) and bands concluded.
`demo_starts_within` (CV 3%) and `demo_starts_within_cv10`: the share of sweeps within that bound
(a look sized to two starts of the winner, for 90% power where one start each left the start
variance's estimate large, goes past it).
For speed the race's round replay is memoised within a sweep (`rounds.after_round` and
`rounds.next_round` are pure functions of the records, which only grow; the critical values
are cached in `specflow.stats`); `--no-memo` turns the replay memo off: identical decisions,
slower. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from omegaconf import OmegaConf
from scipy import stats

import specflow
from specflow.decision.bands import bands_for
from specflow.decision.choose import analyze
from specflow.decision.model import Analysis, AnalysisError
from specflow.decision.race import BandState
from specflow.search import rounds, simulate
from specflow.search.plan import final_rules, spent_by, split_baseline
from specflow.spec.schema import BudgetSpec, PromoteSpec
from specflow.stats.queueing import backlog, served

START_S = 25.0
WINDOW_S = 4.0
COSTS = ("engine start ~25 s, window ~4 s, measured on this machine's CPU engine with the tiny "
         "demo models")
GAIN_INDEX = 3
TRUE = f"c{GAIN_INDEX}"
TIED_INDEX = 5
"""The near-tied winner of the "tied" scenarios: the same drafter as c3, one N larger."""
GPU_START_S, GPU_WINDOW_S = 90.0, 20.0
PROFILES = {"cpu": (START_S, WINDOW_S, 1.0),
            "gpu": (GPU_START_S, GPU_WINDOW_S,
                    (GPU_START_S + 12 * GPU_WINDOW_S) / (START_S + 12 * WINDOW_S))}
"""(engine start s, window s, race budget scale) per cost profile. cpu: this machine's CPU
engine with the tiny demo models. gpu: an 8B target on one H200 with CUDA graphs; the start is
~90 s (weights from local NVMe ~15-25 s, torch.compile from its cache and CUDA graph capture
~30-60 s, the figures vLLM's startup log reports for Llama-3.1-8B-class models), a window ~20 s
(the demo's windows of 16-32 requests x 256 output tokens at 60-150 tokens/s per request and a
warm-up). The race's budget is scaled by the cost of one engine start with 12 windows (3 per
point, the race's first rounds), so it buys as many of them (x4.5)."""
CVS = (0.03, 0.10, 0.25)
GAINS = (0.0, 0.10, 0.25)
KINDS: tuple[Literal["t3", "lognormal"], ...] = ("t3", "lognormal")
START_SD = 0.03
DRIFT = 0.05
UNIFORM_KS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
U80_KS = (24, 32, 48, 64, 96, 128, 192)
"""Engine starts per config searched for the uniform design's cost at 80% power (CV 10%)."""
SMOKE_TRIALS = 1
"""--smoke: trials per scenario, and per k in the uniform and U80 searches."""
HIT = 0.05
HIT_SLOWDOWN = (0.5, 0.8)
"""Outside load: 5% of windows slowed to 0.5-0.8 of their throughput (see the docstring)."""
TUNE_REPEATS = 5
TUNE_REFUSE = 0.10
MAD_SCALE = 1.4826
TARGETS = {"false_promotion": 0.01, "wrong_candidate": 0.01, "power_cv3": 0.95,
           "power_cv10": 0.80, "budget_ratio_cv10": 0.40, "false_off": 0.05,
           "off_resolved_cv3": 0.90, "off_resolved_cv10": 0.70, "resolved_cv3_gain10": 0.95,
           "power_interference": 0.85, "demo_starts_within": 0.95}
PROMOTE = PromoteSpec(bootstrap_samples=100)
PROMOTE_LATENCY = PROMOTE.model_copy(update={"objective": "latency",
                                             "latency_statistic": "mean_e2el_ms"})
OVERLOAD_TRIALS = 400
"""Simulated windows per cell of the overload detector's table (`overload_figures`)."""
LATENCY_REQUESTS = 32
"""Requests per simulated open-loop window (`simulate.NoiseModel.latency_requests`)."""
LATENCY_TARGETS = {"latency_max_false_promotion": 0.01, "latency_power_cv3_gain10": 0.95,
                   "latency_off_resolved_cv3": 0.90}
ROOT = Path(__file__).resolve().parent.parent
DEMO_GAINS = {("c0", "w0"): 2.0, ("c0", "w1"): 0.77, ("c1", "w0"): 0.47, ("c1", "w1"): 0.67}
"""The CPU demo's plan (`conf/experiment/cpu_demo.yaml`): c0 = ngram-n8, c1 =
draft_model_random-n2; w0 = code, w1 = classify; the true speedups at every level, as `make demo`
measured them (docs/benchmarks.md, the CPU demo: n-gram 1.9-2.2x on code and 0.7-0.8x on
classify, the random draft model 0.4-0.6x and 0.67-0.74x)."""
DEMO_LEVELS = ((4,), (1, 4))
"""The demo's one concurrency level, and two (the plan as the decisions issue states it)."""
DEMO_CVS = (0.03, 0.10)


@dataclass(frozen=True)
class Scenario:
    kind: Literal["t3", "lognormal"]
    cv: float
    gain: float
    start_effect: bool = True
    """False: window noise only (no start effect, no drift)."""
    hit: float = 0.0
    """Share of windows slowed by outside load (`HIT_SLOWDOWN`)."""
    pattern: Literal["uniform", "split", "tied"] = "uniform"
    """uniform: c3 gains `gain` at every point; split: c3 gains `gain` at level 1 and loses as
    much at level 8; tied: c3 gains `gain` and c5 (a larger N of the same drafter) 1 point
    less, both winners."""
    profile: Literal["cpu", "gpu"] = "cpu"
    """The cost profile (`PROFILES`)."""
    objective: Literal["throughput", "latency"] = "throughput"
    """latency: open-loop windows scored on their mean latency over `LATENCY_REQUESTS`
    right-skewed requests (`kind` unused), decided under `PROMOTE_LATENCY`."""

    @property
    def name(self) -> str:
        extra = ("" if self.start_effect else " no-start") + (
            f" hit{self.hit:.0%}" if self.hit else "") + (
            f" {self.pattern}" if self.pattern != "uniform" else "") + (
            f" {self.profile}" if self.profile != "cpu" else "")
        if self.objective == "latency":
            return f"latency cv{self.cv:.0%} gain{self.gain:+.0%}{extra}"
        return f"{self.kind} cv{self.cv:.0%} gain{self.gain:+.0%}{extra}"

    @property
    def gains(self) -> dict[int, float]:
        if not self.gain or self.pattern == "split":
            return {}
        if self.pattern == "tied":
            return {GAIN_INDEX: 1 + self.gain, TIED_INDEX: 1 + self.gain - 0.01}
        return {GAIN_INDEX: 1 + self.gain}

    @property
    def level_gains(self) -> dict[tuple[int, int], float]:
        if self.pattern != "split" or not self.gain:
            return {}
        return {(GAIN_INDEX, 1): 1 + self.gain, (GAIN_INDEX, 8): 1 - self.gain}

    def acceptable(self, band: int) -> frozenset[str]:
        """The right winners of a trial's `band`-th band (classes, then bands by level: even
        bands are level 1); empty: the right answer is off."""
        if not self.gain or (self.pattern == "split" and band % 2):
            return frozenset()
        return frozenset({TRUE, f"c{TIED_INDEX}"} if self.pattern == "tied" else {TRUE})

    def noise(self, rng: np.random.Generator, horizon: int = 30) -> simulate.NoiseModel:
        """The trial's noise: the drift sign drawn from `rng`."""
        start_s, window_s, _ = PROFILES[self.profile]
        if not self.start_effect:
            return simulate.NoiseModel(cv=self.cv, kind=self.kind, start_sd=0.0, drift=0.0,
                                  start_s=start_s, window_s=window_s)
        sign = 1.0 if rng.random() < 0.5 else -1.0
        return simulate.NoiseModel(cv=self.cv, kind=self.kind, start_sd=START_SD,
                              drift=sign * DRIFT, horizon=horizon, start_s=start_s,
                              window_s=window_s, hit=self.hit, slowdown=HIT_SLOWDOWN,
                              latency_requests=LATENCY_REQUESTS
                              if self.objective == "latency" else 0)

    @property
    def promote(self) -> PromoteSpec:
        return PROMOTE_LATENCY if self.objective == "latency" else PROMOTE


@dataclass(frozen=True)
class Trial:
    """What one trial decided: per band (class, band label) the promoted engine hash or None."""

    promoted: tuple[str | None, ...]
    unresolved: int
    """Bands left unresolved (race) or refused (tune)."""
    engine_s: float
    error: str = ""
    unresolved_at: tuple[bool, ...] = ()
    """Per band (as `promoted`): left unresolved (race, uniform) or refused (tune)."""
    stopped: tuple[str, ...] = ()
    """Per band (race): where an unresolved band stopped (`STOPS`), "" where it concluded."""


def code_version() -> dict[str, str]:
    """Short hashes of the decision code the figures come from, per package."""
    root = Path(specflow.__file__).parent
    return {pkg: hashlib.sha256(b"".join(f.read_bytes() for f in sorted(
        (root / pkg).glob("*.py")))).hexdigest()[:12] for pkg in ("stats", "decision", "search")}


def _rng(seed: int, scn: Scenario, design: str, trial: int, k: int = 0) -> np.random.Generator:
    tag = zlib.crc32(f"{scn.name}/{design}/{k}".encode())
    return np.random.default_rng(np.random.SeedSequence((seed, tag, trial)))


# --------------------------------------------------------------------------------------------
# The race's replay, memoised within one sweep

_MEMO: dict[tuple[Any, ...], Any] = {}
_ORIGINAL_AFTER_ROUND = rounds.after_round
_AFTER_ROUND_SIGNATURE = inspect.signature(_ORIGINAL_AFTER_ROUND)
_ORIGINAL_NEXT_ROUND = rounds.next_round
_NEXT_ROUND_SIGNATURE = inspect.signature(_ORIGINAL_NEXT_ROUND)


def _memo_after_round(*args: Any, **kwargs: Any) -> Any:
    """`rounds.after_round`, computed once per round of a sweep: a replay re-analyses every
    finished round on the same records (`data` = the windows of rounds <= index)."""
    bound = _AFTER_ROUND_SIGNATURE.bind(*args, **kwargs).arguments
    key = ("after", bound["index"], bound["stage"], len(bound["data"]))
    if key not in _MEMO:
        _MEMO[key] = _ORIGINAL_AFTER_ROUND(*args, **kwargs)
    return dict(_MEMO[key])


def _memo_next_round(*args: Any, **kwargs: Any) -> Any:
    """`rounds.next_round`, planned once per round of a sweep (its states are those of the
    same records)."""
    bound = _NEXT_ROUND_SIGNATURE.bind(*args, **kwargs).arguments
    key = ("next", bound["index"], len(bound["data"]), bound.get("new_only", False))
    if key not in _MEMO:
        _MEMO[key] = _ORIGINAL_NEXT_ROUND(*args, **kwargs)
    stage, plan = _MEMO[key]
    return stage, list(plan)


def _init_worker(memo: bool) -> None:
    """Memoise the race's replay (pure functions of their arguments), or undo it."""
    replay = memo and {"index", "stage", "data"} <= set(_AFTER_ROUND_SIGNATURE.parameters)
    plans = memo and {"index", "data"} <= set(_NEXT_ROUND_SIGNATURE.parameters)
    rounds.after_round = _memo_after_round if replay else _ORIGINAL_AFTER_ROUND
    rounds.next_round = _memo_next_round if plans else _ORIGINAL_NEXT_ROUND


# --------------------------------------------------------------------------------------------
# The three rules


def _decided(result: Analysis, spent: float,
             states: Mapping[tuple[str, str], BandState] | None = None) -> Trial:
    """Per band (classes, then bands by level): the promoted engine hash, whether the band was
    left unresolved, and (a race's `states`) where the race left it so (`_stop`)."""
    winners, unresolved, stopped = [], [], []
    for r in sorted(result.classes, key=lambda r: r.traffic_class):
        for d in sorted(r.decisions, key=lambda d: d.band.lo):
            winners.append(d.winner.engine_hash if d.winner is not None else None)
            unresolved.append(d.outcome == "unresolved")
            st = (states or {}).get((r.traffic_class, d.band.label))
            stopped.append(_stop(st.why) if unresolved[-1] and st is not None else "")
    return Trial(tuple(winners), sum(unresolved), spent, unresolved_at=tuple(unresolved),
                 stopped=tuple(stopped) if states is not None else ())


STOPS = ("budget", "exploration", "confirmation")
"""Where a race leaves a band unresolved: the budget could not pay for the next round; the
exploration ended with no contender selected and not all ruled out (and no settling look ruled
them out); a selected candidate was not confirmed in its looks, and not ruled out."""


def _stop(why: str) -> str:
    if why.startswith("budget spent"):
        return "budget"
    if why.startswith(("not confirmed", "failed confirmation")):
        return "confirmation"
    return "exploration"


def race_trial(args: tuple[Scenario, int, int, float]) -> Trial:
    scn, seed, trial, budget = args
    rng = _rng(seed, scn, "race", trial)
    noise = scn.noise(rng)
    budget *= PROFILES[scn.profile][2]
    sim = simulate.scenario("race", gains=scn.gains, level_gains=scn.level_gains,
                            budget=BudgetSpec(engine_seconds=budget))
    _MEMO.clear()
    prog, ms = simulate.run_sweep(sim, noise, scn.promote, seed=int(rng.integers(2**62)))
    _MEMO.clear()
    spent = prog.spent.engine_seconds
    if prog.problems:
        return Trial((), 0, spent, "; ".join(prog.problems)[:200])
    # As `steps.decide` does: a measured N schedule (not simulated here) is checked apart.
    opening, later = split_baseline([m for m in ms if m.stage != "schedule"], sim.shape.baseline)
    try:
        result = analyze(opening, final_rules(scn.promote), closing_baseline=later,
                         race=prog.states)
    except AnalysisError as exc:
        return Trial((), 0, spent, str(exc)[:200])
    return _decided(result, spent, prog.states)


def uniform_trial(args: tuple[Scenario, int, int, int]) -> Trial:
    scn, seed, trial, k = args
    rng = _rng(seed, scn, "uniform", trial, k)
    sim = simulate.scenario("grid", gains=scn.gains, level_gains=scn.level_gains)
    plan = simulate.fixed_round(sim.shape, k, closing=True)
    noise = scn.noise(rng, horizon=len(plan.starts))
    ms = simulate.run_round(sim, noise, plan, rng)
    spent = spent_by(ms).engine_seconds
    opening, later = split_baseline(ms, sim.shape.baseline)
    try:
        result = analyze(opening, PROMOTE, closing_baseline=later, family="holm")
    except AnalysisError as exc:
        return Trial((), 0, spent, str(exc)[:200])
    return _decided(result, spent)


@dataclass(frozen=True)
class DemoTrial:
    """One simulated sweep of the demo's plan: the race's engine starts and rounds, and per band
    (classes, then bands by level) the promoted engine hash or None and whether unresolved."""

    starts: int
    rounds: int
    grid_starts: int
    promoted: tuple[str | None, ...] = ()
    unresolved_at: tuple[bool, ...] = ()
    right_at: tuple[frozenset[str], ...] = ()
    """Per band: its right winners (empty: off is right)."""
    error: str = ""


def demo_sweep() -> tuple[BudgetSpec, int, int, PromoteSpec]:
    """The demo's budget, windows per point per start, closing baseline repeats and promotion
    rules, read from its configs (`conf/sweep/cpu_demo.yaml`, `conf/experiment/cpu_demo.yaml`)."""
    sweep: Any = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/sweep/cpu_demo.yaml"))
    experiment: Any = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/experiment/cpu_demo.yaml"))
    rules = PROMOTE.model_copy(update=experiment.get("promote") or {})
    return (BudgetSpec(**sweep["budget"]), sweep["repeats"], sweep["closing_baseline_repeats"],
            rules)


def demo_trial(args: tuple[tuple[int, ...], float, int, int]) -> DemoTrial:
    """The demo's plan raced as `make demo` races it, on simulated windows (t3 noise at `cv`,
    the start effect and drift of the other scenarios, the CPU profile's costs)."""
    levels, cv, seed, trial = args
    budget, repeats, closing, rules = demo_sweep()
    sim = simulate.scenario("race", candidates=2, classes=2, levels=levels, repeats=repeats,
                            closing_repeats=closing, budget=budget)
    sim = replace(sim, point_gains={(h, w, c): g for (h, w), g in DEMO_GAINS.items()
                                    for c in levels})
    grid = len(sim.shape.candidates) + 1 + int(closing > 0)  # `steps.decide`'s grid cost
    tag = zlib.crc32(f"demo/{levels}/{cv}".encode())
    rng = np.random.default_rng(np.random.SeedSequence((seed, tag, trial)))
    noise = Scenario("t3", cv, 0.0).noise(rng)  # the other scenarios' start effect and drift
    _MEMO.clear()
    prog, ms = simulate.run_sweep(sim, noise, rules, seed=int(rng.integers(2**62)))
    _MEMO.clear()
    starts, n_rounds = prog.spent.engine_starts, len(prog.rounds)
    if prog.problems:
        return DemoTrial(starts, n_rounds, grid, error="; ".join(prog.problems)[:200])
    opening, later = split_baseline(ms, sim.shape.baseline)
    try:
        result = analyze(opening, final_rules(rules), closing_baseline=later, race=prog.states)
    except AnalysisError as exc:
        return DemoTrial(starts, n_rounds, grid, error=str(exc)[:200])
    decided = _decided(result, prog.spent.engine_seconds)
    # `_decided`'s order: classes by name (class0 = code, where n-gram wins), bands by level
    right = (frozenset({"c0"}),) * len(levels) + (frozenset(),) * len(levels)
    return DemoTrial(starts, n_rounds, grid, decided.promoted, decided.unresolved_at, right)


def demo_figures(trials: Sequence[DemoTrial]) -> dict[str, Any]:
    """Per row of the demo's plan: the share of sweeps whose engine starts are at most the
    grid's plus one baseline start per round, the starts' median and most, false and wrong
    promotion, every band right, and bands concluded."""
    ok = [t for t in trials if not t.error]
    n, bands = max(1, len(ok)), max(1, sum(len(t.promoted) for t in ok))
    return {
        "trials": len(trials), "errors": len(trials) - len(ok),
        "grid_starts": ok[0].grid_starts if ok else 0,
        "starts_within": sum(t.starts <= t.grid_starts + t.rounds for t in ok) / n,
        "starts_median": float(np.median([t.starts for t in ok])) if ok else math.nan,
        "starts_max": max((t.starts for t in ok), default=0),
        "rounds_max": max((t.rounds for t in ok), default=0),
        "false_promotion": sum(any(w is not None for w, acc in zip(t.promoted, t.right_at,
                                                                  strict=True) if not acc)
                               for t in ok) / n,
        "wrong": sum(any(w is not None and acc and w not in acc
                         for w, acc in zip(t.promoted, t.right_at, strict=True))
                     for t in ok) / n,
        "right": sum(all((w in acc) if acc else (w is None and not u) for w, u, acc in zip(
            t.promoted, t.unresolved_at, t.right_at, strict=True)) for t in ok) / n,
        "resolved_band": sum(not u for t in ok for u in t.unresolved_at) / bands,
    }


def _mad_score(x: Sequence[float]) -> tuple[float, float]:
    """(median - 1.4826 MAD, 1.4826 MAD / median)."""
    med = statistics.median(x)
    mad = MAD_SCALE * float(stats.median_abs_deviation(x))
    return med - mad, mad / med


def tune_trial(args: tuple[Scenario, int, int]) -> Trial:
    scn, seed, trial = args
    rng = _rng(seed, scn, "tune", trial)
    sim = simulate.scenario("grid", gains=scn.gains, level_gains=scn.level_gains,
                            repeats=TUNE_REPEATS, closing_repeats=0)
    plan = simulate.fixed_round(sim.shape, 1, closing=False)
    noise = scn.noise(rng, horizon=len(plan.starts))
    ms = simulate.run_round(sim, noise, plan, rng)
    bands, _, _ = bands_for(PROMOTE, sim.shape.concurrency)
    winners: list[str | None] = []
    refused: list[bool] = []
    for cls in sorted(set(sim.shape.workloads.values())):
        for band in bands:
            tput: dict[str, list[float]] = {}
            for m in ms:
                if m.traffic_class == cls and m.key.concurrency in band:
                    tput.setdefault(m.key.engine_hash, []).append(m.output_throughput)
            scores = {h: _mad_score(x) for h, x in tput.items()}
            refused.append(scores[sim.shape.baseline][1] > TUNE_REFUSE)
            if refused[-1]:
                winners.append(None)
                continue
            best = max([sim.shape.baseline, *sim.shape.candidates], key=lambda h: scores[h][0])
            winners.append(None if best == sim.shape.baseline else best)
    return Trial(tuple(winners), sum(refused), spent_by(ms).engine_seconds,
                 unresolved_at=tuple(refused))


# --------------------------------------------------------------------------------------------
# Figures


@dataclass(frozen=True)
class Figures:
    trials: int
    false_promotion: float | None
    power: float | None
    power_band: float | None
    wrong: float | None
    unresolved_band: float
    engine_s: float
    errors: int
    off_band: float = 0.0
    """Bands concluded "off": neither promoted nor left unresolved (refused, for tune)."""
    false_off_band: float = 0.0
    """Of the bands with a right winner, those concluded off."""
    false_count: int = 0
    wrong_count: int = 0
    k: int | None = None
    k_reached: bool = True
    stopped: dict[str, float] | None = None
    """Race: the share of bands left unresolved at each of `STOPS`."""


def figures(scn: Scenario, trials: Sequence[Trial], k: int | None = None,
            k_reached: bool = True) -> Figures:
    ok = [t for t in trials if not t.error]
    n = max(1, len(ok))
    bands = max(1, sum(len(t.promoted) for t in ok))
    any_promoted = sum(any(w is not None for w in t.promoted) for t in ok)
    wrong = sum(_wrong(scn, t) for t in ok)
    aa = scn.gain == 0
    promoted_bands = sum(w is not None for t in ok for w in t.promoted)
    unresolved = sum(t.unresolved for t in ok)
    winning = [(w, acc) for t in ok for i, w in enumerate(t.promoted)
               if (acc := scn.acceptable(i))]
    return Figures(
        trials=len(trials),
        false_promotion=any_promoted / n if aa else None,
        power=None if aa else sum(bool(t.promoted) and all(
            w in acc for i, w in enumerate(t.promoted) if (acc := scn.acceptable(i)))
            for t in ok) / n,
        power_band=None if aa else sum(w in acc for w, acc in winning) / max(1, len(winning)),
        wrong=None if aa else wrong / n,
        unresolved_band=unresolved / bands,
        engine_s=float(np.mean([t.engine_s for t in trials])) if trials else 0.0,
        errors=len(trials) - len(ok),
        off_band=(bands - unresolved - promoted_bands) / bands if ok else 0.0,
        false_off_band=sum(w is None and not t.unresolved_at[i] for t in ok
                           for i, w in enumerate(t.promoted) if scn.acceptable(i))
        / max(1, len(winning)),
        false_count=any_promoted if aa else 0,
        wrong_count=0 if aa else wrong,
        k=k, k_reached=k_reached,
        stopped={w: sum(x == w for t in ok for x in t.stopped) / bands for w in STOPS}
        if any(t.stopped for t in ok) else None)


def _wrong(scn: Scenario, t: Trial) -> bool:
    """A band promoted what is not one of its right winners (or anything where off is right)."""
    return any(w is not None and w not in scn.acceptable(i) for i, w in enumerate(t.promoted))


def wilson_hi(x: int, n: int, z: float = 1.96) -> float:
    if n == 0:
        return 1.0
    p = x / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(1.0, centre + half)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def stops(rows: Sequence[tuple[Scenario, Figures]]) -> None:
    """Where the race's unresolved bands stopped (`STOPS`), per scenario with any."""
    shown = [(s, f) for s, f in rows if f.stopped and f.unresolved_band]
    if not shown:
        return
    print("\nwhere the race left bands unresolved (share of all bands; budget: the next round did "
          "not fit; exploration: none selected, not all ruled out; confirmation: the selected "
          "one not confirmed in its looks, nor ruled out)")
    head = f"{'scenario':<30}" + "".join(f"{w:>14}" for w in STOPS)
    print(head)
    print("-" * len(head))
    for s, f in shown:
        assert f.stopped is not None
        print(f"{s.name:<30}" + "".join(f"{_pct(f.stopped[w]):>14}" for w in STOPS))


def table(title: str, rows: Sequence[tuple[Scenario, Figures]], unresolved_label: str,
          with_k: bool = False) -> None:
    print(f"\n{title}")
    head = (f"{'scenario':<30}{'trials':>7}{'false prom':>11}{'power':>8}{'pow/band':>9}"
            f"{'wrong':>8}{unresolved_label:>11}{'off/band':>9}{'engine-s':>10}")
    if with_k:
        head += f"{'k':>5}"
    print(head)
    print("-" * len(head))
    for scn, f in rows:
        line = (f"{scn.name:<30}{f.trials:>7}{_pct(f.false_promotion):>11}{_pct(f.power):>8}"
                f"{_pct(f.power_band):>9}{_pct(f.wrong):>8}{_pct(f.unresolved_band):>11}"
                f"{_pct(f.off_band):>9}{f.engine_s:>10.0f}")
        if with_k:
            line += f"{('' if f.k_reached else '>=') + str(f.k):>5}"
        if f.errors:
            line += f"  ({f.errors} trials could not be analysed)"
        print(line)


# --------------------------------------------------------------------------------------------


def run_all(pool: Callable[..., Any], fn: Callable[[Any], Trial], tasks: Sequence[Any]
            ) -> list[Trial]:
    return list(pool(fn, tasks, chunksize=max(1, len(tasks) // 64)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--uniform-trials", type=int, default=100,
                        help="trials per k in the uniform repeats' search (the chosen k is "
                             "then measured on --trials)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=10000.0,
                        help="the race's engine-seconds budget")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--u80-trials", type=int, default=40,
                        help="trials per k when searching uniform repeats' cost at 80%% power")
    parser.add_argument("--quick", action="store_true",
                        help="a quick run: 40 trials, CV 3%% and 10%%, t3 noise only")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: --quick's scenarios, one "
                             "trial each, uniform k in 1, 2 and U80 k 24 only")
    parser.add_argument("--no-memo", action="store_true",
                        help="replay the race without memoising finished rounds")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the latency-objective scenarios (open-loop windows scored on "
                             "mean latency; the race)")
    parser.add_argument("--demo-only", action="store_true",
                        help="only the demo's plan (its trials are seeded apart from the "
                             "other scenarios', so its figures are those of a whole run)")
    args = parser.parse_args()
    if args.smoke:
        args.quick, args.u80_trials = True, SMOKE_TRIALS
    trials = SMOKE_TRIALS if args.smoke else 40 if args.quick else args.trials
    u_trials = min(args.uniform_trials, trials)
    uniform_ks = UNIFORM_KS[:2] if args.smoke else UNIFORM_KS
    u80_ks = U80_KS[:1] if args.smoke else U80_KS
    kinds = KINDS[:1] if args.quick else KINDS
    cvs = CVS[:2] if args.quick else CVS
    full = [Scenario(kind, cv, g) for kind in kinds for cv in cvs for g in GAINS]
    bare = [Scenario(kind, cv, 0.10, start_effect=False) for kind in kinds for cv in (0.03, 0.10)]
    hit = [Scenario(kind, 0.03, g, hit=HIT) for kind in kinds for g in (0.0, 0.10)]
    split = [Scenario(kind, cv, 0.10, pattern="split") for kind in kinds for cv in (0.03, 0.10)]
    tied = [Scenario(kind, 0.03, 0.10, pattern="tied") for kind in kinds]
    gpu = [Scenario(kind, cv, g, profile="gpu") for kind in kinds for cv in (0.03, 0.10)
           for g in (0.0, 0.10)] + [Scenario(kind, 0.03, g, hit=HIT, profile="gpu")
                                    for kind in kinds for g in (0.0, 0.10)]
    t0 = time.perf_counter()
    print(f"decision quality: {trials} trials per scenario (uniform search: {u_trials} per k), "
          f"seed {args.seed}, {args.workers} worker processes")
    print(f"costs: {COSTS}")
    print(f"race budget: {args.budget:.0f} engine-seconds; {PromoteSpec().margin:.0%} margin, "
          f"confidence {PROMOTE.confidence:.0%}; gain candidate {TRUE}")
    code = code_version()
    print("decision code: " + ", ".join(f"{k}.py {v}" for k, v in code.items()))

    _init_worker(not args.no_memo)
    with ProcessPoolExecutor(max_workers=args.workers, initializer=_init_worker,
                             initargs=(not args.no_memo,)) as ex:
        pool = ex.map
        lat_scns = [Scenario("lognormal", cv, g, objective="latency") for cv in (0.03, 0.10)
                    for g in (0.0, 0.10)]
        out_l = run_all(pool, race_trial, [(s, args.seed, i, args.budget) for s in lat_scns
                                           for i in range(trials)])
        latency = {s: figures(s, out_l[j * trials:(j + 1) * trials])
                   for j, s in enumerate(lat_scns)}
        print(f"latency objective done in {time.perf_counter() - t0:.0f} s")
        lat_summary = latency_report(latency, SMOKE_TRIALS if args.smoke else OVERLOAD_TRIALS)
        if args.latency_only:
            print(json.dumps({**lat_summary, "trials": trials, "seed": args.seed, "code": code,
                              "wall_s": round(time.perf_counter() - t0, 1)}))
            return 0
        # The demo's plan, raced as `make demo` races it
        demo_rows = [(lv, cv) for lv in DEMO_LEVELS for cv in DEMO_CVS]
        out_d = list(pool(demo_trial, [(lv, cv, args.seed, i) for lv, cv in demo_rows
                                       for i in range(trials)], chunksize=8))
        demo = {f"levels {'+'.join(map(str, lv))} cv{cv:.0%}":
                demo_figures(out_d[j * trials:(j + 1) * trials])
                for j, (lv, cv) in enumerate(demo_rows)}
        print(f"demo plan done in {time.perf_counter() - t0:.0f} s")
        demo_table(demo)
        if args.demo_only:
            print(json.dumps({"demo_plan": demo, **demo_summary(demo), "trials": trials,
                              "seed": args.seed, "code": code,
                              "wall_s": round(time.perf_counter() - t0, 1)}))
            return 0
        # Race
        scns = [*full, *bare, *hit, *split, *tied, *gpu]
        tasks = [(s, args.seed, i, args.budget) for s in scns for i in range(trials)]
        out = run_all(pool, race_trial, tasks)
        race = {s: figures(s, out[j * trials:(j + 1) * trials]) for j, s in enumerate(scns)}
        race_trials = {s: out[j * trials:(j + 1) * trials] for j, s in enumerate(scns)}
        print(f"race done in {time.perf_counter() - t0:.0f} s")

        # tune_speculative_k
        tasks = [(s, args.seed, i) for s in full for i in range(trials)]
        out = run_all(pool, tune_trial, tasks)
        tune = {s: figures(s, out[j * trials:(j + 1) * trials]) for j, s in enumerate(full)}

        # Uniform repeats: the smallest k reaching the race's power (gain scenarios), searched
        # on `u_trials` trials over every open scenario at once; the chosen k is then measured
        # on `trials` trials (A/A rows at the +10% row's k).
        gain_scns = [s for s in full if s.gain]
        open_: dict[Scenario, float] = {s: race[s].power or 0.0 for s in gain_scns}
        chosen: dict[Scenario, tuple[int, bool, float]] = {}
        for k in uniform_ks:
            if not open_:
                break
            todo = list(open_)
            tasks = [(s, args.seed, i, k) for s in todo for i in range(u_trials)]
            out = run_all(pool, uniform_trial, tasks)
            for j, s in enumerate(todo):
                power = figures(s, out[j * u_trials:(j + 1) * u_trials]).power or 0.0
                chosen[s] = (k, power >= open_[s], power)
                if power >= open_[s]:
                    del open_[s]
            print(f"uniform search k={k} ({len(todo)} scenarios, {u_trials} trials) done at "
                  f"{time.perf_counter() - t0:.0f} s")
        for s in full:
            if not s.gain:
                chosen[s] = chosen[Scenario(s.kind, s.cv, 0.10)]
        tasks = [(s, args.seed, i, chosen[s][0]) for s in full for i in range(trials)]
        out = run_all(pool, uniform_trial, tasks)
        uniform = {s: figures(s, out[j * trials:(j + 1) * trials], *chosen[s][:2])
                   for j, s in enumerate(full)}
        print(f"uniform done at {time.perf_counter() - t0:.0f} s")

        # The CV 10% +10% target as the issue states it: what uniform repeats spend for 80%
        # power (U80), then the race with 40% of that as its budget.
        protocol: dict[Scenario, dict[str, Any]] = {}
        for s in [x for x in full if x.cv == 0.10 and x.gain == 0.10]:
            u80, k80, p80 = math.nan, None, 0.0
            for k in u80_ks:
                out = run_all(pool, uniform_trial,
                              [(s, args.seed, i, k) for i in range(args.u80_trials)])
                f = figures(s, out, k)
                p80 = f.power or 0.0
                print(f"U80 search {s.name} k={k}: power {p80:.1%} at {f.engine_s:.0f} engine-s "
                      f"({time.perf_counter() - t0:.0f} s)")
                if p80 >= TARGETS["power_cv10"]:
                    u80, k80 = f.engine_s, k
                    break
            budget = 0.4 * (u80 if k80 is not None else f.engine_s)
            out = run_all(pool, race_trial, [(s, args.seed, i, budget) for i in range(trials)])
            fr = figures(s, out)
            protocol[s] = {"u80_engine_s": u80 if k80 is not None else f.engine_s,
                           "u80_k": k80 or u80_ks[-1], "u80_reached": k80 is not None,
                           "u80_power": p80, "race_budget": budget, "race_power": fr.power,
                           "race_engine_s": fr.engine_s, "race_wrong": fr.wrong,
                           "race_unresolved_band": fr.unresolved_band}
            print(f"race at 40% of U80 ({budget:.0f} engine-s) {s.name}: power {_pct(fr.power)}, "
                  f"{fr.engine_s:.0f} engine-s ({time.perf_counter() - t0:.0f} s)")
    wall = time.perf_counter() - t0

    race_rows = [(s, race[s]) for s in scns]
    table(f"RACE (budget {args.budget:.0f} engine-s; {COSTS})", race_rows, "unres/band")
    stops(race_rows)
    table(f"UNIFORM REPEATS at the race's power (smallest k in {list(uniform_ks)}; A/A rows at "
          "the +10% row's k; grid, Holm over the family)",
          [(s, uniform[s]) for s in full], "unres/band", with_k=True)
    table(f"tune_speculative_k (1 start per config, {TUNE_REPEATS} windows per point, refuses "
          f"when the baseline's 1.4826*MAD/median > {TUNE_REFUSE:.2f})",
          [(s, tune[s]) for s in full], "refused/bd")

    print("\nrace trials that promoted wrongly (reproduce: race_trial((scenario, seed, trial, "
          "budget))):")
    for s in scns:
        bad = [(i, t.promoted) for i, t in enumerate(race_trials[s])
               if _wrong(s, t)]
        if bad:
            print(f"  {s.name:<30} " + ", ".join(f"trial {i} {list(p)}" for i, p in bad[:8])
                  + (f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""))
    errors = {s.name: t.error for s in scns for t in race_trials[s] if t.error}
    for name, err in errors.items():
        print(f"  {name}: not analysable: {err}")

    print("\nbudget ratio (race engine-s / uniform engine-s at equal power):")
    ratios: dict[Scenario, tuple[float, bool]] = {}
    for s in gain_scns:
        ratio = race[s].engine_s / uniform[s].engine_s if uniform[s].engine_s else math.nan
        ratios[s] = (ratio, uniform[s].k_reached)
        bound = "" if uniform[s].k_reached else (" (no k reached the race's power: "
                                                 "a lower bound on the ratio)")
        print(f"  {s.name:<30} race power {_pct(race[s].power):>6} vs uniform k={uniform[s].k} "
              f"{_pct(chosen[s][2]):>6} in the search, {_pct(uniform[s].power):>6} on {trials} "
              f"trials: {race[s].engine_s:.0f} / {uniform[s].engine_s:.0f} = "
              f"{'>= ' if not uniform[s].k_reached else ''}{ratio:.2f}{bound}")

    print("\nCV 10%, +10%: uniform repeats' cost at 80% power (U80, "
          f"{args.u80_trials} trials per k in {list(u80_ks)}), and the race given 40% of it:")
    for s, p in protocol.items():
        print(f"  {s.name:<30} U80 = {p['u80_engine_s']:.0f} engine-s (k={p['u80_k']}"
              f"{'' if p['u80_reached'] else ', not reached: the largest k'}, power "
              f"{p['u80_power']:.1%}); race budget {p['race_budget']:.0f}: power "
              f"{_pct(p['race_power'])}, spent {p['race_engine_s']:.0f} = "
              f"{p['race_engine_s'] / p['u80_engine_s']:.2f} of U80, wrong "
              f"{_pct(p['race_wrong'])}, unresolved/band {_pct(p['race_unresolved_band'])}")

    def by(cv: float, gain: float, start_effect: bool = True, hit: float = 0.0,
           pattern: str = "uniform", profile: str = "cpu") -> list[Scenario]:
        return [s for s in scns if s.cv == cv and s.gain == gain
                and s.start_effect == start_effect and s.hit == hit and s.pattern == pattern
                and s.profile == profile]

    aa_rows = [s for s in scns if not s.gain]
    max_false = max(race[s].false_promotion or 0.0 for s in aa_rows)
    max_wrong = max(race[s].wrong or 0.0 for s in scns if s.gain)
    p3_hit = min(race[s].power or 0.0 for s in by(0.03, 0.10, hit=HIT))
    p3 = min(race[s].power or 0.0 for s in by(0.03, 0.10))
    p10_default = min(race[s].power or 0.0 for s in by(0.10, 0.10))
    p10 = min((p["race_power"] or 0.0 for p in protocol.values()), default=p10_default)
    ratio40 = max((p["race_engine_s"] / p["u80_engine_s"] for p in protocol.values()),
                  default=math.nan)
    p3_bare = min(race[s].power or 0.0 for s in by(0.03, 0.10, False))
    p10_bare = min(race[s].power or 0.0 for s in by(0.10, 0.10, False))
    cv10 = by(0.10, 0.10)
    ratio10 = max(ratios[s][0] for s in cv10)
    ratio10_bound = not all(ratios[s][1] for s in cv10)
    worst_false = max(aa_rows, key=lambda s: race[s].false_promotion or 0.0)
    f = race[worst_false]
    # Resolution: A/A bands concluded "off"; bands concluded off while the candidate truly
    # gains at least twice the margin (+10% against 5%); bands concluded at CV 3% with +10%.
    off3 = min(race[s].off_band for s in by(0.03, 0.0))
    off10 = min(race[s].off_band for s in by(0.10, 0.0))
    big = [s for s in scns if s.gain >= 2 * PROMOTE.margin]
    worst_off = max(big, key=lambda s: race[s].false_off_band)
    false_off = race[worst_off].false_off_band
    resolved3 = min(1 - race[s].unresolved_band for s in by(0.03, 0.10))

    def worst(rows: Sequence[Scenario], f: Callable[[Figures], float | None]) -> float:
        return min(f(race[s]) or 0.0 for s in rows)

    # the other shapes and the GPU cost profile: the same figures, on their own rows
    split_right = worst([s for s in scns if s.pattern == "split"], lambda f: f.power)
    tied_power = worst([s for s in scns if s.pattern == "tied"], lambda f: f.power)
    gpu_figures = {
        "power_cv3_gain10": worst(by(0.03, 0.10, profile="gpu"), lambda f: f.power),
        "power_cv10_gain10_at_default_budget": worst(by(0.10, 0.10, profile="gpu"),
                                                     lambda f: f.power),
        "off_resolved_cv3": worst(by(0.03, 0.0, profile="gpu"), lambda f: f.off_band),
        "off_resolved_cv10": worst(by(0.10, 0.0, profile="gpu"), lambda f: f.off_band),
        "resolved_cv3_gain10": worst(by(0.03, 0.10, profile="gpu"),
                                     lambda f: 1 - f.unresolved_band),
        "power_interference_cv3_gain10": worst(by(0.03, 0.10, hit=HIT, profile="gpu"),
                                               lambda f: f.power),
        "engine_s_cv3_gain10": max(race[s].engine_s for s in by(0.03, 0.10, profile="gpu")),
    }

    print("\ntargets (race; powers are the worse of the two noise kinds):")
    checks = [
        ("false_promotion", "per-deployment A/A false promotion <= 1% in every scenario",
         max_false <= TARGETS["false_promotion"],
         f"max {max_false:.1%} ({worst_false.name}: {f.false_count}/{f.trials}, 95% upper bound "
         f"{wilson_hi(f.false_count, f.trials):.1%})"),
        ("wrong_candidate", "wrong candidate <= 1% in every scenario",
         max_wrong <= TARGETS["wrong_candidate"], f"max {max_wrong:.1%}"),
        ("power_cv3_gain10", "+10% at CV 3% promoted >= 95%", p3 >= TARGETS["power_cv3"],
         f"{p3:.1%} (window noise only: {p3_bare:.1%})"),
        ("power_cv10_gain10", "+10% at CV 10% promoted >= 80% with 40% of U80 as budget",
         p10 >= TARGETS["power_cv10"],
         f"{p10:.1%} (at the default {args.budget:.0f} engine-s budget: {p10_default:.1%}; "
         f"window noise only: {p10_bare:.1%})"),
        ("budget_ratio_cv10",
         "... within <= 40% of uniform repeats' engine-seconds at equal power",
         ratio40 <= TARGETS["budget_ratio_cv10"] and p10 >= TARGETS["power_cv10"],
         f"race spent {ratio40:.2f} of U80 (at the default budget, vs uniform at the race's "
         f"power: {'>= ' if ratio10_bound else ''}{ratio10:.2f})"),
        ("false_off", "bands concluded off while a candidate truly gains +10% (5% margin) "
         "<= 5%", false_off <= TARGETS["false_off"], f"max {false_off:.1%} ({worst_off.name})"),
        ("off_resolved_cv3", "A/A bands concluded off at CV 3% >= 90%",
         off3 >= TARGETS["off_resolved_cv3"], f"{off3:.1%}"),
        ("off_resolved_cv10", "A/A bands concluded off at CV 10% >= 70%",
         off10 >= TARGETS["off_resolved_cv10"], f"{off10:.1%}"),
        ("resolved_cv3_gain10", "bands concluded at CV 3% with a +10% candidate >= 95%",
         resolved3 >= TARGETS["resolved_cv3_gain10"], f"{resolved3:.1%}"),
        ("power_interference_cv3_gain10", f"+10% at CV 3% promoted >= 85% with {HIT:.0%} of "
         "windows slowed by outside load", p3_hit >= TARGETS["power_interference"],
         f"{p3_hit:.1%} (A/A beside it: off/band "
         f"{min(race[s].off_band for s in by(0.03, 0.0, hit=HIT)):.1%})"),
        ("gpu_profile", "the GPU cost profile meets the CPU profile's targets (CV 3% power and "
         "resolution, off at CV 3% and 10%, interference)",
         gpu_figures["power_cv3_gain10"] >= TARGETS["power_cv3"]
         and gpu_figures["resolved_cv3_gain10"] >= TARGETS["resolved_cv3_gain10"]
         and gpu_figures["off_resolved_cv3"] >= TARGETS["off_resolved_cv3"]
         and gpu_figures["off_resolved_cv10"] >= TARGETS["off_resolved_cv10"]
         and gpu_figures["power_interference_cv3_gain10"] >= TARGETS["power_interference"],
         ", ".join(f"{k} {v:.1%}" if k != "engine_s_cv3_gain10" else f"{k} {v:.0f}"
                   for k, v in gpu_figures.items())),
        ("demo_starts", "the demo's plan at CV 3% (its windows' noise within a start): the "
         "race's engine starts at most the grid's plus one baseline start per round in >= 95% of "
         "sweeps, with false and wrong promotion <= 1%",
         (d := demo_summary(demo))["demo_starts_within"] >= TARGETS["demo_starts_within"]
         and d["demo_max_false_promotion"] <= TARGETS["false_promotion"]
         and d["demo_max_wrong"] <= TARGETS["wrong_candidate"],
         f"{d['demo_starts_within']:.1%} of sweeps (CV 10%: {d['demo_starts_within_cv10']:.1%}); "
         f"false promotion {d['demo_max_false_promotion']:.1%}, wrong "
         f"{d['demo_max_wrong']:.1%}"),
    ]
    for _, what, met, detail in checks:
        print(f"  [{'met' if met else 'NOT MET'}] {what}: {detail}")
    print(f"\nother shapes (race, CPU profile): a gain at level 1 and a loss at level 8 ('split'):"
          f" both right (c3 at level 1, off at level 8) in {split_right:.1%} of sweeps; two "
          f"near-tied winners ('tied', c3 +10% and c5 +9%): one of them promoted in every band "
          f"in {tied_power:.1%}; wrong candidate or a promotion where off is right: counted in "
          "'wrong' above")
    demo_table(demo)
    print(f"\nwall time {wall:.0f} s")

    per = {
        s.name: {"race": _fig_json(race[s]),
                 **({"uniform": _fig_json(uniform[s]), "tune": _fig_json(tune[s])}
                    if s in tune else {})}
        for s in scns}
    summary = {
        "max_false_promotion": max_false,
        "max_wrong_candidate": max_wrong,
        "power_cv3_gain10": p3,
        "power_cv10_gain10": p10,
        "power_cv3_gain10_no_start_effect": p3_bare,
        "power_cv10_gain10_no_start_effect": p10_bare,
        "budget_ratio_cv10": ratio40,
        "budget_ratio_cv10_at_default_budget": ratio10,
        "budget_ratio_cv10_at_default_budget_lower_bound": ratio10_bound,
        "power_cv10_gain10_at_default_budget": p10_default,
        "off_resolved_cv3": off3,
        "off_resolved_cv10": off10,
        "max_false_off": false_off,
        "resolved_cv3_gain10": resolved3,
        "power_interference_cv3_gain10": p3_hit,
        **demo_summary(demo),
        "demo_plan": demo,
        **lat_summary,
        "split_right": split_right,
        "tied_power": tied_power,
        "gpu": gpu_figures,
        "profiles": {k: {"start_s": v[0], "window_s": v[1], "budget_scale": v[2]}
                     for k, v in PROFILES.items()},
        "cv10_protocol": {s.name: p for s, p in protocol.items()},
        "trials": trials,
        "uniform_trials": u_trials,
        "race_budget_engine_s": args.budget,
        "start_s": START_S,
        "window_s": WINDOW_S,
        "seed": args.seed,
        "quick": args.quick,
        "smoke": args.smoke,
        "code": code,
        "max_false_promotion_count": f"{f.false_count}/{f.trials}",
        "max_false_promotion_upper95": wilson_hi(f.false_count, f.trials),
        "targets_met": {key: met for key, _, met, _ in checks},
        "wall_s": round(wall, 1),
        "scenarios": per,
    }
    print(json.dumps(summary))
    return 0


OVERLOAD_LOADS = (0.5, 0.75, 1.25, 2.0)
"""Offered load over capacity in the overload detector's rows."""


def overload_figures(trials: int, seed: int) -> dict[str, dict[str, float]]:
    """The overload detector (`specflow.stats.queueing.backlog`) on simulated servers of known
    capacity: 4 slots, gamma(8) service times of mean 1 s (capacity 4 req/s), Poisson arrivals
    scaled to span N / rate as vLLM's bench scales them; the share of windows called overload
    per offered load (capacity multiples) and window size."""
    out: dict[str, dict[str, float]] = {}
    for n in (12, 32):
        for load in OVERLOAD_LOADS:
            rate, hits = 4.0 * load, 0
            for t in range(trials):
                rng = np.random.default_rng([seed, n, int(load * 100), t])
                service = rng.gamma(8.0, 1 / 8.0, n)
                gaps = np.cumsum(rng.exponential(1 / rate, n))
                arrivals = gaps * (n / rate) / gaps[-1]
                hits += backlog(arrivals, served(arrivals, 4, service), rate).overload
            out.setdefault(f"n{n}", {})[f"load{load:g}"] = hits / trials
    return out


def latency_report(latency: Mapping[Scenario, Figures], overload_trials: int = OVERLOAD_TRIALS
                   ) -> dict[str, Any]:
    """The latency-objective rows (the race) as a table, their targets and their figures."""
    rows = list(latency.items())
    table(f"LATENCY OBJECTIVE (race; open-loop windows: mean e2el over {LATENCY_REQUESTS} "
          "lognormal requests, start effect, drift)", rows, "unres/band")
    aa = [f for s, f in rows if not s.gain]
    out = {
        "latency_max_false_promotion": max(f.false_promotion or 0.0 for f in aa),
        "latency_power_cv3_gain10": min(f.power or 0.0 for s, f in rows
                                        if s.cv == 0.03 and s.gain),
        "latency_power_cv10_gain10": min(f.power or 0.0 for s, f in rows
                                         if s.cv == 0.10 and s.gain),
        "latency_off_resolved_cv3": min(f.off_band for s, f in rows
                                        if s.cv == 0.03 and not s.gain),
        "latency_off_resolved_cv10": min(f.off_band for s, f in rows
                                         if s.cv == 0.10 and not s.gain),
        "latency_max_wrong_candidate": max(f.wrong or 0.0 for s, f in rows if s.gain),
    }
    for key, bound in LATENCY_TARGETS.items():
        met = out[key] <= bound if key == "latency_max_false_promotion" else out[key] >= bound
        print(f"  [{'met' if met else 'NOT MET'}] {key} {out[key]:.1%} "
              f"({'<=' if 'false' in key else '>='} {bound:.0%})")
    out["latency_targets_met"] = all(
        out[k] <= b if k == "latency_max_false_promotion" else out[k] >= b
        for k, b in LATENCY_TARGETS.items())
    over = overload_figures(overload_trials, 0)
    print(f"\noverload detector, simulated servers (4 slots, capacity 4 req/s, {overload_trials} "
          "windows per cell): share of windows called overload")
    print(f"{'requests':<10}" + "".join(f"{f'load {x:g}x':>11}" for x in OVERLOAD_LOADS))
    for size, row in over.items():
        print(f"{size[1:]:<10}" + "".join(f"{v:>11.1%}" for v in row.values()))
    out["overload_false_half_capacity_n32"] = over["n32"]["load0.5"]
    out["overload_detected_twice_capacity_n32"] = over["n32"]["load2"]
    out["overload_detector"] = over
    out["latency_scenarios"] = {s.name: _fig_json(f) for s, f in rows}
    return out


def demo_summary(demo: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The demo plan's figures over its rows: the worst of each."""
    def worst(cv: str, key: str) -> float:
        return min(r[key] for name, r in demo.items() if name.endswith(f" cv{cv}"))

    return {"demo_starts_within": worst("3%", "starts_within"),
            "demo_starts_within_cv10": worst("10%", "starts_within"),
            "demo_max_false_promotion": max(r["false_promotion"] for r in demo.values()),
            "demo_max_wrong": max(r["wrong"] for r in demo.values()),
            "demo_right": worst("3%", "right"), "demo_right_cv10": worst("10%", "right")}


def demo_table(demo: Mapping[str, Mapping[str, Any]]) -> None:
    print("\nTHE DEMO'S PLAN (conf/sweep/cpu_demo.yaml's budget: n-gram 2.0x on code, the random "
          "drafter 0.47x; both 0.67-0.77x on classify), raced; the grid's engine starts beside it")
    head = (f"{'row':<22}{'trials':>7}{'grid':>6}{'starts med':>11}{'max':>5}{'rounds':>7}"
            f"{'<= grid+rounds':>15}{'false prom':>11}{'wrong':>7}{'right':>7}"
            f"{'concluded':>10}")
    print(head)
    print("-" * len(head))
    for name, r in demo.items():
        print(f"{name:<22}{r['trials']:>7}{r['grid_starts']:>6}{r['starts_median']:>11.0f}"
              f"{r['starts_max']:>5}{r['rounds_max']:>7}{_pct(r['starts_within']):>15}"
              f"{_pct(r['false_promotion']):>11}{_pct(r['wrong']):>7}{_pct(r['right']):>7}"
              f"{_pct(r['resolved_band']):>10}" + (f"  ({r['errors']} not analysable)"
                                                    if r["errors"] else ""))


def _fig_json(f: Figures) -> dict[str, Any]:
    out = {k: v for k, v in f.__dict__.items() if v is not None}
    return {k: (round(v, 4) if isinstance(v, float) else
                {w: round(x, 4) for w, x in v.items()} if isinstance(v, dict) else v)
            for k, v in out.items()}


if __name__ == "__main__":
    sys.exit(main())
