"""Scale-out: the same 4-config sweep dispatched to a Prefect work pool with 1 worker, then 2.

Run: .venv/bin/python bench/scale_out.py [--workdir DIR] [--models DIR] [--prompts 8]
     [--tokens 32] [--repeats 3] [--ngram "[1,2,3]"] [--workers 1,2] [--smoke]
     [--prefect-api URL --tracking-uri URI --pool NAME]
(--smoke: the 2-worker phase alone on the baseline alone, 2 windows of 2 prompts x 8 tokens: one
engine start; `--ngram "[]"`: no n-gram configs; `--workers 2`: that phase alone, no ratio;
`--prefect-api`, `--tracking-uri`: servers already running, none started; `--pool`: a work pool
whose workers already serve `specflow-engine-config/NAME` (`python -m pipelines.pool deploy`),
as a cluster's GPU pool does: no deployment and no worker started, one phase of `--workers`)

One `prefect server` and one `mlflow server` on loopback; a process pool per phase (`w1`, `w2`),
its workers each owning one fake device id. On this CPU machine a worker's "device" is a core:
the single worker's engines use every core (vLLM's automatic OpenMP binding), each of the two
workers' engines is bound to its own core (VLLM_CPU_OMP_THREADS_BIND), so the two phases use
the same cores. Each phase runs the main job (`python -m specflow dispatch.deployment=...`) in a
workdir and MLflow experiment of its own, so nothing is reused between them.

Prints, per phase: wall time, engine starts, how long configs queued for a free worker (the
flow run's creation to a worker taking it: PENDING), the dispatch overhead per config (taken to
its engine start in the ledger: the flow-run process, Prefect's engine, opening the sweep) and
engine-seconds (engine start to the flow run's end, summed); then one JSON line with
wall_ratio_2_vs_1, dispatch_overhead_s (median over every config of both phases) and configs.

The ledger on an object store: the same window records, leases and resume scans written and read
by a worker (`--store-windows` windows, each: recorded, marked logged, its lease renewed, the
resume set read) on a local path and on an S3-compatible server on loopback (moto's standalone
server, started here; `--store-url s3://bucket/prefix` for a real one), as milliseconds per window
and as a share of the phases' measured seconds per window (`store_overhead_ms_per_window_*`,
`store_share_of_window`).
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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specflow.demo import tiny  # noqa: E402
from specflow.results.ledger import Ledger  # noqa: E402
from tests.pipelines import live  # noqa: E402 - the loopback servers the tests start

console = Console(highlight=False)


def _overrides(models: str, work: Path, uri: str, experiment: str, a: argparse.Namespace
               ) -> list[str]:
    ngram = [] if a.ngram == "[]" else [f"+sweep.num_speculative_tokens.ngram={a.ngram}"]
    return ["experiment=cpu_demo", f"drafter=[none{',ngram' if ngram else ''}]", *ngram,
            "workload=[chat]",
            f"workload.chat.num_prompts={a.prompts}", f"workload.chat.max_tokens={a.tokens}",
            "sweep.concurrency=[1]", f"sweep.repeats={a.repeats}", "promote.min_repeats=2",
            "sweep.closing_baseline_repeats=0", "sweep.design=grid", f"paths.models={models}",
            f"tracking.workdir={work}", f"tracking.uri={uri}",
            f"tracking.experiment={experiment}", f"promote.output_dir={work / 'promoted'}"]


def _flow_runs(env: dict[str, str], pool: str) -> list[dict[str, Any]]:
    script = f"""
import json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(
        any_=[{pool!r}])))
    out = []
    for r in runs:
        pending = [s.timestamp.timestamp() for s in client.read_flow_run_states(r.id)
                   if s.type.value == "PENDING"]
        out.append({{"key": r.parameters["key"], "state": r.state.type.value,
                    "created": r.created.timestamp(), "taken": min(pending, default=None),
                    "end": r.end_time.timestamp() if r.end_time else None}})
