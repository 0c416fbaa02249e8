"""What a sweep's steps return across a boundary: Prefect task and flow results, and what the
CLI prints from them. Each is a pydantic model, so a flow run's result, the console and a script
read the same fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from specflow.spec.memory import Fit


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Prepared(_Summary):
    """The sweep as `prepare` opened it: what the flow needs to sequence its tasks."""

    plan_hash: str
    sweep_id: str
    synced: int
    """Windows of the ledger logged to MLflow while opening (a resumed sweep's backlog)."""
    design: str
    dispatch: str | None
    """The work pool deployment each engine config runs on (None: in this process)."""
    engines: list[tuple[str, str]]
    """(engine hash, name) of every engine config, in plan order."""
    headroom: dict[str, Fit]
    """Engine hash -> its fit."""
    tracking_error: str | None
    notes: list[str]
    soak: bool


class UnitResult(_Summary):
    """What measuring one unit did: an engine config, an engine start of a round or the
    closing baseline, measured here (the counts) or dispatched to a work pool (its flow run)."""

    engine: str | None
    hash: str | None = None
    skipped: int = 0
    """Windows already in the ledger (not measured again)."""
    ok: int = 0
    failed: int = 0
    started: bool = False
    seq: int | None = None
    start: int | None = None
    stage: str | None = None
    error: str | None = None
    """Why the unit did not finish (its task's or flow run's message)."""
    kind: str | None = None
    key: str | None = None
    flow_run: str | None = None
    flow_run_id: str | None = None
    state: str | None = None
    attempts: int | None = None
    host: str | None = None
    devices: list[str] | None = None
    recorded_failed: int | None = None
    """Windows recorded as failed when a dispatched unit was given up."""


class NextRound(_Summary):
    """The racing round to run now, or none (`round` None: the race is over)."""

    round: int | None
    lines: list[str]
    stage: str | None = None
    starts: list[tuple[int, str]] = []
    """(position in the run order, engine config name) of each engine start."""
    windows: int = 0


class PromotionLine(_Summary):
    traffic_class: str
    status: str
    version: str
    path: str


class SearchCost(_Summary):
    """Engine starts and windows spent, and what the grid of the same plan costs."""

    search: str
    engine_starts: int
    windows: int
    engine_seconds: float
    grid_engine_starts: int
    grid_windows: int


class ComparisonLine(_Summary):
    """The re-validation's comparison with the previous sweep of the same plan."""

    previous: str | None
    summary: str
    markdown: str | None
    regressions: int
    champion_regressed: list[str]
    """Classes whose champion regressed."""
    applied: list[str]
    message: str | None
    """Set when a champion regressed beyond noise (the main job exits 3)."""


class SweepSummary(_Summary):
    """The decision as the flow returns it and the console prints it."""

    decided: bool
    problems: list[str]
    report: str | None
    plots: list[str]
    promotions: list[PromotionLine]
    table: list[dict[str, Any]]
    """`decision_rows`: one row per band x candidate, plus each band's "off" row."""
    windows: int
    ok: int
    slowed: list[str]
    unlogged: int
    tracking_uri: str
    tracking_error: str | None
    experiment: str
    parent_run_id: str | None
    run_link: str | None
    missing: list[str]
    cost: SearchCost
    comparison: ComparisonLine | None
    services: list[str] = []
    """Per service and band: its answer beside routing each class to its own champion."""
    realism: list[str] = []
    """What the measured windows show unlike the traffic they replay."""
    beside: list[str] = []
    """Per class and band measured for other objectives too: their answers beside the
    decision, and whether they agree."""


class SoakSummary(_Summary):
    engine: str
    windows: int
    lines: list[str]
    report: str
    findings: dict[str, str]


class SweepResult(_Summary):
    """The sweep flow's result."""

    plan: Prepared
    engines: list[UnitResult]
    closing: UnitResult | list[UnitResult] | None
    outcome: SweepSummary
    soak: SoakSummary | None = None
