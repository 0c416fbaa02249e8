"""`specflow compare A B`: find the two sweeps, compare them (`specflow.decision.compare`) and
show the comparison (a console table, Markdown).

A and B are each one of:
- a sweep id (under `<tracking.workdir>/sweeps/`, a directory or an object store's prefix) or
  a sweep directory's path or URL (`s3://bucket/prefix/sweeps/<id>`);
- an MLflow parent run id: its sweep's local ledger when this machine has it, else the windows
  its child runs logged (`measurement.json`) and its `pin.*` tags;
- `champion:CLASS` (the current champion of a traffic class) or `champion:CLASS@VERSION` (a
  version in its history): the sweep it was decided on.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specflow.decision.compare import Change, Comparison, SweepSide
from specflow.records.measurement import MEASUREMENT, Measurement
from specflow.records.store import is_url, shown
from specflow.results.ledger import Ledger, is_sweep, sweep_ids
from specflow.spec.errors import Problem, SpecError
from specflow.spec.serialize import as_json

EXIT_REGRESSION = 3
"""Exit code of `compare` when some row regressed beyond noise."""
EXIT_NOT_COMPARABLE = 4
"""Exit code of `compare` when nothing could be compared (no common point, or the workload
changed at every common point)."""

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
CHAMPION_PREFIX = "champion:"


def _from_ledger(label: str, ledger: Ledger) -> SweepSide:
    info = ledger.info()
    return SweepSide(label, tuple(ledger.measurements()), info.pins if info else {},
                     info.measured if info else {}, info.repeats if info else None, ledger.sid)


def _champion(ref: str, output_dir: str, workdir: str, what: str) -> SweepSide:
    from specflow.champions import promote

    spec = ref[len(CHAMPION_PREFIX):]
    cls, _, version = spec.partition("@")
    if not promote.is_plain_name(cls) or (version and not promote.is_plain_name(version)):
        raise SpecError([Problem(what, "not a plain traffic class (and version)", ref,
                                 f"champion:CLASS or champion:CLASS@VERSION ({promote.PLAIN})")])
    store = promote.class_store(output_dir, cls)
    key = promote.history_key(version) if version else promote.CHAMPION
    if not store.exists(key):
        known = promote.history(output_dir, cls)
        raise SpecError([Problem(what, "no such champion", ref,
                                 f"a version of {cls}: {', '.join(known)}" if known else
                                 f"a class promoted under {shown(output_dir)}")])
    record = promote.GatedRecord.model_validate_json(store.read_bytes(key))
    sid = record.sweep_id if record is not None else None
    if not sid:
        raise SpecError([Problem(what, "the champion does not name the sweep it was decided on "
                                 "(promoted before champions recorded it)", ref,
                                 "a sweep id or an MLflow run id")])
    if not is_sweep(workdir, sid):
        raise SpecError([Problem(what, f"its sweep {sid} is not under {workdir}/sweeps", ref,
                                 "the tracking.workdir the sweep ran in")])
    return _from_ledger(f"{ref} (sweep {sid})", Ledger(workdir, sid))


def _from_mlflow(ref: str, tracking_uri: str, workdir: str) -> SweepSide | None:
    """The sweep of an MLflow parent run: its local ledger, else its logged windows."""
    from specflow.results.tracking import KIND_TAG, SWEEP_TAG, mlflow_client

    client = mlflow_client(tracking_uri)
    try:
        run = client.get_run(ref)
    except Exception:  # noqa: BLE001 - no such run or no store: not this kind of reference
        return None
    if run.data.tags.get(KIND_TAG) != "sweep":
        return None
    sid = run.data.tags.get(SWEEP_TAG, "")
    if sid and is_sweep(workdir, sid):
        return _from_ledger(f"run {ref} (sweep {sid})", Ledger(workdir, sid))
    pins = {k[len("pin."):]: v for k, v in run.data.tags.items() if k.startswith("pin.")}
    children = client.search_runs(
        [run.info.experiment_id], max_results=10000,
        filter_string=f"tags.`mlflow.parentRunId` = '{ref}' and tags.`{KIND_TAG}` = 'window'")
    ms: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp:
        for child in children:
            path = client.download_artifacts(child.info.run_id, "measurement.json", tmp)
            ms.append(MEASUREMENT.validate_json(Path(path).read_bytes()))
    repeats = run.data.params.get("repeats")
    return SweepSide(f"run {ref} (sweep {sid}, from MLflow)", tuple(ms), pins, {},
                     int(repeats) if repeats and repeats.isdigit() else None, sid)


def resolve(ref: str, what: str, *, workdir: str | Path, tracking_uri: str,
            output_dir: str | Path) -> SweepSide:
    """One side of a comparison from its reference (see the module docstring); SpecError
    (exit 2) naming what was looked for when nothing matches."""
    workdir = str(workdir) if is_url(workdir) else str(Path(workdir).resolve())
    output_dir = str(output_dir)
    if ref.startswith(CHAMPION_PREFIX):
        return _champion(ref, output_dir, workdir, what)
    if is_url(ref):
        root, _, sid = ref.rstrip("/").rpartition("/")
        if root.endswith("/sweeps") and is_sweep(root.removesuffix("/sweeps"), sid):
            return _from_ledger(ref, Ledger(root.removesuffix("/sweeps"), sid))
    else:
        path = Path(ref).expanduser()
        if (path / "windows").is_dir():
            path = path.resolve()
            return _from_ledger(ref, Ledger(path.parent.parent, path.name))
    if "/" not in ref and is_sweep(workdir, ref):
        return _from_ledger(ref, Ledger(workdir, ref))
    if _RUN_ID.match(ref):
        found = _from_mlflow(ref, tracking_uri, workdir)
        if found is not None:
            return found
    known = sweep_ids(workdir)
    raise SpecError([Problem(what, "no sweep, MLflow parent run or champion of that name", ref,
                             "a sweep id (" + (", ".join(known) if known else
                                               f"none under {workdir}/sweeps") +
                             "), a sweep directory, an MLflow parent run id, or "
                             "champion:CLASS[@VERSION]")])


# --------------------------------------------------------------------------------------------
# Showing it


def _num(c: Change, v: float) -> str:
    if c.metric == "throughput":
        return f"{v:,.0f} tok/s"
    return f"{v:.3f}"


def change_text(c: Change) -> str:
    """The change with its interval, e.g. `0.551x [0.512, 0.593]`."""
    if c.scale == "ratio":
        return f"{c.change:.3f}x [{c.lo:.3f}, {c.hi:.3f}]"
    return f"{c.change:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]"


COLUMNS = ("class", "workload", "c", "engine", "metric", "A", "B", "B vs A", "finding",
           "replicates")


def rows(cmp: Comparison, *, all_positions: bool = True) -> list[tuple[str, ...]]:
    """The table's rows; `all_positions=False` drops per-position rows with no finding."""
    return [(c.traffic_class, c.workload, str(c.concurrency), c.engine, c.label, _num(c, c.a),
             _num(c, c.b), change_text(c), c.finding, c.replicates) for c in cmp.changes
            if all_positions or c.metric != "acceptance at position"
            or c.finding in ("regression", "improvement")]


