"""Request logs: one request per line, as gateways log OpenAI-compatible requests.

A line is a JSON object holding a chat request (`messages`, any of system/developer/user/
assistant/tool turns, `tools` when present) or a completion request (`prompt`), its
`max_tokens` / `max_completion_tokens`, the output length it was answered with when the log has
it (`usage.completion_tokens`, `output_tokens`), an optional `timestamp` and a field naming its
traffic class. A log that nests the request body under `request` or `body` (with `usage` beside
it or under `response`) is read as it is. Every field can be named by a dotted path
(`metadata.route`); `TraceSource` holds the paths, `None` meaning the defaults below.

`format: spec_bench` / `speed_bench` read the field's benchmark sets from local files: Spec-Bench's
`question.jsonl` and SPEED-Bench's parquet or prepared JSONL (`turns` or `messages`, `category`);
like vLLM's own readers they replay each question's first turn.

Every problem is named by `file:line`, and all of a file's problems are reported at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from specflow.spec.errors import Problem, Raw, one_of, show
from specflow.spec.schema import CLASS_NAME, TraceSource

ROLES = ("system", "developer", "user", "assistant", "tool")
"""Chat roles a request may hold (OpenAI's; `developer` is the newer name of `system`)."""

ROOTS = ("", "request.", "body.")
"""Where a logged request body may sit: the line itself, or nested under `request` / `body`."""

DEFAULTS: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "prompt": ("prompt",),
    "tools": ("tools",),
    "max_tokens": ("max_completion_tokens", "max_tokens"),
    "output_tokens": ("usage.completion_tokens", "response.usage.completion_tokens",
                      "output_tokens"),
    "timestamp": ("timestamp", "created", "time"),
    "class": (),
    "template_kwargs": ("chat_template_kwargs",),
}
"""The dotted paths tried for each field when the source names none (within each of ROOTS)."""

FORMATS: dict[str, dict[str, tuple[str, ...]]] = {
    "openai": {},
    "spec_bench": {"prompt": ("turns",), "class": ("category",)},
    "speed_bench": {"messages": ("messages",), "prompt": ("turns",), "class": ("category",)},
}
"""Each format's defaults, over DEFAULTS (a source's own field paths win)."""

RESERVED = frozenset({"conversation", "messages", "tools", "tokenize", "add_generation_prompt",
                      "return_dict", "documents", "chat_template"})
"""Template arguments a request may not set: the renderer sets them itself."""

PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED"
"""SPEED-Bench's stand-in for prompts it may not redistribute."""

MAX_PROBLEMS = 20
"""Problems listed per file; the rest are counted."""

_CLASS = re.compile(CLASS_NAME)


@dataclass(frozen=True)
class Request:
    """One logged request, ready to render."""

    line: int
    """Line of the file (1-based; the row number for parquet)."""
    messages: tuple[dict[str, Any], ...] | None
    """Chat turns (role, content as text, tool_calls/tool_call_id/name where logged)."""
    prompt: str | None
    """A completion request's raw prompt (None for a chat request)."""
    tools: tuple[dict[str, Any], ...] = ()
    """Tool schemas the request offered."""
    max_tokens: int | None = None
    """The request's own output limit, if logged."""
    recorded_output: int | None = None
    """The output length it was answered with, if logged."""
    timestamp: float | None = None
    """Arrival time, seconds since the epoch, if logged."""
    traffic_class: str | None = None
    """Its class, from the class field."""
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    """The request's `chat_template_kwargs` (e.g. `enable_thinking: false`), passed to the
    template as vLLM's server passes them."""

    @property
    def turns(self) -> int:
        """Chat turns in the request (1 for a completion prompt)."""
        return len(self.messages) if self.messages is not None else 1

    @property
    def uses_tools(self) -> bool:
        """Whether it offered tools or holds tool calls or tool results."""
        return bool(self.tools) or any(
            m.get("role") == "tool" or m.get("tool_calls") for m in self.messages or ())

    @property
    def key(self) -> str:
        """A digest of what is sent (duplicates in a log are one request)."""
        body = {"m": self.messages, "p": self.prompt, "t": self.tools,
                "k": dict(self.template_kwargs)}
        return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False)
                              .encode()).hexdigest()

    def output_len(self, cap: int) -> int:
        """Output tokens to request: the recorded length where logged, else its own limit,
        never more than `cap`."""
        n = self.recorded_output or self.max_tokens or cap
        return max(1, min(n, cap))

    def text_chars(self) -> int:
        """Characters of text it sends (for token estimates without a tokenizer)."""
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.get("content") or "") for m in self.messages or ())


