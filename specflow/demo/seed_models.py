"""Weights and configs of the seed-method builds (MiMo MTP, Gemma 4 and its assistant, Qwen3
and its DFlash drafter): the agreeing geometry of `specflow.demo.tiny` and the random builds."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specflow.demo.tiny import (
    AGREE,
    BOS,
    DFLASH,
    DFLASH_MASK_TOKEN_ID,
    DFLASH_TARGET_LAYER_IDS,
    DTYPE,
    EOS,
    GEMMA4,
    GEMMA4_ASSISTANT,
    GEMMA4_ASSISTANT_LAYER_TYPES,
    GEMMA4_LAYER_TYPES,
    GEMMA4_WINDOW,
    MIMO,
    PAD,
    QWEN3,
    SPECIAL_TOKENS,
    UNK,
    LlamaSpec,
    SeedKind,
    random_tensors,
    write_tokenizer,
)


@dataclass(frozen=True)
class _Geometry:
    """Embeddings and LM head of an agreeing target (float32 tensors)."""

    embed: Any
    """(vocab, hidden): orbit tokens E[t] with E[f(t)] = R E[t]; the mask token is a flag."""
    head: Any
    """(vocab, hidden): row j is R^-1 E[j], so argmax head . E[t] = f(t); special rows 0."""
    rotation: Any
    """(hidden, hidden): R, the identity on the two flag dimensions."""
    next_token: Any
    """(vocab,): f(t) for tokens on an orbit, -1 for the special tokens."""


@functools.cache
def _geometry(hidden: int, vocab: int) -> _Geometry:
    """Orbits of a seeded rotation; refuses a draw whose greedy choices are near-ties."""
    import math

    import torch

    a = AGREE
    planes = (hidden - 2) // 2
    gen = torch.Generator().manual_seed(a.seed)
    units = [k for k in range(1, a.period) if math.gcd(k, a.period) == 1]
    steps = torch.tensor(units)[torch.randint(len(units), (planes,), generator=gen)]
    rot = torch.eye(hidden, dtype=torch.float64)
    for p, k in enumerate(steps.tolist()):
        c, s = math.cos(2 * math.pi * k / a.period), math.sin(2 * math.pi * k / a.period)
        i = 2 + 2 * p
        rot[i, i], rot[i, i + 1], rot[i + 1, i], rot[i + 1, i + 1] = c, -s, s, c

    def point() -> Any:
        """A real token's embedding: the flag plus unit-norm content of random phases."""
        phases = torch.rand(planes, generator=gen, dtype=torch.float64) * 2 * math.pi
        x = torch.zeros(hidden, dtype=torch.float64)
        x[0] = a.flag
        x[2:2 + 2 * planes:2] = torch.cos(phases) / math.sqrt(planes)
        x[3:3 + 2 * planes:2] = torch.sin(phases) / math.sqrt(planes)
        return x

    n_special = len(SPECIAL_TOKENS)
    ids = (n_special + torch.randperm(vocab - n_special, generator=gen)).tolist()
    if len(ids) % a.period:
        raise ValueError(f"{len(ids)} tokens do not split into orbits of {a.period}")
    embed = torch.zeros(vocab, hidden, dtype=torch.float64)
    nxt = torch.full((vocab,), -1, dtype=torch.long)
    for start in range(0, len(ids), a.period):
        orbit, x = ids[start:start + a.period], point()
        for k, t in enumerate(orbit):
            embed[t], nxt[t] = x, orbit[(k + 1) % a.period]
            x = rot @ x
    for t in (BOS, EOS, UNK):
        embed[SPECIAL_TOKENS.index(t)] = point()
    embed[DFLASH_MASK_TOKEN_ID, 1] = a.flag
    head = embed @ rot  # row j: (R^T E[j]^T)^T = (R^-1 E[j])^T
    head[:n_special] = 0.0

    # The greedy choice of every orbit token, on the content dimensions alone (the DFlash
    # mask slots carry no token flag): the right token must win by min_margin.
    on_orbit = nxt >= 0
    scores = (embed[on_orbit, 2:] @ head[:, 2:].T).clone()
    rows = torch.arange(int(on_orbit.sum()))
    right = scores[rows, nxt[on_orbit]]
    scores[rows, nxt[on_orbit]] = -math.inf
    margin = float((right - scores.max(dim=1).values).min())
    if margin < a.min_margin:
        raise ValueError(f"agreeing geometry margin {margin:.3f} < {a.min_margin}; change the seed")
    return _Geometry(embed.float(), head.float(), rot.float(), nxt)


