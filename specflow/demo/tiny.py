"""Offline builders of tiny Llama models for tests and the CPU demo.

Every kind is built in seconds from seeded random weights and a byte-level BPE
tokenizer trained on local Python stdlib sources; nothing is downloaded.  A model
directory is ``<root>/<kind>-<hash12>``, where the hash covers the whole builder
spec (sizes, seeds, noise scale, tokenizer corpus digest and BUILDER_VERSION), so a
directory that exists is a finished, cached build.

Kinds:

* ``target``: random Llama (4 layers, hidden 128, head_dim 32, vocab 2048).
* ``draft_copy``: an exact copy of the target; every greedy draft is accepted.
* ``draft_random``: an unrelated 1-layer random Llama; acceptance about 0.
* ``draft_derived``: the target plus seeded Gaussian noise on its matrices; partial
  agreement with the target (greedy acceptance strictly between 0 and 1).
* ``draft_derived_far``: the same with noise as large as the matrices themselves: a later
  revision of the derived drafter that agrees with the target on almost nothing (the
  comparison tests replace the copy with it).
* ``eagle3``: a random EAGLE-3 head (``LlamaForCausalLMEagle3``) reading the target's
  hidden states after layers 1, 2 and 3.

Seed-method families (vLLM's ``mtp`` and ``dflash`` methods), each as an *agreeing* build
whose drafter predicts exactly what the target produces and a ``_random`` build:

* ``mimo_mtp1`` / ``mimo_mtp2`` (and ``_random``): a MiMo-style Qwen2 target
  (``MiMoForCausalLM``) carrying 1 or 2 native MTP layers (``model.mtp_layers.*``).
* ``gemma4`` (and ``_random``): a Gemma 4 text target, two sliding-window layers and one
  full-attention layer; ``gemma4_assistant`` (and ``_random``): its Gemma 4 assistant
  drafter (Q-only layers reading the target's KV cache).
* ``qwen3`` (and ``_random``): a 4-layer Qwen3 target; ``qwen3_dflash`` (and
  ``_random``): a one-layer DFlash block drafter reading the target's hidden states after
  its layers 1 and 2.

An agreeing target's next token depends only on the current one: tokens lie on orbits of a
rotation R of embedding space (``E[f(t)] = R E[t]``), its attention and MLP outputs are zero
and its LM head is ``R^-1 E``, so greedy decoding walks the orbit.  Its drafters compute the
same walk: the MTP layer and the assistant pass the token embedding through to the shared
head; the DFlash layer copies the block's first token into mask slot ``i`` through an
attention head whose rotary phase selects offset ``i`` and whose values apply ``R^(i-1)``.

The end-of-sequence token's output-embedding row is zero in every model, so its logit
is exactly 0 while the 2047 others are spread around it: greedy decoding from random
weights practically never stops early.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["BUILDER_VERSION", "DEFAULT_ROOT", "KINDS", "SEED_KINDS", "build", "build_all", "main",
           "spec_hash"]


BUILDER_VERSION = 1


@dataclass(frozen=True)
class SeedKind:
    """One seed-method build: which family, target or drafter, agreeing or random."""

    family: str  # "mimo", "gemma4" or "qwen3"
    drafter: bool
    agreeing: bool
    mtp_layers: int = 0  # native MTP layers (MiMo targets)


SEED = {
    "mimo_mtp1": SeedKind("mimo", False, True, 1),
    "mimo_mtp2": SeedKind("mimo", False, True, 2),
    "mimo_mtp1_random": SeedKind("mimo", False, False, 1),
    "mimo_mtp2_random": SeedKind("mimo", False, False, 2),
    "gemma4": SeedKind("gemma4", False, True),
    "gemma4_assistant": SeedKind("gemma4", True, True),
    "gemma4_random": SeedKind("gemma4", False, False),
    "gemma4_assistant_random": SeedKind("gemma4", True, False),
    "qwen3": SeedKind("qwen3", False, True),
    "qwen3_dflash": SeedKind("qwen3", True, True),
    "qwen3_random": SeedKind("qwen3", False, False),
    "qwen3_dflash_random": SeedKind("qwen3", True, False),
}
"""The seed-method kinds (native MTP, Gemma 4 MTP, DFlash) and how each is built."""


SEED_KINDS: tuple[str, ...] = tuple(SEED)


KINDS: tuple[str, ...] = (
    "target", "draft_copy", "draft_random", "draft_derived", "draft_derived_far", "eagle3",
    *SEED_KINDS)


DEFAULT_ROOT = Path(".specflow/models")


# Special tokens take ids 0..3 in this order.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)


CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# Stdlib sources the tokenizer is trained on (missing ones are skipped; the digest
# of what was read is part of every model's hash).
CORPUS_FILES: tuple[str, ...] = (
    "argparse.py", "ast.py", "collections/__init__.py", "dataclasses.py",
    "difflib.py", "email/message.py", "functools.py", "inspect.py",
    "json/decoder.py", "json/encoder.py", "logging/__init__.py", "pathlib.py",
    "pydoc.py", "subprocess.py", "textwrap.py", "typing.py",
)


@dataclass(frozen=True)
class LlamaSpec:
    """Shape and seed of one random Llama."""

    num_hidden_layers: int = 4
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # CPU attention supports 32, 64, 80, 96, 112, 128, ...
    vocab_size: int = 2048
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    init_std: float = 0.1  # large enough that logits are not near-flat
    seed: int = 0


@dataclass(frozen=True)
class TokenizerSpec:
    """Byte-level BPE trained on the CORPUS_FILES of the local stdlib."""

    vocab_size: int = 2048
    min_frequency: int = 2
    model_max_length: int = 2048


TARGET = LlamaSpec(seed=1234)


DRAFT_RANDOM = replace(TARGET, num_hidden_layers=1, seed=4321)


DERIVED_NOISE_SEED = 777


DERIVED_NOISE_SCALE = 0.03  # noise std relative to each matrix's std (~64% greedy agreement)


DERIVED_FAR_NOISE_SCALE = 1.0  # noise as large as each matrix: almost no agreement


EAGLE3_SEED = 99


EAGLE3_AUX_LAYER_IDS: tuple[int, ...] = (1, 2, 3)  # hidden states after layers 0, 1, 2


TOKENIZER = TokenizerSpec()


STALE_TMP_SECONDS = 600  # temp dirs of killed builds older than this are removed


DTYPE = "float32"  # served with --dtype float32: fewer greedy near-ties than bf16


@dataclass(frozen=True)
class AgreeSpec:
    """Geometry shared by an agreeing target and its drafter.

    Dimension 0 of every embedding flags a real token, dimension 1 flags the DFlash mask
    token, the other dimensions form planes that R rotates by ``2 pi k_p / period``.
    """

    period: int = 28  # tokens per orbit; 2044 non-special tokens = 73 orbits
    flag: float = 0.5  # height of the token/mask flags next to a unit-norm content part
    seed: int = 2024
    min_margin: float = 0.3  # the builder refuses a geometry whose greedy choice is closer
    draft_gain: float = 140.0  # DFlash q-norm gain: attention logits ~ +100 / -280
    draft_lobe: float = 0.5  # radians: half-width of the DFlash head's offset selector


AGREE = AgreeSpec()


MIMO = replace(TARGET, num_hidden_layers=2, rms_norm_eps=1e-6, seed=3101)


GEMMA4 = replace(TARGET, num_hidden_layers=3, rms_norm_eps=1e-6, seed=3201)


GEMMA4_LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention")


GEMMA4_WINDOW = 64


GEMMA4_ASSISTANT = replace(GEMMA4, num_hidden_layers=2, seed=3202)


GEMMA4_ASSISTANT_LAYER_TYPES = ("sliding_attention", "full_attention")


QWEN3 = replace(TARGET, num_hidden_layers=4, rms_norm_eps=1e-6, rope_theta=1e6, seed=3301)


# One head per mask slot (N <= 4), each wide enough to carry a whole embedding.
DFLASH = replace(QWEN3, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                 head_dim=128, seed=3302)


DFLASH_TARGET_LAYER_IDS: tuple[int, ...] = (1, 2)  # vLLM adds 1: after layers 1 and 2


DFLASH_MASK_TOKEN_ID = SPECIAL_TOKENS.index(PAD)  # never in a prompt, never generated


def _corpus_paths() -> dict[str, Path]:
    """CORPUS_FILES present in this interpreter's stdlib, by relative name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return {rel: stdlib / rel for rel in CORPUS_FILES if (stdlib / rel).is_file()}


