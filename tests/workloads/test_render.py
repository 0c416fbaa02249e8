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

