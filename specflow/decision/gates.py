"""The gates a candidate must pass besides speed: temperature-0 output agreement with the
baseline (Newcombe's interval) and the latency SLOs."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specflow.decision.model import PointStats, QualityCheck, QualityLevel
from specflow.spec.schema import PromoteSpec
from specflow.stats.critical import z_value
from specflow.stats.intervals import newcombe_interval, wilson_interval


@dataclass(frozen=True)
class QualityReference:
    """The baseline's outputs for one workload: the reference (majority) digest per request, and
    per concurrency level how often the baseline's own runs differ from it (batching changes the
    numerics per level, so its self-disagreement is measured where the candidate is)."""

    prompt_hash: str
    digests: tuple[str, ...]
    baseline: Mapping[int, tuple[int, int]]
    """Per concurrency level: (run, request) pairs of the baseline, and how many differ."""


def _mismatches(digests: Sequence[str], reference: Sequence[str]) -> list[int]:
    """Indices of the requests whose output digest differs from the reference's."""
    return [i for i, (x, y) in enumerate(zip(digests, reference, strict=True)) if x != y]


def _majority(runs: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """Per request, the digest most runs produced (ties: the smallest digest, so that the
    reference does not depend on record order)."""
    return tuple(min(Counter(seen).most_common(), key=lambda kv: (-kv[1], kv[0]))[0]
                 for seen in zip(*runs, strict=True))


def quality_references(baseline: Sequence[PointStats]
                       ) -> tuple[dict[str, QualityReference], dict[str, str]]:
    """Per workload, the baseline's reference outputs over all its runs and levels, with its own
    mismatch counts per level (or why there is no reference)."""
    runs: dict[str, list[tuple[int, str, tuple[str, ...]]]] = defaultdict(list)
    for p in baseline:
        for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
            if d:
                runs[p.workload].append((p.concurrency, ph, d))
    refs, missing = {}, {}
    for workload in sorted({p.workload for p in baseline}):
        rs = runs[workload]
        if not rs:
            missing[workload] = f"the baseline recorded no output digests for {workload}"
            continue
        if len({(ph, len(d)) for _, ph, d in rs}) > 1:
            missing[workload] = (f"the baseline's runs of {workload} used different prompts "
                                 "(prompt_hash or count differs); re-measure it")
            continue
        reference = _majority([d for _, _, d in rs])
        counts: dict[int, tuple[int, int]] = {}
        for c, _, d in rs:
            pairs, bad = counts.get(c, (0, 0))
            counts[c] = (pairs + len(d), bad + len(_mismatches(d, reference)))
        refs[workload] = QualityReference(rs[0][1], reference, counts)
    return refs, missing


def _rate_test(concurrency: int, candidate: tuple[int, int], baseline: tuple[int, int],
               promote: PromoteSpec) -> QualityLevel:
    """One level's test on (pairs, mismatches) counts: the lower confidence bound of the
    candidate's excess mismatch rate over the baseline's own must not exceed the tolerance. A
    bound on a rate, not a count of mismatches, so that more repeats of a candidate sharpen the
    estimate instead of making rejection likelier by themselves."""
    q, z = promote.quality, z_value(promote.confidence)
    (n1, x1), (n2, x2) = candidate, baseline
    lo = (newcombe_interval(x1, n1, x2, n2, z)[0] if q.calibrate_with_baseline_repeat
          else wilson_interval(x1, n1, z)[0])
    return QualityLevel(concurrency, n1, x1, n2, x2, lo, lo <= q.max_mismatch_fraction)


def _add(counts: dict[int, tuple[int, int]], level: int, pairs: int, bad: int) -> None:
    """Add (pairs, mismatches) to a level's counts."""
    n, x = counts.get(level, (0, 0))
    counts[level] = (n + pairs, x + bad)


def _compare_runs(points: Sequence[PointStats], ref: QualityReference
                  ) -> tuple[dict[int, tuple[int, int]], set[int], list[str]]:
    """A candidate's runs of one workload against the reference: (pairs, mismatches) per level,
    the requests some run got wrong, and the runs that cannot be compared."""
    counts: dict[int, tuple[int, int]] = {}
    bad: set[int] = set()
    problems: list[str] = []
    for p in points:
        for ph, d in zip(p.prompt_hashes, p.digests, strict=True):
            if not d:
                problems.append(f"{p.label} recorded no output digests")
            elif len(d) != len(ref.digests) or (ph and ref.prompt_hash
                                                and ph != ref.prompt_hash):
                problems.append(f"{p.label} was sent different prompts than the baseline")
            else:
                idx = _mismatches(d, ref.digests)
                _add(counts, p.concurrency, len(d), len(idx))
                bad.update(idx)
    return counts, bad, problems


def quality_check(candidate: Sequence[PointStats], refs: Mapping[str, QualityReference],
                  missing: Mapping[str, str], promote: PromoteSpec) -> QualityCheck:
    """Test a candidate's output mismatch rate in one band against the baseline's, at every
    concurrency level of the band (the class's workloads pooled per level)."""
    calibrated = promote.quality.calibrate_with_baseline_repeat
    cand: dict[int, tuple[int, int]] = {}
    base: dict[int, tuple[int, int]] = {}
    bad: set[tuple[str, int]] = set()
    problems: list[str] = []
    requests = 0
    for workload in sorted({p.workload for p in candidate}):
        if workload in missing:
            problems.append(missing[workload])
            continue
        ref = refs[workload]
        mine = [p for p in candidate if p.workload == workload]
        for c in sorted({p.concurrency for p in mine}):
            _add(base, c, *ref.baseline.get(c, (0, 0)))
            if calibrated and c not in ref.baseline:
                problems.append(f"the baseline recorded no output digests for {workload} at "
                                f"c={c}: its own mismatch rate there is unknown")
        counts, wrong, run_problems = _compare_runs(mine, ref)
        for c, (n, x) in counts.items():
            _add(cand, c, n, x)
        bad.update((workload, i) for i in wrong)
        problems += run_problems
        requests += len(ref.digests)
    levels = tuple(_rate_test(c, cand.get(c, (0, 0)), base[c], promote) for c in sorted(base))
    problem = "; ".join(dict.fromkeys(problems)) or None
    passed = problem is None and requests > 0 and all(lv.passed for lv in levels)
    return QualityCheck(requests, promote.quality.max_mismatch_fraction, passed, levels,
                        calibrated, tuple(f"{w}#{i}" for w, i in sorted(bad)[:8]), problem)


def slo_violations(points: Iterable[PointStats], promote: PromoteSpec) -> list[str]:
    """Each latency SLO broken (or not recorded) at a point, judged by its worst repeat."""
    out = []
    for key, bound in promote.slo.model_dump().items():
        if bound is None:
            continue
        for p in points:
            if not p.n_ok:
                continue
            worst = p.latency_worst.get(key)
            if worst is None:
                out.append(f"{key} not recorded at {p.workload} c={p.concurrency}")
            elif worst > bound:
                out.append(f"{key} {worst:.1f} > {bound:g} at {p.workload} c={p.concurrency}")
    return out
