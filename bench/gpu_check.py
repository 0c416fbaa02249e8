"""The GPU check: specflow's real sweep on a real-shape model, against the memory model.

Run: bash bench/gpu_check.sh        (installs the GPU stack, then runs this)
     .venv/bin/python bench/gpu_check.py [--cpu-safe] [--dir DIR] [--layers L] [--smoke]
(--smoke: the CPU-safe steps with one layer per model, in a temp directory removed afterwards
unless --dir is given; tests/demo/test_realshape.py checks what they build)

Steps, each a real `python -m specflow` command (conf/experiment/gpu_check.yaml):
1. build Llama-3.1-8B's shape with random bf16 weights, its EAGLE-3 head and a Llama-3.2-1B
   shaped draft model locally (`python -m specflow.demo.realshape`), and check each built
   checkpoint against the conf entry the memory model reads (shape, parameter count);
2. compile the plan (synthetic rejection sampling: each engine gets the first N of the
   emulated per-position rates) and, on the CPU, check that it is refused for hardware=cpu;
3. headroom of every engine config on the probed device;
4. (GPU) the sweep: baseline, EAGLE-3 at N=1..7, the draft model at N=3, concurrency 1, 8, 32;
5. (GPU) compare (a) headroom's KV token estimate with the capacity vLLM logged at each start,
   (b) the measured speedup and acceptance length against N with the emulated rates and with
   the chain prediction MAL(k) = 1 + sum of the N=7 run's first k per-position rates.

Without a GPU (or with --cpu-safe) steps 1-3 run with one decoder layer per model (every other
dimension real: the CI runs this) and the report says what was not measured. The last line is
one JSON object: gpu, built_ok, kv_ratio_median/worst (vLLM / estimate), mal_error_worst
(measured vs emulated), chain_error_worst, best (per concurrency), wall_s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specflow.config.compose import load
from specflow.demo import realshape
from specflow.engine.server import reported_kv
from specflow.records.measurement import Measurement
from specflow.results.ledger import Ledger
from specflow.spec.architecture import arch_from_dir, safetensors_params

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "experiment=gpu_check"
console = Console(width=110)


def _specflow(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess:
    """One `python -m specflow` command (argv list), from the repository root."""
    proc = subprocess.run([sys.executable, "-m", "specflow", *args], cwd=ROOT, text=True,
                          capture_output=capture, timeout=3600)
    if check and proc.returncode != 0:
        sys.stderr.write((proc.stdout or "") + (proc.stderr or ""))
        raise SystemExit(f"python -m specflow {' '.join(args)}: exit {proc.returncode}")
    return proc


def _gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# ---------------------------------------------------------------------------- 1. build


def check_build(paths: dict[str, Path], overrides: list[str], layers: int | None
                ) -> list[dict[str, Any]]:
    """Each built checkpoint against its conf entry: shape fields and parameter count (the conf's
    count scaled to the built depth; the embeddings and head do not scale)."""
    spec = load([EXPERIMENT, *overrides]).spec
    entries = {"target": spec.target.arch, "eagle3": spec.drafter["eagle3"].checkpoints[
        spec.target.name].arch, "draft_model": spec.drafter["draft_model"].checkpoints[
        spec.target.name].arch}
    rows = []
    for kind, directory in paths.items():
        conf = entries[kind]
        assert conf is not None
        built = arch_from_dir(directory)
        depth = built.layers[0].count
        conf_layers = conf.layers[0]
        same_shape = (built.hidden_size == conf.hidden_size
                      and built.num_attention_heads == conf.num_attention_heads
                      and built.vocab_size == conf.vocab_size
                      and built.layers[0].num_kv_heads == conf_layers.num_kv_heads
                      and built.layers[0].head_dim == conf_layers.head_dim
                      and (layers is not None or depth == conf_layers.count))
        params = safetensors_params(directory)
        expected = _scaled_params(conf.num_params, conf_layers.count, depth,
                                  conf.vocab_size * conf.hidden_size * (1 if kind == "draft_model"
                                                                        else 2))
        rows.append({"kind": kind, "layers": depth, "conf_layers": conf_layers.count,
                     "same_shape": same_shape, "params": params, "conf_params": conf.num_params,
                     "expected_params": round(expected),
                     "params_error": params / expected - 1})
    return rows


def _scaled_params(conf_params: float, conf_layers: int, layers: int, outside: int) -> float:
    """The conf's parameter count at another depth: embeddings and head (`outside`) stay, the
    rest scales with the number of decoder layers."""
    return outside + (conf_params - outside) * layers / conf_layers


# ------------------------------------------------------------------------ 5. compare


def _sweep_dir(workdir: Path) -> Path | None:
    dirs = sorted((workdir / "sweeps").glob("*/windows"), key=lambda p: p.stat().st_mtime)
    return dirs[-1].parent if dirs else None


def compare_kv(headroom: list[dict[str, Any]], sweep: Path) -> list[dict[str, Any]]:
    """(a) headroom's KV tokens against the capacity vLLM logged at each engine start."""
    rows = []
    for h in headroom:
        logs = sorted((sweep / "engines").glob(f"{h['engine']}-*.log"))
        kv = reported_kv(logs[0]) if logs else None
        rows.append({"engine": h["engine"], "estimate": h["kv_tokens"],
                     "vllm": kv.tokens if kv else None,
                     "ratio": kv.tokens / h["kv_tokens"] if kv and h["kv_tokens"] else None,
                     "vllm_kv_gib": kv.available_gib if kv else None,
                     "estimate_kv_gib": h["kv_cache_bytes"] / 2**30})
    return rows


