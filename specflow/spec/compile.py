"""Spec -> SweepPlan: one EngineConfig per distinct engine (drafter, N), validated across sections.

Pure: no vLLM, no Prefect, no MLflow, no file I/O. Every cross-section problem is collected and
raised together as a `SpecError`; things that are legal but worth knowing become warnings.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import Field, computed_field

from specflow.spec.errors import Problem, Raw, SpecError, did_you_mean, one_of
from specflow.spec.locations import is_url
from specflow.spec.methods import METHODS, MethodInfo
from specflow.spec.profile import SYNTHETIC_RATES, apply_profile, check_synthetic
from specflow.spec.schema import Checkpoint, DrafterSpec, Spec, TargetSpec
from specflow.spec.serialize import as_json

NGRAM_DEFAULT_LOOKUP = 5
"""vLLM's prompt_lookup_min/max when neither is given."""


@dataclass(frozen=True)
class Catalog:
    """What exists in conf/ beyond the selected entries (for name checks and suggestions)."""

    targets: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineConfig:
    """One engine to start: a drafter at one N (or the baseline) on the target."""

    name: str
    """Readable id, e.g. `eagle3-n3` or `baseline`."""
    drafter: str
    """Name of the drafter entry (`none` for the baseline)."""
    method: str
    """Drafting method (`none` for the baseline)."""
    num_speculative_tokens: int
    """N; 0 for the baseline."""
    speculative_config: dict[str, Any] | None
    """Exactly what goes into --speculative-config (None for the baseline)."""
    serve_argv: tuple[str, ...]
    """`vllm serve` argv, starting with `vllm`; host and port are added by the runner."""
    lookahead_slots: int
    """KV slots each running request reserves for drafting."""
    checkpoint: Annotated[str | None, Field(exclude=True)] = None
    """Drafter weights (hub id or directory), if any (in the JSON through the speculative
    config)."""
    checkpoint_revision: Annotated[str | None, Field(exclude=True)] = None
    """Pinned revision of the drafter weights (likewise)."""

    @property
    def adaptive(self) -> bool:
        """Whether vLLM verifies adaptively (`enable_adaptive_verification`)."""
        return bool((self.speculative_config or {}).get(ADAPTIVE_KEY))

    @property
    def series(self) -> str:
        """The candidate family its measurements belong to: the drafter, or the drafter with
        adaptive verification (another engine per N, deployed on its own)."""
        return f"{self.drafter}+adaptive" if self.adaptive else self.drafter

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hash(self) -> str:
        """Stable content hash of what defines the engine (argv, which embeds the spec config)."""
        blob = json.dumps(list(self.serve_argv), separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def with_schedule(ec: EngineConfig, schedule: Sequence[Sequence[int]]) -> EngineConfig:
    """`ec` serving an N schedule (`num_speculative_tokens_per_batch_size`): the engine a
    schedule is deployed as, and measured as before it is promoted. `ec` runs the schedule's
    largest N (its global num_speculative_tokens)."""
    if ec.speculative_config is None or "--speculative-config" not in ec.serve_argv:
        raise ValueError(f"{ec.name} does not speculate: a schedule needs a drafter")
    ranges = [[int(a), int(b), int(n)] for a, b, n in schedule]
    spec_cfg = {**ec.speculative_config, "num_speculative_tokens_per_batch_size": ranges}
    argv = list(ec.serve_argv)
    i = argv.index("--speculative-config")
    argv[i + 1] = json.dumps(spec_cfg, sort_keys=True, separators=(",", ":"))
    label = "_".join(f"{a}-{b}n{n}" for a, b, n in ranges)
    return replace(ec, name=f"{ec.drafter}-schedule-{label}", speculative_config=spec_cfg,
                   serve_argv=tuple(argv))


@dataclass(frozen=True)
class SweepPlan:
    """Everything a sweep will run, before anything runs."""

    target: str
    hardware: str
    engine_configs: tuple[EngineConfig, ...]
    workloads: tuple[str, ...]
    concurrency: tuple[int, ...]
    repeats: int
    warnings: tuple[str, ...] = field(default=())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def num_windows(self) -> int:
        """Measured windows: engine configs x workloads x concurrency levels x repeats."""
        return len(self.engine_configs) * len(self.workloads) * len(self.concurrency) * self.repeats

    @property
    def hash(self) -> str:
        """Stable content hash of the plan (its JSON without the hash itself)."""
        blob = json.dumps(as_json(self, exclude={"plan_hash"}), sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def plan_hash(self) -> str:
        """`hash`, as the JSON names it."""
        return self.hash


# --------------------------------------------------------------------------------------------
# Cross-section checks of one drafter entry (each returns its problems, in report order)

ADAPTIVE_KEY = "enable_adaptive_verification"

_RESERVED_KEYS = frozenset({
    "method", "model", "revision", "num_speculative_tokens", "prompt_lookup_min",
    "prompt_lookup_max", "draft_tensor_parallel_size", "draft_sample_method",
    "num_speculative_tokens_per_batch_size", ADAPTIVE_KEY})
"""--speculative-config keys specflow sets from a drafter's own fields."""
_FIELD_OF = {ADAPTIVE_KEY: "adaptive_verification"}
"""The drafter field behind a reserved key, where its name differs."""


def _where(name: str) -> tuple[str, str]:
    """Dotted path and conf file of a drafter entry."""
    return f"drafter.{name}", f"conf/drafter/{name}.yaml"


def _check_method(name: str, d: DrafterSpec) -> list[Problem]:
    """needs_checkpoint and drafting must agree with the method table."""
    info = METHODS[d.method]
    at, src = _where(name)
    out = []
    allowed_ckpt = {info.needs_checkpoint} | ({True, False} if info.model_optional else set())
    if d.needs_checkpoint not in allowed_ckpt:
        always = "always" if info.needs_checkpoint else "never"
        out.append(Problem(f"{at}.needs_checkpoint", f"method {d.method} {always} loads draft "
                           "weights", d.needs_checkpoint, str(info.needs_checkpoint).lower(),
                           source=src))
    if d.drafting != info.drafting:
        out.append(Problem(f"{at}.drafting", f"method {d.method} drafts '{info.drafting}'",
                           d.drafting, repr(info.drafting), source=src))
    return out


def _check_catalog(name: str, d: DrafterSpec, catalog: Catalog) -> list[Problem]:
    """Targets and checkpoint keys must name conf/target entries."""
    known = catalog.targets
    if not known:
        return []
    at, src = _where(name)
    out = [Problem(f"{at}.targets[{i}]", "unknown target", t, one_of(known),
                   did_you_mean(t, known), src)
           for i, t in enumerate(d.targets) if t not in known]
    out += [Problem(f"{at}.checkpoints.{t}", "checkpoint for an unknown target", t,
                    one_of(known), did_you_mean(t, known), src)
            for t in d.checkpoints if t not in known]
    return out


def _check_checkpoints(spec: Spec, name: str, d: DrafterSpec) -> list[Problem]:
    """A checkpoint only where the method takes one; made for this target (or its MTP layers)."""
    info = METHODS[d.method]
    target = spec.target
    at, src = _where(name)
    out = []
    if not info.needs_checkpoint and not info.model_optional and d.checkpoints:
        out.append(Problem(f"{at}.checkpoints", f"method {d.method} takes no checkpoint",
                           sorted(d.checkpoints), "an empty mapping", source=src))
    if d.method == "mtp" and not d.needs_checkpoint:
        if target.arch.mtp_depth == 0:
            out.append(Problem(at, f"target '{target.name}' has no native MTP layers "
                               "(target.arch.mtp_depth is 0)", name,
                               "a target with MTP layers: " + one_of(d.targets)
                               if d.targets else "a target with arch.mtp_depth > 0", source=src))
    elif d.targets and target.name not in d.targets:
        out.append(Problem(at, f"drafter '{name}' was not made for target '{target.name}'",
                           target.name, f"a target it was made for: {one_of(d.targets)}",
                           source=src))
    elif d.needs_checkpoint and d.checkpoints.get(target.name) is None \
            and not info.model_optional:
        out.append(Problem(f"{at}.checkpoints.{target.name}",
                           f"method {d.method} needs a checkpoint for this target", None,
                           "a checkpoint {model, revision}", source=src))
    return out


def _check_hardware(spec: Spec, name: str, d: DrafterSpec) -> list[Problem]:
    """The method must run on the CPU engine (on CPU), and the drafter on this vendor."""
    info = METHODS[d.method]
    hw = spec.hardware
    at, src = _where(name)
    if hw.vendor == "cpu" and not info.cpu_engine:
        return [Problem(at, f"method {d.method} cannot run on the CPU engine: {info.cpu_reason}",
                        hw.name, "GPU hardware (e.g. hardware=h200)", source=src)]
    if hw.vendor not in d.vendors:
        return [Problem(at, f"drafter '{name}' is not known to run on {hw.vendor} hardware "
                        f"('{hw.name}')", hw.vendor, f"hardware of a vendor in {d.vendors}",
                        source=src)]
    return []


def _check_ngram(name: str, d: DrafterSpec) -> list[Problem]:
    """ngram lookup bounds, resolved the way vLLM does; other methods leave them unset."""
    at, src = _where(name)
    if d.method != "ngram":
        return [Problem(f"{at}.{key}", "only used by method ngram", getattr(d, key), "null",
                        source=src)
                for key in ("prompt_lookup_min", "prompt_lookup_max")
                if getattr(d, key) is not None]
    lo, hi = _ngram_bounds(d)
    if lo > hi:
        return [Problem(f"{at}.prompt_lookup_min",
                        f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}", lo,
                        f"a value <= {hi}", source=src)]
    return []


def _check_tp(spec: Spec, name: str, d: DrafterSpec) -> list[Problem]:
    """Draft TP is 1 or the target's; draft_model needs the target's (vLLM's V1 runner)."""
    tp, target_tp = d.draft_tensor_parallel_size, spec.target.tensor_parallel_size
    if tp is None:
        return []
    at, src = _where(name)
    out = []
    if tp not in (1, target_tp):
        out.append(Problem(f"{at}.draft_tensor_parallel_size",
                           "must be 1 or the target's tensor_parallel_size", tp,
                           one_of(sorted({1, target_tp})), source=src))
    if d.method == "draft_model" and tp != target_tp:
        out.append(Problem(f"{at}.draft_tensor_parallel_size",
                           "vLLM's V1 runner needs draft TP equal to the target's for "
                           "draft_model", tp, str(target_tp), source=src))
    return out


def _check_vocab(spec: Spec, name: str, d: DrafterSpec) -> list[Problem]:
    """A draft_model drafter must share the target's vocabulary."""
    target = spec.target
    ckpt = d.checkpoints.get(target.name)
    if d.method != "draft_model" or ckpt is None or ckpt.arch is None \
            or ckpt.arch.vocab_size == target.arch.vocab_size:
        return []
    at, src = _where(name)
    return [Problem(f"{at}.checkpoints.{target.name}.arch.vocab_size",
                    "draft vocabulary differs from the target's", ckpt.arch.vocab_size,
                    str(target.arch.vocab_size), source=src)]


def _check_extra_config(name: str, d: DrafterSpec) -> list[Problem]:
    """extra_speculative_config may not set what specflow derives; the schedule follows vLLM."""
    at, src = _where(name)
    out = [Problem(f"{at}.extra_speculative_config.{key}",
                   "set by specflow from the drafter's own fields", d.extra_speculative_config[key],
                   f"the field drafter.{name}.{_FIELD_OF.get(key, key)} (or the checkpoint) "
                   "instead", source=src)
           for key in sorted(_RESERVED_KEYS & set(d.extra_speculative_config))]
    if d.num_speculative_tokens_per_batch_size is not None:
        out += _check_schedule(f"{at}.num_speculative_tokens_per_batch_size",
                               d.num_speculative_tokens_per_batch_size, src)
    return out


def _check_adaptive(spec: Spec, name: str, d: DrafterSpec) -> list[Problem]:
    """Adaptive verification only where vLLM 0.32 has it: a method it names, a GPU engine."""
    if True not in d.adaptive_verification:
        return []
    at, src = _where(name)
    out = []
    if not METHODS[d.method].adaptive_verification:
        supported = [m for m, info in METHODS.items() if info.adaptive_verification]
        out.append(Problem(f"{at}.adaptive_verification", f"vLLM 0.32 verifies adaptively only "
                           f"for method {' or '.join(supported)}, not {d.method}",
                           d.adaptive_verification, f"[false], or a drafter of method "
                           f"{' or '.join(supported)}", source=src))
    if spec.hardware.vendor == "cpu":
        out.append(Problem(f"{at}.adaptive_verification", "the CPU engine never verifies "
                           "adaptively (it runs in vLLM's GPU Model Runner V2; the CPU engine's "
                           "V1 runner would measure fixed N twice)", d.adaptive_verification,
                           "[false] on hardware=cpu; sweep it on a GPU", source=src))
    return out


def _check_drafter(spec: Spec, name: str, d: DrafterSpec, catalog: Catalog) -> list[Problem]:
    """Every problem of one drafter entry against the method table, target and hardware."""
    return [*_check_method(name, d), *_check_catalog(name, d, catalog),
            *_check_checkpoints(spec, name, d), *_check_hardware(spec, name, d),
            *_check_ngram(name, d), *_check_tp(spec, name, d), *_check_vocab(spec, name, d),
            *_check_extra_config(name, d), *_check_adaptive(spec, name, d)]


@dataclass(frozen=True)
class _Lengths:
    """The proposal lengths N to sweep for one drafter, and where they were set."""

    values: Sequence[int]
    path: str
    source: str


def _lengths(spec: Spec, name: str, d: DrafterSpec) -> _Lengths:
    """The sweep's N values for this drafter, else the drafter's own defaults."""
    if name in spec.sweep.num_speculative_tokens:
        return _Lengths(spec.sweep.num_speculative_tokens[name],
                        f"sweep.num_speculative_tokens.{name}", "conf/sweep/")
    return _Lengths(d.num_speculative_tokens, f"drafter.{name}.num_speculative_tokens",
                    f"conf/drafter/{name}.yaml")


def _check_n(spec: Spec, name: str, d: DrafterSpec, ns: _Lengths
             ) -> tuple[list[Problem], list[str]]:
    """N values against the MTP depth and a parallel drafter's block size: problems, warnings."""
    target = spec.target
    if METHODS[d.method].vllm_method is None:
        return [], []
    problems: list[Problem] = []
    warnings: list[str] = []
    if not ns.values:
        problems.append(Problem(ns.path, f"no num_speculative_tokens values for drafter '{name}'",
                                [], "a non-empty list of N >= 1", source=ns.source))
    depth = _mtp_depth(d, target, d.checkpoints.get(target.name))
    for i, n in enumerate(ns.values):
        if depth and n > depth and n % depth:
            problems.append(Problem(
                f"{ns.path}[{i}]",
                f"num_speculative_tokens:{n} must be divisible by n_predict={depth} "
                f"(the MTP depth of '{target.name}')", n,
                f"N <= {depth} or a multiple of {depth}", source=ns.source))
        elif depth and n > depth:
            warnings.append(f"{name} N={n} reuses the {depth} MTP layer(s) of "
                            f"'{target.name}' (vLLM warns: lower acceptance expected)")
        if d.drafting == "parallel" and d.depth is not None and n > d.depth:
            problems.append(Problem(f"{ns.path}[{i}]", f"exceeds the block size of drafter "
                                    f"'{name}'", n, f"N <= {d.depth}", source=ns.source))
    sched = d.num_speculative_tokens_per_batch_size
    if sched and ns.values and max(k for _, _, k in sched) > max(ns.values):
        warnings.append(f"{name}: schedule values above N={max(ns.values)} are clamped by vLLM")
    return problems, warnings


def _check_schedule(path: str, sched: Sequence[tuple[int, int, int]], src: str) -> list[Problem]:
    """vLLM's rules for num_speculative_tokens_per_batch_size (ends inclusive)."""
    out: list[Problem] = []
    if not sched:
        return [Problem(path, "empty schedule", [], "null or a non-empty list of [start, end, N]",
                        source=src)]
    prev_end = 0
    for i, (start, end, k) in enumerate(sorted(sched)):
        if start > end:
            out.append(Problem(f"{path}[{i}]", "range start must be <= end", [start, end, k],
                               "[start <= end, N]", source=src))
        if k < 0:
            out.append(Problem(f"{path}[{i}]", "N must be >= 0", k, "N >= 0", source=src))
        if start <= prev_end:
            out.append(Problem(f"{path}[{i}]", "batch-size ranges overlap", [start, end, k],
                               f"a start > {prev_end}", source=src))
        prev_end = max(prev_end, end)
    first = min(s for s, _, _ in sched)
    if first != 1:
        out.append(Problem(path, "the first batch-size range must start at 1", first, "1",
                           source=src))
    return out


def _mtp_depth(d: DrafterSpec, target: TargetSpec, ckpt: Checkpoint | None) -> int:
    if d.method != "mtp":
        return 0
    if ckpt is not None:
        return ckpt.arch.mtp_depth if ckpt.arch is not None else 0
    return target.arch.mtp_depth


def _ngram_bounds(d: DrafterSpec) -> tuple[int, int]:
    """prompt_lookup_min/max as vLLM resolves them: one given sets both; neither, the default."""
    lo = d.prompt_lookup_min if d.prompt_lookup_min is not None else d.prompt_lookup_max
    hi = d.prompt_lookup_max if d.prompt_lookup_max is not None else d.prompt_lookup_min
    if lo is None or hi is None:  # neither given
        return NGRAM_DEFAULT_LOOKUP, NGRAM_DEFAULT_LOOKUP
    return lo, hi


# --------------------------------------------------------------------------------------------
# Building engine configs


def speculative_config(info: MethodInfo, d: DrafterSpec, ckpt: Checkpoint | None, n: int
                       ) -> dict[str, Any] | None:
    """The --speculative-config dict vLLM 0.32 accepts (only keys it knows)."""
    if info.vllm_method is None:
        return None
    cfg: dict[str, Any] = {"method": info.vllm_method, "num_speculative_tokens": n}
    if ckpt is not None:
        cfg["model"] = ckpt.model
        if ckpt.revision:
            cfg["revision"] = ckpt.revision
    if d.method == "ngram":
        cfg["prompt_lookup_min"], cfg["prompt_lookup_max"] = _ngram_bounds(d)
    if d.draft_tensor_parallel_size is not None:
        cfg["draft_tensor_parallel_size"] = d.draft_tensor_parallel_size
    if d.draft_sample_method is not None:
        cfg["draft_sample_method"] = d.draft_sample_method
    if d.num_speculative_tokens_per_batch_size is not None:
        cfg["num_speculative_tokens_per_batch_size"] = [
            list(r) for r in sorted(d.num_speculative_tokens_per_batch_size)]
    cfg.update(d.extra_speculative_config)
    if isinstance(cfg.get(SYNTHETIC_RATES), list):
        cfg[SYNTHETIC_RATES] = cfg[SYNTHETIC_RATES][:n]  # vLLM wants exactly N rates
    return cfg


def serve_argv(spec: Spec, spec_cfg: dict[str, Any] | None) -> tuple[str, ...]:
    """Full `vllm serve` argv (without host/port, which the runner chooses)."""
    t = spec.target
    engine = spec.backend.engine
    argv = ["vllm", "serve", t.model, "--served-model-name", t.name]
    if t.revision:
        argv += ["--revision", t.revision]
    if t.tokenizer:
        argv += ["--tokenizer", t.tokenizer]
    argv += ["--dtype", t.dtype]
    if t.quantization:
        argv += ["--quantization", t.quantization]
    if t.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", t.kv_cache_dtype]
    argv += ["--tensor-parallel-size", str(t.tensor_parallel_size),
             "--max-model-len", str(t.max_model_len)]
    if t.trust_remote_code:
        argv.append("--trust-remote-code")
    if engine.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(engine.kv_cache_memory_bytes)]
    else:
        argv += ["--gpu-memory-utilization", f"{engine.gpu_memory_utilization:g}"]
    if engine.enforce_eager:
        argv.append("--enforce-eager")
    if engine.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.distributed_executor_backend is not None:
        argv += ["--distributed-executor-backend", engine.distributed_executor_backend]
    argv += list(engine.extra_args)
    if spec_cfg is not None:
        argv += ["--speculative-config",
                 json.dumps(spec_cfg, sort_keys=True, separators=(",", ":"))]
    return tuple(argv)


