"""The KV cache as vLLM 0.32 accounts it (v1/core/kv_cache_utils.py): per-layer pages of
`block_size` tokens, layers grouped by kind (uniform type -> one group; hybrid -> groups of equal
size with pages unified), `num_blocks = kv_bytes // bytes_per_block`, and the reported token
capacity `int(num_blocks / blocks_per_request(max_model_len) * max_model_len)`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from specflow.spec.schema import (
    Architecture,
    FullAttention,
    LinearAttention,
    MultiLatentAttention,
    SlidingWindow,
)


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
        return KvCapacity(block_size=block_size, num_blocks=0, bytes_per_block=0, tokens=0,
                          max_concurrency=math.inf, blocks_per_request=0)
    bytes_per_block, groups = _groups(layers, block_size)
    num_blocks = max(0, kv_cache_bytes) // bytes_per_block
    per_request = sum(_blocks(s, length or max_model_len, max_model_len, in_flight_tokens)
                      for s, _ in groups)
    concurrency = num_blocks / per_request if per_request else math.inf
    return KvCapacity(block_size=block_size, num_blocks=num_blocks,
                      bytes_per_block=bytes_per_block, tokens=int(concurrency * max_model_len),
                      max_concurrency=concurrency, blocks_per_request=per_request)
