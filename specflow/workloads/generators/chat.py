"""Multi-turn chat: 0-3 earlier exchanges on one of eight topics, ending with a user turn.

Topics (openers, follow-ups, reply sentences) and the words of their `{slot}`s are data
(data/chat.json).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specflow.spec.schema import WorkloadSpec
from specflow.workloads.generators.common import read_data, vocabulary
from specflow.workloads.model import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer


def _slots(rng: random.Random) -> dict[str, str]:
    words = read_data("chat.json")["slot_words"]
    v = vocabulary()
    city = rng.choice(v.cities)[0]
    lang, lang2 = rng.sample(words["programming_languages"], 2)
    return {
        "city": city, "month": rng.choice(v.months), "days": str(rng.randint(2, 10)),
        "amount": f"{rng.choice((800, 1500, 2500, 4000, 6000)):,}",
        "currency": rng.choice(words["currencies"]), "n": str(rng.randint(2, 8)),
        "veg": rng.choice(words["vegetables"]), "dish": rng.choice(words["dishes"]),
        "day": rng.choice(words["days"]), "lang": lang, "lang2": lang2,
        "company": rng.choice(v.companies)[0], "language": rng.choice(v.languages),
    }


def _reply(rng: random.Random, pool: list[str], topic: Sequence[str],
           slots: dict[str, str]) -> str:
    """One to three sentences drawn without replacement from `pool` (refilled from `topic`)."""
    data = read_data("chat.json")
    picked = []
    for _ in range(rng.randint(1, 3)):
        if not pool:
            pool.extend(topic)
        picked.append(pool.pop(rng.randrange(len(pool))))
    body = " ".join(s.format_map(slots) for s in picked)
    return f"{rng.choice(data['openers'])}{body}{rng.choice(data['closers'])}"


def generate(rng: random.Random, spec: WorkloadSpec, tok: Tokenizer | None) -> Example:
    """A conversation of 0-3 earlier exchanges on one topic, ending with a user turn."""
    topics: dict[str, dict[str, tuple[str, ...]]] = read_data("chat.json")["topics"]
    topic = topics[rng.choice(sorted(topics))]
    slots = _slots(rng)
    replies = list(topic["reply"])
    follows = list(topic["follow"])
    rng.shuffle(follows)
    user = rng.choice(topic["open"]).format_map(slots)
    history: list[tuple[str, str]] = []
    for _ in range(rng.randint(0, 3)):
        history += [("user", user), ("assistant", _reply(rng, replies, topic["reply"], slots))]
        user = follows.pop().format_map(slots)
    return Example(user, _reply(rng, replies, topic["reply"], slots), tuple(history))
