"""The Markdown decision report and its PNG plots, from hand-built records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specflow.decision.choose import analyze
from specflow.results.report import write_report
from specflow.spec.schema import PromoteSpec, SloSpec
from tests.builders import BASELINE, Cand, engine, sweep, window

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_and_plots_from_hand_built_records(tmp_path: Path) -> None:
    e3n2, e3n3 = engine("eagle3-n2", "eagle3", 2), engine("eagle3-n3", "eagle3", 3)
    ngram = engine("ngram-n4", "ngram", 4)
    rng = np.random.default_rng(0)
    math, close = sweep([Cand(e3n3, {1: 1.6, 8: 0.85}, ppa=(0.8, 0.6, 0.45)),
                         Cand(e3n2, {1: 1.4, 8: 0.9}, ppa=(0.8, 0.6)),
                         Cand(ngram, {1: 1.1, 8: 1.0}, ppa=(0.5, 0.3, 0.2, 0.1))],
                        levels=(1, 8), repeats=3, closing=3, cv=0.02, rng=rng)
    math.append(window(e3n3, 0.0, c=8, r=3, failure="oom"))
    chat, _ = sweep([Cand(e3n3, 0.9, ppa=(0.5, 0.3, 0.2))], levels=(1, 8), repeats=3,
                    workloads=("chat",), cls="chat", cv=0.02, rng=rng)
    spec = PromoteSpec(slo=SloSpec(p99_tpot_ms=50))
    analysis = analyze(math + chat, spec, closing_baseline=close)

    files = write_report(analysis, tmp_path / "report")
    assert files.report == tmp_path / "report" / "report.md"
    assert {p.name for p in files.plots} == {
        "throughput_vs_n-gsm8k.png", "throughput_vs_n-chat.png", "acceptance-gsm8k.png",
        "acceptance-chat.png", "speedup_vs_concurrency-math.png",
        "speedup_vs_concurrency-chat.png"}
    for p in files.paths:
        assert p.is_file() and p.stat().st_size > 0
    for p in files.plots:
        assert p.read_bytes()[:8] == PNG

    text = files.report.read_text()
    assert "by at most 0.0% at the 95% lower bound" in text and "p99_tpot_ms <= 50" in text
    assert "engine starts as replicates" in text and "Holm" in text
    assert "## Traffic class `math`" in text and "## Traffic class `chat`" in text
    assert "**Deploy: eagle3 (eagle3), schedule `[[1, 7, 3], [8, 8, 0]]`" in text
    assert "**Deploy: speculation off**" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| c")]
    # Per class (chat, then math) and band: every candidate, plus the "off" row.
    assert [(r[0].lstrip("| "), r[1], r[4]) for r in rows] == [
        ("c1", "eagle3-n3", "ruled out"), ("c1", "off (baseline)", "wins"),
        ("c8", "eagle3-n3", "ruled out"), ("c8", "off (baseline)", "wins"),
        ("c1", "eagle3-n3", "wins"), ("c1", "eagle3-n2", "passes"),
        ("c1", "ngram-n4", "open"), ("c1", "off (baseline)", "ruled out"),
        ("c8", "eagle3-n2", "ruled out"), ("c8", "eagle3-n3", "ruled out"),
        ("c8", "ngram-n4", "ruled out"), ("c8", "off (baseline)", "wins")]
    assert "### Baseline between its engine starts" in text and "| #0 -> #" in text
    assert "| eagle3-n3 | gsm8k | 8 | 3 | oom x1 |" in text  # excluded windows are counted
    assert "![speedup_vs_concurrency-math](speedup_vs_concurrency-math.png)" in text
    assert BASELINE.hash in text


def test_predicted_vs_measured_section_plot_and_metrics(tmp_path: Path) -> None:
    from specflow.search import predict

    e3n2, e3n3 = engine("eagle3-n2", "eagle3", 2), engine("eagle3-n3", "eagle3", 3)
    rng = np.random.default_rng(1)
    ms, close = sweep([Cand(e3n3, {1: 1.6, 8: 0.85}, ppa=(0.8, 0.6, 0.45)),
                       Cand(e3n2, {1: 1.4, 8: 0.9}, ppa=(0.8, 0.6))],
                      levels=(1, 8), repeats=3, closing=3, cv=0.02, rng=rng)
    analysis = analyze(ms, PromoteSpec(), closing_baseline=close)
    rows = predict.versus(predict.point_speedups(analysis), ms, [BASELINE, e3n2, e3n3])
    assert [(v.engine, v.probe, v.concurrency) for v in rows] == [
        ("eagle3-n2", "eagle3-n3", 1), ("eagle3-n2", "eagle3-n3", 8)]
    # MAL(2) = 1 + 0.8 + 0.6, as measured
    assert rows[0].predicted.mal == pytest.approx(2.4) and rows[0].mal == pytest.approx(2.4)
    # a chain: N=2 accepts what N=3's first two positions do
    assert all(v.check is not None and v.check.holds for v in rows)
    # a third N whose first position accepts more than N=3's: its curve cannot be a chain
    e3n1 = engine("eagle3-n1", "eagle3", 1)
    ms1, _ = sweep([Cand(e3n1, {1: 1.5, 8: 0.95}, ppa=(0.99,))], levels=(1, 8), repeats=3,
                   closing=0, cv=0.02, rng=rng)
    curves = predict.curves([*ms, *(m for m in ms1 if m.key.engine_hash == e3n1.hash)],
                            [BASELINE, e3n1, e3n2, e3n3])
    assert [(c.concurrency, c.broken[:35]) for c in curves] == [
        (1, "acceptance length grows faster from"), (8, "acceptance length grows faster from")]
    files = write_report(analysis, tmp_path / "report", versus=rows, curves=curves)
    plot = tmp_path / "report" / "predicted_vs_measured.png"
    assert plot in files.plots and plot.read_bytes()[:8] == PNG
    text = files.report.read_text()
    assert "## Predicted vs measured" in text and "at 2 points" in text
    assert "| eagle3-n2 | eagle3-n3 | gsm8k | 1 |" in text and "| holds (+/- 0.024) |" in text
    assert "Series measured at three or more N: 0 of 2 curves can come from a chain." in text
    assert "- eagle3 gsm8k c=1: not a chain (acceptance length grows faster" in text
    metrics = predict.summary(rows)
    assert metrics["predict_points"] == 2 and metrics["predict_chain_missed"] == 0
    assert metrics["predict_mal_error_worst"] == pytest.approx(0.0)
    assert metrics["predict_speedup_error_worst"] == max(abs(v.speedup_error) for v in rows)
    # nothing chained: no section, no plot
    bare = write_report(analysis, tmp_path / "bare")
    assert "Predicted vs measured" not in bare.report.read_text()
    assert not (tmp_path / "bare" / "predicted_vs_measured.png").exists()
