"""Watch's rules on counters whose answer is known: windows of increments (a restarted server,
an unreadable one, series of several engines), the pooled estimates and their intervals, and
the verdicts against a profile or a reference curve."""

from __future__ import annotations

import math

import pytest

from specflow.decision import watch as w
from specflow.spec.profile import (
    AcceptanceProfile,
    CurvePoint,
    Interval,
    ReferenceCurve,
    ReferencePoint,
)


def _reading(t: float, drafts: float, accepted: float, generated: float,
             per_pos: tuple[float, ...], engine: str = "0") -> w.Reading:
    ident = f"engine={engine},model_name=m"
    values = {(w.DRAFTS, -1, ident): drafts, (w.DRAFT_TOKENS, -1, ident): drafts * len(per_pos),
              (w.ACCEPTED, -1, ident): accepted, (w.GENERATED, -1, ident): generated}
    values.update({(w.POSITION, i, ident): v for i, v in enumerate(per_pos)})
    return w.Reading(t, values)


def _steady(t0: float, count: int, *, drafts: int = 10, rates: tuple[float, ...] = (0.8, 0.5),
            generated: int = 40, every: float = 1.0, start: int = 0) -> list[w.Reading]:
    """Readings of a server that serves the same thing each `every` seconds."""
    out = []
    for k in range(count):
        n = start + k
        per_pos = tuple(r * drafts * n for r in rates)
        out.append(_reading(t0 + k * every, drafts * n, sum(per_pos), generated * n, per_pos))
    return out


def test_windows_sum_increments_and_handle_a_restart_and_an_unreadable_server() -> None:
    rs = _steady(100.0, 5)  # t = 100..104: 4 increments of 10 drafts
    # the server restarts: counters from zero, read at 105 (after serving once) and 106
    rs += _steady(105.0, 2, start=1)
    rs.insert(4, w.Reading(103.5, {}, "unreachable"))
    ws = w.windows(rs, 100.0, 3.0, 3)
    assert [x.drafts for x in ws] == [20, 30, 10]  # 101, 102 | 103, 104, 105 (from 0) | 106
    assert ws[1].resets == 1 and ws[1].unread == 1 and ws[0].resets == 0
    assert "server restarted" in ws[1].note() and "1 readings failed" in ws[1].note()
    assert ws[0].per_position == (16, 10) and ws[0].rates == (0.8, 0.5)
    assert ws[0].acceptance_length == pytest.approx(1 + 26 / 20)
    assert ws[0].tokens_per_step == pytest.approx(80 / (80 - 26))
    # no reading in a window: no traffic
    empty = w.windows(rs, 200.0, 3.0, 1)[0]
    assert not empty.traffic and empty.note() == "no traffic"


def test_series_of_several_engines_add_up_and_one_engine_restarting_loses_nothing_else() -> None:
    a = _steady(0.0, 4)
    b = [w.Reading(r.t, {(k[0], k[1], "engine=1,model_name=m"): v for k, v in r.values.items()})
         for r in _steady(0.0, 4, start=5)]
    # engine 1 restarts before its third reading (5 -> 1 + 1 step)
    b[2] = w.Reading(b[2].t, {k: v / 7 * 1 for k, v in b[2].values.items()})
    merged = [w.Reading(x.t, {**x.values, **y.values}) for x, y in zip(a, b, strict=True)]
    got = w.windows(merged, 0.0, 10.0, 1)[0]
    # engine 0: 3 x 10; engine 1: 10, then 10 (from zero after the restart), then 80 - 10
    assert got.drafts == 30 + 10 + 10 + (80 - 10) and got.resets == 1


def test_pooled_ratio_interval_covers_and_shrinks_with_windows() -> None:
    one = w.ratio_band([3.0], [4.0], 0.95)
    assert one is not None and one.value == one.lo == one.hi == 0.75 and one.df == 0
    assert w.ratio_band([1.0], [0.0], 0.95) is None
    few = w.ratio_band([3, 5, 4], [4, 6, 5], 0.95, 1.0)
    many = w.ratio_band([3, 5, 4] * 10, [4, 6, 5] * 10, 0.95, 1.0)
    assert few is not None and many is not None
    assert few.value == pytest.approx(1 + 12 / 15) == many.value
    assert few.lo < few.value < few.hi and (many.hi - many.lo) < (few.hi - few.lo)


def test_verdicts_need_the_change_beyond_noise_and_beyond_the_tolerance() -> None:
    ref = w.Band.of(3.0, 2.8, 3.2, 0.95, 8)
    assert ref.se > 0 and ref.df == 7
    tight = w.Band(2.5, 2.45, 2.55, 0.02, 20)
    assert w.verdict(tight, ref, 0.95, 0.05) == w.WORSE
    assert w.verdict(w.Band(3.5, 3.45, 3.55, 0.02, 20), ref, 0.95, 0.05) == w.BETTER
    assert w.verdict(w.Band(2.9, 2.5, 3.3, 0.2, 3), ref, 0.95, 0.05) == w.AS_MEASURED
    exact = w.Band(1.0, 1.0, 1.0)
    # both exact: a 3% drop is within the tolerance, a 10% one is not
    assert w.verdict(w.Band(0.97, 0.97, 0.97), exact, 0.95, 0.05) == w.AS_MEASURED
    assert w.verdict(w.Band(0.9, 0.9, 0.9), exact, 0.95, 0.05) == w.WORSE


