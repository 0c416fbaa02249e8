"""`watch` on a real vLLM server under load: the CPU demo's target serving with n-gram lookup
(N=8), the champion of the demo's code class, with a real Prometheus scraping it every second.

The profile it is held against (tests/data/profile_code_ngram.json) is the demo's own: `python
-m specflow` on the embedded defaults, then `python -m specflow profile SWEEP code ngram
--out tests/data` (docs/watching.md). The live traffic is the code class's prompts (the
champion's traffic) and then the classify class's (two-token answers: nothing for n-gram to
propose, so every target step yields one token).

Guaranteed at any machine speed (the demo's target is deterministic, so the counters are too:
n-gram accepts every token it proposes on code, and proposes nothing on two-token answers):
- read directly and through Prometheus, the code traffic is "as measured" (exit 0) and the
  classify traffic "worse beyond noise" on tokens per step (exit 3), predicting less than half
  the measured speedup; against a published curve (acceptance length only), the code traffic
  is as measured and the classify traffic, which drafts nothing, has nothing to hold (exit 4);
- the emitted alerting rules pass `promtool check rules`, and `promtool test rules` on series
  made of the windows' real increments fires the tokens-per-step alert on the classify traffic
  and nothing on the code traffic;
- the Prefect flow ends Failed on the classify traffic, with the table as an artifact;
- a server restarted mid-watch is a window "server restarted", counted from zero, and the
  watch goes on to the same verdict;
- no traffic, a /metrics that is not vLLM's, an unreachable server, a selector matching nothing,
  a profile of another target and a server without speculative decoding are each a clear
  message, exit 2 or 4, no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from specflow import cli
from specflow.config.compose import load_plan
from specflow.decision.watch import from_profile
from specflow.engine.server import LocalEngine, free_port
from specflow.spec.profile import read
from specflow.steps import alerts
from specflow.workloads.materializing import materialize
from tests.pipelines import live

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profile_code_ngram.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
WINDOW = ["watch.window_s=4", "watch.windows=4", "watch.scrape_s=1"]


class Traffic:
    """Requests kept in flight (4 at once) against a server, from one workload's prompts."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.rows: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.sent = 0
        self.busy = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(4)]

    def serve(self, rows: list[dict[str, Any]]) -> None:
        """Send these prompts from now on, once every request of the ones before has ended."""
        self.pause()
        self.rows = rows
        if not self.threads[0].is_alive():
            for t in self.threads:
                t.start()

    def pause(self) -> None:
        """Send nothing more, and wait for the requests in flight to end."""
        with self.lock:
            self.rows = []
        deadline = time.monotonic() + 300
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.1)

    def _run(self, i: int) -> None:
        k = i
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                with self.lock:
                    rows = self.rows
                    self.busy += bool(rows)
                if not rows:
                    time.sleep(0.2)
                    continue
                row = rows[k % len(rows)]
                k += 4
                try:
                    client.post(f"{self.url}/v1/completions", json={
                        "model": self.model, "prompt": row["prompt"],
                        "max_tokens": row["output_tokens"], "temperature": 0.0,
                        "ignore_eos": True})
                    self.sent += 1
                except httpx.HTTPError:  # a restart in progress
                    time.sleep(0.5)
                finally:
                    with self.lock:
                        self.busy -= 1
                if self.stop.is_set():
                    return


@pytest.fixture(scope="module")
def served(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("watch")
    loaded, plan = load_plan(["experiment=cpu_demo", "drafter=[none,ngram]",
                              "workload=[code_completion,classify]", f"paths.models={tiny_models}"])
    spec = loaded.spec
    ngram = next(e for e in plan.engine_configs if e.method == "ngram")
    port = free_port("127.0.0.1")
    backend = spec.backend.model_copy(update={"port": port})
    tok = str(tiny_models / "mimo_mtp2")
    rows = {name: [json.loads(line) for line in materialize(
        name, w, tmp / "data", tokenizer=tok).path.read_text().splitlines()]
        for name, w in spec.workload.items()}
    engine = LocalEngine(ngram, backend, tmp / "logs", stop_timeout_s=10)
    engine.start()
    traffic = Traffic(engine.base_url, engine.model_name)
    prom = None
    if PROMETHEUS:
        prom_port = free_port("127.0.0.1", exclude=[port])
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "vllm", "static_configs": [
                {"targets": [f"127.0.0.1:{port}"]}]}]}))
        log = (tmp / "prometheus.log").open("wb")
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        live.wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prom, tmp / "prometheus.log", 60)
    state = {"tmp": tmp, "engine": engine, "ngram": ngram, "plan": plan, "backend": backend,
             "rows": rows, "traffic": traffic, "url": f"{engine.base_url}/metrics",
             "prometheus": f"http://127.0.0.1:{prom_port}" if prom else None, "spans": {}}
    try:
        yield state
    finally:
        traffic.stop.set()
        state["engine"].stop()
        if prom is not None:
            prom.terminate()
            prom.wait(30)


