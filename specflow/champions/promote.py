"""Promotion: per traffic class, the deployable decision as files, written so a crash cannot
leave half a champion, with every champion kept and restorable.

Layout under `PromoteSpec.output_dir` (a local directory or an object-store URL):
    <class>/champion.json             the current champion (a copy of one history entry)
    <class>/history/<version>.json    every champion ever promoted, never rewritten
    <class>/refused/<version>.json    promotions the regression gate refused, for the record
A version is `<UTC time>-<content hash>`, so names sort by time, and a versioned file is never
rewritten. `champion.json` is the pointer: a reader gets the old champion or the new one, never
a part. On a local disk every file is written to a temporary file in the same directory,
fsynced, then `os.replace`d into place, and promotions of one class are serialised by an
advisory lock that dies with its holder. On an object store there is no lock: a promotion reads
the champion with its ETag, decides, and swaps it in with one conditional PUT (`If-Match`);
when another promotion swapped first, it reads the new champion and decides again against it
(the regression gate included). Class and version names become path components only when they
are plain names (`is_plain_name`), whether they come from the command line or from a file; a
champion file that cannot be read does not stop `restore(cls, version)`, the command that
repairs it.

Regression gate: a new champion replaces the old one unless, in some band both decided, the new
one is confidently worse than what the old one was promoted for (new speedup upper bound <
old speedup estimate x (1 - tie_tolerance)) while the new sweep did not re-measure the old
champion's engine there; when it did, the same-sweep comparison (already made by the analysis)
stands. Per-position acceptance drops against the old champion's drafter are flagged, not refused:
beyond noise where the two sweeps were compared, else beyond the fixed `acceptance_drop`.
(Refusing whenever the new lower bound falls below the old estimate would refuse re-validating
the very same config almost every time: a lower bound sits below its own estimate.)

Every file is one pydantic model: `ChampionRecord` (what the version hash is taken over),
`VersionedRecord` (an `unresolved/` file) and `GatedRecord` (champion, history and refused files).

Side effects beyond files (MLflow registration) are the caller's, through `on_promoted`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from specflow.decision.model import (
    BASELINE_METHOD,
    Analysis,
    ClassResult,
    Decision,
    Outcome,
    Verdict,
)
from specflow.decision.wording import decision_rows
from specflow.records.fsio import BeforeReplace
from specflow.records.store import Store, shown
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import PromoteSpec
from specflow.spec.serialize import as_json

log = logging.getLogger("specflow.champions.promote")

_SAFE = re.compile(r"[A-Za-z0-9_.-]+")
PLAIN = "letters, digits, '_', '-' and '.' (not '.' or '..')"
"""What `is_plain_name` accepts, for messages."""
SCHEMA_VERSION = 2
"""Version of the champion file format. 2: the glossary's words (a band's and a champion's
outcome `promote`, was `speculate`; a candidate's `verdict`, was `status` and `outcome`; the
"off" row's verdict wins / ruled out / open, was wins / beaten / unresolved). Files of schema 1
are read as schema 2 (`upgrade_v1`)."""
CHAMPION = "champion.json"
SWAPS = 8
"""How many times a promotion on an object store decides again when another one swapped the
champion first (each time against the champion that is there now)."""


class PromotionError(RuntimeError):
    """A promotion or restore that cannot be carried out (the message says why)."""


@dataclass(frozen=True)
class GateResult:
    """What the regression gate found against the previous champion."""

    passed: bool
    regressions: tuple[str, ...] = ()
    """Bands where the new champion is confidently worse (refuses the promotion)."""
    excused: tuple[str, ...] = ()
    """Bands where it is worse but the old champion was re-measured and no longer holds."""
    acceptance_drops: tuple[str, ...] = ()
    """Per-position acceptance drops of the champion's drafter (flagged only): beyond noise
    where a comparison with the champion's sweep has the data, else beyond `acceptance_drop`."""
    notes: tuple[str, ...] = ()
    """What could not be compared (bands only one of them decided, an older file format)."""
    forced: bool = False


# --------------------------------------------------------------------------------------------
# Records


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class SpeedupInterval(_Record):
    """A band's speedup as promoted: the estimate with its confidence interval."""

    estimate: float
    lo: float
    hi: float
    confidence: float


