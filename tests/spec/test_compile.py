"""Compiled speculative configs and serve argv: golden files and cross-section rules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specflow.config.compose import load_plan
from specflow.spec.compile import serve_argv
from specflow.spec.errors import SpecError
from specflow.spec.methods import METHODS
from tests.conftest import run_cli

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("SPECFLOW_UPDATE_GOLDEN") == "1"

PAIRS = [
    ("qwen3_5_27b", "mtp"),
    ("gemma4_26b_a4b", "gemma4_mtp"),
    ("qwen3_8b", "eagle3"),
    ("qwen3_8b", "dflash"),
    ("qwen3_8b", "dspark"),
    ("qwen3_8b", "ngram"),
    ("qwen3_8b", "draft_model"),
    ("llama3_1_8b", "eagle3"),
    ("tiny", "draft_model"),
]


def _golden_view(plan) -> list[dict]:  # noqa: ANN001
    return [{"name": e.name, "speculative_config": e.speculative_config,
             "serve_argv": list(e.serve_argv)} for e in plan.engine_configs]


@pytest.mark.parametrize(("target", "drafter"), PAIRS, ids=[f"{t}-{d}" for t, d in PAIRS])
def test_golden(target: str, drafter: str) -> None:
    _, plan = load_plan([f"target={target}", f"drafter={drafter}"])
    got = _golden_view(plan)
    path = GOLDEN / f"{target}__{drafter}.json"
    if UPDATE or not path.exists():
        assert UPDATE, f"missing golden {path}; regenerate with SPECFLOW_UPDATE_GOLDEN=1"
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(path.read_text())


def test_golden_content_is_what_vllm_expects() -> None:
    """Spot-check the goldens against vLLM 0.32's rules, not just against themselves."""
    mtp = json.loads((GOLDEN / "qwen3_5_27b__mtp.json").read_text())
    assert mtp[1]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    gemma = json.loads((GOLDEN / "gemma4_26b_a4b__gemma4_mtp.json").read_text())
    assert gemma[1]["speculative_config"]["method"] == "mtp"
    assert gemma[1]["speculative_config"]["model"] == "google/gemma-4-26B-A4B-it-assistant"
    ngram = json.loads((GOLDEN / "qwen3_8b__ngram.json").read_text())
    sc = ngram[1]["speculative_config"]
    assert sc["prompt_lookup_min"] <= sc["prompt_lookup_max"]
    for entry in ngram:
        argv = entry["serve_argv"]
        assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
        assert "--trust-remote-code" not in argv
        if entry["speculative_config"]:
            i = argv.index("--speculative-config")
            assert json.loads(argv[i + 1]) == entry["speculative_config"]


def test_cli_compile_prints_the_plan_from_repo_root() -> None:
    proc = run_cli("compile", "target=qwen3_8b", "drafter=eagle3")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert _golden_view_from_json(plan) == json.loads(
        (GOLDEN / "qwen3_8b__eagle3.json").read_text())
    assert len({e["hash"] for e in plan["engine_configs"]}) == len(plan["engine_configs"])


def _golden_view_from_json(plan: dict) -> list[dict]:
    return [{"name": e["name"], "speculative_config": e["speculative_config"],
             "serve_argv": e["serve_argv"]} for e in plan["engine_configs"]]


def test_mismatched_pair_exits_2_naming_drafter_and_supported_targets() -> None:
    proc = run_cli("compile", "target=qwen3_8b", "drafter=gemma4_mtp")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "drafter.gemma4_mtp" in proc.stderr
    assert "gemma4_26b_a4b" in proc.stderr and "gemma4_31b" in proc.stderr
    assert proc.stdout == ""


