"""Compose conf/ with Hydra and validate it once into a `Spec`, collecting every problem.

Hydra does the composition (groups, multi-select, experiment overlays, overrides); this module
turns whatever goes wrong, in Hydra or in the schema, into `Problem` lines that name the dotted
field, the value, what is allowed, a did-you-mean and the file the value came from.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specflow.config.validation import (
    GROUPS,
    MULTI,
    Sources,
    fields_of,
    problems_from_validation,
    read_yaml,
    strip_optional,
    union_members,
    walk,
)
from specflow.spec.compile import Catalog, SweepPlan, compile_plan
from specflow.spec.errors import (
    Problem,
    Raw,
    SpecError,
    did_you_mean,
    one_of,
)
from specflow.spec.expand import expand
from specflow.spec.schema import Spec


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
    unresolved: dict[str, Any] = field(default_factory=dict, repr=False)
    """The composed config before interpolation (`${oc.env:...}` kept as text), for artifacts."""


class PartialSpecError(SpecError):
    """Bad overrides, the rest of the config valid: `partial` is the config without them, so
    that the cross-section checks can still report their problems in the same run."""

    def __init__(self, problems: Sequence[Problem], partial: Loaded):
        super().__init__(problems)
        self.partial = partial


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
            problems.append(Problem(f"override '{text}'", f"cannot parse ({first})", text,
                                    "key=value, group=option or group=[a,b]"))
            continue
        key = ov.key_or_group
        group = key.split("@", 1)[0]
        source = f"override {text}"
        if not _KEY.fullmatch(key):
            problems.append(Problem(f"override '{text}'", "malformed key", key,
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
        if group in GROUPS:  # ~group: drop a group from the defaults list
            good.append(text)
            continue
        entry = _entry_problem(key, text, root)
        if entry is not None:
            problems.append(entry)
            continue
        # added (+, ++) and deleted (~) keys too: a key the schema lacks is refused either way
        parts = key.split(".")
        unknown = _unknown_part(parts)
        if unknown is not None:
            i, allowed = unknown
            problems.append(Problem(".".join(parts[: i + 1]), "unknown key", _value(text),
                                    one_of(allowed), did_you_mean(parts[i], allowed), source))
            continue
        good.append(text)
    return problems, good


def _key(text: str) -> str:
    """The dotted key an override addresses (`+sweep.x=1` -> `sweep.x`)."""
    return text.split("=", 1)[0].lstrip("+~")


def _prefix(text: str) -> str:
    """How an override applies: '' (set), '+' (add), '++' (force-add) or '~' (delete)."""
    return text[: len(text) - len(text.lstrip("+~"))]


def _value(text: str) -> Raw:
    """An override's value as typed (the whole text for `~key`)."""
    return Raw(text.split("=", 1)[1] if "=" in text else text)


def _entry_problem(key: str, text: str, root: Path, chosen: Sequence[str] | None = None
                   ) -> Problem | None:
    """An override of a list-group entry (`drafter.<name>...`) naming an entry conf/ lacks or,
    given the `chosen` entries, one not selected: its value would be dropped without a word."""
    group, _, rest = key.partition(".")
    name = rest.split(".", 1)[0]
    if group not in MULTI or not name:
        return None
    known = options(group, root)
    source = f"override {text}"
    if name not in known:
        return Problem(f"{group}.{name}", f"unknown {group}", name, one_of(known),
                       did_you_mean(name, known), source)
    if chosen is None or name in chosen:
        return None
    return Problem(key, f"{group} {name!r} is not selected, so this override "
                   "would be ignored", _value(text), f"an entry of a selected {group}, "
                   f"{one_of(chosen)} (to select it: {group}=[{','.join([*chosen, name])}])",
                   source=source)


def _unselected(overrides: Sequence[str], root: Path, choices: dict[str, Any]) -> list[Problem]:
    """Command-line overrides of list-group entries that are not selected. (An experiment may
    tune entries it does not select; only what the user typed is flagged.)"""
    out: list[Problem] = []
    for text in overrides:
        group = _key(text).partition(".")[0]
        if group in MULTI and _prefix(text) != "~":
            chosen = selected(group, root, choices, overrides)
            problem = _entry_problem(_key(text), text, root, chosen or [])
            if problem is not None and chosen is not None:
                out.append(problem)
    return out


_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*(/[\w-]+)*(@[\w.]+)?")