class BandRecord(_Record):
    """One concurrency band of a champion: its outcome, the engine that won it, by how much."""

    band: str
    """The band's label, e.g. `c1-4`."""
    lo: int
    hi: int
    outcome: Outcome
    engine_hash: str | None
    """The winner's engine config (None: no winner)."""
    engine: str | None
    drafter: str | None
    method: str | None
    num_speculative_tokens: int
    """The winner's N (0: no winner)."""
    speedup: SpeedupInterval
    """The winner's worst point (1 with no winner)."""
    per_position_acceptance: tuple[float, ...]
    reasons: tuple[str, ...]
    notes: tuple[str, ...]


class ChampionEngine(_Record):
    """The engine config a champion deploys."""

    name: str
    hash: str
    drafter: str
    method: str
    num_speculative_tokens: int


class Evidence(_Record):
    """What the decision rested on, as the decision serialises it (people and MLflow read it)."""

    decision_table: tuple[dict[str, JsonValue], ...]
    """`decision_rows`: one row per band x candidate, plus each band's "off" row."""
    decisions: tuple[JsonValue, ...]
    """Each band's `Decision`."""
    drift: tuple[JsonValue, ...]
    """The class's baseline `Drift` steps."""
    deployment: dict[str, JsonValue]
    """The class's `Deployment`."""
    notes: tuple[str, ...]


class ChampionRecord(_Record):
    """The deployable decision of one class with its evidence (`build_record`): what its
    version's content hash is taken over."""

    model_config = ConfigDict(frozen=True, validate_by_name=True, serialize_by_alias=True)

    schema_version: int = Field(alias="schema")
    """The file format (`SCHEMA_VERSION`)."""
    traffic_class: str
    outcome: Literal["promote", "off"]
    engine: ChampionEngine
    speculative_config: dict[str, JsonValue] | None
    """The --speculative-config to serve with (None: no speculation)."""
    serve_argv: tuple[str, ...]
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None
    """vLLM's N schedule ranges [start, end, N]; None for a fixed N."""
    bands: tuple[BandRecord, ...]
    evidence: Evidence
    settings: dict[str, JsonValue]
    """The PromoteSpec it was decided under."""

    @model_validator(mode="before")
    @classmethod
    def _read_older(cls, data: Any) -> Any:
        """A schema 1 file is read in schema 2's words."""
        if isinstance(data, dict) and data.get("schema", data.get("schema_version")) == 1:
            return upgrade_v1(data)
        return data


class VersionedRecord(ChampionRecord):
    """A record as promotion files it: with its version, time and predecessor (the files of
    `unresolved/`; the base of `GatedRecord`)."""

    version: JsonValue
    """`<UTC time>-<content hash>`; kept as the file holds it: it names a file only when
    `is_plain_name` accepts it."""
    created_at: str
    previous: JsonValue
    """The version of the champion it followed (None: none), checked like `version`."""
    sweep_id: str | None = None
    """The sweep it was decided on (`specflow compare` reads its windows); None in files
    written before it was recorded."""


class GatedRecord(VersionedRecord):
    """A champion, history entry or refused promotion: a versioned record with its gate."""

    gate: GateResult


@dataclass(frozen=True)
class Promotion:
    """The outcome of `promote_class` or `restore`."""

    traffic_class: str
    status: Literal["promoted", "refused", "restored", "unchanged", "unresolved"]
    """`unresolved`: some band of the class is undecided; the champion is left as it was."""
    version: str
    path: Path | str
    """The champion file, or the refused record (a URL on an object store)."""
    previous: str | None
    """Version of the champion this one replaced (None if there was none)."""
    gate: GateResult
    record: VersionedRecord = field(repr=False)


Hook = Callable[[Promotion], None]
"""Called after the files are in place (e.g. to register the champion in MLflow)."""


_V1_WORDS = {"speculate": "promote"}
_V1_OFF_ROW = {"beaten": "ruled out", "unresolved": "open"}


def _renamed(words: Mapping[str, str], word: Any) -> Any:
    return words.get(word, word) if isinstance(word, str) else word


