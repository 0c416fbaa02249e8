"""Measure engine configs on a real vLLM server: load, counters, one Measurement per window.

Per engine config: one engine start (`specflow.engine.server`), one long-lived load generator
(`specflow.engine.loadgen`), and every (workload, concurrency, repeat) window run against them. Per
window: warm-up requests before the first window at each concurrency level (a separate bench
run, outside every measured window), a
/metrics scrape, the measured `vllm bench serve` run, another scrape; the bench result JSON
becomes a frozen Measurement and specflow's own counter deltas must equal bench's exactly.
Failures (engine start, crash, OOM, hang, timeout, failed requests, counter mismatch) become
failed Measurements with the reason and log tail; the sweep goes on.

Layout under `workdir`: `engines/<name>-<hash>.log|.json` (server log, process record) and
`windows/<engine hash>/<workload>/c<N>/r<R>/` (warm-up and bench logs, result.json,
counters.json).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ValidationError

from specflow.decision.requests import request_sums
from specflow.engine import metrics
from specflow.engine.loadgen import (
    BenchDriver,
    JobResult,
    LoadGenerator,
    LoadGeneratorError,
    LoadGeneratorKind,
    bench_env,
    make_load_generator,
    release,
)
from specflow.engine.server import (
    Endpoint,
    EngineFailure,
    EngineStartError,
    LocalEngine,
    Server,
    argv_value,
    http_get,
    redact_argv,
    tail,
    tokenizer_of,
)
from specflow.records.fsio import atomic_write_json
from specflow.records.measurement import (
    LATENCY_METRICS,
    LATENCY_STATS,
    Measurement,
    RequestStats,
    WindowKey,
)
from specflow.spec.compile import EngineConfig
from specflow.spec.schema import EndpointBackend, LocalBackend, WorkloadSpec
from specflow.spec.serialize import as_json
from specflow.stats.queueing import backlog

RESULT_FILE = "result.json"
PERCENTILE_METRICS = ",".join(LATENCY_METRICS)
METRIC_PERCENTILES = "50,90,99"


@dataclass(frozen=True)
class Window:
    """One measured window: a workload's dataset at one concurrency, one repeat."""

    workload: str
    """Workload name."""
    traffic_class: str
    """The workload's traffic class."""
    dataset: Path
    """JSONL in vLLM's custom-dataset format, one `{"prompt": ...}` per line; prompts are sent
    verbatim (chat templates are rendered when the dataset is built)."""
    num_prompts: int
    """Requests in the window: the dataset's first `num_prompts` lines, in order."""
    max_tokens: int
    """Output tokens requested per prompt (with `per_request_lengths`, the most any asks)."""
    concurrency: int
    """Max in-flight requests."""
    repeat: int = 0
    """Repeat index, from 0."""
    seed: int = 0
    """bench's seed."""
    temperature: float = 0.0
    """Sampling temperature."""
    warmup_requests: int = 0
    """Requests sent (and discarded) before the measured window; the runner sends them only
    before the first window at each concurrency level of an engine start."""
    ignore_eos: bool = False
    """Generate max_tokens even past EOS."""
    stop: tuple[str, ...] = ()
    """Stop strings sent with every request."""
    start: int = 0
    """Which engine start of the config this window belongs to."""
    per_request_lengths: bool = False
    """Each request asks for its own output length (the dataset's `output_tokens`: a trace's
    recorded lengths, a service's classes)."""
    request_rate: float | None = None
    """Open loop: requests offered per second (gamma gaps of shape `burstiness`), with
    `concurrency` as the cap on those in flight; None: closed loop, `concurrency` kept full."""
    burstiness: float = 1.0
    """Shape of the open-loop arrival gaps (1: Poisson)."""
    search: bool = False
    """A capacity search's planned window: the rate it offers is where the search starts, and
    the engine start measures the rates it names next (`specflow.steps.measure.steps`)."""

    def key(self, ec: EngineConfig) -> WindowKey:
        return WindowKey(ec.hash, self.workload, self.concurrency, self.repeat, self.start)


