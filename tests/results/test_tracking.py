"""The MLflow side of a window and of a champion, on a real MLflow store (sqlite in a temp dir):
a run that a killed logger left half-written is completed without logging any metric twice; a
champion is registered in the glossary's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from specflow.results.tracking import WINDOW_TAG, Tracker
from tests.builders import engine, window

NGRAM = engine("ngram-n2", "ngram", 2)


@pytest.fixture
def tracker(tmp_path: Path) -> Tracker:
    return Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "specflow/tiny/cpu",
                   artifact_root=tmp_path / "artifacts")


def _history(t: Tracker, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = t.client.get_run(run_id)
    return {k: sorted((m.step, m.value) for m in t.client.get_metric_history(run_id, k))
            for k in run.data.metrics}


def test_a_run_left_running_by_a_killed_logger_is_completed_without_duplicates(
        tracker: Tracker) -> None:
    """Killed after the metrics were logged but before the run ended (the scale-out test's
    worker, SIGKILLed while logging): the retry finds the run by its point id and ends it; each
    metric keeps one value per step, the params are not logged again."""
    parent = tracker.client.create_run(tracker.experiment_id()).info.run_id
    m = window(NGRAM, 120.0, ppa=(0.8, 0.5))
    first = tracker.log_window(parent, m, NGRAM)
    once = _history(tracker, first)
    assert once["output_throughput"] == [(0, 120.0)]
    assert once["acceptance_per_position"] == [(0, 0.8), (1, 0.5)]
    tracker.client.update_run(first, status="RUNNING")  # what the kill leaves

    again = tracker.log_window(parent, m, NGRAM)
    assert again == first
    assert _history(tracker, again) == once
    run = tracker.client.get_run(again)
    assert run.info.status == "FINISHED" and run.data.tags[WINDOW_TAG] == m.key.id
    assert tracker.log_window(parent, m, NGRAM) == first  # finished: nothing more is logged
    assert _history(tracker, first) == once


def test_a_run_killed_before_its_first_metric_is_completed_whole(tracker: Tracker) -> None:
    """Killed right after the run was created: the retry logs its params and every metric."""
    parent = tracker.client.create_run(tracker.experiment_id()).info.run_id
    m = window(NGRAM, 80.0, ppa=(0.7, 0.4))
    bare = tracker.client.create_run(tracker.experiment_id(), tags={
        "mlflow.parentRunId": parent, WINDOW_TAG: m.key.id}).info.run_id

    assert tracker.log_window(parent, m, NGRAM) == bare
    run = tracker.client.get_run(bare)
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == "ngram" and run.data.params["num_speculative_tokens"] == "2"
    history = _history(tracker, bare)
    assert history["output_throughput"] == [(0, 80.0)]
    assert history["acceptance_per_position"] == [(0, 0.7), (1, 0.4)]


def test_a_champion_is_registered_with_its_outcome_in_the_glossarys_words(
        tracker: Tracker, tmp_path: Path) -> None:
    """The MLflow model registry says what promotion wrote: the version, and the outcome
    (`promote` or `off`, the words of champion.json and the report), under the alias
    `champion`."""
    from tests.champions.test_promote import _promote

    parent = tracker.client.create_run(tracker.experiment_id()).info.run_id
    for scenario, outcome in (("first", "promote"), ("slower", "off")):
        p = _promote(scenario, tmp_path / "promoted" / scenario)
        version = tracker.register_champion(parent, p, "tiny", "cpu")
        mv = tracker.client.get_model_version_by_alias("specflow-tiny-math", "champion")
        assert str(mv.version) == version
        assert mv.tags == {"specflow.version": p.version, "specflow.decision": outcome}