def test_hash_is_stable_and_content_based() -> None:
    _, a = load_plan(["target=qwen3_8b", "drafter=eagle3"])
    _, b = load_plan(["target=qwen3_8b", "drafter=eagle3", "sweep.repeats=7"])
    assert [e.hash for e in a.engine_configs] == [e.hash for e in b.engine_configs]
    assert a.hash != b.hash  # the plan (repeats) changed, the engines did not
    _, c = load_plan(["target=qwen3_8b", "drafter=eagle3", "target.max_model_len=8192"])
    assert {e.hash for e in a.engine_configs}.isdisjoint(e.hash for e in c.engine_configs)


def test_baseline_added_when_not_selected_and_n_from_sweep() -> None:
    _, plan = load_plan(["target=qwen3_8b", "drafter=eagle3",
                         "+sweep.num_speculative_tokens.eagle3=[5,1,5]"])
    assert [e.name for e in plan.engine_configs] == ["baseline", "eagle3-n1", "eagle3-n5"]


def test_lookahead_slots_follow_vllm() -> None:
    assert METHODS["dflash"].lookahead_slots(4) == 5
    assert METHODS["eagle3"].lookahead_slots(4) == 4
    assert METHODS["draft_model"].lookahead_slots(3) == 3
    assert METHODS["ngram"].lookahead_slots(4) == 0
    _, plan = load_plan(["target=qwen3_8b", "drafter=dflash"])
    assert all(e.lookahead_slots == e.num_speculative_tokens + 1
               for e in plan.engine_configs if e.method == "dflash")


def test_mtp_reuse_warns_and_divisibility_rejects() -> None:
    _, plan = load_plan(["target=qwen3_5_27b", "drafter=mtp"])
    assert any("reuses" in w for w in plan.warnings)
    with pytest.raises(SpecError) as info:
        load_plan(["target=qwen3_5_27b", "drafter=mtp", "target.arch.mtp_depth=2",
                   "+sweep.num_speculative_tokens.mtp=[2,3]"])
    (problem,) = info.value.problems
    assert problem.path == "sweep.num_speculative_tokens.mtp[1]"
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in problem.problem


def test_endpoint_backend_argv_ignores_engine_knobs_but_compiles() -> None:
    loaded, plan = load_plan(["backend=endpoint", "backend.served_model_name=q", "drafter=none"])
    assert [e.name for e in plan.engine_configs] == ["baseline"]
    assert serve_argv(loaded.spec, None)[0] == "vllm"


def test_cfg_job_prints_the_composed_config() -> None:
    import yaml

    proc = run_cli("compile", "experiment=cpu_tiny", "sweep.repeats=4", "--cfg", "job")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["sweep"]["repeats"] == 4
    assert set(cfg["drafter"]) == {"none", "ngram", "draft_model"}
    assert "hydra" not in cfg


# --------------------------------------------------------------------------------------------
# Secrets stay out of argv; the engine stays on loopback unless allowed and keyed

SECRET = "sk-live-0123456789"


@pytest.mark.parametrize("args", [["--api-key", SECRET], [f"--api-key={SECRET}"],
                                  ["--api_key", SECRET], ["--api-ke", SECRET],
                                  ["--hf-token", SECRET]])
def test_a_secret_in_extra_args_is_refused_without_showing_it(args: list[str]) -> None:
    override = "backend.engine.extra_args=[--enforce-eager," + ",".join(
        f"'{a}'" for a in args) + "]"
    with pytest.raises(SpecError) as info:
        load_plan(["target=qwen3_8b", "drafter=eagle3", override])
    (p,) = info.value.problems
    assert p.path == "backend.engine.extra_args[1]"
    assert "***" in p.render() and SECRET not in p.render()
    assert p.source.startswith("override backend.engine.extra_args")
    if "hf" not in args[0]:
        assert p.expected == ("set the key in the environment variable named by "
                              "backend.api_key_env")


def test_options_that_only_look_like_secrets_pass() -> None:
    _, plan = load_plan(["target=qwen3_8b", "drafter=eagle3", "backend.engine.extra_args="
                         "[--api-server-count,'2',--hf-token,--disable-log-stats]"])
    assert "--api-server-count" in plan.engine_configs[0].serve_argv


