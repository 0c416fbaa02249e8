"""A real local Prefect server, the scheduled re-validation deployment served, a run triggered."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = "specflow-sweep/specflow-revalidate"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} not ready:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.engine
def test_served_deployment_runs_on_a_local_prefect_server(tmp_path: Path, tiny_models: Path
                                                          ) -> None:
    models = tiny_models
    port = _port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false",
               MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    env.pop("PREFECT_API_URL", None)
    server_log = tmp_path / "server.log"
    with open(server_log, "wb") as fh:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start",
                                   "--host", "127.0.0.1", "--port", str(port)],
                                  cwd=tmp_path, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    procs = [server]
    try:
        _wait_http(f"{api}/health", server, server_log, 180)
        client_env = dict(env, PREFECT_API_URL=api)
        overrides = ["experiment=cpu_demo", "drafter=[none]", "workload=[chat]",
                     "workload.chat.num_prompts=4", "workload.chat.max_tokens=8",
                     "sweep.concurrency=[1]", "sweep.repeats=2", "promote.min_repeats=2",
                     "sweep.closing_baseline_repeats=0", "sweep.design=grid",
                     f"paths.models={models}",
                     f"tracking.workdir={tmp_path / 'work'}",
                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                     f"promote.output_dir={tmp_path / 'promoted'}"]
        serve_log = tmp_path / "serve.log"
        with open(serve_log, "wb") as fh:
            serve = subprocess.Popen([sys.executable, "-m", "pipelines.deploy", "--cron",
                                      "0 3 * * *", *overrides], cwd=ROOT, env=client_env,
                                     stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
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
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", DEPLOYMENT,
                              "--watch", "--watch-timeout", "600"], env=client_env,
                             capture_output=True, text=True, timeout=700, check=False)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:] + serve_log.read_text(errors="replace")[-3000:]
        assert "COMPLETED" in out.upper(), out[-3000:]
        assert (tmp_path / "work" / "sweeps").is_dir()  # the run really measured
    finally:
        for p in reversed(procs):
            _stop(p)
