"""Offline prompt generators, one module per traffic class, seeded by the workload's `seed`.

Each is a `Generate`: `(rng, spec, tokenizer or None) -> Example`. Their prompt data (word
pools, tool schemas, chat topics, record schemas) lives in specflow/workloads/data/*.json.
"""

from __future__ import annotations

from specflow.workloads.generators import (
    chat,
    code_completion,
    random_tokens,
    structured_json,
    tool_calling,
)
from specflow.workloads.generators.common import Generate

__all__ = ["GENERATORS", "Generate"]

GENERATORS: dict[str, Generate] = {
    "tool_calling": tool_calling.generate,
    "structured_json": structured_json.generate,
    "code_completion": code_completion.generate,
    "chat": chat.generate,
    "random": random_tokens.generate,
}
"""`source.generator` name -> generator (the names of `specflow.spec.schema.Generator`)."""
