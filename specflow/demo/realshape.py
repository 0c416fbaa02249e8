"""Real-shape, random-weight checkpoints for the GPU check (``bench/gpu_check.sh``).

A GPU sweep needs a target whose memory, step time and KV cache are those of a real model, and
nothing may be downloaded: this builds Llama-3.1-8B's exact shape (32 layers, hidden 4096, GQA 8,
vocabulary 128,256) with seeded random bf16 weights, and its two drafters of the catalog: an
EAGLE-3 head in the layout of ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`` (one layer over three of the
target's hidden states, a 32,000-token draft vocabulary mapped by ``d2t``) and a draft model of
Llama-3.2-1B's shape (16 layers, hidden 2048, tied embeddings). The tokenizer is the tiny models'
byte-level BPE, its vocabulary padded with reserved tokens to 128,256 entries so that every id
the model can sample decodes.

Random weights accept almost no draft; the GPU check asks vLLM for synthetic rejection sampling
(``extra_speculative_config.rejection_sample_method: synthetic``) to accept at chosen rates with
the real compute cost of drafting and verifying.

``layers`` reduces the depth (the CPU-safe part of the check builds one layer of each in CI);
every other dimension stays real. Tensors are generated one at a time (on the GPU when there is
one) and written in shards of at most ``SHARD_BYTES``, so the peak host memory is one shard.

Usage: ``python -m specflow.demo.realshape --root DIR [--layers L] [--device cpu|cuda]``; prints
kind -> directory as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specflow.demo import tiny

__all__ = ["DRAFT", "EAGLE3", "KINDS", "TARGET", "RealShape", "build", "build_all", "main"]

LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
VOCAB = 128256
SHARD_BYTES = 4 << 30
INIT_STD = 0.02
DTYPE = "bfloat16"
RESERVED = "<|reserved_{}|>"


@dataclass(frozen=True)
class RealShape:
    """One Llama-family shape (the fields of its config.json that size it)."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    seed: int
    vocab_size: int = VOCAB
    max_position_embeddings: int = 131072
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5


TARGET = RealShape(32, 4096, 14336, 32, 8, 128, tie_word_embeddings=False, seed=8)
"""meta-llama/Llama-3.1-8B-Instruct's shape."""
DRAFT = RealShape(16, 2048, 8192, 32, 8, 64, tie_word_embeddings=True, seed=1)
"""meta-llama/Llama-3.2-1B-Instruct's shape."""
EAGLE3 = RealShape(1, 4096, 14336, 32, 8, 128, tie_word_embeddings=False, seed=3)
"""yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's shape (one decoder layer)."""
EAGLE3_DRAFT_VOCAB = 32000
KINDS: tuple[str, ...] = ("target", "eagle3", "draft_model")


def _config(shape: RealShape) -> dict[str, Any]:
    """config.json of a LlamaForCausalLM of this shape (token ids of the local tokenizer)."""
    cfg = {k: v for k, v in shape.__dict__.items() if k != "seed"}
    return {**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "rope_scaling": dict(LLAMA3_ROPE), "initializer_range": INIT_STD,
            "torch_dtype": DTYPE, "use_cache": True,
            "bos_token_id": tiny.SPECIAL_TOKENS.index(tiny.BOS),
            "eos_token_id": tiny.SPECIAL_TOKENS.index(tiny.EOS),
            "pad_token_id": tiny.SPECIAL_TOKENS.index(tiny.PAD)}


