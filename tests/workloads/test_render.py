"""Prompt formatting: system prompt, few-shot examples, history, the chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

from specflow.spec.errors import SpecError
from specflow.workloads import examples, materialize

from .helpers import generated, prompt_rows, spec_of


def test_chat_template_renders_system_few_shot_and_history(tokenizer: str,
                                                           tmp_path: Path) -> None:
    spec = spec_of("chat", "workload.chat.few_shot=2", "workload.chat.num_prompts=40")
    m = materialize("chat", spec, tmp_path, tokenizer)
    prompts = [r["prompt"] for r in prompt_rows(m.path)]
    for p in prompts:
        assert p.startswith("<|system|>\nYou are a helpful assistant.\n<|user|>\n")
        assert p.endswith("<|assistant|>\n")
        assert p.count("<|assistant|>") >= 3  # two worked examples + the generation prompt
    shots, chosen = examples("chat", spec)
    assert len(shots) == 2 and all(s.answer for s in shots)
    multi = [ex for ex in chosen if ex.history]
    assert multi and any(len(ex.history) >= 4 for ex in chosen), "multi-turn transcripts"
    assert len(multi) < len(chosen), "single-turn requests too"


def test_plain_formatting_without_template(tmp_path: Path) -> None:
    spec = generated("chat", system_prompt="Be brief.", few_shot=1)
    shots, chosen = examples("w", spec)
    m = materialize("w", spec, tmp_path)
    prompts = [r["prompt"] for r in prompt_rows(m.path)]
    assert all(p.startswith(f"Be brief.\n\n{shots[0].prompt}\n{shots[0].answer}\n\n")
               for p in prompts)
    assert all(p.endswith(ex.prompt if not ex.history else "Assistant:")
               for p, ex in zip(prompts, chosen, strict=True))
    assert m.mean_prompt_tokens is None and m.repetition is None  # nothing to count with


def test_chat_template_needs_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("chat", spec_of("chat"), tmp_path)
    assert info.value.problems[0].path == "workload.chat.chat_template"
    assert not list(tmp_path.iterdir()), "nothing half-written"


def test_unloadable_tokenizer_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("chat", spec_of("chat"), tmp_path, str(tmp_path / "no-such-tokenizer"))
    assert info.value.problems[0].path == "target.tokenizer"


def test_the_tokenizer_is_the_class_autotokenizer_picks(tokenizer: str, tmp_path: Path) -> None:
    """`load_tokenizer` loads the class a directory's tokenizer_config.json names (AutoTokenizer
    imports torch to decide it): the same class as AutoTokenizer's, the same ids and the same
    rendered chat; for a config that names no class, asks for remote code or names a class
    transformers does not export, and for a name that is no local directory, `named_class`
    answers None and AutoTokenizer decides."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from specflow.workloads import tokens

    named = tmp_path / "named"
    shutil.copytree(tokenizer, named)
    config = json.loads((named / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    text = "def f(x):\n    return x + 1  # ünïcode, tabs\tand  spaces"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    mine = tokens.load_tokenizer(str(named))
    auto = AutoTokenizer.from_pretrained(str(named), local_files_only=True)
    assert tokens.named_class(str(named)) is type(mine) is type(auto)
    assert tokens.token_ids(mine, text) == tokens.token_ids(auto, text)
    assert mine.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    for change in ({"tokenizer_class": None}, {"auto_map": {"AutoTokenizer": ["x.Y", None]}},
                   {"tokenizer_class": "NoSuchTokenizer"}):
        (named / "tokenizer_config.json").write_text(json.dumps(config | change))
        assert tokens.named_class(str(named)) is None, change
    assert tokens.named_class(str(tmp_path / "absent")) is None
