"""Where `watch` reads vLLM's counters: a server's /metrics, or a Prometheus server's HTTP API.

Either gives `Reading`s (specflow.decision.watch): per series (counter, draft position, the
series' labels) its value at a time. A source that is not what it should be (not reachable, not
vLLM, no speculative decoding) is a `WatchError` whose message says which and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specflow.decision.watch import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATED,
    POSITION,
    Reading,
    Series,
)
from specflow.engine.metrics import ACCEPTED as M_ACCEPTED
from specflow.engine.metrics import ACCEPTED_PER_POS
from specflow.engine.metrics import DRAFT_TOKENS as M_DRAFT_TOKENS
from specflow.engine.metrics import DRAFTS as M_DRAFTS

M_GENERATED = "vllm:generation_tokens_total"
COUNTERS = {M_DRAFTS: DRAFTS, M_DRAFT_TOKENS: DRAFT_TOKENS, M_ACCEPTED: ACCEPTED,
            ACCEPTED_PER_POS: POSITION, M_GENERATED: GENERATED}
"""vLLM's counter (sample name) -> what a reading calls it."""


class WatchError(RuntimeError):
    """A source that cannot be watched; the message says why and what to do."""


def _series(name: str, labels: Mapping[str, str]) -> Series:
    pos = int(labels["position"]) if name == ACCEPTED_PER_POS else -1
    ident = ",".join(f"{k}={v}" for k, v in sorted(labels.items())
                     if k not in ("position", "__name__"))
    return COUNTERS[name], pos, ident


def _matches(labels: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


@dataclass(frozen=True)
class Scraped:
    """One /metrics page, read."""

    reading: Reading
    vllm: bool
    speculative: bool


def parse_page(text: str, t: float, labels: Mapping[str, str] | None = None) -> Scraped:
    """A /metrics page's counters (only series whose labels include `labels`)."""
    values: dict[Series, float] = {}
    vllm = speculative = False
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            vllm |= s.name.startswith("vllm:")
            if s.name in COUNTERS and _matches(s.labels, labels or {}):
                speculative |= s.name != M_GENERATED
                values[_series(s.name, s.labels)] = float(s.value)
    return Scraped(Reading(t, values), vllm, speculative)


def scrape(url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0,
           labels: Mapping[str, str] | None = None, *, first: bool = False) -> Scraped:
    """Read a server's /metrics now. An unreachable server is a reading without values (a
    restart in progress), and so is any other failure after the `first` reading (a server
    starting answers errors for a while); on the first, an answer that is not a /metrics page
    is a WatchError saying so."""
    t = time.time()
    try:
        resp = httpx.get(url, headers=dict(headers or {}), timeout=timeout,
                         follow_redirects=True)
    except httpx.HTTPError as exc:
        return Scraped(Reading(t, {}, f"unreachable: {type(exc).__name__}"), False, False)
    try:
        if resp.status_code != 200:
            raise WatchError(f"{url} answered HTTP {resp.status_code}: not a vLLM server's "
                             "/metrics (vLLM serves them at http://HOST:PORT/metrics)")
        try:
            return parse_page(resp.text, t, labels)
        except ValueError as exc:
            raise WatchError(f"{url} is not a Prometheus /metrics page ({exc})") from None
    except WatchError as exc:
        if first:
            raise
        return Scraped(Reading(t, {}, str(exc)), False, False)


def check_server(first: Scraped, url: str) -> None:
    """A first reading that cannot be watched: why, as a WatchError."""
    if first.reading.problem:
        raise WatchError(f"cannot reach {url} ({first.reading.problem}); start the server or "
                         "set watch.metrics_url to its /metrics")
    if not first.vllm:
        raise WatchError(f"{url} is not a vLLM server's /metrics: it has no vllm: metrics")
    if not first.speculative:
        raise WatchError(f"{url} serves without speculative decoding (no vllm:spec_decode_* "
                         "counters): nothing to watch; serve the champion's "
                         "--speculative-config")


# --------------------------------------------------------------------------------------------
# Prometheus


def _query_range(client: httpx.Client, base: str, query: str, start: float, end: float,
                 step: float) -> list[dict[str, Any]]:
    try:
        resp = client.get(f"{base.rstrip('/')}/api/v1/query_range",
                          params={"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                  "step": f"{step:g}"})
    except httpx.HTTPError as exc:
        raise WatchError(f"cannot reach Prometheus at {base} ({type(exc).__name__}); set "
                         "watch.prometheus_url to its address (e.g. http://127.0.0.1:9090)"
                         ) from None
    try:
        body = resp.json()
    except ValueError:
        raise WatchError(f"{base} answered HTTP {resp.status_code} without JSON: not a "
                         "Prometheus server's HTTP API") from None
    if body.get("status") != "success":
        raise WatchError(f"Prometheus refused `{query}`: {body.get('errorType', '')} "
                         f"{body.get('error', resp.status_code)}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def prometheus_readings(base: str, selector: str, start: float, end: float, step: float,
                        timeout: float = 30.0) -> list[Reading]:
    """Every counter's series matching `selector` ({...} matchers) over [start, end], at
    `step` seconds (Prometheus's query_range: each point the latest sample within its lookback),
    as readings. WatchError when no vLLM series match or none is a spec-decode counter."""
    inner = selector.strip()[1:-1] if selector else ""
    by_t: dict[float, dict[Series, float]] = {}
    found: set[str] = set()
    with httpx.Client(timeout=timeout) as client:
        for name in COUNTERS:
            for series in _query_range(client, base, f"{name}{{{inner}}}", start, end, step):
                labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
                key = _series(name, labels)
                found.add(name)
                for t, v in series["values"]:
                    by_t.setdefault(float(t), {})[key] = float(v)
    if not found:
        raise WatchError(f"no vLLM counters match {selector or '{}'} in Prometheus at {base} "
                         f"from {_when(start)} to {_when(end)}: is it scraping the server "
                         "(and is watch.selector right)?")
    if found == {M_GENERATED}:
        raise WatchError(f"the vLLM servers matching {selector or '{}'} serve without "
                         "speculative decoding (no vllm:spec_decode_* counters): nothing to "
                         "watch")
    return [Reading(t, v) for t, v in sorted(by_t.items())]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))

