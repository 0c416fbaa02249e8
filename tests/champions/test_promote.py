"""Promotion as files: atomic champions, history, restore, the regression gate, crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specflow.champions.promote import (
    GatedRecord,
    Promotion,
    PromotionError,
    champion,
    history,
    promote_all,
    promote_class,
    restore,
)
from specflow.decision.choose import analyze
from specflow.decision.model import ClassResult
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import PromoteSpec
from tests.builders import BASELINE, Cand, engine, sweep

ROOT = Path(__file__).resolve().parents[2]
E3N2 = engine("eagle3-n2", "eagle3", 2)
E3N3 = engine("eagle3-n3", "eagle3", 3)
E3N4 = engine("eagle3-n4", "eagle3", 4)
ENGINES: dict[str, EngineConfig] = {e.hash: e for e in (BASELINE, E3N2, E3N3, E3N4)}
SPEC = PromoteSpec(concurrency_bands=[[1, 4], [5, 32]])

SCENARIOS = {
    # eagle3 wins at low load and loses at high load: a schedule with N=0 there.
    "first": [Cand(E3N3, {1: 1.6, 4: 1.4, 32: 0.8}, ppa=(0.8, 0.6, 0.4)),
              Cand(E3N2, {1: 1.3, 4: 1.2, 32: 0.9}, ppa=(0.8, 0.6))],
    # Re-validation: both re-measured, eagle3-n2 now ahead.
    "second": [Cand(E3N3, {1: 1.3, 4: 1.2, 32: 0.8}, ppa=(0.8, 0.6, 0.4)),
               Cand(E3N2, {1: 1.5, 4: 1.4, 32: 0.9}, ppa=(0.8, 0.6))],
    # Speculation loses everywhere.
    "slower": [Cand(E3N3, 0.9), Cand(E3N2, 0.95)],
    # The old champion was not measured; the new one is clearly worse than its claim.
    "worse_unmeasured": [Cand(E3N2, {1: 1.2, 4: 1.1, 32: 0.9})],
    # The old champion was re-measured and no longer delivers.
    "worse_remeasured": [Cand(E3N3, {1: 1.1, 4: 1.0, 32: 0.8}, ppa=(0.8, 0.6, 0.4)),
                         Cand(E3N2, {1: 1.2, 4: 1.1, 32: 0.9}, ppa=(0.8, 0.6))],
    # Same winner, its acceptance at position 2 fell.
    "acceptance_drop": [Cand(E3N3, {1: 1.6, 4: 1.4, 32: 0.8}, ppa=(0.8, 0.45, 0.38)),
                        Cand(E3N2, {1: 1.3, 4: 1.2, 32: 0.9}, ppa=(0.8, 0.45))],
}


def scenario(name: str) -> tuple[ClassResult, dict[str, EngineConfig], PromoteSpec]:
    """A decided traffic class from noise-free hand-built records (also used by the subprocess)."""
    ms, _ = sweep(SCENARIOS[name], levels=(1, 4, 32), repeats=3)
    return analyze(ms, SPEC).result("math"), ENGINES, SPEC


def _promote(name: str, out: Path, **kwargs: object) -> Promotion:
    result, engines, spec = scenario(name)
    return promote_class(result, engines, spec, output_dir=out, **kwargs)


def _champion(out: Path) -> GatedRecord:
    record = champion(out, "math")
    assert record is not None
    return record


def _champion_file(out: Path) -> bytes:
    return (out / "math" / "champion.json").read_bytes()


def _history_file(out: Path, version: str) -> bytes:
    return (out / "math" / "history" / f"{version}.json").read_bytes()


# --------------------------------------------------------------------------------------------
# What a champion holds


def test_champion_is_deployable_with_its_evidence(tmp_path: Path) -> None:
    p = _promote("first", tmp_path)
    assert p.status == "promoted" and p.previous is None
    assert p.path == tmp_path / "math" / "champion.json"
    record = json.loads(p.path.read_text())
    assert record["outcome"] == "promote"
    assert record["engine"]["hash"] == E3N3.hash
    schedule = [[1, 4, 3], [5, 32, 0]]
    assert record["num_speculative_tokens_per_batch_size"] == schedule
    assert record["speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 3,
                                            "num_speculative_tokens_per_batch_size": schedule}
    argv = record["serve_argv"]
    assert argv[:3] == ["vllm", "serve", "/models/tiny"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == record[
        "speculative_config"]
    rows = record["evidence"]["decision_table"]
    assert [(r["band"], r["engine"], r["verdict"]) for r in rows] == [
        ("c1-4", "eagle3-n3", "wins"), ("c1-4", "eagle3-n2", "passes"),
        ("c1-4", "off (baseline)", "ruled out"),
        ("c5-32", "eagle3-n2", "ruled out"), ("c5-32", "eagle3-n3", "ruled out"),
        ("c5-32", "off (baseline)", "wins")]
    assert [b["outcome"] for b in record["bands"]] == ["promote", "off"]
    assert record["bands"][0]["speedup"]["estimate"] == pytest.approx(1.4)  # worst level, c=4
    assert record["settings"]["margin"] == 0.05
    assert history(tmp_path, "math") == [record["version"]]
    assert champion(tmp_path, "math") == p.record  # the file reads back as the record written
    assert json.loads((tmp_path / "math" / "history" / f"{p.version}.json").read_text()) == record


SCHEMA1 = ROOT / "tests" / "data" / "champion_schema1.json"
"""A champion of scenario "first" as specflow wrote it at schema 1 (df061b6): outcome
"speculate", the off row's verdict "beaten", verdicts with `status` and `outcome`."""