def test_cli_refuses_an_api_key_in_extra_args_exit_2_without_printing_it() -> None:
    proc = run_cli("compile", "--no-vllm-check", "target=qwen3_8b", "drafter=eagle3",
                   f"backend.engine.extra_args=[--api-key,{SECRET}]")
    assert proc.returncode == 2, proc.stderr
    assert "backend.engine.extra_args[0]" in proc.stderr and "backend.api_key_env" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gpu-node.example.org"])
def test_a_non_loopback_host_needs_allow_remote_and_an_api_key(host: str) -> None:
    base = ["target=qwen3_8b", "drafter=eagle3", f"backend.host={host}"]
    for extra, missing in [([], ["backend.allow_remote=true", "backend.api_key_env"]),
                           (["backend.allow_remote=true"], ["backend.api_key_env"]),
                           (["backend.api_key_env=SPECFLOW_KEY"], ["backend.allow_remote=true"])]:
        with pytest.raises(SpecError) as info:
            load_plan([*base, *extra])
        (p,) = info.value.problems
        assert p.path == "backend.host" and p.got == host
        assert all(m in p.expected for m in missing), p.render()
    _, plan = load_plan([*base, "backend.allow_remote=true", "backend.api_key_env=SPECFLOW_KEY"])
    (warning,) = [w for w in plan.warnings if "backend.host" in w]
    assert host in warning and "$SPECFLOW_KEY" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_nothing(host: str) -> None:
    _, plan = load_plan(["target=qwen3_8b", "drafter=eagle3", f"backend.host={host}"])
    assert not [w for w in plan.warnings if "backend.host" in w]


def test_cli_refuses_a_public_bind_exit_2() -> None:
    proc = run_cli("compile", "--no-vllm-check", "target=qwen3_8b", "drafter=eagle3",
                   "backend.host=0.0.0.0")
    assert proc.returncode == 2, proc.stderr
    assert "backend.host:" in proc.stderr and "backend.allow_remote" in proc.stderr
    proc = run_cli("compile", "--no-vllm-check", "target=qwen3_8b", "drafter=eagle3",
                   "backend.host=0.0.0.0", "backend.allow_remote=true",
                   "backend.api_key_env=SPECFLOW_KEY")
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "0.0.0.0" in proc.stderr


# --------------------------------------------------------------------------------------------
# Adaptive verification: a sweep axis where the installed vLLM has it


def test_adaptive_verification_is_swept_beside_each_fixed_n() -> None:
    _, plan = load_plan(["target=qwen3_8b", "hardware=h200", "drafter=[none,dspark]",
                         "drafter.dspark.adaptive_verification=[false,true]",
                         "+sweep.num_speculative_tokens.dspark=[4,7]"])
    names = [e.name for e in plan.engine_configs]
    assert names == ["baseline", "dspark-n4", "dspark-n4-adaptive", "dspark-n7",
                     "dspark-n7-adaptive"]
    by = {e.name: e for e in plan.engine_configs}
    assert by["dspark-n7-adaptive"].speculative_config == {
        **by["dspark-n7"].speculative_config, "enable_adaptive_verification": True}
    assert by["dspark-n7-adaptive"].hash != by["dspark-n7"].hash
    assert by["dspark-n7-adaptive"].lookahead_slots == by["dspark-n7"].lookahead_slots
    assert [e.series for e in plan.engine_configs] == [
        "none", "dspark", "dspark+adaptive", "dspark", "dspark+adaptive"]
    _, only = load_plan(["target=qwen3_8b", "hardware=h200", "drafter=[none,dspark]",
                         "drafter.dspark.adaptive_verification=[true]"])
    assert [e.name for e in only.engine_configs] == ["baseline", "dspark-n7-adaptive"]