def _llama_shapes(shape: RealShape) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of LlamaForCausalLM's checkpoint (what vLLM's loader expects)."""
    h, i, kv = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads
    q, kvd = shape.num_attention_heads * shape.head_dim, kv * shape.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h),
                                       "model.norm.weight": (h,)}
    for n in range(shape.num_hidden_layers):
        p = f"model.layers.{n}."
        out.update({p + "input_layernorm.weight": (h,),
                    p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kvd, h),
                    p + "self_attn.v_proj.weight": (kvd, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)})
    if not shape.tie_word_embeddings:
        out["lm_head.weight"] = (shape.vocab_size, h)
    return out


def _eagle3_shapes(shape: RealShape) -> dict[str, tuple[int, ...]]:
    """The EAGLE-3 head: one layer attending over [embeds, hidden] (2h wide), fc over 3 states."""
    h, i, kv = shape.hidden_size, shape.intermediate_size, shape.num_key_value_heads
    q, kvd = shape.num_attention_heads * shape.head_dim, kv * shape.head_dim
    return {"midlayer.input_layernorm.weight": (h,), "midlayer.hidden_norm.weight": (h,),
            "midlayer.post_attention_layernorm.weight": (h,),
            "midlayer.self_attn.q_proj.weight": (q, 2 * h),
            "midlayer.self_attn.k_proj.weight": (kvd, 2 * h),
            "midlayer.self_attn.v_proj.weight": (kvd, 2 * h),
            "midlayer.self_attn.o_proj.weight": (h, q),
            "midlayer.mlp.gate_proj.weight": (i, h), "midlayer.mlp.up_proj.weight": (i, h),
            "midlayer.mlp.down_proj.weight": (h, i), "norm.weight": (h,),
            "fc.weight": (h, 3 * h), "lm_head.weight": (EAGLE3_DRAFT_VOCAB, h)}
    # no embed_tokens: vLLM shares the target's


def _aux_layers(target_layers: int) -> list[int]:
    """EAGLE-3's default taps (vLLM: 2, L/2, L-3), kept inside a reduced-depth target."""
    return sorted({min(x, target_layers - 1) for x in (2, target_layers // 2, target_layers - 3)
                   if x >= 0} or {0})


def _tensors(shapes: dict[str, tuple[int, ...]], seed: int, device: str) -> Iterator[
        tuple[str, Any]]:
    """Seeded tensors in name order: norms ones, matrices N(0, INIT_STD^2), bf16 on the CPU."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    eos = tiny.SPECIAL_TOKENS.index(tiny.EOS)
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.bfloat16, device=device)
            t.normal_(0.0, INIT_STD, generator=gen)
            if name in ("lm_head.weight", "model.embed_tokens.weight") and shape[0] > eos:
                t[eos] = 0.0  # the EOS logit stays 0: random outputs run to max_tokens
            t = t.cpu()
        yield name, t


def _write_shards(tensors: Iterator[tuple[str, Any]], out: Path) -> int:
    """Safetensors shards of <= SHARD_BYTES plus model.safetensors.index.json; total bytes."""
    from safetensors.torch import save_file

    shards: list[dict[str, Any]] = [{}]
    size = total = 0
    names: list[list[str]] = [[]]
    tmp_files: list[Path] = []

    def flush() -> None:
        path = out / f"shard-{len(tmp_files):05d}.safetensors"
        save_file(shards[-1], str(path), metadata={"format": "pt"})
        tmp_files.append(path)

    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            flush()
            shards[-1] = {}
            names.append([])
            size = 0
        shards[-1][name] = t.contiguous()
        names[-1].append(name)
        size += nbytes
        total += nbytes
    flush()
    count = len(tmp_files)
    weight_map = {}
    for k, (path, members) in enumerate(zip(tmp_files, names, strict=True)):
        final = out / (f"model-{k + 1:05d}-of-{count:05d}.safetensors" if count > 1
                       else "model.safetensors")
        path.rename(final)
        weight_map.update({n: final.name for n in members})
    if count > 1:
        tiny.write_json(out / "model.safetensors.index.json",
                         {"metadata": {"total_size": total}, "weight_map": weight_map})
    return total


def _write_tokenizer(out: Path) -> None:
    """The tiny byte-level BPE with its vocabulary padded to VOCAB by reserved tokens."""
    tiny.write_tokenizer(out)
    doc = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = doc["model"]["vocab"]
    for i in range(len(vocab), VOCAB):
        vocab[RESERVED.format(i)] = i
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["model_max_length"] = TARGET.max_position_embeddings
    tiny.write_json(out / "tokenizer_config.json", cfg)


def _write_kind(kind: str, out: Path, layers: int | None, device: str) -> None:
    target = replace(TARGET, num_hidden_layers=layers or TARGET.num_hidden_layers)
    if kind == "eagle3":
        cfg = _config(EAGLE3)
        cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=EAGLE3_DRAFT_VOCAB,
                   target_hidden_size=target.hidden_size,
                   eagle_aux_hidden_state_layer_ids=_aux_layers(target.num_hidden_layers))
        shapes = _eagle3_shapes(EAGLE3)
        extra = _d2t()
    else:
        shape = target if kind == "target" else replace(
            DRAFT, num_hidden_layers=layers or DRAFT.num_hidden_layers)
        cfg, shapes, extra = _config(shape), _llama_shapes(shape), {}
    seed = {"target": TARGET.seed, "eagle3": EAGLE3.seed, "draft_model": DRAFT.seed}[kind]
    _write_shards(_chain(_tensors(shapes, seed, device), extra), out)
    tiny.write_json(out / "config.json", cfg)
    _write_tokenizer(out)


def _d2t() -> dict[str, Any]:
    """EAGLE-3's draft-to-target offsets: draft id d is target id d + d2t[d] (here the first
    EAGLE3_DRAFT_VOCAB ids, offsets 0)."""
    import torch

    return {"d2t": torch.zeros(EAGLE3_DRAFT_VOCAB, dtype=torch.long)}


def _chain(tensors: Iterator[tuple[str, Any]], extra: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    yield from tensors
    yield from sorted(extra.items())


def build(kind: str, root: Path, layers: int | None = None, device: str | None = None) -> Path:
    """Build ``kind`` (target, eagle3, draft_model) under ``root``; a finished build is reused.

    ``root/<kind>`` is the stable name conf/ refers to; it points at ``<kind>-L<layers>``, built
    in a temporary sibling and renamed into place (a killed build leaves no half directory).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    root = Path(root)
    depth = layers or TARGET.num_hidden_layers
    final = root / f"{kind}-L{depth}"
    if not (final / "config.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            _write_kind(kind, tmp, layers, device or _default_device())
            for path in tmp.iterdir():
                path.chmod(0o644)
            tmp.chmod(0o755)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    tiny.link_or_copy(root / kind, final)
    return final


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_all(root: Path, layers: int | None = None, device: str | None = None
              ) -> dict[str, Path]:
    """Every kind under ``root``; kind -> directory."""
    return {kind: build(kind, root, layers, device) for kind in KINDS}


def main(argv: list[str] | None = None) -> int:
    """CLI: build the real-shape models under --root and print kind -> path as JSON."""
    parser = argparse.ArgumentParser(prog="python -m specflow.demo.realshape",
                                     description=main.__doc__)
    parser.add_argument("--root", type=Path, required=True, help="output directory")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers of the target and the draft model (default: real)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="where random weights are drawn (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    paths = build_all(args.root, args.layers, args.device)
    print(json.dumps({k: str(p.resolve()) for k, p in paths.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
