"""User-facing configuration problems: one line each, all collected, rendered the same way.

Format:
`<dotted.path>: <problem>; got <value>; expected <allowed>[; did you mean '<x>'?] [<source>]`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

EXIT_INVALID = 2
"""Exit status of every entry point that refuses an invalid configuration."""

_MISSING = object()

_SECRET_VALUE = re.compile(r"""(--(?:api[-_]k|hf[-_]t)[\w-]*(?:=|['"]?\s*,\s*|\s+))"""  # option
                           r"""(?!['"]?-)(?:'[^']*'|"[^"]*"|[^,\]\s'"]+)""")  # its value
"""A secret option's value inside free text (an override, a command line)."""


_URL_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")
"""The user (and password) part of a URL: `scheme://user:pass@host`."""


def redact_secrets(text: str) -> str:
    """`text` with the values of secret options and the credentials written into URLs
    replaced by `***` (for messages)."""
    return _URL_USERINFO.sub(r"\1***@", _SECRET_VALUE.sub(r"\1***", text))


def one_line(text: str) -> str:
    """`text` with control characters and line breaks escaped (`\\n`, `\\x1b`, `\\u2028`), so a
    problem stays on one line and no input can move the cursor or colour the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def show(value: Any, limit: int = 80) -> str:
    """Render a config value compactly for an error line."""
    if value is _MISSING:
        return "nothing"
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: Any, options: Iterable[Any]) -> str | None:
    """The closest option to a misspelt word, if any is close enough."""
    if not isinstance(word, str):
        return None
    candidates = [str(o) for o in options]
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return match[0] if match else None


def one_of(options: Sequence[Any]) -> str:
    """`one of ['a', 'b']` for a closed set."""
    return "one of [" + ", ".join(show(o) for o in options) + "]"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration."""

    path: str
    problem: str
    got: Any = _MISSING
    expected: str = ""
    suggestion: str | None = None
    source: str = ""

    def render(self) -> str:
        parts = [f"{self.path}: {self.problem}", f"got {show(self.got)}"]
        if self.expected:
            parts.append(f"expected {self.expected}")
        if self.suggestion:
            parts.append(f"did you mean {self.suggestion!r}?")
        line = "; ".join(parts)
        # no secret a user typed (an override, extra_args) is ever echoed back
        return redact_secrets(one_line(f"{line} [{self.source}]" if self.source else line))


class Raw(str):
    """A value already rendered as text (shown as it is, without quotes)."""

    def __repr__(self) -> str:
        return str(self)


class ProblemError(ValueError):
    """A schema validator's problem as data; `problem.path` is relative to the model validated.

    pydantic keeps the exception in the error's ctx["error"], so the config layer reads the
    problem from there instead of parsing the message (which is the rendered problem)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(problem.render())


class SpecError(Exception):
    """A configuration that cannot be run; carries every problem found."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"invalid configuration: {n} problem{'s' if n != 1 else ''}"
        return "\n".join([head, *(f"  - {p.render()}" for p in self.problems)])


def report(exc: SpecError, stream: TextIO) -> int:
    """Write the problems the way every entry point does (plain text, one line each, nothing
    interpreted as markup or emoji) and return `EXIT_INVALID`."""
    stream.write(exc.render() + "\n")
    return EXIT_INVALID