def _unknown_part(parts: Sequence[str]) -> tuple[int, list[str]] | None:
    """Index of the first path part the schema does not know, with what it allows there."""
    tp: Any = Spec
    for i, part in enumerate(parts):
        tp = strip_optional(tp)
        names = fields_of(tp)
        if names:
            if part not in names:
                return i, names
            members = union_members(tp) or [tp]
            tp = next(m.model_fields[part].annotation for m in members if part in m.model_fields)
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return None


class _Refused(Exception):
    """Hydra, or the YAML reader under it, refused to compose; `cause` is what it raised."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _compose(overrides: Sequence[str], root: Path) -> tuple[Any, dict]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(root), version_base=None, job_name="specflow"):
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, OSError, ValueError,
            TypeError, KeyError, IndexError, AssertionError) as exc:
        # AssertionError: Hydra asserts on some malformed overrides instead of raising its own.
        raise _Refused(exc) from exc
    finally:
        GlobalHydra.instance().clear()
    return cfg, dict(cfg.hydra.runtime.choices)


def _chain(exc: BaseException) -> list[BaseException]:
    """An exception and the ones it was raised from."""
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _reason(exc: BaseException) -> str:
    """What the exceptions of the chain say, first lines only, each once."""
    said: list[str] = []
    for e in _chain(exc):
        first = str(e).strip().splitlines()[0].rstrip(": ") if str(e).strip() else ""
        if first and first != "None" and not any(first in line for line in said):
            said.append(first)
    return ": ".join(said) or type(exc).__name__


# (message pattern naming the key, how the override applies)
_REFUSALS = [
    (re.compile(r"Could not override '([^']+)'"), ""),
    (re.compile(r"Could not append to config\. An item is already at '([^']+)'"), "+"),
    (re.compile(r"Could not delete from config\. '([^']+)' does not exist"), "~"),
    (re.compile(r"Could not delete from config\. The value of '([^']+)' is"), "~"),
    (re.compile(r"Could not delete '([^']+)'"), "~"),
    (re.compile(r"force-add of config groups is not supported: '\+\+([^=']+)"), "++"),
]


_NOT_FOUND = re.compile(r"Could not (?:find|load) '([^']+)'")


def _culprit(exc: BaseException, overrides: Sequence[str], root: Path) -> str | None:
    """The override Hydra refused; None when the conf files themselves do not compose."""
    if _file_problem(exc, root) is not None:
        return None
    text = "\n".join(str(e) for e in _chain(exc))
    for pattern, prefix in _REFUSALS:
        m = pattern.search(text)
        found = [o for o in overrides if m and _key(o) == m.group(1) and _prefix(o) == prefix]
        if found:
            return found[-1]
    m = _NOT_FOUND.search(text)
    found = [o for o in overrides if m and _key(o) == m.group(1).rpartition("/")[0]]
    if found:
        return found[-1]
    # the message does not say: the first override that makes composition fail
    for i in range(len(overrides) + 1):
        try:
            _compose(overrides[:i], root)
        except _Refused:
            return overrides[i - 1] if i else None
    return None


def _compose_problem(exc: BaseException, culprit: str | None, root: Path,
                     choices: dict[str, Any], overrides: Sequence[str]) -> Problem:
    """One line for a refusal: the override's key (or the conf file), why, and what would do."""
    found = _file_problem(exc, root)
    if found is not None:
        return found
    text = "\n".join(str(e) for e in _chain(exc))
    where = _named_file(text, root)
    source = f"override {culprit}" if culprit else where
    m = _NOT_FOUND.search(text)
    if m and m.group(1).rpartition("/")[0] in GROUPS:
        group, _, name = m.group(1).rpartition("/")
        known = options(group, root)
        return Problem(group, f"unknown {group}", name, one_of(known), did_you_mean(name, known),
                       source)
    if m:
        return Problem(where or "conf", "the defaults list names a config that does not exist",
                       m.group(1), f"group: option, with group {one_of(GROUPS)}", source=source)
    if culprit is None or (where and _key(culprit) in GROUPS):  # the file, not the override
        return Problem(where or "conf", f"cannot compose ({_reason(exc)})",
                       Raw(culprit) if culprit else Raw("nothing"),
                       "a mapping of config keys (and a defaults list of group choices)",
                       source=source or where)
    key, value = _key(culprit), _value(culprit)
    prefix = _prefix(culprit)
    if prefix == "+" and "Could not append" in text:
        return Problem(key, "already set, so '+' cannot add it", value,
                       f"'{key}=...' to change it, or '++{key}=...' to set it either way",
                       source=source)
    if prefix == "~":
        m = re.search(r"The value of '[^']+' is (.*) and not (.*)\.", text)
        if m:
            return Problem(key, f"cannot delete: its value is {m.group(1)}, not {m.group(2)}",
                           value, f"'~{key}' (whatever its value) or '~{key}={m.group(1)}'",
                           source=source)
        if key in GROUPS:
            return Problem(key, "cannot delete this group from the defaults list", value,
                           f"'{key}=...' to choose other entries", source=source)
        return Problem(key, "nothing to delete: the key is not set", value,
                       "a key the composed config has (see --cfg job)", source=source)
    if prefix == "++" and "force-add" in text:
        return Problem(key, "'++' cannot force-add a config group", value,
                       f"'{key}=<option>' or '+{key}=<option>'", source=source)
    if "Could not override" in text:
        return _not_overridable(key, culprit, root, choices, overrides)
    if "Ambiguous value" in text:  # Hydra's sweep syntax outside a multirun
        return Problem(key, "several values for one run", value,
                       f"one value, or -m / --multirun to run once per value of {key}",
                       source=source)
    return Problem(key, f"cannot apply ({_reason(exc)})", value,
                   "an override that fits the composed config", source=source)