def upgrade_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A champion record of schema 1 in schema 2's words (the version, hash and everything else
    as the file holds them)."""
    out = json.loads(json.dumps(data))
    out.pop("schema_version", None)
    out["schema"] = SCHEMA_VERSION
    out["outcome"] = _renamed(_V1_WORDS, out.get("outcome"))
    for band in out.get("bands") or ():
        if isinstance(band, dict):
            band["outcome"] = _renamed(_V1_WORDS, band.get("outcome"))
    evidence = out.get("evidence")
    if not isinstance(evidence, dict):
        return out
    dep = evidence.get("deployment")
    if isinstance(dep, dict):
        dep["outcome"] = _renamed(_V1_WORDS, dep.get("outcome"))
    for d in evidence.get("decisions") or ():
        if not isinstance(d, dict):
            continue
        d["outcome"] = _renamed(_V1_WORDS, d.get("outcome"))
        for v in [d.get("winner"), *(d.get("candidates") or ())]:
            if isinstance(v, dict):
                v.pop("status", None)
                if "outcome" in v:
                    v["verdict"] = v.pop("outcome")
    for row in evidence.get("decision_table") or ():
        if isinstance(row, dict) and row.get("method") == BASELINE_METHOD:
            row["verdict"] = _renamed(_V1_OFF_ROW, row.get("verdict"))
    return out


def _parse(data: bytes, where: object) -> GatedRecord:
    try:
        return GatedRecord.model_validate(json.loads(data))
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}"
                        for e in exc.errors()[:3])
        raise PromotionError(f"cannot read {where}: not a champion record ({why})") from None
    except ValueError as exc:  # bad JSON or not UTF-8
        raise PromotionError(f"cannot read {where}: {exc}") from None


def _read(store: Store, key: str) -> GatedRecord:
    if store.local and key.startswith("history/"):  # a link planted in history/
        path, hist = store.path(key), store.path("history")
        if path.exists() and not path.resolve().is_relative_to(hist.resolve()):
            raise PromotionError(f"history entry {path} leads outside {hist}")
    try:
        data = store.read_bytes(key)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PromotionError(f"cannot read {shown(store.location(key))}: {exc}") from None
    return _parse(data, shown(store.location(key)))


def record_json(record: VersionedRecord) -> str:
    """A record as its file holds it (sorted, indented JSON)."""
    return json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def is_plain_name(name: object) -> TypeGuard[str]:
    """Whether a value may become one path component (a class or version name)."""
    return isinstance(name, str) and bool(_SAFE.fullmatch(name)) and name not in {".", ".."}


def class_store(output_dir: str | Path, traffic_class: str) -> Store:
    """Where one class's champion lives (the class name must be a plain path component)."""
    if not is_plain_name(traffic_class):
        raise PromotionError(f"traffic class {traffic_class!r} is not a plain name; "
                             f"expected {PLAIN}")
    return Store(output_dir, setting="promote.output_dir").sub(traffic_class)


def history_key(version: object) -> str:
    """`history/<version>.json` of a class, for a plain version name only."""
    if not is_plain_name(version):
        raise PromotionError(f"version {version!r} is not a plain version name; "
                             f"expected {PLAIN}")
    return f"history/{version}.json"


def champion(output_dir: str | Path, traffic_class: str) -> GatedRecord | None:
    """The current champion record of a class, or None."""
    try:
        return _read(class_store(output_dir, traffic_class), CHAMPION)
    except FileNotFoundError:
        return None


def promoted(output_dir: str | Path) -> list[str]:
    """The classes with a champion under `output_dir`, sorted."""
    store = Store(output_dir, setting="promote.output_dir")
    return [c for c in store.names() if is_plain_name(c) and store.exists(f"{c}/{CHAMPION}")]


def history(output_dir: str | Path, traffic_class: str) -> list[str]:
    """Versions ever promoted for a class, oldest first."""
    return [n.removesuffix(".json") for n in
            class_store(output_dir, traffic_class).names("history", ".json")]


def _current(store: Store) -> tuple[GatedRecord | None, str | None]:
    """The champion with the tag of the version read (for the swap), after copying it into
    history/ when a writer was killed between the two; a champion that is unreadable or names
    no plain version raises PromotionError (the caller decides) or is left unrepaired."""
    try:
        data, tag = store.read_tagged(CHAMPION)
    except FileNotFoundError:
        return None, None
    record = _parse(data, shown(store.location(CHAMPION)))
    try:
        key = history_key(record.version)
    except PromotionError as exc:
        log.warning("%s not repaired: %s", shown(store.location(CHAMPION)), exc)
        return record, tag
    if not store.exists(key):
        store.create(key, record_json(record))
    return record, tag


