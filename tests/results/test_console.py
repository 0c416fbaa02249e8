"""The decision as a person reads it in a terminal, a log file or a narrow console."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rich.console import Console

from specflow.decision.choose import analyze
from specflow.decision.wording import decision_rows
from specflow.records.summaries import SearchCost, SweepSummary
from specflow.results.console import NARROW, decision_lines, deploy_lines, print_outcome
from specflow.results.report import decision_note
from specflow.spec.schema import PromoteSpec
from tests.builders import Cand, engine, sweep

LONG = ("chat: the emitted schedule [[1, 3, 4], [4, 4, 0]] is not promoted: it was not measured "
        "as one engine (the budget ran out before it)")
PATH = "/work/main/.specflow/sweeps/ccb4068616fbe85e/report/report.md"
CI = re.compile(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]")


def _summary() -> SweepSummary:
    e3 = engine("eagle3-n3-with-a-long-engine-name", "eagle3", 3)
    ng = engine("ngram-n4", "ngram", 4)
    records, close = sweep([Cand(e3, {1: 1.6, 8: 1.0}), Cand(ng, {1: 1.1, 8: 1.0})],
                           levels=(1, 8), repeats=3, closing=3, cv=0.02,
                           rng=np.random.default_rng(0))
    result = analyze(records, PromoteSpec(), closing_baseline=close)
    table = [row for r in result.classes for row in decision_rows(r)]
    return SweepSummary(
        decided=True, table=table, problems=[LONG], ok=30, windows=30, missing=[],
        promotions=[], report=PATH, plots=[], slowed=[], unlogged=0,
        tracking_uri="sqlite:///m.db", tracking_error=None, experiment="e",
        parent_run_id="abc", run_link="mlflow ui --backend-store-uri sqlite:///m.db, then open "
                                      "http://127.0.0.1:5000/#/experiments/1/runs/abc",
        cost=SearchCost(search="adaptive", engine_starts=9, windows=72, engine_seconds=600.0,
                        grid_engine_starts=17, grid_windows=136), comparison=None)


def test_decision_lines_name_what_each_band_deploys() -> None:
    lines = decision_lines(_summary().table)
    assert [(r["band"], r["deploy"]) for r in lines] == [
        ("c1", "eagle3-n3-with-a-long-engine-name"), ("c8", "off (baseline)")]
    assert CI.fullmatch(lines[0]["speedup [CI]"])
    assert lines[0]["N"] == "3" and lines[1]["N"] == "0"
    assert lines[0]["runner-up / why not"].startswith("ngram-n4: ")


@pytest.mark.parametrize("width", [80, 60, NARROW - 1])
def test_a_narrow_console_never_splits_a_band_or_its_interval(width: int) -> None:
    out = Console(width=width, record=True, color_system=None)
    print_outcome(_summary(), out, 12.0)
    text = out.export_text()
    # each band on one line with its interval whole; the runner-up on the next line
    c1 = next(line for line in text.splitlines() if line.startswith("math c1: "))
    assert "eagle3-n3-with-a-long-engine-name N=3 " in c1 and CI.search(c1)
    assert any(line.startswith("  runner-up: ngram-n4: ") and CI.search(line)
               for line in text.splitlines())
    assert "│" not in text  # no table borders to wrap
    # every other line whole too: a long problem, the report's path
    assert "no decision: " + LONG in text and f"report (every candidate, plots): {PATH}" in text
    assert ("results: mlflow ui --backend-store-uri sqlite:///m.db, then open "
            "http://127.0.0.1:5000/#/experiments/1/runs/abc") in text
    assert ("adaptive search: 9 engine starts, 72 windows (the grid of this plan: 17 starts, "
            "136 windows)") in text


def test_the_last_lines_say_what_to_deploy_per_class_in_words() -> None:
    """A class that speculates in one band and not in another; a class concluded off; an
    undecided class; a decision the regression gate refused."""
    table = _summary().table
    (math,) = deploy_lines(table)
    c1 = next(r for r in table if r["band"] == "c1" and r["verdict"] == "wins")
    assert math == (f"math: eagle3 with N=3 at concurrency 1: {c1['speedup']:.2f}x the "
                    f"throughput without it (interval [{c1['lo']:.2f}, {c1['hi']:.2f}]); "
                    "no speculative decoding at concurrency 8")
    off = [{**r, "traffic_class": "classify"} for r in table if r["band"] == "c8"]
    undecided = [{**r, "traffic_class": "chat", "verdict": "open"}
                 if r["method"] == "none" else {**r, "traffic_class": "chat"}
                 for r in table if r["band"] == "c8"]
    assert [r["method"] for r in off if r["verdict"] == "wins"] == ["none"]
    assert deploy_lines(off + undecided) == [
        "classify: serve without speculative decoding: no drafter measured pays here",
        "chat: unresolved: keep what is deployed now (the report says what would settle it)"]
    refused = deploy_lines(table, [{"traffic_class": "math", "status": "refused"}])
    assert refused == ["math: keep what is deployed now: the new decision did not pass the "
                       "regression gate (see the report)"]
    out = Console(width=80, record=True, color_system=None)
    print_outcome(_summary(), out, 12.0)
    text = out.export_text().splitlines()
    assert text[-2:] == ["what to deploy, per traffic class", f"  {math}"]


def test_a_wide_console_gets_the_table() -> None:
    out = Console(width=160, record=True, color_system=None)
    print_outcome(_summary(), out, 12.0)
    text = out.export_text()
    assert "│" in text and "runner-up / why not" in text
    row = next(line for line in text.splitlines() if "eagle3-n3-with-a-long-engine-name" in line)
    assert CI.search(row)  # the interval in its cell, on the row's line


def test_the_mlflow_note_is_the_decision_table_with_the_champions() -> None:
    lines = decision_lines(_summary().table)
    champions = [("math", "promoted, version 3: /p/math/champion.json")]
    note = decision_note("Decision per traffic class and concurrency band", lines, champions)
    rows = note.splitlines()
    assert rows[0] == "**Decision per traffic class and concurrency band**"
    assert rows[2] == "| " + " | ".join(lines[0]) + " |"  # the console's columns
    body = [r for r in rows if r.startswith("| math |")]
    assert len(body) == len(lines) == 2  # one row per band: c1 and c8
    assert all(CI.search(r) for r in body)
    assert "- math: promoted, version 3: /p/math/champion.json" in rows
    # a cell's own "|" cannot split the Markdown table; MLflow's tag size is kept
    piped = [{**lines[0], "runner-up / why not": "a | b"}]
    assert "a \\| b |" in decision_note("t", piped, [])
    cut = decision_note("t", lines * 200, champions, limit=1000)
    assert len(cut) <= 1000 and cut.endswith("has all of it)")
    assert decision_note("t", [], []).splitlines()[2] == "no decision"


def test_a_window_measured_again_and_the_slowed_ones_are_said() -> None:
    """A window measured again in a slowed one's place is said as such, and counted beyond the
    plan's total ([3/3], never [3/2]); the summary names the slowed windows."""
    from io import StringIO

    from specflow.records.measurement import AGAIN
    from specflow.results.console import SweepProgress
    from tests.builders import window

    base = engine("baseline")
    out = StringIO()
    console = Console(file=out, width=120, force_terminal=False)
    with SweepProgress(console, "sweep", 2) as progress:
        for r in (0, 1, AGAIN + 1):
            progress.window(window(base, 100.0, r=r))
    text = out.getvalue()
    assert "[2/2] baseline gsm8k c1 r1: ok, 100.0 tok/s (0 left" in text
    assert ("[3/3] baseline gsm8k c1 r1001: ok, 100.0 tok/s (measured again: r1 was slowed by "
            "outside load) (0 left") in text
    slowed = [f"baseline at gsm8k c=1, start 0 repeat {r}: 0.60x its start's other windows "
              "(-9.0 robust SDs)" for r in range(7)]
    out = StringIO()
    print_outcome(_summary().model_copy(update={"slowed": slowed}), Console(file=out, width=120),
                  1.0)
    text = out.getvalue()
    assert ("7 windows slowed by outside load, left out of the speedups (their starts' other "
            "windows carry them; the report lists each):") in text
    assert all(f"  {w}" in text for w in slowed[:5]) and slowed[5] not in text
    assert "  ... and 2 more" in text
