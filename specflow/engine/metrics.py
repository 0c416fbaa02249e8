"""Speculative-decoding counters read from a server's Prometheus /metrics, independently of bench.

`vllm bench serve` takes its acceptance numbers as /metrics deltas around its measured window;
specflow scrapes the same counters itself (with prometheus_client's parser, not bench's line
matching) around the same window and requires both to agree exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specflow.spec.serialize import as_json

PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts_total"
DRAFT_TOKENS = PREFIX + "num_draft_tokens_total"
ACCEPTED = PREFIX + "num_accepted_tokens_total"
ACCEPTED_PER_POS = PREFIX + "num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters, summed over engines (a snapshot or a delta)."""

    num_drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: dict[int, int] = field(default_factory=dict)
    """Accepted tokens by draft position (0-based)."""

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        positions = sorted(set(self.accepted_per_pos) | set(before.accepted_per_pos))
        return SpecCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_pos={p: self.accepted_per_pos.get(p, before.accepted_per_pos.get(p, 0))
                              - before.accepted_per_pos.get(p, 0) for p in positions})

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / draft tokens (a fraction), None without drafts."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts, None without drafts."""
        return 1 + self.accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """accepted at position i / drafts, by position."""
        if not self.num_drafts:
            return ()
        return tuple(self.accepted_per_pos[p] / self.num_drafts
                     for p in sorted(self.accepted_per_pos))


PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
"""Prompt tokens looked up in the prefix cache."""
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
"""Prompt tokens found there (their KV was not computed again)."""


@dataclass(frozen=True)
class PrefixCache:
    """vLLM's prefix-cache counters in tokens, summed over engines (a snapshot or a delta)."""

    queries: int = 0
    hits: int = 0

    def __sub__(self, before: PrefixCache) -> PrefixCache:
        return PrefixCache(self.queries - before.queries, self.hits - before.hits)


@dataclass(frozen=True)
class Snapshot:
    """What specflow reads of one /metrics scrape."""

    spec: SpecCounters | None
    """Speculative-decoding counters; None on a server without a speculative config."""
    prefix_cache: PrefixCache | None
    """Prefix-cache counters; None where the server exposes none (prefix caching off)."""


def scrape(text: str) -> Snapshot:
    """The counters specflow reads from a /metrics exposition, parsed once."""
    families = list(text_string_to_metric_families(text))
    return Snapshot(_spec(families), _prefix_cache(families))


def _prefix_cache(families: list[Any]) -> PrefixCache | None:
    totals = {PREFIX_CACHE_QUERIES: 0, PREFIX_CACHE_HITS: 0}
    found = False
    for family in families:
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += int(sample.value)
                found = True
    return PrefixCache(totals[PREFIX_CACHE_QUERIES], totals[PREFIX_CACHE_HITS]) if found else None


def parse(text: str) -> SpecCounters | None:
    """The spec-decode counters in a /metrics exposition; None when the server has none."""
    return _spec(list(text_string_to_metric_families(text)))


def _spec(families: list[Any]) -> SpecCounters | None:
    found = False
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    per_pos: dict[int, int] = {}
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += int(sample.value)
                found = True
            elif sample.name == ACCEPTED_PER_POS:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0) + int(sample.value)
                found = True
    if not found:
        return None
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], per_pos)


def window_delta(before: SpecCounters | None, after: SpecCounters | None) -> SpecCounters | None:
    """Counter deltas over a window; None when the server exposes no spec-decode counters."""
    if before is None or after is None:
        return None
    return after - before


def compare_with_bench(delta: SpecCounters | None, result: Mapping[str, Any]) -> list[str]:
    """Every disagreement between specflow's deltas and bench's result JSON (empty: agree).

    Bench reports its numbers only when draft tokens were proposed in the window; without
    them, specflow's deltas must show no drafting either.
    """
    if "spec_decode_num_drafts" not in result:
        if delta is not None and (delta.num_drafts or delta.draft_tokens or delta.accepted_tokens):
            return [f"bench reported no spec-decode numbers but /metrics moved: {as_json(delta)}"]
        return []
    if delta is None:
        return ["bench reported spec-decode numbers but /metrics has no spec-decode counters"]
    problems = []
    for key, mine in (("spec_decode_num_drafts", delta.num_drafts),
                      ("spec_decode_draft_tokens", delta.draft_tokens),
                      ("spec_decode_accepted_tokens", delta.accepted_tokens)):
        if int(result[key]) != mine:
            problems.append(f"{key}: bench {result[key]} != /metrics delta {mine}")
    rate, percent = delta.acceptance_rate, result["spec_decode_acceptance_rate"]
    if rate is not None and percent != rate * 100:
        problems.append(f"spec_decode_acceptance_rate: bench {percent}% != /metrics {rate * 100}%")
    theirs = list(result.get("spec_decode_per_position_acceptance_rates") or [])
    mine_pp = list(delta.per_position)
    if theirs != mine_pp:
        problems.append(f"per-position acceptance: bench {theirs} != /metrics {mine_pp}")
    return problems