@contextlib.contextmanager
def _locked(store: Store) -> Iterator[None]:
    """Serialise writers of one class on a local disk and clear a killed writer's temporary
    files; an object store's writers swap the champion conditionally instead (no lock)."""
    if not store.local:
        yield
        return
    cdir = store.path()
    cdir.mkdir(parents=True, exist_ok=True)
    with open(cdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cdir.rglob(".*.tmp"):
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _raced(store: Store, traffic_class: str) -> PromotionError:
    return PromotionError(f"the champion of traffic class {traffic_class!r} under "
                          f"{shown(store.url)} changed {SWAPS} times while this promotion "
                          "decided against it; run it again")


# --------------------------------------------------------------------------------------------
# Building and gating


def _speculative_argv(argv: Sequence[str], cfg: dict[str, Any]) -> list[str]:
    """argv with its --speculative-config replaced (or added), encoded as compile encodes it."""
    blob = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    out = list(argv)
    if "--speculative-config" in out:
        out[out.index("--speculative-config") + 1] = blob
    else:
        out += ["--speculative-config", blob]
    return out


def build_record(result: ClassResult, engines: Mapping[str, EngineConfig],
                 promote: PromoteSpec) -> ChampionRecord:
    """The deployable champion of one class with its evidence (pure; no version yet)."""
    dep = result.deployment
    engine = engines.get(dep.engine_hash)
    if engine is None:
        raise PromotionError(f"engine config {dep.engine_hash} ({dep.engine}) is not in the "
                             "plan passed to promote; pass the plan's engine configs by hash")
    spec_cfg = dict(engine.speculative_config) if engine.speculative_config else None
    argv = list(engine.serve_argv)
    if spec_cfg is not None and dep.schedule is not None:
        spec_cfg["num_speculative_tokens"] = dep.num_speculative_tokens
        spec_cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in dep.schedule]
        argv = _speculative_argv(argv, spec_cfg)
    return ChampionRecord(
        schema_version=SCHEMA_VERSION,
        traffic_class=result.traffic_class,
        outcome=dep.outcome,
        engine=ChampionEngine(name=engine.name, hash=engine.hash, drafter=engine.drafter,
                              method=engine.method,
                              num_speculative_tokens=engine.num_speculative_tokens),
        speculative_config=spec_cfg,
        serve_argv=tuple(argv),
        num_speculative_tokens_per_batch_size=dep.schedule or None,
        bands=tuple(_band(d, promote) for d in result.decisions),
        evidence=Evidence(decision_table=tuple(decision_rows(result)),
                          decisions=as_json(result.decisions), drift=as_json(result.drift),
                          deployment=as_json(dep), notes=result.notes),
        settings=promote.model_dump(mode="json"),
    )


def _band(d: Decision, promote: PromoteSpec) -> BandRecord:
    """A band of the champion: its winner and the winner's worst-point speedup."""
    w = d.winner
    s = w.worst.speedup if w is not None and w.worst is not None else None
    return BandRecord(
        band=d.band.label, lo=d.band.lo, hi=d.band.hi, outcome=d.outcome,
        engine_hash=w.engine_hash if w else None, engine=w.engine if w else None,
        drafter=w.drafter if w else None, method=w.method if w else None,
        num_speculative_tokens=w.num_speculative_tokens if w else 0,
        speedup=SpeedupInterval(estimate=s.value, lo=s.lo, hi=s.hi, confidence=s.confidence)
        if s else SpeedupInterval(estimate=1.0, lo=1.0, hi=1.0, confidence=promote.confidence),
        per_position_acceptance=w.per_position_acceptance if w else (),
        reasons=d.reasons, notes=d.notes)


def _measured(decisions: Sequence[Decision], band: str, engine_hash: str) -> Verdict | None:
    """The verdict the new sweep gave `engine_hash` in `band`, if it measured it there."""
    for d in decisions:
        if d.band.label == band:
            for v in d.candidates:
                if v.engine_hash == engine_hash:
                    return v
    return None


