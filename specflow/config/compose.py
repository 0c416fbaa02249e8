"""Compose conf/ with Hydra and validate it once into a `Spec`, collecting every problem.

Hydra does the composition (groups, multi-select, experiment overlays, overrides); this module
turns whatever goes wrong, in Hydra or in the schema, into `Problem` lines that name the dotted
field, the value, what is allowed, a did-you-mean and the file the value came from.
"""

from __future__ import annotations

import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from specflow.core.compile import Catalog, SweepPlan, compile_plan
from specflow.core.errors import Problem, ProblemError, Raw, SpecError, did_you_mean, one_of
from specflow.core.schema import Spec

GROUPS = ("target", "drafter", "hardware", "workload", "sweep", "promote", "backend", "experiment")
"""Config groups under conf/."""
MULTI = ("drafter", "workload")
"""Groups selected as lists; each file nests its content under its own name."""


def conf_dir() -> Path:
    """The conf/ directory: $SPECFLOW_CONF, else the one shipped in the package (`specflow/conf`,
    a link to the source tree's conf/ in a checkout, a copy of it in an installed wheel)."""
    env = os.environ.get("SPECFLOW_CONF")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "conf"
    if not (path / "config.yaml").is_file():
        raise SpecError([Problem("conf", "no config.yaml found", str(path), "a conf/ directory")])
    return path


def options(group: str, root: Path | None = None) -> list[str]:
    """Names of the entries of a config group."""
    folder = (root or conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


@dataclass(frozen=True)
class Loaded:
    """A validated spec plus where its values came from."""

    spec: Spec
    choices: dict[str, Any]
    overrides: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False)


class PartialSpecError(SpecError):
    """Bad overrides, the rest of the config valid: `partial` is the config without them, so
    that the cross-section checks can still report their problems in the same run."""

    def __init__(self, problems: Sequence[Problem], partial: Loaded):
        super().__init__(problems)
        self.partial = partial


# --------------------------------------------------------------------------------------------
# Where a value came from


@dataclass(frozen=True)
class Sources:
    """Maps a dotted path to the conf file (or override) it came from."""

    root: Path
    choices: dict[str, Any]
    overrides: tuple[str, ...]

    def __call__(self, path: str) -> str:
        for ov in self.overrides:
            key = ov.split("=", 1)[0].lstrip("+~")
            if "=" in ov and key not in GROUPS and (
                path == key or path.startswith((key + ".", key + "[")) or key.startswith(path + ".")
            ):
                return f"override {ov}"
        experiment = self.choices.get("experiment")
        overlay = self.root / "experiment" / f"{experiment}.yaml"
        if experiment and _has_path(_read_yaml(overlay), path):
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


def _read_yaml(path: Path) -> Any:
    try:
        return _read_yaml_cached(str(path), path.stat().st_mtime)
    except (OSError, yaml.YAMLError):
        return None


