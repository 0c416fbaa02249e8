"""Scale-out on a Prefect work pool, all on loopback: a `prefect server`, a process work pool,
two workers each owning a distinct (fake) device id, a real `mlflow server`, an S3-compatible
server (moto) holding the ledger and MLflow's artifacts, a sweep of three engine configs on the
CPU engine dispatched by `python -m specflow dispatch.deployment=...`; one worker is SIGKILLed
during its first engine config and a replacement worker joins. The workers and the sweep write
to no shared directory: each has its own home and cache (`tracking.scratch` null); what they
share is the Prefect API, the MLflow server, the bucket, and what they only read: the code
checkout (a cluster's image) and the tiny models' directory (a cluster node's own copy at the
same path)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specflow.results.ledger import Ledger, sweep_ids
from tests.pipelines import live
from tests.pipelines.procs import pids_with_env, processes_using

ROOT = Path(__file__).resolve().parents[2]
POOL = "gpu"
DEPLOYMENT = f"specflow-engine-config/{POOL}"

_FLOW_RUNS = """
import json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
with get_client(sync_client=True) as client:
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[
        "specflow-engine-config"])))
print(json.dumps([{"name": r.name, "state": r.state.type.value, "tags": sorted(r.tags),
                   "kind": r.parameters["kind"], "key": r.parameters["key"],
                   "parent": str(r.parent_task_run_id)} for r in runs]))
"""


def _fresh_s3() -> None:
    """Credentials are read when a filesystem is made: forget the ones made before."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def _own(tmp: Path, name: str) -> dict[str, str]:
    """A process's own home and cache (as on its own node): nothing shared with the others."""
    home = tmp / "nodes" / name
    (home / "cache").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / "cache")}


def _upload_models(local: Path, url: str) -> None:
    """The tiny models into the bucket, one directory per kind (as `build-models` puts them)."""
    from specflow.records.store import Store

    store = Store(url)
    for kind in sorted(p for p in local.iterdir() if p.is_symlink()):
        for f in sorted(p for p in kind.resolve().rglob("*") if p.is_file()):
            store.upload(f, f"{kind.name}/{f.relative_to(kind.resolve())}")


def _worker(tmp: Path, env: dict[str, str], name: str, device: str) -> subprocess.Popen:
    """`prefect worker start` owning `device`, one flow run at a time, with its own home and
    cache; on this CPU machine its engines' OpenMP threads are bound to core `device` (the CPU
    engine's device set)."""
    with open(tmp / f"{name}.log", "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--type",
             "process", "--limit", "1", "--name", name],
            cwd=ROOT, env=dict(env, CUDA_VISIBLE_DEVICES=device, **_own(tmp, name),
                                     VLLM_CPU_OMP_THREADS_BIND=device), stdout=fh,
            stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.engine
