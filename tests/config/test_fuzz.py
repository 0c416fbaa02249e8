"""A seeded slice of bench/fuzz_configs.py: random overrides and broken YAML through the CLI
end clean (exit 0, or exit 2 with one line per problem naming a field or file:line)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuzz_configs.py"


@pytest.fixture(scope="module")
def fuzz():  # noqa: ANN201 - the bench module
    spec = importlib.util.spec_from_file_location("fuzz_configs", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [11])
def test_seeded_slice_is_all_clean(fuzz, seed: int) -> None:  # noqa: ANN001
    result = fuzz.run(n_overrides=100, n_yaml=14, seed=seed)
    assert result["total"] == 114
    assert result["clean"] == result["total"], json.dumps(result["examples"][:3], indent=1)