def test_adaptive_verification_is_refused_where_vllm_does_not_verify_adaptively() -> None:
    with pytest.raises(SpecError) as info:
        load_plan(["experiment=cpu_tiny", "+drafter.ngram.adaptive_verification=[false,true]",
                   "+drafter.draft_model.extra_speculative_config.enable_adaptive_verification"
                   "=true"])
    got = {(p.path, p.problem.split(" (")[0]) for p in info.value.problems}
    assert got == {
        ("drafter.ngram.adaptive_verification",
         "vLLM 0.32 verifies adaptively only for method dspark, not ngram"),
        ("drafter.ngram.adaptive_verification", "the CPU engine never verifies adaptively"),
        ("drafter.draft_model.extra_speculative_config.enable_adaptive_verification",
         "set by specflow from the drafter's own fields")}
    reserved = next(p for p in info.value.problems if "extra_speculative" in p.path)
    assert "drafter.draft_model.adaptive_verification" in reserved.expected


def test_a_cpu_run_asked_to_verify_adaptively_says_so_before_starting() -> None:
    proc = run_cli("experiment=cpu_tiny", "+drafter.ngram.adaptive_verification=[true]")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "drafter.ngram.adaptive_verification: the CPU engine never verifies adaptively" \
        in proc.stderr
    assert "sweep" not in proc.stdout  # refused before Prefect, an engine or a window


# ------------------------------------------------------------ synthetic rejection sampling

SYNTH = "drafter.eagle3.extra_speculative_config"


def test_synthetic_rates_cover_the_largest_n_and_each_engine_gets_its_first_n() -> None:
    _, plan = load_plan(["experiment=gpu_check"])
    rates = [0.75, 0.55, 0.40, 0.29, 0.21, 0.16, 0.13]
    got = {e.name: e.speculative_config for e in plan.engine_configs if e.speculative_config}
    for n in range(1, 8):
        cfg = got[f"eagle3-n{n}"]
        assert cfg["rejection_sample_method"] == "synthetic"
        assert cfg["synthetic_acceptance_rates"] == rates[:n]
    assert got["draft_model-n3"]["synthetic_acceptance_rates"] == [0.60, 0.40, 0.27]
    # one acceptance length for every N is passed as it is
    _, plan = load_plan(["experiment=gpu_check", f"~{SYNTH}.synthetic_acceptance_rates",
                         f"+{SYNTH}.synthetic_acceptance_length=2"])
    eagle = [e.speculative_config for e in plan.engine_configs if e.drafter == "eagle3"]
    assert {c["synthetic_acceptance_length"] for c in eagle} == {2}


