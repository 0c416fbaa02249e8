"""Shared fixtures: the repo's conf/, hermetic caches, helpers to run the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _hermetic(tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("cache")
    os.environ["SPECFLOW_CACHE"] = str(cache)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.pop("SPECFLOW_CONF", None)


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m specflow ARGS` in a real subprocess (exit code and streams as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "specflow", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