def regression_gate(new: ChampionRecord, old: ChampionRecord | None, promote: PromoteSpec,
                    decisions: Sequence[Decision], drops: Sequence[str] | None = None
                    ) -> GateResult:
    """Compare a new champion record (from `decisions`) with the current one (see the module
    docstring). `drops`: the per-position acceptance drops beyond noise of the champion's
    engine from a comparison of the two sweeps (`specflow compare`), which replace the fixed
    `acceptance_drop` threshold; None where no comparison has the data."""
    if old is None:
        return GateResult(True)
    if old.schema_version != SCHEMA_VERSION:
        return GateResult(True, notes=(f"the previous champion's file format "
                                       f"{old.schema_version} is not {SCHEMA_VERSION}; "
                                       "not compared",))
    regressions, excused, found = [], [], []
    old_bands = {b.band: b for b in old.bands}
    new_bands = {b.band for b in new.bands}
    notes = [f"band {b} was decided only by the {which} champion; not compared"
             for which, only in (("previous", set(old_bands) - new_bands),
                                 ("new", new_bands - set(old_bands))) for b in sorted(only)]
    for nb in new.bands:
        ob = old_bands.get(nb.band)
        if ob is None:
            continue
        label = nb.band
        claim = ob.speedup.estimate
        floor = claim * (1 - promote.tie_tolerance)
        remeasured = _measured(decisions, label, ob.engine_hash) if ob.engine_hash else None
        if nb.speedup.hi < floor:
            what = (f"band {label}: new {nb.engine or 'off'} reaches at most "
                    f"{nb.speedup.hi:.3f}x, below the {claim:.3f}x the champion "
                    f"{ob.engine} was promoted for")
            if remeasured is None:
                regressions.append(f"{what}, and this sweep did not re-measure {ob.engine}; "
                                   "include it in the sweep or promote with force")
            else:
                now = remeasured.worst.speedup.value if remeasured.worst else None
                state = f"{now:.3f}x" if now is not None else "unmeasurable"
                excused.append(f"{what}; re-measured here, {ob.engine} now gives {state}"
                               + (f" and is rejected ({remeasured.rejected[0].gate})"
                                  if remeasured.rejected else ""))
        old_curve = ob.per_position_acceptance
        if not old_curve or drops is not None:
            continue
        new_curve = (remeasured.per_position_acceptance if remeasured else ()) or (
            nb.per_position_acceptance if nb.drafter == ob.drafter else ())
        for i, (a, b) in enumerate(zip(old_curve, new_curve, strict=False)):
            if a - b > promote.acceptance_drop:
                found.append(f"band {label}: {ob.drafter} acceptance at position {i + 1} fell "
                             f"{a:.3f} -> {b:.3f} (> {promote.acceptance_drop:.3f})")
    if drops is not None:
        found = list(drops)
    return GateResult(not regressions, tuple(regressions), tuple(excused), tuple(found),
                      tuple(notes))


def _version(record: ChampionRecord, now: dt.datetime) -> str:
    blob = json.dumps(record.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      default=str)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


# --------------------------------------------------------------------------------------------
# Promote and restore


def promote_class(result: ClassResult, engines: Mapping[str, EngineConfig],
                  promote: PromoteSpec, *, output_dir: str | Path | None = None,
                  force: bool = False, on_promoted: Hook | None = None,
                  before_replace: BeforeReplace | None = None,
                  now: dt.datetime | None = None, sweep_id: str | None = None,
                  acceptance_drops: Mapping[str, Sequence[str]] | None = None) -> Promotion:
    """Make one class's decision its champion, unless the regression gate refuses it.

    `engines`: the plan's EngineConfigs by hash (the deployable argv and speculative config come
    from them). `force` overrides the gate (recorded). `on_promoted` runs after the champion is
    in place; if it raises, the files stay promoted and the error propagates. `sweep_id`: the
    sweep decided on, recorded in the files. `acceptance_drops`: per class, the champion's
    per-position acceptance drops beyond noise from a comparison with its sweep (see
    `regression_gate`); a class not in it keeps the fixed threshold. `before_replace`: called
    before a local file is renamed into place (fault injection)."""
    store = class_store(output_dir if output_dir is not None else promote.output_dir,
                        result.traffic_class)
    now = now or dt.datetime.now(dt.UTC)
    record = build_record(result, engines, promote)
    version = _version(record, now)
    for _ in range(SWAPS):
        with _locked(store):
            promotion = _promote_once(store, result, record, version, promote, force=force,
                                      before_replace=before_replace, now=now,
                                      sweep_id=sweep_id, acceptance_drops=acceptance_drops)
        if promotion is not None:
            break
    else:
        raise _raced(store, result.traffic_class)
    if promotion.status == "promoted" and on_promoted is not None:
        on_promoted(promotion)
    return promotion


