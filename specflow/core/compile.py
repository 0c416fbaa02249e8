"""Spec -> SweepPlan: one EngineConfig per distinct engine (drafter, N), validated across sections.

Pure: no vLLM, no Prefect, no MLflow, no file I/O. Every cross-section problem is collected and
raised together as a `SpecError`; things that are legal but worth knowing become warnings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specflow.core.errors import Problem, SpecError, did_you_mean, one_of
from specflow.core.methods import METHODS, MethodInfo
from specflow.core.schema import Checkpoint, DrafterSpec, Spec, TargetSpec

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
    checkpoint: str | None = None
    """Drafter weights (hub id or directory), if any."""
    checkpoint_revision: str | None = None
    """Pinned revision of the drafter weights."""

    @property
    def hash(self) -> str:
        """Stable content hash of what defines the engine (argv, which embeds the spec config)."""
        blob = json.dumps(list(self.serve_argv), separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hash": self.hash,
            "drafter": self.drafter,
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "lookahead_slots": self.lookahead_slots,
            "speculative_config": self.speculative_config,
            "serve_argv": list(self.serve_argv),
        }


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

    @property
    def num_points(self) -> int:
        """Measured windows: engine configs x workloads x concurrency levels x repeats."""
        return len(self.engine_configs) * len(self.workloads) * len(self.concurrency) * self.repeats

    @property
    def hash(self) -> str:
        blob = json.dumps(self.to_json(include_hash=False), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self, include_hash: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "hardware": self.hardware,
            "workloads": list(self.workloads),
            "concurrency": list(self.concurrency),
            "repeats": self.repeats,
            "num_points": self.num_points,
            "engine_configs": [e.to_json() for e in self.engine_configs],
            "warnings": list(self.warnings),
        }
        if include_hash:
            out["plan_hash"] = self.hash
        return out


# --------------------------------------------------------------------------------------------
# Cross-section checks


def _check_drafter(spec: Spec, name: str, d: DrafterSpec, catalog: Catalog,
                   problems: list[Problem], warnings: list[str]) -> None:
    info = METHODS[d.method]
    target = spec.target
    at = f"drafter.{name}"
    src = f"conf/drafter/{name}.yaml"

    allowed_ckpt = {info.needs_checkpoint} | ({True, False} if info.model_optional else set())
    if d.needs_checkpoint not in allowed_ckpt:
        problems.append(Problem(f"{at}.needs_checkpoint",
                                f"method {d.method} {'always' if info.needs_checkpoint else 'never'}"
                                " loads draft weights", d.needs_checkpoint,
                                str(info.needs_checkpoint).lower(), source=src))
    if d.drafting != info.drafting:
        problems.append(Problem(f"{at}.drafting", f"method {d.method} drafts '{info.drafting}'",
                                d.drafting, repr(info.drafting), source=src))
    if catalog.targets:
        for i, t in enumerate(d.targets):
            if t not in catalog.targets:
                problems.append(Problem(f"{at}.targets[{i}]", "unknown target", t,
                                        one_of(catalog.targets), did_you_mean(t, catalog.targets),
                                        src))
        for t in d.checkpoints:
            if t not in catalog.targets:
                problems.append(Problem(f"{at}.checkpoints.{t}", "checkpoint for an unknown target",
                                        t, one_of(catalog.targets),
                                        did_you_mean(t, catalog.targets), src))
    if not info.needs_checkpoint and not info.model_optional and d.checkpoints:
        problems.append(Problem(f"{at}.checkpoints", f"method {d.method} takes no checkpoint",
                                sorted(d.checkpoints), "an empty mapping", source=src))

    ckpt = d.checkpoints.get(target.name)
    if d.method == "mtp" and not d.needs_checkpoint:
        if target.arch.mtp_depth == 0:
            problems.append(Problem(at, f"target '{target.name}' has no native MTP layers "
                                    "(target.arch.mtp_depth is 0)", name,
                                    "a target with MTP layers: " + one_of(d.targets)
                                    if d.targets else "a target with arch.mtp_depth > 0",
                                    source=src))
    elif d.targets and target.name not in d.targets:
        problems.append(Problem(at, f"drafter '{name}' was not made for target '{target.name}'",
                                target.name, f"a target it was made for: {one_of(d.targets)}",
                                source=src))
    elif d.needs_checkpoint and ckpt is None and not info.model_optional:
        problems.append(Problem(f"{at}.checkpoints.{target.name}",
                                f"method {d.method} needs a checkpoint for this target",
                                None, "a checkpoint {model, revision}", source=src))

    if spec.hardware.vendor == "cpu" and not info.cpu_engine:
        problems.append(Problem(at, f"method {d.method} cannot run on the CPU engine: "
                                f"{info.cpu_reason}", spec.hardware.name,
                                "GPU hardware (e.g. hardware=h200)", source=src))
    elif spec.hardware.vendor not in d.vendors:
        problems.append(Problem(at, f"drafter '{name}' is not known to run on "
                                f"{spec.hardware.vendor} hardware ('{spec.hardware.name}')",
                                spec.hardware.vendor, f"hardware of a vendor in {d.vendors}",
                                source=src))

    # ngram lookup bounds, resolved the way vLLM does
    if d.method != "ngram":
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(d, key) is not None:
                problems.append(Problem(f"{at}.{key}", "only used by method ngram",
                                        getattr(d, key), "null", source=src))
    else:
        lo, hi = _ngram_bounds(d)
        if lo > hi:
            problems.append(Problem(f"{at}.prompt_lookup_min",
                                    f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}", lo,
                                    f"a value <= {hi}", source=src))

    tp = d.draft_tensor_parallel_size
    if tp is not None and tp not in (1, target.tensor_parallel_size):
        problems.append(Problem(f"{at}.draft_tensor_parallel_size",
                                "must be 1 or the target's tensor_parallel_size", tp,
                                one_of(sorted({1, target.tensor_parallel_size})), source=src))
    if (d.method == "draft_model" and tp is not None and tp != target.tensor_parallel_size):
        problems.append(Problem(f"{at}.draft_tensor_parallel_size",
                                "vLLM's V1 runner needs draft TP equal to the target's for "
                                "draft_model", tp, str(target.tensor_parallel_size), source=src))
    if d.method == "draft_model" and ckpt is not None and ckpt.arch is not None \
            and ckpt.arch.vocab_size != target.arch.vocab_size:
        problems.append(Problem(f"{at}.checkpoints.{target.name}.arch.vocab_size",
                                "draft vocabulary differs from the target's", ckpt.arch.vocab_size,
                                str(target.arch.vocab_size), source=src))
    reserved = {"method", "model", "revision", "num_speculative_tokens", "prompt_lookup_min",
                "prompt_lookup_max", "draft_tensor_parallel_size", "draft_sample_method",
                "num_speculative_tokens_per_batch_size"}
    for key in sorted(reserved & set(d.extra_speculative_config)):
        problems.append(Problem(f"{at}.extra_speculative_config.{key}",
                                "set by specflow from the drafter's own fields",
                                d.extra_speculative_config[key],
                                f"the field drafter.{name}.{key} (or the checkpoint) instead",
                                source=src))
    if d.num_speculative_tokens_per_batch_size is not None:
        problems.extend(_check_schedule(f"{at}.num_speculative_tokens_per_batch_size",
                                        d.num_speculative_tokens_per_batch_size, src))


def _check_n(spec: Spec, name: str, d: DrafterSpec, ns: Sequence[int], n_path: str, n_src: str,
             problems: list[Problem], warnings: list[str]) -> None:
    info = METHODS[d.method]
    target = spec.target
    ckpt = d.checkpoints.get(target.name)
    if info.vllm_method is None:
        return
    if not ns:
        problems.append(Problem(n_path, f"no num_speculative_tokens values for drafter '{name}'",
                                [], "a non-empty list of N >= 1", source=n_src))
    depth = _mtp_depth(d, target, ckpt)
    for i, n in enumerate(ns):
        if depth and n > depth:
            if n % depth:
                problems.append(Problem(
                    f"{n_path}[{i}]",
                    f"num_speculative_tokens:{n} must be divisible by n_predict={depth} "
                    f"(the MTP depth of '{target.name}')", n,
                    f"N <= {depth} or a multiple of {depth}", source=n_src))
            else:
                warnings.append(f"{name} N={n} reuses the {depth} MTP layer(s) of "
                                f"'{target.name}' (vLLM warns: lower acceptance expected)")
        if d.drafting == "parallel" and d.depth is not None and n > d.depth:
            problems.append(Problem(f"{n_path}[{i}]", f"exceeds the block size of drafter '{name}'",
                                    n, f"N <= {d.depth}", source=n_src))
    sched = d.num_speculative_tokens_per_batch_size
    if sched and ns and max(k for _, _, k in sched) > max(ns):
        warnings.append(f"{name}: schedule values above N={max(ns)} are clamped by vLLM")


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
    lo, hi = d.prompt_lookup_min, d.prompt_lookup_max
    if lo is None and hi is None:
        return NGRAM_DEFAULT_LOOKUP, NGRAM_DEFAULT_LOOKUP
    return (lo if lo is not None else hi), (hi if hi is not None else lo)  # type: ignore[return-value]


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
    argv += list(engine.extra_args)
    if spec_cfg is not None:
        argv += ["--speculative-config", json.dumps(spec_cfg, sort_keys=True, separators=(",", ":"))]
    return tuple(argv)


def compile_plan(spec: Spec, catalog: Catalog = Catalog()) -> SweepPlan:
    """Validate across sections and build the sweep plan; raises SpecError with every problem."""
    problems: list[Problem] = []
    warnings: list[str] = []
    t = spec.target

    if t.tensor_parallel_size > spec.hardware.device_count:
        problems.append(Problem("target.tensor_parallel_size", "more ranks than devices",
                                t.tensor_parallel_size,
                                f"<= hardware.device_count ({spec.hardware.device_count})",
                                source=f"conf/target/{t.name}.yaml"))
    if t.hub and not t.revision:
        warnings.append(f"target '{t.name}' has no pinned revision: results are recorded against "
                        "whatever the hub serves")
    if t.trust_remote_code:
        warnings.append(f"target '{t.name}' runs its own code (trust_remote_code: true)")
    for key in spec.sweep.num_speculative_tokens:
        if catalog.drafters and key not in catalog.drafters:
            problems.append(Problem(f"sweep.num_speculative_tokens.{key}", "unknown drafter", key,
                                    one_of(catalog.drafters), did_you_mean(key, catalog.drafters)))
        elif key in spec.drafter and spec.drafter[key].method == "none":
            problems.append(Problem(f"sweep.num_speculative_tokens.{key}",
                                    "the baseline has no proposal length", key,
                                    "a speculative drafter"))
    levels = sorted(set(spec.sweep.concurrency))
    for i, (lo, hi) in enumerate(spec.promote.concurrency_bands):
        if lo > hi:
            problems.append(Problem(f"promote.concurrency_bands[{i}]", "low end above high end",
                                    [lo, hi], "[low <= high]"))
        elif not any(lo <= c <= hi for c in levels):
            problems.append(Problem(f"promote.concurrency_bands[{i}]",
                                    "no measured concurrency level falls in this band", [lo, hi],
                                    f"a band containing one of sweep.concurrency {levels}"))
    if spec.backend.kind == "endpoint":
        speculative = [n for n, d in spec.drafter.items() if d.method != "none"]
        if len(speculative) > 1:
            problems.append(Problem("drafter", "an endpoint serves one engine config; select at "
                                    "most one speculative drafter", speculative, "one drafter"))

    configs: list[EngineConfig] = []
    drafters = dict(spec.drafter)
    if spec.sweep.include_baseline and not any(d.method == "none" for d in drafters.values()):
        drafters = {"none": DrafterSpec(method="none", needs_checkpoint=False, drafting="none",
                                        vendors=[spec.hardware.vendor]), **drafters}
    for name, d in drafters.items():
        n_before = len(problems)
        _check_drafter(spec, name, d, catalog, problems, warnings)
        info = METHODS[d.method]
        if name in spec.sweep.num_speculative_tokens:
            ns, n_path, n_src = (spec.sweep.num_speculative_tokens[name],
                                 f"sweep.num_speculative_tokens.{name}", "conf/sweep/")
        else:
            ns, n_path, n_src = (d.num_speculative_tokens, f"drafter.{name}.num_speculative_tokens",
                                 f"conf/drafter/{name}.yaml")
        _check_n(spec, name, d, ns, n_path, n_src, problems, warnings)
        if len(problems) > n_before:
            continue
        ckpt = d.checkpoints.get(t.name)
        for n in ([0] if info.vllm_method is None else sorted(set(ns))):
            sc = speculative_config(info, d, ckpt, n)
            configs.append(EngineConfig(
                name="baseline" if info.vllm_method is None else f"{name}-n{n}",
                drafter=name, method=d.method, num_speculative_tokens=n,
                speculative_config=sc, serve_argv=serve_argv(spec, sc),
                lookahead_slots=info.lookahead_slots(n),
                checkpoint=ckpt.model if ckpt else None,
                checkpoint_revision=ckpt.revision if ckpt else None))
            if ckpt is not None and not ckpt.revision and t.hub:
                msg = f"drafter '{name}' checkpoint {ckpt.model} has no pinned revision"
                if msg not in warnings:
                    warnings.append(msg)

    seen: dict[str, str] = {}
    for ec in configs:
        if ec.hash in seen:
            problems.append(Problem("drafter", f"engine configs '{seen[ec.hash]}' and '{ec.name}' "
                                    "are identical", ec.name, "distinct drafters"))
        seen[ec.hash] = ec.name
    if len(configs) > spec.sweep.max_engine_configs:
        problems.append(Problem("sweep.max_engine_configs", f"the plan has {len(configs)} engine "
                                "configs (one engine start each)", spec.sweep.max_engine_configs,
                                f">= {len(configs)}, or fewer drafters / N values"))
    if problems:
        raise SpecError(problems)
    return SweepPlan(
        target=t.name, hardware=spec.hardware.name, engine_configs=tuple(configs),
        workloads=tuple(spec.workload), concurrency=tuple(sorted(set(spec.sweep.concurrency))),
        repeats=spec.sweep.repeats, warnings=tuple(warnings))