def plan_windows(workloads: Mapping[str, WorkloadSpec], datasets: Mapping[str, Path],
                 concurrency: Sequence[int], repeats: int, warmup_requests: int) -> list[Window]:
    """Every window of one engine config; repeats outermost, so drift spreads over all points."""
    missing = sorted(set(workloads) - set(datasets))
    if missing:
        raise ValueError(f"no dataset for workload(s) {missing}")
    return [Window(workload=name, traffic_class=w.traffic_class, dataset=Path(datasets[name]),
                   num_prompts=w.num_prompts, max_tokens=w.max_tokens, concurrency=c, repeat=r,
                   seed=w.seed, temperature=w.temperature, warmup_requests=warmup_requests,
                   ignore_eos=w.ignore_eos, stop=tuple(w.stop),
                   per_request_lengths=w.source.kind in ("trace", "mix"),
                   request_rate=_rate(w), search=w.arrival is not None and
                   w.arrival.capacity_from is not None,
                   burstiness=(w.arrival.burstiness or 1.0) if w.arrival else 1.0)
            for r in range(repeats) for name, w in workloads.items() for c in concurrency]


def _rate(w: WorkloadSpec) -> float | None:
    """The rate an (expanded) workload's windows offer: its rate, or where its capacity search
    starts; None: closed loop."""
    a = w.arrival
    return None if a is None else a.capacity_from if a.capacity_from is not None else \
        a.request_rate[0]


def cache_salt(key: WindowKey, *, warmup: bool = False) -> str:
    """The window's prefix-cache salt: its own, so a repeat that re-sends the same prompts
    on the same engine start is measured on a cold prefix cache, like the first (its prompts
    still share prefixes with each other, as production traffic does); the warm-up has another,
    so it warms the engine without caching the window's first prompt."""
    salt = "specflow." + key.id + (".warmup" if warmup else "")
    salt = salt.translate(_SALT_SAFE)
    if len(salt) > _SALT_MAX:  # vLLM's limit; a long workload name is hashed instead
        salt = "specflow." + hashlib.sha256(salt.encode()).hexdigest()
    return salt


_SALT_SAFE = str.maketrans({c: "." for c in "@/\\\0"})
"""Characters vLLM refuses in a cache salt."""
_SALT_MAX = 128


def bench_argv(server: Server, w: Window, window_dir: Path, *, warmup: bool = False,
               salt: str | None = None) -> list[str]:
    """`vllm bench serve` arguments for a window (or for its warm-up); `salt`: the requests'
    `cache_salt` (see `cache_salt`)."""
    argv = ["--backend", "vllm", "--base-url", server.base_url, "--model", server.model_name,
            "--tokenizer", server.tokenizer, "--dataset-name", "custom",
            "--dataset-path", str(w.dataset), "--disable-shuffle", "--no-oversample",
            "--skip-chat-template",
            # -1: each line's own output_tokens
            "--custom-output-len", "-1" if w.per_request_lengths else str(w.max_tokens),
            "--seed", str(w.seed), "--temperature", repr(float(w.temperature)),
            "--max-concurrency", str(w.concurrency), "--disable-tqdm",
            # No readiness poll request: it would run inside specflow's counter window but
            # outside bench's, and the server is known to be ready.
            "--ready-check-timeout-sec", "0"]
    if w.ignore_eos:
        argv.append("--ignore-eos")
    extra: dict[str, Any] = {"stop": list(w.stop)} if w.stop else {}
    if salt is not None:
        extra["cache_salt"] = salt
    if extra:
        argv += ["--extra-body", json.dumps(extra)]
    if warmup:
        # bench's own warm-up (the first prompt, at the window's concurrency) plus one request.
        return argv + ["--num-prompts", "1", "--num-warmups", str(w.warmup_requests - 1)]
    if w.request_rate is not None:  # open loop; bench's arrivals are seeded by --seed
        argv += ["--request-rate", repr(float(w.request_rate)),
                 "--burstiness", repr(float(w.burstiness))]
    return argv + ["--num-prompts", str(w.num_prompts), "--num-warmups", "0",
                   "--percentile-metrics", PERCENTILE_METRICS,
                   "--metric-percentiles", METRIC_PERCENTILES,
                   "--save-result", "--save-detailed", "--result-dir", str(window_dir),
                   "--result-filename", RESULT_FILE]