@pytest.mark.parametrize(("overrides", "path", "problem"), [
    (["hardware=cpu", "backend=cpu"], f"{SYNTH}.rejection_sample_method",
     "the CPU engine has no synthetic acceptance"),
    ([f"{SYNTH}.synthetic_acceptance_rates=[0.9,0.8]"], f"{SYNTH}.synthetic_acceptance_rates",
     "per-position unconditional acceptance rates for every position up to the largest N"),
    ([f"{SYNTH}.synthetic_acceptance_rates=[0.5,0.6,0.4,0.3,0.2,0.1,0.1]"],
     f"{SYNTH}.synthetic_acceptance_rates", "per-position unconditional acceptance rates"),
    ([f"{SYNTH}.synthetic_acceptance_rates=[1.5,0.6,0.4,0.3,0.2,0.1,0.1]"],
     f"{SYNTH}.synthetic_acceptance_rates", "per-position unconditional acceptance rates"),
    ([f"+{SYNTH}.synthetic_acceptance_length=2"], SYNTH, "needs exactly one of"),
    ([f"~{SYNTH}.synthetic_acceptance_rates"], SYNTH, "needs exactly one of"),
    ([f"~{SYNTH}.synthetic_acceptance_rates", f"+{SYNTH}.synthetic_acceptance_length=2.5"],
     f"{SYNTH}.synthetic_acceptance_length", "within [1, N+1] of every N swept"),
    ([f"~{SYNTH}.rejection_sample_method"], f"{SYNTH}.synthetic_acceptance_rates",
     "only read by vLLM with rejection_sample_method: synthetic"),
])
def test_synthetic_rejection_sampling_is_checked_before_anything_starts(
        overrides: list[str], path: str, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        load_plan(["experiment=gpu_check", *overrides])
    found = [p for p in info.value.problems if p.path == path]
    assert found and problem in found[0].problem, info.value.problems


def test_a_list_in_extra_speculative_config_is_checked_item_by_item() -> None:
    with pytest.raises(SpecError) as info:
        load_plan(["experiment=cpu_tiny", "+drafter.draft_model.extra_speculative_config.x=nan",
                   "+drafter.draft_model.extra_speculative_config.y=[1,nan]",
                   "+drafter.draft_model.extra_speculative_config.z={a:1}"])
    got = {p.path: p.problem for p in info.value.problems}
    at = "drafter.draft_model.extra_speculative_config"
    assert got == {f"{at}.x": "not a finite number", f"{at}.y[1]": "not a finite number",
                   f"{at}.z": "wrong type"}


def test_the_single_process_executor_is_asked_for_and_serves_one_rank(tmp_path: Path) -> None:
    from specflow.engine.server import LocalEngine
    from specflow.spec.schema import LocalBackend

    _, default = load_plan(["experiment=cpu_tiny"])  # vLLM's choice unless asked
    assert all("--distributed-executor-backend" not in ec.serve_argv
               for ec in default.engine_configs)
    loaded, plan = load_plan(["experiment=cpu_tiny",
                              "backend.engine.distributed_executor_backend=uni"])
    for ec in plan.engine_configs:
        argv = list(ec.serve_argv)
        assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    # without this vLLM's CPU platform turns `uni` back into `mp`
    backend = loaded.spec.backend
    assert isinstance(backend, LocalBackend)
    engine = LocalEngine(plan.engine_configs[0], backend, tmp_path)
    assert engine.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    untouched = LocalEngine(default.engine_configs[0], backend, tmp_path).env
    assert untouched.get("VLLM_ENABLE_V1_MULTIPROCESSING") == os.environ.get(
        "VLLM_ENABLE_V1_MULTIPROCESSING")
    with pytest.raises(SpecError) as info:
        load_plan(["target=qwen3_8b", "drafter=eagle3", "target.tensor_parallel_size=2",
                   "hardware.device_count=2",
                   "backend.engine.distributed_executor_backend=uni"])
    (p,) = info.value.problems
    assert p.path == "backend.engine.distributed_executor_backend" and p.got == "uni"
    assert "one rank" in p.problem and "mp" in p.expected


def test_a_work_pool_sweep_refuses_paths_each_worker_would_resolve_on_its_own(tmp_path: Path
                                                                              ) -> None:
    """Fanned out to a work pool, relative ledger/model paths and a relative sqlite store are
    refused together, each naming its field; absolute paths and a tracking server pass; the
    dispatch settings are not part of the plan (a dispatched sweep resumes in-process)."""
    pool = ["experiment=cpu_tiny", "dispatch.deployment=specflow-engine-config/gpu"]
    with pytest.raises(SpecError) as err:
        load_plan(pool)
    assert {p.path for p in err.value.problems} == {"tracking.workdir", "paths.models",
                                                    "tracking.uri"}
    assert "a tracking server (http://HOST:PORT)" in str(err.value)
    fine = [f"tracking.workdir={tmp_path}/work", f"paths.models={tmp_path}/models"]
    _, plan = load_plan([*pool, *fine, "tracking.uri=http://127.0.0.1:5000"])
    _, local = load_plan(["experiment=cpu_tiny", *fine])
    assert plan.hash == local.hash
    load_plan([*pool, *fine, f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])  # absolute
    proc = run_cli("compile", "experiment=cpu_tiny", "dispatch.deployment=gpu", "--no-vllm-check")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "dispatch.deployment: malformed; got 'gpu'" in proc.stderr
