"""A real local Prefect server, the scheduled re-validation deployment served, a run triggered;
then the server is killed during a served run and started again."""

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

from specflow.results.ledger import Ledger
from tests.pipelines import live
from tests.pipelines.procs import processes_using

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = "specflow-sweep/specflow-revalidate"
UNREACHABLE = "unreachable ("  # pipelines.deploy on stderr: the runner stopped for an outage
AGAIN = "serving again in"  # ... and no flow run is in flight any more: it checks the API


_UNPICKLE = """
import sys, cloudpickle
flow = cloudpickle.loads(sys.stdin.buffer.read())
print(sorted(flow.validate_parameters({"overrides": ["x=1"]})))
"""


def test_the_flow_pickled_by_value_validates_its_parameters() -> None:
    """Prefect's runner sends a served flow to its subprocess pickled by value (the module's
    name `sweep_flow` is the Flow, not its function): the parameters' types travel with it."""
    import cloudpickle

    from pipelines.sweep import sweep_flow

    out = subprocess.run([sys.executable, "-c", _UNPICKLE], input=cloudpickle.dumps(sweep_flow),
                         capture_output=True, cwd="/", timeout=300, check=False)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    assert out.stdout.decode().strip() == "['on_round', 'on_window', 'overrides', 'run_label']"


def _flow_run_shows_windows_and_the_decision(run_output: str, env: dict[str, str], tmp: Path
                                             ) -> None:
    """What a person sees of a served run in the Prefect UI: an engine-start line and one line
    per window in the flow run's log, and the decision as a table artifact whose description
    leads to the sweep's MLflow parent run."""
    (run_id,) = re.findall(r"UUID: ([0-9a-f-]{36})", run_output)
    logs = live.prefect(env, "flow-run", "logs", run_id)
    assert "engine start: " in logs
    assert re.search(r"\S+ chat c1 r\d: ok, \d+\.\d tok/s", logs), logs[-3000:]
    (artifact, *_) = json.loads(live.prefect(env, "artifact", "inspect", "specflow-decision",
                                         "-o", "json"))
    assert artifact["type"] == "table" and str(artifact["flow_run_id"]) == run_id
    rows = artifact["data"] if isinstance(artifact["data"], list) else json.loads(
        artifact["data"])
    assert [(r["class"], r["band"]) for r in rows] == [("chat", "c1")]
    # two windows of n-gram on the tiny target: it wins, is ruled out (off) or stays open
    assert (rows[0]["outcome"], rows[0]["deploy"]) in (
        ("promote", "ngram-n2"), ("off", "off (baseline)"), ("unresolved", "the champion (kept)"))
    assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", rows[0]["speedup [CI]"])
    assert (f"mlflow ui --backend-store-uri sqlite:///{tmp / 'mlflow.db'}, then open "
            "http://127.0.0.1:5000/#/experiments/") in artifact["description"]
    assert "?workflowType=machine_learning" in artifact["description"]