def _promote_once(store: Store, result: ClassResult, record: ChampionRecord, version: str,
                  promote: PromoteSpec, *, force: bool, before_replace: BeforeReplace | None,
                  now: dt.datetime, sweep_id: str | None,
                  acceptance_drops: Mapping[str, Sequence[str]] | None) -> Promotion | None:
    """One decision against the champion there now; None when another promotion swapped the
    champion before this one could (decide again)."""
    cls = result.traffic_class
    old, tag = _current(store)
    previous = _plain(old.version) if old is not None else None
    stamp: dict[str, Any] = {**dict(record), "version": version, "created_at": now.isoformat(),
                             "previous": previous, "sweep_id": sweep_id}
    if any(d.outcome == "unresolved" for d in result.decisions) and not force:
        # Never promote on an undecided band, not even "off": the champion stays.
        unresolved = VersionedRecord(**stamp)
        key = f"unresolved/{version}.json"
        store.write(key, record_json(unresolved), before_replace)
        return Promotion(cls, "unresolved", version, store.location(key), previous,
                         GateResult(True), unresolved)
    if old is not None and previous is not None and not force and \
            version.split("-", 1)[1] == previous.split("-", 1)[-1]:
        # the same evidence again (a resumed or re-validated sweep with nothing new)
        return Promotion(cls, "unchanged", previous, store.location(CHAMPION),
                         _plain(old.previous), GateResult(True), old)
    drops = (acceptance_drops or {}).get(cls)
    gate = regression_gate(record, old, promote, result.decisions, drops)
    if force and not gate.passed:
        gate = dataclasses.replace(gate, passed=True, forced=True)
    gated = GatedRecord(**stamp, gate=gate)
    if not gate.passed:
        key = f"refused/{version}.json"
        store.write(key, record_json(gated), before_replace)
        return Promotion(cls, "refused", version, store.location(key), previous, gate, gated)
    if store.local:
        store.write(CHAMPION, record_json(gated), before_replace)
        store.write(history_key(version), record_json(gated), before_replace)
    elif store.replace_if(CHAMPION, record_json(gated), tag):
        store.create(history_key(version), record_json(gated))
    else:
        return None
    return Promotion(cls, "promoted", version, store.location(CHAMPION), previous, gate, gated)


def _plain(version: JsonValue) -> str | None:
    """A version read from a file, if it is a plain version name."""
    return version if is_plain_name(version) else None


def promote_all(analysis: Analysis, engines: Mapping[str, EngineConfig], promote: PromoteSpec,
                **kwargs: Any) -> list[Promotion]:
    """`promote_class` for every decided traffic class."""
    return [promote_class(r, engines, promote, **kwargs) for r in analysis.classes]


def restore(output_dir: str | Path, traffic_class: str, version: str | None = None, *,
            on_restored: Hook | None = None) -> Promotion:
    """Make an earlier champion current again: `version`, or by default the one the current
    champion replaced (so repeated calls walk back through history)."""
    store = class_store(output_dir, traffic_class)
    if not store.isdir(""):
        raise PromotionError(f"nothing was ever promoted for traffic class {traffic_class!r} "
                             f"under {shown(output_dir)}")
    for _ in range(SWAPS):
        with _locked(store):
            try:
                (current, tag), unreadable = _current(store), None
            except PromotionError as exc:  # restoring a named version repairs it
                (current, tag), unreadable = (None, _tag_of(store)), exc
            wanted = version if version is not None else \
                _previous(output_dir, traffic_class, current, unreadable)
            key = history_key(wanted)
            try:
                record = _read(store, key)
            except FileNotFoundError:
                raise PromotionError(f"traffic class {traffic_class!r} has no version "
                                     f"{wanted!r}; known: {history(output_dir, traffic_class)}"
                                     ) from None
            if store.replace_if(CHAMPION, record_json(record), tag):
                break
    else:
        raise _raced(store, traffic_class)
    restored = Promotion(traffic_class, "restored", wanted, store.location(CHAMPION),
                         _plain(current.version) if current else None, GateResult(True), record)
    if on_restored is not None:
        on_restored(restored)
    return restored


def _tag_of(store: Store) -> str | None:
    """The tag of a champion file that cannot be parsed (restore replaces it)."""
    try:
        return store.read_tagged(CHAMPION)[1]
    except FileNotFoundError:
        return None


def _previous(output_dir: str | Path, traffic_class: str, current: GatedRecord | None,
              unreadable: PromotionError | None) -> str:
    """The version the current champion replaced (restore's default), checked."""
    name_one = (f"name the version to restore: restore {traffic_class} VERSION; known: "
                f"{history(output_dir, traffic_class)}")
    if unreadable is not None:
        raise PromotionError(f"the current champion of traffic class {traffic_class!r} is "
                             f"unreadable ({unreadable}); {name_one}")
    previous = current.previous if current else None
    if previous is None:
        raise PromotionError(f"traffic class {traffic_class!r} has no previous champion "
                             "to restore")
    if not is_plain_name(previous):
        raise PromotionError(f"the current champion of traffic class {traffic_class!r} names "
                             f"previous version {previous!r}, which is not a plain version "
                             f"name; {name_one}")
    return previous
