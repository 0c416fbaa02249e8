"""Rows of one local data file: parquet, arrow (stream or file), csv, json or JSON lines.

Problems are raised as `Fail` naming `where` (the dotted path of the workload's source).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specflow.spec.errors import Problem, did_you_mean, one_of
from specflow.workloads.model import Fail

if TYPE_CHECKING:
    import pyarrow as pa

Row = dict[str, Any]
"""One record of a data file (column -> value)."""


def read_table(path: Path, columns: list[str], where: str, origin: str) -> list[Row]:
    """Rows of one data file (only `columns` for columnar formats)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        return read_jsonl(path, f"{where}.dataset")
    if suffix == ".json":
        return _read_json(path, where)
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    table, names = _read_arrow(path, columns, where, origin)
    missing = [c for c in columns if c not in names]
    if missing:
        which = "field" if missing[0] == columns[0] else "answer_field"
        raise Fail(Problem(f"{where}.{which}", f"no such column in {origin}", missing[0],
                           one_of(names), did_you_mean(missing[0], names)))
    rows: list[Row] = table.select(columns).to_pylist()
    return rows


def _read_arrow(path: Path, columns: list[str], where: str, origin: str
                ) -> tuple[pa.Table, list[str]]:
    """A parquet file (the present `columns` only, else all) or an arrow stream/file, and
    the names of all the columns the file has."""
    import pyarrow as pa

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            names = pq.ParquetFile(path).schema_arrow.names
            return pq.read_table(path, columns=[c for c in columns if c in names] or None), names
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
        return table, table.column_names
    except (pa.ArrowInvalid, OSError) as exc:
        raise Fail(Problem(f"{where}.dataset", f"cannot read {path.name} ({exc})", origin,
                           "readable parquet/arrow files")) from None


def _read_json(path: Path, where: str) -> list[Row]:
    """A JSON list of records (or an object holding one), else JSON lines."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return read_jsonl(path, f"{where}.dataset")
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else data
    if not isinstance(data, list):
        raise Fail(Problem(f"{where}.dataset", f"{path.name} is not a list of records",
                           type(data).__name__, "a JSON list of objects"))
    return [r for r in data if isinstance(r, dict)]


def read_jsonl(path: Path, where: str) -> list[Row]:
    """One JSON object per non-blank line."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Fail(Problem(where, f"line {i} of {path.name} is not JSON ({exc.msg})",
                                   line.strip()[:60], "one JSON object per line")) from None
            if not isinstance(row, dict):
                raise Fail(Problem(where, f"line {i} of {path.name} is not a JSON object",
                                   row, "one JSON object per line"))
            rows.append(row)
    return rows
