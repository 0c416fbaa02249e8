"""Reports of a decision: a Markdown decision table and PNG plots, as files whose paths are
returned (tracking logs them as artifacts).

Plots use matplotlib's Agg canvas directly (no pyplot, no global backend state, no display).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from specflow.decision.aggregate import label_statistic
from specflow.decision.beside import Beside
from specflow.decision.beside import lines as beside_lines
from specflow.decision.capacity import replicas
from specflow.decision.model import Analysis, ClassResult, Estimate, PointSpeedup, PointStats
from specflow.decision.requests import LevelRequests, agreement, analyze_requests
from specflow.decision.services import ServiceRouting
from specflow.decision.wording import decision_rows
from specflow.records.fsio import atomic_write
from specflow.records.measurement import Measurement
from specflow.search.predict import Curve, Versus, summary
from specflow.search.rounds import Round, ScheduleCheck
from specflow.stats.replicates import SLOWED_Z


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    report: Path
    """The Markdown report."""
    plots: tuple[Path, ...]

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.report, *self.plots)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _figure(ncols: int, title: str) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(4.2 * ncols + 1.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title)
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _yerr(values: Sequence[float], los: Sequence[float], his: Sequence[float]) -> np.ndarray:
    v = np.asarray(values)
    return np.vstack([v - np.asarray(los), np.asarray(his) - v]).clip(min=0)


# --------------------------------------------------------------------------------------------
# Plots


def plot_throughput_vs_n(analysis: Analysis, workload: str, path: Path) -> Path:
    """Output throughput vs N per drafter, one panel per concurrency level, with CI error bars
    (the baseline is the N=0 line and its shaded CI)."""
    pts = [p for p in analysis.points if p.workload == workload and p.throughput is not None]
    levels = sorted({p.concurrency for p in pts})
    if not levels:
        raise ValueError(f"no usable points for workload {workload!r}")
    fig, axes = _figure(len(levels), f"{workload}: output throughput vs N")
    for ax, c in zip(axes, levels, strict=True):
        at = [p for p in pts if p.concurrency == c]
        n_max = max([p.num_speculative_tokens for p in at] + [1])
        for p in at:
            if p.is_baseline:
                t = p.throughput
                ax.axhline(t.value, color="black", linestyle="--", label="baseline (N=0)")
                ax.axhspan(t.lo, t.hi, color="black", alpha=0.08)
        by_drafter: dict[str, list[PointStats]] = defaultdict(list)
        for p in at:
            if not p.is_baseline:
                by_drafter[p.drafter].append(p)
        for drafter, dps in sorted(by_drafter.items()):
            dps.sort(key=lambda p: p.num_speculative_tokens)
            ns = [p.num_speculative_tokens for p in dps]
            vals = [p.throughput.value for p in dps]
            ax.errorbar(ns, vals, yerr=_yerr(vals, [p.throughput.lo for p in dps],
                                             [p.throughput.hi for p in dps]),
                        marker="o", capsize=3, label=f"{drafter} ({dps[0].method})")
        ax.set_xlim(-0.3, n_max + 0.5)
        ax.set_xlabel("num_speculative_tokens (N)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"concurrency {c}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return _save(fig, path)


def plot_acceptance(analysis: Analysis, workload: str, path: Path) -> Path | None:
    """Per-position acceptance p_i for each speculative engine (median over its windows);
    None when no engine recorded acceptance for this workload."""
    curves: dict[tuple[str, int, str], list[tuple[float, ...]]] = defaultdict(list)
    for p in analysis.points:
        if p.workload == workload and p.per_position_acceptance:
            curves[(p.drafter, p.num_speculative_tokens, p.engine)].append(
                p.per_position_acceptance)
    if not curves:
        return None
    fig, axes = _figure(1, f"{workload}: per-position acceptance")
    ax = axes[0]
    for (_drafter, _n, engine), cs in sorted(curves.items()):
        k = min(len(c) for c in cs)
        curve = np.median(np.asarray([c[:k] for c in cs]), axis=0)
        ax.plot(np.arange(1, k + 1), curve, marker="o", label=engine)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("accepted at position i / drafts")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_speedup_vs_concurrency(result: ClassResult, path: Path, margin: float) -> Path:
    """Speedup over the baseline vs concurrency per candidate (worst workload at each level),
    with CI error bars, the break-even line and the promotion threshold 1 + margin."""
    series: dict[tuple[str, str], dict[int, PointSpeedup]] = defaultdict(dict)
    winners = set()
    for d in result.decisions:
        if d.winner is not None:
            winners.add(d.winner.engine_hash)
        for v in d.candidates:
            for s in v.speedups:
                cur = series[(v.engine, v.engine_hash)].get(s.concurrency)
                if cur is None or s.speedup.lo < cur.speedup.lo:
                    series[(v.engine, v.engine_hash)][s.concurrency] = s
    fig, axes = _figure(1, f"{result.traffic_class}: speedup vs concurrency")
    ax = axes[0]
    for (engine, engine_hash), by_c in sorted(series.items()):
        cs = sorted(by_c)
        vals = [by_c[c].speedup.value for c in cs]
        ax.errorbar(cs, vals, yerr=_yerr(vals, [by_c[c].speedup.lo for c in cs],
                                         [by_c[c].speedup.hi for c in cs]),
                    marker="o", capsize=3, linewidth=2.2 if engine_hash in winners else 1.0,
                    label=engine + (" (wins a band)" if engine_hash in winners else ""))
    ax.axhline(1.0, color="black", linewidth=1, label="baseline")
    ax.axhline(1 + margin, color="red", linestyle=":", label=f"1 + margin ({1 + margin:.2f})")
    for b in result.bands:
        if b.lo != b.hi:
            ax.axvspan(b.lo, b.hi, alpha=0.05, color="gray")
    ax.set_xscale("log", base=2)
    levels = sorted({c for by_c in series.values() for c in by_c})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrency (max in-flight requests)")
    ax.set_ylabel("speedup (output throughput / baseline)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_request_acceptance(levels: Sequence[LevelRequests], path: Path) -> Path | None:
    """One class: the distribution of per-request acceptance length of each speculative engine,
    one panel per concurrency level (None when no request carried its acceptance)."""
    levels = [lv for lv in levels if lv.acceptance]
    if not levels:
        return None
    fig, axes = _figure(len(levels), f"{levels[0].traffic_class}: acceptance length per request")
    for ax, lv in zip(axes, levels, strict=True):
        top = max(max(v) for v in lv.acceptance.values())
        bins = np.linspace(1.0, max(top, 1.5), 21)
        for engine, values in sorted(lv.acceptance.items()):
            ax.hist(values, bins=bins, histtype="step", linewidth=1.5,
                    label=f"{engine} (n={len(values)})")
        ax.set_title(f"c={lv.concurrency}")
        ax.set_xlabel("tokens per verify step (1 + accepted / steps)")
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path)


def plot_predicted(analysis: Analysis, rows: Sequence[Versus], path: Path) -> Path | None:
    """Output throughput vs N per chain drafter, measured (markers, CI) beside predicted from
    its largest N (line and band), one panel per workload and concurrency."""
    base = {(p.workload, p.concurrency): p.throughput.value for p in analysis.points
            if p.is_baseline and p.throughput is not None}
    measured = {(p.drafter, p.workload, p.concurrency, p.num_speculative_tokens): p.throughput
                for p in analysis.points if not p.is_baseline and p.throughput is not None}
    panels = sorted({(v.workload, v.concurrency) for v in rows if (v.workload, v.concurrency)
                     in base})
    if not panels:
        return None
    fig, axes = _figure(len(panels), "output throughput vs N: measured (points) and predicted "
                                     "from the largest N (line, band)")
    for ax, (w, c) in zip(axes, panels, strict=True):
        ax.axhline(base[(w, c)], color="black", linestyle="--", label="baseline")
        for i, series in enumerate(sorted({v.series for v in rows})):
            mine = sorted((v for v in rows if (v.series, v.workload, v.concurrency)
                           == (series, w, c)), key=lambda v: v.n)
            if not mine:
                continue
            color = f"C{i}"
            ns = [v.n for v in mine]
            b = base[(w, c)]
            ax.plot(ns, [v.predicted.value * b for v in mine], color=color, linestyle=":",
                    label=f"{series} predicted")
            ax.fill_between(ns, [v.predicted.lo * b for v in mine],
                            [v.predicted.hi * b for v in mine], color=color, alpha=0.12)
            pts = sorted((n, t) for (d, ww, cc, n), t in measured.items()
                         if (d, ww, cc) == (series, w, c))
            if pts:
                vals = [t.value for _, t in pts]
                ax.errorbar([n for n, _ in pts], vals, yerr=_yerr(
                    vals, [t.lo for _, t in pts], [t.hi for _, t in pts]), color=color,
                    marker="o", linestyle="none", capsize=3, label=f"{series} measured")
        ax.set_xlabel("num_speculative_tokens (N)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{w} c={c}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return _save(fig, path)


def _predicted_section(rows: Sequence[Versus], plot: Path | None, base: Path,
                       curves: Sequence[Curve] = ()) -> list[str]:
    """Every measured point of a chained candidate beside its prediction, and the chain test of
    every series measured at three or more N."""
    if not rows:
        return []
    s = summary(rows)
    lines = ["## Predicted vs measured", "",
             f"Each chain drafter's N values predicted from its largest N (per-position "
             f"acceptance, step cost linear in N) against what was measured at "
             f"{int(s['predict_points'])} points: speedup error median "
             f"{s.get('predict_speedup_error_median', 0):.1%}, worst "
             f"{s.get('predict_speedup_error_worst', 0):.1%}; acceptance length median "
             f"{s.get('predict_mal_error_median', 0):.1%}, worst "
             f"{s.get('predict_mal_error_worst', 0):.1%}. Predictions only choose what to "
             "measure; nothing is promoted on one.", ""]
    if plot is not None:
        lines += [f"![predicted vs measured]({plot.relative_to(base)})", ""]
    lines += ["| engine | from | workload | c | predicted speedup [band] | measured | "
              "predicted MAL | measured MAL | chain |", "|---|---|---|---|---|---|---|---|---|"]
    for v in rows:
        p = v.predicted
        capped = f" (KV holds {p.kv_capacity})" if p.kv_capacity else ""
        chain = "-" if v.check is None else (
            f"holds (+/- {v.check.allowed:.3f})" if v.check.holds
            else f"missed (+/- {v.check.allowed:.3f})")
        lines.append(f"| {v.engine} | {v.probe} | {v.workload} | {v.concurrency} | "
                     f"{p.value:.3f} [{p.lo:.3f}, {p.hi:.3f}]{capped} | {v.speedup:.3f} | "
                     f"{p.mal:.2f} | {_cell(v.mal)} | {chain} |")
    broken = [c for c in curves if c.broken]
    if curves:
        lines += ["", f"Series measured at three or more N: {len(curves) - len(broken)} of "
                      f"{len(curves)} curves can come from a chain."]
    lines += [f"- {c.series} {c.workload} c={c.concurrency}: not a chain ({c.broken}); "
              "measured per N" for c in broken]
    return [*lines, ""]


def plot_all(analysis: Analysis, out_dir: str | Path,
             requests: Sequence[LevelRequests] = ()) -> list[Path]:
    """Every plot of an analysis, written under out_dir."""
    out = Path(out_dir)
    margin = float(analysis.settings["margin"])
    paths = []
    settings = analysis.settings
    for workload in sorted({p.workload for p in analysis.points if p.throughput is not None
                            and settings.get("objectives", {}).get(
                                p.traffic_class, settings.get("objective", "throughput"))
                            == "throughput"}):  # a latency class's scores are not tok/s
        paths.append(plot_throughput_vs_n(analysis, workload,
                                          out / f"throughput_vs_n-{_slug(workload)}.png"))
        acc = plot_acceptance(analysis, workload, out / f"acceptance-{_slug(workload)}.png")
        if acc is not None:
            paths.append(acc)
    for r in analysis.classes:
        paths.append(plot_speedup_vs_concurrency(
            r, out / f"speedup_vs_concurrency-{_slug(r.traffic_class)}.png", margin))
        mine = [lv for lv in requests if lv.traffic_class == r.traffic_class]
        acc = plot_request_acceptance(mine, out / f"request_acceptance-"
                                      f"{_slug(r.traffic_class)}.png")
        if acc is not None:
            paths.append(acc)
    return paths


# --------------------------------------------------------------------------------------------
# Markdown


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def decision_note(title: str, lines: Sequence[Mapping[str, str]],
                  champions: Sequence[tuple[str, str]], limit: int = 8000) -> str:
    """The decision as Markdown for the sweep's MLflow parent run description (its note, the
    first thing its page shows): the `decision_lines` table, then each class's champion; cut
    to `limit` characters (MLflow's tag size) with a pointer to the report."""
    out = [f"**{title}**", ""]
    if lines:
        cols = list(lines[0])
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(_cell(row[c]) for c in cols) + " |" for row in lines]
    else:
        out.append("no decision")
    if champions:
        out += ["", "**Champions**", ""]
        out += [f"- {cls}: {what}" for cls, what in champions]
    out += ["", "Every candidate, with plots: the `report/report.md` artifact."]
    text = "\n".join(out)
    if len(text) > limit:
        tail = "\n\n(cut here: the `report/report.md` artifact has all of it)"
        text = text[:limit - len(tail)] + tail
    return text


