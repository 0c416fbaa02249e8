"""Per-request acceptance and speedup by prompt length, from hand-built windows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from specflow.decision.choose import analyze
from specflow.decision.requests import agreement, analyze_requests, buckets
from specflow.records.measurement import Measurement, RequestStats
from specflow.results.report import write_report
from specflow.spec.schema import PromoteSpec
from tests.builders import BASELINE, engine, window

PROMPTS = [12, 15, 18, 20, 60, 70, 80, 90, 300, 320, 340, 360]
OUT = 64
SHORT_AT = 100  # prompt tokens: "short" below, "long" above

BOTH = engine("ngram-n2", "ngram", 2)
SHORT = engine("draft_model-n4", "draft_model", 4)  # fast on short prompts, slow on long


def _requests(tpot_ms, accept, rng: np.random.Generator, steps: int | None = 20
              ) -> tuple[RequestStats, ...]:
    """One request per prompt: time per output token from `tpot_ms(prompt tokens)` (2% noise)."""
    out = []
    for p in PROMPTS:
        tpot = tpot_ms(p) / 1000 * (1 + 0.02 * rng.standard_normal())
        spec = {} if steps is None else {"spec_steps": steps, "accepted": accept(p),
                                         "drafted": steps * 2}
        out.append(RequestStats(prompt_tokens=p, output_tokens=OUT, latency_s=tpot * OUT,
                                ttft_s=tpot, **spec))
    return tuple(out)


def _windows(rng: np.random.Generator) -> list[Measurement]:
    ms = []
    for r in range(2):
        base = _requests(lambda p: 10.0, lambda p: 0, rng, steps=None)
        both = _requests(lambda p: 8.0, lambda p: 10, rng)
        short = _requests(lambda p: 6.0 if p < SHORT_AT else 11.0,
                          lambda p: 30 if p < SHORT_AT else 4, rng)
        for ec, reqs in ((BASELINE, base), (BOTH, both), (SHORT, short)):
            m = window(ec, 100.0, workload="chat", cls="chat", c=1, r=r)
            spec = [x for x in reqs if x.spec_steps]
            ms.append(replace(m, requests=reqs, **({
                "num_drafts": sum(x.spec_steps for x in spec),
                "draft_tokens": sum(x.drafted for x in spec),
                "accepted_tokens": sum(x.accepted for x in spec)} if spec else {})))
    return ms


def test_prompt_length_buckets_are_terciles() -> None:
    assert [(b.lo, b.hi) for b in buckets(PROMPTS)] == [(-1, 20), (20, 90), (90, 360)]
    assert [b.label for b in buckets(PROMPTS)] == ["<= 20", "21-90", "91-360"]
    assert [(b.lo, b.hi) for b in buckets([5, 5, 5, 9])] == [(-1, 5), (5, 9)]
    assert buckets([]) == ()


def test_the_best_engine_by_prompt_length_and_what_keying_on_it_would_gain() -> None:
    (lv,) = analyze_requests(_windows(np.random.default_rng(0)))
    assert (lv.traffic_class, lv.concurrency) == ("chat", 1)
    rows = {(r.engine, r.bucket): r for r in lv.rows}
    # acceptance length per bucket: 1 + accepted / steps, pooled over requests, CI around it
    short_acc = rows[("draft_model-n4", "<= 20")].acceptance_length
    assert short_acc.value == 1 + 30 / 20 and short_acc.lo <= short_acc.value <= short_acc.hi
    assert rows[("draft_model-n4", "91-360")].acceptance_length.value == 1 + 4 / 20
    # speedup per bucket: the baseline's time per token over the engine's, on the same prompts
    fast = rows[("draft_model-n4", "<= 20")].speedup
    assert 10 / 6 * 0.97 < fast.value < 10 / 6 * 1.03 and fast.lo < fast.value < fast.hi
    assert rows[("draft_model-n4", "91-360")].speedup.hi < 1.0  # it loses on long prompts
    assert lv.best == {"<= 20": "draft_model-n4", "21-90": "draft_model-n4",
                       "91-360": "ngram-n2"}
    # the single best over all requests, and the length-keyed choice beats it clearly
    assert lv.single_best == "draft_model-n4"
    gain = lv.keyed_gain
    assert gain is not None and gain.lo > 0
    # expected: short side keeps 6 ms; long side 11 -> 8 ms: (8*6+4*11)/(8*6+4*8) - 1
    assert abs(gain.value - (92 / 80 - 1)) < 0.03
    assert set(lv.acceptance) == {"ngram-n2", "draft_model-n4"}
    assert len(lv.acceptance["ngram-n2"]) == 2 * len(PROMPTS)


def test_one_engine_best_everywhere_means_no_length_keying() -> None:
    ms = [m for m in _windows(np.random.default_rng(1)) if m.engine != "draft_model-n4"]
    (lv,) = analyze_requests(ms)
    assert set(lv.best.values()) == {"ngram-n2"} and lv.single_best == "ngram-n2"
    assert lv.keyed_gain is None


def test_per_request_sums_are_checked_against_the_counters() -> None:
    ms = _windows(np.random.default_rng(2))
    assert agreement(ms) == (4, 4, [])
    off = replace(ms[1], accepted_tokens=ms[1].accepted_tokens + 1)
    agree, total, diffs = agreement([off, *ms[2:]])
    assert (agree, total) == (3, 4) and off.key.id in diffs[0]


def test_the_report_shows_the_per_request_view(tmp_path: Path) -> None:
    ms = _windows(np.random.default_rng(3))
    files = write_report(analyze(ms, PromoteSpec(min_repeats=2)), tmp_path, measurements=ms)
    text = files.report.read_text()
    assert "agrees with the /metrics counters in 4 of 4 speculative windows" in text
    assert "### Per request, by prompt length (c=1)" in text
    assert "| draft_model-n4 | <= 20 | 8 | 2.500 [" in text
    assert "**The best engine differs by prompt length.**" in text
    assert (tmp_path / "request_acceptance-chat.png") in files.plots
