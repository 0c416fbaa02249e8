"""The local, durable record of a sweep: the source of truth for resume and for MLflow sync.

Every finished window is written here first (atomically, one JSON file per point), then logged
to MLflow. A re-run of the same sweep (same plan hash, same vLLM version) reads it to skip
finished points, re-runs failed ones and pushes points MLflow never received.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specflow.core.fsio import atomic_write_json
from specflow.core.records import Measurement


def sweep_id(plan_hash: str, vllm_version: str) -> str:
    """Identity of a sweep for resume: the plan and the engine that measures it."""
    return hashlib.sha256(f"{plan_hash}|{vllm_version}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """One point as the ledger holds it."""

    measurement: Measurement
    run_id: str | None
    """MLflow child run id once logged."""
    logged: bool
    """Whether MLflow has the final state of this point."""


class Ledger:
    """Points of one sweep under `<workdir>/sweeps/<sweep_id>/`."""

    def __init__(self, workdir: Path | str, sid: str):
        self.dir = Path(workdir).resolve() / "sweeps" / sid
        self.points = self.dir / "points"
        self.points.mkdir(parents=True, exist_ok=True)
        self.sid = sid

    def _path(self, point_id: str) -> Path:
        return self.points / (point_id.replace("/", "__") + ".json")

    def record(self, m: Measurement, run_id: str | None = None) -> None:
        """Keep a finished (or failed) window, not yet logged to MLflow."""
        old = self.get(m.key.id)
        run_id = run_id or (old.run_id if old else None)
        atomic_write_json(self._path(m.key.id), {"measurement": m.to_json(), "run_id": run_id,
                                             "logged": False})

    def mark_logged(self, point_id: str, run_id: str) -> None:
        entry = self.get(point_id)
        if entry is None:
            raise KeyError(point_id)
        atomic_write_json(self._path(point_id), {"measurement": entry.measurement.to_json(),
                                             "run_id": run_id, "logged": True})

    def get(self, point_id: str) -> Entry | None:
        path = self._path(point_id)
        if not path.is_file():
            return None
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> Entry:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Entry(Measurement.from_json(data["measurement"]), data.get("run_id"),
                     bool(data.get("logged")))

    def entries(self) -> Iterator[Entry]:
        for path in sorted(self.points.glob("*.json")):
            yield self._read(path)

    def finished(self) -> set[str]:
        """Point ids with a successful measurement (skipped on resume)."""
        return {e.measurement.key.id for e in self.entries() if e.measurement.ok}

    def unlogged(self) -> list[Entry]:
        """Points MLflow has not received (to sync)."""
        return [e for e in self.entries() if not e.logged]

    def measurements(self) -> list[Measurement]:
        return [e.measurement for e in self.entries()]

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
        out = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln]
        return [e for e in out if kind is None or e["event"] == kind]
