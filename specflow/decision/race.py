"""Where a raced band stands: its contenders' intervals and status after a round."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class ContenderEstimate:
    """A contender's band estimate in one round: its worst point."""

    value: float
    lo: float
    hi: float
    point: str
    starts: int = 1
    """Candidate engine starts behind the estimate."""


@dataclass(frozen=True)
class BandState:
    """Where one (traffic class, band) stands after a round."""

    traffic_class: str
    band: str
    status: Literal["exploring", "confirming", "promote", "off", "unresolved"]
    """In progress (exploring, confirming), then the band's outcome (promote, off,
    unresolved)."""
    contenders: tuple[str, ...]
    """Engine hashes still in the race (exploring), or the selected one (confirming and after)."""
    dropped: tuple[tuple[str, str], ...] = ()
    """(engine hash, why) of every candidate dropped so far, in the order they were dropped."""
    estimates: Mapping[str, ContenderEstimate] = field(default_factory=dict)
    ruled_out: tuple[str, ...] = ()
    """Engine hashes of `dropped` that the race ruled out (a gate, a gain of 2 x margin excluded
    at the look's futility share, outranked); the others were dropped for another's selection."""
    looks: int = 0
    """Confirmation looks taken."""
    evidence: Literal["explore", "confirm"] = "confirm"
    """The engine starts a confirmed winner was shown on: its fresh confirmation starts, or
    (a clear case, confirmed early) its exploration starts."""
    why: str = ""
    notes: tuple[tuple[str, str], ...] = ()
    """(engine hash, note) of what the search checked on the way (an adaptive search's chain
    check, under its probe's hash)."""

    @property
    def left_open(self) -> bool:
        """The exploration left it unresolved with contenders still open (not confirmed, not
        out of budget): a confirmation's starts measure it too, and may yet rule them out."""
        return self.status == "unresolved" and self.looks == 0 and bool(self.contenders)

    def word(self, more_rounds: bool) -> str:
        """The status as said after its round: a band `left_open` is measured again when
        another round follows, so it is still `exploring` there; `unresolved` is said only
        where no round follows."""
        return "exploring" if more_rounds and self.left_open else self.status
