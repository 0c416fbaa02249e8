"""Records as JSON data, one way for every record that crosses a boundary (a file, MLflow, a
flow result, the CLI's `--json`): pydantic serialises the record's fields, then the properties
marked `computed_field` (its derived values); fields marked `Field(exclude=True)` stay out. The
text a command prints and its `--json` come from the same record."""

from __future__ import annotations

import functools
import json
from collections.abc import Set
from typing import Any

import numpy as np
from pydantic import TypeAdapter


@functools.cache
def _adapter(tp: type[object]) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _numpy_scalar(value: Any) -> Any:
    """A numpy scalar that reached a record (from aggregation) as its Python value."""
    return value.item() if isinstance(value, np.generic) else value


def as_json(record: object, exclude: Set[str] | None = None) -> Any:
    """Plain JSON data of a record (a dataclass or pydantic model), or of a tuple or list of
    them: fields, then computed fields; non-finite floats become null (JSON has no inf or nan).
    `exclude`: top-level fields left out."""
    if isinstance(record, tuple | list):
        return [as_json(r, exclude) for r in record]
    adapter = _adapter(type(record))  # type: ignore[arg-type]  # (mypy: types are hashable)
    return json.loads(adapter.dump_json(record, warnings=False, fallback=_numpy_scalar,
                                        exclude=set(exclude) if exclude else None))