def _context(cmp: Comparison) -> list[str]:
    lines = [f"A: {cmp.a}", f"B: {cmp.b}"]
    if cmp.pins:
        lines.append("what differs: " + "; ".join(f"{k} {a} -> {b}" for k, a, b in cmp.pins))
    else:
        lines.append("what differs: no pin (vLLM, torch, checkpoints, device, driver)")
    lines += [f"the workload changed: {w}" for w in cmp.workload_changes]
    lines += [f"setting changed: {s}" for s in cmp.settings]
    lines += [f"not compared: {o}" for o in cmp.only]
    return lines


def markdown(cmp: Comparison) -> str:
    """The whole comparison as Markdown (every row, per-position acceptance included)."""
    out = [f"# {cmp.summary}", ""]
    out += [f"- {line}" for line in _context(cmp)]
    out += ["", f"Intervals: {cmp.confidence:.0%}, two-sided; findings Holm-corrected over the "
            f"rows; a change within {cmp.tolerance:.0%} (ratios) or {cmp.tolerance:.2f} "
            "(acceptance at a position) is not a regression.", ""]
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "---|" * len(COLUMNS))
    out += ["| " + " | ".join(r) + " |" for r in rows(cmp)]
    return "\n".join(out) + "\n"


def _short(replicates: str) -> str:
    n = replicates.split(" (")[0]
    return n.replace(" + ", "+").replace("engine starts", "starts") + (
        "*" if "(" in replicates else "")


def print_table(cmp: Comparison, console: Any) -> None:
    """The comparison on the console (rich): context, the table, the summary last."""
    from rich.markup import escape
    from rich.table import Table

    for line in _context(cmp):
        console.print(escape(line))
    table = Table("class", "workload", "c", "engine", "metric", "A -> B", "B vs A",
                  "finding", "replicates")
    style = {"regression": "red", "improvement": "green", "workload changed": "yellow"}
    for r in rows(cmp, all_positions=False):
        table.add_row(*map(escape, (*r[:5], f"{r[5]} -> {r[6]}", r[7], r[8], _short(r[9]))),
                      style=style.get(r[8]))
    console.print(table)
    if any("(" in c.replicates for c in cmp.changes):
        console.print("* windows as replicates: an engine started once a side, so the interval "
                      "has no start effect in it")
    hidden = sum(1 for c in cmp.changes if c.metric == "acceptance at position"
                 and c.finding not in ("regression", "improvement"))
    if hidden:
        console.print(f"({hidden} per-position acceptance rows with no change: in the Markdown)")
    console.print(escape(cmp.summary))


def exit_code(cmp: Comparison) -> int:
    if cmp.regressions:
        return EXIT_REGRESSION
    return 0 if cmp.compared else EXIT_NOT_COMPARABLE


def dumps(cmp: Comparison) -> str:
    """The comparison as `--json` prints it (the record, with its summary)."""
    return json.dumps(as_json(cmp), indent=2)


__all__: Sequence[str] = ("EXIT_NOT_COMPARABLE", "EXIT_REGRESSION", "dumps", "exit_code",
                          "markdown", "print_table", "resolve", "rows")
