"""Materialising: a workload's prompts written as the JSONL `vllm bench serve` replays, the
sha256 that names them, token statistics and the realism warnings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specflow.records.fsio import atomic_write
from specflow.spec.errors import Problem, SpecError
from specflow.spec.schema import GeneratedSource, WorkloadSpec
from specflow.workloads.model import MaterializedWorkload
from specflow.workloads.rendering import render
from specflow.workloads.sources import examples
from specflow.workloads.tokens import load_tokenizer, ngram_repetition, token_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

MIN_PROMPTS = 32
"""Fewer prompts than this are warned about. Acceptance varies a lot from prompt to prompt
(per-prompt acceptance rates spread over roughly +-0.2); with 32 prompts the standard error of
the mean is about 0.035, i.e. a 95% interval of about +-7%, the size of the default promotion
margin (5%). Below that, prompt sampling noise alone can decide a promotion."""
PROMPTS_PER_CONCURRENCY = 4
"""A measured window should hold at least this many prompts per in-flight slot; otherwise ramp-up
and drain (fewer requests in flight than the concurrency level) dominate the window."""
INPUT_LEN_TOLERANCE = 2.0
"""Mean prompt length more than this factor away from `input_len` is warned about (headroom is
sized with `input_len`)."""


def realism_warnings(name: str, spec: WorkloadSpec, concurrency: Sequence[int] = ()) -> list[str]:
    """What makes this workload unlike production traffic (none is an error)."""
    w = f"workload.{name}"
    out = []
    if isinstance(spec.source, GeneratedSource) and spec.source.generator == "random":
        out.append(f"{w}.source.generator: random-token prompts; got 'random'; acceptance on "
                   "random tokens says nothing about real traffic (no repetition for ngram "
                   "lookup, nothing a drafter was trained on); use a task-grounded source")
    if spec.ignore_eos:
        out.append(f"{w}.ignore_eos: requests run past EOS to max_tokens; got true; real "
                   "requests stop at EOS, and text generated past it is degenerate, which "
                   "skews acceptance and output lengths")
    if spec.production_temperature is not None and spec.temperature != spec.production_temperature:
        out.append(f"{w}.temperature: the sweep samples at {spec.temperature} but production "
                   f"uses {spec.production_temperature}; got {spec.temperature}; acceptance "
                   "changes with temperature (usually lower when sampling), so the measured "
                   "speedup may not transfer")
    if spec.num_prompts < MIN_PROMPTS:
        out.append(f"{w}.num_prompts: too few prompts for a stable estimate; got "
                   f"{spec.num_prompts}; expected at least {MIN_PROMPTS} (acceptance varies per "
                   "prompt; fewer leave a confidence interval wider than the promotion margin)")
    top = max(concurrency, default=0)
    if top and spec.num_prompts < PROMPTS_PER_CONCURRENCY * top:
        out.append(f"{w}.num_prompts: fewer than {PROMPTS_PER_CONCURRENCY} prompts per "
                   f"in-flight request at concurrency {top}; got {spec.num_prompts}; expected "
                   f"at least {PROMPTS_PER_CONCURRENCY * top} (ramp-up and drain would dominate "
                   "the window)")
    return out


def _prompt_hash(prompts: Sequence[str]) -> str:
    """sha256 of the prompts in order (JSON list of strings, UTF-8)."""
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")
                          ).hexdigest()


def _dataset_text(prompts: Sequence[str], max_tokens: int) -> str:
    """The custom-dataset JSONL: one `{"prompt": ..., "output_tokens": ...}` per line."""
    return "".join(json.dumps({"prompt": p, "output_tokens": max_tokens}, ensure_ascii=False)
                   + "\n" for p in prompts)


def _token_stats(tok: Tokenizer, prompts: Sequence[str]) -> tuple[float, int, float]:
    """(mean prompt tokens, longest prompt, mean n-gram repetition) as the bench counts."""
    ids = [token_ids(tok, p) for p in prompts]
    lengths = [len(i) for i in ids]
    repetition = sum(ngram_repetition(i) for i in ids) / len(ids)
    return sum(lengths) / len(lengths), max(lengths), repetition


def _input_len_warning(name: str, spec: WorkloadSpec, mean_tokens: float) -> list[str]:
    """A warning when the prompts are far from `input_len` (headroom is sized with it)."""
    ratio = mean_tokens / spec.input_len
    if 1 / INPUT_LEN_TOLERANCE <= ratio <= INPUT_LEN_TOLERANCE:
        return []
    return [f"workload.{name}.input_len: prompts average {mean_tokens:.0f} tokens; got "
            f"{spec.input_len}; expected about {mean_tokens:.0f} (headroom sizes the context "
            "with input_len)"]


def materialize(name: str, spec: WorkloadSpec, out_dir: Path, tokenizer: str | None = None,
                concurrency: Sequence[int] = ()) -> MaterializedWorkload:
    """Write the workload's prompts as a `vllm bench serve` custom dataset and describe it.

    `tokenizer` (the target's tokenizer directory or cached id) renders the chat template and
    counts tokens; `concurrency` (the sweep's levels) only feeds the warnings. The file is named
    by the content hash and written atomically, so re-materialising is idempotent.
    """
    tok = load_tokenizer(str(tokenizer)) if tokenizer is not None else None
    shots, chosen = examples(name, spec, tok)
    prompts = [render(name, spec, shots, ex, tok) for ex in chosen]
    digest = _prompt_hash(prompts)
    path = Path(out_dir) / f"{name}-{digest[:12]}.jsonl"
    if not path.is_file():
        atomic_write(path, _dataset_text(prompts, spec.max_tokens))
    warnings = realism_warnings(name, spec, concurrency)
    mean_tokens: float | None = None
    longest: int | None = None
    repetition: float | None = None
    if tok is not None:
        mean_tokens, longest, repetition = _token_stats(tok, prompts)
        warnings += _input_len_warning(name, spec, mean_tokens)
    return MaterializedWorkload(
        name=name, traffic_class=spec.traffic_class, path=path, num_prompts=len(prompts),
        prompt_hash=digest, max_tokens=spec.max_tokens, temperature=spec.temperature,
        stop=tuple(spec.stop), chat_template=spec.chat_template, ignore_eos=spec.ignore_eos,
        warnings=tuple(warnings), mean_prompt_tokens=mean_tokens, max_prompt_tokens=longest,
        repetition=repetition,
    )


def materialize_all(workloads: Mapping[str, WorkloadSpec], out_dir: Path,
                    tokenizer: str | None = None, concurrency: Sequence[int] = ()
                    ) -> dict[str, MaterializedWorkload]:
    """Materialise every workload; one `SpecError` lists the problems of all of them."""
    done: dict[str, MaterializedWorkload] = {}
    problems: list[Problem] = []
    for name, spec in workloads.items():
        try:
            done[name] = materialize(name, spec, out_dir, tokenizer, concurrency)
        except SpecError as err:
            problems += err.problems
    if problems:
        raise SpecError(problems)
    return done
