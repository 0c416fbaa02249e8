"""What a sweep's context logs as its MLflow `config.yaml`: the real composed conf/, no secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specflow.config.artifact import REDACTED, artifact_config
from specflow.config.compose import load

TOKEN = "hf_secret_0123456789"
LITERAL = "literal-secret-9876543210"


def test_config_artifact_redacts_backend_env_and_keeps_env_interpolations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECFLOW_TEST_TOKEN", TOKEN)
    loaded = load(["experiment=cpu_tiny",
                   "+backend.env.HF_TOKEN=${oc.env:SPECFLOW_TEST_TOKEN}",
                   f"+backend.env.OTHER_KEY={LITERAL}",
                   "target.revision=${oc.env:SPECFLOW_TEST_TOKEN}",
                   "tracking.experiment=${backend.env.HF_TOKEN}"])
    assert loaded.spec.backend.env["HF_TOKEN"] == TOKEN  # the run itself gets the values
    assert loaded.spec.tracking.experiment == TOKEN

    text = artifact_config(loaded)
    assert TOKEN not in text and LITERAL not in text
    cfg = yaml.safe_load(text)
    assert cfg["backend"]["env"] == {"HF_HUB_OFFLINE": REDACTED, "HF_TOKEN": REDACTED,
                                     "OTHER_KEY": REDACTED}
    assert cfg["target"]["revision"] == "${oc.env:SPECFLOW_TEST_TOKEN}"
    assert cfg["tracking"]["experiment"] == "${oc.env:SPECFLOW_TEST_TOKEN}"
    # everything else is the validated config: references followed, names filled in
    assert cfg["target"]["model"] == loaded.raw["target"]["model"]
    assert "${" not in cfg["target"]["model"]
    assert cfg["target"]["name"] == loaded.raw["target"]["name"]
    assert set(cfg) == set(loaded.raw) and set(cfg["drafter"]) == set(loaded.raw["drafter"])
    assert {k: v for k, v in cfg.items() if k not in ("backend", "target", "tracking")} == {
        k: v for k, v in loaded.raw.items() if k not in ("backend", "target", "tracking")}


def test_config_artifact_of_a_plain_config_is_the_config() -> None:
    loaded = load(["target=qwen3_8b", "drafter=eagle3"])
    cfg = yaml.safe_load(artifact_config(loaded))
    assert cfg["backend"]["env"] == {}
    assert cfg == loaded.raw


def _sid(*overrides: str) -> str:
    from specflow.config.compose import load_plan
    from specflow.results.ledger import sweep_id
    from specflow.steps.context import measured_settings

    loaded, plan = load_plan(["experiment=cpu_tiny", *overrides])
    return sweep_id(plan.hash, "0.32.0", measured_settings(loaded.spec))


@pytest.mark.parametrize("change", [
    "workload.chat.max_tokens=9", "workload.chat.num_prompts=5", "sweep.warmup_requests=3",
    "sweep.design=grid", "workload=[chat]"])
def test_what_changes_a_window_changes_the_sweep(change: str) -> None:
    """A different output length, prompt set, warm-up or design is another sweep: its windows
    are never taken for the old ones on resume."""
    assert _sid(change) != _sid()


@pytest.mark.parametrize("change", ["promote.margin=0.1", "promote.confidence=0.9"])
def test_what_changes_only_the_decision_reuses_the_windows(change: str) -> None:
    assert _sid(change) == _sid()


def test_the_round_planner_gets_each_engines_kv_capacity_from_headroom(tmp_path: Path) -> None:
    """The adaptive search caps a prediction where the candidate's KV cache holds fewer
    requests than the level: the shape it plans with carries headroom's maximum concurrency."""
    from specflow.config.compose import load_plan
    from specflow.results.ledger import Ledger
    from specflow.spec.memory import headroom
    from specflow.steps.context import Context

    loaded, plan = load_plan(["experiment=cpu_tiny",
                              "backend.engine.kv_cache_memory_bytes=8388608"])
    reports = {ec.hash: headroom(loaded.spec, ec) for ec in plan.engine_configs}
    ctx = Context((), loaded, plan, None, Ledger(tmp_path, "sid"),  # type: ignore[arg-type]
                  reports, {}, [])
    kv = ctx.shape().kv_capacity
    assert kv == {h: r.concurrency_at_context for h, r in reports.items()}
    by_name = {ec.name: kv[ec.hash] for ec in plan.engine_configs}
    # the copy drafter's own KV cache and lookahead slots leave room for fewer requests
    assert 0 < by_name["draft_model-n4"] < by_name["baseline"]


