"""`promote.on_regression`: a champion whose engine regressed beyond noise, on hand-built records
(the real-engine run is tests/results/test_compare_sweeps.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specflow.champions.promote import champion, promote_class
from specflow.decision.choose import analyze
from specflow.decision.compare import Change, Comparison
from specflow.steps.revalidate import apply_policy, champion_regressions, position_drops
from tests.builders import sweep
from tests.champions.test_promote import E3N3, ENGINES, SCENARIOS, SPEC, scenario


def _comparison(engine: str, metric: str = "speedup", finding: str = "regression") -> Comparison:
    row = Change("math", "gsm8k", 1, engine, metric, None, 1.6, 1.1,  # type: ignore[arg-type]
                 0.69, 0.6, 0.8, "ratio", 0.001, "3 + 3 engine starts", finding)  # type: ignore[arg-type]
    return Comparison("A", "B", (row,), (("vllm", "0.31.0", "0.32.0"),), (), (), (), 0.95, 0.02)


@pytest.mark.parametrize("policy", ["keep", "demote", "off"])
def test_a_regressed_champion_is_kept_demoted_or_turned_off(tmp_path: Path, policy: str) -> None:
    spec = SPEC.model_copy(update={"output_dir": str(tmp_path)})
    first, engines, _ = scenario("first")
    old = promote_class(first, engines, spec)
    assert old.status == "promoted" and old.record.engine.hash == E3N3.hash
    champions = {"math": champion(tmp_path, "math")}
    # the re-validation measured the champion well below its claim: the gate refuses the new
    # decision; the comparison says the champion's engine regressed beyond noise
    analysis = analyze(sweep(SCENARIOS["worse_remeasured"], levels=(1, 4, 32), repeats=3)[0],
                       SPEC)
    promotions = [promote_class(analysis.result("math"), ENGINES, spec)]
    assert promotions[0].status in ("refused", "promoted")
    regressed = champion_regressions(_comparison("eagle3-n3"), champions)
    assert list(regressed) == ["math"] and "eagle3-n3 speedup at gsm8k c=1" in regressed["math"][0]
    lines = apply_policy(policy, regressed, analysis, promotions, ENGINES, spec, "sweep-b")
    now = champion(tmp_path, "math")
    assert now is not None
    if policy == "off":
        assert now.outcome == "off" and now.sweep_id == "sweep-b" and now.previous is not None
        assert lines[0].startswith("math: demoted to off (promote.on_regression=off)")
        assert promotions[0].status == "promoted" and promotions[0].record.outcome == "off"
    elif promotions[0].status == "promoted":  # the new decision passed the gate on its own
        assert now.version == promotions[0].version
        assert lines == ["math: the champion is this sweep's decision already (it passed the "
                         "regression gate)"]
    elif policy == "keep":
        assert now.version == old.version
        assert lines == ["math: the regressed champion is kept (promote.on_regression=keep)"]
    else:
        assert now.version != old.version and now.gate.forced and now.sweep_id == "sweep-b"
        assert lines[0].startswith("math: demoted to this sweep's decision")


@pytest.mark.parametrize("policy", ["keep", "demote"])
def test_a_refused_decision_is_kept_or_forced_past_the_gate(tmp_path: Path, policy: str) -> None:
    """The new decision lost to the champion's claim without re-measuring it: the gate refuses
    it; `demote` promotes it anyway (recorded as forced), `keep` leaves the champion."""
    spec = SPEC.model_copy(update={"output_dir": str(tmp_path)})
    first, engines, _ = scenario("first")
    old = promote_class(first, engines, spec)
    champions = {"math": champion(tmp_path, "math")}
    analysis = analyze(sweep(SCENARIOS["worse_unmeasured"], levels=(1, 4, 32), repeats=3)[0],
                       SPEC)
    promotions = [promote_class(analysis.result("math"), ENGINES, spec)]
    assert promotions[0].status == "refused"
    regressed = champion_regressions(_comparison("eagle3-n3"), champions)
    lines = apply_policy(policy, regressed, analysis, promotions, ENGINES, spec, "sweep-b")
    now = champion(tmp_path, "math")
    assert now is not None
    if policy == "keep":
        assert now.version == old.version and promotions[0].status == "refused"
        assert lines == ["math: the regressed champion is kept (promote.on_regression=keep)"]
    else:
        assert now.version != old.version and now.gate.forced and now.sweep_id == "sweep-b"
        assert promotions[0].status == "promoted"
        assert lines[0].startswith("math: demoted to this sweep's decision")


def test_only_the_champions_own_engine_counts(tmp_path: Path) -> None:
    first, engines, spec = scenario("first")
    promote_class(first, engines, spec, output_dir=tmp_path)
    champions = {"math": champion(tmp_path, "math")}
    assert champion_regressions(_comparison("eagle3-n2"), champions) == {}  # not the champion
    assert champion_regressions(_comparison("eagle3-n3", "throughput"), champions) == {}
    assert champion_regressions(_comparison("eagle3-n3", finding="no change beyond noise"),
                                champions) == {}
    assert champion_regressions(_comparison("eagle3-n3", "acceptance length"), champions)
    assert champion_regressions(_comparison("eagle3-n3"), {"math": None}) == {}


def test_the_documented_automation_is_one_prefect_accepts() -> None:
    """docs/comparing.md's notification recipe validates as a Prefect automation and listens for
    the state the flow ends in when a champion regressed."""
    import re
    import uuid

    import yaml
    from prefect.events.schemas.automations import AutomationCore

    import pipelines.sweep

    text = (Path(__file__).resolve().parents[2] / "docs" / "comparing.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    data = yaml.safe_load(block.replace("<your Slack or email block's id>", str(uuid.uuid4())))
    automation = AutomationCore.model_validate(data)
    from specflow.records.summaries import ComparisonLine, SweepResult, SweepSummary

    def result(message: str | None) -> SweepResult:
        line = ComparisonLine.model_construct(message=message) if message else None
        return SweepResult.model_construct(outcome=SweepSummary.model_construct(comparison=line))

    state = pipelines.sweep._ended(result("regressed"))
    assert automation.trigger.expect == {f"prefect.flow-run.{state.name}"}  # type: ignore[union-attr]
    assert automation.trigger.match_related.root["prefect.resource.name"] == (  # type: ignore[union-attr]
        pipelines.sweep.sweep_flow.name)
    assert state.is_completed() and state.message == "regressed"
    quiet = result(None)
    assert pipelines.sweep._ended(quiet) is quiet


def test_a_comparison_replaces_the_fixed_acceptance_drop_threshold(tmp_path: Path) -> None:
    """Scenario `acceptance_drop`: position 2 fell 0.6 -> 0.45, beyond the fixed 0.05
    (tests/champions/test_promote.py). With a comparison of the two sweeps the gate flags what
    fell beyond noise instead: nothing when the comparison found no drop, its row when it did."""
    first, engines, spec = scenario("first")
    dropped = scenario("acceptance_drop")[0]
    same = _comparison("eagle3-n3", "acceptance at position", "no change beyond noise")
    row = dataclasses.replace(same.changes[0], position=2, a=0.6, b=0.45, change=-0.15,
                              lo=-0.2, hi=-0.1, scale="difference", finding="regression")
    fell = dataclasses.replace(same, changes=(row,))
    gates = []
    for name, cmp in (("same", same), ("fell", fell)):
        out = tmp_path / name
        promote_class(first, engines, spec, output_dir=out)
        champions = {"math": champion(out, "math")}
        drops = position_drops(cmp, champions)
        gates.append(promote_class(dropped, engines, spec, output_dir=out,
                                   acceptance_drops=drops).gate)
    assert gates[0].acceptance_drops == ()
    (line,) = gates[1].acceptance_drops
    assert line.startswith("eagle3-n3 acceptance at position 2 (gsm8k c=1) fell 0.600 -> 0.450, "
                           "beyond noise (-0.150 [-0.200, -0.100])")
    assert position_drops(_comparison("eagle3-n2", "acceptance at position"),
                          {"math": champion(tmp_path / "same", "math")}) == {}
