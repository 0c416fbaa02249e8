"""The words specflow prints are the glossary's (docs/glossary.md): the `Literal` types that
carry them, and what the decision table, the console and the report print for a sweep whose
bands conclude promote, off and unresolved."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import numpy as np

from specflow.champions.promote import BandRecord, ChampionRecord, Promotion
from specflow.decision.choose import analyze
from specflow.decision.compare import Finding
from specflow.decision.model import Outcome, VerdictWord
from specflow.decision.race import BandState
from specflow.decision.wording import decision_rows
from specflow.results.console import decision_lines, deploy_lines
from specflow.results.report import write_report
from specflow.spec.memory import Fit
from specflow.spec.schema import Objective, PromoteSpec
from tests.builders import Cand, engine, sweep

GLOSSARY = Path(__file__).parents[1] / "docs" / "glossary.md"

RETIRED = ("speculate", "beaten", "undecided", "inconclusive", "confirmed [", "status")
"""Words older versions printed beside the glossary's (a band's outcome, the off row's verdict,
a race band's state, a verdict's second field)."""


def _entry(term: str) -> tuple[str, ...]:
    """The backticked words of a glossary entry (its whole set)."""
    text = GLOSSARY.read_text(encoding="utf-8")
    (entry,) = re.findall(rf"^- \*\*{re.escape(term)}\*\*.*?(?=^- \*\*|^$)", text,
                          flags=re.MULTILINE | re.DOTALL)
    return tuple(re.findall(r"`([^`]+)`", entry.split(": ", 1)[1].split(". ")[0]))


def _args(tp: object) -> tuple[str, ...]:
    return typing.get_args(tp)


def test_the_types_carry_the_glossarys_words_and_no_other() -> None:
    assert _args(Outcome) == _entry("outcome") == ("promote", "off", "unresolved")
    assert _args(VerdictWord) == _entry("verdict") == ("wins", "passes", "ruled out", "open")
    state = _args(typing.get_type_hints(BandState)["status"])
    assert state == _entry("band state")
    assert set(state) - {"exploring", "confirming"} == set(_args(Outcome))
    assert _args(Finding) == _entry("finding")
    assert _args(Fit) == _entry("fit")
    assert _args(Objective) == _entry("objective") == ("throughput", "latency", "capacity")
    assert _args(typing.get_type_hints(Promotion)["status"]) == _entry("promotion")
    # the champion file says a band's outcome and the class's in the same words
    assert _args(typing.get_type_hints(BandRecord)["outcome"]) == _args(Outcome)
    assert set(_args(typing.get_type_hints(ChampionRecord)["outcome"])) < set(_args(Outcome))


def test_what_a_decision_prints_uses_only_the_glossarys_words(tmp_path: Path) -> None:
    """Two classes: `math`, whose eagle3 is promoted at c1 and off at c8 (where it loses), and
    `chat`, whose ngram is left unresolved at c1 (a gain too close to the margin) and off at c8;
    the words checked everywhere the decision is said."""
    clear, _ = sweep([Cand(engine("eagle3-n3", "eagle3", 3), {1: 1.6, 8: 0.5})],
                     levels=(1, 8), repeats=3, cv=0.02, rng=np.random.default_rng(0))
    close, _ = sweep([Cand(engine("ngram-n4", "ngram", 4), {1: 1.08, 8: 0.5})],
                     levels=(1, 8), repeats=3, cv=0.10, cls="chat", workloads=("chat-w",),
                     rng=np.random.default_rng(3))
    analyses = [analyze(clear, PromoteSpec()), analyze(close, PromoteSpec())]
    outcomes = {(r.traffic_class, d.band.label): d.outcome
                for a in analyses for r in a.classes for d in r.decisions}
    assert outcomes == {("math", "c1"): "promote", ("math", "c8"): "off",
                        ("chat", "c1"): "unresolved", ("chat", "c8"): "off"}

    rows = [row for a in analyses for r in a.classes for row in decision_rows(r)]
    assert {row["verdict"] for row in rows} <= set(_args(VerdictWord))
    lines = decision_lines(rows)
    assert {line["outcome"] for line in lines} == set(_args(Outcome))
    printed = [*(str(v) for line in lines for v in line.values()), *deploy_lines(rows)]
    report = "\n".join(write_report(a, tmp_path / str(i)).report.read_text(encoding="utf-8")
                       for i, a in enumerate(analyses))
    bands = re.findall(r"^- band \S+ \(levels [^)]*\): \*\*([^*]+)\*\*", report, re.MULTILINE)
    assert set(bands) == set(_args(Outcome))
    table = re.findall(r"^\| (c\d+) \| [^|]+ \| [^|]+ \| \d+ \| ([^|]+) \|", report, re.MULTILINE)
    assert table and {v.strip() for _, v in table} <= set(_args(VerdictWord))
    for text in (*printed, report):
        low = text.lower()
        assert not [w for w in RETIRED if w in low], (text, [w for w in RETIRED if w in low])
