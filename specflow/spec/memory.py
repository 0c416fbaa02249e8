"""Memory headroom of an engine config before anything starts: weights, reserve, KV cache,
the fit, the breakdown table and the fixes.

Pure: no vLLM, no I/O except reading a local model directory (`specflow.spec.architecture`).
The KV cache is accounted as vLLM 0.32 does (`specflow.spec.kvcache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import computed_field

from specflow.spec.architecture import arch_from_dir, snapshot_dir
from specflow.spec.compile import EngineConfig
from specflow.spec.kvcache import (
    CacheLayer,
    KvCapacity,
    cache_layers,
    kv_bytes_per_token,
    kv_capacity,
)
from specflow.spec.methods import METHODS
from specflow.spec.schema import (
    Architecture,
    FullAttention,
    MultiLatentAttention,
    Spec,
)

GIB = 1024**3
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
KV_DTYPE_BYTES = {"bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
QUANT_BITS_PER_PARAM = {
    "fp8": 8.0,  # per-tensor/channel scales: negligible
    "mxfp8": 8.0 + 8 / 32,  # one e8m0 scale per 32 values
    "mxfp4": 4.0 + 8 / 32,
    "nvfp4": 4.0 + 8 / 16,  # one fp8 scale per 16 values
    "int4": 4.0 + 16 / 128,  # group 128, fp16 scale
    "awq": 4.0 + 32 / 128,  # group 128, fp16 scale + zero
    "gptq": 4.0 + 32 / 128,
    "compressed-tensors": 8.0,  # assumed fp8 (W8A8), the common case
}
"""Bits per quantized weight including scales; embeddings and LM head stay in the model dtype."""

ASSUMPTIONS = (
    "activations of the profiling pass ~ max_num_batched_tokens x hidden x dtype x 16, plus "
    "sampler logits max_num_seqs x vocab x 4 bytes",
    "CUDA-graph reserve 1 GiB (0 with enforce_eager) and 0.75 GiB of non-torch memory per GPU",
    "quantized checkpoints keep embeddings and LM head (2 x vocab x hidden) in the model dtype",
    "native MTP layers are counted in the target's parameter count; their KV is that of the "
    "target's full-attention layers",
    "linear-attention state: conv state in the model dtype, recurrent state in float32; on "
    "hybrid models the attention block size is raised until one page holds a state "
    "(vLLM's page unification, approximated)",
)

Fit = Literal["fits", "warn", "refuse"]


# --------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True)
class Row:
    """One line of the breakdown table."""

    item: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class Headroom:
    """Whether an engine config fits, and what its drafter costs."""

    engine: str
    fit: Fit
    reasons: tuple[str, ...]
    fixes: tuple[str, ...]
    rows: tuple[Row, ...]
    memory_per_device_bytes: int
    target_weight_bytes: int
    draft_weight_bytes: int
    reserve_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token_target: int
    kv_bytes_per_token_draft: int
    capacity: KvCapacity
    capacity_without_drafter: KvCapacity
    concurrency_at_context: int
    concurrency_at_context_without_drafter: int
    context_len: int
    lookahead_slots: int
    assumptions: tuple[str, ...] = field(default=ASSUMPTIONS)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kv_tokens(self) -> int:
        """KV cache tokens with the drafter (`capacity.tokens`)."""
        return self.capacity.tokens

    @computed_field  # type: ignore[prop-decorator]
    @property
    def drafter_cost_tokens(self) -> int:
        return self.capacity_without_drafter.tokens - self.capacity.tokens

    @computed_field  # type: ignore[prop-decorator]
    @property
    def drafter_cost_percent(self) -> float:
        base = self.capacity_without_drafter.tokens
        return round(100.0 * self.drafter_cost_tokens / base, 2) if base else 0.0


def weight_bytes(num_params: float, arch: Architecture, dtype: str,
                 quantization: str | None) -> int:
    """Bytes of a checkpoint's weights (all ranks together)."""
    dbytes = DTYPE_BYTES[dtype]
    if quantization is None:
        return int(num_params * dbytes)
    embed = 2 * arch.vocab_size * arch.hidden_size
    bits = QUANT_BITS_PER_PARAM[quantization]
    return int(max(0.0, num_params - embed) * bits / 8 + embed * dbytes)


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def default_block_size(vendor: str, layers: Sequence[CacheLayer]) -> int:
    """vLLM 0.32's default block size: 128 on the CPU engine (16 for MLA), else 16."""
    if vendor == "cpu":
        return 16 if any(lyr.kind == "mla" for lyr in layers) else 128
    return 16