def sampling_of(argv: Sequence[str]) -> dict[str, str | int | float | bool | None]:
    """What a window's requests carry, read from its `vllm bench serve` arguments: a setting
    left out is None (vLLM's default applies, and that default may change between versions: the
    temperature trap of vLLM issue 33497). Recorded on every window and compared across sweeps
    (`specflow compare`), so that a changed request reads as "the workload changed"."""
    def number(flag: str, kind: type[int] | type[float]) -> int | float | None:
        value = argv_value(argv, flag)
        return kind(value) if value is not None else None

    extra = json.loads(argv_value(argv, "--extra-body") or "{}")
    stop = extra.get("stop")
    return {"temperature": number("--temperature", float), "seed": number("--seed", int),
            "max_tokens": number("--custom-output-len", int),
            "ignore_eos": "--ignore-eos" in argv,
            "chat_template": "as materialised" if "--skip-chat-template" in argv
            else "applied by vllm bench",
            "order": "dataset order" if "--disable-shuffle" in argv else "shuffled",
            "stop": json.dumps(stop or [])}


def read_prompts(w: Window) -> list[str]:
    """The window's prompts, in order; ValueError when the dataset cannot provide them."""
    prompts: list[str] = []
    with open(w.dataset, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{w.dataset}:{n}: expected an object with a string 'prompt'")
            prompts.append(row["prompt"])
    if len(prompts) < w.num_prompts:
        raise ValueError(f"{w.dataset} has {len(prompts)} prompts; the window needs "
                         f"{w.num_prompts} (prompts are never repeated)")
    return prompts[: w.num_prompts]


def prompt_hash(prompts: Sequence[str]) -> str:
    """sha256 of the exact prompts sent, in order (JSON list of strings, UTF-8), as
    `specflow.workloads.materialize` hashes a materialised dataset."""
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")
                          ).hexdigest()


def output_digests(result: Mapping[str, Any]) -> tuple[str, ...]:
    """sha256 of each generated text in dataset order; "" for a request that failed."""
    texts = result.get("generated_texts") or []
    errors = result.get("errors") or [""] * len(texts)
    return tuple("" if err else hashlib.sha256(text.encode("utf-8")).hexdigest()
                 for text, err in zip(texts, errors, strict=False))


def latency_stats(result: Mapping[str, Any], open_loop: bool = False) -> dict[str, float]:
    """vLLM's latency statistics present in a result (`p99_tpot_ms`, `mean_ttft_ms`, ...).

    `open_loop`: TTFT and end-to-end latency count from each request's arrival, not from when
    the load generator sent it: under the concurrency cap a request offered open loop waits at
    the client (`queue_times`) as it would at a gateway, and vLLM's bench leaves that wait out
    of both. Recomputed from the detailed result, over the requests that succeeded."""
    out = {f"{s}_{m}_ms": float(result[f"{s}_{m}_ms"]) for m in LATENCY_METRICS
           for s in LATENCY_STATS if result.get(f"{s}_{m}_ms") is not None}
    if not open_loop:
        return out
    waited = result.get("queue_times") or []
    errors = result.get("errors") or [""] * len(waited)
    for metric, key in (("ttft", "ttfts"), ("e2el", "latencies")):
        values = result.get(key) or []
        if not (len(values) == len(waited) == len(errors)) or not values:
            continue
        ms = np.asarray([(v + q) * 1000.0 for v, q, e in zip(values, waited, errors, strict=True)
                         if not e])
        if not ms.size:
            continue
        out |= {f"mean_{metric}_ms": float(ms.mean()), f"median_{metric}_ms": float(np.median(ms)),
                **{f"p{p}_{metric}_ms": float(np.percentile(ms, p)) for p in (50, 90, 99)}}
    return out


# --------------------------------------------------------------------------------------------
# One window


def _scrape(server: Server) -> metrics.Snapshot:
    status, body = http_get(f"{server.base_url}/metrics", server.auth_headers, timeout=30.0)
    if status != 200:
        raise ConnectionError(f"GET {server.base_url}/metrics answered {status or 'nothing'}")
    return metrics.scrape(body)


def _failed(ec: EngineConfig, w: Window, kind: str, detail: str,
            artifacts: Mapping[str, Path] | None = None, **numbers: Any) -> Measurement:
    return Measurement(key=w.key(ec), engine=ec.name, drafter=ec.series, method=ec.method,
                       num_speculative_tokens=ec.num_speculative_tokens,
                       traffic_class=w.traffic_class, status="failed", failure=kind,
                       failure_detail=detail,
                       artifacts={k: str(v) for k, v in (artifacts or {}).items()}, **numbers)


WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EIO})
"""A write that fails with one of these is the disk's fault (full, over a size limit or a quota,
read-only, failing), not the engine's: the window is `write_failed`."""
_WRITE_ERROR_TEXT = tuple(f"[Errno {e}]" for e in sorted(WRITE_ERRNOS))


def _write_failed(exc: OSError) -> Failure:
    where = f" {exc.filename}" if exc.filename else ""
    return "write_failed", f"could not write{where}: {exc.strerror or exc}"


def _job_failure(server: Server, job: JobResult, log: Path) -> tuple[str, str]:
    """(kind, detail) for a bench job that did not finish: engine down, timeout, a result file
    the disk refused (`write_failed`) or another bench error."""
    down = server.failure()
    if down is not None:
        return down.kind, down.detail
    kind = "timeout" if job.timed_out else "bench_failed"
    if not job.timed_out and any(t in job.error for t in _WRITE_ERROR_TEXT):
        kind = "write_failed"
    return kind, f"{job.error}\n--- bench log tail ---\n{tail(log)}"


Failure = tuple[str, str]
"""(kind, detail) of a window that produced no usable result."""
Status = tuple[Literal["ok", "failed"], str | None, str]
"""(status, failure, detail) of a window that ran."""


@dataclass(frozen=True)
class _Files:
    """Where one window's files go."""

    dir: Path

    @property
    def bench_log(self) -> Path:
        return self.dir / "bench.log"

    @property
    def warmup_log(self) -> Path:
        return self.dir / "warmup.log"

    @property
    def counters(self) -> Path:
        return self.dir / "counters.json"

    @property
    def result(self) -> Path:
        return self.dir / RESULT_FILE

    @property
    def per_request(self) -> Path:
        return self.dir / "per_request.jsonl"


@dataclass(frozen=True)
class _Run:
    """What a measured window returned: bench's result and the counters around it."""

    result: dict[str, Any]
    before: metrics.Snapshot
    after: metrics.Snapshot

    @property
    def prefix_cache(self) -> metrics.PrefixCache | None:
        """The window's prefix-cache deltas (tokens), None where the server has no counters."""
        b, a = self.before.prefix_cache, self.after.prefix_cache
        return a - b if a is not None and b is not None else None


def _warm_up(server: Server, gen: LoadGenerator, w: Window, files: _Files, timeout_s: float,
             artifacts: dict[str, Path], key: WindowKey) -> Failure | None:
    """The window's warm-up requests (outside the measured window); a failure, or None."""
    if w.warmup_requests <= 0:
        return None
    artifacts["warmup_log"] = files.warmup_log
    job = gen.run(bench_argv(server, w, files.dir, warmup=True,
                             salt=cache_salt(key, warmup=True)), files.warmup_log, timeout_s)
    if job.ok:
        return None
    kind, detail = _job_failure(server, job, files.warmup_log)
    return kind, "warm-up: " + detail


def _bench(server: Server, gen: LoadGenerator, w: Window, files: _Files, timeout_s: float,
           artifacts: dict[str, Path], key: WindowKey) -> _Run | Failure:
    """The measured window: /metrics before, `vllm bench serve`, /metrics after."""
    try:
        before = _scrape(server)
    except ConnectionError as exc:
        down = server.failure()
        return (down.kind, down.detail) if down else ("metrics_unavailable", str(exc))
    files.per_request.unlink(missing_ok=True)
    job = gen.run(bench_argv(server, w, files.dir, salt=cache_salt(key)), files.bench_log,
                  timeout_s, per_request=files.per_request)
    after: metrics.Snapshot | None = None
    scrape_error = ""
    try:
        after = _scrape(server)
    except ConnectionError as exc:
        scrape_error = str(exc)
    if files.result.is_file():
        artifacts["result"] = files.result
    down = server.failure()
    if down is not None:
        return down.kind, down.detail
    if not job.ok or not files.result.is_file():
        return _job_failure(server, job, files.bench_log)
    result = json.loads(files.result.read_text(encoding="utf-8"))
    if after is None:
        return "metrics_unavailable", scrape_error
    return _Run(result, before, after)


