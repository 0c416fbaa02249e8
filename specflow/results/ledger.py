"""The local, durable record of a sweep: the source of truth for resume and for MLflow sync.

Every finished window is written here first (atomically, one JSON file per window), then logged
to MLflow. A re-run of the same sweep (same plan hash, same vLLM version) reads it to skip
finished windows, re-runs failed ones and pushes windows MLflow never received.
`workdir` is a local directory or an object-store URL (`specflow.records.store`): the records
(windows, `sweep.json`, leases, engine-start events) live there; a process's own files (engine
logs, materialised datasets, report files) live in `Ledger.dir`, the same directory on a local
store and a local scratch directory on an object store.
A window file that cannot be read back (torn, empty, binary, of the wrong shape) is moved into
`windows/quarantine/` with a warning and its window counts as missing, so the re-run measures it
again instead of failing on it.

Every file here has one pydantic model that validates and serialises it: `Entry` (a window
file), `Lease` (a unit's lease), `EngineStartEvent` (one object under `events/`; older
sweeps: a line of `events.jsonl`) and `SweepInfo`
(`sweep.json`: what the sweep measured and with what, read by `specflow compare`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool

from specflow.records.measurement import Measurement
from specflow.records.store import Store


def default_scratch() -> Path:
    """A process's own files when the records are on an object store and `tracking.scratch`
    is null: `$XDG_CACHE_HOME/specflow` (~/.cache/specflow)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "specflow"

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


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def renew_lease(path: Path | str, *, flow_run_id: str | None = None, host: str | None = None,
                devices: Sequence[str] | None = None) -> None:
    """Renew a lease (`Ledger.lease_path`: a path or an object-store URL): now, this process
    and what is given. Needs no opened sweep, so a worker takes its lease before the slow work of
    opening one. One writer per lease (the flow run measuring the unit): a plain replace."""
    parent, name = str(path).rstrip("/").rsplit("/", 1)
    lease = Lease(t=time.time(), pid=os.getpid(), flow_run_id=flow_run_id, host=host,
                  devices=devices)
    Store(parent).write(name, _json(lease.model_dump(mode="json")))


class Entry(BaseModel):
    """One window as the ledger holds it (a window file)."""

    model_config = ConfigDict(frozen=True)

    measurement: Measurement
    run_id: str | None
    """MLflow child run id once logged."""
    logged: StrictBool
    """Whether MLflow has the final state of this window."""


