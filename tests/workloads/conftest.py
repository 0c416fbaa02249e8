"""Fixtures of the workloads tests: the tiny target's tokenizer, an empty offline HF_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from specflow.demo import tiny


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny target's tokenizer directory (it has a chat template)."""
    return str(tiny.build("target", tmp_path_factory.mktemp("models")))


@pytest.fixture()
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF_HOME; every other cache location variable unset; hub offline."""
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return home