# --------------------------------------------------------------------------------------------
# The plan: plan-level checks, engine configs per drafter, duplicate and size checks


def _check_target(spec: Spec) -> list[Problem]:
    """The target needs no more ranks than the hardware has devices, and a single-process
    executor serves one rank only."""
    t, devices = spec.target, spec.hardware.device_count
    out = []
    if t.tensor_parallel_size > devices:
        out.append(Problem("target.tensor_parallel_size", "more ranks than devices",
                           t.tensor_parallel_size, f"<= hardware.device_count ({devices})",
                           source=f"conf/target/{t.name}.yaml"))
    if spec.backend.engine.distributed_executor_backend == "uni" and t.tensor_parallel_size > 1:
        out.append(Problem("backend.engine.distributed_executor_backend",
                           f"the single-process executor serves one rank; the target has "
                           f"tensor_parallel_size={t.tensor_parallel_size}", "uni",
                           "mp, ray or null (vLLM's choice)"))
    return out


def _target_warnings(t: TargetSpec) -> list[str]:
    """Legal but worth knowing: an unpinned hub revision, remote code."""
    out = []
    if t.hub and not t.revision:
        out.append(f"target '{t.name}' has no pinned revision: results are recorded against "
                   "whatever the hub serves")
    if t.trust_remote_code:
        out.append(f"target '{t.name}' runs its own code (trust_remote_code: true)")
    return out


