"""Pydantic validation errors -> specflow problems: each names the dotted field path, the
value, what is allowed and the config file the value came from (`Sources`)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from specflow.spec.errors import (
    Problem,
    ProblemError,
    did_you_mean,
    one_of,
    redact_secrets,
)
from specflow.spec.schema import CLASS_NAME, Spec

GROUPS = ("target", "drafter", "hardware", "workload", "service", "sweep", "promote", "backend",
          "experiment")
"""Config groups under conf/."""


MULTI = ("drafter", "workload", "service")
"""Groups selected as lists; each file nests its content under its own name."""

PATTERNS = {CLASS_NAME: "a name of letters, digits, '_' and '-' starting with a letter, at most "
                        "64 characters (a metric label and a file name hold it)"}
"""What a pattern-checked field takes, in words."""


@dataclass(frozen=True)
class Sources:
    """Maps a dotted path to the conf file (or override) it came from."""

    root: Path
    choices: dict[str, Any]
    overrides: tuple[str, ...]

    def __call__(self, path: str) -> str:
        path = re.sub(r"\[(\d+)\]", r".\1", path)  # layers[0].count, as typed: layers.0.count
        for ov in self.overrides:
            key = ov.split("=", 1)[0].lstrip("+~")
            if "=" in ov and key not in GROUPS and (
                path == key or path.startswith((key + ".", key + "[")) or key.startswith(path + ".")
            ):
                return f"override {redact_secrets(ov)}"
        experiment = self.choices.get("experiment")
        overlay = self.root / "experiment" / f"{experiment}.yaml"
        if experiment and _has_path(read_yaml(overlay), path):
            return f"conf/experiment/{experiment}.yaml"
        head, _, rest = path.partition(".")
        if head in MULTI:
            name = rest.split(".", 1)[0]
            if name and (self.root / head / f"{name}.yaml").is_file():
                return f"conf/{head}/{name}.yaml"
            return f"conf/{head}/"
        choice = self.choices.get(head)
        if head in GROUPS and isinstance(choice, str):
            return f"conf/{head}/{choice}.yaml"
        return "conf/config.yaml"


@lru_cache(maxsize=64)
def _read_yaml_cached(path: str, mtime: float) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def read_yaml(path: Path) -> Any:
    try:
        return _read_yaml_cached(str(path), path.stat().st_mtime)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _has_path(data: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return strip_optional(args[0])
    if origin is typing.Annotated:
        return strip_optional(typing.get_args(tp)[0])
    return tp


def union_members(tp: Any) -> list[type[BaseModel]]:
    tp = strip_optional(tp)
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    field_info = model.model_fields.get("kind")
    return field_info.default if field_info is not None else None


def walk(loc: Sequence[str | int], root: type[BaseModel] = Spec) -> tuple[list[str | int], Any]:
    """Follow a pydantic error location through the schema.

    Returns the user-facing path (union tags removed) and the type found at the end.
    """
    tp: Any = root
    path: list[str | int] = []
    items = list(loc)
    i = 0
    while i < len(items):
        part = items[i]
        tp = strip_optional(tp)
        members = union_members(tp)
        if members:
            by_tag = {_tag(m): m for m in members}
            if part in by_tag:
                tp = by_tag[part]
                i += 1
                continue
            tp = members[0]
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):  # str | int | ...: pydantic names the member
            by_name = {name: a for a in typing.get_args(tp)  # int, list[float]
                       for name in {getattr(a, "__name__", str(a)), str(a)}}
            if part in by_name:
                tp = by_name[part]
                i += 1
                continue
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            info = tp.model_fields.get(str(part))
            tp = info.annotation if info else None
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        elif origin in (list, tuple):
            args = typing.get_args(tp)
            tp = args[0] if origin is list or (len(args) == 2 and args[1] is Ellipsis) else (
                args[int(part)] if isinstance(part, int) and part < len(args) else None)
        else:
            tp = None
        path.append(part)
        i += 1
    return path, tp


def fields_of(tp: Any) -> list[str]:
    """Field names allowed at a schema node (union members combined)."""
    tp = strip_optional(tp)
    is_model = isinstance(tp, type) and issubclass(tp, BaseModel)
    members = union_members(tp) or ([tp] if is_model else [])
    names: list[str] = []
    for m in members:
        names.extend(n for n in m.model_fields if n not in names)
    return names


def dotted(parts: Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _describe(tp: Any) -> str:
    tp = strip_optional(tp)
    names = fields_of(tp)
    if names:
        return "a mapping with keys " + one_of(names)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return one_of(typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


_RANGE = {
    "greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<=",
}


_TYPES = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
    "tuple_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


@dataclass(frozen=True)
class _Error:
    """One pydantic error, located in the schema."""

    kind: str
    user_path: list[str | int]
    """The user-facing path (union tags removed)."""
    tp: Any
    """The schema type at that path."""
    ctx: dict[str, Any]
    got: Any
    msg: str

    @property
    def path(self) -> str:
        return dotted(self.user_path)


def _missing(x: _Error) -> Problem:
    return Problem(x.path, "required field is missing", expected=_describe(x.tp))


def _literal(x: _Error) -> Problem:
    allowed = typing.get_args(strip_optional(x.tp)) or ()
    return Problem(x.path, "not an allowed value", x.got,
                   x.ctx.get("expected", one_of(allowed)), did_you_mean(x.got, allowed))


def _union_tag(x: _Error) -> Problem:
    tags = [_tag(m) for m in union_members(x.tp)]
    field_name = x.ctx.get("discriminator", "'kind'").strip("'")
    got = x.got.get(field_name) if isinstance(x.got, dict) else x.got
    return Problem(dotted([*x.user_path, field_name]),
                   "unknown kind" if x.kind == "union_tag_invalid" else "missing kind", got,
                   one_of(tags), did_you_mean(got, tags))


def _out_of_range(x: _Error) -> Problem:
    bound = next(iter(x.ctx.values()), "")
    if isinstance(bound, float) and abs(bound) >= 1e6:
        bound = f"{bound:g}"
    return Problem(x.path, "out of range", x.got, f"a value {_RANGE[x.kind]} {bound}")


def _too_short(x: _Error) -> Problem:
    n = x.ctx.get("min_length", 1)
    what = "character" if x.kind == "string_too_short" else "item"
    plural = "s" if n != 1 else ""
    return Problem(x.path, "too short", x.got, f"at least {n} {what}{plural}")


_TRANSLATE: dict[str, Callable[[_Error], Problem]] = {
    "missing": _missing,
    "literal_error": _literal,
    "union_tag_invalid": _union_tag,
    "union_tag_not_found": _union_tag,
    **dict.fromkeys(_RANGE, _out_of_range),
    "finite_number": lambda x: Problem(x.path, "not a finite number", x.got, "a finite number"),
    "int_parsing_size": lambda x: Problem(x.path, "out of range", x.got,
                                          "an integer of sensible size"),
    "too_short": _too_short,
    "string_too_short": _too_short,
    "too_long": lambda x: Problem(x.path, "too long", x.got,
                                  f"at most {x.ctx.get('max_length')} items"),
    "string_pattern_mismatch": lambda x: Problem(x.path, "malformed", x.got, PATTERNS.get(
        str(x.ctx.get("pattern")), f"a string matching {x.ctx.get('pattern')}")),
    **{kind: (lambda x: Problem(x.path, "wrong type", x.got, _TYPES[x.kind])) for kind in _TYPES},
    "value_error": lambda x: _from_value_error(x.ctx.get("error"), x.user_path, x.got, x.msg),
}
"""One translation per pydantic error kind; any other kind keeps pydantic's message."""