@pytest.mark.engine
def test_served_deployment_runs_on_a_local_prefect_server(tmp_path: Path, tiny_models: Path
                                                          ) -> None:
    """The deployment served by `python -m pipelines.deploy` against a real `prefect server`;
    the server is SIGKILLed during a served run (after its first window). The run goes on
    without the API (task states are events; the windows go to the ledger) and cannot report
    its end; no engine outlives it; the serve process outlives the outage. With the server back
    on the same port and database, the deployment is served again and the next run completes
    the sweep without measuring again what the killed run had measured."""
    models, work = tiny_models, tmp_path / "work"
    port = live.port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
               MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    env.pop("PREFECT_API_URL", None)
    client_env = dict(
        env, PREFECT_API_URL=api,
        # The runner asks for runs to start every 10 s by default: 2 s starts a triggered run
        # sooner, and the runner gives up on the dead API after 3 failed polls in a row.
        PREFECT_RUNNER_POLL_FREQUENCY="2",
        # A failed API request is retried 5 times, 2+4+8+16+32 s (about a minute) by default:
        # with 2 retries (about 6 s) each poll, the killed run's state reports and the serve
        # process's pause of the schedule give up within seconds of the outage.
        PREFECT_CLIENT_MAX_RETRIES="2")
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    server = live.start_server(tmp_path, port, env)
    procs = [server]
    try:
        live.wait_http(f"{api}/health", server, server_log, 180)
        overrides = ["experiment=cpu_tiny", "drafter=[none,ngram]",
                     "+sweep.num_speculative_tokens.ngram=[2]", "workload=[chat]",
                     "workload.chat.num_prompts=4", "workload.chat.max_tokens=8",
                     "sweep.concurrency=[1]", "sweep.repeats=2", "promote.min_repeats=2",
                     "sweep.closing_baseline_repeats=0", "sweep.design=grid",
                     f"paths.models={models}",
                     f"tracking.workdir={work}",
                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                     f"promote.output_dir={tmp_path / 'promoted'}"]
        with open(serve_log, "wb") as fh:
            # --reconnect-max 4: the API is checked again at most 4 s apart after the outage
            serve = subprocess.Popen([sys.executable, "-m", "pipelines.deploy", "--cron",
                                      "0 3 * * *", "--reconnect-max", "4", *overrides],
                                     cwd=ROOT, env=client_env, stdout=fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(serve)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert serve.poll() is None, serve_log.read_text(errors="replace")[-3000:]
            info = subprocess.run([sys.executable, "-m", "prefect", "deployment", "inspect",
                                   DEPLOYMENT], env=client_env, capture_output=True, text=True,
                                  timeout=120, check=False)
            if info.returncode == 0:
                break
            time.sleep(2)
        else:
            pytest.fail(f"deployment never registered:\n{serve_log.read_text()[-3000:]}")
        assert "0 3 * * *" in info.stdout  # the cron schedule is on the deployment

        # run 1, killed: the Prefect server dies once the run's first window is in the ledger
        first = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run",
                                DEPLOYMENT], env=client_env, capture_output=True, text=True,
                               timeout=120, check=False)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]

        def serving() -> bool:
            assert serve.poll() is None, serve_log.read_text(errors="replace")[-3000:]
            return True

        live.wait_for("a window of run 1 in the ledger", lambda: serving() and any(
            m["status"] == "ok" for m in live.windows(work).values()), 600, serve_log)
        before = {k: m for k, m in live.windows(work).items() if m["status"] == "ok"}
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
        live.wait_for("the serve process says the runner stopped on the outage",
                  lambda: serving() and UNREACHABLE in serve_log.read_text(errors="replace"),
                  180, serve_log)
        # the run goes on without the API (every window, the decision) and then fails to report
        # its end; the serve process waits for it before it checks the API again
        live.wait_for("the killed run ending", lambda: serving() and AGAIN in serve_log.read_text(
            errors="replace"), 600, serve_log)
        live.wait_for("no engine outliving the killed run",
                  lambda: not processes_using(models, but=serve.pid), 60, serve_log)
        (sweep_dir,) = (work / "sweeps").iterdir()
        ledger = Ledger(work, sweep_dir.name)
        recorded = live.windows(work)
        assert {k: recorded.get(k) for k in before} == before  # kept, as they were
        assert len(recorded) == 4 and len(recorded) > len(before)  # measured during the outage
        missing = {e.measurement.key.engine_hash for e in ledger.entries()
                   if not e.measurement.ok}  # what run 1 left to measure
        if not missing:
            # run 1 finished every window during the outage: one of those is lost, so that the
            # next run has a window to measure (and to show in its flow-run log)
            name = next(k for k in recorded if k not in before)
            (sweep_dir / "windows" / name).unlink()
            missing = {recorded.pop(name)["key"]["engine_hash"]}
        starts = len(ledger.engine_starts())

        # the server back on the same port and database; the deployment served again
        server = procs[0] = live.start_server(tmp_path, port, env)
        live.wait_http(f"{api}/health", server, server_log, 180)
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", DEPLOYMENT,
                              "--watch", "--watch-timeout", "600"], env=client_env,
                             capture_output=True, text=True, timeout=700, check=False)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:] + serve_log.read_text(errors="replace")[-3000:]
        assert "COMPLETED" in out.upper(), out[-3000:]
        assert (tmp_path / "work" / "sweeps").is_dir()  # the run really measured
        done = list(ledger.entries())
        assert len(done) == 4 and all(e.measurement.ok for e in done)
        assert {k: live.windows(work).get(k) for k in before} == before  # not measured again
        again = [e.hash for e in ledger.engine_starts()][starts:]
        assert sorted(again) == sorted(missing)  # started again: only what run 1 left
        _flow_run_shows_windows_and_the_decision(out, client_env, tmp_path)
        os.killpg(serve.pid, signal.SIGTERM)
        assert serve.wait(timeout=120) == 0, serve_log.read_text(errors="replace")[-3000:]
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                live.stop(p)