def _check_sweep_drafters(spec: Spec, catalog: Catalog) -> list[Problem]:
    """sweep.num_speculative_tokens keys must name speculative drafters."""
    out = []
    for key in spec.sweep.num_speculative_tokens:
        path = f"sweep.num_speculative_tokens.{key}"
        if catalog.drafters and key not in catalog.drafters:
            out.append(Problem(path, "unknown drafter", key, one_of(catalog.drafters),
                               did_you_mean(key, catalog.drafters)))
        elif key in spec.drafter and spec.drafter[key].method == "none":
            out.append(Problem(path, "the baseline has no proposal length", key,
                               "a speculative drafter"))
    return out


def _check_bands(spec: Spec) -> list[Problem]:
    """Each concurrency band is [low <= high] and holds a measured level."""
    levels = sorted(set(spec.sweep.concurrency))
    out = []
    for i, (lo, hi) in enumerate(spec.promote.concurrency_bands):
        if lo > hi:
            out.append(Problem(f"promote.concurrency_bands[{i}]", "low end above high end",
                               [lo, hi], "[low <= high]"))
        elif not any(lo <= c <= hi for c in levels):
            out.append(Problem(f"promote.concurrency_bands[{i}]",
                               "no measured concurrency level falls in this band", [lo, hi],
                               f"a band containing one of sweep.concurrency {levels}"))
    return out


