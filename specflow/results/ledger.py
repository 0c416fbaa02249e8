"""The local, durable record of a sweep: the source of truth for resume and for MLflow sync.

Every finished window is written here first (atomically, one JSON file per window), then logged
to MLflow. A re-run of the same sweep (same plan hash, same vLLM version) reads it to skip
finished windows, re-runs failed ones and pushes windows MLflow never received.
A window file that cannot be read back (torn, empty, binary, of the wrong shape) is moved into
`windows/quarantine/` with a warning and its window counts as missing, so the re-run measures it
again instead of failing on it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specflow.records.fsio import atomic_write_json, fsync_dir
from specflow.records.measurement import Measurement

log = logging.getLogger("specflow.results.ledger")


def sweep_id(plan_hash: str, vllm_version: str, measured: Mapping[str, Any]) -> str:
    """Identity of a sweep for resume: the plan, the engine that measures it and every other
    setting that changes what a window measures (`measured`: the workloads' prompts and output
    lengths, the warm-up, the design). What only changes the decision (margins, confidence)
    is not in it: a re-decision reuses the windows."""
    blob = json.dumps(measured, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{plan_hash}|{vllm_version}|{blob}".encode()).hexdigest()[:16]


def renew_lease(path: Path | str, **fields: Any) -> None:
    """Renew a lease (`Ledger.lease_path`): now, this process and `fields`. Needs no opened
    sweep, so a worker takes its lease before the slow work of opening one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"t": time.time(), "pid": os.getpid(), **fields})


@dataclass(frozen=True)
class Entry:
    """One window as the ledger holds it."""

    measurement: Measurement
    run_id: str | None
    """MLflow child run id once logged."""
    logged: bool
    """Whether MLflow has the final state of this window."""


class Ledger:
    """Points of one sweep under `<workdir>/sweeps/<sweep_id>/`."""

    def __init__(self, workdir: Path | str, sid: str):
        self.dir = Path(workdir).resolve() / "sweeps" / sid
        self.windows = self.dir / "windows"
        legacy = self.dir / "points"  # the directory's earlier name: renamed, never re-measured
        if legacy.is_dir() and not self.windows.exists():
            legacy.rename(self.windows)
        self.windows.mkdir(parents=True, exist_ok=True)
        self.sid = sid

    def _path(self, window_id: str) -> Path:
        return self.windows / (window_id.replace("/", "__") + ".json")

    def record(self, m: Measurement, run_id: str | None = None) -> None:
        """Keep a finished (or failed) window, not yet logged to MLflow."""
        old = self.get(m.key.id)
        run_id = run_id or (old.run_id if old else None)
        atomic_write_json(self._path(m.key.id), {"measurement": m.to_json(), "run_id": run_id,
                                             "logged": False})

    def mark_logged(self, window_id: str, run_id: str) -> None:
        entry = self.get(window_id)
        if entry is None:
            raise KeyError(window_id)
        atomic_write_json(self._path(window_id), {"measurement": entry.measurement.to_json(),
                                             "run_id": run_id, "logged": True})

    def get(self, window_id: str) -> Entry | None:
        """The window's entry; None when it has none (or its file was bad and is moved aside)."""
        path = self._path(window_id)
        if not path.is_file():
            return None
        return self._read(path)

    def _read(self, path: Path) -> Entry | None:
        """The entry in a window file, or None after quarantining a file that is not one."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            entry = Entry(Measurement.from_json(data["measurement"]), data["run_id"],
                          data["logged"])
            problem = self._shape_problem(path, entry)
        except FileNotFoundError:
            return None  # moved aside meanwhile by another reader
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # JSON, UTF-8, shape
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return entry
        self._quarantine(path, problem)
        return None

    def _shape_problem(self, path: Path, entry: Entry) -> str | None:
        """What is wrong with a parsed entry (None: nothing); it must be this file's window."""
        m = entry.measurement
        if self._path(m.key.id) != path:
            return f"it holds window {m.key.id!r}"
        if not isinstance(entry.logged, bool) or not isinstance(entry.run_id, str | None) \
                or m.status not in ("ok", "failed"):
            return "run_id, logged or status has the wrong type"
        return None

    def _quarantine(self, path: Path, problem: str) -> None:
        """Move a bad window file into windows/quarantine/ (kept for a post-mortem)."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        dest = self.windows / "quarantine" / f"{path.name}.{stamp}"
        dest.parent.mkdir(exist_ok=True)
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return  # another reader moved it first
        fsync_dir(self.windows)
        log.warning("ledger window file %s is unreadable (%s); moved to %s, its window will be "
                    "measured again", path, problem[:200], dest)

    def entries(self) -> Iterator[Entry]:
        """Every readable window (bad files are quarantined and skipped)."""
        for path in sorted(self.windows.glob("*.json")):
            entry = self._read(path)
            if entry is not None:
                yield entry

    def finished(self) -> set[str]:
        """Point ids with a successful measurement (skipped on resume)."""
        return {e.measurement.key.id for e in self.entries() if e.measurement.ok}

    def unlogged(self) -> list[Entry]:
        """Points MLflow has not received (to sync)."""
        return [e for e in self.entries() if not e.logged]

    def measurements(self) -> list[Measurement]:
        return [e.measurement for e in self.entries()]

    def lease_path(self, unit: str) -> Path:
        """Where the lease on `unit` (one engine start measured by one worker) is renewed; the
        sweep declares the unit lost when it stops being renewed (see `renew_lease`)."""
        return self.dir / "leases" / f"{unit}.json"

    def lease(self, unit: str) -> dict[str, Any] | None:
        """The last renewal of `unit`'s lease (None: never taken, or unreadable)."""
        try:
            data = json.loads(self.lease_path(unit).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("t"), float) else None

    def event(self, kind: str, **fields: Any) -> None:
        """Append an event (engine start, engine failure, ...) to events.jsonl."""
        line = json.dumps({"t": time.time(), "event": kind, "pid": os.getpid(), **fields})
        with open(self.dir / "events.jsonl", "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.dir / "events.jsonl"
        if not path.is_file():
            return []
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(),
                                 1):
            try:
                event = json.loads(line) if line else None
            except ValueError:  # a line torn by a kill mid-append
                log.warning("%s:%d is not a JSON event; skipped", path, n)
                continue
            if isinstance(event, dict) and (kind is None or event.get("event") == kind):
                out.append(event)
        return out
