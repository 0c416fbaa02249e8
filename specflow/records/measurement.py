"""Frozen measurement records: what one measured window produced, as vLLM reported it.

The runner creates them, tracking logs them, analysis reads them. Pure data; `MEASUREMENT`
validates one read back from JSON and serialises it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from pydantic import AliasChoices, ConfigDict, Field, TypeAdapter, with_config

from specflow.spec.schema import CAPACITY_POINT, Objective

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
"""vLLM bench's latency families (milliseconds)."""
LATENCY_STATS = ("mean", "median", "p50", "p90", "p99")
"""Statistics kept per family; keys are vLLM's, e.g. `p99_tpot_ms`, `mean_ttft_ms`."""


AGAIN = 1000
"""Added to a slowed window's repeat to number the window measured again in its place."""
STEP = 10_000
"""A capacity search's step k (k >= 1) is numbered repeat + k x STEP: the search is its
planned window's repeat, each later rate it offers a window of its own
(`specflow.decision.capacity`)."""

_RECORD = ConfigDict(extra="forbid")
"""A record read back has exactly its fields (a stray key makes it unreadable, not ignored)."""


@with_config(_RECORD)
@dataclass(frozen=True)
class WindowKey:
    """Identifies one measured window of a sweep."""

    engine_hash: str
    """EngineConfig.hash (what the engine was started with)."""
    workload: str
    """Workload name."""
    concurrency: int
    """Max in-flight requests."""
    repeat: int
    """Repeat index within the engine start, from 0; a window measured again on the same start
    in place of one that outside load slowed is numbered `AGAIN` + the slowed one's; a capacity
    search's later steps `STEP` x k + the search's."""
    start: Annotated[int, Field(validation_alias=AliasChoices("start", "block"))] = 0
    """Which engine start of this config (0 = its first); the replicate unit. Read from
    `block` too, the key's name in older ledgers."""

    @property
    def id(self) -> str:
        """The window's identity in the ledger and MLflow (`/b<n>` marks a later start)."""
        suffix = f"/b{self.start}" if self.start else ""
        return f"{self.engine_hash}{suffix}/{self.workload}/c{self.concurrency}/r{self.repeat}"

    @property
    def planned(self) -> WindowKey:
        """The planned window this one belongs to: itself, or the first window of the capacity
        search it is a later step of."""
        return self if self.repeat < STEP else replace(self, repeat=self.repeat % STEP)

    @property
    def step(self) -> int:
        """Which step of its capacity search the window is (0: the planned window)."""
        return self.repeat // STEP


