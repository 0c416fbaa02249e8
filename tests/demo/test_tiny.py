"""The tiny offline model builders (the launcher's tests: tests/engine/test_launcher.py).

The engine serving these models is exercised by tests/engine/test_runner.py and
tests/engine/test_memory_engine.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specflow.demo import seed_models, tiny


@pytest.fixture(scope="module")
def models(tiny_models: Path) -> dict[str, Path]:
    """All kinds, from the session's build (built again here: a cached build returns them)."""
    return tiny.build_all(tiny_models)


def _tree_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# ------------------------------------------------------------------------- builders


def test_build_is_deterministic_and_cached(models: dict[str, Path], tmp_path: Path) -> None:
    assert tuple(models) == tiny.KINDS
    for kind, path in models.items():
        assert path.name == f"{kind}-{tiny.spec_hash(kind)}"
        assert {"config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json"} <= {p.name for p in path.iterdir()}

    stamps = {p: p.stat().st_mtime_ns for d in models.values() for p in d.iterdir()}
    again = tiny.build_all(models["target"].parent)
    assert again == models
    assert {p: p.stat().st_mtime_ns for d in again.values() for p in d.iterdir()} == stamps, \
        "a cached build must not rewrite anything"

    other = tiny.build("draft_copy", tmp_path / "elsewhere")
    assert other.name == models["draft_copy"].name
    assert _tree_bytes(other) == _tree_bytes(models["draft_copy"])


def test_hashes_differ_per_kind_and_unknown_kind_fails(tmp_path: Path) -> None:
    assert len({tiny.spec_hash(k) for k in tiny.KINDS}) == len(tiny.KINDS)
    with pytest.raises(ValueError, match="unknown tiny model kind"):
        tiny.build("nope", tmp_path)


def test_failed_build_leaves_nothing_that_looks_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_write(kind: str, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "_write_kind", half_write)
    with pytest.raises(KeyboardInterrupt):
        tiny.build("target", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_copy_and_derived_relate_to_target(models: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    target = load_file(str(models["target"] / "model.safetensors"))
    copy = load_file(str(models["draft_copy"] / "model.safetensors"))
    derived = load_file(str(models["draft_derived"] / "model.safetensors"))
    assert target.keys() == copy.keys() == derived.keys()
    assert all((target[k] == copy[k]).all() for k in target)
    changed = [k for k in target if not (target[k] == derived[k]).all()]
    assert changed and all(target[k].dim() == 2 for k in changed)
    assert (target["lm_head.weight"][2] == 0).all(), "EOS row of the head must be zero"

    eagle = json.loads((models["eagle3"] / "config.json").read_text())
    assert eagle["architectures"] == ["LlamaForCausalLMEagle3"]
    layers = json.loads((models["target"] / "config.json").read_text())["num_hidden_layers"]
    assert all(0 < i < layers for i in eagle["eagle_aux_hidden_state_layer_ids"])


@pytest.mark.parametrize("kind", ["mimo_mtp1", "gemma4", "qwen3"])
def test_agreeing_targets_walk_their_orbits(models: dict[str, Path], kind: str) -> None:
    """Greedy decoding in transformers: each next token is f(current), for any prompt."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    geo = seed_models._geometry(128, 2048)
    cls = Qwen2ForCausalLM if kind.startswith("mimo") else AutoModelForCausalLM  # MTP layers unused
    model = cls.from_pretrained(str(models[kind]), dtype=torch.float32).eval()
    prompt = torch.tensor([[700, 5, 1999, 42, 1234]])
    out = model.generate(prompt, max_new_tokens=12, do_sample=False)[0].tolist()
    assert out[5:] == [int(geo.next_token[t]) for t in out[4:-1]]
    assert len(set(out[5:])) == 12, "the walk does not stall"


def test_seed_builds_pair_up(models: dict[str, Path]) -> None:
    """Drafters read the geometry of their target; random builds share the agreeing shapes."""
    from safetensors.torch import load_file

    def weights(kind: str) -> dict:
        return load_file(str(models[kind] / "model.safetensors"))

    def config(kind: str) -> dict:
        return json.loads((models[kind] / "config.json").read_text())

    for kind in tiny.SEED_KINDS:
        if kind.endswith("_random"):
            agreeing, rand = weights(kind.removesuffix("_random")), weights(kind)
            shapes = {k: v.shape for k, v in agreeing.items()}
            assert shapes == {k: v.shape for k, v in rand.items()}
            assert config(kind) == config(kind.removesuffix("_random"))
    mtp1, mtp2 = weights("mimo_mtp1"), weights("mimo_mtp2")
    assert all((mtp2[k] == v).all() for k, v in mtp1.items()), "one body, one more MTP layer"
    assert {k for k in mtp2 if k not in mtp1} == {k.replace("mtp_layers.0", "mtp_layers.1")
                                                  for k in mtp1 if "mtp_layers.0" in k}
    assert config("mimo_mtp2")["num_nextn_predict_layers"] == 2
    assert config("mimo_mtp2")["architectures"] == ["MiMoForCausalLM"]

    gemma, assistant = weights("gemma4"), weights("gemma4_assistant")
    assert (assistant["model.embed_tokens.weight"] == gemma["lm_head.weight"]).all()
    acfg = config("gemma4_assistant")
    assert acfg["model_type"] == "gemma4_assistant" and acfg["backbone_hidden_size"] == 128
    text = acfg["text_config"]
    assert text["num_kv_shared_layers"] == text["num_hidden_layers"]
    assert not any("k_proj" in k or "v_proj" in k for k in assistant), "Q-only layers"

    dflash, dcfg = weights("qwen3_dflash"), config("qwen3_dflash")
    assert dcfg["architectures"] == ["DFlashDraftModel"]
    assert not any(k.startswith(("model.", "lm_head", "embed_tokens")) for k in dflash)
    assert (dflash["fc.weight"] == 0).all() and dflash["fc.weight"].shape == (128, 256)
    target_layers = config("qwen3")["num_hidden_layers"]
    assert all(i <= target_layers - 2 for i in dcfg["dflash_config"]["target_layer_ids"])


def test_tokenizer_loads_offline(models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models["target"]))
    assert len(tok) == tiny.TOKENIZER.vocab_size
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "def main(argv: list[str]) -> int:\n    return 0  # déjà vu\n"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>\n")


def test_cli_prints_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tiny.main(["--root", str(tmp_path)]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert set(paths) == set(tiny.KINDS)
    assert all(Path(p).is_dir() for p in paths.values())