def _not_overridable(key: str, text: str, root: Path, choices: dict[str, Any],
                     overrides: Sequence[str]) -> Problem:
    """`key=value` where the composed config has no `key`."""
    source = f"override {text}"
    value = _value(text)
    parts = key.split(".")
    group = parts[0].split("@", 1)[0]
    if "@" in parts[0]:
        return Problem(group, f"no {group} at package {parts[0].split('@', 1)[1]!r} in the "
                       "defaults list", value, f"'+{key}=<option>' to add one", source=source)
    if group in MULTI:
        chosen = selected(group, root, choices, overrides) or []
        entry = _entry_problem(key, text, root, chosen)
        if entry is not None:
            return entry
    unknown = _unknown_part(parts)
    if unknown is not None:
        i, allowed = unknown
        return Problem(".".join(parts[: i + 1]), "unknown key", value, one_of(allowed),
                       did_you_mean(parts[i], allowed), source)
    if typing.get_origin(strip_optional(walk(parts)[1])) is dict:
        return Problem(key, "adds entries to a mapping, which a plain override cannot do", value,
                       f"'++{key}=...' (replace) or '+{key}.<name>=...' (add one entry)",
                       source=source)
    return Problem(key, "not set in the composed config, so a plain override cannot change it",
                   value, f"'+{key}=...' to add it", source=source)


def _named_file(text: str, root: Path) -> str:
    """The conf file a Hydra message names (`In 'experiment/x': ...`), as conf/experiment/x.yaml."""
    for name in re.findall(r"'([\w./-]+)'", text):
        if (root / f"{name}.yaml").is_file():
            return f"conf/{name}.yaml"
    return ""


def _conf_name(path: str | Path, root: Path) -> str:
    try:
        return "conf/" + Path(path).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return str(path)


def _file_problem(exc: BaseException, root: Path) -> Problem | None:
    """A conf file that is not YAML (or not text), named with its line and column."""
    for e in _chain(exc):
        if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
            return _yaml_problem(e, root)
        if isinstance(e, UnicodeDecodeError):
            return _undecodable(root)
    return None


def _yaml_problem(e: yaml.MarkedYAMLError, root: Path) -> Problem:
    mark = e.problem_mark
    assert mark is not None
    name = _conf_name(mark.name, root)
    what = e.problem or "malformed"
    if e.context and e.context_mark is not None and e.context_mark.line != mark.line:
        what += (f" ({e.context} at line {e.context_mark.line + 1}, "
                 f"column {e.context_mark.column + 1})")
    try:
        lines = Path(mark.name).read_text(encoding="utf-8", errors="replace").splitlines()
        line: Any = lines[mark.line].rstrip() if mark.line < len(lines) else Raw("end of file")
    except OSError:
        line = Raw("nothing readable")
    if "duplicate key" in what:
        expected = "each key at most once in a mapping"
    elif "constructor for the tag" in what:
        expected = "plain YAML values (no !! tags)"
    elif "'\\t'" in what:
        expected = "spaces for indentation, never tabs"
    else:
        expected = "valid YAML (consistent indentation, closed brackets and quotes)"
    return Problem(f"{name}:{mark.line + 1}:{mark.column + 1}", f"invalid YAML: {what}", line,
                   expected, source=name)


