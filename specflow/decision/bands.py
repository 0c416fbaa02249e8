"""Concurrency bands and the N schedule built from the N chosen per band."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from specflow.decision.model import Band
from specflow.spec.schema import PromoteSpec


def bands_for(promote: PromoteSpec, levels: Sequence[int]
              ) -> tuple[tuple[Band, ...], list[str], list[str]]:
    """The bands to decide (configured, or one per measured level), with problems and notes."""
    levels = sorted(set(levels))
    if not promote.concurrency_bands:
        return tuple(Band(c, c) for c in levels), [], []
    problems, notes = [], []
    bands = []
    for i, (lo, hi) in enumerate(promote.concurrency_bands):
        if lo > hi:
            problems.append(f"promote.concurrency_bands[{i}]: low {lo} > high {hi}; "
                            "expected [low, high] with low <= high")
        else:
            bands.append(Band(lo, hi))
    bands.sort(key=lambda b: b.lo)
    for a, b in itertools.pairwise(bands):
        if b.lo <= a.hi:
            problems.append(f"promote.concurrency_bands: {[a.lo, a.hi]} overlaps {[b.lo, b.hi]}; "
                            "expected disjoint bands")
    for b in bands:
        if not any(c in b for c in levels):
            problems.append(f"promote.concurrency_bands: band {[b.lo, b.hi]} has no measured "
                            f"concurrency level (measured: {levels}); add one to sweep.concurrency")
    outside = [c for c in levels if not any(c in b for b in bands)]
    if outside:
        notes.append(f"concurrency levels {outside} lie outside every band and are not decided on")
    return tuple(bands), problems, notes


def build_schedule(n_by_band: Sequence[tuple[Band, int]], max_batch_size: int | None = None
                   ) -> tuple[list[list[int]] | None, list[str]]:
    """vLLM `num_speculative_tokens_per_batch_size` from the N chosen per band.

    Ranges run contiguously from batch size 1 to the last band's end (or `max_batch_size`);
    batch sizes below the first band or between bands take the band below (vLLM carries N
    forward the same way). Returns None when one N serves every band, and notes on what was
    filled in rather than measured."""
    if not n_by_band:
        raise ValueError("a schedule needs at least one band")
    ordered = sorted(n_by_band, key=lambda bn: bn[0].lo)
    end = max_batch_size if max_batch_size is not None else ordered[-1][0].hi
    notes = []
    ranges: list[list[int]] = []
    for i, (band, n) in enumerate(ordered):
        start = 1 if i == 0 else band.lo
        stop = ordered[i + 1][0].lo - 1 if i + 1 < len(ordered) else max(end, band.hi)
        if i == 0 and band.lo > 1:
            notes.append(f"batch sizes 1-{band.lo - 1} were not measured; they use band "
                         f"{band.label}'s N={n}")
        if stop > band.hi:
            notes.append(f"batch sizes {band.hi + 1}-{stop} were not measured; they use band "
                         f"{band.label}'s N={n}")
        if ranges and ranges[-1][2] == n:
            ranges[-1][1] = stop
        else:
            ranges.append([start, stop, n])
    return (ranges if len(ranges) > 1 else None), notes