def test_a_schema_1_champion_is_read_in_schema_2s_words_and_gated_against(
        tmp_path: Path) -> None:
    old = json.loads(SCHEMA1.read_text())
    assert (old["schema"], old["outcome"]) == (1, "speculate")
    (tmp_path / "math" / "history").mkdir(parents=True)
    (tmp_path / "math" / "champion.json").write_bytes(SCHEMA1.read_bytes())
    (tmp_path / "math" / "history" / f"{old['version']}.json").write_bytes(SCHEMA1.read_bytes())
    read = _champion(tmp_path)
    assert (read.schema_version, read.outcome, read.version) == (2, "promote", old["version"])
    assert [b.outcome for b in read.bands] == ["promote", "off"]
    assert [r["verdict"] for r in read.evidence.decision_table] == [
        "wins", "passes", "ruled out", "ruled out", "ruled out", "wins"]
    winner = read.evidence.decisions[0]["winner"]  # type: ignore[index]
    assert winner["verdict"] == "wins" and "status" not in winner  # type: ignore[operator]
    assert read.evidence.deployment["outcome"] == "promote"
    # held against as any champion: the new one compared band by band, its predecessor named
    new = _promote("second", tmp_path)
    assert new.status == "promoted" and new.previous == old["version"], new.gate
    assert not [n for n in new.gate.notes if "file format" in n], new.gate.notes
    assert json.loads(new.path.read_text())["schema"] == 2
    back = restore(tmp_path, "math")  # and restored, in schema 2's words
    assert (back.version, json.loads(back.path.read_text())["outcome"]) == (old["version"],
                                                                           "promote")


def test_off_is_promoted_as_the_baseline_engine(tmp_path: Path) -> None:
    p = _promote("slower", tmp_path)
    record = champion(tmp_path, "math")
    assert p.status == "promoted" and record is not None and record == p.record
    assert record.outcome == "off" and record.speculative_config is None
    assert record.serve_argv == BASELINE.serve_argv
    assert "--speculative-config" not in record.serve_argv


