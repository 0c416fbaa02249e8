"""The offline generators: what they generate, deterministically and distinctly."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specflow.workloads import examples, materialize, ngram_repetition
from specflow.workloads.generators import GENERATORS
from specflow.workloads.generators.tool_calling import tools

from .helpers import generated, spec_of


def test_tool_calls_match_the_offered_schemas() -> None:
    shots, chosen = examples("t", generated("tool_calling", num_prompts=200))
    by_name = {t.name: t for t in tools()}
    used = set()
    for ex in chosen:
        call = json.loads(ex.answer or "")
        tool = by_name[call["name"]]
        used.add(tool.name)
        assert f'"name": "{tool.name}"' in ex.prompt, "the needed function is offered"
        props = tool.schema()["function"]["parameters"]["properties"]
        assert set(tool.required) <= set(call["arguments"]) <= set(props)
    assert used == set(by_name), "every tool gets requests"


def test_every_tool_template_mentions_its_required_slots() -> None:
    for tool in tools():
        slots = {p: slot for p, _, slot in tool.params}
        for template in tool.requests:
            for p in tool.required:
                assert f"{{{slots[p]}" in template, (tool.name, p, template)


def test_structured_answers_validate_against_their_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    _, chosen = examples("s", generated("structured_json", num_prompts=120))
    kinds = set()
    for ex in chosen:
        schema = json.loads(ex.prompt.split("Schema:\n", 1)[1].split("\n\nText:\n", 1)[0])
        jsonschema.validate(json.loads(ex.answer or ""), schema)
        kinds.add(tuple(schema["required"]))
    assert len(kinds) == 6, "all record kinds appear"


def test_code_completion_is_cut_from_stdlib_sources() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    spec = generated("code_completion", input_len=200)
    _, chosen = examples("c", spec)
    files = set()
    for ex in chosen:
        header, _, context = ex.prompt.partition("\n")
        rel = header.removeprefix("# ")
        source = (stdlib / rel).read_text(encoding="utf-8")
        assert context + (ex.answer or "") in source
        assert "def " in context and ex.answer and ex.answer.strip()
        files.add(rel)
    assert len(files) > len(chosen) // 2, "spread over many files"


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), generator=st.sampled_from(
    ["tool_calling", "structured_json", "chat", "random"]))
def test_generators_are_deterministic_and_distinct(seed: int, generator: str) -> None:
    spec = generated(generator, seed=seed, num_prompts=40)
    a = [ex.prompt for ex in examples("g", spec)[1]]
    b = [ex.prompt for ex in examples("g", spec)[1]]
    assert a == b and len(set(a)) == 40
    assert a != [ex.prompt for ex in examples("g", spec.model_copy(update={"seed": seed + 1}))[1]]


def test_generators_registry_matches_schema() -> None:
    from typing import get_args

    from specflow.spec.schema import Generator

    assert set(GENERATORS) == set(get_args(Generator))


def test_code_tools_and_schemas_repeat_their_context_more_than_chat(tokenizer: str,
                                                                    tmp_path: Path) -> None:
    rep = {name: materialize(name, spec_of(name), tmp_path, tokenizer).repetition
           for name in ("chat", "code_completion", "tool_calling", "structured_json")}
    for name in ("code_completion", "tool_calling", "structured_json"):
        assert rep[name] > rep["chat"] + 0.05, rep


def test_ngram_repetition() -> None:
    assert ngram_repetition([1, 2, 3, 1, 2, 3]) == 0.25  # (1,2,3) seen again once in 4
    assert ngram_repetition([1, 2]) == 0.0
    assert ngram_repetition("abcabcabc", n=3) == 4 / 7