def _has_path(data: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


# --------------------------------------------------------------------------------------------
# Schema walking (for unknown keys and did-you-mean)


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _strip_optional(args[0])
    if origin is typing.Annotated:
        return _strip_optional(typing.get_args(tp)[0])
    return tp


def _union_members(tp: Any) -> list[type[BaseModel]]:
    tp = _strip_optional(tp)
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
        tp = _strip_optional(tp)
        members = _union_members(tp)
        if members:
            by_tag = {_tag(m): m for m in members}
            if part in by_tag:
                tp = by_tag[part]
                i += 1
                continue
            tp = members[0]
        origin = typing.get_origin(tp)
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
    tp = _strip_optional(tp)
    is_model = isinstance(tp, type) and issubclass(tp, BaseModel)
    members = _union_members(tp) or ([tp] if is_model else [])
    names: list[str] = []
    for m in members:
        names.extend(n for n in m.model_fields if n not in names)
    return names


def dotted(parts: Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --------------------------------------------------------------------------------------------
# pydantic errors -> problems


def _describe(tp: Any) -> str:
    tp = _strip_optional(tp)
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


def problems_from_validation(err: ValidationError, sources: Sources | None = None,
                             root: type[BaseModel] = Spec, prefix: Sequence[str | int] = ()
                             ) -> list[Problem]:
    """Translate every pydantic error into a `Problem`."""
    out: list[Problem] = []
    for e in err.errors(include_url=False):
        loc = list(prefix) + list(e["loc"])
        kind = e["type"]
        ctx = e.get("ctx") or {}
        got = e.get("input")
        if kind == "extra_forbidden":
            parent_path, parent_tp = walk(loc[:-1], root)
            allowed = fields_of(parent_tp)
            path = dotted([*parent_path, loc[-1]])
            problem = Problem(path, "unknown key", got, one_of(allowed),
                              did_you_mean(loc[-1], allowed))
        else:
            user_path, tp = walk(loc, root)
            path = dotted(user_path)
            if kind == "missing":
                problem = Problem(path, "required field is missing", expected=_describe(tp))
            elif kind == "literal_error":
                allowed = typing.get_args(_strip_optional(tp)) or ()
                problem = Problem(path, "not an allowed value", got,
                                  ctx.get("expected", one_of(allowed)), did_you_mean(got, allowed))
            elif kind in ("union_tag_invalid", "union_tag_not_found"):
                tags = [_tag(m) for m in _union_members(tp)]
                field_name = ctx.get("discriminator", "'kind'").strip("'")
                path = dotted([*user_path, field_name])
                got = got.get(field_name) if isinstance(got, dict) else got
                problem = Problem(path, "unknown kind" if kind == "union_tag_invalid"
                                  else "missing kind", got, one_of(tags), did_you_mean(got, tags))
            elif kind in _RANGE:
                bound = next(iter(ctx.values()), "")
                problem = Problem(path, "out of range", got, f"a value {_RANGE[kind]} {bound}")
            elif kind in ("too_short", "string_too_short"):
                n = ctx.get("min_length", 1)
                what = "character" if kind == "string_too_short" else "item"
                plural = "s" if n != 1 else ""
                problem = Problem(path, "too short", got, f"at least {n} {what}{plural}")
            elif kind == "too_long":
                problem = Problem(path, "too long", got, f"at most {ctx.get('max_length')} items")
            elif kind == "string_pattern_mismatch":
                problem = Problem(path, "malformed", got, f"a string matching {ctx.get('pattern')}")
            elif kind in _TYPES:
                problem = Problem(path, "wrong type", got, _TYPES[kind])
            elif kind == "value_error":
                problem = _from_value_error(ctx.get("error"), user_path, got, e["msg"])
            else:
                problem = Problem(path, e["msg"], got, _describe(tp))
        if sources is not None:
            problem = Problem(problem.path, problem.problem, problem.got, problem.expected,
                              problem.suggestion, sources(problem.path))
        out.append(problem)
    return out


def _from_value_error(error: object, user_path: Sequence[str | int], got: Any, msg: str
                      ) -> Problem:
    """A validator's `ProblemError` (its path is relative to the model at `user_path`)."""
    if isinstance(error, ProblemError):
        p = error.problem
        path = dotted([*user_path, *p.path.split(".")]) if p.path else dotted(user_path)
        return Problem(path, p.problem, p.got, p.expected, p.suggestion)
    return Problem(dotted(user_path), str(error) if error is not None else msg, got)


# --------------------------------------------------------------------------------------------
# Overrides: checked before Hydra so that every bad one is reported, not just the first


def _check_overrides(overrides: Sequence[str], root: Path) -> tuple[list[Problem], list[str]]:
    """Problems with the overrides themselves, and the overrides that are fine to compose."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    problems: list[Problem] = []
    good: list[str] = []
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (ov,) = parser.parse_overrides([text])
        except OverrideParseException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
            problems.append(Problem(f"override {text!r}", f"cannot parse ({first})", text,
                                    "key=value, group=option or group=[a,b]"))
            continue
        key = ov.key_or_group
        group = key.split("@", 1)[0]
        source = f"override {text}"
        if not _KEY.fullmatch(key):
            problems.append(Problem(f"override {text!r}", "malformed key", key,
                                    "a dotted key such as sweep.repeats", source=source))
            continue
        if group in GROUPS and not ov.is_delete():
            value = ov.value()
            chosen = value if isinstance(value, list) else [value]
            known = options(group, root)
            if group not in MULTI and isinstance(value, list):
                problems.append(Problem(group, "takes a single option", value, one_of(known),
                                        source=source))
                continue
            bad = [Problem(group, f"unknown {group}", item, one_of(known),
                           did_you_mean(item, known), source)
                   for item in chosen
                   if not (item is None and group == "experiment")
                   and (not isinstance(item, str) or item not in known)]
            problems.extend(bad)
            if not bad:
                good.append(text)
            continue
        if "/" in group:
            problems.append(Problem(group, "unknown config group", key, one_of(GROUPS),
                                    did_you_mean(group.split("/")[0], GROUPS), source))
            continue
        if ov.is_add() or ov.is_force_add() or ov.is_delete():
            good.append(text)  # new keys are checked by the schema after composition
            continue
        parts = key.split(".")
        unknown = _unknown_part(parts)
        if unknown is not None:
            i, allowed = unknown
            problems.append(Problem(".".join(parts[: i + 1]), "unknown key",
                                    Raw(text.split("=", 1)[-1]), one_of(allowed),
                                    did_you_mean(parts[i], allowed), source))
            continue
        good.append(text)
    return problems, good


_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*(/[\w-]+)*(@[\w.]+)?")


def _unknown_part(parts: Sequence[str]) -> tuple[int, list[str]] | None:
    """Index of the first path part the schema does not know, with what it allows there."""
    tp: Any = Spec
    for i, part in enumerate(parts):
        tp = _strip_optional(tp)
        names = fields_of(tp)
        if names:
            if part not in names:
                return i, names
            members = _union_members(tp) or [tp]
            tp = next(m.model_fields[part].annotation for m in members if part in m.model_fields)
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return None


def _hydra_problem(exc: Exception, overrides: Sequence[str]) -> Problem:
    """Translate a Hydra composition failure into one problem line."""
    text = str(exc)
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        key = m.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key), None)
        parent_path, parent_tp = walk(key.split(".")[:-1])
        allowed = fields_of(parent_tp)
        if key.split(".")[0] in MULTI and _unknown_part(key.split(".")) is None:
            return Problem(key, f"{key.split('.')[1]!r} is not selected", Raw(value or ""),
                           f"a key of a selected {key.split('.')[0]} (select it with "
                           f"{key.split('.')[0]}=[...])", source=f"override {key}={value}")
        leaf = key.split(".")[-1]
        if _unknown_part(key.split(".")) is None:
            return Problem(key, "adds entries to a mapping, which a plain override cannot do",
                           Raw(value or ""), f"'++{key}=...' (replace) or "
                           f"'+{key}.<name>=...' (add one entry)", source=f"override {key}={value}")
        return Problem(key, "unknown key", Raw(value or ""), one_of(allowed) if allowed else
                       "an existing key (use +key=value to add one)",
                       did_you_mean(leaf, allowed), f"override {key}={value}")
    m = re.search(r"Could not find '([^']+)'", text)
    if m:
        group, _, name = m.group(1).rpartition("/")
        known = options(group) if group in GROUPS else []
        return Problem(group or m.group(1), f"unknown {group or 'config'}", name, one_of(known),
                       did_you_mean(name, known))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return Problem("conf", f"cannot compose ({first})", list(overrides), "a composable config")


# --------------------------------------------------------------------------------------------
# Entry point


def compose_raw(overrides: Sequence[str], root: Path) -> tuple[Any, dict]:
    """Compose conf/ with Hydra; returns (DictConfig with hydra node, choices)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None, job_name="specflow"):
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError, AssertionError) as exc:
        # AssertionError: Hydra asserts on some malformed overrides instead of raising its own.
        raise SpecError([_hydra_problem(exc, overrides)]) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg, dict(cfg.hydra.runtime.choices)


