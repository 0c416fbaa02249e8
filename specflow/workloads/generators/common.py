"""What the generators share: their data files, the common vocabulary, dates, times, people."""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from specflow.spec.schema import WorkloadSpec
from specflow.workloads.model import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

Generate = Callable[[random.Random, WorkloadSpec, "Tokenizer | None"], Example]
"""A generator: one example from the random stream (the tokenizer, if any, sizes lengths)."""


@functools.cache
def read_data(name: str) -> dict[str, Any]:
    """A JSON file of specflow/workloads/data/, with its arrays as tuples (the tables are
    shared, so nobody may change them)."""
    path = files("specflow.workloads") / "data" / name
    frozen = _frozen(json.loads(path.read_text(encoding="utf-8")))
    assert isinstance(frozen, dict), name
    return frozen


def _frozen(value: object) -> object:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Vocabulary:
    """Word pools several generators draw from (data/vocabulary.json)."""

    months: tuple[str, ...]
    cities: tuple[tuple[str, str, str], ...]
    """(city, country, airport code)."""
    first_names: tuple[str, ...]
    last_names: tuple[str, ...]
    companies: tuple[tuple[str, str], ...]
    """(name, email domain)."""
    products: tuple[tuple[str, str, float], ...]
    """(name, category, typical price)."""
    brands: tuple[str, ...]
    currencies: tuple[str, ...]
    currency_names: dict[str, str]
    languages: tuple[str, ...]
    stocks: tuple[tuple[str, str], ...]
    """(company, ticker symbol)."""
    restaurants: tuple[str, ...]
    meetings: tuple[str, ...]
    subjects: tuple[tuple[str, str], ...]
    """(email subject, body)."""
    issues: tuple[str, ...]
    chores: tuple[str, ...]
    places: tuple[str, ...]
    phrases: tuple[str, ...]
    rooms: tuple[str, ...]


@functools.cache
def vocabulary() -> Vocabulary:
    """The shared word pools, loaded once."""
    return Vocabulary(**read_data("vocabulary.json"))


def date(rng: random.Random) -> dt.date:
    """A day in 2025 or the first half of 2026."""
    return dt.date(2025, 1, 1) + dt.timedelta(days=rng.randint(0, 540))


def say_date(d: dt.date) -> str:
    """`Friday, March 7`."""
    return f"{d.strftime('%A')}, {vocabulary().months[d.month - 1]} {d.day}"


def time_of_day(rng: random.Random) -> tuple[str, str]:
    """(spoken, HH:MM) for a time between 07:00 and 21:45."""
    hour, minute = rng.randint(7, 21), rng.choice((0, 15, 30, 45))
    spoken = f"{(hour - 1) % 12 + 1}:{minute:02d} {'am' if hour < 12 else 'pm'}"
    return spoken, f"{hour:02d}:{minute:02d}"


def person(rng: random.Random) -> tuple[str, str, str]:
    """(full name, email, company)."""
    v = vocabulary()
    first, last = rng.choice(v.first_names), rng.choice(v.last_names)
    company, domain = rng.choice(v.companies)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@{domain}", company
