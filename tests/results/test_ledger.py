"""The sweep ledger on real files: resume sets, and bad window files moved aside, never fatal."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from specflow.records.measurement import MEASUREMENT
from specflow.results.ledger import Ledger
from tests.builders import BASELINE, window

GOOD = window(BASELINE, 100.0, c=1)
BAD = window(BASELINE, 100.0, c=4)
"""The window whose window file gets damaged."""

DAMAGE = {
    "truncated": b'{"measurement": {"key": {"engine_hash": "ab',
    "empty": b"",
    "binary": b"\x00\xff\xfe\x9c\x80garbage\x00",
    "a list": b"[1, 2, 3]\n",
    "no measurement": b'{"run_id": null, "logged": false}\n',
    "measurement of the wrong shape": b'{"measurement": {"key": {"x": 1}}, "logged": false}\n',
    "another window's record": json.dumps(
        {"measurement": MEASUREMENT.dump_python(GOOD, mode="json"), "run_id": None,
         "logged": False}).encode(),
    "logged of the wrong type": json.dumps(
        {"measurement": MEASUREMENT.dump_python(BAD, mode="json"), "run_id": None,
         "logged": "yes"}).encode(),
}


def _ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path, "sweep1")
    ledger.record(GOOD, run_id="run-good")
    ledger.record(BAD)
    return ledger


def test_windows_round_trip_through_their_files(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    failed = window(BASELINE, 0.0, c=8, failure="oom")
    ledger.record(failed)
    ledger.mark_logged(GOOD.key.id, "run-good")
    assert ledger.finished() == {GOOD.key.id, BAD.key.id}
    assert [e.measurement.key.id for e in ledger.unlogged()] == sorted(
        [BAD.key.id, failed.key.id], key=lambda i: ledger._path(i).name)
    again = Ledger(tmp_path, "sweep1").get(GOOD.key.id)
    assert again is not None and again.measurement == GOOD and again.logged
    assert again.run_id == "run-good"


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_bad_window_file_is_quarantined_and_measured_again(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    ledger = _ledger(tmp_path)
    bad_file = ledger._path(BAD.key.id)
    bad_file.write_bytes(DAMAGE[damage])

    with caplog.at_level(logging.WARNING, logger="specflow.results.ledger"):
        assert ledger.finished() == {GOOD.key.id}  # the bad window counts as missing
    assert not bad_file.exists()
    (moved,) = (ledger.windows / "quarantine").iterdir()
    assert moved.name.startswith(bad_file.name + ".")
    assert moved.read_bytes() == DAMAGE[damage]  # kept as it was, for a post-mortem
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert str(bad_file) in caplog.text and str(moved) in caplog.text

    # every reader copes, and a re-run's record() repairs the window
    assert [e.measurement for e in ledger.entries()] == [GOOD]
    assert [e.measurement for e in ledger.unlogged()] == [GOOD]  # logged: never marked
    assert ledger.get(BAD.key.id) is None
    ledger.record(BAD)
    assert ledger.finished() == {GOOD.key.id, BAD.key.id}
    assert ledger.get(BAD.key.id) is not None


def test_record_repairs_a_bad_file_it_meets_first(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger._path(BAD.key.id).write_bytes(DAMAGE["truncated"])
    ledger.record(BAD, run_id="run-bad")
    entry = ledger.get(BAD.key.id)
    assert entry is not None and entry.measurement == BAD and entry.run_id == "run-bad"
    assert len(list((ledger.windows / "quarantine").iterdir())) == 1


def test_a_torn_event_line_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = _ledger(tmp_path)
    ledger.engine_started("baseline", BASELINE.hash, "host-a", ("0",))
    with open(ledger.dir / "events.jsonl", "a", encoding="utf-8") as fh:  # an older sweep's
        fh.write('{"t": 0.5, "event": "engine_start", "pid": 1, "engine": "old", "hash": "h", '
                 '"host": "h", "devices": null}\n')
        fh.write('{"t": 1.0, "event": "engine_st')  # killed mid-append
    with caplog.at_level(logging.WARNING, logger="specflow.results.ledger"):
        old, start = ledger.engine_starts()
    assert old.engine == "old"  # an older sweep's events.jsonl is still read, first
    assert (start.engine, start.hash, start.host, start.devices) == (
        "baseline", BASELINE.hash, "host-a", ("0",))
    assert "events.jsonl:2" in caplog.text



def test_a_lease_is_renewed_without_an_opened_sweep_and_read_back(tmp_path: Path) -> None:
    from specflow.results.ledger import renew_lease

    ledger = _ledger(tmp_path)
    assert ledger.lease("engine-abc") is None
    renew_lease(ledger.lease_path("engine-abc"), flow_run_id="r1", devices=["0"])
    first = ledger.lease("engine-abc")
    assert first is not None and first.flow_run_id == "r1" and first.devices == ("0",)
    renew_lease(ledger.lease_path("engine-abc"), flow_run_id="r1", devices=["0"])
    again = ledger.lease("engine-abc")
    assert again is not None and again.t >= first.t
    ledger.lease_path("engine-abc").write_text("{torn")
    assert ledger.lease("engine-abc") is None  # unreadable: as if never renewed
