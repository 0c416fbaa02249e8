"""`python -m specflow compare` on sweeps of the real vLLM engine (real Prefect, real MLflow):
the same plan measured twice, and again with the drafter's checkpoint replaced by a worse one
(the target copy, then the target plus noise as large as its weights: a new revision that
accepts almost nothing). The worse
sweep runs where the first one did, as a scheduled re-validation does after a new revision: it
compares itself with it, publishes the comparison and demotes the regressed champion."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from specflow.champions import promote
from specflow.cli import EXIT_REGRESSED
from specflow.results.comparing import EXIT_NOT_COMPARABLE, EXIT_REGRESSION

PLAN = [
    "experiment=cpu_tiny", "workload=[chat]", "workload.chat.num_prompts=8",
    "workload.chat.max_tokens=32", "sweep.concurrency=[1]", "sweep.repeats=2",
    "promote.min_repeats=2", "sweep.warmup_requests=1", "sweep.design=grid",
    "drafter=[none,draft_model]", "sweep.num_speculative_tokens.draft_model=[4]",
]


def _env(tmp: Path, api: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PREFECT_HOME": str(tmp / "prefect"), "PREFECT_API_URL": api,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
                "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp)})
    return env


def _where(tmp: Path) -> list[str]:
    return [f"tracking.workdir={tmp / 'work'}", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"promote.output_dir={tmp / 'promoted'}"]


def _sweep(tmp: Path, models: Path, api: str, *extra: str, rc: tuple[int, ...] = (0, 1)
           ) -> tuple[Path, subprocess.CompletedProcess]:
    """The main job on PLAN; the sweep's directory (the newest under the workdir) and the run."""
    tmp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "specflow", *PLAN, f"paths.models={models}",
                           *_where(tmp), *extra], cwd=tmp, env=_env(tmp, api),
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode in rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = max((tmp / "work" / "sweeps").iterdir(), key=lambda d: (d / "sweep.json").stat(
        ).st_mtime)
    return sweep, proc


def _champion_of_the_copy(tmp: Path, models: Path) -> promote.Promotion:
    """A champion of class chat deploying the copy drafter, promoted from sweep A's own windows
    (as an earlier day's decision would have been; the copy does not beat the baseline by the
    margin on this engine, so the test promotes it past the rule, recorded as forced)."""
    from specflow.steps import open_sweep
    from specflow.steps.decide import analyse

    ctx = open_sweep([*PLAN, f"paths.models={models}", *_where(tmp)], tracking=False)
    analysis, _ = analyse(ctx)
    result = analysis.result("chat")
    copy = next(ec for ec in ctx.plan.engine_configs if ec.name == "draft_model-n4")
    dep = dataclasses.replace(result.deployment, outcome="promote", engine_hash=copy.hash,
                              engine=copy.name, drafter=copy.drafter, method=copy.method,
                              num_speculative_tokens=copy.num_speculative_tokens)
    won = tuple(dataclasses.replace(d, winner=next(v for v in d.candidates
                                                   if v.engine_hash == copy.hash), unresolved="")
                for d in result.decisions)
    engines = {ec.hash: ec for ec in ctx.plan.engine_configs}
    return promote.promote_class(dataclasses.replace(result, deployment=dep, decisions=won),
                                 engines, ctx.spec.promote, force=True, sweep_id=ctx.sid)


