"""One Hugging Face cache locator, honouring the variables huggingface_hub honours, for models
(headroom) and datasets (workloads) alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specflow.spec import hfcache
from specflow.spec.architecture import snapshot_dir

VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_DATASETS_CACHE")


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_precedence_of_the_cache_variables(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert hfcache.hub_cache() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hfcache.hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    assert hfcache.datasets_cache() == tmp_path / "xdg" / "huggingface" / "datasets"
    env.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hfcache.hub_cache() == tmp_path / "hf" / "hub"
    env.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert hfcache.hub_cache() == tmp_path / "old"
    env.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
    assert hfcache.hub_cache() == tmp_path / "new"
    env.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds"))
    assert hfcache.datasets_cache() == tmp_path / "ds"


def _snapshot(hub: Path, repo: str, commit: str, ref: str = "main") -> Path:
    root = hub / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / ref).write_text(commit + "\n")
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return snap


def test_model_snapshots_are_found_through_the_same_locator(env: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    snap = _snapshot(tmp_path / "xdg" / "huggingface" / "hub", "org/m", "abc123")
    assert hfcache.snapshot("org/m") == snap
    assert snapshot_dir("org/m") == snap  # headroom reads architectures from here
    assert snapshot_dir("org/m", "abc123") == snap  # a commit works as the revision
    assert snapshot_dir("org/m", "v2") is None
    assert hfcache.repo_dir("org/d", "dataset").name == "datasets--org--d"
