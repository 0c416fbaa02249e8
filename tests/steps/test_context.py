"""What a sweep's context logs as its MLflow `config.yaml`: the real composed conf/, no secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specflow.config.artifact import REDACTED, artifact_config
from specflow.config.compose import load

TOKEN = "hf_secret_0123456789"
LITERAL = "literal-secret-9876543210"


def test_config_artifact_redacts_backend_env_and_keeps_env_interpolations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECFLOW_TEST_TOKEN", TOKEN)
    loaded = load(["experiment=cpu_demo",
                   "+backend.env.HF_TOKEN=${oc.env:SPECFLOW_TEST_TOKEN}",
                   f"+backend.env.OTHER_KEY={LITERAL}",
                   "target.revision=${oc.env:SPECFLOW_TEST_TOKEN}",
                   "tracking.experiment=${backend.env.HF_TOKEN}"])
    assert loaded.spec.backend.env["HF_TOKEN"] == TOKEN  # the run itself gets the values
    assert loaded.spec.tracking.experiment == TOKEN

    text = artifact_config(loaded)
    assert TOKEN not in text and LITERAL not in text
    cfg = yaml.safe_load(text)
    assert cfg["backend"]["env"] == {"HF_HUB_OFFLINE": REDACTED, "HF_TOKEN": REDACTED,
                                     "OTHER_KEY": REDACTED}
    assert cfg["target"]["revision"] == "${oc.env:SPECFLOW_TEST_TOKEN}"
    assert cfg["tracking"]["experiment"] == "${oc.env:SPECFLOW_TEST_TOKEN}"
    # everything else is the validated config: references followed, names filled in
    assert cfg["target"]["model"] == loaded.raw["target"]["model"]
    assert "${" not in cfg["target"]["model"]
    assert cfg["target"]["name"] == loaded.raw["target"]["name"]
    assert set(cfg) == set(loaded.raw) and set(cfg["drafter"]) == set(loaded.raw["drafter"])
    assert {k: v for k, v in cfg.items() if k not in ("backend", "target", "tracking")} == {
        k: v for k, v in loaded.raw.items() if k not in ("backend", "target", "tracking")}


def test_config_artifact_of_a_plain_config_is_the_config() -> None:
    loaded = load(["target=qwen3_8b", "drafter=eagle3"])
    cfg = yaml.safe_load(artifact_config(loaded))
    assert cfg["backend"]["env"] == {}
    assert cfg == loaded.raw


def _sid(*overrides: str) -> str:
    from specflow.config.compose import load_plan
    from specflow.results.ledger import sweep_id
    from specflow.steps.context import measured_settings

    loaded, plan = load_plan(["experiment=cpu_demo", *overrides])
    return sweep_id(plan.hash, "0.32.0", measured_settings(loaded.spec))


@pytest.mark.parametrize("change", [
    "workload.chat.max_tokens=9", "workload.chat.num_prompts=5", "sweep.warmup_requests=3",
    "sweep.design=grid", "workload=[chat]"])
def test_what_changes_a_window_changes_the_sweep(change: str) -> None:
    """A different output length, prompt set, warm-up or design is another sweep: its windows
    are never taken for the old ones on resume."""
    assert _sid(change) != _sid()


@pytest.mark.parametrize("change", ["promote.margin=0.1", "promote.confidence=0.9"])
def test_what_changes_only_the_decision_reuses_the_windows(change: str) -> None:
    assert _sid(change) == _sid()


def test_the_round_planner_gets_each_engines_kv_capacity_from_headroom(tmp_path: Path) -> None:
    """The adaptive search caps a prediction where the candidate's KV cache holds fewer
    requests than the level: the shape it plans with carries headroom's maximum concurrency."""
    from specflow.config.compose import load_plan
    from specflow.core.memory import headroom
    from specflow.results.ledger import Ledger
    from specflow.steps.context import Context

    loaded, plan = load_plan(["experiment=cpu_demo",
                              "backend.engine.kv_cache_memory_bytes=8388608"])
    reports = {ec.hash: headroom(loaded.spec, ec) for ec in plan.engine_configs}
    ctx = Context((), loaded, plan, None, Ledger(tmp_path, "sid"),  # type: ignore[arg-type]
                  reports, {}, [])
    kv = ctx.shape().kv_capacity
    assert kv == {h: r.concurrency_at_context for h, r in reports.items()}
    by_name = {ec.name: kv[ec.hash] for ec in plan.engine_configs}
    # the copy drafter's own KV cache and lookahead slots leave room for fewer requests
    assert 0 < by_name["draft_model-n4"] < by_name["baseline"]
