"""Acceptance profiles: built from a sweep's windows, written and read back against their schema,
exported by `python -m specflow profile`, and compiled into vLLM's synthetic sampler on a GPU
config (refused on the CPU engine before anything starts)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specflow.config.compose import load_plan
from specflow.records.measurement import Measurement, RequestStats
from specflow.results.ledger import Ledger, SweepInfo
from specflow.search import profiles
from specflow.spec import profile
from specflow.spec.errors import SpecError
from tests.builders import Cand, engine, sweep
from tests.conftest import run_cli

LLAMA_EAGLE3 = (0.7296, 0.5208, 0.3545)
"""vLLM CI (MT-Bench, N=3, temperature 0): Llama-3.1-8B with EAGLE-3, per-position rates."""
PINS = {"vllm": "0.32.0", "target_model": "meta-llama/Llama-3.1-8B-Instruct",
        "target_revision": "0e9e39f", "drafter.eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B@main"}


def _requests(n: int, first: float) -> tuple[RequestStats, ...]:
    """20 requests, prompts 40..230 tokens; longer prompts accept a little more."""
    out = []
    for i in range(20):
        steps = 40
        accepted = round(steps * (first + 0.01 * i) * 2)
        out.append(RequestStats(prompt_tokens=40 + 10 * i, output_tokens=steps + accepted,
                                latency_s=1.0, ttft_s=0.1, spec_steps=steps, accepted=accepted,
                                drafted=steps * n))
    return tuple(out)


def _windows(rates_at: dict[int, tuple[float, ...]], levels: tuple[int, ...] = (1, 8)
             ) -> list[Measurement]:
    """A sweep of the EAGLE-3 series at the N of `rates_at` (each N's per-position rates),
    windows 3 per point, with per-request acceptance and the sampling they carried."""
    cands = [Cand(engine(f"eagle3-n{n}", "eagle3", n), {c: 1.2 for c in levels}, ppa=rates)
             for n, rates in rates_at.items()]
    ms, _ = sweep(cands, levels=levels, repeats=3, cls="chat", workloads=("mtbench",))
    out = []
    for m in ms:
        if m.method == "none":
            out.append(m)
            continue
        # window-to-window spread of the rates (+/- 1%)
        k = 1 + 0.01 * (m.key.repeat - 1)
        out.append(dataclasses.replace(
            m, per_position_acceptance=tuple(r * k for r in m.per_position_acceptance),
            num_drafts=400, requests=_requests(m.num_speculative_tokens,
                                               m.per_position_acceptance[0] / 2),
            sampling={"temperature": 0.0}))
    return out


def test_a_chain_series_profile_has_rates_curve_histogram_and_prompt_bins() -> None:
    ms = _windows({1: LLAMA_EAGLE3[:1], 2: LLAMA_EAGLE3[:2], 3: LLAMA_EAGLE3})
    (p,) = profiles.build(ms, PINS, sweep_id="s1")
    assert (p.traffic_class, p.drafter, p.method, p.n_max, p.temperature) == (
        "chat", "eagle3", "eagle3", 3, 0.0)
    assert p.target == "meta-llama/Llama-3.1-8B-Instruct@0e9e39f" and p.vllm == "0.32.0"
    assert p.drafter_model == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B@main"
    assert [r.value for r in p.rates] == pytest.approx(LLAMA_EAGLE3, abs=1e-4)
    assert all(r.lo < r.value < r.hi for r in p.rates)  # windows 1% apart
    assert p.windows == 6  # 3 per level, pooled over concurrency
    assert p.model == "chain" and p.why == ""
    assert [c.n for c in p.curve] == [1, 2, 3]
    for c in p.curve:
        assert c.measured is not None and c.predicted is not None
        assert c.predicted.lo <= c.measured.value <= c.predicted.hi
    assert p.curve[-1].measured.value == pytest.approx(2.605, abs=1e-3)  # type: ignore[union-attr]
    assert sum(p.histogram.values()) == 20 * 6 and set(p.histogram) >= {"2.0-2.5"}
    assert [b.prompt_tokens for b in p.by_prompt_length] == ["<= 100", "101-170", "171-230"]
    lengths = [b.acceptance_length.value for b in p.by_prompt_length
               if b.acceptance_length is not None]
    assert lengths == sorted(lengths) and len(lengths) == 3
    # written and read back against the schema
    text = profile.dumps(p)
    assert json.loads(text)["kind"] == "specflow.acceptance_profile"
    path = Path(profiles.file_name(p))
    assert path.name == "chat--eagle3--t0.json"


def test_a_series_that_is_not_a_chain_is_measured_per_n(tmp_path: Path) -> None:
    # a multi-layer MTP (vLLM PR 48892): N=1 accepts its first token 0.834, N=8's first 0.762
    n8 = (0.762, 0.616, 0.513, 0.424, 0.364, 0.309, 0.272, 0.237)
    (p,) = profiles.build(_windows({1: (0.834,), 8: n8}), PINS, sweep_id="s2")
    assert p.model == "measured per N"
    assert p.why.startswith("chain check at N=1 missed: acceptance length 1.834")
    assert p.curve[0].measured is not None and p.curve[3].measured is None  # N=4 not run


def test_a_profile_file_is_validated_and_drives_a_synthetic_drafter_on_a_gpu_only(
        tmp_path: Path) -> None:
    (p,) = profiles.build(_windows({3: LLAMA_EAGLE3}), PINS, sweep_id="s1")
    good = tmp_path / "chat--eagle3.json"
    good.write_text(profile.dumps(p))
    assert profile.read(good) == p
    # the GPU check's EAGLE-3 at N=1..3 accepts at the profile's rates
    at = "drafter.eagle3"
    _, plan = load_plan(["experiment=gpu_check", f"~{at}.extra_speculative_config",
                         f"+{at}.acceptance_profile={good}",
                         "sweep.num_speculative_tokens.eagle3=1..3"])
    got = {e.name: e.speculative_config for e in plan.engine_configs if e.drafter == "eagle3"}
    assert got["eagle3-n3"]["rejection_sample_method"] == "synthetic"
    assert got["eagle3-n3"]["synthetic_acceptance_rates"] == [0.7296, 0.5208, 0.3545]
    assert got["eagle3-n1"]["synthetic_acceptance_rates"] == [0.7296]
    # beyond the profile's largest N there are no rates to emulate
    with pytest.raises(SpecError) as info:
        load_plan(["experiment=gpu_check", f"~{at}.extra_speculative_config",
                   f"+{at}.acceptance_profile={good}"])
    assert any(x.path == f"{at}.extra_speculative_config.synthetic_acceptance_rates"
               for x in info.value.problems), info.value.problems
    # refused on the CPU engine, before anything starts
    with pytest.raises(SpecError) as info:
        load_plan(["experiment=gpu_check", "hardware=cpu", "backend=cpu",
                   f"~{at}.extra_speculative_config", f"+{at}.acceptance_profile={good}",
                   "sweep.num_speculative_tokens.eagle3=1..3"])
    assert any("the CPU engine has no synthetic acceptance" in x.problem
               for x in info.value.problems), info.value.problems
    # a file that is not a profile, or not there: named at the field, all at once
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(profile.dumps(p)), "rates": "high"}))
    proc = run_cli("compile", "experiment=gpu_check", f"~{at}.extra_speculative_config",
                   f"+{at}.acceptance_profile={bad}",
                   f"+drafter.draft_model.acceptance_profile={tmp_path / 'none.json'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{at}.acceptance_profile: not an acceptance profile (1 problems; rates:" in proc.stderr
    assert "drafter.draft_model.acceptance_profile: sets the synthetic acceptance itself" in \
        proc.stderr


def test_profile_exports_a_sweeps_profiles(tmp_path: Path) -> None:
    ms = _windows({1: LLAMA_EAGLE3[:1], 3: LLAMA_EAGLE3})
    ledger = Ledger(tmp_path / "work", "sweep-a")
    for m in ms:
        ledger.record(m)
    ledger.write_info(SweepInfo(sweep_id="sweep-a", plan_hash="p", target="llama3_1_8b",
                                hardware="h200", experiment="e", measured={}, pins=PINS,
                                opened_at="2026-12-03T00:00:00Z"))
    where = [f"tracking.workdir={tmp_path / 'work'}",
             f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    proc = run_cli("profile", "sweep-a", "--out", str(tmp_path / "out"), *where)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("chat eagle3 (t=0): N=3 acceptance length 2.60 [")
    assert "rates 0.730, 0.521, 0.354; chain; 6 windows -> " in proc.stdout, proc.stdout
    (exported,) = (tmp_path / "out").iterdir()
    assert profile.read(exported).sweep_id == "sweep-a"
    js = run_cli("profile", str(tmp_path / "work" / "sweeps" / "sweep-a"), "chat", "eagle3",
                 "--json", *where)
    assert js.returncode == 0 and json.loads(js.stdout)[0]["n_max"] == 3
    none = run_cli("profile", "sweep-a", "code", *where)
    assert none.returncode == 2 and "Traceback" not in none.stderr
    assert "profile: no drafter of this sweep measured per-position acceptance there" in \
        none.stderr


def test_compare_holds_a_sweeps_acceptance_length_against_a_published_curve(
        tmp_path: Path) -> None:
    """`compare SWEEP reference:FILE`: each measured N on the curve as measured or worse beyond
    noise (exit 3), a curve of another method not comparable (exit 4); the windows' tokens per
    step are in the profile (what `watch` holds live traffic against first)."""
    ms = [dataclasses.replace(m, total_output_tokens=1000, accepted_tokens=
                              round(400 * sum(m.per_position_acceptance)))
          if m.method != "none" else m for m in _windows({1: LLAMA_EAGLE3[:1],
                                                          3: LLAMA_EAGLE3})]
    ledger = Ledger(tmp_path / "work", "s1")
    for m in ms:
        ledger.record(m)
    (p,) = profiles.build(ms, PINS, sweep_id="s1")
    assert p.tokens_per_step is not None and p.tokens_per_step.value == pytest.approx(
        1000 / (1000 - 400 * sum(LLAMA_EAGLE3)), rel=0.02)
    measured3 = next(c for c in p.curve if c.n == 3).measured
    assert measured3 is not None
    curve = tmp_path / "golden.csv"
    args = [f"tracking.workdir={tmp_path / 'work'}", f"promote.output_dir={tmp_path / 'p'}"]
    curve.write_text(f"n,acceptance_length\n1,{1 + LLAMA_EAGLE3[0]:.4f}\n3,"
                     f"{measured3.value:.4f}\n8,4.0\n")
    same = run_cli("compare", "s1", f"reference:{curve}", *args)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "chat eagle3 N=3: 2.605" in same.stdout and "as measured" in same.stdout
    curve.write_text("n,acceptance_length\n3,3.1\n")
    worse = run_cli("compare", "s1", f"reference:{curve}", *args)
    assert worse.returncode == 3 and "worse beyond noise" in worse.stdout, worse.stdout
    other = tmp_path / "dspark.json"
    other.write_text(json.dumps({"method": "dspark", "points": [{"n": 3, "al": 3.7}]}))
    none = run_cli("compare", "s1", f"reference:{other}", *args)
    assert none.returncode == 4 and "nothing comparable" in none.stdout, none.stdout
    bad = run_cli("compare", "s1", f"reference:{tmp_path / 'missing.csv'}", *args)
    assert bad.returncode == 2 and "compare B: cannot read it" in bad.stderr, bad.stderr