def _check_endpoint(spec: Spec) -> list[Problem]:
    """An endpoint backend measures one running server: at most one speculative drafter."""
    speculative = [n for n, d in spec.drafter.items() if d.method != "none"]
    if spec.backend.kind != "endpoint" or len(speculative) <= 1:
        return []
    return [Problem("drafter", "an endpoint serves one engine config; select at most one "
                    "speculative drafter", speculative, "one drafter")]


@dataclass(frozen=True)
class _Secret:
    """A `vllm serve` option whose value is a secret: never in argv, plans or artifacts."""

    shortest: str
    """Shortest abbreviation argparse accepts for it (vLLM's parser allows abbreviations)."""
    instead: str
    """Where the secret goes instead."""
    bare_ok: bool = False
    """Whether the option alone, without a value, is harmless."""


SECRET_OPTIONS = {
    "--api-key": _Secret("--api-k", "set the key in the environment variable named by "
                         "backend.api_key_env"),
    "--hf-token": _Secret("--hf-t", "HF_TOKEN in the environment specflow runs in (the engine "
                          "inherits it), or --hf-token without a value", bare_ok=True),
}
"""Secret `vllm serve` options, refused in backend.engine.extra_args."""

def _relative_path(value: str) -> bool:
    return "://" not in value and not value.startswith(("/", "~"))