def _shapes(model_cls: Any, config: Any) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a transformers model class, without allocating it."""
    import torch

    with torch.device("meta"):
        model = model_cls(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _common_config(spec: LlamaSpec) -> dict[str, Any]:
    return {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads, "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps, "initializer_range": spec.init_std,
        "tie_word_embeddings": False, "pad_token_id": SPECIAL_TOKENS.index(PAD),
        "bos_token_id": SPECIAL_TOKENS.index(BOS), "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "dtype": DTYPE,
    }


def _rope(theta: float) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta}


def _silence_outputs(tensors: dict[str, Any]) -> None:
    """Zero every attention and MLP output projection: each block adds nothing."""
    for name, t in tensors.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            t.zero_()


def _agreeing_target(tensors: dict[str, Any], spec: LlamaSpec) -> None:
    """Embeddings and head of the orbit walk; the layers pass the embedding through."""
    geo = _geometry(spec.hidden_size, spec.vocab_size)
    tensors["model.embed_tokens.weight"] = geo.embed.clone()
    tensors["lm_head.weight"] = geo.head.clone()
    _silence_outputs(tensors)


def _mimo(k: SeedKind) -> tuple[dict[str, Any], Any]:
    """A MiMo-style Qwen2 target with ``k.mtp_layers`` native MTP layers."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec, h = MIMO, MIMO.hidden_size
    config = Qwen2Config(**_common_config(spec), rope_parameters=_rope(spec.rope_theta),
                         use_sliding_window=False, architectures=["MiMoForCausalLM"],
                         num_nextn_predict_layers=k.mtp_layers)
    shapes = _shapes(Qwen2ForCausalLM, config)
    block = {n.removeprefix("model.layers.0."): v for n, v in shapes.items()
             if n.startswith("model.layers.0.")}
    for i in range(k.mtp_layers):  # an ordinary decoder block plus MiMo's MTP head parts
        pre = f"model.mtp_layers.{i}."
        shapes.update({pre + n: v for n, v in block.items()})
        shapes.update({pre + "token_layernorm.weight": (h,), pre + "hidden_layernorm.weight": (h,),
                       pre + "final_layernorm.weight": (h,), pre + "input_proj.weight": (h, 2 * h)})
    tensors = random_tensors(shapes, spec.init_std, spec.seed)
    if k.agreeing:
        _agreeing_target(tensors, spec)
        for i in range(k.mtp_layers):
            # input_proj reads [hidden, token embedding]: keep the token, drop the hidden state
            proj = torch.zeros(h, 2 * h)
            proj[:, h:] = torch.eye(h)
            tensors[f"model.mtp_layers.{i}.input_proj.weight"] = proj
    return tensors, config


def _gemma4_text_config(spec: LlamaSpec, layer_types: Sequence[str]) -> Any:
    from transformers import Gemma4TextConfig

    # head_dim == global_head_dim: mixed head sizes force the Triton backend (absent on CPU)
    return Gemma4TextConfig(**_common_config(spec), global_head_dim=spec.head_dim,
                            num_global_key_value_heads=spec.num_key_value_heads,
                            layer_types=list(layer_types), sliding_window=GEMMA4_WINDOW,
                            hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                            architectures=["Gemma4ForCausalLM"])


def _ones_layer_scalars(tensors: dict[str, Any]) -> None:
    for name, t in tensors.items():
        if name.endswith("layer_scalar"):
            t.fill_(1.0)


def _gemma4(k: SeedKind) -> tuple[dict[str, Any], Any]:
    """A Gemma 4 text target (untied head, sliding and full layers of one head size)."""
    from transformers import Gemma4ForCausalLM

    config = _gemma4_text_config(GEMMA4, GEMMA4_LAYER_TYPES)
    tensors = random_tensors(_shapes(Gemma4ForCausalLM, config), GEMMA4.init_std, GEMMA4.seed)
    _ones_layer_scalars(tensors)
    if k.agreeing:
        _agreeing_target(tensors, GEMMA4)
    return tensors, config


def _gemma4_assistant(k: SeedKind) -> tuple[dict[str, Any], Any]:
    """The Gemma 4 assistant: Q-only layers on the target's KV, its own tied head."""
    import torch
    from transformers.models.gemma4_assistant import (
        Gemma4AssistantConfig,
        Gemma4AssistantForCausalLM,
    )

    spec, h = GEMMA4_ASSISTANT, GEMMA4_ASSISTANT.hidden_size
    text = _gemma4_text_config(spec, GEMMA4_ASSISTANT_LAYER_TYPES)
    text.architectures = None
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=GEMMA4.hidden_size,
                                   use_ordered_embeddings=False, tie_word_embeddings=True,
                                   architectures=["Gemma4AssistantForCausalLM"], dtype=DTYPE)
    shapes = _shapes(Gemma4AssistantForCausalLM, config)
    del shapes["lm_head.weight"]  # tied to model.embed_tokens
    tensors = random_tensors(shapes, spec.init_std, spec.seed)
    _ones_layer_scalars(tensors)
    if k.agreeing:
        # The draft-dim table is the assistant's head; vLLM swaps in the target's embedding
        # for the inputs.  pre_projection reads [token embedding, target hidden].
        tensors["model.embed_tokens.weight"] = _geometry(h, spec.vocab_size).head.clone()
        proj = torch.zeros(h, h + GEMMA4.hidden_size)
        proj[:, :h] = torch.eye(h)
        tensors["pre_projection.weight"] = proj
        _silence_outputs(tensors)
    return tensors, config


