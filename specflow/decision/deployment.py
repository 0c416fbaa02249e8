"""A band's winner among its eligible candidates (`pick`: the highest lower bound; ties to the
smaller N, then the cheaper method), and a class's deployment: one engine, the drafter winning
most bands with its best N per band (an N schedule where that N changes with load)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from specflow.decision.bands import build_schedule
from specflow.decision.model import (
    BASELINE_METHOD,
    Band,
    Decision,
    Deployment,
    PointStats,
    Verdict,
)
from specflow.spec.methods import METHODS


def cost_rank(method: str) -> int:
    info = METHODS.get(method)
    return info.cost_rank if info is not None else len(METHODS)


def tie_key(v: Verdict) -> tuple[Any, ...]:
    return (v.num_speculative_tokens, cost_rank(v.method), -(v.score or 0.0), v.engine,
            v.engine_hash)


def pick(eligible: Sequence[Verdict], tie_tolerance: float) -> tuple[Verdict, list[Verdict]]:
    """The winner among eligible verdicts, and the others with a note on why they lost."""
    best = max(v.score or 0.0 for v in eligible)
    tied = [v for v in eligible if (v.score or 0.0) >= best * (1 - tie_tolerance)]
    winner = min(tied, key=tie_key)
    others = []
    for v in eligible:
        if v is winner:
            continue
        if any(v is t for t in tied):
            note = (f"tied with {winner.engine} (lower bounds within {tie_tolerance:.0%}); "
                    "the smaller N, then the cheaper method is preferred")
        else:
            note = f"lower bound {v.score:.3f} < winner's {winner.score:.3f}"
        others.append(dataclasses.replace(v, note=note))
    return dataclasses.replace(winner, chosen=True), others


def n_per_band(decisions: Sequence[Decision], drafter: str, tie_tolerance: float
                ) -> tuple[list[tuple[Band, int]], dict[int, Verdict], list[str]]:
    """The drafter's N in each band (0 where none of its engines is eligible), its engine per N,
    and notes on bands another drafter won."""
    notes = []
    n_by_band: list[tuple[Band, int]] = []
    engines: dict[int, Verdict] = {}
    for d in decisions:
        if d.winner is not None and d.winner.drafter == drafter:
            chosen: Verdict | None = d.winner
        else:
            mine = [v for v in d.candidates if v.drafter == drafter and v.eligible]
            chosen = pick(mine, tie_tolerance)[0] if mine else None
        n = chosen.num_speculative_tokens if chosen is not None else 0
        if chosen is not None:
            engines[n] = chosen
        if d.winner is not None and d.winner.drafter != drafter:
            notes.append(f"band {d.band.label}: {d.winner.engine} won, but one engine serves one "
                         f"drafter; {drafter} runs N={n} there")
        n_by_band.append((d.band, n))
    return n_by_band, engines, notes


def class_deployment(traffic_class: str, decisions: Sequence[Decision], baseline: PointStats,
                max_batch_size: int | None, tie_tolerance: float
                ) -> tuple[Deployment, list[str]]:
    """One engine per class: the drafter winning most bands, with its best N per band."""
    baseline_hash = baseline.engine_hash
    off = Deployment(traffic_class, "off", baseline_hash, baseline.engine, baseline.drafter,
                     BASELINE_METHOD, 0, None, baseline_hash,
                     ("speculation loses or is unproven in every band",))
    winners = [(i, d.winner) for i, d in enumerate(decisions) if d.winner is not None]
    if not winners:
        return off, []
    wins = Counter(w.drafter for _, w in winners)
    first = {w.drafter: i for i, w in reversed(winners)}
    method = {w.drafter: w.method for _, w in winners}
    drafter = min(wins, key=lambda d: (-wins[d], first[d], cost_rank(method[d]), d))
    n_by_band, engines, notes = n_per_band(decisions, drafter, tie_tolerance)
    n_max = max(n for _, n in n_by_band)
    top = engines[n_max]
    reasons = [f"{drafter} wins {wins[drafter]} of {len(decisions)} bands"]
    if len({n for _, n in n_by_band}) == 1:
        return Deployment(traffic_class, "promote", top.engine_hash, top.engine, drafter,
                          top.method, n_max, None, baseline_hash, tuple(reasons)), notes
    schedule, fill = build_schedule(n_by_band, max_batch_size)
    notes += fill
    if schedule is not None:
        reasons.append("N changes with load: " + ", ".join(
            f"{b.label}: N={n}" for b, n in n_by_band))
        notes.append("the schedule was assembled from fixed-N measurements; sweep it as one "
                     "engine before relying on it (vLLM drops full CUDA graphs to piecewise for "
                     "a dynamic N, and the drafter's memory is held even where N=0)")
    ranges = tuple((start, end, k) for start, end, k in schedule) if schedule else None
    return Deployment(traffic_class, "promote", top.engine_hash, top.engine, drafter,
                      top.method, n_max, ranges, baseline_hash, tuple(reasons)), notes