def test_a_sweep_fans_out_to_two_workers_and_survives_one_killed(
        tmp_path: Path, tiny_models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three engine configs on two workers (devices 0 and 1), the ledger, the champions, the
    models and MLflow's artifacts on a bucket, no directory shared (each process copies the
    models to its own cache). Worker 0 is SIGKILLed after the
    first window of its first config: its flow run's process and engine die with it, the
    sweep declares the config lost (lease) or crashed and submits it again; a replacement
    worker on device 0 joins. The sweep completes: each config has one completed flow run,
    both device ids ran configs (their flow runs' tags say so), MLflow holds exactly one
    FINISHED child run per window of the plan, each metric logged once, no RUNNING run; the
    windows finished before the kill were not measured again; each child run's artifacts are
    in the bucket; no engine survives; the decision equals the one the single-process path's
    decision step computes from the same windows copied to a local path, which misses none.
    Then `bench/scale_out.py --smoke` runs on the same pool, workers and servers: exit 0, its
    one config measured."""
    s3 = live.S3Server(tmp_path).start()
    work = s3.bucket("fleet") + "/specflow"
    for k, v in s3.env.items():  # this process reads the bucket too
        monkeypatch.setenv(k, v)
    _fresh_s3()
    models = f"{work}/models"
    _upload_models(tiny_models, models)
    port = live.port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
               MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path),
               **s3.env)
    env.pop("PREFECT_API_URL", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    client_env = dict(env, PREFECT_API_URL=api, PREFECT_WORKER_QUERY_SECONDS="2")
    mlflow_server = live.MlflowServer(tmp_path, env, artifacts="s3://fleet/mlartifacts")
    procs: list[subprocess.Popen] = [s3.proc]
    logs = [tmp_path / n for n in ("server.log", "sweep.log", "gpu-0.log", "gpu-1.log",
                                   "gpu-0b.log", "mlflow-server.log")]
    try:
        procs.append(live.start_server(tmp_path, port, env))
        mlflow_server.start()
        procs.append(mlflow_server.proc)
        live.wait_http(f"{api}/health", procs[0], logs[0], 180)
        deploy = subprocess.run([sys.executable, "-m", "pipelines.pool", "deploy", "--pool",
                                 POOL, "--slots", "2"], cwd=ROOT, env=client_env,
                                capture_output=True, text=True, timeout=180, check=False)
        assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-3000:]
        assert "work pool 'gpu' (process) created, 2 slots" in deploy.stdout
        assert f"dispatch.deployment={DEPLOYMENT}" in deploy.stdout
        workers = {"0": _worker(tmp_path, client_env, "gpu-0", "0"),
                   "1": _worker(tmp_path, client_env, "gpu-1", "1")}
        procs += workers.values()
        overrides = ["experiment=cpu_tiny", "drafter=[none,ngram]",
                     "+sweep.num_speculative_tokens.ngram=[1,2]", "workload=[chat]",
                     "workload.chat.num_prompts=4", "workload.chat.max_tokens=16",
                     "sweep.concurrency=[1]", "sweep.repeats=3", "promote.min_repeats=2",
                     "sweep.closing_baseline_repeats=0", "sweep.design=grid",
                     # what is checked is the fan-out, not a start's speed: two workers'
                     # engines starting at once on a loaded 2-core machine can outlast cpu's
                     # 300 s, which would record a starved start as a hang
                     "backend.startup_timeout_s=900",
                     f"paths.models={models}", f"tracking.workdir={work}",
                     f"tracking.uri={mlflow_server.uri}"]
        with open(logs[1], "wb") as fh:
            sweep = subprocess.Popen(
                [sys.executable, "-m", "specflow", *overrides,
                 f"dispatch.deployment={DEPLOYMENT}", "dispatch.lease_s=20",
                 "dispatch.poll_s=1"], cwd=tmp_path / "nodes" / "sweep",
                env=dict(client_env, COLUMNS="80", **_own(tmp_path, "sweep")),
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(sweep)

        def killed_mid_config() -> bool:
            """Worker 0 has measured a window of the config it is on, not all of them."""
            assert sweep.poll() is None, logs[1].read_text(errors="replace")[-3000:]
            sweeps = sweep_ids(work)
            if not sweeps:
                return False
            ledger = Ledger(work, sweeps[0], scratch=tmp_path / "reader")
            mine = [e.hash for e in ledger.engine_starts() if e.devices == ("0",)]
            if not mine:
                return False
            ok = [e for e in ledger.entries() if e.measurement.ok
                  and e.measurement.key.engine_hash == mine[-1]]
            if not 1 <= len(ok) < 3:
                return False
            os.kill(workers["0"].pid, signal.SIGKILL)
            return True

        live.wait_for("a window of worker 0's config", killed_mid_config, 900, *logs,
                      every_s=0.1)
        workers["0"].wait(timeout=30)
        (sid,) = sweep_ids(work)
        ledger = Ledger(work, sid, scratch=tmp_path / "reader")
        before = {k: m for k, m in live.windows(work).items() if m["status"] == "ok"}
        # its flow run's process and its engine end with it
        live.wait_for("nothing of worker 0 alive", lambda: not pids_with_env(
            "CUDA_VISIBLE_DEVICES", "0"), 60, *logs)
        procs.append(_worker(tmp_path, client_env, "gpu-0b", "0"))
        sweep.wait(timeout=1500)
        out = logs[1].read_text(errors="replace")
        assert sweep.returncode == 0, out[-4000:]

        runs = json.loads(subprocess.run([sys.executable, "-c", _FLOW_RUNS], env=client_env,
                                         capture_output=True, text=True, timeout=120,
                                         check=True).stdout)
        completed = [r for r in runs if r["state"] == "COMPLETED"]
        assert sorted(r["key"] for r in completed) == sorted(
            {e.hash for e in ledger.engine_starts()})  # one per config
        assert len(completed) == 3
        devices = {t for r in completed for t in r["tags"] if t.startswith("devices:")}
        assert devices == {"devices:0", "devices:1"}, runs
        lost = [r for r in runs if r["state"] == "CRASHED"]
        assert len(lost) == 1 and "devices:0" in lost[0]["tags"], runs
        assert any(r["key"] == lost[0]["key"] and "attempt:1" in r["tags"] for r in completed)
        assert all(r["parent"] != "None" for r in runs)  # subflow runs of the sweep's flow run

        # the windows measured before the kill were kept as they were
        recorded = live.windows(work)
        assert {k: recorded.get(k) for k in before} == before
        assert len(recorded) == 9 and all(m["status"] == "ok" for m in recorded.values())

        from mlflow.tracking import MlflowClient

        from specflow.records.store import Store
        from specflow.steps import open_sweep

        for k, v in _own(tmp_path, "checker").items():  # this process as one more node
            monkeypatch.setenv(k, v)
        ctx = open_sweep(overrides, tracking=False)
        expected = sorted(w.key(ec).id for ec in ctx.plan.engine_configs for w in ctx.windows)
        client = MlflowClient(mlflow_server.uri)
        (exp,) = [e for e in client.search_experiments() if e.name.startswith("specflow/")]
        every = client.search_runs([exp.experiment_id], max_results=1000)
        children = [r for r in every if r.data.tags.get("specflow.kind") == "window"]
        assert sorted(r.data.tags["specflow.window_id"] for r in children) == expected
        assert {r.info.status for r in every} == {"FINISHED"}, [
            (r.info.run_name, r.info.status) for r in every]
        for r in children:
            assert len(client.get_metric_history(r.info.run_id, "output_throughput")) == 1
            # proxied by the tracking server to its artifacts destination: the bucket
            assert r.info.artifact_uri.startswith("mlflow-artifacts:"), r.info.artifact_uri
            assert "measurement.json" in Store("s3://fleet/mlartifacts").names(
                f"{exp.experiment_id}/{r.info.run_id}/artifacts")

        assert not processes_using(tmp_path / "nodes"), processes_using(tmp_path / "nodes")
        nodes = {p.name for p in (tmp_path / "nodes").iterdir()}
        assert {"gpu-0", "gpu-1", "gpu-0b", "sweep"} <= nodes
        scratch = {n for n in nodes if list((tmp_path / "nodes" / n / "cache").rglob("*.log"))}
        assert {"gpu-0", "gpu-1"} <= scratch  # each worker's engine logs in its own cache
        copied = {n for n in nodes if any(
            not p.parent.name.endswith(".meta") for p in (tmp_path / "nodes" / n / "cache")
            .glob("specflow/models/target-*/.specflow-complete"))}
        assert {"gpu-0", "gpu-1"} <= copied  # each worker ran engines from its own copy
        assert "sweep" not in copied  # the flow that fans out copied no weights
        assert Store(work).names("promoted") == ["chat"]  # the champion in the bucket
        assert not (tmp_path / "work").exists()
        decision = live.decision_lines(out)
        assert re.search(r"chat c1: \S+", "\n".join(decision)), out[-3000:]
        # the single-process path's decision step on the same windows copied to a local path
        import io

        from rich.console import Console

        from specflow import steps
        from specflow.results.console import print_outcome

        local = tmp_path / "local"
        store = Store(work)
        store.fs.get(f"{store.root}/sweeps/{sid}", str(local / "sweeps" / sid), recursive=True)
        again = steps.open_sweep([*overrides, f"tracking.workdir={local}",
                                  f"promote.output_dir={tmp_path / 'promoted-local'}"])
        assert again.sid == sid and steps.missing(again) == []
        shown = io.StringIO()
        print_outcome(steps.outcome_summary(again, steps.decide(again)),
                      Console(file=shown, width=80, highlight=False), 0.0)
        assert live.decision_lines(shown.getvalue()) == decision
        assert len(ledger.engine_starts()) == 4  # 3 configs + the lost one again

        # the Kubernetes recipe's pool and deployment, registered on the same server (no cluster)
        live.prefect(client_env, "work-pool", "create", "gpu-k8s", "--type", "kubernetes",
                     "--base-job-template", str(ROOT / "pipelines/k8s/base-job-template.json"))
        image = "registry.example.com/specflow:0.1.0"
        k8s = subprocess.run([sys.executable, "-m", "pipelines.pool", "deploy", "--pool",
                              "gpu-k8s", "--image", image], cwd=ROOT, env=client_env,
                             capture_output=True, text=True, timeout=180, check=False)
        assert k8s.returncode == 0, k8s.stdout[-2000:] + k8s.stderr[-3000:]
        shown = live.prefect(client_env, "deployment", "inspect", "specflow-engine-config/gpu-k8s")
        assert image in shown and "pipelines/dispatch.py:engine_config_flow" in shown
        pool = live.prefect(client_env, "work-pool", "inspect", "gpu-k8s")
        assert "nvidia.com/gpu" in pool and "gpu_count" in pool

        # bench/scale_out.py's smoke size, on this pool, its two workers and these servers
        # (tests/test_bench.py runs the other benchmarks'): it composes, dispatches and reports
        bench = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "scale_out.py"), "--smoke", "--workdir",
             str(tmp_path / "bench"), "--models", str(models), "--prefect-api", api,
             "--tracking-uri", mlflow_server.uri, "--pool", POOL], cwd=ROOT, env=client_env,
            capture_output=True, text=True, timeout=600, check=False)
        tail = bench.stdout[-3000:] + bench.stderr[-3000:]
        assert bench.returncode == 0 and "Traceback" not in bench.stderr, tail
        figures = json.loads(bench.stdout.strip().splitlines()[-1])
        assert figures["configs"] == 1 and figures["wall_s_2"] > 0, tail
    finally:
        for p in reversed(procs):
            if p is not None and p.poll() is None:
                live.stop(p)


_FENCED = """
import json, signal, sys, time
from pipelines import dispatch
def stopped(signum, frame):
    print("stopped by SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
with dispatch._lease(sys.argv[2], 0.2, flow_run_id=sys.argv[1]):
    print("leased", time.time(), flush=True)
    time.sleep(2)
print("measured to the end", flush=True)
"""


def test_a_flow_run_that_is_no_longer_running_stops_itself(tmp_path: Path,
                                                           prefect_api: str) -> None:
    """The lease is a fence: a flow run the sweep declared lost (set Crashed on the real
    Prefect server, as the sweep does) stops its process, and with it its engine; one still
    RUNNING keeps renewing its lease."""
    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Crashed, Running

    @flow(name="fenced-probe")
    def fenced() -> None: ...

    with SyncPrefectClient(prefect_api) as client:
        runs = {"lost": client.create_flow_run(fenced, state=Crashed(message="worker lost")),
                "fine": client.create_flow_run(fenced, state=Running())}
    lease = tmp_path / "leases" / "engine-x.json"
    env = dict(os.environ, PREFECT_API_URL=prefect_api)
    for name, last in (("lost", "stopped by SIGTERM"), ("fine", "measured to the end")):
        run_id = str(runs[name].id)
        out = subprocess.run([sys.executable, "-c", _FENCED, run_id, str(lease)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120,
                             check=False)
        assert out.returncode == 0 and out.stdout.splitlines()[-1] == last, out
        renewed = json.loads(lease.read_text())
        assert renewed["flow_run_id"] == run_id
        if name == "fine":
            leased = float(out.stdout.split()[1])
            assert renewed["t"] > leased + 1.5  # renewed every 0.2 s while it measured


def test_the_sweep_waits_out_a_prefect_api_outage_and_gives_up_after_its_grace(
        prefect_api: str) -> None:
    """A real Prefect server behind a link that is cut: dropped connections and 503s (what a
    busy SQLite database or an ingress without a backend answers) are waited out by the
    sweep's calls (a submission, a look at its flow runs), each look keeping its units in
    flight; an outage longer than dispatch.server_grace_s ends with an error naming the field,
    its value and the last failure; an answer such as 404 is not waited out."""
    import threading
    import uuid
    from types import SimpleNamespace

    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_MAX_RETRIES,
        PREFECT_LOGGING_TO_API_ENABLED,
        temporary_settings,
    )
    from prefect.states import Scheduled

    from pipelines import dispatch

    target = int(prefect_api.rsplit(":", 1)[1].split("/")[0])
    d = SimpleNamespace(poll_s=0.2, server_grace_s=60.0, wait_s=3600.0, lease_s=60.0,
                        retries=2)

    @flow(name="outage-probe")
    def probe(mode: str) -> dict[str, object]:
        seen: dict[str, object] = {}
        with live.Outage(target, mode) as link, SyncPrefectClient(f"{link.url}/api") as client:
            run = client.create_flow_run(probe, state=Scheduled())
            calls = []

            def read() -> object:
                calls.append(1)
                return client.read_flow_run(run.id)

            link.cut()
            threading.Timer(1.5, link.mend).start()
            seen["read"] = dispatch._patiently(read, "reading a flow run", d).id == run.id
            seen["calls"] = len(calls)
            s = dispatch._Submitted(dispatch.Unit("engine", "k", "ngram-n2"), run, 0)
            link.cut()
            still, error = dispatch._poll(None, client, [s], [], None, d)
            seen["cut"] = (still == [s], dispatch._transient(error) if error else None)
            link.mend()
            still, error = dispatch._poll(None, client, [s], [], None, d)
            seen["mended"] = (still == [s], error)
            link.cut()
            with pytest.raises(RuntimeError) as gone:
                dispatch._patiently(read, "submitting engine ngram-n2",
                                    SimpleNamespace(poll_s=0.2, server_grace_s=1.0))
            seen["gone"] = str(gone.value)
            link.mend()
            calls.clear()
            with pytest.raises(ObjectNotFound):
                dispatch._patiently(lambda: read() and client.read_flow_run(uuid.uuid4()),
                                    "reading", d)
            seen["404 calls"] = len(calls)
        return seen

    with temporary_settings({PREFECT_API_URL: prefect_api, PREFECT_CLIENT_MAX_RETRIES: 0,
                             PREFECT_LOGGING_TO_API_ENABLED: False}):
        for mode in ("drop", "503"):
            seen = probe(mode)
            assert seen["read"] is True and int(seen["calls"]) >= 2, (mode, seen)
            assert seen["cut"] == (True, True), (mode, seen)
            assert seen["mended"] == (True, None), (mode, seen)
            gone = str(seen["gone"])
            assert gone.startswith("submitting engine ngram-n2: the Prefect API failed every "
                                   "call for over dispatch.server_grace_s=1 s (last: "), gone
            assert ("503 Service Unavailable from http://127.0.0.1:" in gone) == \
                (mode == "503"), gone
            assert seen["404 calls"] == 1, (mode, seen)


def test_a_taken_run_that_never_starts_and_a_running_one_gone_silent_are_declared_lost(
        prefect_api: str, tmp_path: Path) -> None:
    """On a real Prefect server: a flow run a worker took (PENDING: process, pod or image
    starting) is given dispatch.start_s, not the lease, to start; a RUNNING one is judged by
    its lease in the ledger. Past them, each is set Crashed with a message naming the field
    and is submitted again (worker_lost); within them, or with a fresh lease, it goes on."""
    from types import SimpleNamespace

    from prefect import flow
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Pending, Running

    from pipelines import dispatch
    from specflow.results.ledger import renew_lease

    @flow(name="taken-probe")
    def taken() -> None: ...

    ledger = Ledger(tmp_path, "s")
    ctx = SimpleNamespace(ledger=ledger)

    def d(start_s: float, lease_s: float) -> SimpleNamespace:
        return SimpleNamespace(start_s=start_s, lease_s=lease_s, wait_s=3600.0)

    with SyncPrefectClient(prefect_api) as client:
        pending = client.create_flow_run(taken, state=Pending())
        running = client.create_flow_run(taken, state=Running())
        units = {"PENDING": dispatch._Submitted(dispatch.Unit("engine", "p", "ngram-n2"),
                                                pending, 0),
                 "RUNNING": dispatch._Submitted(dispatch.Unit("engine", "r", "ngram-n3"),
                                                running, 0)}

        def look(state: str, dd: SimpleNamespace) -> tuple[str, str] | None:
            s = units[state]
            return dispatch._problem(ctx, client, s, client.read_flow_run(s.run.id), state, dd)

        time.sleep(1.5)
        # a long start is no lost lease: the process of a PENDING run writes none yet
        assert look("PENDING", d(start_s=60, lease_s=1)) is None
        renew_lease(ledger.lease_path(units["RUNNING"].unit.id), flow_run_id=str(running.id))
        assert look("RUNNING", d(start_s=60, lease_s=1)) is None  # its lease is fresh
        assert look("RUNNING", d(start_s=0, lease_s=60)) is None
        time.sleep(1.2)
        lost = {state: look(state, d(start_s=1, lease_s=1)) for state in units}
        assert lost["PENDING"] is not None and lost["RUNNING"] is not None, lost
        assert lost["PENDING"][0] == lost["RUNNING"][0] == "worker_lost", lost
        assert re.search(r"taken by a worker but not running after \d+ s "
                         r"\(dispatch.start_s=1\)$", lost["PENDING"][1]), lost
        assert re.search(r"no lease renewal for \d+ s \(dispatch.lease_s=1\)$",
                         lost["RUNNING"][1]), lost
        for s in units.values():
            state = client.read_flow_run(s.run.id).state
            assert state is not None and state.type.value == "CRASHED", state