STORE_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
                  "abfs": "adlfs", "abfss": "adlfs"}
"""The package an object-store URL's scheme needs (fsspec's own backends need none)."""


def store_settings(spec: Spec) -> list[tuple[str, str]]:
    """The settings that may name a store, with their locations: `tracking.workdir`, and
    `promote.output_dir` where it is not under the workdir."""
    workdir, out = spec.tracking.workdir, spec.promote.output_dir
    found = [("tracking.workdir", workdir)]
    if not out.startswith(workdir.rstrip("/") + "/"):
        found.append(("promote.output_dir", out))
    return found


def _check_store(spec: Spec) -> list[Problem]:
    """Each location given as a URL (`store_settings`): a scheme fsspec knows, its package
    installed, a bucket named, no credentials written into it."""
    return [p for field, url in store_settings(spec) for p in _check_url(field, url)]


def _check_url(field: str, url: str) -> list[Problem]:
    if not is_url(url):
        return []
    import importlib.util

    import fsspec

    scheme, rest = url.split("://", 1)
    known = sorted(fsspec.available_protocols())
    out = []
    if scheme not in known:
        out.append(Problem(field, f"{scheme!r} is not a filesystem fsspec knows",
                           url, "a local path, or a URL such as s3://bucket/prefix, "
                           "gs://bucket/prefix", did_you_mean(scheme, known)))
    elif (pkg := STORE_PACKAGES.get(scheme)) and importlib.util.find_spec(pkg) is None:
        out.append(Problem(field, f"{scheme}:// needs the package {pkg}, which is "
                           "not installed", url, f"pip install {pkg}"))
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:
        out.append(Problem(field, "credentials written into the URL", Raw(
            f"{scheme}://***@{netloc.rsplit('@', 1)[1]}/..."), "the backend's environment "
            "variables (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"))
    elif not netloc and scheme not in {"memory"}:
        out.append(Problem(field, "no bucket named", url, f"{scheme}://BUCKET/PREFIX"))
    return out


