"""Profiles other tools read and curves other tools publish: the speculation_profile.json shape
(marginal and conditional per-position acceptance, the mean acceptance length, the method and
whether it extrapolates, the measurement conditions), the scalar a planner takes, and
published acceptance-length curves imported as references (CSV, JSON rows, {N: length}),
with a clear error for each malformed file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specflow import cli
from specflow.spec.profile import (
    AcceptanceProfile,
    CurvePoint,
    Interval,
    import_curve,
    speculation_profile,
)


def _profile(model: str = "chain") -> AcceptanceProfile:
    return AcceptanceProfile(
        sweep_id="s1", target="/models/t@unpinned", drafter="eagle3-n3", method="eagle3",
        drafter_model="/models/e@abc", traffic_class="chat", workloads=("chat",),
        temperature=0.0, vllm="0.32", n_max=3,
        rates=(Interval(value=0.8, lo=0.7, hi=0.9), Interval(value=0.6, lo=0.5, hi=0.7),
               Interval(value=0.62, lo=0.5, hi=0.7)),
        curve=(CurvePoint(n=1, predicted=Interval(value=1.8, lo=1.7, hi=1.9)),
               CurvePoint(n=2, predicted=Interval(value=2.4, lo=2.3, hi=2.5)),
               CurvePoint(n=3, measured=Interval(value=3.0, lo=2.9, hi=3.1))),
        model=model, windows=6, histogram={"1.0-1.5": 3, "2.5-3.0": 9})


def test_a_profile_exports_the_speculation_profile_shape() -> None:
    got = speculation_profile(_profile())
    # marginal: non-increasing (window noise clipped), conditional: each over the one before
    assert got["marginal_accept_rates"] == [0.8, 0.6, 0.6]
    assert got["conditional_accept_rates"] == pytest.approx([0.8, 0.75, 1.0])
    assert got["mean_accept_length"] == 3.0 and got["mean_accept_length_interval"] == [2.9, 3.1]
    assert got["accept_length_model"] == "chain_analytic"
    assert got["num_speculative_tokens"] == 3 and got["method"] == "eagle3"
    assert got["draft_checkpoint"] == {"name": "/models/e@abc"}
    assert got["measurement_conditions"]["specflow_sweep"] == "s1"
    assert got["per_request_acceptance_length_histogram"] == {"1.0-1.5": 3, "2.5-3.0": 9}
    at2 = speculation_profile(_profile("measured per N"), 2)
    assert at2["marginal_accept_rates"] == [0.8, 0.6] and at2["mean_accept_length"] == 2.4
    assert at2["accept_length_model"] == "measured_per_k"
    assert at2["per_request_acceptance_length_histogram"] is None  # measured at N=3 only
    json.dumps(got)  # plain JSON
    with pytest.raises(ValueError, match="N=4 is not measured"):
        speculation_profile(_profile(), 4)


def test_published_curves_import_from_csv_json_rows_and_objects(tmp_path: Path) -> None:
    csv = tmp_path / "dsv4_mtp.csv"
    csv.write_text("num_speculative_tokens,AL\n1,1.9\n3,2.55\n2,2.3\n")
    got = import_curve(csv)
    assert got.name == "dsv4_mtp" and [p.n for p in got.points] == [1, 2, 3]
    assert got.at(3) is not None and got.at(3).acceptance_length == 2.55
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"name": "DSpark golden", "method": "dspark", "points": [
        {"n": 6, "acceptance_length": 3.77, "lo": 3.7, "hi": 3.84}]}))
    r = import_curve(rows)
    assert r.name == "DSpark golden" and r.method == "dspark" and r.points[0].lo == 3.7
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"1": 1.8, "2": 2.4}))
    assert [p.acceptance_length for p in import_curve(obj).points] == [1.8, 2.4]
    # a written reference reads back as itself
    again = tmp_path / "again.json"
    again.write_text(json.dumps(r.model_dump(mode="json")))
    assert import_curve(again) == r


@pytest.mark.parametrize(("text", "suffix", "says"), [
    ("n,speedup\n1,1.2\n", ".csv", "needs an N column"),
    ("n,acceptance_length\n0,1.5\n", ".csv", "not a whole N >= 1"),
    ("n,acceptance_length\n2,0.5\n", ".csv", "a length >= 1"),
    ("n,acceptance_length\n2,2\n2,2.1\n", ".csv", "an N appears twice"),
    ("{not json", ".json", "not JSON"),
    ("[1, 2]", ".json", "(objects)"),
    ("n,acceptance_length\n", ".csv", "no rows"),
])
def test_a_malformed_curve_says_what_is_wrong(tmp_path: Path, text: str, suffix: str,
                                             says: str) -> None:
    path = tmp_path / f"curve{suffix}"
    path.write_text(text)
    with pytest.raises(ValueError, match=None) as info:
        import_curve(path)
    assert says in str(info.value)


def test_the_reference_command_imports_and_refuses_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "golden.csv"
    src.write_text("n,acceptance_length\n1,1.8\n2,2.4\n")
    out = tmp_path / "ref" / "golden.json"
    assert cli.main(["reference", str(src), "--out", str(out)]) == 0
    assert "golden: acceptance length N=1 1.8, N=2 2.4" in capsys.readouterr().out
    assert json.loads(out.read_text())["kind"] == "specflow.reference"
    bad = tmp_path / "bad.csv"
    bad.write_text("k\n1\n")
    assert cli.main(["reference", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "reference FILE" in err and "needs an N column" in err and "Traceback" not in err