print(json.dumps(out))
"""
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def _phase(n: int, tmp: Path, env: dict[str, str], models: str, uri: str,
           a: argparse.Namespace) -> dict[str, Any]:
    pool, work = a.pool or f"w{n}", tmp / f"w{n}"
    if a.pool is None:
        deploy = subprocess.run([sys.executable, "-m", "pipelines.pool", "deploy", "--pool",
                                 pool, "--slots", str(n)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300, check=False)
        if deploy.returncode != 0:
            raise SystemExit(deploy.stdout + deploy.stderr)
    workers = []
    for i in range(0 if a.pool else n):
        bind = str(i) if n > 1 else "auto"
        with open(tmp / f"{pool}-{i}.log", "ab") as fh:
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type",
                 "process", "--limit", "1", "--name", f"{pool}-{i}"], cwd=ROOT,
                env=dict(env, CUDA_VISIBLE_DEVICES=str(i), VLLM_CPU_OMP_THREADS_BIND=bind),
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        if workers:
            time.sleep(5)  # the workers register with the pool
        since, t0 = time.time(), time.monotonic()
        sweep = subprocess.run(
            [sys.executable, "-m", "specflow",
             *_overrides(models, work, uri, f"scale-out-{pool}", a),
             f"dispatch.deployment=specflow-engine-config/{pool}", "dispatch.poll_s=1"],
            cwd=tmp, env=dict(env, COLUMNS="100"), capture_output=True, text=True,
            timeout=3600, check=False)
        wall = time.monotonic() - t0
    finally:
        for w in workers:
            live.stop(w)
    if sweep.returncode != 0:
        raise SystemExit(sweep.stdout[-3000:] + sweep.stderr[-3000:])
    (sweep_dir,) = (work / "sweeps").iterdir()
    starts = {e.hash: e.t for e in Ledger(work, sweep_dir.name).engine_starts()}
    # this phase's flow runs (a pool given by --pool may hold others)
    runs = [r for r in _flow_runs(env, pool) if r["state"] == "COMPLETED"
            and r["key"] in starts and r["created"] >= since - 1]
    ran = [r for r in runs if r["taken"] is not None]
    overhead = [starts[r["key"]] - r["taken"] for r in ran]
    queued = [r["taken"] - r["created"] for r in ran]
    engine_s = sum(r["end"] - starts[r["key"]] for r in ran)
    return {"workers": n, "wall_s": wall, "configs": len(runs), "engine_starts": len(starts),
            "overhead_s": overhead, "queued_s": queued, "engine_s": engine_s}


def _store_ms(location: str, windows: int) -> tuple[float, float]:
    """A worker's ledger traffic at `location`, in milliseconds (medians of 3): per window
    (recorded, marked logged, its lease renewed) and per engine start (the resume set read
    over `windows` windows)."""
    from specflow.results.ledger import renew_lease
    from tests.builders import BASELINE, window

    per_window, scan = [], []
    for run in range(3):
        ledger = Ledger(location, f"bench-{run}-{time.time_ns()}",
                        scratch=Path(tempfile.mkdtemp(prefix="scratch-")))
        t0 = time.perf_counter()
        for i in range(windows):
            m = window(BASELINE, 100.0 + i, c=1 + i)
            ledger.record(m)
            ledger.mark_logged(m.key.id, f"run-{i}")
            renew_lease(ledger.lease_path("unit"), flow_run_id="r")
        per_window.append((time.perf_counter() - t0) * 1000 / windows)
        t0 = time.perf_counter()
        assert len(ledger.finished()) == windows
        scan.append((time.perf_counter() - t0) * 1000)
    return statistics.median(per_window), statistics.median(scan)


def _store(a: argparse.Namespace, tmp: Path) -> dict[str, tuple[float, float]]:
    """The ledger's cost per window on a local path and on an object store."""
    server = None
    saved = dict(os.environ)
    try:
        url = a.store_url
        if url is None:
            server = live.S3Server(tmp).start()
            os.environ.update(server.env)
            url = server.bucket("bench") + "/specflow"
        local = _store_ms(str(tmp / "store-local"), a.store_windows)
        remote = _store_ms(url, a.store_windows)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if server is not None:
            server.stop()
    return {"local": local, "object_store": remote}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--repeats", type=int, default=3, help="windows per config")
    parser.add_argument("--ngram", default="[1,2,3]",
                        help="n-gram's N values (with the baseline, the sweep's configs)")
    parser.add_argument("--models", default=None,
                        help="the tiny models, built there if missing (default: under workdir); "
                             "a URL (s3://...): the models already uploaded there")
    parser.add_argument("--workers", default="1,2",
                        help="one phase per worker count, in this order (the ratio needs 1 and 2)")
    parser.add_argument("--smoke", action="store_true",
                        help="the 2-worker phase at its smallest: the baseline alone, 2 windows "
                             "of 2 prompts x 8 tokens")
    parser.add_argument("--prefect-api", default=None,
                        help="a running Prefect API (default: start a local `prefect server`)")
    parser.add_argument("--tracking-uri", default=None,
                        help="a running MLflow server (default: start a local `mlflow server`)")
    parser.add_argument("--pool", default=None,
                        help="an existing work pool whose workers serve its deployment")
    parser.add_argument("--store-url", default=None,
                        help="an object store for the ledger measurement (default: moto's "
                             "S3-compatible server on loopback)")
    parser.add_argument("--store-windows", type=int, default=40,
                        help="windows per ledger measurement (the resume scan grows with them)")
    a = parser.parse_args()
    if a.smoke:  # 2 windows: promote.min_repeats
        a.ngram, a.prompts, a.tokens, a.repeats, a.workers = "[]", 2, 8, 2, "2"
        a.store_windows = 5
    counts = [int(n) for n in a.workers.split(",")]
    if a.pool and len(counts) != 1:
        parser.error("--pool runs one phase: give --workers its number of workers")
    tmp = a.workdir or Path(tempfile.mkdtemp(prefix="scale_out-"))
    tmp.mkdir(parents=True, exist_ok=True)
    models = a.models or str(tmp / "models")
    if "://" not in models:
        tiny.build_all(Path(models))
    port = live.port()
    env = dict(os.environ, PREFECT_HOME=str(tmp / "prefect"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp / 'p.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
               MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1",
               PREFECT_API_URL=a.prefect_api or f"http://127.0.0.1:{port}/api",
               PREFECT_WORKER_QUERY_SECONDS="2")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    server = None if a.prefect_api else live.start_server(tmp, port, server_env)
    mlflow = None if a.tracking_uri else live.MlflowServer(tmp, server_env)
    try:
        if server is not None:
            live.wait_http(f"http://127.0.0.1:{port}/api/health", server, tmp / "server.log",
                           180)
        if mlflow is not None:
            mlflow.start()
        uri = a.tracking_uri if mlflow is None else mlflow.uri
        phases = [_phase(n, tmp, env, models, uri, a) for n in counts]
        store = _store(a, tmp)
    finally:
        if mlflow is not None:
            mlflow.kill()
        if server is not None:
            live.stop(server)

    t = Table(title=f"the same {phases[0]['configs']}-config sweep on a process work pool")
    for c in ("workers", "wall s", "configs", "engine starts", "queued s (median)",
              "dispatch overhead s (median)", "engine-seconds"):
        t.add_column(c, justify="right")
    for p in phases:
        t.add_row(str(p["workers"]), f"{p['wall_s']:.0f}", str(p["configs"]),
                  str(p["engine_starts"]), f"{statistics.median(p['queued_s']):.1f}",
                  f"{statistics.median(p['overhead_s']):.1f}", f"{p['engine_s']:.0f}")
    console.print(t)
    by = {p["workers"]: p for p in phases}
    figures: dict[str, Any] = {"wall_ratio_2_vs_1": None}
    if 1 in by and 2 in by:
        one, two = by[1], by[2]
        figures["wall_ratio_2_vs_1"] = round(two["wall_s"] / one["wall_s"], 3)
        console.print(f"2 workers vs 1: wall x{figures['wall_ratio_2_vs_1']:.2f}; "
                      f"engine-seconds x{two['engine_s'] / one['engine_s']:.2f} (on 2 cores, "
                      "two engines share the CPU: each runs slower, which a GPU per worker "
                      "would not)")
    figures["dispatch_overhead_s"] = round(statistics.median(
        [s for p in phases for s in p["overhead_s"]]), 1)
    figures["configs"] = phases[0]["configs"]
    windows = sum(p["configs"] for p in phases) * a.repeats
    window_ms = 1000 * sum(p["engine_s"] for p in phases) / max(windows, 1)
    s = Table(title="the ledger's own cost (per window: recorded, marked logged, lease "
                    f"renewed; per engine start: the resume set read over {a.store_windows} "
                    "windows)")
    for c in ("store", "ms per window", "share of a measured window here",
              "ms per engine start"):
        s.add_column(c, justify="right")
    for name, (ms, scan) in store.items():
        s.add_row(name.replace("_", " "), f"{ms:.1f}", f"{ms / window_ms:.2%}", f"{scan:.0f}")
    console.print(s)
    (local_ms, local_scan), (s3_ms, s3_scan) = store["local"], store["object_store"]
    figures |= {"store_ms_per_window_local": round(local_ms, 1),
                "store_ms_per_window_object_store": round(s3_ms, 1),
                "store_ratio_object_vs_local": round(s3_ms / local_ms, 1),
                "store_share_of_window": round(s3_ms / window_ms, 4),
                "store_scan_ms_local": round(local_scan), "store_scan_ms_object_store":
                    round(s3_scan)}
    for n, p in by.items():
        figures |= {f"wall_s_{n}": round(p["wall_s"]),
                    f"queued_s_{n}": round(statistics.median(p["queued_s"]), 1),
                    f"engine_seconds_{n}": round(p["engine_s"])}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