@functools.cache
def _corpus_digest() -> str:
    digest = hashlib.sha256()
    for rel, path in _corpus_paths().items():
        digest.update(rel.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _spec(kind: str) -> dict[str, Any]:
    """Everything that determines the bytes of ``kind``'s directory."""
    if kind not in KINDS:
        raise ValueError(f"unknown tiny model kind {kind!r}; expected one of {KINDS}")
    spec: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "kind": kind,
        "dtype": DTYPE,
        "tokenizer": asdict(TOKENIZER),
        "corpus_sha256": _corpus_digest(),
    }
    if kind in SEED:
        spec["seed_model"] = _seed_spec(SEED[kind])
        return spec
    spec["target"] = asdict(TARGET)
    if kind == "draft_random":
        spec["draft"] = asdict(DRAFT_RANDOM)
    elif kind == "draft_derived":
        spec["noise"] = {"seed": DERIVED_NOISE_SEED, "scale": DERIVED_NOISE_SCALE}
    elif kind == "draft_derived_far":
        spec["noise"] = {"seed": DERIVED_NOISE_SEED, "scale": DERIVED_FAR_NOISE_SCALE}
    elif kind == "eagle3":
        spec["eagle3"] = {"seed": EAGLE3_SEED, "aux_layer_ids": list(EAGLE3_AUX_LAYER_IDS)}
    return spec


