"""The objectives a class was measured for beside the one it is decided on, and where they
disagree.

A workload can be measured closed loop (throughput), at offered rates (latency) and by a
capacity search (capacity) in one sweep (`ArrivalSpec.closed_loop`, `request_rate`,
`capacity_from`). Its class is decided, and promoted, on its objective's windows only
(`capacity.decided`); the windows of each other objective are decided here under the same rule,
on their own, as an answer beside it: what would be promoted if the class were decided for that.
Nothing here is promoted, and no error control spans these answers and the decision (each is
its own family); they say where the same setting would not win all three.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specflow.decision.aggregate import objective_label
from specflow.decision.choose import analyze
from specflow.decision.model import Analysis, AnalysisError, ClassResult, Decision
from specflow.records.measurement import Measurement
from specflow.spec.schema import PromoteSpec


@dataclass(frozen=True)
class Beside:
    """One class's answer for an objective it was measured for but is not decided on."""

    traffic_class: str
    objective: str
    """The objective in words (`aggregate.objective_label`)."""
    analysis: Analysis | None
    """That objective's windows decided on their own (None: they could not carry it)."""
    problems: tuple[str, ...] = ()
    """Why they could not."""

    @property
    def result(self) -> ClassResult | None:
        return self.analysis.result(self.traffic_class) if self.analysis is not None else None


def beside(measurements: Iterable[Measurement], promote: PromoteSpec,
           closing_baseline: Iterable[Measurement] = ()) -> list[Beside]:
    """Per class, each objective its windows answer other than the one it is decided for, its
    windows decided for it (`analyze`, family "none": each answer on its own)."""
    ms, closing = list(measurements), list(closing_baseline)
    found = sorted({(m.traffic_class, m.answers) for m in ms
                    if m.answers != promote.objective_for(m.traffic_class)})
    out = []
    for cls, objective in found:
        rules = promote.model_copy(update={"objectives": {**promote.objectives, cls: objective}})
        label = objective_label(rules, cls)
        try:
            a = analyze([m for m in ms if m.traffic_class == cls], rules,
                        closing_baseline=[m for m in closing if m.traffic_class == cls],
                        family="none", partial=True)
        except AnalysisError as exc:
            out.append(Beside(cls, label, None, tuple(exc.problems)))
            continue
        out.append(Beside(cls, label, a))
    return out


def answer(d: Decision | None) -> str:
    """A band's answer in words: `promote <engine>`, `off` or `unresolved`."""
    if d is None:
        return "not measured"
    if d.outcome == "promote" and d.winner is not None:
        return f"promote {d.winner.engine}"
    return d.outcome


def _gain(d: Decision | None) -> str:
    """The winner's gain in its objective ` (1.40x [1.33, 1.48])`, or ""."""
    w = d.winner if d is not None else None
    if w is None or w.worst is None:
        return ""
    s = w.worst.speedup
    return f" ({s.value:.2f}x [{s.lo:.2f}, {s.hi:.2f}])"


def lines(decided: Sequence[ClassResult], found: Sequence[Beside]) -> list[str]:
    """Per class and band with an answer beside its decision: each objective's answer, and
    whether they agree (the same engine promoted, or both off) or disagree."""
    out = []
    for r in decided:
        mine = [b for b in found if b.traffic_class == r.traffic_class]
        if not mine:
            continue
        for d in r.decisions:
            parts = [f"decided for {r.objective}: {answer(d)}{_gain(d)}"]
            words = {answer(d)}
            for b in mine:
                side = b.result
                if side is None:
                    parts.append(f"{b.objective}: no answer ({'; '.join(b.problems)[:200]})")
                    continue
                s = next((x for x in side.decisions if x.band.label == d.band.label), None)
                parts.append(f"{b.objective}: {answer(s)}{_gain(s)}")
                words.add(answer(s))
            words.discard("not measured")
            verdict = ("they agree" if len(words) == 1 else
                       "not all concluded" if "unresolved" in words else "they disagree")
            out.append(f"{r.traffic_class} {d.band.label}: " + "; ".join(parts) + f": {verdict}")
    return out
