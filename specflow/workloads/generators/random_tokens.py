"""Random tokens: a lower bound for drafting, not traffic (a realism warning says so)."""

from __future__ import annotations

import random
import string
from typing import TYPE_CHECKING

from specflow.spec.schema import WorkloadSpec
from specflow.workloads.model import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer


def generate(rng: random.Random, spec: WorkloadSpec, tok: Tokenizer | None) -> Example:
    """`input_len` random tokens (random letters-words without a tokenizer)."""
    if tok is not None:
        special = set(getattr(tok, "all_special_ids", []) or [])
        ids = [i for i in (rng.randrange(len(tok)) for _ in range(spec.input_len * 2))
               if i not in special][: spec.input_len]
        text = tok.decode(ids)
        assert isinstance(text, str)  # one sequence decodes to one string
        return Example(text)
    words = ("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
             for _ in range(spec.input_len))
    return Example(" ".join(words))