class TappedRequest(BaseModel):
    """One line of the bench driver's per-request file: the prompt's digest and the request's
    speculative-decoding metrics (vLLM's `metrics.speculative_decoding` usage chunk)."""

    prompt_sha: str
    spec: dict[str, Any]


def request_stats(result: Mapping[str, Any], prompts: Sequence[str], tapped: Path
                  ) -> tuple[RequestStats, ...]:
    """Each request in dataset order: lengths and latency from bench's detailed result, and
    the per-request speculative-decoding metrics the bench driver tapped (matched by prompt;
    absent where none were read)."""
    spec: dict[str, list[dict[str, Any]]] = {}
    if tapped.is_file():
        for line in tapped.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValidationError):  # a line cut short by a killed driver
                row = TappedRequest.model_validate_json(line)
                spec.setdefault(row.prompt_sha, []).append(row.spec)
    cols = [result.get(k) or [] for k in ("input_lens", "output_lens", "latencies", "ttfts")]
    out = []
    for i, (inp, outp, lat, ttft) in enumerate(zip(*cols, strict=False)):
        mine = spec.get(request_digest(prompts[i]), []) if i < len(prompts) else []
        s = mine.pop(0) if mine else {}
        out.append(RequestStats(
            prompt_tokens=int(inp or 0), output_tokens=int(outp or 0),
            latency_s=float(lat or 0.0), ttft_s=float(ttft or 0.0),
            spec_steps=s.get("num_spec_steps"), accepted=s.get("num_accepted_draft_tokens"),
            drafted=s.get("num_draft_tokens")))
    return tuple(out)


def request_digest(prompt: str) -> str:
    """A prompt's digest as the bench driver records it with its request."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def per_request_check(requests: Sequence[RequestStats], delta: metrics.SpecCounters | None
                      ) -> dict[str, Any]:
    """Per-request sums against the /metrics deltas of the window: they must agree, or the
    difference is reported (never a failed window: the counters are the reference)."""
    sums = request_sums(requests)
    out: dict[str, Any] = {"requests": len(requests),
                           "with_metrics": sum(r.spec_steps is not None for r in requests),
                           "sums": sums}
    if delta is not None and sums is not None:
        diff = {k: v - getattr(delta, k) for k, v in sums.items() if v != getattr(delta, k)}
        out["difference"] = diff
        out["agrees"] = not diff
    return out


def _status(w: Window, result: Mapping[str, Any], mismatches: Sequence[str]
            ) -> Status:
    """(status, failure, detail): failed requests or counters that disagree with bench."""
    if result.get("failed", 0) or result.get("completed", 0) < w.num_prompts:
        errors = [e for e in result.get("errors") or [] if e]
        return "failed", "requests_failed", (
            f"{result.get('failed', 0)} of {w.num_prompts} requests failed; first errors: "
            + " | ".join(errors[:3]))
    if mismatches:
        return "failed", "metrics_mismatch", ("bench and /metrics disagree: "
                                              + "; ".join(mismatches))
    return "ok", None, ""


def measure_window(server: Server, gen: LoadGenerator, ec: EngineConfig, w: Window,
                   window_dir: Path, timeout_s: float) -> Measurement:
    """Run one window against a running server and turn it into a Measurement; a disk that
    refuses the window's files (full, over a size limit) fails it as `write_failed`."""
    files = _Files(window_dir)
    artifacts: dict[str, Path] = {"bench_log": files.bench_log}
    if server.log_path is not None:
        artifacts["engine_log"] = server.log_path
    try:
        return _measure(server, gen, ec, w, files, timeout_s, artifacts)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        return _failed(ec, w, *_write_failed(exc), artifacts)


