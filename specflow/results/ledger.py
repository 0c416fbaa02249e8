"""The local, durable record of a sweep: the source of truth for resume and for MLflow sync.

Every finished window is written here first (atomically, one JSON file per window), then logged
to MLflow. A re-run of the same sweep (same plan hash, same vLLM version) reads it to skip
finished windows, re-runs failed ones and pushes windows MLflow never received.
A window file that cannot be read back (torn, empty, binary, of the wrong shape) is moved into
`windows/quarantine/` with a warning and its window counts as missing, so the re-run measures it
again instead of failing on it.

Every file here has one pydantic model that validates and serialises it: `Entry` (a window
file), `Lease` (a unit's lease), `EngineStartEvent` (a line of `events.jsonl`) and `SweepInfo`
(`sweep.json`: what the sweep measured and with what, read by `specflow compare`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool

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


class Lease(BaseModel):
    """One renewal of a unit's lease (`Ledger.lease_path`): when, by which process, for which
    flow run, where."""

    model_config = ConfigDict(frozen=True)

    t: float
    """When it was renewed (Unix time)."""
    pid: int
    """The renewing process."""
    flow_run_id: str | None = None
    """The Prefect flow run measuring the unit."""
    host: str | None = None
    """The worker's host name."""
    devices: tuple[str, ...] | None = None
    """The worker's device ids (None: every device visible)."""


def renew_lease(path: Path | str, *, flow_run_id: str | None = None, host: str | None = None,
                devices: Sequence[str] | None = None) -> None:
    """Renew a lease (`Ledger.lease_path`): now, this process and what is given. Needs no
    opened sweep, so a worker takes its lease before the slow work of opening one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lease = Lease(t=time.time(), pid=os.getpid(), flow_run_id=flow_run_id, host=host,
                  devices=devices)
    atomic_write_json(path, lease.model_dump(mode="json"))


class Entry(BaseModel):
    """One window as the ledger holds it (a window file)."""

    model_config = ConfigDict(frozen=True)

    measurement: Measurement
    run_id: str | None
    """MLflow child run id once logged."""
    logged: StrictBool
    """Whether MLflow has the final state of this window."""


class EngineStartEvent(BaseModel):
    """One line of `events.jsonl`: an engine started for the sweep (what, when, where)."""

    model_config = ConfigDict(frozen=True)

    t: float
    """When (Unix time)."""
    event: Literal["engine_start"] = "engine_start"
    pid: int
    """The process that started it."""
    engine: str
    """EngineConfig.name."""
    hash: str
    """EngineConfig.hash."""
    host: str
    devices: tuple[str, ...] | None
    """The device ids it was given (None: every device visible)."""


class SweepInfo(BaseModel):
    """`sweep.json`: the sweep's identity as a comparison needs it, written when the sweep is
    opened (again on each resume: the pins of the newest run)."""

    model_config = ConfigDict(frozen=True)

    sweep_id: str
    plan_hash: str
    target: str
    hardware: str
    experiment: str
    """The MLflow experiment it logs to."""
    measured: dict[str, Any]
    """`measured_settings`: the workloads and everything else that changes what a window
    measures."""
    pins: dict[str, str]
    """Versions and revisions (vLLM, torch, the checkpoints, device, driver)."""
    opened_at: str
    """UTC time of the newest opening."""
    repeats: int | None = None
    """`sweep.repeats` (a grid sweep's closing baseline windows come after them)."""


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

    @property
    def info_path(self) -> Path:
        return self.dir / "sweep.json"

    def write_info(self, info: SweepInfo) -> None:
        atomic_write_json(self.info_path, info.model_dump(mode="json"))

    def info(self) -> SweepInfo | None:
        """`sweep.json`, or None when the sweep has none (older, or unreadable: said in the log)."""
        try:
            return SweepInfo.model_validate_json(self.info_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s); the sweep's pins are unknown", self.info_path,
                        str(exc).splitlines()[0])
            return None

    def record(self, m: Measurement, run_id: str | None = None) -> None:
        """Keep a finished (or failed) window, not yet logged to MLflow."""
        old = self.get(m.key.id)
        run_id = run_id or (old.run_id if old else None)
        self._write(Entry(measurement=m, run_id=run_id, logged=False))

    def mark_logged(self, window_id: str, run_id: str) -> None:
        entry = self.get(window_id)
        if entry is None:
            raise KeyError(window_id)
        self._write(entry.model_copy(update={"run_id": run_id, "logged": True}))

    def _write(self, entry: Entry) -> None:
        atomic_write_json(self._path(entry.measurement.key.id), entry.model_dump(mode="json"))

    def get(self, window_id: str) -> Entry | None:
        """The window's entry; None when it has none (or its file was bad and is moved aside)."""
        path = self._path(window_id)
        if not path.is_file():
            return None
        return self._read(path)

    def _read(self, path: Path) -> Entry | None:
        """The entry in a window file, or None after quarantining a file that is not one."""
        try:
            entry = Entry.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None  # moved aside meanwhile by another reader
        except ValueError as exc:  # JSON, UTF-8, or the shape (pydantic's ValidationError)
            problem = " ".join(f"{type(exc).__name__}: {exc}".split())  # on one line
        else:
            window = entry.measurement.key.id
            if self._path(window) == path:
                return entry
            problem = f"it holds window {window!r}"
        self._quarantine(path, problem)
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

    def lease(self, unit: str) -> Lease | None:
        """The last renewal of `unit`'s lease (None: never taken, or unreadable)."""
        try:
            return Lease.model_validate_json(self.lease_path(unit).read_bytes())
        except (OSError, ValueError):  # ValueError: pydantic's ValidationError
            return None

    def engine_started(self, engine: str, engine_hash: str, host: str,
                       devices: Sequence[str] | None) -> None:
        """Append an engine start to events.jsonl."""
        event = EngineStartEvent(t=time.time(), pid=os.getpid(), engine=engine, hash=engine_hash,
                                 host=host, devices=devices)
        with open(self.dir / "events.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event.model_dump(mode="json")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def engine_starts(self) -> list[EngineStartEvent]:
        """The engine starts in events.jsonl, in order (a torn line is skipped)."""
        path = self.dir / "events.jsonl"
        if not path.is_file():
            return []
        out = []
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(),
                                 1):
            if not line:
                continue
            try:
                out.append(EngineStartEvent.model_validate_json(line))
            except ValueError:  # a line torn by a kill mid-append (pydantic's ValidationError)
                log.warning("%s:%d is not a JSON event; skipped", path, n)
        return out