def _points(sweep: Path) -> list[Measurement]:
    """The sweep's successful windows, as its ledger holds them."""
    ledger = Ledger(sweep.parent.parent, sweep.name)
    return [m for m in ledger.measurements() if m.ok]


def compare_curve(points: list[Measurement], rates: dict[str, list[float]]
                  ) -> list[dict[str, Any]]:
    """(b) per drafter and concurrency, against N: speedup over the baseline (ratio of median
    output throughputs), measured acceptance length, the emulated one (1 + sum of the first N
    rates) and the chain prediction from the largest N's per-position rates."""
    tput: dict[tuple[str, int], list[float]] = defaultdict(list)
    mal: dict[tuple[str, int], list[float]] = defaultdict(list)
    pos: dict[tuple[str, int], list[tuple[float, ...]]] = defaultdict(list)
    for m in points:
        tput[(m.engine, m.key.concurrency)].append(m.output_throughput)
        if m.mean_acceptance_length is not None:
            mal[(m.engine, m.key.concurrency)].append(m.mean_acceptance_length)
            pos[(m.drafter, m.num_speculative_tokens)].append(m.per_position_acceptance)
    engines = {(m.drafter, m.num_speculative_tokens, m.engine) for m in points
               if m.num_speculative_tokens}
    rows = []
    for drafter, n, engine in sorted(engines):
        top = max(k for d, k, _ in engines if d == drafter)
        longest = [p for p in pos[(drafter, top)] if len(p) == top]
        chain = 1 + sum(statistics.mean(p[i] for p in longest) for i in range(n)) \
            if longest else None
        emulated = 1 + sum(rates.get(drafter, [])[:n]) if drafter in rates else None
        for c in sorted({m.key.concurrency for m in points}):
            base = tput.get(("baseline", c))
            mine = tput.get((engine, c))
            measured = statistics.mean(mal[(engine, c)]) if mal.get((engine, c)) else None
            rows.append({"drafter": drafter, "n": n, "concurrency": c,
                         "speedup": statistics.median(mine) / statistics.median(base)
                         if mine and base else None,
                         "mal": measured, "mal_emulated": emulated, "mal_chain": chain,
                         "mal_error": measured / emulated - 1 if measured and emulated else None,
                         "chain_error": measured / chain - 1 if measured and chain else None})
    return rows


# ----------------------------------------------------------------------------- report


def _table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    t = Table(title=title)
    for c in cols:
        t.add_column(c, justify="right" if c not in ("kind", "engine", "drafter") else "left")
    for r in rows:
        t.add_row(*[_fmt(r.get(c)) for c in cols])
    console.print(t)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def _worst(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got, key=abs) if got else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-safe", action="store_true",
                        help="build (one layer), compile and headroom only (default without a GPU)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="models, MLflow store and sweep files (default: .specflow/gpu_check;"
                             " --smoke: a temp directory)")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers to build (default: real on a GPU, 1 otherwise)")
    parser.add_argument("--smoke", action="store_true",
                        help="the CPU-safe steps at their smallest: --cpu-safe --layers 1")
    args = parser.parse_args()
    if args.smoke:
        args.cpu_safe, args.layers = True, 1
    if args.dir is not None:
        return check(args, args.dir.resolve())
    if not args.smoke:
        return check(args, ROOT / ".specflow" / "gpu_check")
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:  # ~4 GB of checkpoints
        return check(args, Path(tmp))


