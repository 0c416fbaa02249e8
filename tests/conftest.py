"""Shared fixtures: the repo's conf/, hermetic caches, helpers to run the CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


COSTLIEST_FIRST = (
    # The modules that start engines, costliest first (worker-seconds in the fresh-clone CI,
    # docs/benchmarks.md "The test suite"). `make test` hands modules to its workers in this
    # order (`--dist loadscope --no-loadscope-reorder`), so the many short modules fill the
    # end of the run instead of one long module running alone at the end.
    "tests/pipelines/test_pipeline.py",
    "tests/test_bench.py",
    "tests/pipelines/test_scale_out.py",
    "tests/engine/test_runner.py",
    "tests/demo/test_seed_methods.py",
    "tests/results/test_compare_sweeps.py",
    "tests/pipelines/test_deployment.py",
    "tests/workloads/test_trace_sweep.py",
    "tests/engine/test_watch.py",
    "tests/results/test_object_store.py",
)


LIGHT = (
    # Modules whose tests compute in this process only: no server, no subprocess, no clock (no
    # timeout, sleep or lease), so that they pass however little CPU they get (checked by
    # tests/test_suite_parts.py). `make test` runs them (`--part light`) at the lowest priority
    # beside the other tests (`--part heavy`), on the CPU those leave idle while they wait
    # (servers starting, polls, outages), instead of on the two workers' cores. A test marked
    # `engine` is heavy wherever it is.
    "tests/config/test_conf.py", "tests/config/test_fuzz.py",
    "tests/decision/", "tests/search/test_predict.py", "tests/search/test_racing.py",
    "tests/decision/test_capacity.py",
    "tests/decision/test_beside.py",
    "tests/spec/test_hfcache.py", "tests/workloads/test_generators.py",
    "tests/workloads/test_materialize.py", "tests/workloads/test_render.py",
    "tests/workloads/test_sources.py", "tests/results/test_console.py",
    "tests/results/test_ledger.py", "tests/results/test_report.py", "tests/records/",
    "tests/steps/", "tests/engine/test_device.py", "tests/engine/test_server.py",
    "tests/pipelines/test_k8s_template.py", "tests/stats/", "tests/test_glossary.py",
    "tests/spec/test_traces.py", "tests/spec/test_profile_exchange.py",
    "tests/spec/test_store_config.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--part", choices=("all", "light", "heavy"), default="all",
                     help="light: the LIGHT modules' tests (not marked engine); heavy: the "
                          "others; all (the default): every test")


def _light(item: pytest.Item) -> bool:
    return item.nodeid.startswith(LIGHT) and "engine" not in item.keywords


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--part`: the light or the heavy tests only (see LIGHT). The costliest modules first
    (see COSTLIEST_FIRST; a stable sort: each module's tests and the other modules keep their
    order). Tests marked `engine` need the real vLLM; without it they are skipped, saying why."""
    part = config.getoption("--part")
    if part != "all":
        light = {item.nodeid: _light(item) for item in items}
        want = part == "light"
        config.hook.pytest_deselected(items=[i for i in items if light[i.nodeid] != want])
        items[:] = [item for item in items if light[item.nodeid] == want]
    rank = {module: i for i, module in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: install specflow[cpu] (or [gpu]); `make test` does")
    for item in items:
        if "engine" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _hermetic(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
              ) -> Iterator[None]:
    cache = tmp_path_factory.mktemp("cache")
    # vLLM's API server and engine core talk over IPC sockets under VLLM_RPC_BASE_PATH (by
    # default the temp dir), and a socket path must fit in 107 bytes: the pipeline tests make
    # each test's own temp dir the TMPDIR of their jobs, and under xdist
    # (/tmp/pytest-of-root/pytest-12/popen-gw0/test_a_sweep_fans_out_to_two_w0/<uuid>) that is
    # 108. A short directory of the session's own keeps every engine start clear of the limit.
    rpc = tempfile.mkdtemp(prefix="sf-rpc-", dir="/tmp")
    os.environ.setdefault("VLLM_RPC_BASE_PATH", rpc)
    os.environ["SPECFLOW_CACHE"] = str(cache)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # vLLM inspects each model architecture once (~15 s) and caches what it found under
    # VLLM_CACHE_ROOT (atomic writes, keyed by the model module's hash): one cache for all the
    # session's xdist workers, so a second worker starting the same architecture reads it.
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    os.environ.setdefault("VLLM_CACHE_ROOT", str(shared / "vllm-cache"))
    # The engines the tests start run vLLM's single-process executor (the model worker inside
    # the engine-core process; API server and engine core stay two processes): each start is
    # ~9 s shorter without the worker process's imports, and tiny models decode a few tokens.
    # vLLM's default (`mp`) runs in the multirun main job (tests/pipelines/test_pipeline.py).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.pop("SPECFLOW_CONF", None)
    # `make test` runs the suite on pytest-xdist workers, one per core, so two engines may
    # run at once: each decodes its tiny model on one OpenMP thread bound to its worker's core.
    # The light part's workers (`--part light`) stay unpinned: they run on whichever core the
    # heavy part leaves idle.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cpus = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cpus) > 1 and pytestconfig.getoption("--part") != "light":
        cpu = cpus[int(worker[2:]) % len(cpus)]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cpu))
        # Each worker and every process it starts (engines, API servers, load generators, main
        # jobs) run on a core of their own, as each engine has its own GPU on a GPU node: a
        # window measures its engine, not the other worker's engine start beside it.
        os.sched_setaffinity(0, {cpu})
    yield
    shutil.rmtree(rpc, ignore_errors=True)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `prefect server` for the main jobs of this test worker, started once: a main job
    without PREFECT_API_URL starts Prefect's temporary server (~20 CPU-seconds, most of a main
    job's overhead); one pointed at a running API is what a production install does. The main
    jobs that check the temporary server (its start and its cleanup) do not use this one."""
    from tests.pipelines import live

    tmp = tmp_path_factory.mktemp("prefect-api")
    port = live.port()
    env = dict(os.environ, PREFECT_HOME=str(tmp / "home"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="false")
    env.pop("PREFECT_API_URL", None)
    server = live.start_server(tmp, port, env)
    try:
        api = f"http://127.0.0.1:{port}/api"
        live.wait_http(f"{api}/health", server, tmp / "server.log", 180)
        yield api
    finally:
        live.stop(server)


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m specflow ARGS` in a real subprocess (exit code and streams as a user sees)."""
    return subprocess.run([sys.executable, "-m", "specflow", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tiny local model (targets, drafters of each seed method), built once per session;
    the directory to pass as `paths.models`."""
    from specflow.demo import tiny

    root = tmp_path_factory.mktemp("models")
    tiny.build_all(root)
    return root
