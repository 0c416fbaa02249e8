"""What a watch holds the counters against, and every refusal before anything is read: a class
without a champion, a champion that does not speculate, a profile of another drafter or target
than the champion's, two sources or none, a reference without the servers' N (hand-built
champions; the real server is tests/engine/test_watch.py)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from specflow import cli
from specflow.config.compose import load
from specflow.spec.profile import AcceptanceProfile, CurvePoint, Interval
from specflow.steps import watch
from tests.champions.test_promote import _promote

URL = "watch.metrics_url=http://127.0.0.1:9/metrics"


def _profile(tmp: Path, **kw: object) -> Path:
    base: dict[str, object] = dict(
        sweep_id="s1", target="/models/tiny@unpinned", drafter="eagle3", method="eagle3",
        drafter_model=None, traffic_class="math", workloads=("gsm8k",), temperature=0.0,
        vllm="0.32", n_max=4,
        rates=tuple(Interval(value=v, lo=v - 0.05, hi=v + 0.05) for v in (0.8, 0.6, 0.45, 0.3)),
        curve=tuple(CurvePoint(n=n, predicted=Interval(value=1 + 0.5 * n, lo=0.9 + 0.5 * n,
                                                       hi=1.1 + 0.5 * n)) for n in (1, 2, 3, 4)),
        model="chain", windows=6)
    base.update(kw)
    path = tmp / f"profile-{len(kw)}-{abs(hash(json.dumps(kw, default=str)))}.json"
    path.write_text(AcceptanceProfile.model_validate(base).model_dump_json())
    return path


def _cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["watch", *args])
    return code, err.getvalue()


def test_a_champions_profile_and_n_are_what_it_holds_the_counters_against(tmp_path: Path
                                                                          ) -> None:
    assert _promote("first", tmp_path).record.engine.name == "eagle3-n3"
    spec = load([f"promote.output_dir={tmp_path}", URL,
                 f"watch.profile={_profile(tmp_path)}"]).spec
    got = watch.resolve(spec, "math")
    assert got.n == 3 and got.served == "tiny" and got.champion and got.speedup is not None
    expected = got.expected(3)
    assert len(expected.rates) == 3 and expected.acceptance_length is not None
    assert expected.acceptance_length.value == 2.5 and expected.speedup == got.speedup
    # N beyond what the profile measured: refused, naming the field
    with pytest.raises(Exception, match="watch.num_speculative_tokens"):
        got.expected(5)


def test_every_refusal_names_its_field_and_exits_2(tmp_path: Path) -> None:
    out = f"promote.output_dir={tmp_path}"
    code, err = _cli("math", out, URL)
    assert code == 2 and "no champion of this class to watch" in err and "Traceback" not in err
    code, err = _cli("math", out)
    assert code == 2 and "watch.metrics_url: a watch reads one source" in err
    both = ["watch.prometheus_url=http://127.0.0.1:9", URL]
    code, err = _cli("math", out, *both, f"watch.profile={_profile(tmp_path)}")
    assert code == 2 and "a watch reads one source" in err
    code, err = _cli("math", out, URL, f"watch.profile={_profile(tmp_path)}",
                     f"watch.reference={tmp_path / 'x.csv'}")
    assert code == 2 and "watch.reference: a watch holds the counters against one thing" in err
    code, err = _cli("../etc", out, URL)
    assert code == 2 and "watch CLASS: not a plain traffic class name" in err

    _promote("first", tmp_path)
    code, err = _cli("math", out, URL, f"watch.profile={_profile(tmp_path, drafter='ngram')}")
    assert code == 2 and "is a profile of drafter 'ngram'; the math champion drafts with " \
        "'eagle3'" in err, err
    code, err = _cli("math", out, URL,
                     f"watch.profile={_profile(tmp_path, target='/models/other@main')}")
    assert code == 2 and "is a profile of target '/models/other@main'; the math champion " \
        "serves '/models/tiny'" in err, err
    code, err = _cli("math", out, URL, f"watch.profile={tmp_path / 'missing.json'}")
    assert code == 2 and "watch.profile: cannot read it" in err
    (tmp_path / "golden.csv").write_text("n,acceptance_length\n1,1.8\n2,2.4\n")
    spec = load([out, URL, f"watch.reference={tmp_path / 'golden.csv'}"]).spec
    with pytest.raises(Exception, match="has no acceptance length at N=3"):
        watch.resolve(spec, "math").expected(3)


def test_a_champion_that_serves_without_speculation_has_nothing_to_watch(tmp_path: Path
                                                                         ) -> None:
    assert _promote("slower", tmp_path).record.outcome == "off"
    code, err = _cli("math", f"promote.output_dir={tmp_path}", URL)
    assert code == 2 and "its champion serves without speculation" in err, err


def test_alerts_are_rules_and_a_dashboard_per_champion_with_its_bands(tmp_path: Path) -> None:
    from grafana_foundation_sdk.models.dashboard import Dashboard

    _promote("first", tmp_path)
    out = tmp_path / "alerts"
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert cli.main(["alerts", f"promote.output_dir={tmp_path}", "--out", str(out),
                         f"watch.profile={_profile(tmp_path)}", "watch.alert_for=600"]) == 0
    assert "math: champion" in said.getvalue() and "(eagle3, N=3)" in said.getvalue()
    import yaml

    rules = yaml.safe_load((out / "specflow-rules.yml").read_text())
    group = rules["groups"][0]
    assert group["name"] == "specflow-math"
    by = {(r["alert"], r["labels"]["figure"]): r for r in group["rules"]}
    # no tokens per step in this profile: acceptance length and the first three positions
    assert set(by) == {("SpecflowAcceptanceLengthLow", "acceptance length"),
                       *(("SpecflowPositionAcceptanceLow", f"position {i}") for i in (1, 2, 3))}
    al = by[("SpecflowAcceptanceLengthLow", "acceptance length")]
    assert al["expr"].endswith(f"< {round(2.4 - 0.05 * 2.5, 4)}") and al["for"] == "10m"
    assert 'model_name="tiny"' in al["expr"] and al["labels"]["traffic_class"] == "math"
    pos1 = by[("SpecflowPositionAcceptanceLow", "position 1")]["expr"]
    assert 'position="0"' in pos1 and pos1.endswith(f"< {round(0.75 - 0.05 * 0.8, 4)}")
    board = json.loads((out / "specflow-dashboard.json").read_text())
    parsed = Dashboard.from_json(board)  # Grafana's own model of a dashboard reads it back
    assert parsed.title == board["title"] and board["schemaVersion"] >= 36
    titles = [p["title"] for p in board["panels"]]
    assert titles[1:5] == ["tokens per step", "acceptance length", "acceptance per position",
                           "spec-decode throughput (tokens/s)"], titles
    assert all(t["expr"] for p in board["panels"][1:] for t in p["targets"])
    # no champion that speculates: refused
    code, err = 0, io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["alerts", f"promote.output_dir={tmp_path / 'empty'}"])
    assert code == 2 and "alerts: no champion that speculates" in err.getvalue()


def test_a_resweep_measures_the_class_under_the_watchs_own_settings_and_serving_refuses_early(
        tmp_path: Path) -> None:
    from pipelines.watch import artifact_key, main, resweep_overrides

    assert resweep_overrides(
        ["experiment=cpu_demo", "watch.metrics_url=http://h/metrics", "+watch.x=1",
         "workload=[chat]", "promote.output_dir=/p"], ("code_completion", "code_long")) == [
        "experiment=cpu_demo", "promote.output_dir=/p", "workload=[code_completion,code_long]"]
    assert resweep_overrides(["experiment=cpu_demo"], ()) == ["experiment=cpu_demo"]
    assert artifact_key("Sql_Agent.v2") == "specflow-watch-sql-agent-v2"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["math", f"promote.output_dir={tmp_path}", URL]) == 2
    assert "no champion of this class to watch" in err.getvalue()
