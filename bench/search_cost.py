"""Search cost: the adaptive search against the grid, on the real CPU engine, in one run.

Run: .venv/bin/python bench/search_cost.py [--workdir DIR] [--models DIR] [--n-max 5]
     [--max-rounds R] [--smoke]
(--smoke: the baseline and n-gram at N = 1..2 only, code completion alone with 2 prompts x 32
tokens, concurrency 1, no closing baseline, one exploration round and at most one confirmation
look of one start a side, the race within 6 engine starts: the whole code path in about a
minute)

The same plan both ways, through the real main job (`pipelines.sweep.run`: Prefect, the vLLM
engine, the ledger, MLflow): the tiny target (`experiment=cpu_tiny`); the baseline, n-gram, the
derived draft model (intermediate acceptance) and the copy draft model, each at N = 1..n-max;
concurrency 1 and 4; cpu_tiny's two workloads (chat, code completion). The grid
(`sweep.design=grid`) starts every config once; the adaptive search (`sweep.design=race
sweep.search=adaptive`, cpu_tiny's race budget without its caps) measures each drafter at its
largest N first, predicts the rest from its per-position acceptance and step cost, starts what
can still win and confirms its selections on fresh engine starts.

Prints the engine starts, windows and engine-seconds of each, their ratio, what each round
of the adaptive search started, whether the decisions agree per (traffic class, band) (the
same deployment, or one the grid itself cannot tell from it: see `_agree`; each with its
outcome: speculate, off or unresolved), and the predictor's error per drafter on the grid's
windows (every N predicted from N = n-max, against what was measured). The last line is one
JSON object: engine_seconds_ratio, same_decision, outcomes, mal_error_median/worst and
speedup_error_median/worst (relative, absolute values, chain drafters), starts and windows
(also per round). Run again with the same --workdir, it measures nothing and reprints.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specflow.cli import orchestration_env
from specflow.decision.model import Analysis
from specflow.demo import tiny
from specflow.search import predict
from specflow.search.plan import spent_by
from specflow.steps.context import open_sweep
from specflow.steps.decide import analyse

console = Console(width=120)
SMOKE = ["drafter=[none,ngram]", "workload=[code_completion]",
         "workload.code_completion.num_prompts=2", "workload.code_completion.max_tokens=32",
         "sweep.concurrency=[1]", "sweep.closing_baseline_repeats=0",
         "sweep.budget.confirm_starts=1", "sweep.budget.max_confirm_starts=2",
         "sweep.budget.max_rounds=1", "sweep.budget.confirm_looks=1",
         "backend.engine.distributed_executor_backend=uni"]
"""--smoke's plan (with --n-max 2): the fewest engine starts that still run both designs and the
adaptive search's prediction (N=1 from N=2), each start ~8 s shorter under the `uni` executor;
its race also gets a budget of 6 engine starts, so that a band the exploration leaves open ends
unresolved instead of in a long confirmation."""


def _overrides(models: Path, out: Path, n_max: int, smoke: bool) -> list[str]:
    n = f"1..{n_max}"
    plan = [f"sweep.num_speculative_tokens.ngram={n}", *SMOKE] if smoke else [
        "drafter=[none,ngram,draft_model_derived,draft_model]",
        f"sweep.num_speculative_tokens.ngram={n}",
        f"+sweep.num_speculative_tokens.draft_model_derived={n}",
        f"sweep.num_speculative_tokens.draft_model={n}"]
    return ["experiment=cpu_tiny", *plan, "sweep.max_engine_configs=64",
            f"paths.models={models}", f"tracking.workdir={out}",
            f"tracking.uri=sqlite:///{out / 'mlflow.db'}", f"promote.output_dir={out / 'promoted'}"]


def _sweep(overrides: list[str]) -> dict[str, Any]:
    orchestration_env()  # as `python -m specflow` runs it: no telemetry, quiet logs
    from pipelines.sweep import run

    started = time.monotonic()
    run(overrides)
    wall = time.monotonic() - started
    ctx = open_sweep(overrides, tracking=False)
    ms = ctx.ledger.measurements()
    result, _ = analyse(ctx)
    return {"wall_s": wall, "spent": spent_by(ms), "result": result, "measurements": ms,
            "configs": ctx.plan.engine_configs, "margin": ctx.spec.promote.margin}


def _decisions(result: Analysis) -> dict[tuple[str, str], str]:
    return {(r.traffic_class, d.band.label): d.winner.engine_hash if d.winner else "off"
            for r in result.classes for d in r.decisions}


def _agree(grid: Analysis, adaptive: Analysis, names: dict[str, str], margin: float
           ) -> list[dict[str, Any]]:
    """Per band: the two decisions and whether the grid can tell them apart.

    Two deployments: the same, or their grid intervals overlap. The grid promoted nothing and
    the adaptive search confirmed a candidate: the grid cannot tell them apart unless its own
    data rule that candidate out (a gate other than the statistical ones, or an interval wholly
    below 1 + margin). The grid promoted one and the adaptive search nothing: they disagree."""
    verdicts = {(r.traffic_class, d.band.label): {v.engine_hash: v for v in d.candidates}
                for r in grid.classes for d in r.decisions}
    ga, aa = _decisions(grid), _decisions(adaptive)
    rows = []
    for band in sorted(set(ga) | set(aa)):
        g, a = ga.get(band, "off"), aa.get(band, "off")
        va, vg = verdicts.get(band, {}).get(a), verdicts.get(band, {}).get(g)
        if g == a:
            same = True
        elif g == "off":
            same = (va is not None and va.worst is not None
                    and va.worst.speedup.hi >= 1 + margin
                    and all(r.gate in ("speedup", "family", "race") for r in va.rejected))
        elif a == "off" or va is None or vg is None or va.worst is None or vg.worst is None:
            same = False
        else:
            same = (va.worst.speedup.lo <= vg.worst.speedup.hi
                    and vg.worst.speedup.lo <= va.worst.speedup.hi)
        rows.append({"band": f"{band[0]} {band[1]}", "grid": names.get(g, g),
                     "adaptive": names.get(a, a), "agree": same})
    return rows


def _per_round(ms: list[Any], names: dict[str, str]) -> list[dict[str, Any]]:
    """The adaptive search's spend by (round, stage), in run order, with the engines started
    (a name repeated once per start)."""
    groups: dict[tuple[int, str], list[Any]] = {}
    for m in sorted(ms, key=lambda m: m.seq):
        groups.setdefault((m.round, m.stage), []).append(m)
    rows = []
    for (rnd, stage), group in groups.items():
        spent = spent_by(group)
        starts: dict[tuple[str, int], str] = {}
        for m in group:
            starts.setdefault((m.key.engine_hash, m.key.start), names.get(m.key.engine_hash,
                                                                          m.engine))
        rows.append({"round": rnd, "stage": stage, "starts": spent.engine_starts,
                     "windows": spent.windows, "engine_s": spent.engine_seconds,
                     "engines": list(starts.values())})
    return rows


def _outcomes(result: Analysis) -> dict[str, str]:
    """Per band ("<class> <band>"): speculate, off (decided) or unresolved (nothing decided)."""
    return {f"{r.traffic_class} {d.band.label}": d.outcome for r in result.classes
            for d in r.decisions}


def _abs(values: list[float | None]) -> list[float]:
    return [abs(v) for v in values if v is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    parser.add_argument("--n-max", type=int, default=5)
    parser.add_argument("--max-rounds", type=int, default=None,
                        help="exploration rounds of the adaptive search (default: the "
                             "experiment's, cpu_tiny: 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: --n-max 2 and SMOKE's plan")
    parser.add_argument("--models", type=Path, default=None,
                        help="the tiny models, built there if missing (default: under workdir)")
    args = parser.parse_args()
    if args.smoke:
        args.n_max = 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="search_cost-"))
    models = args.models or work / "models"
    tiny.build_all(models)
    grid = _sweep([*_overrides(models, work / "grid", args.n_max, args.smoke),
                   "sweep.design=grid"])
    adaptive = _sweep([*_overrides(models, work / "adaptive", args.n_max, args.smoke),
                       "sweep.design=race",
                       "sweep.search=adaptive", "sweep.budget.windows=null",
                       "sweep.budget.engine_starts=null",
                       *([f"sweep.budget.max_rounds={args.max_rounds}"]
                         if args.max_rounds is not None else []),
                       # the smoke's race ends within its exploration: at most 6 starts
                       *(["sweep.budget.engine_starts=6"] if args.smoke else [])])
    names = {ec.hash: ec.name for ec in grid["configs"]}

    cost = Table(title="cost")
    for c in ("search", "engine starts", "windows", "engine-seconds", "wall s"):
        cost.add_column(c, justify="right")
    for label, r in (("grid", grid), ("adaptive", adaptive)):
        s = r["spent"]
        cost.add_row(label, str(s.engine_starts), str(s.windows), f"{s.engine_seconds:.0f}",
                     f"{r['wall_s']:.0f}")
    console.print(cost)

    rounds_table = Table(title="adaptive search: what each round started")
    for c in ("round", "stage", "engine starts", "windows", "engine-seconds", "engines"):
        rounds_table.add_column(c, justify="right" if c not in ("stage", "engines") else "left")
    per_round = _per_round(adaptive["measurements"], names)
    for row in per_round:
        rounds_table.add_row(str(row["round"]), row["stage"], str(row["starts"]),
                             str(row["windows"]), f"{row['engine_s']:.0f}",
                             ", ".join(row["engines"]))
    console.print(rounds_table)

    agree = _agree(grid["result"], adaptive["result"], names, grid["margin"])
    t = Table(title="decisions per (traffic class, band)")
    for c in ("band", "grid", "adaptive", "agree"):
        t.add_column(c)
    go, ao = _outcomes(grid["result"]), _outcomes(adaptive["result"])
    for row in agree:
        t.add_row(row["band"], f"{row['grid']} ({go.get(row['band'], '-')})",
                  f"{row['adaptive']} ({ao.get(row['band'], '-')})", str(row["agree"]))
    console.print(t)

    vs = predict.versus(predict.point_speedups(grid["result"]), grid["measurements"],
                        grid["configs"])
    e = Table(title=f"prediction error on the grid's windows (from N={args.n_max})")
    for c in ("drafter", "points", "MAL median", "MAL worst", "speedup median", "speedup worst"):
        e.add_column(c, justify="right")
    per: dict[str, dict[str, list[float]]] = {}
    for v in vs:
        d = per.setdefault(v.series, {"mal": [], "speedup": []})
        d["mal"] += _abs([v.mal_error])
        d["speedup"] += _abs([v.speedup_error])
    for series, d in sorted(per.items()):
        e.add_row(series, str(len(d["speedup"])), *[
            f"{f(d[k]):.1%}" if d[k] else "-" for k in ("mal", "speedup")
            for f in (statistics.median, max)])
    console.print(e)

    mal = _abs([v.mal_error for v in vs])
    sp = _abs([v.speedup_error for v in vs])
    g, a = grid["spent"], adaptive["spent"]
    figures = {
        "engine_seconds_ratio": round(a.engine_seconds / g.engine_seconds, 3)
        if g.engine_seconds else None,
        "same_decision": all(r["agree"] for r in agree),
        "outcomes": {b: [go.get(b), ao.get(b)] for b in sorted(set(go) | set(ao))},
        "mal_error_median": round(statistics.median(mal), 4) if mal else None,
        "mal_error_worst": round(max(mal), 4) if mal else None,
        "speedup_error_median": round(statistics.median(sp), 4) if sp else None,
        "speedup_error_worst": round(max(sp), 4) if sp else None,
        "grid_starts": g.engine_starts, "grid_windows": g.windows,
        "adaptive_starts": a.engine_starts, "adaptive_windows": a.windows,
        "grid_engine_s": round(g.engine_seconds), "adaptive_engine_s": round(a.engine_seconds),
        "adaptive_starts_per_round": [[r["round"], r["stage"], r["starts"]] for r in per_round],
        "workdir": str(work),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