@with_config(_RECORD)
@dataclass(frozen=True)
class RequestStats:
    """One request of a window (the window keeps them in dataset order): its lengths and
    latency from `vllm bench serve`, and for a speculative engine its own acceptance from the
    response (`--per-request-spec-decode-metrics`; None where the load generator could not
    read it)."""

    prompt_tokens: int
    output_tokens: int
    latency_s: float
    ttft_s: float
    spec_steps: int | None = None
    """Verify steps of this request (its drafts)."""
    accepted: int | None = None
    """Draft tokens accepted over its steps."""
    drafted: int | None = None
    """Draft tokens proposed over its steps."""

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verify step: 1 + accepted / steps."""
        return 1.0 + self.accepted / self.spec_steps if self.spec_steps and \
            self.accepted is not None else None

    @property
    def s_per_token(self) -> float | None:
        """Request latency per output token (end to end). Not TPOT from the streamed chunks'
        times: the CPU engine delivers some streams in one burst, which makes that near 0."""
        return self.latency_s / self.output_tokens if self.output_tokens and \
            self.latency_s > 0 else None


@with_config(_RECORD)
@dataclass(frozen=True)
class Measurement:
    """One measured window (engine config x workload x concurrency x repeat)."""

    key: WindowKey
    engine: str
    """EngineConfig.name, e.g. `eagle3-n3` or `baseline`."""
    drafter: str
    """The candidate series: the drafter entry name (`none` for the baseline), with
    `+adaptive` for its adaptive-verification engines (EngineConfig.series)."""
    method: str
    """Drafting method (`none` for the baseline)."""
    num_speculative_tokens: int
    """N (0 for the baseline)."""
    traffic_class: str
    """The workload's traffic class."""
    status: Literal["ok", "failed"] = "ok"
    """`failed` when the window produced no usable result (see `failure`)."""
    failure: str | None = None
    """Why it failed: one of start_failed, oom, crashed, hang, timeout, bench_failed, ..."""
    failure_detail: str = ""
    """Human-readable detail (e.g. the server log tail)."""
    completed: int = 0
    """Requests that finished."""
    failed: int = 0
    """Requests that errored."""
    duration_s: float = 0.0
    """Measured window length."""
    output_throughput: float = 0.0
    """Output tokens per second over the window."""
    request_throughput: float = 0.0
    """Requests per second over the window."""
    total_token_throughput: float = 0.0
    """Input + output tokens per second."""
    latency_ms: dict[str, float] = field(default_factory=dict)
    """vLLM's latency statistics, keyed as in its result JSON (`p99_tpot_ms`, ...)."""
    acceptance_rate: float | None = None
    """accepted / draft tokens, as a fraction (None without speculation)."""
    mean_acceptance_length: float | None = None
    """1 + accepted / drafts."""
    per_position_acceptance: tuple[float, ...] = ()
    """accepted_at_position_i / drafts, i = 0..N-1 (non-increasing)."""
    num_drafts: int | None = None
    """Drafting steps in the window (counter delta)."""
    draft_tokens: int | None = None
    """Proposed tokens in the window (counter delta)."""
    accepted_tokens: int | None = None
    """Accepted tokens in the window (counter delta)."""
    output_digests: tuple[str, ...] = ()
    """Per-request sha256 of the generated text, in dataset order (quality gate)."""
    prompt_hash: str = ""
    """Content hash of the exact prompts sent."""
    total_output_tokens: int = 0
    """Output tokens generated in the window."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Files the window left, by name (bench result JSON, bench and engine logs, counters)."""
    seq: int = -1
    """Position of this window's engine start in the sweep's run order (-1: not recorded;
    analysis then assumes baseline first, candidates, closing baseline last)."""
    stage: Literal["explore", "confirm", "schedule"] = "explore"
    """Racing stage of the engine start: selection data, fresh confirmation data, or the
    measurement of an emitted N schedule around its thresholds."""
    round: int = 0
    """Racing round the engine start belonged to."""
    engine_s: float = 0.0
    """Seconds from the engine's launch to the end of this window (engine time spent)."""
    requests: tuple[RequestStats, ...] = ()
    """Each request of the window, in dataset order (empty when the load generator did not
    report them)."""
    sampling: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    """The sampling settings the window's requests carried, read from the load generator's
    arguments (`specflow.engine.runner.sampling_of`): temperature, seed, max tokens, ignore-EOS,
    the chat template, the prompts' order and stop strings. None: not sent, so vLLM's default
    applied. Empty in ledgers written before it was recorded."""
    request_rate: float | None = None
    """Open loop: the requests offered per second (None: closed loop at `key.concurrency`)."""
    backlog_growth: float | None = None
    """Open loop: how fast the requests in the system grew over the window, as a fraction of
    the offered rate (`specflow.stats.queueing`)."""
    overload: bool = False
    """Open loop: the backlog kept growing (the server did not keep up with the offered rate);
    reported, never scored."""
    search_rates: tuple[float, ...] = ()
    """A capacity search summarised for the decision (`specflow.decision.capacity.searches`;
    never recorded): the rates its windows offered, in order; `request_rate` is then the
    capacity it found. Empty for a measured window, as every ledger record has it."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def searched(self) -> bool:
        """A window of a capacity search (its point is `<workload>@capacity`)."""
        return self.key.workload.endswith(CAPACITY_POINT)

    @property
    def answers(self) -> Objective:
        """What the window answers: capacity (a search's), latency (offered a rate, open
        loop) or throughput (closed loop)."""
        return "capacity" if self.searched else \
            "latency" if self.request_rate is not None else "throughput"


MEASUREMENT = TypeAdapter(Measurement)
"""Validates a measurement read back from JSON (a ledger window, a tracked record) and
serialises one: `MEASUREMENT.dump_python(m, mode="json")`."""
