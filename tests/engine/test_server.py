"""The local engine's API key: read from the variable `backend.api_key_env` names, handed to
`vllm serve` through its environment only (no engine is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specflow.engine.server import EngineStartError, LocalEngine
from specflow.spec.schema import LocalBackend
from tests.builders import BASELINE

KEY = "sk-local-0123456789"


def test_the_key_reaches_the_engine_environment_not_its_argv(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECFLOW_TEST_ENGINE_KEY", KEY)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    engine = LocalEngine(BASELINE, LocalBackend(api_key_env="SPECFLOW_TEST_ENGINE_KEY"), tmp_path)
    assert engine.env["VLLM_API_KEY"] == KEY and engine.api_key == KEY
    assert KEY not in " ".join(engine.argv(8000))


def test_a_missing_key_fails_the_start_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECFLOW_TEST_ENGINE_KEY", raising=False)
    backend = LocalBackend(host="0.0.0.0", allow_remote=True,
                           api_key_env="SPECFLOW_TEST_ENGINE_KEY")
    engine = LocalEngine(BASELINE, backend, tmp_path)
    with pytest.raises(EngineStartError) as info:
        engine.start()
    assert info.value.failure.kind == "start_failed"
    assert "$SPECFLOW_TEST_ENGINE_KEY" in info.value.failure.message
    assert engine.proc is None  # never launched without its key
