"""A request log like a gateway's, built offline from this interpreter's stdlib sources: the trace
the tests and the docs replay (`python -m specflow.demo.traces OUT.jsonl`).

Two routes of one assistant service, in one log:

* `sql-agent`: agent conversations. A system turn, the user's task, the assistant's tool call
  (content null, `tool_calls` with JSON arguments), the tool's result (source code it read), and
  the user's follow-up; the `tools` it offered; long answers (recorded 96-192 tokens).
* `router`: one user turn asking which team gets a ticket; 1-2 token answers.

Lines alternate between the two shapes gateways log: the request at the top with `usage` beside
it, and the request nested under `request` with `response.usage`. Each has `metadata.route` and
a `timestamp` (ISO 8601), about 4 requests per second.
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)

TOOLS = [{"type": "function", "function": {
    "name": "read_source", "description": "Read a Python module's source",
    "parameters": {"type": "object", "properties": {"module": {"type": "string"}},
                   "required": ["module"]}}}]

MODULES = ("json", "textwrap", "difflib", "fnmatch", "shlex", "string", "heapq", "bisect",
           "calendar", "csv", "glob", "gzip", "ipaddress", "keyword", "locale", "numbers",
           "operator", "pprint", "queue", "random", "sched", "secrets", "statistics", "tokenize")

TEAMS = ("billing", "storage", "network", "auth", "compute", "support")


def _snippets(rng: random.Random) -> Iterator[tuple[str, str]]:
    import importlib

    while True:
        name = rng.choice(MODULES)
        try:
            text = inspect.getsource(importlib.import_module(name))
        except (OSError, TypeError, ImportError):
            continue
        lines = text.splitlines()
        at = rng.randrange(max(1, len(lines) - 30))
        yield name, "\n".join(lines[at:at + 24])


def _agent(i: int, rng: random.Random, snippets: Iterator[tuple[str, str]]) -> dict[str, Any]:
    module, code = next(snippets)
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "read_source", "arguments": json.dumps({"module": module})}}
    return {"model": "assistant", "tools": TOOLS, "max_tokens": 512, "messages": [
        {"role": "system", "content": "You are a coding agent. Use the tools to read code."},
        {"role": "user", "content": f"Explain what this part of {module} does (task {i})."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": code},
        {"role": "user", "content": [{"type": "text", "text": "Now rewrite it more simply."}]},
    ]}, rng.randrange(96, 193)


def _router(i: int, rng: random.Random, snippets: Iterator[tuple[str, str]]) -> dict[str, Any]:
    module, code = next(snippets)
    line = rng.choice([x for x in code.splitlines() if x.strip()] or [module])
    return {"model": "assistant", "max_tokens": 2, "messages": [
        {"role": "user", "content": f"Ticket {i}: '{line.strip()}' fails in {module}. Which "
                                    f"team: {', '.join(TEAMS)}? One word."}]}, rng.randrange(1, 3)


def requests(per_class: int, seed: int = 0, agent_share: float = 0.5) -> list[dict[str, Any]]:
    """The log's lines: `per_class` requests of the smaller class, the larger one scaled so that
    `sql-agent` holds `agent_share` of them."""
    rng = random.Random(f"specflow/demo-trace/{seed}")
    snippets = _snippets(rng)
    n_agent = per_class if agent_share <= 0.5 else round(per_class * agent_share
                                                         / (1 - agent_share))
    n_router = per_class if agent_share >= 0.5 else round(per_class * (1 - agent_share)
                                                          / agent_share)
    routes = ["sql-agent"] * n_agent + ["router"] * n_router
    rng.shuffle(routes)
    out = []
    t = START
    for i, route in enumerate(routes):
        body, tokens = (_agent if route == "sql-agent" else _router)(i, rng, snippets)
        t += dt.timedelta(seconds=rng.expovariate(4.0))
        meta = {"route": route, "user": f"u{rng.randrange(50)}"}
        stamp = t.isoformat().replace("+00:00", "Z")
        if i % 2:
            out.append({"timestamp": stamp, "metadata": meta, "request": body,
                        "response": {"usage": {"completion_tokens": tokens}}})
        else:
            out.append({**body, "timestamp": stamp, "metadata": meta,
                        "usage": {"prompt_tokens": 0, "completion_tokens": tokens}})
    return out


def write(path: str | Path, per_class: int = 24, seed: int = 0, agent_share: float = 0.5
          ) -> Path:
    """Write the demo log (one JSON request per line)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in requests(per_class, seed, agent_share)),
                 encoding="utf-8")
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specflow.demo.traces",
                                 description="Write the demo request log.")
    ap.add_argument("out", help="the JSONL file to write")
    ap.add_argument("--per-class", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agent-share", type=float, default=0.5)
    a = ap.parse_args(argv)
    print(write(a.out, a.per_class, a.seed, a.agent_share))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
