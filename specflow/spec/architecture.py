"""A model's architecture as the KV cache sees it, read from a local model directory (its
config.json and safetensors headers) or a Hugging Face cache snapshot. No network."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from specflow.spec import hfcache
from specflow.spec.schema import (
    Architecture,
    FullAttention,
    LayerGroup,
    LinearAttention,
    MultiLatentAttention,
    SlidingWindow,
)

KV_SHARED_MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
"""Drafter config types whose attention reads the target's KV cache (no KV of their own)."""


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg.get("text_config") or cfg


def _typed_layer(t: dict[str, Any], kind: str, count: int, kv: int, head_dim: int
                 ) -> LayerGroup:
    """One group of a `layer_types` list (Gemma sliding/global, Qwen3.5 linear/full)."""
    if kind in ("sliding_attention", "sliding_window"):
        return SlidingWindow(count=count, num_kv_heads=kv, head_dim=head_dim,
                             window=int(t["sliding_window"]))
    if kind == "full_attention":
        return FullAttention(count=count,
                             num_kv_heads=int(t.get("num_global_key_value_heads") or kv),
                             head_dim=int(t.get("global_head_dim") or head_dim))
    if kind == "linear_attention":
        return LinearAttention(
            count=count, num_key_heads=int(t["linear_num_key_heads"]),
            num_value_heads=int(t["linear_num_value_heads"]),
            key_head_dim=int(t["linear_key_head_dim"]),
            value_head_dim=int(t["linear_value_head_dim"]),
            conv_kernel=int(t.get("linear_conv_kernel_dim", 4)))
    raise ValueError(f"layer_types: unknown layer type {kind!r}")


def _layer_groups(t: dict[str, Any]) -> list[LayerGroup]:
    """Attention layers of a text config, grouped by kind: MLA, typed layers, sliding or full."""
    layers_n = int(t["num_hidden_layers"])
    heads = int(t["num_attention_heads"])
    kv = int(t.get("num_key_value_heads") or heads)
    head_dim = int(t.get("head_dim") or int(t["hidden_size"]) // heads)
    types = t.get("layer_types") or []
    if "kv_lora_rank" in t and t.get("kv_lora_rank"):
        return [MultiLatentAttention(count=layers_n, kv_lora_rank=int(t["kv_lora_rank"]),
                                     qk_rope_head_dim=int(t.get("qk_rope_head_dim", 0)))]
    if types:
        return [_typed_layer(t, kind, types.count(kind), kv, head_dim)
                for kind in dict.fromkeys(types)]
    if t.get("sliding_window") and t.get("use_sliding_window", True) and \
            t.get("model_type") not in ("qwen3", "qwen2", "llama"):
        return [SlidingWindow(count=layers_n, num_kv_heads=kv, head_dim=head_dim,
                              window=int(t["sliding_window"]))]
    return [FullAttention(count=layers_n, num_kv_heads=kv, head_dim=head_dim)]


def arch_from_config(cfg: dict[str, Any], num_params: float | None = None) -> Architecture:
    """Architecture facts from a Hugging Face config.json (text models, hybrids, MLA)."""
    t = _text_config(cfg)
    layers_n = int(t["num_hidden_layers"])
    heads = int(t["num_attention_heads"])
    hidden = int(t["hidden_size"])
    groups = _layer_groups(t)
    # A Gemma 4 assistant's layers all read the target's KV (its text_config is gemma4_text)
    assistant = cfg.get("model_type") in KV_SHARED_MODEL_TYPES or \
        t.get("model_type") in KV_SHARED_MODEL_TYPES
    if assistant:
        groups = []
    mtp = int(t.get("num_nextn_predict_layers") or t.get("mtp_num_hidden_layers") or 0)
    vocab = int(t.get("vocab_size") or cfg["vocab_size"])
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
    path = Path(hfcache.local_model(model))
    if (path / "config.json").is_file():
        return path
    snap = hfcache.snapshot(model, revision)
    return snap if snap is not None and (snap / "config.json").is_file() else None


def arch_from_dir(directory: Path) -> Architecture:
    """Architecture of a local model directory (config.json + safetensors headers)."""
    cfg = json.loads((directory / "config.json").read_text())
    params = safetensors_params(directory)
    return arch_from_config(cfg, float(params) if params else None)
