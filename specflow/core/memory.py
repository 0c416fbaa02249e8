"""Memory headroom of an engine config before anything starts: weights, reserve, KV cache.

Pure: no vLLM, no I/O except reading a local model directory's config.json and safetensors
headers. KV accounting follows vLLM 0.32's v1/core/kv_cache_utils.py: per-layer pages of
`block_size` tokens, layers grouped by kind (uniform type -> one group; hybrid -> groups of
equal size with pages unified), `num_blocks = kv_bytes // bytes_per_block`, and the reported
token capacity `int(num_blocks / blocks_per_request(max_model_len) * max_model_len)`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from specflow.core import hfcache
from specflow.core.compile import EngineConfig
from specflow.core.methods import METHODS
from specflow.core.schema import (
    Architecture,
    FullAttention,
    LinearAttention,
    MultiLatentAttention,
    SlidingWindow,
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
KV_SHARED_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
"""Drafter config types whose attention reads the target's KV cache (no KV of their own)."""

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

Verdict = Literal["fits", "warn", "refuse"]


# --------------------------------------------------------------------------------------------
# Layers as the KV cache sees them (per rank)


@dataclass(frozen=True)
class CacheLayer:
    """One attention layer's cache on one rank."""

    kind: Literal["full", "sliding", "mla", "linear"]
    bytes_per_token: int
    """K+V (or latent) bytes per token; 0 for linear-attention layers."""
    window: int | None = None
    state_bytes: int = 0
    """Constant per-sequence state (linear attention)."""
    owner: Literal["target", "draft"] = "target"


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    return max(1, kv_heads // tp)


def cache_layers(arch: Architecture, tp: int, kv_bytes: int, dtype_bytes: int,
                 owner: Literal["target", "draft"] = "target") -> list[CacheLayer]:
    """Per-layer caches of an architecture on one rank of tensor-parallel degree `tp`."""
    out: list[CacheLayer] = []
    for g in arch.layers:
        if isinstance(g, FullAttention):
            bpt = 2 * _kv_heads_per_rank(g.num_kv_heads, tp) * g.head_dim * kv_bytes
            out += [CacheLayer("full", bpt, owner=owner)] * g.count
        elif isinstance(g, SlidingWindow):
            bpt = 2 * _kv_heads_per_rank(g.num_kv_heads, tp) * g.head_dim * kv_bytes
            out += [CacheLayer("sliding", bpt, window=g.window, owner=owner)] * g.count
        elif isinstance(g, MultiLatentAttention):
            bpt = (g.kv_lora_rank + g.qk_rope_head_dim) * kv_bytes  # one latent, not per head
            out += [CacheLayer("mla", bpt, owner=owner)] * g.count
        elif isinstance(g, LinearAttention):
            out += [CacheLayer("linear", 0, state_bytes=linear_state_bytes(g, tp, dtype_bytes),
                               owner=owner)] * g.count
    return out


def linear_state_bytes(g: LinearAttention, tp: int, dtype_bytes: int) -> int:
    """Per-sequence state of one Gated-DeltaNet-style layer on one rank."""
    key_dim = g.num_key_heads * g.key_head_dim
    value_dim = g.num_value_heads * g.value_head_dim
    conv = (g.conv_kernel - 1) * (2 * key_dim + value_dim) // tp * dtype_bytes
    recurrent = max(1, g.num_value_heads // tp) * g.key_head_dim * g.value_head_dim * 4
    return conv + recurrent


def kv_bytes_per_token(layers: Sequence[CacheLayer]) -> int:
    """Bytes per token summed over attention layers (sliding windows not capped)."""
    return sum(layer.bytes_per_token for layer in layers)


# --------------------------------------------------------------------------------------------
# vLLM's block accounting


@dataclass(frozen=True)
class _Spec:
    kind: str
    page: int
    block_size: int
    window: int | None


@dataclass(frozen=True)
class KvCapacity:
    """KV cache capacity as vLLM computes and reports it."""

    block_size: int
    num_blocks: int
    bytes_per_block: int
    tokens: int
    """vLLM's "KV cache size: N tokens" (at max_model_len)."""
    max_concurrency: float
    """vLLM's "Maximum concurrency for max_model_len tokens per request"."""
    blocks_per_request: int


def _blocks(spec: _Spec, length: int, max_model_len: int, in_flight: int) -> int:
    if spec.kind == "sliding":
        assert spec.window is not None
        tokens = min(spec.window - 1 + in_flight, length, max_model_len)
        return math.ceil(tokens / spec.block_size) + 1
    if spec.kind == "linear":
        return 1
    return math.ceil(length / spec.block_size)


def _groups(layers: Sequence[CacheLayer], block_size: int) -> tuple[int, list[tuple[_Spec, int]]]:
    """(bytes_per_block, [(group spec, layers in group)]) following vLLM's grouping."""
    attn = [lyr for lyr in layers if lyr.kind != "linear"]
    linear = [lyr for lyr in layers if lyr.kind == "linear"]
    specs = [_Spec(lyr.kind if lyr.kind != "mla" else "full", lyr.bytes_per_token * block_size,
                   block_size, lyr.window) for lyr in attn]
    kinds = {(s.kind, s.window) for s in specs}
    if not linear and len(kinds) == 1:
        # uniform spec or uniform type: one group holding every layer
        return sum(s.page for s in specs), [(specs[0], len(specs))]
    if linear:
        # vLLM raises the attention block size until a page holds a whole linear-attention state,
        # then pads the linear layers' pages to the attention page.
        state = max(lyr.state_bytes for lyr in linear)
        base = min(s.page for s in specs) if specs else state
        factor = max(1, math.ceil(state / base)) if specs else 1
        specs = [replace(s, page=s.page * factor, block_size=s.block_size * factor) for s in specs]
        page = max([s.page for s in specs] + [state])
        specs += [_Spec("linear", page, block_size, None)] * len(linear)
    max_page = max(s.page for s in specs)
    specs = [replace(s, block_size=s.block_size * max_page // s.page, page=max_page)
             if s.page < max_page and max_page % s.page == 0 else s for s in specs]
    buckets: dict[_Spec, int] = {}
    for s in specs:
        buckets[s] = buckets.get(s, 0) + 1
    lo, hi = min(buckets.values()), max(buckets.values())
    group_size = hi if hi < lo * 1.5 else lo
    groups = []
    for s, n in buckets.items():
        groups += [(s, group_size)] * math.ceil(n / group_size)
    return group_size * max_page, groups


def kv_capacity(layers: Sequence[CacheLayer], kv_cache_bytes: int, max_model_len: int,
                block_size: int, in_flight_tokens: int, length: int | None = None) -> KvCapacity:
    """Blocks, token capacity and max concurrency for a KV budget (vLLM's arithmetic)."""
    if not layers:
        return KvCapacity(block_size, 0, 0, 0, math.inf, 0)
    bytes_per_block, groups = _groups(layers, block_size)
    num_blocks = max(0, kv_cache_bytes) // bytes_per_block
    per_request = sum(_blocks(s, length or max_model_len, max_model_len, in_flight_tokens)
                      for s, _ in groups)
    concurrency = num_blocks / per_request if per_request else math.inf
    return KvCapacity(block_size, num_blocks, bytes_per_block,
                      int(concurrency * max_model_len), concurrency, per_request)


# --------------------------------------------------------------------------------------------
# Architecture from a local model directory (or an HF cache snapshot)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg.get("text_config") or cfg


def arch_from_config(cfg: dict[str, Any], num_params: float | None = None) -> Architecture:
    """Architecture facts from a Hugging Face config.json (text models, hybrids, MLA)."""
    t = _text_config(cfg)
    layers_n = int(t["num_hidden_layers"])
    heads = int(t["num_attention_heads"])
    hidden = int(t["hidden_size"])
    kv = int(t.get("num_key_value_heads") or heads)
    head_dim = int(t.get("head_dim") or hidden // heads)
    groups: list[Any] = []
    types = t.get("layer_types") or []
    if "kv_lora_rank" in t and t.get("kv_lora_rank"):
        groups.append(MultiLatentAttention(count=layers_n, kv_lora_rank=int(t["kv_lora_rank"]),
                                           qk_rope_head_dim=int(t.get("qk_rope_head_dim", 0))))
    elif types:
        counts = {k: types.count(k) for k in dict.fromkeys(types)}
        for kind, n in counts.items():
            if kind in ("sliding_attention", "sliding_window"):
                groups.append(SlidingWindow(count=n, num_kv_heads=kv, head_dim=head_dim,
                                            window=int(t["sliding_window"])))
            elif kind == "full_attention":
                groups.append(FullAttention(
                    count=n, num_kv_heads=int(t.get("num_global_key_value_heads") or kv),
                    head_dim=int(t.get("global_head_dim") or head_dim)))
            elif kind == "linear_attention":
                groups.append(LinearAttention(
                    count=n, num_key_heads=int(t["linear_num_key_heads"]),
                    num_value_heads=int(t["linear_num_value_heads"]),
                    key_head_dim=int(t["linear_key_head_dim"]),
                    value_head_dim=int(t["linear_value_head_dim"]),
                    conv_kernel=int(t.get("linear_conv_kernel_dim", 4))))
            else:
                raise ValueError(f"layer_types: unknown layer type {kind!r}")
    elif t.get("sliding_window") and t.get("use_sliding_window", True) and \
            t.get("model_type") not in ("qwen3", "qwen2", "llama"):
        groups.append(SlidingWindow(count=layers_n, num_kv_heads=kv, head_dim=head_dim,
                                    window=int(t["sliding_window"])))
    else:
        groups.append(FullAttention(count=layers_n, num_kv_heads=kv, head_dim=head_dim))
    # A Gemma 4 assistant's layers all read the target's KV (its text_config is gemma4_text)
    assistant = cfg.get("model_type") in KV_SHARED_MODEL_TYPES or \
        t.get("model_type") in KV_SHARED_MODEL_TYPES
    if assistant:
        groups = []
    mtp = int(t.get("num_nextn_predict_layers") or t.get("mtp_num_hidden_layers") or 0)
    vocab = int(t.get("vocab_size") or cfg.get("vocab_size"))
    params = num_params or estimate_params(hidden, layers_n, vocab, t)
    return Architecture(hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab,
                        num_params=params, layers=groups, mtp_depth=mtp, kv_shared=assistant)


def estimate_params(hidden: int, layers: int, vocab: int, t: dict[str, Any]) -> float:
    """Rough parameter count from dimensions when no weights are at hand."""
    inter = int(t.get("intermediate_size") or 4 * hidden)
    experts = int(t.get("num_experts") or t.get("n_routed_experts") or 0)
    moe_inter = int(t.get("moe_intermediate_size") or 0)
    mlp = 3 * hidden * (moe_inter * experts if experts else inter)
    attn = 4 * hidden * hidden
    return float(layers * (attn + mlp) + 2 * vocab * hidden)


def safetensors_params(directory: Path) -> int:
    """Parameter count from the safetensors headers of a directory (no tensor data read)."""
    total = 0
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, entry in header.items():
            if name != "__metadata__":
                total += math.prod(entry["shape"])
    return total


def snapshot_dir(model: str, revision: str | None = None) -> Path | None:
    """A local directory holding `model`: the path itself or its HF cache snapshot."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    snap = hfcache.snapshot(model, revision)
    return snap if snap is not None and (snap / "config.json").is_file() else None


def arch_from_dir(directory: Path) -> Architecture:
    """Architecture of a local model directory (config.json + safetensors headers)."""
    cfg = json.loads((directory / "config.json").read_text())
    params = safetensors_params(directory)
    return arch_from_config(cfg, float(params) if params else None)


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
    verdict: Verdict
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

    @property
    def drafter_cost_tokens(self) -> int:
        return self.capacity_without_drafter.tokens - self.capacity.tokens

    @property
    def drafter_cost_percent(self) -> float:
        base = self.capacity_without_drafter.tokens
        return 100.0 * self.drafter_cost_tokens / base if base else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "verdict": self.verdict, "reasons": list(self.reasons),
            "fixes": list(self.fixes), "kv_cache_bytes": self.kv_cache_bytes,
            "kv_tokens": self.capacity.tokens, "kv_tokens_without_drafter":
                self.capacity_without_drafter.tokens,
            "drafter_cost_tokens": self.drafter_cost_tokens,
            "drafter_cost_percent": round(self.drafter_cost_percent, 2),
            "max_concurrency_at_context": self.concurrency_at_context,
            "max_concurrency_at_context_without_drafter":
                self.concurrency_at_context_without_drafter,
            "context_len": self.context_len,
            "breakdown": [{"item": r.item, "value": r.value, "note": r.note} for r in self.rows],
        }


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
    d = spec.drafter[ec.drafter] if ec.drafter in spec.drafter else None
    ckpt = d.checkpoints.get(spec.target.name) if d else None
    if ckpt is None:
        return None
    if ckpt.arch is not None:
        return ckpt.arch
    local = snapshot_dir(ckpt.model, ckpt.revision)
    return arch_from_dir(local) if local else None


def target_arch(spec: Spec) -> Architecture:
    """The conf entry's facts (a local directory's config.json only when the conf has none)."""
    return spec.target.arch


def headroom(spec: Spec, ec: EngineConfig, *, device_total_bytes: int | None = None,
             device_free_bytes: int | None = None) -> Headroom:
    """Memory breakdown and verdict for one engine config on spec.hardware."""
    t, hw, engine = spec.target, spec.hardware, spec.backend.engine
    tp = t.tensor_parallel_size
    dtype_bytes = DTYPE_BYTES[t.dtype]
    kvb = dtype_bytes if t.kv_cache_dtype == "auto" else KV_DTYPE_BYTES[t.kv_cache_dtype]
    info = METHODS[ec.method]
    arch = target_arch(spec)

    total = device_total_bytes or int(hw.memory_gib_per_device * GIB)
    target_w = weight_bytes(arch.num_params, arch, t.dtype, t.quantization) // tp
    target_layers = cache_layers(arch, tp, kvb, dtype_bytes, "target")

    reasons: list[str] = []
    d_arch = draft_arch(spec, ec)
    draft_layers: list[CacheLayer] = []
    draft_w = 0
    if ec.method == "mtp" and d_arch is None:  # native MTP: the target's own layers
        full = next((g for g in arch.layers if isinstance(g, (FullAttention,
                                                              MultiLatentAttention))), None)
        if full is not None:
            mtp_arch = arch.model_copy(update={"layers": [full.model_copy(
                update={"count": arch.mtp_depth})]})
            draft_layers = cache_layers(mtp_arch, tp, kvb, dtype_bytes, "draft")
    elif d_arch is not None:
        d = spec.drafter[ec.drafter]
        dtp = d.draft_tensor_parallel_size or tp
        draft_w = weight_bytes(d_arch.num_params, d_arch, t.dtype, None) // dtp
        draft_layers = cache_layers(d_arch, dtp, kvb, dtype_bytes, "draft")
    elif info.needs_checkpoint and not info.model_optional:
        reasons.append(f"drafter '{ec.drafter}' has no architecture facts: its weights and KV "
                       "are not counted")

    cpu = hw.vendor == "cpu"
    max_batched = engine.max_num_batched_tokens or (2048 if cpu else 8192)
    max_seqs = engine.max_num_seqs or (256 if cpu else 1024)
    activations = max_batched * arch.hidden_size * dtype_bytes * 16 + max_seqs * arch.vocab_size * 4
    graphs = 0 if (engine.enforce_eager or cpu) else GIB
    non_torch = 0 if cpu else int(0.75 * GIB)
    reserve = activations + graphs + non_torch

    budget = int(total * engine.gpu_memory_utilization)
    explicit = engine.kv_cache_memory_bytes
    if explicit is not None:
        kv_with, kv_without = explicit, explicit
        needed = target_w + draft_w + reserve + explicit
        if needed > total:
            reasons.append(f"weights + reserve + the fixed KV cache ({_gib(needed)}) exceed "
                           f"device memory ({_gib(total)})")
    else:
        kv_with = budget - target_w - draft_w - reserve
        kv_without = budget - target_w - reserve

    block = default_block_size(hw.vendor, target_layers)
    in_flight = max_batched
    L = t.max_model_len
    cap = kv_capacity(target_layers + draft_layers, kv_with, L, block, in_flight)
    cap0 = kv_capacity(target_layers, kv_without, L, block, in_flight)

    workloads = list(spec.workload.values())
    context = max((w.input_len + w.max_tokens for w in workloads), default=L)
    context = min(context, L)
    slots = ec.lookahead_slots
    need_len = min(context + slots, L) if slots else context

    def at_context(c: KvCapacity, layers: Sequence[CacheLayer], with_slots: bool) -> int:
        if c.num_blocks == 0:
            return 0
        k = kv_capacity(layers, (kv_with if with_slots else kv_without), L, block, in_flight,
                        length=need_len if with_slots else context)
        return int(k.num_blocks // k.blocks_per_request) if k.blocks_per_request else 0

    conc = at_context(cap, target_layers + draft_layers, True)
    conc0 = at_context(cap0, target_layers, False)
    if device_free_bytes is not None and device_free_bytes < budget:
        reasons.append(f"only {_gib(device_free_bytes)} free of {_gib(total)}: other processes "
                       f"hold memory the engine expects ({_gib(budget)})")

    verdict: Verdict = "fits"
    if kv_with <= 0 or cap.num_blocks < cap.blocks_per_request or cap.tokens < L:
        verdict = "refuse"
        if kv_with <= 0:
            reasons.insert(0, f"weights and reserve ({_gib(target_w + draft_w + reserve)}) leave "
                           f"no KV cache within {_gib(budget)} per device")
        else:
            reasons.insert(0, f"the KV cache holds {cap.tokens:,} tokens, less than one request "
                           f"at max_model_len={L:,}")
    elif explicit is not None and target_w + draft_w + reserve + explicit > total:
        verdict = "refuse"
    else:
        top = max(spec.sweep.concurrency)
        if conc < top:
            verdict = "warn"
            reasons.append(f"holds {conc} requests of {need_len:,} tokens, below the sweep's "
                           f"highest concurrency {top}")
        margin = (cap.tokens - top * need_len) / cap.tokens if cap.tokens else 0.0
        if verdict == "fits" and margin < spec.headroom.warn_margin:
            verdict = "warn"
            reasons.append(f"KV margin at concurrency {top} is {margin:.0%}, under "
                           f"headroom.warn_margin={spec.headroom.warn_margin:.0%}")
        if device_free_bytes is not None and device_free_bytes < budget and verdict == "fits":
            verdict = "warn"

    fixes = _fixes(spec, ec, verdict, arch, target_w, draft_w, reserve, budget, cap,
                   target_layers, draft_layers) if verdict != "fits" else []

    rows = [
        Row("device memory", _gib(total), "probed" if device_total_bytes else f"conf/hardware/"
            f"{hw.name}.yaml"),
        Row("usable (gpu_memory_utilization)" if explicit is None else "KV cache (fixed)",
            _gib(budget if explicit is None else explicit),
            f"x {engine.gpu_memory_utilization:g}" if explicit is None
            else "--kv-cache-memory-bytes"),
        Row("target weights / rank", _gib(target_w),
            f"{arch.num_params / 1e9:,.2f}B params, {t.quantization or t.dtype}, TP={tp}"),
        Row("draft weights / rank", _gib(draft_w), ec.checkpoint or
            ("target's MTP layers" if ec.method == "mtp" else "none")),
        Row("runtime reserve", _gib(reserve), f"activations {_gib(activations)}, CUDA graphs "
            f"{_gib(graphs)}, non-torch {_gib(non_torch)}"),
        Row("KV cache / rank", _gib(max(0, kv_with)), f"without drafter {_gib(max(0, kv_without))}"),
        Row("KV bytes / token (target)", f"{kv_bytes_per_token(target_layers):,}",
            f"{len(target_layers)} layers, kv dtype {kvb} B"),
        Row("KV bytes / token (drafter)", f"{kv_bytes_per_token(draft_layers):,}",
            f"{len(draft_layers)} layers"),
        Row("linear-attention state / sequence",
            _gib(sum(lyr.state_bytes for lyr in target_layers + draft_layers)), "")
        if any(lyr.kind == "linear" for lyr in target_layers) else None,
        Row("KV blocks", f"{cap.num_blocks:,}", f"block_size {block}, {cap.bytes_per_block:,} "
            "B/block"),
        Row("KV token capacity", f"{cap.tokens:,}", f"without drafter {cap0.tokens:,}"),
        Row("KV capacity lost to the drafter", f"{cap0.tokens - cap.tokens:,} tokens",
            f"{(100.0 * (cap0.tokens - cap.tokens) / cap0.tokens) if cap0.tokens else 0:.1f}%"),
        Row(f"max concurrency at max_model_len={L:,}", f"{cap.max_concurrency:.2f}",
            f"without drafter {cap0.max_concurrency:.2f}"),
        Row(f"max concurrency at context {need_len:,}", str(conc),
            f"without drafter {conc0} (context {context:,}; lookahead {slots} slots/request)"),
    ]
    return Headroom(ec.name, verdict, tuple(reasons), tuple(fixes),
                    tuple(r for r in rows if r is not None), total, target_w, draft_w, reserve,
                    kv_with, kv_bytes_per_token(target_layers), kv_bytes_per_token(draft_layers),
                    cap, cap0, conc, conc0, context, slots)


def _fixes(spec: Spec, ec: EngineConfig, verdict: Verdict, arch: Architecture, target_w: int,
           draft_w: int, reserve: int, budget: int, cap: KvCapacity,
           target_layers: list[CacheLayer], draft_layers: list[CacheLayer]) -> list[str]:
    t, hw = spec.target, spec.hardware
    out: list[str] = []
    tp = t.tensor_parallel_size
    for more in (2, 4, 8):
        new_tp = tp * more
        if new_tp > 8:
            break
        need = (target_w * tp) // new_tp + draft_w + reserve
        if need < budget * 0.8:
            where = "" if new_tp <= hw.device_count else f" (needs {new_tp} devices; " \
                    f"hardware.device_count={hw.device_count})"
            out.append(f"more tensor parallelism: target.tensor_parallel_size={new_tp}{where}")
            break
    if t.quantization is None and target_w > budget * 0.5:
        out.append("a quantized checkpoint (fp8 halves the weights)")
    if draft_layers and ec.num_speculative_tokens > 1:
        out.append(f"a smaller N than {ec.num_speculative_tokens} (fewer lookahead slots)")
    if draft_layers or draft_w:
        out.append("a method without weights or KV of its own (ngram, suffix)")
    if verdict == "warn" or cap.num_blocks > 0:
        per_token = kv_bytes_per_token(target_layers + draft_layers)
        if per_token and cap.num_blocks:
            fit = cap.num_blocks * cap.block_size // max(1, max(spec.sweep.concurrency))
            if fit < t.max_model_len:
                out.append(f"a lower max_model_len: target.max_model_len={max(16, fit // 16 * 16)}"
                           f" holds {max(spec.sweep.concurrency)} concurrent requests")
    if t.kv_cache_dtype == "auto" and hw.vendor != "cpu":
        out.append("an fp8 KV cache: target.kv_cache_dtype=fp8 (halves KV bytes per token)")
    return out