def _watch(*args: str) -> tuple[int, dict[str, Any] | None, str]:
    """`python -m specflow watch ...` in this process: (exit code, its JSON or None, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["watch", *args])
    text = out.getvalue()
    return code, json.loads(text) if text.strip().startswith("{") else None, err.getvalue()


def _direct(state: dict, tmp: Path, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    return _watch("code", f"watch.metrics_url={state['url']}", f"watch.profile={PROFILE}",
                  f"promote.output_dir={tmp / 'none'}", *WINDOW, "--json", *extra)


def _figure(got: dict[str, Any], figure: str) -> dict[str, Any]:
    return next(r for r in got["rows"] if r["figure"] == figure)


@pytest.mark.engine
def test_watch_finds_the_champions_traffic_as_measured_and_other_traffic_worse(
        served: dict, tmp_path: Path) -> None:
    traffic: Traffic = served["traffic"]
    traffic.serve(served["rows"]["code_completion"])
    time.sleep(3)  # a first request of each prompt compiled nothing: CPU eager mode
    code, healthy, err = _direct(served, tmp_path)
    assert code == 0 and healthy is not None, err
    assert healthy["outcome"] == "as measured", healthy
    assert _figure(healthy, "tokens per step")["verdict"] == "as measured"
    assert all(r["verdict"] == "as measured" for r in healthy["rows"]), healthy["rows"]
    assert healthy["n"] == 8 and len(_figure(healthy, "position 8")["live"]) == 3
    served["spans"]["healthy"] = healthy["windows"][-1]["end"]

    traffic.serve(served["rows"]["classify"])
    time.sleep(2)
    code, degraded, err = _direct(served, tmp_path)
    assert code == 3 and degraded is not None, err
    assert degraded["outcome"] == "worse beyond noise"
    tps = _figure(degraded, "tokens per step")
    assert tps["verdict"] == "worse beyond noise" and tps["live"][0] < 1.2 < tps["reference"][0]
    assert degraded["predicted_speedup_factor"] < 0.5
    assert _figure(degraded, "acceptance length")["why"] == "no drafts in these windows"
    served["spans"]["degraded"] = degraded["windows"][-1]["end"]
    # the table a user reads
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["watch", "code", f"watch.metrics_url={served['url']}",
                         f"watch.profile={PROFILE}", f"promote.output_dir={tmp_path}",
                         *WINDOW, "watch.window_s=2", "watch.windows=2"]) == 3
    table = out.getvalue()
    assert "tokens per step" in table and "worse beyond noise" in table
    assert "code: worse beyond noise against code/ngram of sweep" in table

    # the rules from this profile: valid, and on the windows' real increments they fire on the
    # classify traffic only
    if PROMTOOL is None:
        pytest.skip("no promtool: `make test` installs Debian's prometheus (apt-get, as root)")
    _promtool(tmp_path, healthy, degraded)


def _promtool(tmp: Path, healthy: dict[str, Any], degraded: dict[str, Any]) -> None:
    expected = from_profile(read(PROFILE), 8, speedup=3.0)
    champ = alerts.Watched("code", "v1", "ngram", '{model_name="tiny_mimo_mtp2"}', expected)
    (tmp / "rules.yml").write_text(alerts.rules_yaml([champ], window_s=120, for_s=300,
                                                     tolerance=0.05))
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp / "rules.yml")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr

    def series(got: dict[str, Any]) -> list[dict[str, str]]:
        """The windows' mean increments, every minute for 30 minutes."""
        ws = [w for w in got["windows"] if w["generated"]]
        mean = {k: sum(w[k] for w in ws) / len(ws) for k in ("generated", "drafts", "accepted")}
        pos = [sum(w["per_position"][i] if i < len(w["per_position"]) else 0 for w in ws)
               / len(ws) for i in range(8)]
        lab = 'engine="0",model_name="tiny_mimo_mtp2"'
        out = [{"series": f"vllm:generation_tokens_total{{{lab}}}",
                "values": f"0+{mean['generated']:g}x30"},
               {"series": f"vllm:spec_decode_num_drafts_total{{{lab}}}",
                "values": f"0+{mean['drafts']:g}x30"},
               {"series": f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}}",
                "values": f"0+{mean['accepted']:g}x30"}]
        out += [{"series": f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},'
                           f'position="{i}"}}', "values": f"0+{p:g}x30"}
                for i, p in enumerate(pos)]
        return out

    labels = {"severity": "warning", "traffic_class": "code", "champion": "v1",
              "drafter": "ngram", "figure": "tokens per step"}
    rule = next(r for g in yaml.safe_load((tmp / "rules.yml").read_text())["groups"]
                for r in g["rules"] if r["alert"] == "SpecflowTokensPerStepLow")
    said = {k: v.replace('{{ $value | printf "%.3f" }}', "1.000")  # one token per step
            for k, v in rule["annotations"].items()}
    tests = {"rule_files": [str(tmp / "rules.yml")], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series(healthy), "alert_rule_test": [
            {"eval_time": "20m", "alertname": a, "exp_alerts": []} for a in (
                "SpecflowTokensPerStepLow", "SpecflowAcceptanceLengthLow",
                "SpecflowPositionAcceptanceLow")]},
        {"interval": "1m", "input_series": series(degraded), "alert_rule_test": [
            {"eval_time": "3m", "alertname": "SpecflowTokensPerStepLow", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "SpecflowTokensPerStepLow",
             "exp_alerts": [{"exp_labels": labels, "exp_annotations": said}]}]}]}
    (tmp / "tests.yml").write_text(yaml.safe_dump(tests))
    run = subprocess.run([str(PROMTOOL), "test", "rules", str(tmp / "tests.yml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.engine
def test_watch_through_prometheus_and_the_flow_that_fails_on_a_drop(
        served: dict, tmp_path: Path, prefect_api: str) -> None:
    if served["prometheus"] is None:
        pytest.skip("no prometheus: `make test` installs Debian's prometheus (apt-get, as root)")
    spans = served["spans"]
    assert set(spans) == {"healthy", "degraded"}, "runs after the direct watch"
    prom = [f"watch.prometheus_url={served['prometheus']}", f"watch.profile={PROFILE}",
            f"promote.output_dir={tmp_path}", *WINDOW, "--json"]
    code, healthy, err = _watch("code", *prom, f"watch.end={spans['healthy']}")
    assert code == 0 and healthy is not None and healthy["outcome"] == "as measured", err
    code, degraded, err = _watch("code", *prom, f"watch.end={spans['degraded']}")
    assert code == 3 and degraded is not None, err
    assert _figure(degraded, "tokens per step")["verdict"] == "worse beyond noise"
    # a published curve (acceptance length per N) instead of the profile: it has acceptance
    # length only, so the classify traffic, which drafts nothing, has nothing to hold
    (tmp_path / "golden.csv").write_text("n,acceptance_length\n4,5.0\n8,9.0\n")
    curve = [f"watch.prometheus_url={served['prometheus']}",
             f"watch.reference={tmp_path / 'golden.csv'}", f"promote.output_dir={tmp_path}",
             *WINDOW, "--json", "watch.num_speculative_tokens=8"]
    code, got, err = _watch("code", *curve, f"watch.end={spans['healthy']}")
    assert code == 0 and got is not None and got["outcome"] == "as measured", err
    assert got["against"] == "reference golden" and [r["figure"] for r in got["rows"] if
                                                     r["verdict"]] == ["acceptance length"]
    code, got, err = _watch("code", *curve, f"watch.end={spans['degraded']}")
    assert code == 4 and got is not None and got["outcome"] == "nothing to hold", err
    code, _, err = _watch("code", *prom, "watch.selector='job=\"nothing\"'")
    assert code == 2 and "no vLLM counters match {job=\"nothing\"}" in err, err
    assert "Traceback" not in err

    # the Prefect flow on the classify traffic still served: Failed, the table as an artifact
    overrides = [*prom[:-1], f"watch.end={spans['degraded']}"]
    script = (
        "import sys\n"
        "from prefect.artifacts import Artifact\n"
        "from pipelines.watch import artifact_key, watch_flow\n"
        f"state = watch_flow('code', {overrides!r}, return_state=True)\n"
        "print('STATE', state.type.value)\n"
        "a = Artifact.get(artifact_key('code'))\n"
        "print('ARTIFACT', a.type, a.description)\n"
        "print('DATA', a.data)\n")
    env = dict(os.environ, PREFECT_API_URL=prefect_api, PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False, cwd=Path(__file__).parents[2])
    out = proc.stdout
    assert "STATE FAILED" in out, out[-3000:] + proc.stderr[-3000:]
    assert "ARTIFACT table code: worse beyond noise" in out, out[-3000:]
    assert "tokens per step" in out and "AcceptanceDropped" in proc.stdout + proc.stderr


@pytest.mark.engine
def test_a_server_restarted_mid_watch_is_counted_from_zero(served: dict, tmp_path: Path
                                                           ) -> None:
    """However long the new server takes to start: the live watch records the readings that
    failed and never calls the gap a drop; through Prometheus, a span chosen once the new
    server has served a while holds windows before and after the restart, the restart counted
    from zero (a window "server restarted"), as measured."""
    traffic: Traffic = served["traffic"]
    traffic.serve(served["rows"]["code_completion"])
    got: dict[str, Any] = {}

    def watch() -> None:
        got["result"] = _direct(served, tmp_path)

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(4)
    stopped = time.time()
    served["engine"].stop()
    engine = LocalEngine(served["ngram"], served["backend"], served["tmp"] / "logs2",
                         stop_timeout_s=10)
    engine.start()  # the same port
    served["engine"] = engine
    t.join(120)
    code, result, err = got["result"]
    assert result is not None, err
    notes = [w["note"] for w in result["windows"]]
    assert any("readings failed" in n for n in notes), notes
    assert all(w["generated"] >= 0 and w["drafts"] >= 0 for w in result["windows"])
    assert code in (0, 4) and result["outcome"] != "worse beyond noise", (result, notes)
    if served["prometheus"] is None:
        return
    time.sleep(12)  # three windows of traffic on the new server
    end = time.time()
    count = math.ceil((end - (stopped - 8)) / 4)
    code, span, err = _watch("code", f"watch.prometheus_url={served['prometheus']}",
                             f"watch.profile={PROFILE}", f"promote.output_dir={tmp_path}",
                             "watch.window_s=4", f"watch.windows={count}", "watch.scrape_s=1",
                             f"watch.end={end}", "--json")
    assert span is not None, err
    notes = [w["note"] for w in span["windows"]]
    assert sum("server restarted" in n for n in notes) == 1, notes
    assert all(w["generated"] >= 0 for w in span["windows"])
    assert code == 0 and span["outcome"] == "as measured", (span["rows"], notes)


@pytest.mark.engine
def test_what_cannot_be_watched_is_said_clearly(served: dict, tmp_path: Path) -> None:
    traffic: Traffic = served["traffic"]
    traffic.pause()
    time.sleep(2)
    code, got, err = _direct(served, tmp_path, "watch.window_s=2", "watch.windows=2")
    assert code == 4 and got is not None and got["outcome"] == "no traffic", err
    # a /metrics that is not vLLM's: Prometheus's own (or, without it, a closed port)
    if served["prometheus"]:
        code, _, err = _watch("code", f"watch.metrics_url={served['prometheus']}/metrics",
                              f"watch.profile={PROFILE}", f"promote.output_dir={tmp_path}",
                              *WINDOW)
        assert code == 2 and "is not a vLLM server's /metrics: it has no vllm: metrics" in err
    closed = free_port("127.0.0.1")
    code, _, err = _watch("code", f"watch.metrics_url=http://127.0.0.1:{closed}/metrics",
                          f"watch.profile={PROFILE}", f"promote.output_dir={tmp_path}", *WINDOW)
    assert code == 2 and f"cannot reach http://127.0.0.1:{closed}/metrics" in err, err
    # a profile of another target
    other = json.loads(PROFILE.read_text())
    other["target"] = "/models/llama-70b@main"
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = _watch("code", f"watch.metrics_url={served['url']}",
                          f"watch.profile={tmp_path / 'other.json'}",
                          f"promote.output_dir={tmp_path / 'none'}", *WINDOW)
    assert code == 2 and "the profile is of target '/models/llama-70b@main'" in err, err
    # a server without speculative decoding: the baseline engine on the same port
    served["engine"].stop()
    baseline = next(e for e in served["plan"].engine_configs if e.method == "none")
    engine = LocalEngine(baseline, served["backend"], served["tmp"] / "logs3",
                         stop_timeout_s=10)
    engine.start()
    served["engine"] = engine
    code, _, err = _direct(served, tmp_path)
    assert code == 2 and "serves without speculative decoding" in err, err
    for e in (err,):
        assert "Traceback" not in e
