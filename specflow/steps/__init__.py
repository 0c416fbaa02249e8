"""The steps of a sweep, callable without Prefect: open, measure one engine config, sync, decide.

`pipelines/` sequences them as Prefect tasks. No step keeps state between calls: each builds its
`Context` from the overrides and the sweep's ledger (`open_sweep`), so a step can run in a fresh
process or on another worker and sees the same sweep.
"""

from specflow.records.summaries import (
    NextRound,
    Prepared,
    SoakSummary,
    SweepResult,
    SweepSummary,
    UnitResult,
)
from specflow.steps.context import Context, OnRound, OnWindow, headroom_reports, open_sweep
from specflow.steps.decide import Decided, decide, outcome_summary
from specflow.steps.measure import (
    UNIT_KINDS,
    DevicesShort,
    give_up,
    log_round,
    measure,
    measurements,
    missing,
    progress,
    run_closing_baseline,
    run_start,
    run_unit,
    to_measure,
    unit_of,
)
from specflow.steps.soak import SoakResult, run_soak

__all__ = [
    "UNIT_KINDS", "Context", "DevicesShort", "give_up", "run_unit", "to_measure",
    "unit_of", "OnWindow", "OnRound", "Decided", "decide", "headroom_reports",
    "measure", "measurements", "missing", "open_sweep", "outcome_summary",
    "log_round", "progress", "run_closing_baseline", "run_start", "SoakResult", "run_soak",
    "NextRound", "Prepared", "SoakSummary", "SweepResult", "SweepSummary", "UnitResult",
]