def _filter(api: str, what: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Prefect's REST filter endpoint (`artifacts`, `flow_runs`)."""
    request = urllib.request.Request(f"{api}/{what}/filter", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:  # loopback only
        return json.loads(answer.read())


def _compare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specflow", "compare", *args], cwd=cwd,
                          env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true"),
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path,
           prefect_api: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("compare")
    a, _ = _sweep(root / "a", tiny_models, prefect_api)
    # the same plan again, elsewhere; after its decision it soaks its speculative engine
    again, again_run = _sweep(root / "again", tiny_models, prefect_api,
                              "sweep.soak={duration_s: 20}")
    champion = _champion_of_the_copy(root / "a", tiny_models)
    # the new revision, where A ran: the run compares itself with A
    worse, run = _sweep(root / "a", tiny_models, prefect_api,
                        f"drafter.draft_model.checkpoints.tiny.model={tiny_models}/draft_derived_far",
                        "promote.on_regression=off", rc=(EXIT_REGRESSED,))
    return {"root": root, "a": a, "again": again, "worse": worse, "run": run,
            "again_run": again_run, "champion": champion, "api": prefect_api,
            "models": tiny_models}


@pytest.mark.engine
def test_a_worse_drafter_revision_is_a_regression_with_intervals(sweeps: dict[str, Any]
                                                                  ) -> None:
    """The copy accepts every draft (acceptance length 5 at N=4); the far-noise copy almost
    none. Guaranteed at any machine speed: acceptance (deterministic here) regresses beyond
    noise, with its interval, so compare exits 3 and the pins say what changed; the speedup's
    change is estimated below 1 over 3 + 3 engine starts with an interval that holds the
    estimate, and is never called an improvement. Whether the speedup's interval also clears 1
    depends on the day's start-to-start noise (the copy's own speedup at c=1 was 1.28 on a quiet
    day, 0.86 on a slow one), so "regression" and "no change beyond noise" are both accepted."""
    root = sweeps["root"]
    md = root / "worse.md"
    proc = _compare(root, str(sweeps["a"]), str(sweeps["worse"]), "--markdown", str(md),
                    *_where(root / "a"))
    assert proc.returncode == EXIT_REGRESSION, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    assert re.search(r"what differs: .*drafter\.draft_model .*/draft_copy@unpinned -> "
                     r".*/draft_derived_far@unpinned", out), out[:2000]
    assert "the workload changed" not in out
    text = md.read_text()
    assert text.startswith("# regression: ")
    rows = {(r[4], r[3]): r for r in (line.rstrip(" |").split(" | ")
                                      for line in text.splitlines()
                                      if line.startswith("| chat |"))}
    al = rows[("acceptance length", "draft_model-n4")]
    assert al[5] == "5.000" and float(al[6]) < 4.0, al
    assert al[8] == "regression"
    lo, hi = map(float, re.findall(r"\[([\d.]+), ([\d.]+)\]", al[7])[0])
    assert lo <= hi < 1
    # the speedup, over engine starts (the baselines' opening and closing starts carry the
    # start effect): the copy drafts 4 tokens a step and keeps them all, the new revision pays
    # the same 4 draft passes for about 1 token
    speed = rows[("speedup", "draft_model-n4")]
    assert speed[8] in ("regression", "no change beyond noise"), speed
    assert speed[9] == "3 + 3 engine starts", speed
    lo, hi = map(float, re.findall(r"\[([\d.]+), ([\d.]+)\]", speed[7])[0])
    assert lo <= float(speed[7].split("x")[0]) <= hi and float(speed[7].split("x")[0]) < 1
    assert rows[("acceptance at position 1", "draft_model-n4")][8] == "regression"
    # machine-readable too
    js = _compare(root, str(sweeps["a"]), str(sweeps["worse"]), "--json", *_where(root / "a"))
    assert js.returncode == EXIT_REGRESSION
    data = json.loads(js.stdout)
    assert data["summary"].startswith("regression") and data["changes"]


@pytest.mark.engine
def test_the_same_plan_twice_is_no_change_and_sweeps_resolve_by_run_and_id(
        sweeps: dict[str, Any]) -> None:
    root = sweeps["root"]
    proc = _compare(root, str(sweeps["a"]), str(sweeps["again"]), *_where(root / "a"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"no change beyond noise in \d+ rows", proc.stdout), proc.stdout[-2000:]
    # the same sweep id (the same plan, vLLM and workload): the directories tell them apart
    assert sweeps["a"].name == sweeps["again"].name
    # A as its MLflow parent run, read from MLflow alone (its ledger is not in this workdir),
    # B as a sweep directory
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'a' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "specflow/tiny/cpu"]
    (parent,) = [r for r in client.search_runs([exp.experiment_id],
                                               "tags.`specflow.kind` = 'sweep'")
                 if r.data.tags["specflow.sweep_id"] == sweeps["a"].name]
    by_run = _compare(root, parent.info.run_id, str(sweeps["again"]),
                      f"tracking.uri=sqlite:///{root / 'a' / 'mlflow.db'}",
                      f"tracking.workdir={root / 'empty'}")
    assert by_run.returncode == 0, by_run.stdout[-3000:] + by_run.stderr[-3000:]
    assert f"A: run {parent.info.run_id} (sweep {sweeps['a'].name}, from MLflow)" in by_run.stdout
    assert by_run.stdout.splitlines()[-1] == proc.stdout.splitlines()[-1]  # the same rows
    # two unknown references: both named at once, exit 2, no traceback
    bad = _compare(root, "nope", "champion:no_such_class", *_where(root / "a"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "compare A: no sweep, MLflow parent run or champion of that name; got 'nope'" in \
        bad.stderr, bad.stderr
    assert "compare B:" in bad.stderr
    assert EXIT_NOT_COMPARABLE not in (proc.returncode, by_run.returncode)


@pytest.mark.engine
def test_a_rerun_under_a_new_revision_reports_the_change_and_demotes_the_champion(
        sweeps: dict[str, Any]) -> None:
    """The worse sweep ran where A did, with a champion deploying the copy: it compared itself
    with A (report, MLflow, a Prefect artifact), found the champion's acceptance regressed
    beyond noise, applied `promote.on_regression=off`, and ended `Regressed` (exit 3)."""
    run, worse, a = sweeps["run"], sweeps["worse"], sweeps["a"]
    assert worse != a and worse.parent == a.parent
    assert f"against the last sweep of this plan ({a.name}): regression: " in run.stdout
    assert "the champion regressed beyond noise against sweep" in run.stdout
    # where the gate refused this sweep's decision (below the champion's claim, its engine not
    # re-measured: the checkpoint changed) the policy forces off past it; where this sweep's
    # decision was off and passed the gate (the copy's claim within noise of 1), it is already
    forced = "chat: demoted to off (promote.on_regression=off)" in run.stdout
    assert forced or "chat: the champion is this sweep's decision already" in run.stdout, \
        run.stdout[-3000:]
    text = (worse / "report" / "comparison.md").read_text()
    assert text.startswith("# regression: ") and "## The champion regressed" in text
    assert "draft_model-n4 acceptance length at chat c=1: 5.000 -> " in text
    now = promote.champion(a.parent.parent.parent / "promoted", "chat")
    assert now is not None and now.outcome == "off" and now.gate.forced == forced
    assert now.version != sweeps["champion"].version and now.sweep_id == worse.name
    assert sweeps["champion"].version in promote.history(a.parent.parent.parent / "promoted",
                                                         "chat")
    # published: a Prefect artifact of the flow run, the MLflow parent run's tags and report
    (artifact,) = [x for x in _filter(sweeps["api"], "artifacts", {
        "artifacts": {"key": {"any_": ["specflow-comparison"]}}}) if worse.name in x["data"]]
    assert artifact["data"].startswith("# regression: ")
    # the flow run ended in a state an automation can notify on: prefect.flow-run.Regressed
    ended = _filter(sweeps["api"], "flow_runs",
                    {"flow_runs": {"state": {"name": {"any_": ["Regressed"]}}}})
    assert any(r["state"]["type"] == "COMPLETED" and "champion regressed" in r["state"]["message"]
               for r in ended), ended
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{a.parent.parent.parent / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "specflow/tiny/cpu"]
    (parent,) = [r for r in client.search_runs([exp.experiment_id],
                                               "tags.`specflow.kind` = 'sweep'")
                 if r.data.tags["specflow.sweep_id"] == worse.name]
    assert parent.data.tags["specflow.compared_with"] == a.name
    assert parent.data.tags["specflow.regressed"].startswith("the champion regressed")
    assert parent.data.metrics["compare.champion_regressed"] == 1.0
    assert "report/comparison.md" in {f.path for f in client.list_artifacts(
        parent.info.run_id, "report")}
    # a champion and its history version name their sweeps: the same comparison again
    root = a.parent.parent.parent
    by_champion = _compare(root, f"champion:chat@{sweeps['champion'].version}", "champion:chat",
                           *_where(root))
    assert by_champion.returncode == EXIT_REGRESSION, by_champion.stderr[-2000:]
    assert f"A: champion:chat@{sweeps['champion'].version} (sweep {a.name})" in \
        by_champion.stdout
    assert f"B: champion:chat (sweep {worse.name})" in by_champion.stdout


@pytest.mark.engine
def test_a_soak_measures_one_engine_for_a_while_and_reports_its_trend(
        sweeps: dict[str, Any]) -> None:
    """`sweep.soak`: the copy drafter's engine, one start, window after window for 20 s; the
    trend of its throughput and acceptance length is reported; the soak's windows stay out of
    the sweep's ledger and decision. Guaranteed at any machine speed: the acceptance length's
    trend is exactly flat (the copy accepts all); the throughput's may be any of the three
    findings (outside load over 20 s is a trend), with its interval."""
    run, sweep = sweeps["again_run"], sweeps["again"]
    head = re.search(r"soak of draft_model-n4: (\d+) windows over (\d+) s \(0 failed\)",
                     run.stdout)
    assert head, run.stdout[-3000:]
    assert int(head.group(1)) >= 3 and int(head.group(2)) >= 20
    assert re.search(r"  throughput: (no trend beyond noise|(falling|rising) beyond noise): "
                     r"[+-][\d.]+% over \d+ s \[", run.stdout), run.stdout[-2000:]
    assert re.search(r"  acceptance length: no trend beyond noise: \+0\.0% over \d+ s "
                     r"\[\+0\.0%, \+0\.0%\] \(\d+ windows\)", run.stdout), run.stdout[-2000:]
    rows = [json.loads(line) for line in (sweep / "soak" / "windows.jsonl").read_text(
        ).splitlines()]
    assert len(rows) == int(head.group(1)) and rows[-1]["t_s"] >= 20
    assert [r["window"]["key"]["repeat"] for r in rows] == list(range(100_000, 100_000 +
                                                                       len(rows)))
    assert {r["window"]["engine"] for r in rows} == {"draft_model-n4"}
    assert all(r["window"]["mean_acceptance_length"] == 5.0 for r in rows)
    assert (sweep / "soak" / "soak.md").read_text().startswith("# Soak of draft_model-n4")
    ledger = list((sweep / "windows").glob("*.json"))
    assert ledger and not any("r100000" in p.name for p in ledger)
    (artifact,) = [x for x in _filter(sweeps["api"], "artifacts", {
        "artifacts": {"key": {"any_": ["specflow-soak"]}}})]
    assert artifact["data"].startswith("# Soak of draft_model-n4")
    # the sweep run again: nothing measured, the soak read back, not run again
    records = (sweep / "soak" / "windows.jsonl").read_bytes()
    events = sorted((sweep / "events").iterdir())
    _, rerun = _sweep(sweeps["root"] / "again", sweeps["models"], sweeps["api"],
                      "sweep.soak={duration_s: 20}")
    assert head.group(0) in rerun.stdout
    assert (sweep / "soak" / "windows.jsonl").read_bytes() == records
    assert sorted((sweep / "events").iterdir()) == events  # no engine started
