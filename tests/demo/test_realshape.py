"""The GPU check's CPU-safe parts (bench/gpu_check.sh --smoke: --cpu-safe, one layer), as CI
runs them: the real-shape builders (one decoder layer, every other dimension real), compile and
headroom.

The engine side (an 8B target, synthetic rejection sampling) needs a GPU; what can be checked
without one is that the built checkpoints are what vLLM's loaders and the memory model expect.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specflow.demo import realshape, tiny
from specflow.spec.architecture import safetensors_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One run of the script's CPU-safe part at its smoke size (`--smoke`: `--cpu-safe` with one
    layer per model; the suite's run of this benchmark, tests/test_bench.py): its output and
    last-line figures (the ~4 GB of one-layer checkpoints are removed afterwards)."""
    out = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--smoke"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHON=sys.executable, GPU_CHECK_DIR=str(out)))
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield {"stdout": proc.stdout,
               "figures": json.loads(proc.stdout.strip().splitlines()[-1]),
               "models": out / "models" / "realshape"}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _header(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the safetensors headers."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
    return shapes


def _hf_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """What transformers' LlamaForCausalLM built from the config.json holds (no memory used)."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def test_the_cpu_safe_check_builds_compiles_and_sizes_the_real_shape(check: dict[str, Any]
                                                                      ) -> None:
    f = check["figures"]
    assert f["gpu"] is False and f["layers"] == 1 and f["sweep_exit"] is None
    assert f["built_ok"] is True
    # the built parameter counts are the conf's (what headroom charges), scaled to one layer
    assert abs(f["params_error"]["target"]) < 1e-3
    assert abs(f["params_error"]["draft_model"]) < 1e-2
    assert abs(f["params_error"]["eagle3"]) < 1e-2
    # baseline, EAGLE-3 N=1..7, the draft model at N=3; each engine gets its first N rates
    assert f["engine_configs"] == 9 and f["rates_sliced"] is True
    assert f["refused_on_cpu"] is True  # synthetic acceptance is GPU-only, said before starting
    assert f["headroom_fits"] == 9
    assert f["baseline_kv_tokens_estimate"] > 500_000  # an 8B target's KV on an H200
    assert "not run: no GPU" in check["stdout"]


def test_built_checkpoints_have_the_names_and_shapes_the_loaders_expect(check: dict[str, Any]
                                                                        ) -> None:
    models: Path = check["models"]
    for kind in ("target", "draft_model"):
        directory = models / kind
        assert _header(directory) == _hf_shapes(directory), kind
    target = json.loads((models / "target" / "config.json").read_text())
    assert (target["hidden_size"], target["num_attention_heads"], target["num_key_value_heads"],
            target["intermediate_size"], target["vocab_size"], target["num_hidden_layers"]) == (
        4096, 32, 8, 14336, 128256, 1)
    # the EAGLE-3 head: the tiny head's tensors (which vLLM loads in the engine tests), with
    # the real widths, a 32,000-token draft head and its draft-to-target map
    eagle = _header(models / "eagle3")
    tiny_names = set(_header(tiny.build("eagle3", models.parent / "tiny")))
    assert set(eagle) == tiny_names | {"d2t"}
    assert eagle["lm_head.weight"] == (realshape.EAGLE3_DRAFT_VOCAB, 4096)
    assert eagle["fc.weight"] == (4096, 3 * 4096) and eagle["d2t"] == (32000,)
    cfg = json.loads((models / "eagle3" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == 32000 and cfg["eagle_aux_hidden_state_layer_ids"] == [0]
    assert safetensors_params(models / "eagle3") == sum(math.prod(s) for s in eagle.values())


def test_the_tokenizer_covers_every_id_the_model_can_sample(check: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(check["models"] / "target")
    assert len(tok) == realshape.VOCAB
    text = "def speculative(n: int) -> int:\n    return n + 1\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([realshape.VOCAB - 1]) == realshape.RESERVED.format(realshape.VOCAB - 1)


def test_a_finished_build_is_reused_and_depth_is_checked(check: dict[str, Any]) -> None:
    models: Path = check["models"]
    stamps = {p: p.stat().st_mtime_ns for p in (models / "target-L1").iterdir()}
    assert realshape.build("target", models, layers=1) == models / "target-L1"
    assert {p: p.stat().st_mtime_ns for p in (models / "target-L1").iterdir()} == stamps
    with pytest.raises(ValueError, match="layers must be >= 1"):
        realshape.build("target", models, layers=0)
    with pytest.raises(ValueError, match="unknown kind"):
        realshape.build("medusa", models)