def _seed_spec(k: SeedKind) -> dict[str, Any]:
    """Builder inputs of a seed-method kind (a drafter's include its target's)."""
    target = {"mimo": MIMO, "gemma4": GEMMA4, "qwen3": QWEN3}[k.family]
    out: dict[str, Any] = {**asdict(k), "target": asdict(target)}
    if k.agreeing:
        out["agree"] = asdict(AGREE)
    if k.family == "gemma4":
        out["gemma4"] = {"layer_types": list(GEMMA4_LAYER_TYPES), "window": GEMMA4_WINDOW}
        if k.drafter:
            out["draft"] = asdict(GEMMA4_ASSISTANT)
            out["draft_layer_types"] = list(GEMMA4_ASSISTANT_LAYER_TYPES)
    if k.family == "qwen3" and k.drafter:
        out["draft"] = asdict(DFLASH)
        out["dflash"] = {"target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
                         "mask_token_id": DFLASH_MASK_TOKEN_ID}
    return out


def spec_hash(kind: str) -> str:
    """The 12-hex-digit content hash that names ``kind``'s directory."""
    blob = json.dumps(_spec(kind), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


@functools.cache
def _tokenizer_json() -> str:
    """Train the byte-level BPE tokenizer once per process (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER.vocab_size,
        min_frequency=TOKENIZER.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in _corpus_paths().values()]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.get_vocab_size() != TOKENIZER.vocab_size:
        raise RuntimeError(
            f"tokenizer has {tok.get_vocab_size()} tokens, expected {TOKENIZER.vocab_size}:"
            " the local corpus is too small"
        )
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i
    return tok.to_str()


def write_tokenizer(out: Path) -> None:
    (out / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": TOKENIZER.model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "tokenizer_config.json", config)
    write_json(out / "special_tokens_map.json",
                {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK})


def _llama_config(spec: LlamaSpec) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        initializer_range=spec.init_std,
        tie_word_embeddings=False,
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        architectures=["LlamaForCausalLM"],
        dtype=DTYPE,
    )


def random_tensors(shapes: dict[str, tuple[int, ...]], std: float, seed: int) -> dict[str, Any]:
    """Seeded weights in sorted-name order: norms are ones, matrices N(0, std^2).

    Filled with an explicit generator so the bytes do not depend on how the installed
    transformers version initialises modules.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.randn(shape, generator=gen) * std
    lm_head = out.get("lm_head.weight")
    if lm_head is not None:
        lm_head[SPECIAL_TOKENS.index(EOS)] = 0.0  # EOS logit is exactly 0: rarely the max
    return out


def _random_llama(spec: LlamaSpec) -> Any:
    """A LlamaForCausalLM with seeded random weights."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_llama_config(spec))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(random_tensors(shapes, spec.init_std, spec.seed))
    return model.eval()


def _derived_from(target: Any, scale: float = DERIVED_NOISE_SCALE) -> Any:
    """The target plus seeded noise on every matrix (`scale` x its std; norms kept): partial
    agreement."""
    import torch

    gen = torch.Generator().manual_seed(DERIVED_NOISE_SEED)
    state = target.state_dict()
    with torch.no_grad():
        for name in sorted(state):
            t = state[name]
            if t.dim() < 2:
                continue
            noise = torch.randn(t.shape, generator=gen) * (scale * t.std())
            if name == "lm_head.weight":
                noise[SPECIAL_TOKENS.index(EOS)] = 0.0
            t.add_(noise)
    return target


def _save_llama(model: Any, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    write_tokenizer(out)


def _save_eagle3(out: Path) -> None:
    """A random EAGLE-3 head in the HF checkpoint layout vLLM's llama_eagle3 loads."""
    import torch
    from safetensors.torch import save_file

    t = TARGET
    h, q, kv = t.hidden_size, t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    shapes = {
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        # The first (only) EAGLE-3 layer attends over [embeds, hidden] (2h wide).
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (t.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (t.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, t.intermediate_size),
        "norm.weight": (h,),
        "fc.weight": (h, h * len(EAGLE3_AUX_LAYER_IDS)),
        "lm_head.weight": (t.vocab_size, h),
    }  # no embed_tokens: vLLM shares the target's
    tensors = random_tensors(shapes, t.init_std, EAGLE3_SEED)
    dtype = getattr(torch, DTYPE)
    save_file({k: v.to(dtype).contiguous() for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    config = _llama_config(replace(t, num_hidden_layers=1))
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.draft_vocab_size = t.vocab_size
    config.target_hidden_size = h
    config.eagle_aux_hidden_state_layer_ids = list(EAGLE3_AUX_LAYER_IDS)
    config.save_pretrained(out)
    write_tokenizer(out)


def _write_kind(kind: str, out: Path) -> None:
    if kind in SEED:
        from specflow.demo.seed_models import write_seed  # imports this module's parts

        write_seed(SEED[kind], out)
        return
    if kind == "eagle3":
        _save_eagle3(out)
        return
    import torch

    with torch.no_grad():
        if kind in ("target", "draft_copy"):
            model = _random_llama(TARGET)
        elif kind == "draft_random":
            model = _random_llama(DRAFT_RANDOM)
        elif kind == "draft_derived_far":
            model = _derived_from(_random_llama(TARGET), DERIVED_FAR_NOISE_SCALE)
        else:
            model = _derived_from(_random_llama(TARGET))
    _save_llama(model, out)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(kind: str, root: Path) -> Path:
    """Build ``kind`` under ``root`` (or return the cached build) and return its directory.

    The directory is built in a temporary sibling and renamed into place, so a killed
    build leaves no half directory under the final name.
    """
    root = Path(root)
    final = root / f"{kind}-{spec_hash(kind)}"
    if final.is_dir():
        link_or_copy(root / kind, final)
        return final
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        _write_kind(kind, tmp)
        write_json(tmp / "specflow_tiny.json", _spec(kind))
        for path in tmp.iterdir():  # mkdtemp and safetensors create owner-only files
            path.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a concurrent builder winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    link_or_copy(root / kind, final)
    return final


def link_or_copy(link: Path, final: Path) -> None:
    """Point the stable name conf/ uses (``root/<kind>``) at the current build, atomically."""
    if link.is_symlink() and os.readlink(link) == final.name:
        return
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(final.name)
    os.replace(tmp, link)


def _remove_stale_tmp(root: Path, name: str) -> None:
    """Remove temp dirs that builds of ``name`` killed long ago left behind."""
    cutoff = time.time() - STALE_TMP_SECONDS
    for tmp in root.glob(f".{name}.tmp-*"):
        try:
            if tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)
        except FileNotFoundError:
            pass


def build_all(root: Path) -> dict[str, Path]:
    """Build every kind in KINDS under ``root``; returns kind -> directory."""
    return {kind: build(kind, root) for kind in KINDS}


def main(argv: list[str] | None = None) -> int:
    """CLI: build all tiny models under ``--root`` and print kind -> path as JSON."""
    parser = argparse.ArgumentParser(prog="specflow build-models", description=main.__doc__)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help=f"model cache directory (default: {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    paths = build_all(args.root)
    print(json.dumps({k: str(p.resolve()) for k, p in paths.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