def test_the_plan_must_hold_the_deployed_engine(tmp_path: Path) -> None:
    result, _, spec = scenario("first")
    with pytest.raises(PromotionError, match="not in the plan"):
        promote_class(result, {BASELINE.hash: BASELINE}, spec, output_dir=tmp_path)


def test_promote_all_and_the_hook_that_registers_elsewhere(tmp_path: Path) -> None:
    ms, _ = sweep(SCENARIOS["first"], levels=(1, 4, 32), repeats=3)
    chat, _ = sweep(SCENARIOS["slower"], levels=(1, 4, 32), repeats=3, workloads=("chat",),
                    cls="chat")
    registered: list[Promotion] = []
    out = promote_all(analyze(ms + chat, SPEC), ENGINES, SPEC, output_dir=tmp_path,
                      on_promoted=registered.append)
    assert [(p.traffic_class, p.record.outcome) for p in out] == [("chat", "off"),
                                                                  ("math", "promote")]
    assert registered == out
    assert all(p.path.is_file() for p in registered)  # the hook runs once the files are in place


# --------------------------------------------------------------------------------------------
# History and restore


def test_previous_champion_is_kept_and_restorable(tmp_path: Path) -> None:
    first = _promote("first", tmp_path)
    second = _promote("second", tmp_path)
    assert second.status == "promoted" and second.previous == first.version
    assert _champion(tmp_path).engine.hash == E3N2.hash
    assert history(tmp_path, "math") == [first.version, second.version]

    restored: list[Promotion] = []
    back = restore(tmp_path, "math", on_restored=restored.append)
    assert (back.status, back.version, back.previous) == ("restored", first.version,
                                                          second.version)
    assert restored == [back]
    assert _champion_file(tmp_path) == _history_file(tmp_path, first.version)

    with pytest.raises(PromotionError, match="no previous champion"):
        restore(tmp_path, "math")
    restore(tmp_path, "math", second.version)
    assert _champion(tmp_path).version == second.version
    with pytest.raises(PromotionError, match=r"no version 'nope'; known: \["):
        restore(tmp_path, "math", "nope")
    with pytest.raises(PromotionError, match="nothing was ever promoted"):
        restore(tmp_path, "chat")


def test_history_heals_after_a_crash_between_champion_and_history(tmp_path: Path) -> None:
    first = _promote("first", tmp_path)
    (tmp_path / "math" / "history" / f"{first.version}.json").unlink()
    _promote("second", tmp_path)
    assert first.version in history(tmp_path, "math")


CORRUPT = {"truncated": b'{"schema": 1, "traffic_class": "ma', "empty": b"",
           "binary": b"\x00\xff\xfe", "a list": b"[]\n"}


@pytest.mark.parametrize("damage", list(CORRUPT))
def test_restore_with_a_version_repairs_a_corrupt_champion(tmp_path: Path, damage: str) -> None:
    first = _promote("first", tmp_path)
    second = _promote("second", tmp_path)
    (tmp_path / "math" / "champion.json").write_bytes(CORRUPT[damage])
    with pytest.raises(PromotionError, match=r"current champion .* is unreadable.*name the "
                       rf"version to restore.*known: \['{first.version}', '{second.version}'\]"):
        restore(tmp_path, "math")
    back = restore(tmp_path, "math", first.version)
    assert (back.status, back.version, back.previous) == ("restored", first.version, None)
    assert _champion_file(tmp_path) == _history_file(tmp_path, first.version)
    assert _promote("second", tmp_path).status in ("promoted", "unchanged")  # usable again


@pytest.mark.parametrize("version", ["../../../../outside/secret", "../secret", "..", ".",
                                     "a/b", "/etc/passwd", "", "v 1", "~root"])
def test_restore_refuses_a_version_that_is_not_a_plain_name(tmp_path: Path,
                                                             version: str) -> None:
    first = _promote("first", tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"version": "stolen"}))
    with pytest.raises(PromotionError, match="not a plain version name"):
        restore(tmp_path, "math", version)
    assert _champion(tmp_path).version == first.version