def _measure(server: Server, gen: LoadGenerator, ec: EngineConfig, w: Window, files: _Files,
             timeout_s: float, artifacts: dict[str, Path]) -> Measurement:
    files.dir.mkdir(parents=True, exist_ok=True)
    files.result.unlink(missing_ok=True)
    try:
        prompts = read_prompts(w)
    except (OSError, ValueError) as exc:
        return _failed(ec, w, "dataset_invalid", str(exc), artifacts)
    phash = prompt_hash(prompts)
    sent = sampling_of(bench_argv(server, w, files.dir))
    key = w.key(ec)
    run = _warm_up(server, gen, w, files, timeout_s, artifacts, key) or \
        _bench(server, gen, w, files, timeout_s, artifacts, key)
    if not isinstance(run, _Run):
        return _failed(ec, w, *run, artifacts, prompt_hash=phash, sampling=sent)
    delta = metrics.window_delta(run.before.spec, run.after.spec)
    mismatches = metrics.compare_with_bench(delta, run.result)
    requests = request_stats(run.result, prompts, files.per_request)
    if files.per_request.is_file():
        artifacts["per_request"] = files.per_request
    prefix = run.prefix_cache
    atomic_write_json(files.counters, {
        "before": as_json(run.before.spec) if run.before.spec else None,
        "after": as_json(run.after.spec) if run.after.spec else None,
        "delta": as_json(delta) if delta else None,
        # tokens of this window's prompts found in the prefix cache (the salt keeps other
        # windows' prompts out: hits come only from prefixes shared inside the window)
        "prefix_cache": as_json(prefix) if prefix else None,
        "bench": {k: v for k, v in run.result.items() if k.startswith("spec_decode_")},
        "mismatches": mismatches,
        "per_request": per_request_check(requests, delta)
        if ec.speculative_config is not None else None})
    artifacts["counters"] = files.counters
    return replace(_measurement(ec, w, run.result, delta, _status(w, run.result, mismatches),
                                phash, artifacts, requests), sampling=sent)


def _measurement(ec: EngineConfig, w: Window, result: Mapping[str, Any],
                 delta: metrics.SpecCounters | None,
                 status: Status, phash: str, artifacts: Mapping[str, Path],
                 requests: tuple[RequestStats, ...]) -> Measurement:
    """The window's record: bench's throughput and latency, the counter deltas (speculative
    engines only), per-request output digests, lengths, latency and acceptance."""
    spec = delta if ec.speculative_config is not None else None
    return Measurement(
        key=w.key(ec), engine=ec.name, drafter=ec.series, method=ec.method,
        num_speculative_tokens=ec.num_speculative_tokens, traffic_class=w.traffic_class,
        status=status[0], failure=status[1], failure_detail=status[2],
        completed=int(result.get("completed", 0)), failed=int(result.get("failed", 0)),
        duration_s=float(result.get("duration", 0.0)),
        output_throughput=float(result.get("output_throughput", 0.0)),
        request_throughput=float(result.get("request_throughput", 0.0)),
        total_token_throughput=float(result.get("total_token_throughput", 0.0)),
        latency_ms=latency_stats(result, open_loop=w.request_rate is not None),
        acceptance_rate=spec.acceptance_rate if spec else None,
        mean_acceptance_length=spec.mean_acceptance_length if spec else None,
        per_position_acceptance=spec.per_position if spec else (),
        num_drafts=spec.num_drafts if spec else None,
        draft_tokens=spec.draft_tokens if spec else None,
        accepted_tokens=spec.accepted_tokens if spec else None,
        output_digests=output_digests(result), prompt_hash=phash,
        total_output_tokens=int(result.get("total_output_tokens", 0)),
        artifacts={k: str(v) for k, v in artifacts.items()}, requests=requests,
        **_arrival(w, result))


def _arrival(w: Window, result: Mapping[str, Any]) -> dict[str, Any]:
    """An open-loop window's offered rate, and whether its backlog kept growing (overload),
    from each request's send time, client-side wait and latency in bench's detailed result."""
    if w.request_rate is None:
        return {}
    sent, waited, lat = (result.get(k) or [] for k in ("start_times", "queue_times",
                                                         "latencies"))
    if not (len(sent) == len(waited) == len(lat)) or not sent:
        return {"request_rate": w.request_rate}
    q = backlog([s - d for s, d in zip(sent, waited, strict=True)],
                [s + x for s, x in zip(sent, lat, strict=True)], w.request_rate)
    return {"request_rate": w.request_rate, "backlog_growth": q.growth,
            "overload": q.overload}


# --------------------------------------------------------------------------------------------
# One engine config


def _window_dir(workdir: Path, key: WindowKey) -> Path:
    return workdir / "windows" / key.id


