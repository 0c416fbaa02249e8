"""The configuration as a run artifact (MLflow's `config.yaml`), holding no secret.

Made from the composed config before interpolation: resolver calls such as `${oc.env:NAME}` stay
as their text, so nothing read from the process environment is written, while references to
other keys (`${paths.models}/qwen3`) are followed so the artifact still shows what ran. Every
`backend.env` value is replaced by `<redacted>`; the variable names stay.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from specflow.config.compose import Loaded

REDACTED = "<redacted>"
"""What a `backend.env` value becomes in the artifact."""

_RESOLVER_CALL = re.compile(r"(?<!\\)\$\{(?=\s*[\w.-]+\s*:)")
"""The `${` of a resolver call (`${oc.env:X}`), as opposed to a key reference (`${a.b}`)."""

_ABSENT = object()


def _escape_resolvers(node: Any) -> Any:
    """Every resolver call escaped (`\\${...}`): resolving then yields its text, not its value."""
    if isinstance(node, dict):
        return {k: _escape_resolvers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_escape_resolvers(v) for v in node]
    return _RESOLVER_CALL.sub(r"\\${", node) if isinstance(node, str) else node


def _references_followed(unresolved: dict[str, Any]) -> Any:
    """`unresolved` with key references resolved and resolver calls kept as text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(_escape_resolvers(unresolved)),
                                      resolve=True)
    except OmegaConfBaseException:  # a reference that cannot be followed: every one as text
        return unresolved


def _shaped(shape: Any, text: Any) -> Any:
    """`text` cut to the keys of `shape` (the validated config); keys only `shape` has (names
    filled in from the choices) keep their value there."""
    if text is _ABSENT:
        return shape
    if isinstance(shape, dict) and isinstance(text, dict):
        return {k: _shaped(v, text.get(k, _ABSENT)) for k, v in shape.items()}
    if isinstance(shape, list) and isinstance(text, list) and len(shape) == len(text):
        return [_shaped(s, t) for s, t in zip(shape, text, strict=True)]
    return text


def artifact_config(loaded: Loaded) -> str:
    """The run's configuration as YAML, safe to log (see the module docstring)."""
    out = _shaped(loaded.raw, _references_followed(loaded.unresolved))
    backend = out.get("backend")
    if isinstance(backend, dict) and isinstance(backend.get("env"), dict):
        backend["env"] = {name: REDACTED for name in backend["env"]}
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True, default_flow_style=False)