def _check_dispatch(spec: Spec) -> list[Problem]:
    """Fanned out to a work pool, every path a worker writes or reads must mean the same place
    on every worker: absolute (on a filesystem they all mount) or a tracking server."""
    if spec.dispatch.deployment is None:
        return []
    shared = "an absolute path on a filesystem every worker mounts"
    out = []
    if spec.sweep.soak is not None:
        out.append(Problem("sweep.soak", "a soak runs in the sweep flow's own process, and the "
                           "flow that fans out to a work pool holds no device", "set",
                           "null with dispatch.deployment (soak in a sweep run without it)"))
    if spec.backend.kind == "endpoint":
        out.append(Problem("dispatch.deployment", "an endpoint backend measures one running "
                           "server, there is nothing to fan out", spec.dispatch.deployment,
                           "null with backend=endpoint"))
    if _relative_path(spec.tracking.workdir):
        out.append(Problem("tracking.workdir", "a relative path: each worker would keep its own "
                           "ledger in its own working directory", spec.tracking.workdir, shared))
    if _relative_path(spec.paths.models):
        out.append(Problem("paths.models", "a relative path: each worker would resolve it in its "
                           "own working directory", spec.paths.models, shared))
    uri = spec.tracking.uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////") or (
            "://" not in uri and _relative_path(uri)):
        out.append(Problem("tracking.uri", "a relative store: each worker would log to its own",
                           uri, "a tracking server (http://HOST:PORT) every worker reaches"))
    return out