def _windows(server: Server, gen: LoadGenerator, ec: EngineConfig, todo: Sequence[Window],
             workdir: Path, timeout_s: float) -> Iterator[tuple[Measurement, EngineFailure | None]]:
    """Measure windows in order; stop after the first one that finds the server down.

    Only the first window at each concurrency level gets its warm-up: the engine is warm for
    that level afterwards (a warm-up per window would cost its requests' time on every window)."""
    warmed: set[int] = set()
    for w in todo:
        if w.concurrency in warmed:
            w = replace(w, warmup_requests=0)
        warmed.add(w.concurrency)
        m = measure_window(server, gen, ec, w, _window_dir(workdir, w.key(ec)), timeout_s)
        down = server.failure() if not m.ok else None
        yield m, down
        if down is not None:
            return


def _not_run(ec: EngineConfig, rest: Sequence[Window], why: str) -> Iterator[Measurement]:
    for w in rest:
        yield _failed(ec, w, "engine_down", why)


def _full_disk(directory: Path, failure: Failure) -> Failure:
    """An engine that exits during its start on a disk that refuses its log (full, over a size
    limit) failed for the disk, not for its config: `write_failed` (never retried)."""
    probe = directory / ".specflow-write-probe"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        return "write_failed", (f"{failure[1]}; its log directory {directory} refuses writes: "
                                f"{exc.strerror}")
    finally:
        probe.unlink(missing_ok=True)
    return failure


def _start(engine: LocalEngine, gen: LoadGenerator) -> Failure | None:
    """Start the engine, then the load generator; the failure every window gets, or None."""
    try:
        engine.start()
        if isinstance(gen, BenchDriver):
            gen.wait_ready()
    except EngineStartError as exc:
        return exc.failure.kind, exc.failure.detail
    except LoadGeneratorError as exc:
        return "bench_failed", f"{exc}\n{tail(gen.log)}"
    return None


@dataclass(frozen=True)
class _EngineRecord:
    """The engine's record file: argv (secrets redacted), PIDs, attempts, failure, survivors."""

    path: Path
    ec: EngineConfig
    engine: LocalEngine
    gen: LoadGenerator

    def write(self, **extra: Any) -> None:
        """Write the record; a disk that refuses it loses only this artifact (the windows'
        own records say why they failed)."""
        e = self.engine
        try:
            self._write(e, extra)
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise

    def _write(self, e: LocalEngine, extra: Mapping[str, Any]) -> None:
        atomic_write_json(self.path, {
            "engine": self.ec.name, "hash": self.ec.hash, "argv": redact_argv(e.argv(e.port or 0)),
            "base_url": e.base_url if e.port else None, "log": str(e.log_path),
            "attempts": e.attempts, "start_s": e.start_s, "engine_pgid": e.pid,
            "engine_pids": sorted(e.processes()), "load_generator": type(self.gen).__name__,
            "load_generator_pids": self.gen.pids(), **extra})

    def stopped(self, failure: str | None = None) -> None:
        """Stop the load generator and the engine (its whole group), recording survivors."""
        self.gen.close()
        extra = {"failure": failure} if failure else {}
        self.write(**extra, survivors=self.engine.stop())


Again = Callable[[Sequence[Measurement]], Sequence[Window]]
"""What a start measures after its planned windows (see `run_engine`)."""


