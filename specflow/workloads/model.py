"""The records of the workloads package: one example of a source, one materialised workload, and
the exception a loader raises for one problem."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specflow.spec.errors import Problem
from specflow.spec.traces import Request


@dataclass(frozen=True)
class Example:
    """One prompt of a source, with its reference answer and any earlier chat turns."""

    prompt: str
    """The (last) user turn, or the raw text for completion-style prompts."""
    answer: str | None = None
    """A reference answer (used when this example serves as a few-shot example)."""
    history: tuple[tuple[str, str], ...] = ()
    """Earlier (role, content) turns of a conversation, oldest first."""
    request: Request | None = None
    """The logged request it replays (a trace source): its turns, tools and output length."""

    @property
    def key(self) -> str:
        """What makes two examples the same prompt."""
        return self.request.key if self.request is not None else self.prompt


@dataclass(frozen=True)
class MaterializedWorkload:
    """A workload written to disk: what `vllm bench serve` replays and what it holds."""

    name: str
    """Workload name (conf/workload entry)."""
    traffic_class: str
    """Traffic class decisions are made for."""
    path: Path
    """The custom-dataset JSONL file (`{"prompt": ..., "output_tokens": ...}` per line)."""
    num_prompts: int
    """Prompts in the file."""
    prompt_hash: str
    """sha256 of the exact prompts, in file order (JSON list of strings, UTF-8)."""
    max_tokens: int
    """Maximum output tokens per request."""
    temperature: float
    """Sampling temperature of the sweep."""
    stop: tuple[str, ...]
    """Stop strings sent with every request."""
    chat_template: bool
    """Whether the prompts were rendered with the tokenizer's chat template."""
    ignore_eos: bool
    """Whether requests ignore EOS."""
    warnings: tuple[str, ...]
    """Realism warnings (each starts with the workload's dotted path)."""
    output_lengths: tuple[int, ...] = ()
    """Output tokens requested per prompt, in file order, where they differ between requests (a
    trace, a service; the dataset's `output_tokens`); empty: every request asks for
    `max_tokens`. Read by people and tests."""
    recorded_output: tuple[int | None, ...] = ()
    """A trace's recorded output length per prompt (None where the log has none)."""
    classes: tuple[str, ...] = ()
    """A service's class of each prompt, in file order; empty for a single class."""
    private: bool = False
    """Production text (a trace): no prompt or generated text leaves the work directory."""
    mean_prompt_tokens: float | None = None
    """Mean prompt length in tokens as the bench counts them; null without a tokenizer."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens (must fit max_model_len with max_tokens); null without one."""
    repetition: float | None = None
    """Mean `ngram_repetition` of the prompts' tokens (what prompt lookup can match); null
    without a tokenizer."""


class Fail(Exception):
    """One problem found while loading (gathered into a SpecError by the caller)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.render())
        self.problem = problem