def _listed(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return None


def selected(group: str, root: Path, choices: dict[str, Any], overrides: Sequence[str]
             ) -> list[str] | None:
    """Entries chosen for a list group: the command line, else the experiment, else config.yaml."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in reversed(list(overrides)):
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException:
            continue
        if ov.key_or_group == group and not ov.is_delete():
            return _listed(ov.value())
    files = []
    if isinstance(choices.get("experiment"), str):
        files.append(root / "experiment" / f"{choices['experiment']}.yaml")
    files.append(root / "config.yaml")
    for path in files:
        data = _read_yaml(path) or {}
        for item in data.get("defaults") or []:
            if isinstance(item, dict):
                for key, value in item.items():
                    if key.replace("override ", "").strip().lstrip("/") == group:
                        return _listed(value)
    return None


def to_plain(cfg: Any, choices: dict[str, Any], sources: Sources) -> dict[str, Any]:
    """Resolve interpolations and strip Hydra's node; unresolved values become problems."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise SpecError([Problem(key, "mandatory value not set", "???", "a value",
                                     source=sources(key)) for key in missing])
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "conf"
        first = str(exc).strip().splitlines()[0]
        raise SpecError([Problem(key, f"cannot resolve interpolation ({first})",
                                 expected="an interpolation of an existing key",
                                 source=sources(key))]) from None
    assert isinstance(data, dict)
    data.pop("hydra", None)
    data.pop("experiment", None)
    for group in ("target", "hardware"):
        if isinstance(data.get(group), dict) and isinstance(choices.get(group), str):
            data[group].setdefault("name", choices[group])
    for group in MULTI:
        data.setdefault(group, {})
        if data[group] is None:
            data[group] = {}
        chosen = selected(group, sources.root, choices, sources.overrides)
        if chosen is not None:
            # an experiment may tune entries it selects; drop its tuning of entries it doesn't
            data[group] = {k: v for k, v in data[group].items() if k in chosen}
    return data