def _context(tmp_path: Path, *overrides: str):  # noqa: ANN202 - a Context
    """A sweep's context without vLLM: composed plan, headroom, windows over a named dataset."""
    from specflow.config.compose import load_plan
    from specflow.engine.runner import plan_windows
    from specflow.results.ledger import Ledger
    from specflow.spec.memory import headroom
    from specflow.steps.context import Context

    loaded, plan = load_plan(["experiment=cpu_tiny", "workload=[chat]", *overrides])
    s = loaded.spec
    windows = plan_windows(s.workload, {"chat": tmp_path / "chat.jsonl"}, s.sweep.concurrency,
                           s.sweep.repeats, s.sweep.warmup_requests)
    return Context(tuple(overrides), loaded, plan, None,  # type: ignore[arg-type]
                   Ledger(tmp_path, "sid"),
                   {ec.hash: headroom(s, ec) for ec in plan.engine_configs}, {}, windows)


def test_each_unit_a_worker_is_sent_names_its_engine_and_windows_and_gives_up_on_the_rest(
        tmp_path: Path) -> None:
    """What a pool's worker measures for each kind of unit (a grid's engine config, its closing
    baseline, a race's planned start), and what the sweep records for a unit measured nowhere:
    its unfinished windows, failed with the reason; finished windows are kept."""
    from dataclasses import replace

    from specflow.steps import give_up, progress, unit_of

    ctx = _context(tmp_path, "sweep.design=grid", "sweep.closing_baseline_repeats=1")
    ec = ctx.plan.engine_configs[1]
    got, windows, start = unit_of(ctx, "engine", ec.hash)
    assert got == ec and windows == ctx.windows and start is None
    base, closing, _ = unit_of(ctx, "closing", "baseline")
    assert base == ctx.baseline() and closing == ctx.closing_windows() and closing
    from tests.builders import window

    done = replace(window(ec, 100.0, workload="chat", cls="chat"), key=ctx.windows[0].key(ec))
    ctx.ledger.record(done)
    assert give_up(ctx, ec, windows, "worker_lost", "flow run x crashed") == len(windows) - 1
    failed = [m for m in ctx.ledger.measurements() if not m.ok]
    assert {m.failure for m in failed} == {"worker_lost"} and len(failed) == len(windows) - 1
    assert ctx.ledger.get(done.key.id).measurement.ok  # kept as it was

    race = _context(tmp_path / "race", "sweep.design=race")
    current = progress(race).current
    assert current is not None and current.starts
    first = current.starts[0]
    got, windows, start = unit_of(race, "start", str(first.seq))
    assert start == first and got is not None and got.hash == first.engine_hash
    assert [w.key(got) for w in windows] == list(first.window_keys())
    assert unit_of(race, "start", "999") == (None, [], None)  # a start of no current round


def test_a_racing_start_measures_its_own_slowed_windows_once_more(tmp_path: Path) -> None:
    """What a racing start hands its engine after its planned windows: each of its own windows
    that the sweep's records show slowed by outside load, numbered AGAIN + its repeat, once;
    nothing for a start whose windows are all steady, nothing once the window was measured
    again."""
    from dataclasses import replace

    import numpy as np

    from specflow.records.measurement import AGAIN, Measurement
    from specflow.search.plan import EngineStart
    from specflow.steps import progress, unit_of
    from specflow.steps.measure import slowed_again
    from tests.builders import window

    race = _context(tmp_path, "sweep.design=race", "sweep.repeats=3")
    current = progress(race).current
    assert current is not None and len(current.starts) >= 4
    rng = np.random.default_rng(0)
    units = [unit_of(race, "start", str(s.seq)) for s in current.starts]
    slowed = units[1][1][0]  # the second start's first window
    for ec, windows, start in units:
        assert ec is not None and start is not None
        for w in windows:
            hit = ec == units[1][0] and w == slowed
            tput = 100.0 * (1 + 0.01 * rng.standard_normal()) * (0.6 if hit else 1.0)
            race.ledger.record(replace(window(ec, tput, workload="chat", cls="chat",
                                              c=w.concurrency, r=w.repeat),
                                       key=w.key(ec), seq=start.seq, stage=start.stage,
                                       round=start.round))

    def mine(start: EngineStart) -> list[Measurement]:  # the start's windows, as measured
        return [m for m in race.ledger.measurements() if m.seq == start.seq]

    picks = [slowed_again(race, ec, windows, start)(mine(start))
             for ec, windows, start in units]
    assert picks[0] == [] and all(p == [] for p in picks[2:])
    assert picks[1] == [replace(slowed, repeat=slowed.repeat + AGAIN)]  # its start kept
    ec, windows, start = units[1]
    pick = slowed_again(race, ec, windows, start)
    assert pick([]) == []  # a start that measured nothing (it failed) measures nothing again
    assert pick(mine(start)) == picks[1]
    again = picks[1][0]
    race.ledger.record(replace(window(ec, 100.0, workload="chat", cls="chat",
                                      c=again.concurrency, r=again.repeat),
                               key=again.key(ec), seq=start.seq, stage=start.stage,
                               round=start.round))
    assert pick(mine(start)) == []  # measured again once, never twice