def run_engine(ec: EngineConfig, backend: LocalBackend | EndpointBackend, windows: Sequence[Window],
               workdir: Path, *, load_generator: LoadGeneratorKind = "driver",
               skip: Collection[str] = (), tokenizer: str | None = None,
               again: Again | None = None) -> Iterator[Measurement]:
    """Start one engine for `ec`, measure every window on it, stop it; yields per window.

    Windows whose WindowKey id is in `skip` (finished earlier) are not run, and an engine with
    nothing left to run is not started. A failed start fails every window with the reason and
    log tail; an engine that dies mid-run is stopped (its whole process group, checked by PID)
    before its failure is yielded, and the windows after it are recorded as `engine_down`.
    `again`: called after every window measured (and consumed by the caller) with this
    start's measurements; the windows it returns are measured on the same engine before it
    stops (windows that outside load slowed, measured once more; a capacity search's next
    rate), and it is called again after them until it returns none new (a window is measured
    once per call of this function).
    """
    if isinstance(backend, EndpointBackend):
        yield from run_endpoint(ec, backend, windows, workdir, load_generator=load_generator,
                                skip=skip, tokenizer=tokenizer, again=again)
        return
    todo = [w for w in windows if w.key(ec).id not in skip]
    if not todo:
        return
    engine_dir = workdir / "engines"
    engine = LocalEngine(ec, backend, engine_dir)
    gen = make_load_generator(load_generator, backend.vllm_command,
                              bench_env(backend.env, api_key=engine.api_key),
                              engine_dir / f"{ec.name}-{ec.hash}.loadgen.log")
    suffix = f"-b{todo[0].start}" if todo[0].start else ""
    record = _EngineRecord(engine_dir / f"{ec.name}-{ec.hash}{suffix}.json", ec, engine, gen)
    try:
        failure = _start(engine, gen)
        if failure is not None and failure[0] == "start_failed":
            failure = _full_disk(engine_dir, failure)
        if failure is not None:
            record.stopped(failure[0])
            artifacts = {"engine_log": engine.log_path, "engine_record": record.path}
            yield from (_failed(ec, w, *failure, artifacts) for w in todo)
            return
        record.write()
        measured: list[Measurement] = []
        for batch in _batches(ec, todo, again, measured):
            for done, (m, down) in enumerate(
                    _windows(engine, gen, ec, batch, workdir, backend.request_timeout_s), 1):
                m = _with_artifacts(m, record.path)
                if down is not None:
                    record.stopped(down.kind)
                    yield m
                    yield from _not_run(ec, batch[done:], f"not run: engine '{ec.name}' "
                                        f"stopped serving at window {m.key.id} ({down.kind})")
                    return
                record.write()
                measured.append(m)
                yield m
    finally:
        release(gen)
        if engine.running:
            record.write(survivors=engine.stop())


def _batches(ec: EngineConfig, todo: Sequence[Window], again: Again | None,
             measured: Sequence[Measurement]) -> Iterator[Sequence[Window]]:
    """The planned windows, then what `again` returns while it returns windows not measured yet
    (read after each batch is consumed: `measured` is the caller's list of this start's
    windows). The engine is warm at every level by then: no warm-up."""
    yield todo
    seen = {w.key(ec).id for w in todo}
    while again is not None:
        batch = [replace(w, warmup_requests=0) for w in again(measured)
                 if w.key(ec).id not in seen]
        if not batch:
            return
        seen.update(w.key(ec).id for w in batch)
        yield batch


def _with_artifacts(m: Measurement, record_path: Path) -> Measurement:
    return replace(m, artifacts={**m.artifacts, "engine_record": str(record_path)})


def run_endpoint(ec: EngineConfig, backend: EndpointBackend, windows: Sequence[Window],
                 workdir: Path, *, load_generator: LoadGeneratorKind = "driver",
                 skip: Collection[str] = (), tokenizer: str | None = None,
                 again: Again | None = None) -> Iterator[Measurement]:
    """Measure a server specflow did not start (no lifecycle); `ec` describes what it serves.

    The API key is read from the environment variable `backend.api_key_env` and reaches the
    load generator only through its environment (OPENAI_API_KEY); it is never written.
    """
    todo = [w for w in windows if w.key(ec).id not in skip]
    if not todo:
        return
    server = Endpoint(backend, tokenizer or tokenizer_of(ec))
    if backend.api_key_env and not server.api_key:
        yield from (_failed(ec, w, "api_key_missing", f"backend.api_key_env names "
                            f"${backend.api_key_env}, which is not set") for w in todo)
        return
    down = server.failure()
    if down is not None:
        yield from (_failed(ec, w, down.kind, down.detail) for w in todo)
        return
    log = workdir / "endpoints" / f"{ec.name}-{ec.hash}.loadgen.log"
    gen = make_load_generator(load_generator, backend.vllm_command,
                              bench_env(api_key=server.api_key), log)
    try:
        if isinstance(gen, BenchDriver):
            try:
                gen.wait_ready()
            except LoadGeneratorError as exc:
                yield from (_failed(ec, w, "bench_failed", f"{exc}\n{tail(log)}") for w in todo)
                return
        measured: list[Measurement] = []
        for batch in _batches(ec, todo, again, measured):
            for done, (m, down) in enumerate(
                    _windows(server, gen, ec, batch, workdir, backend.request_timeout_s), 1):
                yield m
                if down is not None:
                    yield from _not_run(ec, batch[done:], f"not run: the endpoint stopped "
                                        f"serving at window {m.key.id} ({down.kind})")
                    return
                measured.append(m)
    finally:
        release(gen)
