"""Structured output: a JSON schema, a text that states the values, and the object extracting them.

Six record kinds (invoice, contact, calendar event, job posting, support ticket, product
listing); their schemas and word pools are data (data/structured.json), the sentences that
state the drawn values are written here.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable
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

Record = tuple[str, dict[str, Any], dict[str, Any], list[str]]
"""(what it is, JSON schema, the values, sentences of a text that states them)."""


def _data(kind: str) -> dict[str, Any]:
    """The schema and word pools of one record kind."""
    data: dict[str, Any] = read_data("structured.json")["records"][kind]
    return data


def _invoice(rng: random.Random) -> Record:
    data = _data("invoice")
    vendor, domain = rng.choice(vocabulary().companies)
    issued = date(rng)
    due = issued + dt.timedelta(days=rng.choice((14, 30, 45, 60)))
    currency = rng.choice(("USD", "EUR", "GBP"))
    items: list[dict[str, Any]] = []
    for product, _, price in rng.sample(vocabulary().products, rng.randint(1, 4)):
        items.append({"description": product, "quantity": rng.randint(1, 12),
                      "unit_price": round(price * rng.uniform(0.85, 1.1), 2)})
    total = round(sum(i["quantity"] * i["unit_price"] for i in items), 2)
    number = f"INV-{issued.year}-{rng.randint(1000, 9999)}"
    values = {"invoice_number": number, "vendor": vendor, "issue_date": issued.isoformat(),
              "due_date": due.isoformat(), "currency": currency, "line_items": items,
              "total": total}
    lines = "; ".join(f"{i['quantity']} x {i['description']} at {i['unit_price']:.2f}"
                      for i in items)
    text = [f"Hello, please find attached invoice {number} from {vendor} (billing@{domain}).",
            rng.choice((f"It was issued on {say_date(issued)}",
                        f"The invoice date is {issued.strftime('%d %B %Y')}")) +
            f" and payment is due by {say_date(due)}.",
            f"Items billed: {lines}.",
            f"Amount due: {total:,.2f} {currency}.",
            rng.choice(data["closings"])]
    return "invoice", data["schema"], values, text


def _contact(rng: random.Random) -> Record:
    data = _data("contact")
    name, email, company = person(rng)
    city, country, _ = rng.choice(vocabulary().cities)
    title = rng.choice(data["titles"])
    phone = f"+{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(100, 999)} " \
            f"{rng.randint(1000, 9999)}"
    lang = rng.choice(vocabulary().languages)
    values = {"full_name": name, "email": email, "phone": phone, "company": company,
              "job_title": title, "city": city, "country": country,
              "preferred_language": lang}
    text = [f"Met {name} at the trade fair yesterday; {name.split()[0]} is {title} at {company}.",
            f"Based in {city}, {country}.",
            rng.choice((f"Best reached at {email} or on {phone}.",
                        f"Phone: {phone}. Email: {email}.")),
            f"Prefers to correspond in {lang}.",
            rng.choice(data["closings"])]
    return "contact", data["schema"], values, text


def _event(rng: random.Random) -> Record:
    data = _data("calendar event")
    day = date(rng)
    said, start = time_of_day(rng)
    minutes = rng.choice((30, 45, 60, 90, 120))
    title = rng.choice(vocabulary().meetings)
    attendees = sorted({person(rng)[1] for _ in range(rng.randint(2, 4))})
    online = rng.random() < 0.5
    location = "video call" if online else rng.choice(data["rooms"])
    recurrence = rng.choice(("none", "weekly", "biweekly", "monthly"))
    values = {"title": title, "date": day.isoformat(), "start_time": start,
              "duration_minutes": minutes, "attendees": attendees, "location": location,
              "recurrence": recurrence}
    text = [f"Hi all, I'm setting up '{title}' on {say_date(day)} at {said}.",
            f"Plan for {minutes} minutes" + (" on a video call." if online else
                                               f" in {location}."),
            f"Invites go to {', '.join(attendees)}.", data["recurrence"][recurrence],
            rng.choice(data["closings"])]
    return "calendar event", data["schema"], values, text


def _job(rng: random.Random) -> Record:
    data = _data("job posting")
    company, _ = rng.choice(vocabulary().companies)
    city, country, _ = rng.choice(vocabulary().cities)
    title = rng.choice(data["titles"])
    level = rng.choice(("junior", "mid", "senior", "staff"))
    low = rng.randrange(50, 140, 5) * 1000
    high = low + rng.randrange(15, 60, 5) * 1000
    currency = rng.choice(("USD", "EUR", "GBP", "CAD"))
    remote = rng.random() < 0.5
    skills = rng.sample(data["skills"], rng.randint(2, 4))
    values = {"title": title, "company": company, "location": f"{city}, {country}",
              "remote": remote, "seniority": level, "salary_min": low, "salary_max": high,
              "currency": currency, "skills": skills}
    text = [f"{company} is hiring a {level}-level {title} in {city}, {country}.",
            "The role is fully remote." if remote else "You'll work from our office three "
                                                       "days a week.",
            f"Compensation: {low:,} to {high:,} {currency} per year.",
            f"We're looking for experience with {', '.join(skills[:-1])} and {skills[-1]}.",
            rng.choice(data["closings"])]
    return "job posting", data["schema"], values, text


def _ticket(rng: random.Random) -> Record:
    data = _data("support ticket")
    name, email, _ = person(rng)
    product, _, _ = rng.choice(vocabulary().products)
    issue = rng.choice(vocabulary().issues)
    severity = rng.choice(("low", "medium", "high", "critical"))
    category = rng.choice(("hardware", "shipping", "software", "billing"))
    steps = rng.sample([s.format(product=product) for s in data["steps"]], 3)
    order = f"{rng.choice(('US', 'EU', 'UK'))}-{rng.randint(100000, 999999)}"
    values = {"customer_name": name, "customer_email": email, "order_id": order,
              "product": product, "category": category, "severity": severity,
              "summary": f"{product} {issue}", "steps_to_reproduce": steps}
    text = [f"From: {name} <{email}>", f"Subject: {product} problem (order {order})",
            f"Hi, my {product} {issue}.", "What I did: " + "; then ".join(s.lower() for s in steps)
            + ".", data["urgency"][severity], f"Filed under {category}."]
    return "support ticket", data["schema"], values, text


def _product(rng: random.Random) -> Record:
    data = _data("product listing")
    product, category, price = rng.choice(vocabulary().products)
    brand = rng.choice(vocabulary().brands)
    sku = f"{category[:3].upper()}-{rng.randint(10000, 99999)}"
    w, h, d = (rng.randint(5, 150) for _ in range(3))
    price = round(price * rng.uniform(0.9, 1.2), 2)
    in_stock = rng.random() < 0.7
    tags = rng.sample(data["tags"], 2)
    values = {"sku": sku, "title": product, "brand": brand, "category": category,
              "price": price, "in_stock": in_stock,
              "dimensions_cm": {"width": w, "height": h, "depth": d}, "tags": tags}
    text = [f"New listing from {brand}: {product} (SKU {sku}, {category}).",
            f"Retail price {price:.2f} USD.",
            "Currently in stock and ships in 2 days." if in_stock else
            "Out of stock; restock expected next month.",
            f"Dimensions: {w} cm wide, {h} cm high, {d} cm deep.",
            f"Tag it as {tags[0]} and {tags[1]}."]
    return "product listing", data["schema"], values, text


RECORDS: tuple[Callable[[random.Random], Record], ...] = (
    _invoice, _contact, _event, _job, _ticket, _product)
"""The record kinds, in the order the generator picks from."""


def generate(rng: random.Random, spec: WorkloadSpec, tok: Tokenizer | None) -> Example:
    """A JSON schema, a text holding the values, and the object that extracts them."""
    kind, schema, values, text = rng.choice(RECORDS)(rng)
    body = text[:1] + rng.sample(text[1:], len(text) - 1)  # keep the opening line first
    instruction = rng.choice(read_data("structured.json")["instructions"])
    prompt = (f"{instruction.format(kind=kind)}\n\nSchema:\n"
              f"{json.dumps(schema, indent=2)}\n\nText:\n{' '.join(body)}")
    return Example(prompt, json.dumps(values, indent=2))