def secret_option(word: str) -> str | None:
    """The secret option an argv word names: in full, with underscores or abbreviated."""
    if not word.startswith("--"):
        return None
    name = word.split("=", 1)[0].replace("_", "-")
    return next((opt for opt, s in SECRET_OPTIONS.items()
                 if opt.startswith(name) and len(name) >= len(s.shortest)), None)


def _check_secrets(spec: Spec) -> list[Problem]:
    """No secret in backend.engine.extra_args: it would reach argv, MLflow, champions and `ps`."""
    args = spec.backend.engine.extra_args
    out = []
    for i, word in enumerate(args):
        opt = secret_option(word)
        if opt is None:
            continue
        valued = "=" in word or (i + 1 < len(args) and not args[i + 1].startswith("-"))
        if SECRET_OPTIONS[opt].bare_ok and not valued:
            continue
        shown = word.split("=", 1)[0] + "=***" if "=" in word else \
            f"{word} ***" if valued else word
        out.append(Problem(f"backend.engine.extra_args[{i}]", f"{opt} on the command line "
                           "would put a secret into the plan, MLflow, champion files and the "
                           "process list", Raw(shown), SECRET_OPTIONS[opt].instead))
    return out


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def _check_host(spec: Spec) -> tuple[list[Problem], list[str]]:
    """A local engine off loopback needs allow_remote and an API key; then it is a warning."""
    b = spec.backend
    if b.kind != "local" or _loopback(b.host):
        return [], []
    missing = [need for need, ok in (("backend.allow_remote=true", b.allow_remote),
                                     ("backend.api_key_env", b.api_key_env)) if not ok]
    if missing:
        return [Problem("backend.host", "a non-loopback address makes the engine reachable "
                        "from other machines", b.host, "a loopback address (127.0.0.1, ::1, "
                        f"localhost), or {' and '.join(missing)}")], []
    return [], [f"backend.host={b.host}: the engine is reachable from other machines; requests "
                f"need the key in ${b.api_key_env}, which vLLM checks only under /v1, /v2 and "
                "/inference"]


def _drafters(spec: Spec) -> dict[str, DrafterSpec]:
    """The selected drafters, led by the baseline when the sweep includes one none selected."""
    drafters = dict(spec.drafter)
    if spec.sweep.include_baseline and not any(d.method == "none" for d in drafters.values()):
        baseline = DrafterSpec(method="none", needs_checkpoint=False, drafting="none",
                               vendors=[spec.hardware.vendor])
        return {"none": baseline, **drafters}
    return drafters