class EngineStartEvent(BaseModel):
    """One object under `events/` (older sweeps: a line of `events.jsonl`): an engine started
    for the sweep (what, when, where)."""

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
    """Points of one sweep under `<workdir>/sweeps/<sweep_id>/` (`workdir`: a path or an
    object-store URL; `scratch`: where a process keeps its own files when it is a URL)."""

    def __init__(self, workdir: Path | str, sid: str, *, scratch: Path | str | None = None,
                 grace_s: float | None = None):
        root = Store(workdir) if grace_s is None else Store(workdir, grace_s=grace_s)
        self.store = root.sub("sweeps", sid)
        self.workdir = root.url
        """The `tracking.workdir` it is under (a resolved path, or the URL)."""
        if self.store.local:
            self.dir = self.store.path()
            legacy = self.dir / "points"  # the directory's earlier name: renamed, never re-measured
            if legacy.is_dir() and not (self.dir / "windows").exists():
                legacy.rename(self.dir / "windows")
            (self.dir / "windows").mkdir(parents=True, exist_ok=True)
        else:
            self.dir = Path(scratch or default_scratch()).expanduser().resolve() / "sweeps" / sid
            self.dir.mkdir(parents=True, exist_ok=True)
        self.windows = self.dir / "windows"
        """The window files' directory on a local store."""
        self.sid = sid

    @property
    def location(self) -> str:
        """Where the records are: a path, or the object store's URL."""
        return self.store.url

    @staticmethod
    def _key(window_id: str) -> str:
        return "windows/" + window_id.replace("/", "__") + ".json"

    def _path(self, window_id: str) -> Path:
        """A window file's path (a local store)."""
        return self.store.path(self._key(window_id))

    @property
    def info_path(self) -> str:
        return self.store.join("sweep.json")

    def write_info(self, info: SweepInfo) -> None:
        self.store.write("sweep.json", _json(info.model_dump(mode="json")))

    def info(self) -> SweepInfo | None:
        """`sweep.json`, or None when the sweep has none (older, or unreadable: said in the log)."""
        try:
            return SweepInfo.model_validate_json(self.store.read_bytes("sweep.json"))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            log.warning("%s is unreadable (%s); the sweep's pins are unknown", self.info_path,
                        str(exc).splitlines()[0])
            return None
        except OSError as exc:
            log.warning("%s is unreadable (%s); the sweep's pins are unknown", self.info_path,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
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
        """A window's record, replaced whole (a reader never sees a part). A second write of
        the same window (a worker fenced off too late) is harmless: the key is the window's id
        and either record is a whole measurement of it; its MLflow child run is found again by
        window id, so it is logged once."""
        self.store.write(self._key(entry.measurement.key.id), _json(entry.model_dump(mode="json")))

    def get(self, window_id: str) -> Entry | None:
        """The window's entry; None when it has none (or its file was bad and is moved aside)."""
        return self._read(self._key(window_id))

    def _read(self, key: str, data: bytes | None = None) -> Entry | None:
        """The entry in a window file (its bytes, when already read), or None (none there, or
        quarantined: not an entry)."""
        try:
            if data is None:
                data = self.store.read_bytes(key)
            entry = Entry.model_validate(json.loads(data.decode("utf-8")))
        except FileNotFoundError:
            return None  # none, or moved aside meanwhile by another reader
        except IsADirectoryError:
            return None
        except ValueError as exc:  # JSON, UTF-8, or the shape (pydantic's ValidationError)
            problem = " ".join(f"{type(exc).__name__}: {exc}".split())  # on one line
        else:
            window = entry.measurement.key.id
            if self._key(window) == key:
                return entry
            problem = f"it holds window {window!r}"
        self._quarantine(key, problem)
        return None

    def _quarantine(self, key: str, problem: str) -> None:
        """Move a bad window file into windows/quarantine/ (kept for a post-mortem)."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        dest = f"windows/quarantine/{key.rsplit('/', 1)[-1]}.{stamp}"
        try:
            self.store.move(key, dest)
        except FileNotFoundError:
            return  # another reader moved it first
        log.warning("ledger window file %s is unreadable (%s); moved to %s, its window will be "
                    "measured again", self.store.join(key), problem[:200], self.store.join(dest))

    def entries(self) -> Iterator[Entry]:
        """Every readable window (bad files are quarantined and skipped)."""
        keys = [f"windows/{name}" for name in self.store.names("windows", ".json")]
        if self.store.local:  # read one by one, as they are parsed
            found: dict[str, bytes | None] = dict.fromkeys(keys)
        else:  # fetched concurrently: one round trip's latency, not one per window
            found = dict(self.store.read_many(keys))
        for key, data in found.items():
            entry = self._read(key, data)
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

    def lease_path(self, unit: str) -> Path | str:
        """Where the lease on `unit` (one engine start measured by one worker) is renewed (a
        path, or a URL on an object store); the sweep declares the unit lost when it stops being
        renewed (see `renew_lease`)."""
        key = f"leases/{unit}.json"
        return self.store.path(key) if self.store.local else self.store.join(key)

    def lease(self, unit: str) -> Lease | None:
        """The last renewal of `unit`'s lease (None: never taken, or unreadable)."""
        try:
            return Lease.model_validate_json(self.store.read_bytes(f"leases/{unit}.json"))
        except (OSError, ValueError):  # ValueError: pydantic's ValidationError
            return None

    def engine_started(self, engine: str, engine_hash: str, host: str,
                       devices: Sequence[str] | None) -> None:
        """Record an engine start: one new object under events/ (never appended to, so an
        object store holds it as a local disk does)."""
        event = EngineStartEvent(t=time.time(), pid=os.getpid(), engine=engine, hash=engine_hash,
                                 host=host, devices=devices)
        name = f"events/{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self.store.create(name, json.dumps(event.model_dump(mode="json")) + "\n")

    def engine_starts(self) -> list[EngineStartEvent]:
        """The engine starts, in order: an older sweep's events.jsonl (a torn line is skipped),
        then the events/ objects (one that is unreadable is skipped, said in the log)."""
        out = []
        try:
            legacy = self.store.read_bytes("events.jsonl").decode("utf-8", errors="replace")
        except FileNotFoundError:
            legacy = ""
        for n, line in enumerate(legacy.splitlines(), 1):
            if not line:
                continue
            try:
                out.append(EngineStartEvent.model_validate_json(line))
            except ValueError:  # a line torn by a kill mid-append (pydantic's ValidationError)
                log.warning("%s:%d is not a JSON event; skipped", self.store.join("events.jsonl"),
                            n)
        for name in self.store.names("events", ".json"):
            try:
                out.append(EngineStartEvent.model_validate_json(
                    self.store.read_bytes(f"events/{name}")))
            except (OSError, ValueError):
                log.warning("%s is not a JSON event; skipped", self.store.join(f"events/{name}"))
        return sorted(out, key=lambda e: e.t)

    def publish(self, files: Sequence[Path]) -> None:
        """Copy files this process wrote under `dir` (a report, profiles) to the same place in
        the records (nothing to do on a local store, where `dir` is that place)."""
        if self.store.local:
            return
        for f in files:
            self.store.upload(f, f.resolve().relative_to(self.dir).as_posix())


def is_sweep(workdir: str | Path, sid: str) -> bool:
    """Whether `<workdir>/sweeps/<sid>` holds a sweep (its windows, or its sweep.json)."""
    s = Store(workdir).sub("sweeps", sid)
    return s.isdir("windows") or s.exists("sweep.json")


def sweep_ids(workdir: str | Path) -> list[str]:
    """The sweeps under `<workdir>/sweeps/`, sorted."""
    root = Store(workdir)
    return [sid for sid in root.names("sweeps") if is_sweep(workdir, sid)]
