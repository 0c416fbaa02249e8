"""Materialising: a workload's prompts written as the JSONL `vllm bench serve` replays, the
sha256 that names them, token statistics and the realism warnings."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specflow.records.fsio import atomic_write
from specflow.spec.errors import Problem, SpecError
from specflow.spec.schema import GeneratedSource, MixSource, TraceSource, WorkloadSpec
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


def _prompt_hash(prompts: Sequence[str], lengths: Sequence[int] = ()) -> str:
    """sha256 of the prompts in order (JSON list of strings, UTF-8); with per-request output
    lengths, of the [prompt, length] pairs."""
    body: list[Any] = [[p, n] for p, n in zip(prompts, lengths, strict=True)] if lengths \
        else list(prompts)
    return hashlib.sha256(json.dumps(body, ensure_ascii=False).encode("utf-8")).hexdigest()


def _dataset_text(prompts: Sequence[str], lengths: Sequence[int]) -> str:
    """The custom-dataset JSONL: one `{"prompt": ..., "output_tokens": ...}` per line."""
    return "".join(json.dumps({"prompt": p, "output_tokens": n}, ensure_ascii=False)
                   + "\n" for p, n in zip(prompts, lengths, strict=True))


@dataclass(frozen=True)
class _Requests:
    """What a workload sends, before it is written."""

    prompts: list[str]
    lengths: list[int]
    recorded: list[int | None]
    classes: list[str]


def _requests(name: str, spec: WorkloadSpec, tok: Tokenizer | None,
              others: Mapping[str, WorkloadSpec]) -> _Requests:
    """The rendered prompts of a workload, their output lengths (a trace's own, capped at
    max_tokens) and, for a mix, each one's class, interleaved by the mix's seed."""
    if isinstance(spec.source, MixSource):
        return _mixed(name, spec, spec.source, tok, others)
    shots, chosen = examples(name, spec, tok)
    prompts = [render(name, spec, shots, ex, tok) for ex in chosen]
    lengths = [ex.request.output_len(spec.max_tokens) if ex.request else spec.max_tokens
               for ex in chosen]
    recorded = [ex.request.recorded_output if ex.request else None for ex in chosen]
    return _Requests(prompts, lengths, recorded, [spec.traffic_class or name] * len(prompts))


def _mixed(name: str, spec: WorkloadSpec, mix: MixSource, tok: Tokenizer | None,
           others: Mapping[str, WorkloadSpec]) -> _Requests:
    counts = shares_to_counts(mix.parts, spec.num_prompts)
    rows: list[tuple[str, int, int | None, str]] = []
    problems: list[Problem] = []
    for part, k in counts.items():
        pspec = others[part]
        try:
            got = _requests(part, pspec.model_copy(update={"num_prompts": k, "seed": spec.seed}),
                            tok, others)
        except SpecError as err:
            problems += [Problem(f"service.{spec.traffic_class}.num_prompts", f"{k} of its "
                                 f"{spec.num_prompts} requests come from {part}: {p.problem}",
                                 spec.num_prompts, f"a count whose share of {part} it holds "
                                 f"({p.expected})" if p.path.endswith(".num_prompts")
                                 else p.expected, source=p.path)
                         for p in err.problems]
            continue
        rows += zip(got.prompts, got.lengths, got.recorded, got.classes, strict=True)
    if problems:
        raise SpecError(problems)
    random.Random(f"specflow/service/{name}/{spec.seed}").shuffle(rows)
    return _Requests([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                     [r[3] for r in rows])


def shares_to_counts(shares: Mapping[str, float], total: int) -> dict[str, int]:
    """`total` requests shared out by `shares` (largest remainder; each part at least one)."""
    weight = sum(shares.values())
    exact = {k: max(1.0, total * v / weight) for k, v in shares.items()}
    counts = {k: int(v) for k, v in exact.items()}
    left = total - sum(counts.values())
    for k in sorted(exact, key=lambda k: counts[k] - exact[k])[:max(0, left)]:
        counts[k] += 1
    return counts


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
                concurrency: Sequence[int] = (), others: Mapping[str, WorkloadSpec] | None = None
                ) -> MaterializedWorkload:
    """Write the workload's prompts as a `vllm bench serve` custom dataset and describe it.

    `tokenizer` (the target's tokenizer directory or cached id) renders the chat template and
    counts tokens; `concurrency` (the sweep's levels) only feeds the warnings; `others` (every
    workload of the run) are the classes a mix (a service) draws from. The file is named
    by the content hash and written atomically, so re-materialising is idempotent.
    """
    tok = load_tokenizer(str(tokenizer)) if tokenizer is not None else None
    got = _requests(name, spec, tok, others or {})
    prompts = got.prompts
    varied = len(set(got.lengths)) > 1 or any(n is not None for n in got.recorded)
    digest = _prompt_hash(prompts, got.lengths if varied else ())
    path = Path(out_dir) / f"{name}-{digest[:12]}.jsonl"
    if not path.is_file():
        atomic_write(path, _dataset_text(prompts, got.lengths))
    warnings = realism_warnings(name, spec, concurrency)
    warnings += _trace_warnings(name, spec, got)
    mean_tokens: float | None = None
    longest: int | None = None
    repetition: float | None = None
    if tok is not None:
        mean_tokens, longest, repetition = _token_stats(tok, prompts)
        warnings += _input_len_warning(name, spec, mean_tokens)
    return MaterializedWorkload(
        name=name, traffic_class=spec.traffic_class, path=path, num_prompts=len(prompts),
        prompt_hash=digest, max_tokens=max(got.lengths), temperature=spec.temperature,
        stop=tuple(spec.stop), chat_template=spec.chat_template, ignore_eos=spec.ignore_eos,
        warnings=tuple(warnings), mean_prompt_tokens=mean_tokens, max_prompt_tokens=longest,
        repetition=repetition, output_lengths=tuple(got.lengths) if varied else (),
        recorded_output=tuple(got.recorded) if varied else (),
        classes=tuple(got.classes) if isinstance(spec.source, MixSource) else (),
        private=_private(spec, others or {}),
    )


def _private(spec: WorkloadSpec, others: Mapping[str, WorkloadSpec]) -> bool:
    """Whether the workload replays production text (a trace, or a mix with one in it)."""
    src = spec.source
    if isinstance(src, TraceSource):
        return not src.log_prompts
    if isinstance(src, MixSource):
        return any(_private(others[p], others) for p in src.parts if p in others)
    return False


def _trace_warnings(name: str, spec: WorkloadSpec, got: _Requests) -> list[str]:
    """A trace whose recorded answers the cap cuts short, or a mix class of a handful."""
    out = []
    recorded = [n for n in got.recorded if n is not None]
    cut = sum(n > spec.max_tokens for n in recorded)
    if recorded and cut / len(recorded) > 0.1:
        out.append(f"workload.{name}.max_tokens: {cut} of {len(recorded)} requests were answered "
                   f"with more tokens in the log (up to {max(recorded)}); got {spec.max_tokens}; "
                   f"expected at least {max(recorded)} (shorter answers than production's "
                   "change acceptance: longer answers repeat more)")
    if isinstance(spec.source, MixSource):
        per = {c: got.classes.count(c) for c in dict.fromkeys(got.classes)}
        few = {c: k for c, k in per.items() if k < 8}
        if few:
            out.append(f"service.{spec.traffic_class}.num_prompts: classes with a handful of "
                       f"requests per window ({few}); got {spec.num_prompts}; expected at least "
                       "8 requests of each class (more requests, or fewer classes)")
    return out


def materialize_all(workloads: Mapping[str, WorkloadSpec], out_dir: Path,
                    tokenizer: str | None = None, concurrency: Sequence[int] = ()
                    ) -> dict[str, MaterializedWorkload]:
    """Materialise every workload; one `SpecError` lists the problems of all of them."""
    done: dict[str, MaterializedWorkload] = {}
    problems: list[Problem] = []
    for name, spec in workloads.items():
        try:
            done[name] = materialize(name, spec, out_dir, tokenizer, concurrency, workloads)
        except SpecError as err:
            problems += err.problems
    if problems:
        raise SpecError(problems)
    return done
