"""Search cost at GPU scale, simulated: the adaptive search against the racing grid.

Run: .venv/bin/python bench/search_cost_simulated.py [--trials 60] [--seed 0] [--workers 2]
     [--max-k 6] [--smoke]
(--smoke: one trial per design and plan, uniform repeats at k = 2 only, seconds: the whole code
path, figures that mean nothing)

The real round planner and decision code (`specflow.search.rounds`, `specflow.decision`) on a
GPU-sized plan, measured by `specflow.search.simulate` instead of an engine: three drafters x
N = 1..7, four concurrency levels (1, 8, 32, 128), two traffic classes (chat, code). Each design
runs `--trials` sweeps; the adaptive search's and the racing grid's (`sweep.search:
exhaustive`, the same race) engine-seconds are compared, and their decisions per band. A third
design, uniform repeats (every config started k times in one round, then a closing baseline
start, decided once with Holm over the candidates), is run at k = 2, 3, ... until its share of
bands decided right reaches the adaptive search's (equal error), at most k = --max-k.

Two plans. `chains` (the plan the search exists for): three chain drafters. `mixed`: its MTP
replaced by one that is not a chain, which the search must detect and measure per N.
True acceptance (per-position unconditional rates per class; what the windows report, 1% noise):
- eagle3. code: the GPU check's emulated EAGLE-3 rates (acceptance length 3.49 at N=7,
  yuhuili/EAGLE3-LLaMA3.1-Instruct-8B on HumanEval); chat: vLLM CI's Llama-3.1-8B EAGLE-3 rates
  (MT-Bench, N=3: 0.7296, 0.5208, 0.3545), each further position 0.7 x the one before (assumed).
- draft_model. code: the GPU check's draft-model rates (0.60, 0.40, 0.27, 0.18, 0.12, 0.08,
  0.05; assumed there); chat: 0.85 x those (assumed).
- mtp (`chains`): InferenceX's golden acceptance length of DeepSeek-V4-Pro's MTP for N=1..7
  (1.79, 2.27, 2.49, 2.54, 2.55, 2.55, 2.54) as a chain: the rates are its increments, clipped
  at 0. chat: 0.85 x those (assumed).
- mtp (`mixed`): a multi-layer MTP that is not a chain (vLLM PR 48892, GSM8K): the rates at N=8
  are 0.762, 0.616, 0.513, 0.424, 0.364, 0.309, 0.272, 0.237 and the first position is
  accepted 0.834 at N=1; at N=k the first position is interpolated linearly between the two
  (assumed) and the later positions keep their conditional rates. chat: 0.85 x (assumed).

True step cost (the predictor does not share it; it assumes cost linear in N): a decode step of
c requests with K drafted tokens verifies c(K+1) tokens, memory-bound (flat) until the batch's
tokens reach a compute knee of 256 and growing linearly beyond it (the roofline of an 8B model on
an H100/H200-class GPU, where decode turns compute-bound at a few hundred tokens per step); the
drafter adds K passes per step: eagle3 0.04, mtp 0.06, draft_model 0.15 of a target step each
(its own knee at 4x fewer requests). speedup(c, K) = MAL(K) T(c, 0) / T(c, K).

GPU-shaped costs: 120 s per engine start (an 8B model loaded and its CUDA graphs captured) and
60 s per window; noise: Student-t(3) windows at CV 3%, a 3% start effect.

Right and same: a band's decision is right when it deploys off where nothing truly beats
1 + margin, or a candidate whose true worst-level speedup beats 1 + margin and is within the tie
tolerance (2%) of the best's; two decisions are the same when both are off, both unresolved, or
both deploy candidates whose true speedups are within the tie tolerance of each other.

Prints per design the engine starts, windows and engine-seconds, the adaptive / grid ratio, the
share of bands where the two decide alike, each against the truth, the predictor's acceptance
length error on the chain series and how often the non-chain series was flagged; where each
design's engine-seconds go (round 0 and the later rounds by stage, the baseline's apart); and the
share of bands decided the same within the promotion margin (both deploy engines whose true
speedups are closer than the margin; `same_decision_within_margin`). Two bounds beside them:
the most any design can agree with the racing grid (`same_decision_ceiling`: per band, the
grid's trials that agree with the one answer most of them agree with; the grid itself is noisy
between near-tied N) and the adaptive search's floor (`engine_seconds_floor`: its own probe
round, then one confirmation look of each band's true winner and nothing else; also with
`confirm_starts` 1 and with the probes between two baseline starts only). The last line
is one JSON object: engine_seconds_ratio_simulated, same_decision_simulated, mal_error_median,
prediction_flagged, engine_seconds_ratio_uniform (adaptive / uniform repeats at equal error; a
lower bound when no k up to --max-k reached it), and the designs' means.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specflow.decision.choose import analyze  # noqa: E402
from specflow.decision.model import Analysis, AnalysisError  # noqa: E402
from specflow.records.measurement import Measurement  # noqa: E402
from specflow.search import predict, rounds, simulate  # noqa: E402
from specflow.search.budget import PlannedStart, round_cost  # noqa: E402
from specflow.search.plan import band_keys, final_rules, spent_by, split_baseline  # noqa: E402
from specflow.spec.schema import PromoteSpec  # noqa: E402

console = Console(width=120)
PROMOTE = PromoteSpec(bootstrap_samples=100)
LEVELS = (1, 8, 32, 128)
WORKLOADS = {"w0": "chat", "w1": "code"}
NS = range(1, 8)
KNEE = 256.0
NOISE = simulate.NoiseModel(cv=0.03, start_sd=0.03, start_s=120.0, window_s=60.0)

EAGLE3_CODE = (0.75, 0.55, 0.40, 0.29, 0.21, 0.16, 0.13)
EAGLE3_CHAT = (0.7296, 0.5208, 0.3545, *(0.3545 * 0.7**i for i in range(1, 5)))
DRAFT_CODE = (0.60, 0.40, 0.27, 0.18, 0.12, 0.08, 0.05)
DSV4_MTP_AL = (1.79, 2.27, 2.49, 2.54, 2.55, 2.55, 2.54)
MTP_N8 = (0.762, 0.616, 0.513, 0.424, 0.364, 0.309, 0.272, 0.237)
MTP_N1_FIRST = 0.834
DRAFT_COST = {"eagle3": 0.04, "mtp": 0.06, "draft_model": 0.15}
CHAT = 0.85
"""chat's rates over code's, where only one class is published (assumed)."""


def mtp_rates(plan: str, k: int) -> tuple[float, ...]:
    """The MTP's rates at N = k: the DeepSeek-V4-Pro golden curve's increments (a chain), or
    the multi-layer MTP of PR 48892 (its first position between 0.834 at N=1 and 0.762 at N=8,
    the later positions at N=8's conditional rates: not a chain)."""
    if plan == "chains":
        steps = np.diff((1.0, *DSV4_MTP_AL))
        return tuple(float(max(0.0, r)) for r in steps[:k])
    first = MTP_N1_FIRST + (MTP_N8[0] - MTP_N1_FIRST) * (k - 1) / 7
    return tuple(first * r / MTP_N8[0] for r in MTP_N8[:k])


def true_rates(plan: str, method: str, k: int, cls: str) -> tuple[float, ...]:
    scale = 1.0 if cls == "code" else CHAT
    if method == "eagle3":
        return (EAGLE3_CODE if cls == "code" else EAGLE3_CHAT)[:k]
    if method == "draft_model":
        return tuple(scale * r for r in DRAFT_CODE[:k])
    return tuple(scale * r for r in mtp_rates(plan, k))


def step_cost(method: str, c: int, k: int) -> float:
    """Relative time of one decode step (the true model; see the module docstring)."""
    verify = max(1.0, c * (k + 1) / KNEE)
    if k == 0:
        return verify
    return verify + DRAFT_COST[method] * k * max(1.0, 4 * c / KNEE)


def true_speedup(plan: str, method: str, k: int, cls: str, c: int) -> float:
    mal = 1 + sum(true_rates(plan, method, k, cls))
    return mal * step_cost(method, c, 0) / step_cost(method, c, k)


def build_scenario(plan: str, search: str
                   ) -> tuple[simulate.Scenario, dict[str, tuple[str, int]]]:
    """A GPU plan as a simulated scenario (engine hash -> (method, N))."""
    from specflow.spec.compile import EngineConfig

    engines = {"base": simulate.Engine("base", "baseline", "none", 0)}
    what: dict[str, tuple[str, int]] = {}
    for method in ("eagle3", "mtp", "draft_model"):
        for k in NS:
            h = f"{method}{k}"
            engines[h] = simulate.Engine(h, f"{method}-n{k}", method, k)
            what[h] = (method, k)
    configs = []
    for h, e in engines.items():
        spec = {"method": e.method, "num_speculative_tokens": e.n} if e.n else None
        configs.append((h, EngineConfig(e.name, e.method, e.method, e.n, spec,
                                        ("vllm", "serve", "sim", h), e.n)))
    by_name = {ec.hash: h for h, ec in configs}
    chains = {by_name[ec_hash]: replace(ch, probe=by_name[ch.probe])
              for ec_hash, ch in predict.chains([ec for _, ec in configs]).items()}
    base = simulate.scenario("race", candidates=2, classes=2, levels=LEVELS)
    shape = replace(base.shape, candidates=tuple(what), workloads=WORKLOADS,
                    search=search,  # type: ignore[arg-type]
                    chains=chains if search == "adaptive" else {})
    gains = {(h, w, c): true_speedup(plan, m, k, cls, c)
             for h, (m, k) in what.items() for w, cls in WORKLOADS.items() for c in LEVELS}
    rates = {(h, w): true_rates(plan, m, k, cls) for h, (m, k) in what.items()
             for w, cls in WORKLOADS.items()}
    return simulate.Scenario(shape, engines, point_gains=gains, rates=rates), what


@dataclass(frozen=True)
class Trial:
    engine_s: float
    starts: int
    windows: int
    decisions: tuple[tuple[str, str], ...]
    """(band, deployed engine hash, or off / unresolved)."""
    mal_errors: tuple[float, ...] = ()
    flagged: tuple[bool, ...] = ()
    """Per band of the probe round: the MTP series' chain check missed."""
    error: str = ""
    by_stage: tuple[tuple[str, float], ...] = ()
    """Engine-seconds per part of the sweep (`_by_stage`)."""


def _by_stage(ms: Sequence[Measurement], baseline: str) -> tuple[tuple[str, float], ...]:
    """Engine-seconds of round 0 (the adaptive search's probe round; the grid's exploration of
    every config) and of the later rounds by stage, the baseline's apart from the candidates'."""
    parts: dict[str, list[Measurement]] = defaultdict(list)
    for m in ms:
        who = "baseline" if m.key.engine_hash == baseline else "candidates"
        parts[f"{'round 0' if m.round == 0 else m.stage + ' rounds'}, {who}"].append(m)
    return tuple(sorted((k, spent_by(v).engine_seconds) for k, v in parts.items()))


def _decisions(result: Analysis) -> tuple[tuple[str, str], ...]:
    out = []
    for r in sorted(result.classes, key=lambda r: r.traffic_class):
        for d in sorted(r.decisions, key=lambda d: d.band.lo):
            out.append((f"{r.traffic_class} {d.band.label}",
                        d.winner.engine_hash if d.winner is not None else d.outcome))
    return tuple(out)


def _checks(prog: Any, what: Mapping[str, tuple[str, int]], plan: str
            ) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """The probe round's chain checks: the acceptance-length error of the chain series' checks,
    and whether the MTP series' check missed."""
    errors, flagged = [], []
    for r in prog.rounds[:1]:
        for st in r.states:
            for probe, note in st.notes:
                method = what[probe][0]
                missed = " missed: " in note
                if method == "mtp":
                    flagged.append(missed)
                if method != "mtp" or plan == "chains":
                    got = note.split("acceptance length ")[1].split(" measured, ")
                    measured, predicted = float(got[0]), float(got[1].split(" ")[0])
                    errors.append(abs(predicted / measured - 1))
    return tuple(errors), tuple(flagged)


def trial(args: tuple[str, str, int, int]) -> Trial:
    plan, search, seed, index = args
    scn, what = build_scenario(plan, search)
    rng = np.random.default_rng(np.random.SeedSequence((seed, index)))
    try:
        prog, ms = simulate.run_sweep(scn, NOISE, PROMOTE, seed=int(rng.integers(2**62)))
    except RuntimeError as exc:
        return Trial(0, 0, 0, (), error=str(exc)[:200])
    spent = prog.spent
    if prog.problems:
        return Trial(spent.engine_seconds, spent.engine_starts, spent.windows, (),
                     error="; ".join(prog.problems)[:200])
    opening, later = split_baseline(ms, scn.shape.baseline)
    try:
        result = analyze(opening, final_rules(PROMOTE), closing_baseline=later,
                         race=prog.states)
    except AnalysisError as exc:
        return Trial(spent.engine_seconds, spent.engine_starts, spent.windows, (),
                     error=str(exc)[:200])
    errors, flagged = _checks(prog, what, plan) if search == "adaptive" else ((), ())
    return Trial(spent.engine_seconds, spent.engine_starts, spent.windows, _decisions(result),
                 errors, flagged, by_stage=_by_stage(ms, scn.shape.baseline))


def uniform_trial(args: tuple[str, int, int, int]) -> Trial:
    """Uniform repeats: every config started k times, decided once (one look: the plain rules,
    Holm over every candidate, class and band)."""
    plan, k, seed, index = args
    scn, _ = build_scenario(plan, "exhaustive")
    rng = np.random.default_rng(np.random.SeedSequence((seed, index, k)))
    ms = simulate.run_round(scn, NOISE, simulate.fixed_round(scn.shape, k, closing=True), rng)
    spent = spent_by(ms)
    opening, later = split_baseline(ms, scn.shape.baseline)
    try:
        result = analyze(opening, PROMOTE, closing_baseline=later, family="holm")
    except AnalysisError as exc:
        return Trial(spent.engine_seconds, spent.engine_starts, spent.windows, (),
                     error=str(exc)[:200])
    return Trial(spent.engine_seconds, spent.engine_starts, spent.windows, _decisions(result))


def _means(ts: list[Trial], truth: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    ok = [t for t in ts if not t.error]
    hits = [right(d, truth[b]) for t in ok for b, d in t.decisions]
    return {"engine_s": statistics.fmean(t.engine_s for t in ok) if ok else 0.0,
            "starts": statistics.fmean(t.starts for t in ok) if ok else 0.0,
            "windows": statistics.fmean(t.windows for t in ok) if ok else 0.0,
            "right": sum(hits) / len(hits) if hits else 0.0,
            "errors": len(ts) - len(ok),
            "by_stage": {k: sum(dict(t.by_stage).get(k, 0.0) for t in ok) / len(ok)
                         for k in sorted({k for t in ok for k, _ in t.by_stage})} if ok else {}}


def uniform_at_equal_error(pool: ProcessPoolExecutor, plan: str, trials: int, seed: int,
                           max_k: int, target: float,
                           truth: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """The fewest starts per config (k >= 2: one start has no start-to-start variance) at which
    uniform repeats decide `target`'s share of bands right, or k = max_k if none does."""
    for k in range(2, max_k + 1):
        out = _means(list(pool.map(uniform_trial, [(plan, k, seed, i) for i in range(trials)])),
                     truth)
        if out["right"] >= target:
            break
    return out | {"k": k, "reached": out["right"] >= target}


def band_speedups(plan: str) -> dict[str, dict[str, float]]:
    """Per band label (`<class> c<level>`): every engine's true worst-level speedup."""
    from specflow.decision.bands import bands_for

    bands, _, _ = bands_for(PROMOTE, LEVELS)
    _, what = build_scenario(plan, "exhaustive")
    return {f"{cls} {band.label}": {h: min(true_speedup(plan, m, k, cls, c) for c in LEVELS
                                           if c in band) for h, (m, k) in what.items()}
            for cls in WORKLOADS.values() for band in bands}


def right(decision: str, truth: Mapping[str, float]) -> bool:
    best = max(truth.values())
    if best <= 1 + PROMOTE.margin:
        return decision == "off"
    return decision in truth and truth[decision] > 1 + PROMOTE.margin and \
        truth[decision] * (1 + PROMOTE.tie_tolerance) >= best


def same(a: str, b: str, truth: Mapping[str, float], tolerance: float = PROMOTE.tie_tolerance
         ) -> bool:
    if a in truth and b in truth:
        lo, hi = sorted((truth[a], truth[b]))
        return lo * (1 + tolerance) >= hi
    return a == b


def agreement_ceiling(grid: Sequence[Trial], truth: Mapping[str, Mapping[str, float]]
                      ) -> float:
    """The most any design's decisions can agree with the racing grid's (`same`), on average
    over the bands: per band, the share of the grid's trials that decide the same as the one
    answer most of them agree with. Two designs' trials are independent, so a design answering
    a with probability p(a) agrees with the grid with probability sum p(a) P(same(a, grid)) <=
    max over a. Estimated from the grid's trials (the max over answers is biased upward)."""
    ok = [t for t in grid if not t.error and t.decisions]
    if not ok:
        return math.nan
    out = []
    for i, (band, _) in enumerate(ok[0].decisions):
        got = [t.decisions[i][1] for t in ok]
        answers = {*truth[band], "off", "unresolved", *got}
        out.append(max(sum(same(a, g, truth[band]) for g in got) for a in answers) / len(got))
    return statistics.fmean(out)


def engine_seconds_floor(plan: str, confirm_starts: int, bracketed: bool = False) -> float:
    """The adaptive search at its best: its own probe round (`rounds.first_round`: each
    drafter's probe at every point, the chain checks, the baseline starts among them) and then
    at once one confirmation look (`rounds.confirm_plan`) of each band's true winner,
    `confirm_starts` fresh starts at its bands' points, with the look's baseline starts at every
    confirmed point; nothing explored between, no second look. Its engine-seconds at the bench's
    costs. `bracketed`: the probe round between two baseline starts only (the fewest a
    time-local baseline allows)."""
    scn, _ = build_scenario(plan, "adaptive")
    shape = scn.shape
    if bracketed:
        shape = replace(shape, baseline_every=len(shape.candidates))
    held = rounds.held_back(shape, frozenset())
    probes = rounds.first_round(shape, [h for h in shape.candidates if h not in held], held)
    truth = band_speedups(plan)
    per: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for (cls, label), points in band_keys(shape, PROMOTE).items():
        v = truth[f"{cls} {label}"]
        best = max(v, key=lambda h: v[h])
        if v[best] > 1 + PROMOTE.margin:
            per[best].update(points)
    base = (shape.baseline, "confirm", tuple(sorted({p for ps in per.values() for p in ps})),
            shape.repeats)
    look = rounds.confirm_plan(base, [((h, "confirm", tuple(sorted(per[h])), shape.repeats),
                                       confirm_starts) for h in shape.candidates if h in per])
    return round_cost([PlannedStart(*x) for x in (*probes, *look)], NOISE.start_s,
                      NOISE.window_s).engine_seconds


def run_plan(pool: ProcessPoolExecutor, plan: str, trials: int, seed: int, max_k: int
             ) -> dict[str, Any]:
    results = {search: list(pool.map(trial, [(plan, search, seed, i) for i in range(trials)]))
               for search in ("adaptive", "exhaustive")}
    truth = band_speedups(plan)
    out: dict[str, Any] = {"plan": plan}
    for search, ts in results.items():
        out[search] = _means(ts, truth)
    out["uniform"] = uniform_at_equal_error(pool, plan, trials, seed, max_k,
                                            out["adaptive"]["right"], truth)
    pairs = [(a, g) for a, g in zip(results["adaptive"], results["exhaustive"], strict=True)
             if not a.error and not g.error]
    both = [(da, dg, truth[b]) for a, g in pairs
            for (b, da), (_, dg) in zip(a.decisions, g.decisions, strict=True)]
    agree = [same(*x) for x in both]
    # the same within the promotion margin: both deploy engines whose true speedups are closer
    # than the margin, a difference no decision at this margin is meant to resolve
    near = [same(*x, PROMOTE.margin) for x in both]
    errors = [e for t in results["adaptive"] for e in t.mal_errors]
    flagged = [f for t in results["adaptive"] for f in t.flagged]
    grid, uniform = out["exhaustive"]["engine_s"], out["uniform"]["engine_s"]
    confirm_starts = build_scenario(plan, "adaptive")[0].shape.budget.confirm_starts
    out |= {"ratio": out["adaptive"]["engine_s"] / grid if grid else math.nan,
            "floor": engine_seconds_floor(plan, confirm_starts) / grid if grid else math.nan,
            "floor_one_start": engine_seconds_floor(plan, 1) / grid if grid else math.nan,
            "floor_bracketed": (engine_seconds_floor(plan, confirm_starts, bracketed=True) / grid
                                if grid else math.nan),
            "confirm_starts": confirm_starts,
            "ceiling": agreement_ceiling(results["exhaustive"], truth),
            "ratio_uniform": out["adaptive"]["engine_s"] / uniform if uniform else math.nan,
            "same": sum(agree) / len(agree) if agree else math.nan,
            "same_within_margin": sum(near) / len(near) if near else math.nan,
            "mal_error_median": statistics.median(errors) if errors else math.nan,
            "flagged": sum(flagged) / len(flagged) if flagged else math.nan,
            "truth": {b: max(v, key=lambda h: v[h]) if max(v.values()) > 1 + PROMOTE.margin
                      else "off" for b, v in truth.items()}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-k", type=int, default=6,
                    help="the most starts per config tried for uniform repeats")
    ap.add_argument("--smoke", action="store_true",
                    help="the whole code path at its smallest: --trials 1 --max-k 2")
    args = ap.parse_args()
    if args.smoke:
        args.trials, args.max_k = 1, 2
    if args.max_k < 2:
        ap.error(f"--max-k {args.max_k}: uniform repeats need at least 2 starts per config")
    with ProcessPoolExecutor(args.workers) as pool:
        plans = {plan: run_plan(pool, plan, args.trials, args.seed, args.max_k)
                 for plan in ("chains", "mixed")}
    table = Table(title=f"GPU plans, simulated: 3 drafters x N=1..7, c={list(LEVELS)}, "
                        f"2 classes, {args.trials} trials per design")
    for col in ("plan", "design", "engine starts", "windows", "engine-s", "ratio",
                "bands right", "same decision", "errors"):
        table.add_column(col, justify="left" if col in ("plan", "design") else "right")
    names = {"exhaustive": "racing grid", "adaptive": "adaptive search"}
    for plan, r in plans.items():
        u = r["uniform"]
        names["uniform"] = f"uniform repeats, k={u['k']}" + ("" if u["reached"] else
                                                             " (short of equal error)")
        for search in ("exhaustive", "adaptive", "uniform"):
            m = r[search]
            ratio = {"adaptive": f"{r['ratio']:.3f}", "exhaustive": "1"}.get(
                search, f"{m['engine_s'] / r['exhaustive']['engine_s']:.3f}")
            table.add_row(plan, names[search], f"{m['starts']:.1f}", f"{m['windows']:.0f}",
                          f"{m['engine_s']:.0f}", ratio, f"{m['right']:.0%}",
                          f"{r['same']:.0%}" if search == "adaptive" else "-", str(m["errors"]))
    console.print(table)
    for plan, r in plans.items():
        console.print(f"{plan}: truth per band: " + "; ".join(
            f"{b}: {h}" for b, h in sorted(r["truth"].items())))
        u = r["uniform"]
        console.print(f"{plan}: adaptive / uniform repeats (k={u['k']}, bands right "
                      f"{u['right']:.0%} against the search's {r['adaptive']['right']:.0%}): "
                      f"{'<= ' if not u['reached'] else ''}{r['ratio_uniform']:.3f}")
        console.print(f"{plan}: chain checks: acceptance length error median "
                      f"{r['mal_error_median']:.4f}; the MTP series flagged as not a chain in "
                      f"{r['flagged']:.0%} of band checks")
    parts = Table(title="where the engine-seconds go (mean per sweep; round 0: the adaptive "
                        "search's probe round, the grid's exploration of every config)")
    for col in ("plan", "design", "part", "engine-s", "of the racing grid"):
        parts.add_column(col, justify="left" if col in ("plan", "design", "part") else "right")
    for plan, r in plans.items():
        grid = r["exhaustive"]["engine_s"]
        for search in ("exhaustive", "adaptive"):
            for part, v in r[search]["by_stage"].items():
                parts.add_row(plan, names[search], part, f"{v:.0f}", f"{v / grid:.3f}")
    console.print(parts)
    for plan, r in plans.items():
        console.print(f"{plan}: same decision within the tie tolerance "
                      f"({PROMOTE.tie_tolerance:.0%}) {r['same']:.1%}; within the margin "
                      f"({PROMOTE.margin:.0%}) {r['same_within_margin']:.1%}; the most any "
                      f"design can agree with the racing grid: {r['ceiling']:.1%}")
        console.print(f"{plan}: the adaptive search's floor (its probe round, then one look "
                      f"confirming each band's true winner): {r['floor']:.3f} of the racing "
                      f"grid with confirm_starts {r['confirm_starts']}, "
                      f"{r['floor_one_start']:.3f} with 1; {r['floor_bracketed']:.3f} with "
                      "its probes between two baseline starts only")
    chains, mixed = plans["chains"], plans["mixed"]
    print(json.dumps({
        "engine_seconds_ratio_simulated": round(chains["ratio"], 3),
        "same_decision_simulated": round(chains["same"], 3),
        "mal_error_median": round(chains["mal_error_median"], 4),
        "prediction_flagged": round(mixed["flagged"], 3),
        "chain_flagged_falsely": round(chains["flagged"], 3),
        "engine_seconds_ratio_uniform": round(chains["ratio_uniform"], 3),
        "uniform_k": chains["uniform"]["k"], "uniform_reached": chains["uniform"]["reached"],
        "right_uniform": round(chains["uniform"]["right"], 3),
        "engine_seconds_ratio_mixed": round(mixed["ratio"], 3),
        "engine_seconds_ratio_uniform_mixed": round(mixed["ratio_uniform"], 3),
        "same_decision_mixed": round(mixed["same"], 3),
        "same_decision_within_margin": round(chains["same_within_margin"], 3),
        "same_decision_ceiling": round(chains["ceiling"], 3),
        "same_decision_ceiling_mixed": round(mixed["ceiling"], 3),
        "engine_seconds_floor": round(chains["floor"], 3),
        "engine_seconds_floor_confirm_starts_1": round(chains["floor_one_start"], 3),
        "engine_seconds_floor_bracketed": round(chains["floor_bracketed"], 3),
        "engine_seconds_floor_mixed": round(mixed["floor"], 3),
        "same_decision_within_margin_mixed": round(mixed["same_within_margin"], 3),
        "engine_s_by_stage": {names[d]: {k: round(v) for k, v in chains[d]["by_stage"].items()}
                              for d in ("exhaustive", "adaptive")},
        "right_adaptive": round(chains["adaptive"]["right"], 3),
        "right_grid": round(chains["exhaustive"]["right"], 3),
        "right_adaptive_mixed": round(mixed["adaptive"]["right"], 3),
        "right_grid_mixed": round(mixed["exhaustive"]["right"], 3),
        "starts_adaptive": round(chains["adaptive"]["starts"], 1),
        "starts_grid": round(chains["exhaustive"]["starts"], 1),
        "trials": args.trials, "seed": args.seed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
