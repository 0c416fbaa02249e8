"""The decision in words: why a band's winner won, why a band is off or unresolved and what
would settle it, and the decision table (`decision_rows`) the report, the console, MLflow and
champion.json show."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specflow.decision.model import BASELINE_METHOD, ClassResult, PointSpeedup, Verdict
from specflow.spec.schema import PromoteSpec
from specflow.stats.critical import z_value
from specflow.stats.power import starts_for_power


def winner_reasons(winner: Verdict, promote: PromoteSpec) -> tuple[str, ...]:
    """The winner's evidence: its worst point's speedup, its quality check, the SLOs."""
    w, q = winner.worst, winner.quality
    assert w is not None  # eligible implies measured speedups
    return (
        f"{winner.engine} ({winner.method}, N={winner.num_speculative_tokens}): speedup lower "
        f"bound {w.speedup.lo:.3f} >= {1 + promote.margin:.3f} at its worst point "
        f"{w.workload} c={w.concurrency} (speedup {w.speedup.value:.3f}, "
        f"{w.speedup.confidence:.0%} CI [{w.speedup.lo:.3f}, {w.speedup.hi:.3f}])",
        f"quality: mismatched (run, request) pairs {q.summary}; the {promote.confidence:.0%} "
        f"lower bound of the excess over the baseline's rate is within the tolerance "
        f"{q.tolerance:.1%} at every level"
        if q is not None else "quality: not evaluated",
        "latency SLOs met at the worst repeat"
        if any(b is not None for b in promote.slo.model_dump().values())
        else "no latency SLOs set",
    )


def off_reasons(verdicts: Sequence[Verdict]) -> tuple[str, ...]:
    """Why speculation is off in a band: nothing measured, or every candidate ruled out."""
    if not verdicts:
        return ("no speculative candidate was measured in this band",)
    return (f"speculation off: every one of {len(verdicts)} candidates is ruled out",
            *(f"{v.engine} ruled out: {v.ruled_out}" for v in verdicts))


def open_why(still_open: Sequence[Verdict], promote: PromoteSpec) -> str:
    """An undecided band in one line: its open candidates, and its leader (`leader`)."""
    names = ", ".join(v.engine for v in still_open)
    lead = leader(still_open, promote)
    return f"{names} neither shown to win nor ruled out" + (f"; {lead}" if lead else "")


def leader(still_open: Sequence[Verdict], promote: PromoteSpec) -> str:
    """An undecided band's best open candidate: its estimate, how likely it clears the margin
    (1 - its one-sided p-value at its worst point: a confidence on the data so far, before any
    correction for its selection), what holds meanwhile, and the starts that would settle it."""
    best = max(still_open, key=lambda v: v.worst.speedup.value if v.worst else 0.0)
    if best.worst is None:
        return ""
    e = best.worst.speedup
    need = starts_needed(best.worst, 1 + promote.margin, promote.confidence)
    settle = (settle_phrase(need, best.engine) if need
              else f"more engine starts would rule {best.engine} out")
    return (f"best {best.engine} {e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}] at "
            f"{best.worst.workload} c={best.worst.concurrency}, clearing {1 + promote.margin:.3f}"
            f" with {_pct(1 - band_p_value(best))} confidence so far; meanwhile the class keeps "
            f"its champion; {settle}")


def _pct(x: float) -> str:
    """A confidence in words that never rounds a near-certainty to 100% or a long shot to 0%."""
    if x >= 0.995:
        return ">99%"
    if x < 0.005:
        return "<1%"
    return f"{x:.0%}"


def starts_needed(s: PointSpeedup, threshold: float, confidence: float, power: float = 0.8
                  ) -> int | None:
    """Engine starts per side that would put the lower bound above `threshold` with `power`,
    if the observed speedup and noise hold (None when the speedup is below the threshold)."""
    e = s.speedup
    gap = math.log(e.value) - math.log(threshold)
    if gap <= 0:
        return None
    if e.hi == e.lo:
        return max(2, s.starts)
    se = (math.log(e.hi) - math.log(e.lo)) / (2 * z_value(confidence))
    need = starts_for_power(s.starts * se ** 2, gap, z_value(confidence), z_value(2 * power - 1))
    return max(2, math.ceil(need))


PRACTICAL_STARTS = 100
"""Engine starts per side beyond which "would settle it" is no advice: the estimate sits on the
margin."""


def settle_phrase(need: int, what: str, starts: str = "engine starts") -> str:
    """What would settle `what`: about `need` starts per side, or, past `PRACTICAL_STARTS`, that
    its estimate sits too close to the margin for starts to settle it."""
    if need > PRACTICAL_STARTS:
        return (f"its estimate sits too close to the margin for {starts} to settle {what} "
                f"(over {PRACTICAL_STARTS} per side; about {need} at the observed noise)")
    return f"about {need} {starts} per side would settle {what} at the observed noise"


def band_p_value(v: Verdict) -> float:
    """A band's speedup test: every point must clear 1 + margin (intersection-union), so its
    p-value is the largest of its points'."""
    return max((s.p_value for s in v.speedups), default=1.0)


def decision_rows(result: ClassResult) -> list[dict[str, Any]]:
    """The decision table: one row per band x candidate, plus the "off" row of every band.
    A candidate's verdict: wins, passes (every gate; another chosen), ruled out, open; the off
    row's: wins (the band concludes off), ruled out (a candidate wins), open (the band is
    unresolved)."""
    rows = []
    for d in result.decisions:
        for v in d.candidates:
            s = v.worst.speedup if v.worst is not None else None
            q = v.quality
            rows.append({
                "traffic_class": d.traffic_class, "band": d.band.label,
                "objective": result.objective, "engine": v.engine, "engine_hash": v.engine_hash,
                "method": v.method, "N": v.num_speculative_tokens,
                "verdict": v.verdict,
                "speedup": s.value if s else None, "lo": s.lo if s else None,
                "hi": s.hi if s else None,
                "worst_point": f"{v.worst.workload} c={v.worst.concurrency}" if v.worst else None,
                "quality": q.summary if q else None,
                "acceptance_rate": v.acceptance_rate,
                **_capacity(result, v.engine_hash),
                "why": v.ruled_out if v.verdict == "ruled out"
                else "; ".join(str(r) for r in v.rejected) or v.note,
            })
        rows.append({
            "traffic_class": d.traffic_class, "band": d.band.label,
            "objective": result.objective, "engine": "off (baseline)",
            "engine_hash": result.deployment.baseline_hash, "method": BASELINE_METHOD, "N": 0,
            "verdict": {"off": "wins", "unresolved": "open"}.get(d.outcome, "ruled out"),
            "speedup": 1.0, "lo": 1.0, "hi": 1.0, "worst_point": None, "quality": None,
            "acceptance_rate": None, **_capacity(result, result.deployment.baseline_hash),
            "why": "; ".join(d.reasons) if d.winner is None else "a candidate passed every gate",
        })
    return rows


def _capacity(result: ClassResult, engine_hash: str) -> dict[str, Any]:
    """A capacity class's row: the engine's capacity and the baseline's, [value, lo, hi] in
    requests per second (none where fewer than two searches found one); nothing for other
    objectives."""
    if not result.capacities:
        return {}
    mine, base = result.capacity(engine_hash), result.capacity(result.deployment.baseline_hash)
    return {"capacity": [mine.value, mine.lo, mine.hi] if mine else None,
            "baseline_capacity": [base.value, base.lo, base.hi] if base else None}