def _settings_line(analysis: Analysis) -> str:
    s = analysis.settings
    q = s["quality"]
    slos = [f"{k} <= {v:g}" for k, v in s["slo"].items() if v is not None]
    return (
        f"Decided under: speedup lower bound >= {1 + s['margin']:.3f} (margin {s['margin']:.1%}); "
        f"{s['confidence']:.0%} t intervals with engine starts as replicates, each candidate "
        "start compared with the baseline interpolated in time between the baseline starts "
        "around it; errors bounded per deployment (grid: Holm over every class x band x "
        "candidate; race: the winner confirmed on fresh engine starts, or a clear case on its "
        "exploration starts with its p-value multiplied by the band's candidates, Holm over "
        "bands); "
        f"ties within {s['tie_tolerance']:.0%} go to the "
        f"smaller N, then the cheaper method; >= {s['min_repeats']} usable repeats per point. "
        f"Quality gate: at each concurrency level, the share of (run, request) pairs whose "
        f"temperature-0 output differs from the baseline's may exceed "
        + ("the baseline's own share" if q["calibrate_with_baseline_repeat"]
           else "zero (uncalibrated)")
        + f" by at most {q['max_mismatch_fraction']:.1%} at the {s['confidence']:.0%} lower "
        "bound. "
        f"Latency SLOs (worst repeat): {', '.join(slos) if slos else 'none'}."
    )