def _profile(**kw: object) -> AcceptanceProfile:
    base: dict[str, object] = dict(
        sweep_id="s1", target="/models/t@unpinned", drafter="ngram-n2", method="ngram",
        drafter_model=None, traffic_class="code", workloads=("code_completion",),
        temperature=0.0, vllm="0.32", n_max=2,
        rates=(Interval(value=0.8, lo=0.78, hi=0.82), Interval(value=0.5, lo=0.48, hi=0.52)),
        curve=(CurvePoint(n=1, predicted=Interval(value=1.8, lo=1.75, hi=1.85)),
               CurvePoint(n=2, measured=Interval(value=2.3, lo=2.25, hi=2.35))),
        model="chain", windows=8, tokens_per_step=Interval(value=1.9, lo=1.85, hi=1.95))
    base.update(kw)
    return AcceptanceProfile.model_validate(base)


def test_traffic_like_the_profile_is_as_measured_and_traffic_it_cannot_predict_is_worse(
        ) -> None:
    expected = w.from_profile(_profile(), 2, speedup=1.6)
    assert expected.n == 2 and len(expected.rates) == 2 and expected.tokens_per_step is not None
    # per 10 drafts: 8 + 5 accepted (as the profile), 13 of 27.4 generated: tps 1.9
    same = w.windows(_steady(0.0, 13, generated=27), 0.0, 3.0, 4)
    got = w.watch(same, expected)
    assert got.outcome == w.AS_MEASURED, got.rows
    assert [r.figure for r in got.rows] == ["tokens per step", "acceptance length", "position 1",
                                           "position 2"]
    assert got.predicted == pytest.approx(1.0, abs=0.03)
    assert w.watch(same, w.from_profile(_profile(), 2)).predicted == pytest.approx(
        (27 / 14) / 1.9)  # no speedup known: the tokens-per-step ratio
    # the drafter finds little to propose: fewer drafts, each as good; tokens per step falls
    sparse = w.windows(_steady(0.0, 13, drafts=2, generated=27), 0.0, 3.0, 4)
    low = w.watch(sparse, expected)
    tps = next(r for r in low.rows if r.figure == "tokens per step")
    al = next(r for r in low.rows if r.figure == "acceptance length")
    assert low.outcome == w.WORSE and low.dropped and tps.verdict == w.WORSE
    assert al.verdict == w.AS_MEASURED  # acceptance of what it drafts did not change
    assert low.predicted is not None and low.predicted < 0.9
    assert low.predicted_speedup == pytest.approx(1.6 * low.predicted)
    # a drafter that proposes nothing at all: no drafts, tokens per step 1
    none = w.windows(_steady(0.0, 13, drafts=0, generated=27), 0.0, 3.0, 4)
    nothing = w.watch(none, expected)
    assert nothing.outcome == w.WORSE
    # every step a plain decode step: the speedup is gone, not turned into a slowdown
    assert nothing.predicted_speedup == pytest.approx(1.0)
    assert next(r for r in nothing.rows if r.figure == "acceptance length").why == \
        "no drafts in these windows"


def test_no_traffic_and_a_single_window_are_said_not_judged() -> None:
    expected = w.from_profile(_profile(), 2)
    idle = [w.Reading(t, next(iter(_steady(0.0, 1))).values) for t in range(10)]
    got = w.watch(w.windows(idle, 0.0, 3.0, 3), expected)
    assert got.outcome == "no traffic" and not got.rows and not got.dropped
    one = w.watch(w.windows(_steady(0.0, 3), 0.0, 5.0, 2), expected)
    assert one.outcome == "too few windows" and one.notes


def test_more_positions_live_than_the_reference_are_noted_and_not_held() -> None:
    got = w.watch(w.windows(_steady(0.0, 9, rates=(0.8, 0.5, 0.3)), 0.0, 2.0, 4),
                  w.from_profile(_profile(), 2))
    assert "the servers draft 3 tokens; the reference is at N=2" in got.notes[0]
    assert [r.figure for r in got.rows][-1] == "position 2"


def test_a_reference_curve_holds_acceptance_length_only_and_the_sweeps_n_against_it() -> None:
    ref = ReferenceCurve(name="golden", points=(ReferencePoint(n=2, acceptance_length=2.3),
                                                ReferencePoint(n=3, acceptance_length=2.9)))
    assert w.from_reference(ref, 4) is None
    e = w.from_reference(ref, 2)
    assert e is not None and e.acceptance_length is not None and not e.rates
    got = w.watch(w.windows(_steady(0.0, 9), 0.0, 2.0, 4), e)
    assert got.outcome == w.AS_MEASURED  # 1 + 13/10 = 2.3
    # a curve has no tokens per step: servers that draft nothing cannot be held against it
    idle = w.watch(w.windows(_steady(0.0, 9, drafts=0), 0.0, 2.0, 4), e)
    assert idle.outcome == "nothing to hold" and not idle.dropped
    rows = w.against_reference([_profile()], ref)
    assert [(r.n, r.row.verdict) for r in rows] == [(2, w.AS_MEASURED)]
    worse = w.against_reference([_profile()], ReferenceCurve(
        name="better drafter", points=(ReferencePoint(n=2, acceptance_length=3.0),)))
    assert worse[0].row.verdict == w.WORSE
    assert not w.against_reference([_profile()], ReferenceCurve(
        name="other", drafter="eagle3", points=(ReferencePoint(n=2, acceptance_length=3.0),)))
    assert math.isclose(e.acceptance_length.value, 2.3)
