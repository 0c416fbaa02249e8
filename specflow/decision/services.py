"""A service (one server, several classes) against routing each class to its own champion.

The service is decided like any class, on windows that mix its classes' requests in their shares
(`specflow.spec.expand`). Routing is not measured as one thing: it is what the per-class
decisions imply for the same requests. Each class keeps its share of the requests and the
baseline's time per request at the band's concurrency (measured), and its time is divided by its
own champion's speedup (1 where it is off or unresolved: it is served without speculation):

    routed speedup = sum_i t_i / sum_i (t_i / s_i),   t_i = share_i x baseline seconds/request_i

i.e. the classes' speedups averaged harmonically by their share of the baseline's time (a class
that takes most of the time decides most of the answer). This assumes each class's pool runs at
the band's concurrency, as it was measured; it is an estimate for comparison, not a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specflow.decision.model import Analysis, Band, Decision, Estimate


@dataclass(frozen=True)
class Route:
    """One class of a service as routing would serve it."""

    workload: str
    traffic_class: str
    share: float
    """Share of the service's requests."""
    time_share: float
    """Share of the baseline's time those requests take."""
    engine: str
    """Its own band's answer: the champion's engine, or "off"."""
    speedup: float
    """Its champion's speedup estimate (1 when off or unresolved)."""


@dataclass(frozen=True)
class ServiceRouting:
    """The service's own answer in one band beside routing its classes."""

    service: str
    band: Band
    outcome: str
    """The service's decision (promote / off / unresolved)."""
    engine: str
    speedup: Estimate | None
    """The service winner's speedup (None when off or unresolved)."""
    routed: float
    """The routed speedup (module docstring)."""
    routes: tuple[Route, ...]

    @property
    def one_server(self) -> float:
        return self.speedup.value if self.speedup is not None else 1.0

    @property
    def gain(self) -> float:
        """What routing adds over the one server's answer (0.09: +9%)."""
        return self.routed / self.one_server - 1.0

    @property
    def unresolved(self) -> bool:
        """Whether an estimate stands for a band that has not concluded."""
        return self.outcome == "unresolved" or any("unresolved" in r.engine
                                                   for r in self.routes)

    def text(self) -> str:
        if self.speedup is not None:
            own = (f"{self.engine} {self.speedup.value:.3g}x [{self.speedup.lo:.3g}, "
                   f"{self.speedup.hi:.3g}]")
        else:
            own = self.outcome
        parts = "; ".join(f"{r.traffic_class}: {r.engine}"
                          + (f" {r.speedup:.3g}x" if not r.engine.startswith("off") else "")
                          + f", {r.share:.0%} of requests, {r.time_share:.0%} of the time"
                          for r in self.routes)
        verdict = (f"routing would add {self.gain:+.0%}" if abs(self.gain) >= 0.005
                   else "routing adds nothing")
        if self.unresolved:
            verdict += " (estimates of unresolved bands: more engine starts settle them)"
        return (f"{self.service} {self.band.label}: one server: {own}; routing each class to "
                f"its own champion: {self.routed:.3g}x ({parts}); {verdict}")


def _band(decisions: tuple[Decision, ...], band: Band) -> Decision | None:
    return next((d for d in decisions if d.band == band), None)


def _answer(d: Decision | None) -> tuple[str, Estimate | None]:
    """(engine, speedup) a band's answer stands for: its winner; for an unresolved band, its
    best open candidate's estimate where that is a gain (marked: not a decision), else off;
    off: the baseline."""
    if d is None:
        return "off", None
    if d.winner is not None and d.winner.worst is not None:
        return d.winner.engine, d.winner.worst.speedup
    if d.unresolved:
        open_ = [v for v in d.candidates if not v.ruled_out and v.worst is not None]
        if open_:
            best = max(open_, key=lambda v: v.worst.speedup.value)  # type: ignore[union-attr]
            assert best.worst is not None
            if best.worst.speedup.value > 1.0:
                return f"{best.engine} (unresolved)", best.worst.speedup
            return "off (unresolved)", None
    return "off", None


def routing(analysis: Analysis, services: Mapping[str, Mapping[str, float]],
            classes: Mapping[str, str], seconds: Mapping[tuple[str, int], float]
            ) -> list[ServiceRouting]:
    """Per service and band: its answer and the routed estimate.

    `services`: service class -> {workload: share}; `classes`: workload -> its class;
    `seconds`: (workload, concurrency) -> the baseline's seconds per request. A band where a
    class has no decision or no baseline time is left out.
    """
    decided = {r.traffic_class: r for r in analysis.classes}
    out = []
    for name, shares in services.items():
        svc = decided.get(name)
        if svc is None:
            continue
        total = sum(shares.values())
        for d in svc.decisions:
            level = min(d.levels) if d.levels else d.band.lo
            routes: list[Route] = []
            times = {w: shares[w] / total * seconds.get((w, level), 0.0) for w in shares}
            spent = sum(times.values())
            if spent <= 0 or any(t <= 0 for t in times.values()):
                continue
            for w, t in times.items():
                cls = decided.get(classes.get(w, w))
                own = _band(cls.decisions, d.band) if cls is not None else None
                if cls is None or own is None:
                    break
                engine, est = _answer(own)
                routes.append(Route(w, cls.traffic_class, shares[w] / total, t / spent, engine,
                                    est.value if est is not None else 1.0))
            if len(routes) != len(shares):
                continue
            routed = spent / sum(times[r.workload] / r.speedup for r in routes)
            engine, est = _answer(d)
            out.append(ServiceRouting(name, d.band, d.outcome, engine, est, routed,
                                      tuple(routes)))
    return out