def check(args: argparse.Namespace, root: Path) -> int:
    """Steps 1-5 (1-3 without a GPU or with --cpu-safe) with everything under `root`; the
    report, and 0 when every check ran and passed."""
    started = time.monotonic()
    gpu = _gpu() and not args.cpu_safe
    layers = args.layers if args.layers is not None else (None if gpu else 1)
    overrides = [f"paths.models={root / 'models'}", f"tracking.workdir={root / 'work'}",
                 f"tracking.uri=sqlite:///{root / 'mlflow.db'}"]
    console.print(f"GPU check: {'GPU' if gpu else 'CPU-safe parts only (no GPU)'}; "
                  f"models under {root / 'models' / 'realshape'}, "
                  f"{'real depth' if layers is None else f'{layers} layer(s) per model'}")

    paths = realshape.build_all(root / "models" / "realshape", layers)
    built = check_build(paths, overrides, layers)
    _table("1. built checkpoints vs conf", built,
           ["kind", "layers", "conf_layers", "same_shape", "params", "expected_params",
            "params_error"])

    plan = json.loads(_specflow("compile", EXPERIMENT, *overrides, "--no-vllm-check").stdout)
    rates = {ec["drafter"]: ec["speculative_config"]["synthetic_acceptance_rates"]
             for ec in plan["engine_configs"] if ec["speculative_config"]
             and ec["num_speculative_tokens"] == max(
                 e["num_speculative_tokens"] for e in plan["engine_configs"]
                 if e["drafter"] == ec["drafter"])}
    sliced = all(len(ec["speculative_config"]["synthetic_acceptance_rates"])
                 == ec["num_speculative_tokens"]
                 for ec in plan["engine_configs"] if ec["speculative_config"])
    cpu = _specflow("compile", EXPERIMENT, "hardware=cpu", "backend=cpu", *overrides,
                    "--no-vllm-check", check=False)
    refused_on_cpu = cpu.returncode == 2 and "no synthetic acceptance" in cpu.stderr
    console.print(f"2. plan: {len(plan['engine_configs'])} engine configs, "
                  f"{plan['num_windows']} windows; synthetic rates sliced to N: {sliced}; "
                  f"hardware=cpu refused (exit {cpu.returncode}): {refused_on_cpu}")

    probe = [] if gpu else ["--no-vllm-check"]
    headroom = json.loads(_specflow("headroom", EXPERIMENT, *overrides, "--json",
                                    *probe).stdout)
    _table("3. headroom", headroom, ["engine", "fit", "kv_tokens", "drafter_cost_percent",
                                     "concurrency_at_context"])

    kv_rows: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    sweep_rc = None
    if gpu:
        run = _specflow(EXPERIMENT, *overrides, check=False, capture=False)
        sweep_rc = run.returncode
        sweep = _sweep_dir(root / "work")
        if sweep is not None:
            kv_rows = compare_kv(headroom, sweep)
            curve = compare_curve(_points(sweep), rates)
        _table("5a. KV tokens: headroom estimate vs vLLM's log", kv_rows,
               ["engine", "estimate", "vllm", "ratio", "estimate_kv_gib", "vllm_kv_gib"])
        _table("5b. speedup and acceptance length vs N", curve,
               ["drafter", "n", "concurrency", "speedup", "mal", "mal_emulated", "mal_chain",
                "mal_error", "chain_error"])
    else:
        console.print("4-5. not run: no GPU (vLLM's synthetic rejection sampling and an 8B "
                      "target need one); run `bash bench/gpu_check.sh` on a GPU machine")

    ratios = [r["ratio"] for r in kv_rows if r["ratio"] is not None]
    best: dict[str, Any] = {}
    for r in curve:
        if r["speedup"] is not None and r["speedup"] > best.get(str(r["concurrency"]), ("", 0))[1]:
            best[str(r["concurrency"])] = (f"{r['drafter']}-n{r['n']}", round(r["speedup"], 3))
    figures = {
        "gpu": gpu, "layers": layers,
        "built_ok": all(b["same_shape"] for b in built),
        "params_error": {b["kind"]: round(b["params_error"], 4) for b in built},
        "engine_configs": len(plan["engine_configs"]), "rates_sliced": sliced,
        "refused_on_cpu": refused_on_cpu,
        "headroom_fits": sum(h["fit"] == "fits" for h in headroom),
        "baseline_kv_tokens_estimate": headroom[0]["kv_tokens"],
        "sweep_exit": sweep_rc,
        "kv_ratio_median": statistics.median(ratios) if ratios else None,
        "kv_ratio_worst": _worst([r - 1 for r in ratios]),
        "mal_error_worst": _worst([r["mal_error"] for r in curve]),
        "chain_error_worst": _worst([r["chain_error"] for r in curve]),
        "best": best,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(figures))
    ok = figures["built_ok"] and sliced and (gpu or refused_on_cpu) and sweep_rc in (None, 0)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