def _translate(e: Any, loc: list[str | int], root: type[BaseModel]) -> Problem:
    """One pydantic error as a `Problem` naming the user-facing dotted path."""
    if e["type"] == "extra_forbidden":
        parent_path, parent_tp = walk(loc[:-1], root)
        allowed = fields_of(parent_tp)
        return Problem(dotted([*parent_path, loc[-1]]), "unknown key", e.get("input"),
                       one_of(allowed), did_you_mean(loc[-1], allowed))
    user_path, tp = walk(loc, root)
    x = _Error(e["type"], user_path, tp, e.get("ctx") or {}, e.get("input"), e["msg"])
    handler = _TRANSLATE.get(x.kind)
    return handler(x) if handler else Problem(x.path, x.msg, x.got, _describe(tp))


def problems_from_validation(err: ValidationError, sources: Sources | None = None,
                             root: type[BaseModel] = Spec, prefix: Sequence[str | int] = ()
                             ) -> list[Problem]:
    """Translate every pydantic error into a `Problem`."""
    out: list[Problem] = []
    for e in err.errors(include_url=False):
        loc = list(prefix) + list(e["loc"])
        problem = _translate(e, loc, root)
        if sources is not None:
            problem = dataclasses.replace(problem, source=sources(problem.path))
        if out and out[-1].path == problem.path and e["type"] != "extra_forbidden" \
                and len(walk(loc, root)[0]) < len(loc):
            out[-1] = _either(out[-1], problem)  # one value against each member of a union
            continue
        if out and out[-1].problem == "wrong type" and problem.path.startswith(
                out[-1].path + "[") and len(walk(loc, root)[0]) < len(loc):
            out[-1] = problem  # the list member of a union took the value: its item is wrong
            continue
        out.append(problem)
    return out


def _either(a: Problem, b: Problem) -> Problem:
    """One problem for a value no member of a union accepts: the member whose type matched
    says why (e.g. not finite), else a wrong type with every member's expectation."""
    specific = [p for p in (a, b) if p.problem != "wrong type"]
    if specific:
        return specific[0]
    expected = a.expected if b.expected in a.expected else f"{a.expected} or {b.expected}"
    return Problem(a.path, a.problem, a.got, expected, a.suggestion, a.source)


def _from_value_error(error: object, user_path: Sequence[str | int], got: Any, msg: str
                      ) -> Problem:
    """A validator's `ProblemError` (its path is relative to the model at `user_path`)."""
    if isinstance(error, ProblemError):
        p = error.problem
        path = dotted([*user_path, *p.path.split(".")]) if p.path else dotted(user_path)
        return Problem(path, p.problem, p.got, p.expected, p.suggestion)
    return Problem(dotted(user_path), str(error) if error is not None else msg, got)
