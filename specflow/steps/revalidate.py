"""After the decision: what changed since the last sweep of the same plan, and what to do when
the current champion regressed.

The last sweep of the same plan is the most recently opened other sweep in the same workdir with
the same experiment, target, hardware and workloads: the plan as it ran under other pins (a vLLM
upgrade, a new checkpoint revision) or other settings. Nothing changed means the same sweep id,
which measures nothing new (the ledger resumes), so there is nothing to compare.

The comparison (`specflow compare` of that sweep and this one) is written next to the report.
A champion regressed when a row of its class regressed beyond noise for the engine it deploys
(speedup or acceptance length); `promote.on_regression` then applies (see PromoteSpec).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specflow.champions import promote
from specflow.decision.compare import Comparison, SweepSide, compare
from specflow.decision.model import Analysis, ClassResult, Deployment
from specflow.records.fsio import atomic_write
from specflow.results import comparing
from specflow.results.ledger import Ledger, SweepInfo, sweep_ids
from specflow.spec.compile import EngineConfig
from specflow.steps.context import Context


@dataclass
class Revalidation:
    """The comparison with the previous sweep of the plan, and what the policy did."""

    previous: str | None = None
    """The previous sweep's id (None: this plan never ran under other pins here)."""
    comparison: Comparison | None = None
    markdown: Path | None = None
    regressed: dict[str, list[str]] = field(default_factory=dict)
    """Per class whose champion regressed: the rows that say so."""
    applied: list[str] = field(default_factory=list)
    """What `promote.on_regression` did, one line per class."""


def _same_plan(a: SweepInfo, b: SweepInfo) -> bool:
    return (a.experiment, a.target, a.hardware) == (b.experiment, b.target, b.hardware) and \
        sorted(a.measured.get("workload", {})) == sorted(b.measured.get("workload", {}))


def previous_sweep(workdir: Path | str, current: SweepInfo) -> Ledger | None:
    """The most recently opened other sweep of the same plan under `workdir` (a path or an
    object-store URL; see the module docstring), or None."""
    found: list[tuple[str, Ledger]] = []
    for sid in sweep_ids(workdir):
        if sid == current.sweep_id:
            continue
        ledger = Ledger(workdir, sid)
        info = ledger.info()
        if info is not None and _same_plan(info, current):
            found.append((info.opened_at, ledger))
    return max(found, key=lambda f: f[0])[1] if found else None


def champion_regressions(cmp: Comparison, champions: Mapping[str, promote.GatedRecord | None]
                         ) -> dict[str, list[str]]:
    """Per class whose current champion's engine regressed beyond noise: the rows, in words."""
    out: dict[str, list[str]] = {}
    for cls, champ in champions.items():
        if champ is None or champ.outcome != "promote":
            continue
        rows = [c for c in cmp.regressions if c.traffic_class == cls and
                c.engine == champ.engine.name and c.metric in ("speedup", "acceptance length")]
        if rows:
            out[cls] = [f"{c.engine} {c.metric} at {c.workload} c={c.concurrency}: "
                        f"{c.a:.3f} -> {c.b:.3f} ({comparing.change_text(c)})" for c in rows]
    return out


def _off(result: ClassResult, why: str) -> ClassResult:
    """The class's result deployed as off (its baseline), every band without a winner."""
    dep = result.deployment
    off = Deployment(result.traffic_class, "off", dep.baseline_hash, "baseline", "none", "none",
                     0, None, dep.baseline_hash, (why,))
    decisions = tuple(dataclasses.replace(d, winner=None, unresolved="", reasons=(why,))
                      for d in result.decisions)
    return dataclasses.replace(result, deployment=off, decisions=decisions)