def load(overrides: Sequence[str] = (), root: Path | None = None) -> Loaded:
    """Compose and validate; raises `SpecError` listing every problem found."""
    root = root or conf_dir()
    overrides = tuple(overrides)
    problems, good = _check_overrides(overrides, root)
    try:
        cfg, choices = compose_raw(good, root)
        sources = Sources(root, choices, overrides)
        data = to_plain(cfg, choices, sources)
    except SpecError as err:
        raise SpecError(problems + err.problems) from None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems + problems_from_validation(err, sources)) from None
    loaded = Loaded(spec, choices, overrides, data)
    if problems:
        raise PartialSpecError(problems, loaded)
    return loaded


def catalog(root: Path | None = None) -> Catalog:
    """Names of every target and drafter entry in conf/ (for cross-checks)."""
    root = root or conf_dir()
    return Catalog(targets=tuple(options("target", root)), drafters=tuple(options("drafter", root)))


def load_plan(overrides: Sequence[str] = (), root: Path | None = None
              ) -> tuple[Loaded, SweepPlan]:
    """Compose, validate and compile; every problem carries the file or override it came from."""
    root = root or conf_dir()
    earlier: list[Problem] = []
    try:
        loaded = load(overrides, root)
    except PartialSpecError as err:
        loaded, earlier = err.partial, err.problems
    sources = Sources(root, loaded.choices, loaded.overrides)
    try:
        plan = compile_plan(loaded.spec, catalog(root))
    except SpecError as err:
        raise SpecError(earlier + [Problem(p.path, p.problem, p.got, p.expected, p.suggestion,
                                           _best_source(sources, p)) for p in err.problems]
                        ) from None
    if earlier:
        raise SpecError(earlier)
    return loaded, plan


def _best_source(sources: Sources, p: Problem) -> str:
    found = sources(p.path)
    return found if found.startswith(("override", "conf/experiment")) or not p.source else p.source