def draft_arch(spec: Spec, ec: EngineConfig) -> Architecture | None:
    """The drafter's architecture: conf entry, else its local directory, else None."""
    if ec.method == "none" or METHODS[ec.method].drafting == "lookup":
        return None
    d = spec.drafter.get(ec.drafter)
    ckpt = d.checkpoints.get(spec.target.name) if d else None
    if ckpt is None:
        return None
    if ckpt.arch is not None:
        return ckpt.arch
    local = snapshot_dir(ckpt.model, ckpt.revision)
    return arch_from_dir(local) if local else None


def target_arch(spec: Spec) -> Architecture:
    """The target's architecture facts as its conf entry states them (`target.arch`).

    Nothing is read from disk: `tests/spec/test_memory.py` checks the conf entries against the
    checkpoints' config.json."""
    return spec.target.arch


# --------------------------------------------------------------------------------------------
# Headroom, step by step: draft share -> reserve -> per-rank memory -> KV capacity -> fit


@dataclass(frozen=True)
class _Draft:
    """What the drafter adds on one rank; `note` says why it could not be counted."""

    weight_bytes: int = 0
    layers: tuple[CacheLayer, ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class _Reserve:
    """Memory vLLM holds besides weights and KV cache on one rank (see ASSUMPTIONS)."""

    activations: int
    graphs: int
    non_torch: int

    @property
    def total(self) -> int:
        return self.activations + self.graphs + self.non_torch


@dataclass(frozen=True)
class _Memory:
    """One rank's memory: the device, what vLLM may use, what weights and reserve take."""

    arch: Architecture
    kv_dtype_bytes: int
    total: int
    budget: int
    """total x gpu_memory_utilization."""
    fixed_kv: int | None
    """--kv-cache-memory-bytes, when set (then the KV cache does not depend on the budget)."""
    target_weights: int
    target_layers: tuple[CacheLayer, ...]
    draft: _Draft
    reserve: _Reserve

    @property
    def paid(self) -> int:
        """Weights (target and drafter) plus reserve."""
        return self.target_weights + self.draft.weight_bytes + self.reserve.total

    @property
    def kv_with(self) -> int:
        """KV cache bytes with the drafter loaded (negative when nothing is left)."""
        return self.fixed_kv if self.fixed_kv is not None else self.budget - self.paid

    @property
    def kv_without(self) -> int:
        """KV cache bytes the target alone would get."""
        if self.fixed_kv is not None:
            return self.fixed_kv
        return self.budget - self.target_weights - self.reserve.total

    @property
    def fixed_kv_overflows(self) -> bool:
        return self.fixed_kv is not None and self.paid + self.fixed_kv > self.total


@dataclass(frozen=True)
class _Capacity:
    """KV capacity with and without the drafter, at max_model_len and at the workloads' context."""

    block_size: int
    with_drafter: KvCapacity
    without_drafter: KvCapacity
    context: int
    """Longest workload request (input_len + max_tokens), capped at max_model_len."""
    slots: int
    """Lookahead slots each running request reserves."""
    need_len: int
    """context + slots, capped at max_model_len."""
    concurrency: int
    """Whole requests of need_len tokens the cache holds."""
    concurrency_without_drafter: int
    """Whole requests of context tokens the target's cache alone holds."""


def _batch_limits(spec: Spec) -> tuple[int, int]:
    """max_num_batched_tokens and max_num_seqs, with vLLM's defaults where unset."""
    cpu = spec.hardware.vendor == "cpu"
    engine = spec.backend.engine
    return (engine.max_num_batched_tokens or (2048 if cpu else 8192),
            engine.max_num_seqs or (256 if cpu else 1024))


def _native_mtp_layers(arch: Architecture, tp: int, kv_bytes: int, dtype_bytes: int
                       ) -> list[CacheLayer]:
    """KV of a target's own MTP layers: `mtp_depth` layers like its full-attention (or MLA) ones."""
    full = next((g for g in arch.layers if isinstance(g, (FullAttention, MultiLatentAttention))),
                None)
    if full is None:
        return []
    mtp_arch = arch.model_copy(update={"layers": [full.model_copy(
        update={"count": arch.mtp_depth})]})
    return cache_layers(mtp_arch, tp, kv_bytes, dtype_bytes, "draft")


def _draft(spec: Spec, ec: EngineConfig, arch: Architecture, kv_bytes: int, dtype_bytes: int
           ) -> _Draft:
    """The drafter's weights and KV per rank: native MTP layers, a checkpoint's, or none."""
    tp = spec.target.tensor_parallel_size
    d_arch = draft_arch(spec, ec)
    if ec.method == "mtp" and d_arch is None:
        return _Draft(layers=tuple(_native_mtp_layers(arch, tp, kv_bytes, dtype_bytes)))
    if d_arch is not None:
        dtp = spec.drafter[ec.drafter].draft_tensor_parallel_size or tp
        return _Draft(
            weight_bytes=weight_bytes(d_arch.num_params, d_arch, spec.target.dtype, None) // dtp,
            layers=tuple(cache_layers(d_arch, dtp, kv_bytes, dtype_bytes, "draft")))
    info = METHODS[ec.method]
    if info.needs_checkpoint and not info.model_optional:
        return _Draft(note=f"drafter '{ec.drafter}' has no architecture facts: its weights and "
                      "KV are not counted")
    return _Draft()


def _reserve(spec: Spec, arch: Architecture, dtype_bytes: int) -> _Reserve:
    """Profiling-pass activations and sampler logits, CUDA graphs, non-torch memory."""
    cpu = spec.hardware.vendor == "cpu"
    max_batched, max_seqs = _batch_limits(spec)
    return _Reserve(
        activations=max_batched * arch.hidden_size * dtype_bytes * 16
        + max_seqs * arch.vocab_size * 4,
        graphs=0 if (spec.backend.engine.enforce_eager or cpu) else GIB,
        non_torch=0 if cpu else int(0.75 * GIB))


def _memory(spec: Spec, ec: EngineConfig, device_total_bytes: int | None) -> _Memory:
    """Device memory, budget, weights and reserve of one rank of this engine config."""
    t, engine = spec.target, spec.backend.engine
    arch = target_arch(spec)
    dtype_bytes = DTYPE_BYTES[t.dtype]
    kvb = dtype_bytes if t.kv_cache_dtype == "auto" else KV_DTYPE_BYTES[t.kv_cache_dtype]
    total = device_total_bytes or int(spec.hardware.memory_gib_per_device * GIB)
    tp = t.tensor_parallel_size
    return _Memory(
        arch=arch, kv_dtype_bytes=kvb, total=total,
        budget=int(total * engine.gpu_memory_utilization),
        fixed_kv=engine.kv_cache_memory_bytes,
        target_weights=weight_bytes(arch.num_params, arch, t.dtype, t.quantization) // tp,
        target_layers=tuple(cache_layers(arch, tp, kvb, dtype_bytes, "target")),
        draft=_draft(spec, ec, arch, kvb, dtype_bytes),
        reserve=_reserve(spec, arch, dtype_bytes))


def _requests_at(spec: Spec, layers: Sequence[CacheLayer], kv_bytes: int, block_size: int,
                 length: int) -> int:
    """Whole requests of `length` tokens that `kv_bytes` of KV cache hold."""
    in_flight, _ = _batch_limits(spec)
    k = kv_capacity(layers, kv_bytes, spec.target.max_model_len, block_size, in_flight,
                    length=length)
    return k.num_blocks // k.blocks_per_request if k.blocks_per_request else 0


def _capacity(spec: Spec, ec: EngineConfig, mem: _Memory) -> _Capacity:
    """vLLM's KV capacity with and without the drafter, and the requests it holds at context."""
    L = spec.target.max_model_len
    in_flight, _ = _batch_limits(spec)
    layers = (*mem.target_layers, *mem.draft.layers)
    block = default_block_size(spec.hardware.vendor, mem.target_layers)
    context = min(max((w.input_len + w.max_tokens for w in spec.workload.values()), default=L), L)
    slots = ec.lookahead_slots
    need_len = min(context + slots, L) if slots else context
    return _Capacity(
        block_size=block,
        with_drafter=kv_capacity(layers, mem.kv_with, L, block, in_flight),
        without_drafter=kv_capacity(mem.target_layers, mem.kv_without, L, block, in_flight),
        context=context, slots=slots, need_len=need_len,
        concurrency=_requests_at(spec, layers, mem.kv_with, block, need_len),
        concurrency_without_drafter=_requests_at(spec, mem.target_layers, mem.kv_without, block,
                                                 context))


def _memory_notes(mem: _Memory, device_free_bytes: int | None) -> list[str]:
    """What is worth knowing whatever the fit: uncounted drafter, overflow, a busy device."""
    notes = [mem.draft.note] if mem.draft.note else []
    if mem.fixed_kv is not None and mem.fixed_kv_overflows:
        notes.append(f"weights + reserve + the fixed KV cache ({_gib(mem.paid + mem.fixed_kv)}) "
                     f"exceed device memory ({_gib(mem.total)})")
    if device_free_bytes is not None and device_free_bytes < mem.budget:
        notes.append(f"only {_gib(device_free_bytes)} free of {_gib(mem.total)}: other processes "
                     f"hold memory the engine expects ({_gib(mem.budget)})")
    return notes


def _load_warnings(spec: Spec, cap: _Capacity) -> list[str]:
    """Why the sweep's highest concurrency is tight: too few requests fit, or too little margin."""
    top = max(spec.sweep.concurrency)
    if cap.concurrency < top:
        return [f"holds {cap.concurrency} requests of {cap.need_len:,} tokens, below the sweep's "
                f"highest concurrency {top}"]
    tokens = cap.with_drafter.tokens
    margin = (tokens - top * cap.need_len) / tokens if tokens else 0.0
    if margin < spec.headroom.warn_margin:
        return [f"KV margin at concurrency {top} is {margin:.0%}, under "
                f"headroom.warn_margin={spec.headroom.warn_margin:.0%}"]
    return []


def _fit(spec: Spec, mem: _Memory, cap: _Capacity, notes: Sequence[str], busy: bool
             ) -> tuple[Fit, list[str]]:
    """fits, warn or refuse, with every reason (a refusal's own cause first)."""
    L = spec.target.max_model_len
    kv = cap.with_drafter
    if mem.kv_with <= 0:
        return "refuse", [f"weights and reserve ({_gib(mem.paid)}) leave no KV cache within "
                          f"{_gib(mem.budget)} per device", *notes]
    if kv.num_blocks < kv.blocks_per_request or kv.tokens < L:
        return "refuse", [f"the KV cache holds {kv.tokens:,} tokens, less than one request at "
                          f"max_model_len={L:,}", *notes]
    if mem.fixed_kv_overflows:
        return "refuse", list(notes)
    warnings = _load_warnings(spec, cap)
    return ("warn" if warnings or busy else "fits"), [*notes, *warnings]


def headroom(spec: Spec, ec: EngineConfig, *, device_total_bytes: int | None = None,
             device_free_bytes: int | None = None) -> Headroom:
    """Memory breakdown and fit for one engine config on spec.hardware."""
    mem = _memory(spec, ec, device_total_bytes)
    cap = _capacity(spec, ec, mem)
    busy = device_free_bytes is not None and device_free_bytes < mem.budget
    fit, reasons = _fit(spec, mem, cap, _memory_notes(mem, device_free_bytes), busy)
    fixes = _fixes(spec, ec, mem, cap.with_drafter) if fit != "fits" else []
    rows = (*_memory_rows(spec, ec, mem, probed=bool(device_total_bytes)),
            *_kv_rows(spec, mem, cap))
    return Headroom(
        engine=ec.name, fit=fit, reasons=tuple(reasons), fixes=tuple(fixes), rows=rows,
        memory_per_device_bytes=mem.total, target_weight_bytes=mem.target_weights,
        draft_weight_bytes=mem.draft.weight_bytes, reserve_bytes=mem.reserve.total,
        kv_cache_bytes=mem.kv_with,
        kv_bytes_per_token_target=kv_bytes_per_token(mem.target_layers),
        kv_bytes_per_token_draft=kv_bytes_per_token(mem.draft.layers),
        capacity=cap.with_drafter, capacity_without_drafter=cap.without_drafter,
        concurrency_at_context=cap.concurrency,
        concurrency_at_context_without_drafter=cap.concurrency_without_drafter,
        context_len=cap.context, lookahead_slots=cap.slots)


# --------------------------------------------------------------------------------------------
# The breakdown table and the fixes


def _memory_rows(spec: Spec, ec: EngineConfig, mem: _Memory, probed: bool) -> list[Row]:
    """Device memory, budget, weights, reserve and KV cache of one rank."""
    t, engine = spec.target, spec.backend.engine
    r = mem.reserve
    if mem.fixed_kv is None:
        usable = Row("usable (gpu_memory_utilization)", _gib(mem.budget),
                     f"x {engine.gpu_memory_utilization:g}")
    else:
        usable = Row("KV cache (fixed)", _gib(mem.fixed_kv), "--kv-cache-memory-bytes")
    return [
        Row("device memory", _gib(mem.total),
            "probed" if probed else f"conf/hardware/{spec.hardware.name}.yaml"),
        usable,
        Row("target weights / rank", _gib(mem.target_weights),
            f"{mem.arch.num_params / 1e9:,.2f}B params, {t.quantization or t.dtype}, "
            f"TP={t.tensor_parallel_size}"),
        Row("draft weights / rank", _gib(mem.draft.weight_bytes), ec.checkpoint or
            ("target's MTP layers" if ec.method == "mtp" else "none")),
        Row("runtime reserve", _gib(r.total), f"activations {_gib(r.activations)}, CUDA graphs "
            f"{_gib(r.graphs)}, non-torch {_gib(r.non_torch)}"),
        Row("KV cache / rank", _gib(max(0, mem.kv_with)),
            f"without drafter {_gib(max(0, mem.kv_without))}"),
    ]


def _kv_rows(spec: Spec, mem: _Memory, cap: _Capacity) -> list[Row]:
    """KV bytes per token, blocks, token capacity and concurrency, with and without the drafter."""
    L = spec.target.max_model_len
    target, draft = mem.target_layers, mem.draft.layers
    kv, kv0 = cap.with_drafter, cap.without_drafter
    lost = kv0.tokens - kv.tokens
    rows = [
        Row("KV bytes / token (target)", f"{kv_bytes_per_token(target):,}",
            f"{len(target)} layers, kv dtype {mem.kv_dtype_bytes} B"),
        Row("KV bytes / token (drafter)", f"{kv_bytes_per_token(draft):,}", f"{len(draft)} layers"),
    ]
    if any(lyr.kind == "linear" for lyr in target):
        rows.append(Row("linear-attention state / sequence",
                        _gib(sum(lyr.state_bytes for lyr in (*target, *draft))), ""))
    return rows + [
        Row("KV blocks", f"{kv.num_blocks:,}", f"block_size {cap.block_size}, "
            f"{kv.bytes_per_block:,} B/block"),
        Row("KV token capacity", f"{kv.tokens:,}", f"without drafter {kv0.tokens:,}"),
        Row("KV capacity lost to the drafter", f"{lost:,} tokens",
            f"{(100.0 * lost / kv0.tokens) if kv0.tokens else 0:.1f}%"),
        Row(f"max concurrency at max_model_len={L:,}", f"{kv.max_concurrency:.2f}",
            f"without drafter {kv0.max_concurrency:.2f}"),
        Row(f"max concurrency at context {cap.need_len:,}", str(cap.concurrency),
            f"without drafter {cap.concurrency_without_drafter} (context {cap.context:,}; "
            f"lookahead {cap.slots} slots/request)"),
    ]


def _tp_fix(spec: Spec, mem: _Memory) -> list[str]:
    """The smallest larger TP degree (up to 8) whose weights leave a fifth of the budget."""
    tp, devices = spec.target.tensor_parallel_size, spec.hardware.device_count
    for more in (2, 4, 8):
        new_tp = tp * more
        if new_tp > 8:
            break
        need = (mem.target_weights * tp) // new_tp + mem.draft.weight_bytes + mem.reserve.total
        if need < mem.budget * 0.8:
            where = "" if new_tp <= devices else \
                f" (needs {new_tp} devices; hardware.device_count={devices})"
            return [f"more tensor parallelism: target.tensor_parallel_size={new_tp}{where}"]
    return []


def _fixes(spec: Spec, ec: EngineConfig, mem: _Memory, kv: KvCapacity) -> list[str]:
    """Changes that would make a config that does not fit (or barely fits) fit."""
    t = spec.target
    out = _tp_fix(spec, mem)
    if t.quantization is None and mem.target_weights > mem.budget * 0.5:
        out.append("a quantized checkpoint (fp8 halves the weights)")
    draft = mem.draft
    if draft.layers and ec.num_speculative_tokens > 1:
        out.append(f"a smaller N than {ec.num_speculative_tokens} (fewer lookahead slots)")
    if draft.layers or draft.weight_bytes:
        out.append("a method without weights or KV of its own (ngram, suffix)")
    top = max(spec.sweep.concurrency)
    if kv_bytes_per_token((*mem.target_layers, *draft.layers)) and kv.num_blocks:
        fit = kv.num_blocks * kv.block_size // max(1, top)
        if fit < t.max_model_len:
            out.append(f"a lower max_model_len: target.max_model_len={max(16, fit // 16 * 16)}"
                       f" holds {top} concurrent requests")
    if t.kv_cache_dtype == "auto" and spec.hardware.vendor != "cpu":
        out.append("an fp8 KV cache: target.kv_cache_dtype=fp8 (halves KV bytes per token)")
    return out