def apply_policy(policy: str, regressed: Mapping[str, list[str]], analysis: Analysis,
                 promotions: list[promote.Promotion], engines: Mapping[str, EngineConfig],
                 spec: promote.PromoteSpec, sweep_id: str) -> list[str]:
    """`promote.on_regression` for each class whose champion regressed; `promotions` is
    updated in place; one line per class says what was done."""
    lines = []
    by_class = {p.traffic_class: i for i, p in enumerate(promotions)}
    for cls in sorted(regressed):
        i = by_class.get(cls)
        current = promotions[i] if i is not None else None
        if current is not None and current.status == "promoted" and (
                policy != "off" or current.record.outcome == "off"):
            lines.append(f"{cls}: the champion is this sweep's decision already (it passed "
                         "the regression gate)")
            continue
        if policy == "keep":
            lines.append(f"{cls}: the regressed champion is kept (promote.on_regression=keep)")
            continue
        result = analysis.result(cls)
        if policy == "demote":
            if current is None or current.status in ("unchanged", "restored"):
                lines.append(f"{cls}: the champion is this sweep's decision already")
                continue
            if current.status == "unresolved":
                lines.append(f"{cls}: kept: this sweep's decision is unresolved, so there is "
                             "nothing measured to demote it to")
                continue
            result_to = result
            what = "this sweep's decision"
        else:
            result_to = _off(result, "the champion regressed beyond noise; "
                                     "promote.on_regression=off")
            what = "off"
        p = promote.promote_class(result_to, engines, spec, force=True, sweep_id=sweep_id)
        if i is None:
            promotions.append(p)
        else:
            promotions[i] = p
        lines.append(f"{cls}: demoted to {what} (promote.on_regression={policy}): version "
                     f"{p.version}")
    return lines


def compare_with_previous(ctx: Context) -> tuple[str, Comparison] | None:
    """`specflow compare` of the last sweep of this plan (see the module docstring) and this
    one: (its id, the comparison), or None when there is none."""
    info = ctx.ledger.info()
    previous = previous_sweep(ctx.ledger.workdir, info) if info else None
    if previous is None:
        return None
    old = previous.info()
    return previous.sid, compare(
        SweepSide(f"sweep {previous.sid}", tuple(previous.measurements()),
                  old.pins if old else {}, old.measured if old else {},
                  old.repeats if old else None),
        SweepSide(f"sweep {ctx.sid} (this one)", tuple(ctx.ledger.measurements()), ctx.pins,
                  info.measured if info else {}, ctx.spec.sweep.repeats),
        confidence=ctx.spec.promote.confidence, tolerance=ctx.spec.promote.tie_tolerance)


def position_drops(cmp: Comparison, champions: Mapping[str, promote.GatedRecord | None]
                   ) -> dict[str, tuple[str, ...]]:
    """Per class whose champion's engine has per-position acceptance rows in the comparison:
    the positions that dropped beyond noise (empty: compared, none did), for the regression
    gate in place of its fixed threshold."""
    out: dict[str, tuple[str, ...]] = {}
    for cls, champ in champions.items():
        if champ is None or champ.outcome != "promote":
            continue
        rows = [c for c in cmp.changes if c.traffic_class == cls and c.engine ==
                champ.engine.name and c.metric == "acceptance at position"
                and c.finding != "workload changed"]
        if rows:
            out[cls] = tuple(
                f"{c.engine} acceptance at position {c.position} ({c.workload} c="
                f"{c.concurrency}) fell {c.a:.3f} -> {c.b:.3f}, beyond noise "
                f"({comparing.change_text(c)})" for c in rows if c.finding == "regression")
    return out


def revalidate(ctx: Context, analysis: Analysis,
               champions: Mapping[str, promote.GatedRecord | None],
               promotions: list[promote.Promotion], engines: Mapping[str, EngineConfig],
               found: tuple[str, Comparison] | None) -> Revalidation:
    """Write `report/comparison.md` for the comparison `found` (`compare_with_previous`) and
    apply the policy where the champion regressed (`champions`: each class's champion before
    this sweep's promotion)."""
    if found is None:
        return Revalidation()
    previous, cmp = found
    regressed = champion_regressions(cmp, champions)
    applied = apply_policy(ctx.spec.promote.on_regression, regressed, analysis, promotions,
                           engines, ctx.spec.promote, ctx.sid) if regressed else []
    text = comparing.markdown(cmp)
    if regressed:
        text += "\n## The champion regressed\n\n" + "".join(
            f"- {line}\n" for lines in regressed.values() for line in lines) + "".join(
            f"- {line}\n" for line in applied)
    path = ctx.workdir / "report" / "comparison.md"
    atomic_write(path, text)
    return Revalidation(previous, cmp, path, regressed, applied)


def regressed_message(r: Revalidation) -> str:
    """One line for the flow run's state and the console."""
    classes = ", ".join(sorted(r.regressed))
    return (f"the champion regressed beyond noise against sweep {r.previous} ({classes}); "
            + ("; ".join(r.applied) or "nothing applied"))


__all__: Sequence[str] = ("Revalidation", "apply_policy", "champion_regressions",
                          "compare_with_previous", "position_drops", "previous_sweep",
                          "regressed_message", "revalidate")
