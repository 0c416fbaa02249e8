"""Tool calling: a few function schemas and a request that needs exactly one of them.

The functions and their request templates are data (data/tools.json); each `{slot}` of a
template is filled from one draw of `tool_slots`, which also gives the argument value the
words imply, so every example carries the call that answers it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specflow.spec.schema import WorkloadSpec
from specflow.workloads.generators.common import (
    date,
    person,
    read_data,
    say_date,
    time_of_day,
    vocabulary,
)
from specflow.workloads.model import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

SlotValue = str | int | float | bool | list[str] | None
"""An argument value a request implies."""
Slots = dict[str, tuple[str, SlotValue]]
"""Slot -> (what the request says, the argument value it implies; None: words only)."""


@dataclass(frozen=True)
class Tool:
    """A function schema and requests that need it; `{slot}`s are filled per request."""

    name: str
    description: str
    params: tuple[tuple[str, dict[str, Any], str], ...]
    """(parameter name, JSON schema, slot the value comes from)."""
    required: tuple[str, ...]
    requests: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function definition offered in the prompt."""
        props = {name: dict(sch) for name, sch, _ in self.params}
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props,
                           "required": list(self.required)}}}


@functools.cache
def tools() -> tuple[Tool, ...]:
    """Every function a prompt may offer (data/tools.json)."""
    return tuple(
        Tool(t["name"], t["description"],
             tuple((p["name"], p["schema"], p["slot"]) for p in t["params"]),
             t["required"], t["requests"])
        for t in read_data("tools.json")["tools"])


def _when_where(rng: random.Random) -> Slots:
    """Two cities (and their airports), two dates in order and a time."""
    (c1, _, a1), (c2, _, a2) = rng.sample(vocabulary().cities, 2)
    d1 = date(rng)
    d2 = d1 + dt.timedelta(days=rng.randint(2, 16))
    t_said, t = time_of_day(rng)
    return {
        "city": (c1, c1), "origin": (c1, a1), "destination": (c2, a2),
        "date": (say_date(d1), d1.isoformat()), "date2": (say_date(d2), d2.isoformat()),
        "time": (t_said, t), "start": (f"{say_date(d1)} at {t_said}", f"{d1.isoformat()}T{t}"),
    }


def _who(rng: random.Random) -> Slots:
    """One recipient and one to three attendees."""
    email = person(rng)[1]
    emails = sorted({person(rng)[1] for _ in range(rng.randint(1, 3))})
    return {"emails": (" and ".join(emails), emails), "email": (email, email)}


def _what(rng: random.Random) -> Slots:
    """Stocks, money, products, messages and the small enums of the function schemas."""
    v = vocabulary()
    company, symbol = rng.choice(v.stocks)
    cur1, cur2 = rng.sample(v.currencies, 2)
    product, category, price = rng.choice(v.products)
    subject, body = rng.choice(v.subjects)
    unit = rng.choice(("celsius", "fahrenheit"))
    cabin = rng.choice(("economy", "premium_economy", "business"))
    days, n, minutes = rng.randint(2, 7), rng.randint(1, 6), rng.choice((15, 30, 45, 60, 90))
    amount = rng.choice((25, 80, 150, 420, 1000, 2350, 12000))
    ceiling = float(round(price * rng.uniform(0.8, 1.5), -1))
    tracking = rng.random() < 0.5
    sort = rng.choice(("price_asc", "rating"))
    return {
        "days": (str(days), days), "unit": (unit.capitalize(), unit), "n": (str(n), n),
        "cabin": (cabin.replace("_", " "), cabin), "minutes": (str(minutes), minutes),
        "subject": (subject, subject), "body": (body, body), "symbol": (symbol, symbol),
        "symbol_company": (company, None), "amount": (f"{amount:,}", amount),
        "currency": (cur1, cur1), "currency2": (cur2, cur2),
        "currency_name": (v.currency_names[cur1], None),
        "currency2_name": (v.currency_names[cur2], None),
        "tracking": ("Please include the tracking events." if tracking else
                     "I don't need the tracking history.", tracking),
        "product": (product, product), "category": (category, category),
        "price": (f"{ceiling:.0f}", ceiling),
        "sort": ("cheapest first" if sort == "price_asc" else "best rated first", sort),
    }


def _where_else(rng: random.Random) -> Slots:
    """Two places, an order number and one word from each remaining pool."""
    v = vocabulary()
    place, place2 = rng.sample(v.places, 2)
    order = f"{rng.choice(('US', 'EU', 'UK', 'JP'))}-{rng.randint(100000, 999999)}"
    picks = {
        "meeting": v.meetings, "room": v.rooms, "exchange": ("NASDAQ", "NYSE", "OTC"),
        "restaurant": v.restaurants, "severity": ("low", "medium", "high", "critical"),
        "issue": v.issues, "chore": v.chores, "mode": ("driving", "walking", "transit", "cycling"),
        "phrase": v.phrases, "language": v.languages,
    }
    slots: Slots = {k: (w, w) for k, w in ((k, rng.choice(pool)) for k, pool in picks.items())}
    slots.update({"place": (place, place), "place2": (place2, place2), "order": (order, order)})
    return slots


def tool_slots(rng: random.Random) -> Slots:
    """One value for every slot any request template may mention."""
    return {**_when_where(rng), **_who(rng), **_what(rng), **_where_else(rng)}


def tool_request(tool: Tool, template: str, slots: Slots
                 ) -> tuple[str, dict[str, SlotValue]]:
    """The request text and the call arguments it implies (one per slot it mentions)."""
    mentioned = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    text = template.format_map({k: v[0] for k, v in slots.items()})
    args: dict[str, SlotValue] = {}
    for pname, _, slot in tool.params:
        if slot in mentioned or f"{slot}_name" in mentioned:
            args[pname] = slots[slot][1]
    return text, args


def generate(rng: random.Random, spec: WorkloadSpec, tok: Tokenizer | None) -> Example:
    """A few function schemas and a request that needs exactly one of them."""
    offer = tools()
    tool = rng.choice(offer)
    offered = rng.sample([t for t in offer if t is not tool], rng.randint(2, 5)) + [tool]
    rng.shuffle(offered)
    request, args = tool_request(tool, rng.choice(tool.requests), tool_slots(rng))
    listing = "\n".join(json.dumps(t.schema()) for t in offered)  # one per line, as Hermes/Qwen
    intro = rng.choice(read_data("tools.json")["intros"])
    prompt = (f"You can call the following functions:\n{listing}\n\n"
              'To call one, reply with {"name": <function name>, "arguments": <JSON object>}.'
              f"\n\n{intro}{request}")
    return Example(prompt, json.dumps({"name": tool.name, "arguments": args}))
