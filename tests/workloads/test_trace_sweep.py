"""A sweep on a request log, on the real vLLM engine (real Prefect, real MLflow): the demo trace
(tests/specflow.demo.traces: multi-turn agent conversations with tool calls and results, and
one-word router answers, two free-form classes, recorded output lengths) replayed per class and
as the one server that serves both, on the CPU demo's agreeing target with n-gram lookup; and
beside them, on the same engine starts, the code class decided on latency at offered request
rates (open loop), one of them more than the engine can take, and the classify class decided on
capacity (the highest rate each engine takes within a p99 end-to-end latency, searched)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specflow.config.compose import load
from specflow.decision.capacity import dithered, next_step
from specflow.demo import traces
from specflow.records.measurement import STEP, Measurement
from specflow.results.ledger import Ledger
from specflow.spec.schema import TraceSource
from specflow.spec.traces import read_trace
from specflow.steps import missing, open_sweep
from specflow.workloads import convert


@pytest.mark.engine
def test_a_trace_sweep_decides_per_class_and_for_the_service_and_keeps_prompts_home(
        tmp_path: Path, tiny_models: Path, prefect_api: str) -> None:
    """One grid sweep (a baseline start and an n-gram start) measures both
    classes and the service, its engines logging each request's body as vLLM's request logger
    does (`--enable-log-requests`, the documented logging config): that log, converted, is a
    trace of exactly what was replayed. Guaranteed at any machine speed: every request asked
    for, and got, the output length its log recorded (the agreeing target never stops early);
    the router's one-word answers never promote a drafter; whatever is promoted is n-gram; the
    service's speedup lies between its classes' (a mix of the two); the report and the console
    set the service beside routing; no prompt text reaches MLflow (store and artifacts), the
    report or the champions, not even through the engine's log, which the windows of the code
    class beside them (not private) would otherwise carry.
    On the same starts, the code class is offered requests open loop at 1.5 req/s (well
    within what the CPU engine takes at 4 in flight) and at 200 req/s (far beyond it) and
    decided on mean end-to-end latency. Guaranteed at any machine speed: every 200 req/s window
    is overload (the queue grew), reported in the console and the report and never scored;
    no 1.5 req/s window is; the class is decided (latency objective) from the 1.5 req/s point
    alone, and anything promoted there is n-gram. Measured closed loop too, the code class's
    throughput is answered beside its latency decision, with whether the two agree.
    On the same starts, the classify class (two-token answers) is decided on capacity within
    p99 e2el <= 300 ms: two searches per engine from about 16 req/s (dithered), each rate a
    window. Guaranteed at
    any machine speed: every search offers the rates the bracketing names after what it found
    (doubling while the SLO holds, halving while not, then the bracket's midpoint) and ends
    complete, in the ledger as steps of its planned window; the console prints each engine's
    capacity in req/s, the report tables them with the replicas 500 req/s needs; nothing is
    left to measure; n-gram, with nothing to draft on two tokens, is never promoted."""
    trace = traces.write(tmp_path / "trace.jsonl", per_class=24)
    args = ["experiment=cpu_demo", "drafter=[none,ngram]",
            "workload=[trace,code_completion,classify]",
            "workload.code_completion.num_prompts=12", "workload.classify.num_prompts=24",
            "workload.classify.arrival={capacity_from: 16}",
            "+promote.objectives.classify=capacity", "promote.capacity.slo={p99_e2el_ms: 300}",
            "promote.capacity.resolution=0.5", "promote.capacity.target_load=500",
            "workload.code_completion.arrival={request_rate: [1.5, 200], closed_loop: true}",
            "+promote.objectives.code=latency", "promote.latency_statistic=mean_e2el_ms",
            f"workload.trace.source.path={trace}", "workload.trace.num_prompts=16",
            "workload.trace.max_tokens=192", "workload.trace.input_len=400", "service=[shared]",
            "service.shared.num_prompts=32", "sweep.design=grid",
            "sweep.closing_baseline_repeats=0", f"paths.models={tiny_models}",
            "backend.engine.extra_args=[--distributed-executor-backend,uni,--enable-log-requests]",
            f"+backend.env.VLLM_LOGGING_CONFIG_PATH={convert.LOGGING}",
            f"tracking.workdir={tmp_path / 'work'}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"promote.output_dir={tmp_path / 'promoted'}"]
    env = dict(os.environ, PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=prefect_api,
               PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true",
               HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "specflow", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    decided = {m[1]: m[2] for m in re.finditer(
        r"^(router|sql-agent|shared) c4: (promote|off|unresolved)\b", out, re.M)}
    assert set(decided) == {"router", "sql-agent", "shared"}, out[-3000:]
    assert decided["router"] != "promote", out[-3000:]  # nothing left to draft on one word
    code = re.search(r"^code \[latency \(mean_e2el_ms\)\] c4: (promote|off|unresolved)\b(.*)",
                     out, re.M)
    assert code, out[-3000:]
    assert code[1] != "promote" or code[2].startswith(": ngram-n8 N=8 "), code[0]
    for cls in ("sql-agent", "shared"):
        if decided[cls] == "promote":
            assert re.search(rf"^{cls} c4: promote: ngram-n8 N=8 ", out, re.M), out[-3000:]
    # the one server beside a pool per class, in the console and the report
    line = re.search(r"^shared c4: one server: .*; routing each class to its own champion: "
                     r"([\d.]+)x \((router|sql-agent): .*50% of requests.*", out, re.M)
    assert line, out[-3000:]
    sweep_dir = next((tmp_path / "work" / "sweeps").iterdir())
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "## Services: one server, or a pool per class" in report
    assert re.search(r"^\| shared \| c4 \| ", report, re.M), report[-2000:]
    # measured output lengths: the log's, request by request
    ledger = Ledger(tmp_path / "work", sweep_dir.name)
    searched = [m for m in ledger.measurements() if m.traffic_class == "classify"]
    every = [m for m in ledger.measurements() if m.ok and m not in searched]
    assert len(every) == len(ledger.measurements()) - len(searched) == 24  # 2 x 6 x 2, all ok
    _capacity(searched, out + proc.stderr, report, args)
    # open loop: the offered rate far beyond the engine overloads it, reported, never scored
    opened = [m for m in every if m.key.workload.startswith("code_completion@")]
    over = [m for m in opened if m.key.workload == "code_completion@200rps"]
    assert len(over) == 4 and all(m.overload and m.request_rate == 200 for m in over), [
        (m.key.id, m.backlog_growth) for m in over]
    steady = [m for m in opened if m.key.workload == "code_completion@1.5rps"]
    assert len(steady) == 4 and not any(m.overload for m in steady), [
        (m.key.id, m.backlog_growth) for m in steady]
    assert all(m.request_rate == 1.5 and m.latency_ms["mean_e2el_ms"] > 0 for m in steady)
    assert re.search(r"\S+ code_completion@200rps c4 r0: ok, .*OVERLOAD at 200 req/s",
                     out + proc.stderr), (out + proc.stderr)[-3000:]
    assert "overload: the baseline does not keep up at code_completion@200rps c=4" in report
    side = re.search(r"^code c4: decided for latency \(mean_e2el_ms\): (promote ngram-n8 \(.*?\)"
                     r"|off|unresolved); throughput: (promote ngram-n8 \(.*?\)|off|unresolved): "
                     r"(they agree|they disagree|not all concluded)$", out, re.M)
    assert side, out[-3000:]  # the closed-loop windows answered beside, never decided on
    assert "### `code` decided for throughput, beside" in report
    for engine in ("baseline", "ngram-n8"):  # no usable window there: none scored
        assert re.search(rf"^\| {engine} \| code_completion@200rps \| 4 \| 0 \| overload x2 \|",
                         report, re.M), report[-3000:]
    ms = [m for m in every if not m.key.workload.startswith("code_completion")]
    datasets = {p.name.rsplit("-", 1)[0]: p for p in (sweep_dir / "datasets").iterdir()
                if not p.name.startswith(("code_completion", "classify"))}
    asked = {w: [json.loads(x)["output_tokens"] for x in p.read_text().splitlines()]
             for w, p in datasets.items()}
    for m in ms:
        got = [r.output_tokens for r in m.requests]
        assert got == asked[m.key.workload], (m.key.id, got, asked[m.key.workload])
    # the service mixes its classes: its speedup lies between theirs
    speed = {}
    for cls in ("router", "sql-agent", "shared"):
        base = [m.output_throughput for m in ms if m.key.workload == cls
                and m.method == "none"]
        cand = [m.output_throughput for m in ms if m.key.workload == cls
                and m.method == "ngram"]
        speed[cls] = (sum(cand) / len(cand)) / (sum(base) / len(base))
    lo, hi = sorted((speed["router"], speed["sql-agent"]))  # one engine start a side: a
    # window's noise (a slow machine: ~20%) around a mix that sits ~0.9x the agent's
    assert 0.75 * lo <= speed["shared"] <= 1.25 * hi, speed
    assert speed["sql-agent"] > speed["router"], speed
    # production text stays in the work directory: not in MLflow, the report or champions
    logged = [json.loads(x) for x in trace.read_text().splitlines()]
    texts = {m["content"] for r in logged for m in (r.get("request") or r)["messages"]
             if isinstance(m.get("content"), str) and len(m["content"]) > 30}
    assert len(texts) > 40
    store = [tmp_path / "mlflow.db", *(tmp_path / "work" / "mlartifacts").rglob("*"),
             *(sweep_dir / "report").rglob("*"), *(tmp_path / "promoted").rglob("*")]
    files = [p for p in store if p.is_file()]
    assert len(files) > 50 and any(p.name == "result.json" for p in files)

    def found(data: bytes) -> list[str]:
        return [t[:40] for t in texts if t.encode() in data or json.dumps(t)[1:-1].encode()
                in data]

    home = b"".join(p.read_bytes() for p in (sweep_dir / "datasets").iterdir())
    assert len(found(home)) > 40  # the check finds them where they are: the replayed datasets
    for p in files:
        assert not found(p.read_bytes()), p
    # generated text neither: the window results MLflow holds carry each text's sha256
    results = [json.loads(p.read_text()) for p in files if p.name == "result.json"]
    private = [r for r in results if all(len(t) == 64 and set(t) <= set("0123456789abcdef")
                                         for t in r["generated_texts"])]
    assert len(results) == 24 + len(searched) and len(private) == 12  # the code and classify
    # classes' texts are not private
    # no engine log either, not even with the code class's (not private) windows: the engine
    # served the trace's requests too; the code windows keep their own bench logs
    logs = {p.name for p in files if "mlartifacts" in p.parts and p.suffix == ".log"}
    assert logs <= {"bench.log", "warmup.log"}, logs
    assert not any(t in out + proc.stderr for t in texts)
    # vLLM's own request log, converted: every replayed prompt with its output length
    logs = [p for p in (sweep_dir / "runs" / "engines").glob("*.log") if "JSON body" in
            p.read_text(errors="replace")]
    assert len(logs) == 2, list((sweep_dir / "runs" / "engines").iterdir())  # both engines
    converted = tmp_path / "from-vllm.jsonl"
    rows = []
    for log in logs:
        assert convert.main(["vllm-log", str(log), "-o", str(tmp_path / "one.jsonl")]) == 0
        rows += (tmp_path / "one.jsonl").read_text().splitlines()
    converted.write_text("\n".join(rows) + "\n")
    replayed = {(json.loads(x)["prompt"], json.loads(x)["output_tokens"])
                for p in datasets.values() for x in p.read_text().splitlines()}
    trace_back = read_trace(converted, TraceSource(path=str(converted)))
    assert not trace_back.problems
    got = {(r.prompt, r.max_tokens) for r in trace_back.requests}
    assert replayed <= got, len(replayed - got)
    assert all(r.timestamp and r.timestamp > 1.7e9 for r in trace_back.requests)


def _capacity(steps: list[Measurement], out: str, report: str, args: list[str]) -> None:
    """The classify class's capacity searches (see the test's docstring); `out`: the run's
    stdout and stderr (where the window lines go)."""
    promote = load(args).spec.promote
    searches: dict[tuple[str, int], list[Measurement]] = {}
    for m in steps:
        searches.setdefault((m.engine, m.key.planned.repeat), []).append(m)
    assert sorted(searches) == [("baseline", 0), ("baseline", 1), ("ngram-n8", 0),
                                ("ngram-n8", 1)], sorted(searches)
    for key, ms in searches.items():
        ms.sort(key=lambda m: m.key.step)
        assert [m.key.step for m in ms] == list(range(len(ms))), key
        assert ms[0].request_rate == dithered(16.0, ms[0].key.id)  # near 16, per search
        assert ms[0].key.repeat == key[1]
        for k in range(1, len(ms)):  # each rate the one the bracketing named after the others
            assert ms[k].request_rate == next_step(ms[:k], promote), (key, k)
            assert ms[k].key.repeat == key[1] + k * STEP
        assert next_step(ms, promote) is None, key  # ended: bracketed, or at a bound
    assert re.search(r"\S+ classify@capacity c4 r\d step 1: ", out), out[-3000:]
    assert "### Capacity within the SLOs" in report and "replicas for 500 req/s" in report
    for engine in ("baseline", "ngram-n8"):  # both searches found a capacity, with an interval
        assert re.search(rf"^\| {engine} \| classify@capacity \| 4 \| [\d.]+ \[[\d.]+, "
                         r"[\d.]+\] \| 2 of 2 \| \d+ \|$", report, re.M), report[-3000:]
    decided = re.search(r"^classify \[capacity \(p99_e2el_ms <= 300\)\] c4: "
                        r"(promote|off|unresolved)\b", out, re.M)
    assert decided and decided[1] != "promote", out[-3000:]  # nothing to draft on two tokens
    assert not missing(open_sweep(args, tracking=False, sync=False))  # every search complete