def _undecodable(root: Path) -> Problem | None:
    """The first conf file that is not UTF-8, with the line and column of the bad byte."""
    for path in sorted(root.rglob("*.yaml")):
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except OSError:
            continue
        except UnicodeDecodeError as u:
            line = data.count(b"\n", 0, u.start) + 1
            column = u.start - (data.rfind(b"\n", 0, u.start) + 1) + 1
            name = _conf_name(path, root)
            return Problem(f"{name}:{line}:{column}", f"not UTF-8 text ({u.reason})",
                           Raw(f"byte 0x{data[u.start]:02x}"), "a UTF-8 text file", source=name)
    return None


def compose_raw(overrides: Sequence[str], root: Path) -> tuple[Any, dict]:
    """Compose conf/ with Hydra; returns (DictConfig with hydra node, choices)."""
    try:
        return _compose(overrides, root)
    except _Refused as refused:
        culprit = _culprit(refused.cause, overrides, root)
        raise SpecError([_compose_problem(refused.cause, culprit, root, {}, overrides)]
                        ) from None


def _compose_what_composes(overrides: Sequence[str], root: Path
                           ) -> tuple[Any, dict, list[str], list[Problem]]:
    """Compose; an override Hydra refuses becomes a problem and the rest is composed again
    without it, so the other overrides are still checked in the same run. Returns the config,
    the choices, the overrides composed and the problems of those refused."""
    todo = list(overrides)
    refused: list[tuple[str, BaseException]] = []
    while True:
        try:
            cfg, choices = _compose(todo, root)
            break
        except _Refused as exc:
            culprit = _culprit(exc.cause, todo, root)
            if culprit is None:  # the conf files themselves: nothing more can be checked
                raise SpecError([
                    *(_compose_problem(e, c, root, {}, overrides) for c, e in refused),
                    _compose_problem(exc.cause, None, root, {}, todo)]) from None
            refused.append((culprit, exc.cause))
            todo.remove(culprit)
    return cfg, choices, todo, [_compose_problem(e, c, root, choices, todo) for c, e in refused]


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
        data = read_yaml(path)
        defaults = data.get("defaults") if isinstance(data, dict) else None
        for item in defaults if isinstance(defaults, list) else []:
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
    if not data.get("experiment"):  # content under `experiment:` is an unknown key
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
        cfg, choices, composed, refused = _compose_what_composes(good, root)
        problems += refused + _unselected(composed, root, choices)
        sources = Sources(root, choices, overrides)
        data = to_plain(cfg, choices, sources)
    except SpecError as err:
        raise SpecError(problems + err.problems) from None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems + problems_from_validation(err, sources)) from None
    try:
        spec = expand(spec)  # split traces, services as workloads
    except SpecError as err:
        raise SpecError(problems + err.problems) from None
    from omegaconf import OmegaConf

    unresolved = OmegaConf.to_container(cfg, resolve=False)  # to_plain removed Hydra's node
    loaded = Loaded(spec, choices, overrides, data, unresolved)
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
    earlier += _copy_remote_models(loaded.spec)
    try:
        plan = compile_plan(loaded.spec, catalog(root))
    except SpecError as err:
        raise SpecError(earlier + [Problem(p.path, p.problem, p.got, p.expected, p.suggestion,
                                           _best_source(sources, p)) for p in err.problems]
                        ) from None
    if earlier:
        raise SpecError(earlier)
    return loaded, plan


def model_locations(spec: Spec) -> dict[str, str]:
    """Every model location of a spec by its dotted field (target, tokenizer, checkpoints)."""
    out = {"target.model": spec.target.model}
    if spec.target.tokenizer:
        out["target.tokenizer"] = spec.target.tokenizer
    for name, d in spec.drafter.items():
        for cname, c in d.checkpoints.items():
            out[f"drafter.{name}.checkpoints.{cname}.model"] = c.model
    return out


def _copy_remote_models(spec: Spec) -> list[Problem]:
    """The small files of every model kept at a URL, copied to this node (`records.models`):
    what compiling (a drafter's architecture) and tokenizing prompts read. A store that refuses
    or has no model there is a problem naming the field."""
    from specflow.records import models
    from specflow.records.store import StoreError, shown
    from specflow.spec.locations import is_url

    out = []
    for field_, location in model_locations(spec).items():
        if not is_url(location):
            continue
        try:
            models.fetch(location, weights=False, setting=field_)
        except (StoreError, OSError) as exc:
            out.append(Problem(field_, str(exc).removeprefix(f"{field_}: ")
                               .removeprefix(f"{shown(location)}: "), shown(location),
                               "a directory of a model (its config.json) that this process "
                               "can read"))
    return out


def _best_source(sources: Sources, p: Problem) -> str:
    found = sources(p.path)
    return found if found.startswith(("override", "conf/experiment")) or not p.source else p.source