def _ci(x: Estimate | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    if pct:
        return f"{x.value:+.1%} [{x.lo:+.1%}, {x.hi:+.1%}]"
    return f"{x.value:.3f} [{x.lo:.3f}, {x.hi:.3f}]"


def _requests_section(lv: LevelRequests) -> list[str]:
    """Per-request acceptance and speedup by prompt length at one concurrency level."""
    lines = ["", f"### Per request, by prompt length (c={lv.concurrency})", "",
             "Each request paired with the same prompt on the baseline; CIs resample requests "
             "(the right unit for acceptance; for speedup they leave out the start-to-start "
             "variation the decision above accounts for). Speedup is the baseline's request "
             "latency per output token over the engine's.", "",
             "| engine | prompt tokens | requests | acceptance length [CI] | speedup [CI] |",
             "|---|---|---|---|---|"]
    for row in lv.rows:
        lines.append(f"| {row.engine} | {row.bucket} | {row.requests} | "
                     f"{_ci(row.acceptance_length)} | {_ci(row.speedup)} |")
    if lv.best:
        lines += ["", "Best by prompt length: " + ", ".join(
            f"{b}: `{e}`" for b, e in lv.best.items()) + "."]
    if lv.keyed_gain is not None:
        lines.append(f"**The best engine differs by prompt length.** Serving each length with "
                     f"its own best would change latency per output token by "
                     f"{_ci(lv.keyed_gain, pct=True)} against `{lv.single_best}` alone on the "
                     "same requests (chosen on these data, so optimistic; vLLM 0.32 keys N on "
                     "batch size only: a length-keyed schedule would need a router or a vLLM "
                     "change).")
    elif lv.single_best:
        lines.append(f"The same engine is best at every prompt length (`{lv.single_best}`): "
                     "a length-keyed schedule would not pay here.")
    return lines


def _latency_table(r: ClassResult, analysis: Analysis) -> list[str]:
    """A latency class's measured latency per engine and offered rate: the statistic decided on
    (geometric mean over usable windows, with its interval), the worst p99s, and the windows
    left out as overload."""
    if r.objective == "throughput":
        return []
    if r.capacities or r.objective.startswith("capacity"):
        return _capacity_table(r, analysis)
    stat = label_statistic(r.objective)
    pts = sorted((p for p in analysis.points if p.traffic_class == r.traffic_class),
                 key=lambda p: (not p.is_baseline, p.engine, p.request_rate or 0.0,
                                p.concurrency))
    lines = ["", "### Latency at the offered rates", "",
             f"| engine | offered req/s | in flight at most | {stat} [CI] | worst p99 TPOT ms | "
             "worst p99 e2el ms | usable | overload |", "|---|---|---|---|---|---|---|---|"]
    for p in pts:
        t = p.throughput
        est = "-" if t is None else \
            f"{1000 / t.value:.1f} [{1000 / t.hi:.1f}, {1000 / t.lo:.1f}]"
        p99 = [f"{v:.1f}" if (v := p.latency_worst.get(k)) is not None else "-"
               for k in ("p99_tpot_ms", "p99_e2el_ms")]
        rate = f"{p.request_rate:g}" if p.request_rate is not None else "-"
        lines.append(f"| {p.engine} | {rate} | {p.concurrency} | {est} | {p99[0]} | {p99[1]} | "
                     f"{p.n_ok} | {p.failures.get('overload', 0)} |")
    return lines


def _capacity_table(r: ClassResult, analysis: Analysis) -> list[str]:
    """A capacity class's capacity per engine and point: the geometric mean over its searches
    with its interval, the searches that found one, the windows they took, and the replicas
    the stated target load needs at the lower bound."""
    load = (analysis.settings.get("capacity") or {}).get("target_load")
    pts = sorted((p for p in analysis.points if p.traffic_class == r.traffic_class),
                 key=lambda p: (not p.is_baseline, p.engine, p.workload, p.concurrency))
    head = f" replicas for {load:g} req/s |" if load else ""
    lines = ["", "### Capacity within the SLOs", "",
             f"| engine | workload | in flight at most | capacity req/s [CI] | searches found |"
             f"{head}", "|---|---|---|---|---|" + "---|" * bool(load)]
    for p in pts:
        t = p.throughput
        est = "-" if t is None else f"{t.value:.3g} [{t.lo:.3g}, {t.hi:.3g}]"
        need = ""
        if load:
            need = f" {replicas(load, t.lo) if t is not None else '-'} |"
        lines.append(f"| {p.engine} | {p.workload} | {p.concurrency} | {est} | "
                     f"{p.n_ok} of {p.n_ok + p.n_failed} |{need}")
    return lines


def _class_section(r: ClassResult, analysis: Analysis, plots: Sequence[Path], base: Path,
                   requests: Sequence[LevelRequests] = ()) -> list[str]:
    dep = r.deployment
    lines = [f"## Traffic class `{r.traffic_class}`", ""]
    if r.objective.startswith("capacity"):
        lines += [f"Decided for {r.objective}: each speedup is the candidate's capacity (the "
                  "highest request rate one engine takes within the SLOs, found by a search "
                  "over offered rates, one per planned window) over the baseline's.", ""]
    elif r.objective != "throughput":
        lines += [f"Decided for {r.objective}: each speedup is the baseline's "
                  f"{label_statistic(r.objective)} over the candidate's, at the "
                  "offered request rates (open loop); overloaded windows are reported, never "
                  "scored.", ""]
    undecided = [d.band.label for d in r.decisions if d.outcome == "unresolved"]
    if undecided:
        lines.append(f"**Unresolved: the champion is kept** (band"
                     f"{'s' * (len(undecided) > 1)} {', '.join(undecided)}; the other bands "
                     "are concluded below).")
    elif dep.outcome == "off":
        lines.append(f"**Deploy: speculation off** (the no-speculation baseline, engine "
                     f"`{dep.engine_hash}`).")
    else:
        n = (f"schedule `{[list(x) for x in dep.schedule]}` "
             f"(num_speculative_tokens={dep.num_speculative_tokens})" if dep.schedule
             else f"N={dep.num_speculative_tokens}")
        lines.append(f"**Deploy: {dep.drafter} ({dep.method}), {n}** — "
                     f"engine `{dep.engine_hash}`.")
    lines += [f"- {x}" for x in (() if undecided else dep.reasons)] + [""]
    for d in r.decisions:
        q = d.winner.quality if d.winner else None
        lines.append(f"- band {d.band.label} (levels {list(d.levels)}): **{d.outcome}** — "
                     + "; ".join(d.reasons))
        lines += [f"  - note: {n}" for n in d.notes]
        if q is not None:
            lines.append(f"  - quality: mismatched (run, request) pairs {q.summary} over "
                         f"{q.requests} requests; tolerance {q.tolerance:.1%} over the "
                         "baseline's rate")
    if r.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in r.notes]
    lines += ["", "### Decision table", "",
              "| band | candidate | method | N | verdict | speedup | CI | worst point | "
              "quality (mismatched/pairs) | acceptance | why |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in decision_rows(r):
        ci = "-" if row["lo"] is None else f"[{row['lo']:.3f}, {row['hi']:.3f}]"
        lines.append("| " + " | ".join(_cell(x) for x in (
            row["band"], row["engine"], row["method"], row["N"], row["verdict"], row["speedup"],
            ci, row["worst_point"], row["quality"], row["acceptance_rate"], row["why"])) + " |")
    lines += _latency_table(r, analysis)
    if r.drift:
        lines += ["", "### Baseline between its engine starts", "",
                  "| workload | concurrency | starts | later / earlier | z | beyond noise |",
                  "|---|---|---|---|---|---|"]
        for d in r.drift:
            lines.append(f"| {d.workload} | {d.concurrency} | #{d.seq_from} -> #{d.seq_to} | "
                         f"{d.ratio:.3f} | {d.z:+.1f} | {'**yes**' if d.flagged else 'no'} |")
    failed = [p for p in analysis.points if p.traffic_class == r.traffic_class and p.failures]
    workloads = {p.workload for p in analysis.points if p.traffic_class == r.traffic_class}
    slowed = [w for w in analysis.slowed if w.workload in workloads]
    if failed or slowed:
        lines += ["", "### Excluded windows"]
    if failed:
        lines += ["", "| engine | workload | concurrency | usable | excluded |",
                  "|---|---|---|---|---|"]
        for p in failed:
            what = ", ".join(f"{k} x{v}" for k, v in p.failures.items())
            lines.append(f"| {p.engine} | {p.workload} | {p.concurrency} | {p.n_ok} | {what} |")
    if slowed:
        lines += ["", "Slowed by outside load: each is far below its own engine start's other "
                  f"windows at the point (more than {SLOWED_Z:g} robust SDs below the start's "
                  "median), so it is left out of the speedups and the noise estimates; it "
                  "stays in the ledger and counts as a repeat, and the start's "
                  "other windows carry its estimate, with the window measured again in its "
                  "place on the same start where there is one. Where most of a start's windows "
                  "at a point were slowed together (the point far below the level the start "
                  "keeps at its other points, given the config's other starts), they are "
                  "judged against the start's fastest window there instead (\"together\").",
                  "", "| engine | workload | concurrency | start | repeat | throughput / its "
                  "start's others | robust SDs | found | measured again as |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for w in slowed:
            lines.append(f"| {w.engine} | {w.workload} | {w.concurrency} | {w.start} | "
                         f"{w.repeat} | {w.ratio:.3f} | {w.z:.1f} | "
                         f"{'together' if w.together else 'alone'} | "
                         f"{'-' if w.again is None else f'repeat {w.again}'} |")
    for lv in requests:
        if lv.traffic_class == r.traffic_class:
            lines += _requests_section(lv)
    stems = {f"speedup_vs_concurrency-{_slug(r.traffic_class)}",
             f"request_acceptance-{_slug(r.traffic_class)}"} | {
        f"{kind}-{_slug(w)}" for w in workloads for kind in ("throughput_vs_n", "acceptance")}
    mine = [p for p in plots if p.stem in stems]
    if mine:
        lines += ["", "### Plots", ""]
        lines += [f"![{p.stem}]({p.relative_to(base) if p.is_relative_to(base) else p})"
                  for p in mine]
    return lines + [""]


def rounds_table(rounds: Sequence[Round], names: Mapping[str, str] | None = None) -> list[str]:
    """The race, round by round: what each round ran, dropped and selected, and the spend
    (engines by name where `names` maps their hashes)."""
    if not rounds:
        return []

    def name(h: str) -> str:
        return (names or {}).get(h, h[:8])

    lines = ["## Rounds", "", "| round | stage | engine starts | band states after | dropped "
             "and checked this round | spent (starts / windows / engine-s) |",
             "|---|---|---|---|---|---|"]
    seen: set[tuple[str, str, str]] = set()
    for i, r in enumerate(rounds):
        more = i + 1 < len(rounds)
        words = [(b, b.word(more)) for b in r.states]
        states = "; ".join(f"{b.traffic_class} {b.band}: {word}"
                           + (f" ({', '.join(name(h) for h in b.contenders)})"
                              if word in ("exploring", "confirming", "promote") else "")
                           for b, word in words)
        dropped = [f"{b.traffic_class} {b.band}: {name(h)} ({why})" for b in r.states
                   for h, why in b.dropped if (b.traffic_class, b.band, h) not in seen]
        seen |= {(b.traffic_class, b.band, h) for b in r.states for h, _ in b.dropped}
        dropped += [f"{b.traffic_class} {b.band}: {name(h)}'s series: {note}" for b in r.states
                    for h, note in b.notes if (b.traffic_class, b.band, note) not in seen]
        seen |= {(b.traffic_class, b.band, note) for b in r.states for _, note in b.notes}
        lines.append(f"| {r.index} | {r.stage} | {len(r.starts)} | {_cell(states)} | "
                     f"{_cell('; '.join(dropped) or '-')} | {r.spent.engine_starts} / "
                     f"{r.spent.windows} / {r.spent.engine_seconds:.0f} |")
    return [*lines, ""]


def markdown(analysis: Analysis, plots: Sequence[Path] = (), base: Path = Path("."),
             rounds: Sequence[Round] = (),
             schedules: Mapping[str, ScheduleCheck] | None = None,
             measurements: Sequence[Measurement] = (),
             names: Mapping[str, str] | None = None) -> str:
    """The Markdown report (plot links relative to `base`; `names`: engine hash -> name, for
    configs the race never started)."""
    lines = ["# specflow decision report", "", _settings_line(analysis), ""]
    agree, total, diffs = agreement(measurements)
    if total:
        lines += [f"Per-request acceptance (from each response) agrees with the /metrics "
                  f"counters in {agree} of {total} speculative windows"
                  + (f"; differences: {'; '.join(diffs[:5])}" if diffs else "") + ".", ""]
    requests = analyze_requests(measurements)
    lines += rounds_table(rounds, {**(names or {}), **{
        v.engine_hash: v.engine for r in analysis.classes for d in r.decisions
        for v in d.candidates}})
    for cls, check in sorted((schedules or {}).items()):
        lines += [f"Schedule of `{cls}` `{[list(x) for x in check.schedule]}` measured as one "
                  f"engine (`{check.engine_hash}`) at c={list(check.levels)}: "
                  f"**{'holds' if check.passed else 'not promoted'}** — {check.why}", ""]
    if analysis.excluded:
        lines += [f"Windows excluded as failed or overloaded: {analysis.excluded} (counted per "
                  "point below).",
                  ""]
    if analysis.slowed:
        lines += [f"Windows slowed by outside load, left out of the speedups: "
                  f"{len(analysis.slowed)} (listed per class below).", ""]
    if analysis.headroom_refused:
        lines += ["Refused by the headroom check: "
                  + ", ".join(f"`{h}`" for h in analysis.headroom_refused) + ".", ""]
    for r in analysis.classes:
        lines += _class_section(r, analysis, plots, base, requests)
    return "\n".join(lines)


def beside_section(analysis: Analysis, found: Sequence[Beside]) -> list[str]:
    """Per class measured for other objectives than the one it is decided for: each one's
    answer beside the decision and whether they agree, then each one's decision table and its
    latency or capacity table."""
    if not found:
        return []
    lines = ["## Throughput, latency and capacity side by side", "",
             "Each class is decided, and promoted, for its objective; the windows measured for "
             "another (closed loop, at offered rates, by a capacity search) are decided for it "
             "on their own, under the same rule, as an answer beside it: what would be promoted "
             "if the class were decided for that. Nothing is promoted from them.", ""]
    lines += [f"- {x}" for x in beside_lines(analysis.classes, found)]
    for b in found:
        lines += ["", f"### `{b.traffic_class}` decided for {b.objective}, beside", ""]
        r = b.result
        if r is None or b.analysis is None:
            lines += ["No answer: " + "; ".join(b.problems)]
            continue
        lines += ["| band | candidate | verdict | speedup | CI | why |",
                  "|---|---|---|---|---|---|"]
        for row in decision_rows(r):
            s = row["speedup"]
            ci = f"[{row['lo']:.3f}, {row['hi']:.3f}]" if s is not None else "-"
            lines.append(f"| {row['band']} | {row['engine']} | {row['verdict']} | "
                         f"{'-' if s is None else f'{s:.3f}'} | {ci} | "
                         f"{_cell(str(row['why'] or ''))} |")
        lines += _latency_table(r, b.analysis)
    return [*lines, ""]


def services_section(services: Sequence[ServiceRouting]) -> list[str]:
    """Each service's own answer beside routing its classes to their own champions."""
    if not services:
        return []
    lines = ["## Services: one server, or a pool per class", "",
             "A service is decided like a class, on windows that mix its classes' requests in "
             "their shares. Routing is what the per-class decisions imply for the same requests: "
             "each class's champion speedup, weighted by its share of the baseline's time "
             "(docs/traces.md).", "",
             "| service | band | one server | speedup | routed | routing adds | classes |",
             "|---|---|---|---|---|---|---|"]
    for s in services:
        own = (f"{s.speedup.value:.3f} [{s.speedup.lo:.3f}, {s.speedup.hi:.3f}]"
               if s.speedup is not None else "-")
        parts = "; ".join(f"{r.traffic_class}: {r.engine} {r.speedup:.3f}x ({r.share:.0%} "
                          f"req, {r.time_share:.0%} time)" for r in s.routes)
        lines.append(f"| {s.service} | {s.band.label} | {s.engine if s.speedup else s.outcome}"
                     f" | {own} | {s.routed:.3f} | {s.gain:+.1%} | {_cell(parts)} |")
    return [*lines, ""]


def write_report(analysis: Analysis, out_dir: str | Path, name: str = "report.md",
                 rounds: Sequence[Round] = (),
                 schedules: Mapping[str, ScheduleCheck] | None = None,
                 measurements: Sequence[Measurement] = (),
                 versus: Sequence[Versus] = (),
                 names: Mapping[str, str] | None = None,
                 curves: Sequence[Curve] = (),
                 services: Sequence[ServiceRouting] = (),
                 beside: Sequence[Beside] = ()) -> ReportFiles:
    """Write every plot and the Markdown report under out_dir; returns their paths.
    `measurements` (the sweep's windows) add the per-request view where they kept requests;
    `versus` the predictor's error (`predict.versus`), `curves` its chain tests
    (`predict.curves`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(analysis, out, analyze_requests(measurements))
    predicted = plot_predicted(analysis, versus, out / "predicted_vs_measured.png")
    path = out / name
    text = markdown(analysis, plots, out, rounds, schedules or {}, measurements, names)
    text += "\n" + "\n".join(services_section(services))
    text += "\n" + "\n".join(beside_section(analysis, beside))
    text += "\n" + "\n".join(_predicted_section(versus, predicted, out, curves))
    atomic_write(path, text)
    return ReportFiles(path, tuple(plots) + ((predicted,) if predicted else ()))