def _qwen3(k: SeedKind) -> tuple[dict[str, Any], Any]:
    """A Qwen3 target for the DFlash drafter."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**_common_config(QWEN3), rope_parameters=_rope(QWEN3.rope_theta),
                         architectures=["Qwen3ForCausalLM"])
    tensors = random_tensors(_shapes(Qwen3ForCausalLM, config), QWEN3.init_std, QWEN3.seed)
    if k.agreeing:
        _agreeing_target(tensors, QWEN3)
    return tensors, config


def _dflash(k: SeedKind) -> tuple[dict[str, Any], Any]:
    """A one-layer DFlash drafter for the Qwen3 target (embeddings and head are the target's)."""
    import math

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec, h = DFLASH, DFLASH.hidden_size
    config = Qwen3Config(**_common_config(spec), rope_parameters=_rope(spec.rope_theta),
                         architectures=["DFlashDraftModel"],
                         dflash_config={"mask_token_id": DFLASH_MASK_TOKEN_ID,
                                        "target_layer_ids": list(DFLASH_TARGET_LAYER_IDS)})
    shapes = {n.removeprefix("model."): v for n, v in _shapes(Qwen3ForCausalLM, config).items()
              if n.startswith(("model.layers.", "model.norm."))}
    shapes["hidden_norm.weight"] = (h,)
    shapes["fc.weight"] = (h, QWEN3.hidden_size * len(DFLASH_TARGET_LAYER_IDS))
    tensors = random_tensors(shapes, spec.init_std, spec.seed)
    if not k.agreeing:
        return tensors, config

    # Mask slot j (query offset j = 1..4 from the block's first token b) must yield f^j(b):
    # head j-1 attends only to b, and only at offset j, and its values apply R^(j-1), so the
    # slot holds R^(j-1) E[b] and the target's head (R^-1 E) picks f^j(b).  Keys come from
    # the token flag, queries from the mask flag; the context (fc = 0) has zero keys/values.
    a, d, heads = AGREE, spec.head_dim, spec.num_attention_heads
    rot = _geometry(h, spec.vocab_size).rotation
    half, slow = d // 2, d // 2 - 1  # rotary pair 0 turns 1 rad/token, the last pair ~0
    q, kk = torch.zeros(heads * d, h), torch.zeros(heads * d, h)
    v, o = torch.zeros(heads * d, h), torch.zeros(h, heads * d)
    content = torch.arange(2, h)
    lobe = math.cos(a.draft_lobe)
    for i in range(heads):  # head i serves offset i + 1
        q[i * d, 1], q[i * d + half, 1] = math.cos(-(i + 1)), math.sin(-(i + 1))
        q[i * d + slow, 1] = -lobe  # score ~ cos(offset - i - 1) - cos(lobe): > 0 only there
        kk[i * d, 0] = kk[i * d + slow, 0] = 1.0
        power = torch.linalg.matrix_power(rot.double(), i).float()
        v[i * d + content] = power[content]
        o[content, i * d + content] = 1.0
    pre = "layers.0."
    tensors.update({
        pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": kk,
        pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": o,
        pre + "self_attn.q_norm.weight": torch.full((d,), a.draft_gain),
        pre + "self_attn.k_norm.weight": torch.ones(d),
        "fc.weight": torch.zeros(shapes["fc.weight"]),
    })
    tensors[pre + "mlp.down_proj.weight"].zero_()
    return tensors, config


def write_seed(k: SeedKind, out: Path) -> None:
    """Weights (float32 safetensors), config.json and the tokenizer of one seed-method kind."""
    import torch
    from safetensors.torch import save_file

    builders = {("mimo", False): _mimo, ("gemma4", False): _gemma4,
                ("gemma4", True): _gemma4_assistant, ("qwen3", False): _qwen3,
                ("qwen3", True): _dflash}
    with torch.no_grad():
        tensors, config = builders[(k.family, k.drafter)](k)
    dtype = getattr(torch, DTYPE)
    save_file({n: t.to(dtype).contiguous() for n, t in sorted(tensors.items())},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    write_tokenizer(out)