def test_restore_refuses_a_history_entry_that_leads_outside(tmp_path: Path) -> None:
    first = _promote("first", tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"version": "stolen"}))
    (tmp_path / "math" / "history" / "linked.json").symlink_to(outside)
    with pytest.raises(PromotionError, match="outside"):
        restore(tmp_path, "math", "linked")
    assert _champion(tmp_path).version == first.version


@pytest.mark.parametrize("bad", ["../../../escaped", "<absolute>", "..", 7, None])
def test_a_version_read_from_the_champion_never_becomes_a_path(
        tmp_path: Path, bad: object, caplog: pytest.LogCaptureFixture) -> None:
    if bad == "<absolute>":
        bad = str(tmp_path.parent / "escaped-absolute")
    first = _promote("first", tmp_path)
    second = _promote("second", tmp_path)
    path = tmp_path / "math" / "champion.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "version": bad, "previous": bad}))
    (tmp_path / "math" / "history" / f"{second.version}.json").unlink()
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())

    refusal = "previous version .* not a plain version name" if bad is not None \
        else "no previous champion"
    with caplog.at_level("WARNING", logger="specflow.champions.promote"), \
            pytest.raises(PromotionError, match=refusal):
        restore(tmp_path, "math")  # the repair step reports the version, restore refuses it
    assert "not a plain version name" in caplog.text and "not repaired" in caplog.text
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before
    assert not list(tmp_path.parent.rglob("escaped*"))
    assert restore(tmp_path, "math", first.version).version == first.version


# --------------------------------------------------------------------------------------------
# Regression gate


def test_gate_refuses_a_confidently_worse_champion_unless_forced(tmp_path: Path) -> None:
    first = _promote("first", tmp_path)
    refused = _promote("worse_unmeasured", tmp_path)
    assert refused.status == "refused" and not refused.gate.passed
    assert refused.path == tmp_path / "math" / "refused" / f"{refused.version}.json"
    assert refused.path.is_file()
    (why,) = refused.gate.regressions
    assert "band c1-4" in why and "did not re-measure eagle3-n3" in why
    assert _champion(tmp_path).version == first.version
    assert history(tmp_path, "math") == [first.version]

    forced = _promote("worse_unmeasured", tmp_path, force=True)
    assert forced.status == "promoted" and forced.gate.forced
    assert _champion(tmp_path).gate.forced is True


def test_gate_lets_the_same_sweep_decide_when_the_old_champion_was_remeasured(
        tmp_path: Path) -> None:
    _promote("first", tmp_path)
    p = _promote("worse_remeasured", tmp_path)
    assert p.status == "promoted" and p.gate.passed
    (why,) = p.gate.excused
    assert "re-measured here, eagle3-n3 now gives 1.000x" in why

    _promote("first", tmp_path)
    off = _promote("slower", tmp_path)  # the old winner re-measured and now loses: off wins
    assert off.status == "promoted" and off.record.outcome == "off"


def test_gate_flags_per_position_acceptance_drops(tmp_path: Path) -> None:
    _promote("first", tmp_path)
    p = _promote("acceptance_drop", tmp_path)
    assert p.status == "promoted"
    (drop,) = p.gate.acceptance_drops
    assert drop == "band c1-4: eagle3 acceptance at position 2 fell 0.600 -> 0.450 (> 0.050)"


# --------------------------------------------------------------------------------------------
# Crash safety

_KILLED_MID_WRITE = r"""
import sys, time
from pathlib import Path
from specflow.champions.promote import promote_class
from tests.champions.test_promote import scenario

out, ready = Path(sys.argv[1]), Path(sys.argv[2])
result, engines, spec = scenario("second")

def pause(tmp: Path, dest: Path) -> None:
    if dest.name == "champion.json":
        ready.write_text(str(tmp))
        time.sleep(120)

promote_class(result, engines, spec, output_dir=out, before_replace=pause)
"""


