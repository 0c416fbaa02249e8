"""Sources: Hugging Face data read from a real cache-shaped directory and never fetched, a
local directory, the datasets arrow cache, JSONL files; their problems name the field."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from specflow.spec.errors import SpecError
from specflow.spec.schema import WorkloadSpec
from specflow.workloads import examples, materialize
from specflow.workloads.hfdata import split_of

from .helpers import prompt_rows, spec_of


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
    assert split_of(Path(rel)) == split


def test_uncached_hub_dataset_is_a_clear_error(hf_home: Path, tokenizer: str,
                                               tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        materialize("gsm8k", spec_of("gsm8k"), tmp_path / "out", tokenizer)
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
    spec = spec_of("gsm8k")
    m = materialize("gsm8k", spec, tmp_path, tokenizer)
    prompts = [r["prompt"] for r in prompt_rows(m.path)]
    assert m.num_prompts == len(prompts) == spec.num_prompts == 64
    questions = {r["question"] for r in test_rows}
    for p in prompts:
        assert p.startswith(f"<|system|>\n{spec.system_prompt}\n<|user|>\n")
        assert p.removeprefix(f"<|system|>\n{spec.system_prompt}\n<|user|>\n").removesuffix(
            "\n<|assistant|>\n") in questions
    again = materialize("gsm8k", spec_of("gsm8k", "workload.gsm8k.seed=5"), tmp_path, tokenizer)
    assert again.prompt_hash != m.prompt_hash
    shots, _ = examples("gsm8k", spec_of("gsm8k", "workload.gsm8k.few_shot=3"))
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
    spec = spec_of("mbpp", "workload.mbpp.chat_template=false", "workload.mbpp.system_prompt=null")
    m = materialize("mbpp", spec, tmp_path)
    assert {r["prompt"] for r in prompt_rows(m.path)} <= {r["prompt"] for r in rows}
    with pytest.raises(SpecError) as info:
        materialize("mbpp", spec_of("mbpp", "workload.mbpp.source.split=tset"), tmp_path)
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
    assert all(r["prompt"].count("Compute") == 3 for r in prompt_rows(m.path))

    arrow = hf_home / "datasets" / "HuggingFaceH4___math-500" / "default" / "0.0.0" / "abc123"
    arrow.mkdir(parents=True)
    table = pa.Table.from_pylist([{"problem": f"Find x if x + {i} = {2 * i}.",
                                   "solution": f"x = {i}"} for i in range(50)])
    with pa.OSFile(str(arrow / "math-500-test.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, table.schema) as writer:
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
        spec = spec_of("gsm8k", "workload.gsm8k.chat_template=false", *overrides)
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


