"""The target's tokenizer, optional: it renders chat templates and counts tokens.

Without one, lengths are estimated from characters (`CHARS_PER_TOKEN`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specflow.spec.errors import Problem, SpecError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

CHARS_PER_TOKEN = 3.5
"""Characters per token assumed when no tokenizer is given (sizes code-completion context)."""
REPETITION_N = 3
"""n of the token n-grams `ngram_repetition` counts (a typical prompt_lookup_min)."""


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str) -> Tokenizer:
    """Load a tokenizer from a local directory or the local HF cache (never downloads).

    The class AutoTokenizer would pick is loaded directly when the directory's
    `tokenizer_config.json` names it (`named_class`): AutoTokenizer's own import pulls in
    torch (~5 s per process), which counting and rendering prompts never uses."""
    try:
        import transformers
    except ImportError:
        raise SpecError([Problem(
            "target.tokenizer", "transformers is not installed, so the tokenizer cannot be "
            "loaded", name, "transformers in this environment (pip install 'transformers>=4.50')"
        )]) from None
    try:
        cls = named_class(name)
        if cls is not None:
            return cls.from_pretrained(name, local_files_only=True)  # type: ignore[no-any-return]
        return transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError([Problem(
            "target.tokenizer", f"cannot load the tokenizer offline ({first[:160]})", name,
            "a local tokenizer directory or one in the local Hugging Face cache",
        )]) from None


def named_class(name: str) -> Any | None:
    """The tokenizer class a local directory's `tokenizer_config.json` names, as transformers
    exports it (its fast variant when there is one, as AutoTokenizer prefers); None when the
    name is not a local directory, names no class, asks for remote code (`auto_map`) or names
    a class transformers does not export: AutoTokenizer decides then."""
    path = Path(name) / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    wanted = config.get("tokenizer_class") if isinstance(config, dict) else None
    if not isinstance(wanted, str) or not wanted.isidentifier() or "auto_map" in config:
        return None
    import transformers

    for candidate in ((wanted,) if wanted.endswith("Fast") else (f"{wanted}Fast", wanted)):
        try:
            cls = getattr(transformers, candidate)
        except (AttributeError, ImportError, RuntimeError):
            continue
        if isinstance(cls, type):
            return cls
    return None


def token_ids(tok: Tokenizer, text: str) -> list[int]:
    """Token ids as `vllm bench serve` counts them (`tokenizer(prompt).input_ids`)."""
    return list(tok(text).input_ids)


def token_length(tok: Tokenizer | None, text: str) -> int:
    """Token count of `text` (estimated from its characters without a tokenizer)."""
    if tok is None:
        return max(1, round(len(text) / CHARS_PER_TOKEN))
    return len(tok(text, add_special_tokens=False).input_ids)


def ngram_repetition(tokens: Sequence[Hashable], n: int = REPETITION_N) -> float:
    """Fraction of the n-grams of `tokens` that already occurred earlier in `tokens`.

    A proxy for what prompt-lookup (ngram) drafting can match: code, schemas and tool calls
    repeat their own context far more than conversation does.
    """
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[Hashable, ...]] = set()
    repeated = 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / len(grams)