@dataclass
class Trace:
    """The requests of one file and the problems found reading it."""

    path: Path
    requests: list[Request] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    more_problems: int = 0
    sha256: str = ""
    """sha256 of the file's bytes, taken as it was read ("" when it could not be read)."""

    def classes(self) -> Counter[str]:
        """Requests per class (`None`'s requests counted under "")."""
        return Counter(r.traffic_class or "" for r in self.requests)

    def all_problems(self, source: str = "") -> list[Problem]:
        out = [Problem(p.path, p.problem, p.got, p.expected, p.suggestion, source or p.source)
               for p in self.problems]
        if self.more_problems:
            out.append(Problem(str(self.path), f"{self.more_problems} more problems like the "
                               "ones above", Raw(f"{self.more_problems}"), "a clean file",
                               source=source))
        return out


def lookup(row: Any, path: str) -> Any:
    """The value at a dotted path (`metadata.route`, `choices.0.text`), or MISSING."""
    node = row
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


MISSING: Any = object()


def _paths(src: TraceSource, name: str) -> tuple[str, ...]:
    own = getattr(src, f"{name}_field")
    if own is not None:
        return (own,)
    return FORMATS[src.format].get(name, DEFAULTS[name])


def _find(row: dict[str, Any], paths: Sequence[str], nested: bool = True) -> tuple[str, Any]:
    """(path found, value) of the first path present, tried at each root."""
    for root in ROOTS if nested else ("",):
        for p in paths:
            v = lookup(row, root + p)
            if v is not MISSING and v is not None:
                return root + p, v
    return "", MISSING


CHUNK = 1 << 20
"""Bytes hashed at a time."""


def file_sha256(path: str | Path, digest: Any = None) -> str:
    """sha256 of a file's bytes, read in chunks (into `digest` when given)."""
    digest = digest if digest is not None else hashlib.sha256()
    with Path(path).expanduser().open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return str(digest.hexdigest())


def _rows(path: Path, fail: Any, digest: Any) -> Iterator[tuple[int, Any]]:
    """(line, parsed object) of each non-blank line; undecodable lines are reported. The file's
    bytes are hashed into `digest` on the way (all of them, also after a line that ends the
    reading)."""
    if path.suffix == ".parquet":
        file_sha256(path, digest)  # pyarrow reads the file itself
        try:
            import pyarrow.parquet as pq  # type: ignore[import-untyped]

            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - not parquet, truncated, no pyarrow: one line
            fail(1, "is not a readable parquet file", Raw(f"{type(exc).__name__}: "
                                                          f"{str(exc)[:80]}"),
                 "a parquet table (SPEED-Bench's), or JSONL")
            return
        yield from enumerate(rows, 1)
        return
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            digest.update(raw)
            if b"\0" in raw:
                fail(n, "is not text (a binary file?)", Raw(f"{len(raw)} bytes with NUL"),
                     "a JSONL request log, UTF-8")
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                fail(n, "is not UTF-8 text (a binary file?)", Raw(str(exc)[:60]),
                     "a JSONL request log, UTF-8")
                break
            if not text.strip():
                continue
            try:
                yield n, json.loads(text.strip())
            except json.JSONDecodeError as exc:
                fail(n, "is not valid JSON", Raw(f"{exc.msg} at column {exc.colno}"),
                     "one JSON object per line")
        for rest in fh:  # after a line that ended the reading: hash the rest too
            digest.update(rest)


