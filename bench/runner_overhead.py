"""Runner overhead: specflow's runner against a plain `vllm bench serve` on the same server.

Run: .venv/bin/python bench/runner_overhead.py [--repeats 3] [--prompts 32] [--max-tokens 128]
     [--concurrency 4] [--warmups 2] [--models DIR] [--workdir DIR] [--smoke]
(--smoke: one repeat of 2 prompts x 8 tokens at concurrency 1 with one warm-up request)

Starts one engine (the tiny target with the CPU demo's settings) and, interleaved per repeat,
runs the same window three ways: specflow's runner with its long-lived load generator
(`driver`), specflow's runner with one `vllm bench serve` process per window (`process`), and
the plain `vllm bench serve` command a user would type (`plain`, same dataset and warm-ups).
Prints each one's output throughput (median over repeats), the runner/plain ratio, and the
wall-clock each window costs beyond its measured duration; its last line is a JSON line of the
figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from specflow.config.compose import load_plan
from specflow.demo import tiny
from specflow.engine.launcher import vllm_command
from specflow.engine.loadgen import BenchDriver, BenchProcess, bench_env, driver_python
from specflow.engine.runner import Window, measure_window
from specflow.engine.server import LocalEngine


def _plain(engine: LocalEngine, w: Window, out: Path) -> tuple[float, float, float]:
    """A plain `vllm bench serve` process: (output tok/s, bench duration s, wall s)."""
    argv = [*vllm_command(), "bench", "serve", "--backend", "vllm", "--base-url", engine.base_url,
            "--model", engine.model_name, "--tokenizer", engine.tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(w.dataset), "--disable-shuffle",
            "--skip-chat-template", "--custom-output-len", str(w.max_tokens),
            "--num-prompts", str(w.num_prompts), "--max-concurrency", str(w.concurrency),
            "--num-warmups", str(w.warmup_requests), "--temperature", "0", "--seed", "0",
            "--save-result", "--result-dir", str(out), "--result-filename", "result.json"]
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(out / "bench.log", "wb") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True,
                       env=bench_env(), timeout=600)
    wall = time.perf_counter() - start
    result = json.loads((out / "result.json").read_text())
    return result["output_throughput"], result["duration"], wall


def code_window(work: Path, prompts: int, max_tokens: int, concurrency: int, warmups: int
                ) -> Window:
    """A window of `prompts` short code prompts (a dataset file written under `work`)."""
    dataset = work / "dataset.jsonl"
    dataset.parent.mkdir(parents=True, exist_ok=True)
    dataset.write_text("".join(
        json.dumps({"prompt": f"def f{i}(x):\n    y = x * {i}\n    return y + {i}\n"}) + "\n"
        for i in range(prompts)))
    return Window("code", "code", dataset, prompts, max_tokens, concurrency,
                  warmup_requests=warmups)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--models", type=Path, default=None, help="tiny model dir (default: temp)")
    parser.add_argument("--workdir", type=Path, default=None, help="logs (default: temp)")
    parser.add_argument("--smoke", action="store_true",
                        help="the whole code path at its smallest: one repeat, 2 prompts x 8 "
                             "tokens at concurrency 1, one warm-up request")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.prompts, args.max_tokens, args.concurrency, args.warmups = \
            1, 2, 8, 1, 1

    tmp = Path(tempfile.mkdtemp(prefix="specflow-bench-"))
    models = args.models or tmp / "models"
    work = args.workdir or tmp / "work"
    tiny.build("mimo_mtp2", models)  # the CPU demo's target (conf/target/tiny_mimo_mtp2.yaml)
    loaded, plan = load_plan(["experiment=cpu_demo", f"paths.models={models}",
                              "target.max_model_len=512", "backend.engine.max_num_seqs=8"])
    ec = next(e for e in plan.engine_configs if e.name == "baseline")
    window = code_window(work, args.prompts, args.max_tokens, args.concurrency, args.warmups)
    python = driver_python(vllm_command())
    if python is None:
        print("cannot derive the vLLM interpreter for the long-lived driver", file=sys.stderr)
        return 1

    rows: dict[str, list[tuple[float, float, float]]] = {"driver": [], "process": [], "plain": []}
    t0 = time.perf_counter()
    with LocalEngine(ec, loaded.spec.backend, work / "engines") as engine:
        print(f"engine ready in {engine.start_s:.1f} s on {engine.base_url}")
        driver = BenchDriver(python, bench_env(), work / "driver.log")
        driver.launch()
        driver.wait_ready()
        print(f"driver ready (vLLM benchmark import {driver.import_s:.1f} s, paid once per "
              "engine)")
        process = BenchProcess(vllm_command(), bench_env())
        try:
            for r in range(args.repeats):
                w = replace(window, repeat=r)
                for name, gen in (("driver", driver), ("process", process)):
                    start = time.perf_counter()
                    m = measure_window(engine, gen, ec, w, work / name / f"r{r}", 600)
                    wall = time.perf_counter() - start
                    if not m.ok:
                        print(f"{name} r{r} failed: {m.failure}: {m.failure_detail}",
                              file=sys.stderr)
                        return 1
                    rows[name].append((m.output_throughput, m.duration_s, wall))
                rows["plain"].append(_plain(engine, w, work / "plain" / f"r{r}"))
                print(f"repeat {r}: " + ", ".join(
                    f"{k} {v[-1][0]:.1f} tok/s in {v[-1][2]:.1f} s" for k, v in rows.items()))
        finally:
            driver.close()

    def med(name: str, i: int) -> float:
        return statistics.median(row[i] for row in rows[name])

    print(f"\n{args.repeats} repeats x {args.prompts} prompts x {args.max_tokens} tokens at "
          f"concurrency {args.concurrency}, {args.warmups} warm-up requests; medians:")
    print(f"{'load generator':<34}{'output tok/s':>13}{'window s':>10}{'wall s':>9}"
          f"{'overhead s':>12}")
    labels = {"driver": "specflow runner, long-lived driver",
              "process": "specflow runner, process/window",
              "plain": "plain `vllm bench serve`"}
    for name, label in labels.items():
        print(f"{label:<34}{med(name, 0):>13.1f}{med(name, 1):>10.2f}{med(name, 2):>9.2f}"
              f"{med(name, 2) - med(name, 1):>12.2f}")
    print(f"\nthroughput ratio runner(driver)/plain: {med('driver', 0) / med('plain', 0):.3f}; "
          f"runner(process)/plain: {med('process', 0) / med('plain', 0):.3f}")
    saved = med("process", 2) - med("driver", 2)
    print(f"per-window wall clock: driver {med('driver', 2):.2f} s vs process/window "
          f"{med('process', 2):.2f} s: the long-lived driver saves {saved:.2f} s per window "
          f"(each runner window includes its warm-up run and two /metrics scrapes)")
    print(f"total {time.perf_counter() - t0:.0f} s; logs under {work}")
    print(json.dumps({"repeats": args.repeats,
                      "throughput_ratio_driver_plain": round(med("driver", 0) / med("plain", 0), 3),
                      "throughput_ratio_process_plain": round(
                          med("process", 0) / med("plain", 0), 3),
                      "window_wall_s_driver": round(med("driver", 2), 2),
                      "window_wall_s_process": round(med("process", 2), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