def test_killing_promotion_mid_write_keeps_the_previous_champion(tmp_path: Path) -> None:
    out = tmp_path / "promoted"
    first = _promote("first", out)
    before = (out / "math" / "champion.json").read_bytes()
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_MID_WRITE, str(out), str(ready)],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the promotion never reached the replace"
            time.sleep(0.05)
        tmp = Path(ready.read_text())
        assert json.loads(tmp.read_text())["engine"]["hash"] == E3N2.hash  # new one fully written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    after = (out / "math" / "champion.json").read_bytes()
    assert after == before
    assert json.loads(after)["version"] == first.version
    assert history(out, "math") == [first.version]

    # The next promotion clears the debris and works; restore still reaches the old champion.
    second = _promote("second", out)
    assert second.status == "promoted"
    assert not list((out / "math").glob(".*.tmp"))
    assert restore(out, "math").version == first.version


def test_gate_says_which_bands_it_could_not_compare(tmp_path: Path) -> None:
    _promote("first", tmp_path)
    ms, _ = sweep(SCENARIOS["second"], levels=(1, 4, 32), repeats=3)
    spec = PromoteSpec(concurrency_bands=[[1, 4], [5, 64]])
    p = promote_class(analyze(ms, spec).result("math"), ENGINES, spec, output_dir=tmp_path)
    assert p.status == "promoted"
    assert p.gate.notes == ("band c5-32 was decided only by the previous champion; not compared",
                            "band c5-64 was decided only by the new champion; not compared")


def test_restore_is_one_command(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    first = _promote("first", tmp_path)
    second = _promote("second", tmp_path)
    proc = run_cli("restore", "math", f"promote.output_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert f"restored math champion {first.version} (was {second.version})" in proc.stdout
    assert _champion(tmp_path).version == first.version
    proc = run_cli("restore", "chat", f"promote.output_dir={tmp_path}")
    assert proc.returncode == 1 and "nothing was ever promoted" in proc.stderr
    proc = run_cli("restore", f"promote.output_dir={tmp_path}")
    assert proc.returncode == 2 and "restore CLASS [VERSION]" in proc.stderr


def test_restore_command_checks_its_arguments_and_repairs_a_corrupt_champion(
        tmp_path: Path) -> None:
    from tests.conftest import run_cli

    out = tmp_path / "promoted"
    first = _promote("first", out)
    _promote("second", out)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.json").write_text(json.dumps({"version": "stolen"}))
    proc = run_cli("restore", "math", "../../outside/secret", f"promote.output_dir={out}")
    assert proc.returncode == 2, proc.stderr
    assert "restore VERSION: not a plain version name" in proc.stderr
    assert "Traceback" not in proc.stderr and _champion(out).version != "stolen"
    proc = run_cli("restore", "../math", f"promote.output_dir={out}")
    assert proc.returncode == 2 and "restore CLASS: not a plain" in proc.stderr

    (out / "math" / "champion.json").write_text('{"schema": 1, "trunc')
    proc = run_cli("restore", "math", f"promote.output_dir={out}")
    assert proc.returncode == 1 and "unreadable" in proc.stderr and first.version in proc.stderr
    proc = run_cli("restore", "math", first.version, f"promote.output_dir={out}")
    assert proc.returncode == 0, proc.stderr
    assert f"restored math champion {first.version} (was None)" in proc.stdout
    assert _champion(out).version == first.version


def test_the_same_evidence_again_changes_nothing(tmp_path: Path) -> None:
    hooked: list[Promotion] = []
    first = _promote("first", tmp_path, on_promoted=hooked.append)
    again = _promote("first", tmp_path, on_promoted=hooked.append)
    assert again.status == "unchanged" and again.version == first.version
    assert hooked == [first]  # no second registration
    assert history(tmp_path, "math") == [first.version]