def _text(content: Any) -> str | None:
    """A message's content as text: a string, or the text of OpenAI content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 1 else None


def _time(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value) / (1000.0 if value > 1e11 else 1.0)  # milliseconds
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def read_trace(path: str | Path, src: TraceSource) -> Trace:
    """Every request of the file, and every problem with it (by file:line)."""
    p = Path(path).expanduser()
    trace = Trace(p)

    def fail(line: int, what: str, got: Any, expected: str) -> None:
        if len(trace.problems) >= MAX_PROBLEMS:
            trace.more_problems += 1
            return
        trace.problems.append(Problem(f"{p}:{line}", what, got, expected))

    if not p.is_file():
        trace.problems.append(Problem(str(p), "no such file", str(path),
                                      "an existing JSONL request log"))
        return trace
    digest = hashlib.sha256()
    seen = False
    for n, row in _rows(p, fail, digest):
        seen = True
        if not isinstance(row, dict):
            fail(n, "is not a JSON object", Raw(type(row).__name__), "one request object")
            continue
        req = _request(n, row, src, fail)
        if req is not None:
            trace.requests.append(req)
    if not seen and not trace.problems:
        trace.problems.append(Problem(str(p), "holds no requests", Raw("an empty file"),
                                      "one JSON request per line"))
    trace.sha256 = digest.hexdigest()
    if src.sha256 is not None and trace.sha256 != src.sha256:  # that one problem only
        trace.requests, trace.more_problems = [], 0
        trace.problems = [Problem(str(p), "the file changed since it was pinned",
                                  Raw(f"sha256 {trace.sha256[:16]}..."),
                                  f"sha256 {src.sha256[:16]}... (source.sha256)")]
    return trace


def _request(n: int, row: dict[str, Any], src: TraceSource, fail: Any) -> Request | None:
    ok = True

    def bad(what: str, got: Any, expected: str) -> None:
        nonlocal ok
        ok = False
        fail(n, what, got, expected)

    mpath, raw_messages = _find(row, _paths(src, "messages"))
    ppath, raw_prompt = _find(row, _paths(src, "prompt"))
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    if raw_messages is not MISSING:
        messages = _messages(raw_messages, mpath, src, bad)
    elif raw_prompt is not MISSING:
        if isinstance(raw_prompt, list) and raw_prompt and isinstance(raw_prompt[0], str):
            raw_prompt = raw_prompt[0]  # benchmark sets' `turns`: the first turn
            if src.format != "openai":
                messages = [{"role": "user", "content": raw_prompt}]
        if messages is None:
            if isinstance(raw_prompt, str) and raw_prompt.strip():
                prompt = raw_prompt
            else:
                bad(f"'{ppath}' is not a prompt", raw_prompt, "a non-empty string")
    else:
        tried = list(_paths(src, "messages")) + list(_paths(src, "prompt"))
        bad("has no messages and no prompt", Raw(f"keys {sorted(row)[:8]}"),
            f"{one_of(tried)} (at the top, under 'request' or 'body'), or "
            "source.messages_field / prompt_field naming where they are")
    if messages is not None and any(PLACEHOLDER in (m.get("content") or "") for m in messages):
        bad("holds SPEED-Bench's placeholder instead of the prompt",
            Raw(f"'{PLACEHOLDER}...'"), "the prepared data (NeMo-Skills' speed-bench "
            "prepare.py fetches the full prompts)")
    if messages is not None and src.format != "openai":
        messages = [m for m in messages if m.get("role") == "user"][:1] or messages[:1]
    tools: tuple[dict[str, Any], ...] = ()
    tpath, raw_tools = _find(row, _paths(src, "tools"))
    if raw_tools is not MISSING:
        if isinstance(raw_tools, list) and all(isinstance(t, dict) for t in raw_tools):
            tools = tuple(raw_tools)
        else:
            bad(f"'{tpath}' is not a list of tool objects", raw_tools, "a list of objects")
    limits: dict[str, int | None] = {}
    for name in ("max_tokens", "output_tokens"):
        fpath, value = _find(row, _paths(src, name))
        if value is MISSING:
            limits[name] = None
            continue
        limits[name] = _count(value)
        if limits[name] is None:
            bad(f"'{fpath}' is not a token count", value, "a positive integer")
    cls: str | None = None
    if src.class_field is not None or FORMATS[src.format].get("class"):
        cpath, value = _find(row, _paths(src, "class"), nested=False)
        if value is MISSING:
            bad("has no class", Raw(f"keys {sorted(row)[:8]}"),
                f"a class name at '{_paths(src, 'class')[0]}' (source.class_field)")
        elif not isinstance(value, str) or not _CLASS.fullmatch(value):
            bad(f"'{cpath}' is not a class name", value, "a name of letters, digits, '_' "
                "and '-' starting with a letter, at most 64 characters (a metric label "
                "and a file name)")
        else:
            cls = value
    ts: float | None = None
    tspath, value = _find(row, _paths(src, "timestamp"), nested=False)
    if value is not MISSING:
        ts = _time(value)
        if ts is None:
            bad(f"'{tspath}' is not a time", value, "seconds (or ms) since the epoch, or an "
                "ISO 8601 string")
    kwargs: tuple[tuple[str, Any], ...] = ()
    kpath, value = _find(row, DEFAULTS["template_kwargs"])
    if value is not MISSING:
        taken = sorted(set(value) & RESERVED) if isinstance(value, dict) else []
        if not isinstance(value, dict) or taken:
            bad(f"'{kpath}' sets what the renderer sets" if taken else
                f"'{kpath}' is not a mapping of template arguments", taken or value,
                f"an object of template arguments, none of {sorted(RESERVED)}")
        else:
            kwargs = tuple(sorted(value.items()))
    if not ok:
        return None
    return Request(n, tuple(messages) if messages is not None else None, prompt, tools,
                   limits["max_tokens"], limits["output_tokens"], ts, cls, kwargs)


def _messages(raw: Any, where: str, src: TraceSource, bad: Any) -> list[dict[str, Any]] | None:
    if not isinstance(raw, list) or not raw:
        bad(f"'{where}' is not a list of turns", raw if raw == [] else Raw(type(raw).__name__),
            "a non-empty list of {role, content} objects")
        return None
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        at = f"'{where}.{i}'"
        if not isinstance(m, dict):
            bad(f"{at} is not a turn", m, "an object with role and content")
            return None
        role = m.get("role")
        if role not in ROLES:
            bad(f"{at} has an unknown role", role, one_of(ROLES))
            return None
        content = m.get("content")
        text = _text(content) if content is not None else None
        if content is not None and text is None:
            bad(f"{at} has content that is not text", Raw(show(content, 40)),
                "a string or a list of {type: text, text} parts (images and audio are not "
                "replayed)")
            return None
        if text is None and not (role == "assistant" and m.get("tool_calls")):
            bad(f"{at} has no content", Raw("null"), "text (only an assistant turn with "
                "tool_calls may have none)")
            return None
        turn: dict[str, Any] = {"role": role, "content": text or ""}
        for extra in ("tool_calls", "tool_call_id", "name"):
            if m.get(extra) is not None:
                turn[extra] = m[extra]
        out.append(turn)
    return out


def select(trace: Trace, classes: Sequence[str] | None) -> list[Request]:
    """The requests of the given classes (all when None), in file order."""
    if classes is None:
        return list(trace.requests)
    wanted = set(classes)
    return [r for r in trace.requests if r.traffic_class in wanted]


__all__ = ["CLASS_NAME", "DEFAULTS", "FORMATS", "ROLES", "Request", "Trace", "lookup",
           "read_trace", "select"]