def _engine_configs(spec: Spec, name: str, d: DrafterSpec, ns: Sequence[int]
                    ) -> list[EngineConfig]:
    """One engine config per distinct N (one for the baseline)."""
    info = METHODS[d.method]
    ckpt = d.checkpoints.get(spec.target.name)
    out = []
    modes = sorted(set(d.adaptive_verification))  # fixed N first
    for n, adaptive in ([(0, False)] if info.vllm_method is None
                        else [(n, a) for n in sorted(set(ns)) for a in modes]):
        sc = speculative_config(info, d, ckpt, n)
        if adaptive and sc is not None:
            sc[ADAPTIVE_KEY] = True
        out.append(EngineConfig(
            name="baseline" if info.vllm_method is None
            else f"{name}-n{n}" + ("-adaptive" if adaptive else ""),
            drafter=name, method=d.method, num_speculative_tokens=n,
            speculative_config=sc, serve_argv=serve_argv(spec, sc),
            lookahead_slots=info.lookahead_slots(n),
            checkpoint=ckpt.model if ckpt else None,
            checkpoint_revision=ckpt.revision if ckpt else None))
    return out


def _revision_warning(spec: Spec, name: str, d: DrafterSpec) -> str | None:
    """A hub drafter checkpoint without a pinned revision."""
    ckpt = d.checkpoints.get(spec.target.name)
    if ckpt is None or ckpt.revision or not spec.target.hub:
        return None
    return f"drafter '{name}' checkpoint {ckpt.model} has no pinned revision"


def _check_configs(spec: Spec, configs: Sequence[EngineConfig]) -> list[Problem]:
    """No two engine configs alike, and no more of them than sweep.max_engine_configs."""
    out = []
    seen: dict[str, str] = {}
    for ec in configs:
        if ec.hash in seen:
            out.append(Problem("drafter", f"engine configs '{seen[ec.hash]}' and '{ec.name}' "
                               "are identical", ec.name, "distinct drafters"))
        seen[ec.hash] = ec.name
    soak = spec.sweep.soak
    names = [ec.name for ec in configs]
    if soak is not None and soak.engine is not None and soak.engine not in names:
        out.append(Problem("sweep.soak.engine", "not an engine config of the plan", soak.engine,
                           one_of(names), did_you_mean(soak.engine, names)))
    if soak is not None and soak.workload is not None and soak.workload not in spec.workload:
        out.append(Problem("sweep.soak.workload", "not a workload of the sweep", soak.workload,
                           one_of(list(spec.workload))))
    if soak is not None and soak.concurrency is not None and \
            soak.concurrency not in spec.sweep.concurrency:
        out.append(Problem("sweep.soak.concurrency", "not a concurrency level of the sweep",
                           soak.concurrency, one_of([str(c) for c in spec.sweep.concurrency])))
    limit = spec.sweep.max_engine_configs
    if len(configs) > limit:
        out.append(Problem("sweep.max_engine_configs", f"the plan has {len(configs)} engine "
                           "configs (one engine start each)", limit,
                           f">= {len(configs)}, or fewer drafters / N values"))
    return out


def compile_plan(spec: Spec, catalog: Catalog = Catalog()) -> SweepPlan:
    """Validate across sections and build the sweep plan; raises SpecError with every problem."""
    host_problems, host_warnings = _check_host(spec)
    problems = [*_check_target(spec), *_check_sweep_drafters(spec, catalog),
                *_check_bands(spec), *_check_endpoint(spec),
                *_check_secrets(spec), *_check_dispatch(spec), *_check_store(spec),
                *host_problems]
    warnings = [*_target_warnings(spec.target), *host_warnings]
    configs: list[EngineConfig] = []
    for name, given in _drafters(spec).items():
        d, from_profile = apply_profile(name, given)
        problems += from_profile
        ns = _lengths(spec, name, d)
        found = _check_drafter(spec, name, d, catalog)
        n_problems, n_warnings = _check_n(spec, name, d, ns)
        if METHODS[d.method].vllm_method is not None:
            n_problems += check_synthetic(spec, name, d, ns.values)
        problems += [*found, *n_problems]
        warnings += n_warnings
        if found or n_problems:
            continue
        configs += _engine_configs(spec, name, d, ns.values)
        revision = _revision_warning(spec, name, d)
        if revision is not None and revision not in warnings:
            warnings.append(revision)
    problems += _check_configs(spec, configs)
    if problems:
        raise SpecError(problems)
    return SweepPlan(
        target=spec.target.name, hardware=spec.hardware.name, engine_configs=tuple(configs),
        workloads=tuple(spec.workload), concurrency=tuple(sorted(set(spec.sweep.concurrency))),
        repeats=spec.sweep.repeats, warnings=tuple(warnings))
