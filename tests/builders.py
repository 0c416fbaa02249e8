"""Hand-built sweep records for the analysis, promotion and report tests (no engine involved)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from specflow.records.measurement import Measurement, WindowKey
from specflow.spec.compile import ADAPTIVE_KEY, EngineConfig

DIGESTS = tuple(f"{i:064x}" for i in range(20))
"""Per-request output digests of a 20-prompt workload, as the baseline produces them."""
LATENCY = {"p99_tpot_ms": 20.0, "p99_ttft_ms": 300.0, "p99_itl_ms": 25.0, "p99_e2el_ms": 3000.0}


@cache
def engine(name: str, method: str = "none", n: int = 0, drafter: str | None = None,
           adaptive: bool = False) -> EngineConfig:
    """An EngineConfig as compile would build it for the tiny target (its hash keys the records)."""
    argv = ["vllm", "serve", "/models/tiny", "--served-model-name", "tiny", "--dtype", "bfloat16"]
    spec_cfg = None
    if method != "none":
        spec_cfg = {"method": method, "num_speculative_tokens": n}
        if method == "ngram":
            spec_cfg.update(prompt_lookup_min=2, prompt_lookup_max=4)
        if adaptive:
            spec_cfg[ADAPTIVE_KEY] = True
        argv += ["--speculative-config", json.dumps(spec_cfg, sort_keys=True,
                                                    separators=(",", ":"))]
    return EngineConfig(name=name, drafter=drafter or method, method=method,
                        num_speculative_tokens=n, speculative_config=spec_cfg,
                        serve_argv=tuple(argv), lookahead_slots=n)


BASELINE = engine("baseline")


def window(ec: EngineConfig, tput: float, *, workload: str = "gsm8k", cls: str = "math",
           c: int = 1, r: int = 0, digests: Sequence[str] = DIGESTS,
           latency: Mapping[str, float] | None = None, failure: str | None = None,
           failed_requests: int = 0, ppa: Sequence[float] = ()) -> Measurement:
    """One measured window of engine `ec`."""
    spec = ec.method != "none"
    return Measurement(
        key=WindowKey(ec.hash, workload, c, r), engine=ec.name, drafter=ec.series,
        method=ec.method, num_speculative_tokens=ec.num_speculative_tokens, traffic_class=cls,
        status="failed" if failure else "ok", failure=failure,
        completed=0 if failure else len(digests) - failed_requests, failed=failed_requests,
        duration_s=0.0 if failure else 60.0, output_throughput=0.0 if failure else tput,
        latency_ms={} if failure else dict(latency or LATENCY),
        acceptance_rate=(ppa[0] if ppa else 0.6) if spec and not failure else None,
        per_position_acceptance=tuple(ppa) if not failure else (),
        output_digests=() if failure else tuple(digests), prompt_hash=f"prompts-{workload}",
    )


@dataclass
class Cand:
    """A candidate engine and its true speedup per concurrency level (or one for all)."""

    ec: EngineConfig
    speedup: float | Mapping[int, float]
    latency: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    digests: Sequence[str] = DIGESTS
    ppa: Sequence[float] = ()

    def at(self, c: int) -> float:
        return self.speedup if isinstance(self.speedup, (int, float)) else self.speedup[c]


def sweep(cands: Sequence[Cand], *, levels: Sequence[int] = (1,), workloads: Sequence[str] = (
          "gsm8k",), cls: str = "math", repeats: int = 5, closing: int = 0, cv: float = 0.0,
          rng: np.random.Generator | None = None, base: float = 100.0,
          baseline_repeats: int | None = None
          ) -> tuple[list[Measurement], list[Measurement]]:
    """Windows of a sweep (baseline + candidates) with multiplicative Gaussian noise of CV `cv`,
    and the closing baseline windows."""
    rng = rng or np.random.default_rng(0)

    def noisy(mean: float) -> float:
        return float(mean * max(0.05, 1 + cv * rng.standard_normal()))

    opening, closing_ws = [], []
    for w in workloads:
        for c in levels:
            for r in range(baseline_repeats or repeats):
                opening.append(window(BASELINE, noisy(base), workload=w, cls=cls, c=c, r=r))
            for r in range(closing):
                closing_ws.append(window(BASELINE, noisy(base), workload=w, cls=cls, c=c,
                                         r=100 + r))
            for cand in cands:
                for r in range(repeats):
                    opening.append(window(cand.ec, noisy(base * cand.at(c)), workload=w, cls=cls,
                                          c=c, r=r, latency=cand.latency.get(c),
                                          digests=cand.digests, ppa=cand.ppa))
    return opening, closing_ws
