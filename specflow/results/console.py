"""What a person sees in the terminal: sweep progress, the decision summary, headroom tables."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specflow.decision.aggregate import label_statistic
from specflow.decision.model import BASELINE_METHOD
from specflow.records.measurement import AGAIN, STEP, Measurement
from specflow.records.summaries import SweepSummary
from specflow.search.rounds import SearchState
from specflow.spec.memory import Headroom


def window_line(m: Measurement) -> str:
    """One measured window as a plain line (the flow-run log, a console without a terminal)."""
    state = "ok" if m.ok else f"FAILED {m.failure or 'unknown'}"
    acc = f", acceptance {m.acceptance_rate:.2f}" if m.acceptance_rate is not None else ""
    start = f" b{m.key.start}" if m.key.start else ""
    again = (f" (measured again: r{m.key.repeat - AGAIN} was slowed by outside load)"
             if AGAIN <= m.key.repeat < STEP else "")
    return (f"{m.engine} {m.key.workload} c{m.key.concurrency}{start} {_repeat(m)}: {state}, "
            f"{m.output_throughput:.1f} tok/s{_open_loop(m)}{acc}{again}")


def _repeat(m: Measurement) -> str:
    """`r1`, or for a capacity search's later window `r1 step 3`."""
    k = m.key
    return f"r{k.planned.repeat} step {k.step}" if k.step else f"r{k.repeat}"


def _open_loop(m: Measurement) -> str:
    """An open-loop window's latency, or its overload (never scored)."""
    if m.request_rate is None or not m.ok:
        return ""
    if m.overload:
        return (f", OVERLOAD at {m.request_rate:.3g} req/s (the queue grew by "
                f"{m.backlog_growth or 0:.0%} of the offered rate)")
    e2el = [f"{s} e2el {v:.0f} ms" for s in ("mean", "p99")
            if (v := m.latency_ms.get(f"{s}_e2el_ms")) is not None]
    return f" at {m.request_rate:.3g} req/s" + "".join(f", {x}" for x in e2el)


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


class SweepProgress:
    """The sweep as it runs: a live bar on a terminal; otherwise (a log file, CI, a pipe) one
    plain line per engine start and per window, with windows done/left and an ETA. A race's
    total grows round by round (`round`); a grid's is known up front."""

    def __init__(self, console: Console, title: str, total: int | None) -> None:
        self.console, self.title, self.total = console, title, total
        self.done, self.t0 = 0, time.monotonic()
        self._start: tuple[int, str] | None = None
        self._bar: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> SweepProgress:
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[last]}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total, last="")
        else:
            self.console.print(escape(self.title) + (f": {self.total} windows"
                                                     if self.total else ""))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def round(self, lines: Sequence[str], windows: int) -> None:
        """A racing round ended (its lines) and the next one plans `windows` windows."""
        for line in lines:
            self.console.print(escape(line), highlight=False)
        self.total = self.done + windows if windows else self.done
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def window(self, m: Measurement) -> None:
        """A window finished (or failed)."""
        self.done += 1
        if self.total and self.done > self.total:  # a window measured again, beyond the plan
            self.total = self.done
            if self._bar is not None:
                self._bar.update(self._task, total=self.total)
        if self._bar is not None:
            state = "ok" if m.ok else f"[red]{escape(m.failure or 'failed')}[/]"
            extra = f" acc={m.acceptance_rate:.2f}" if m.acceptance_rate is not None else ""
            start = f"b{m.key.start} " if m.key.start else ""
            self._bar.update(self._task, advance=1, last=(
                f"{escape(m.engine)} {escape(m.key.workload)} c{m.key.concurrency} {start}"
                f"{_repeat(m)}: {state} {m.output_throughput:.1f} tok/s"
                f"{escape(_open_loop(m))}{extra}"))
            return
        start = (m.seq, m.key.engine_hash)
        if start != self._start:
            self._start = start
            where = f" #{m.seq} (round {m.round}, {m.stage})" if m.seq >= 0 else ""
            self.console.print(escape(f"engine start{where}: {m.engine}; first window done "
                                      f"{m.engine_s:.0f} s after the start began"),
                               highlight=False)
        elapsed = time.monotonic() - self.t0
        if self.total:
            left = max(self.total - self.done, 0)
            eta = f", ETA {_clock(elapsed / self.done * left)}" if left else ""
            count = f"[{self.done}/{self.total}] "
            tail = f" ({left} left{eta}; {_clock(elapsed)} so far)"
        else:
            count, tail = f"[{self.done}] ", f" ({_clock(elapsed)} so far)"
        self.console.print(escape(count + window_line(m) + tail), highlight=False)


NARROW = 100
"""Below this many columns the decision is printed as lines per band, not as a table."""


def _bands(rows: Sequence[Mapping[str, Any]]
           ) -> dict[tuple[str, str], tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    """Per (traffic class, band), in the table's order: the row deployed (a candidate that
    wins, else the "off" row: it wins, or it is open where the band is unresolved) and all the
    band's rows."""
    out = {}
    for key in dict.fromkeys((r["traffic_class"], r["band"]) for r in rows):
        mine = [r for r in rows if (r["traffic_class"], r["band"]) == key]
        out[key] = next((r for r in mine if r["verdict"] == "wins"), None) or next(
            r for r in mine if r["method"] == BASELINE_METHOD), mine
    return out


def decision_lines(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Per traffic class and band: what is deployed, its N and speedup [CI], and the best
    other candidate with its verdict (the console's table, the flow run's table artifact and the
    MLflow parent run's note, `report.decision_note`)."""
    out = []
    for (cls, band), (win, mine) in _bands(rows).items():
        others = sorted((r for r in mine if r is not win and r["speedup"] is not None),
                        key=lambda r: -(r["lo"] or 0))
        best = others[0] if others else None
        outcome = ("unresolved" if win["verdict"] != "wins"
                   else "off" if win["method"] == BASELINE_METHOD else "promote")
        objective = win.get("objective", "throughput")
        out.append({
            "class": cls if objective == "throughput" else f"{cls} [{objective}]",
            "band": band, "outcome": outcome,
            "deploy": win["engine"] if win["verdict"] == "wins" else "the champion (kept)",
            "N": str(win["N"]),
            "speedup [CI]": f"{win['speedup']:.3f} [{win['lo']:.3f}, {win['hi']:.3f}]",
            "runner-up / why not": (f"{best['engine']}: {best['speedup']:.3f} "
                                    f"[{best['lo']:.3f}, {best['hi']:.3f}] {best['verdict']}"
                                    if best else "")})
    return out


def _levels(band: str) -> str:
    """A band's label ("c4", "c1-4") in words."""
    return f"concurrency {band[1:]}" if band.startswith("c") else band


def _gain(row: Mapping[str, Any]) -> str:
    """A winner's gain in its class's objective, in words."""
    objective = row.get("objective", "throughput")
    if objective == "throughput":
        return (f"{row['speedup']:.2f}x the throughput without it (interval "
                f"[{row['lo']:.2f}, {row['hi']:.2f}])")
    if objective.startswith("capacity"):
        slo = label_statistic(objective)
        mine, base = row.get("capacity"), row.get("baseline_capacity")
        took = (f"one replica takes {_rate(mine)} req/s within {slo}; without it "
                f"{_rate(base)}: " if mine and base else f"within {slo}: ")
        return (f"{took}{row['speedup']:.2f}x the requests per replica (interval "
                f"[{row['lo']:.2f}, {row['hi']:.2f}])")
    stat = label_statistic(objective)
    return (f"{stat} {1 / row['speedup']:.2f}x of its value without it (interval "
            f"[{1 / row['hi']:.2f}, {1 / row['lo']:.2f}]) at the offered rates")


def _rate(capacity: Sequence[float]) -> str:
    """A capacity [value, lo, hi] in req/s: `11.2 [10.1, 12.0]`."""
    value, lo, hi = capacity
    return f"{value:.3g} [{lo:.3g}, {hi:.3g}]"


def deploy_lines(rows: Sequence[Mapping[str, Any]],
                 promotions: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """What to deploy per traffic class, in words: the drafter and N with its speedup per
    band, no speculative decoding where the band concluded off, or the current champion kept
    (an undecided class, or a decision the regression gate refused)."""
    status = {p["traffic_class"]: p["status"] for p in promotions}
    bands = _bands(rows)
    out = []
    for cls in dict.fromkeys(c for c, _ in bands):
        wins = [win for (c, _), (win, _) in bands.items() if c == cls]
        if any(w["verdict"] != "wins" for w in wins):
            out.append(f"{cls}: unresolved: keep what is deployed now (the report says what "
                       "would settle it)")
            continue
        if status.get(cls) == "refused":
            out.append(f"{cls}: keep what is deployed now: the new decision did not pass the "
                       "regression gate (see the report)")
            continue
        if all(w["method"] == BASELINE_METHOD for w in wins):
            out.append(f"{cls}: serve without speculative decoding: no drafter measured pays "
                       "here")
            continue
        parts = [f"no speculative decoding at {_levels(w['band'])}"
                 if w["method"] == BASELINE_METHOD else
                 f"{w['method']} with N={w['N']} at {_levels(w['band'])}: {_gain(w)}"
                 for w in wins]
        out.append(f"{cls}: " + "; ".join(parts))
    return out


def print_outcome(summary: SweepSummary, out: Console, elapsed: float) -> None:
    """The decision per class and band (the full table with every candidate is in the report):
    a table on a wide console, two lines per band on a narrow one (80 columns), so a CI is
    never split over lines."""
    lines = decision_lines(summary.table)
    title = "decision per traffic class and concurrency band"
    if lines and out.width >= NARROW:
        table = Table(title=title)
        for col in lines[0]:
            table.add_column(col, overflow="fold")
        for row in lines:
            table.add_row(*(escape(v) for v in row.values()))
        out.print(table)
    elif lines:
        out.print(f"[bold]{title}[/]")
        for row in lines:
            out.print(escape(f"{row['class']} {row['band']}: {row['outcome']}: {row['deploy']} "
                             f"N={row['N']} "
                             f"{row['speedup [CI]']}"), highlight=False, soft_wrap=True)
            if row["runner-up / why not"]:
                out.print(escape(f"  runner-up: {row['runner-up / why not']}"),
                          highlight=False, soft_wrap=True)
    for p in summary.problems:  # one line each, also in a log (no wrapping)
        out.print(f"[yellow]no decision:[/] {escape(p)}", soft_wrap=True)
    out.print(f"{summary.ok}/{summary.windows} windows ok in {elapsed:.0f} s; "
              f"missing {len(summary.missing)}")
    slowed = summary.slowed
    if slowed:
        out.print(f"[yellow]{len(slowed)} window{'s' * (len(slowed) != 1)} slowed by outside "
                  "load, left out of the speedups[/] (their starts' other windows carry them; "
                  "the report lists each):", soft_wrap=True)
        for w in slowed[:5]:
            out.print(escape(f"  {w}"), highlight=False, soft_wrap=True)
        if len(slowed) > 5:
            out.print(f"  ... and {len(slowed) - 5} more", highlight=False)
    cost = summary.cost
    out.print(f"{cost.search} search: {cost.engine_starts} engine starts, {cost.windows} "
              f"windows (the grid of this plan: {cost.grid_engine_starts} starts, "
              f"{cost.grid_windows} windows)", soft_wrap=True)
    for p in summary.promotions:
        out.print(escape(f"{p.status} {p.traffic_class}: {p.path}"), soft_wrap=True)
    cmp = summary.comparison
    if cmp is not None:
        out.print(escape(f"against the last sweep of this plan ({cmp.previous}): "
                         f"{cmp.summary} ({cmp.markdown})"), soft_wrap=True)
        if cmp.message:
            out.print(f"[red]{escape(cmp.message)}[/]", soft_wrap=True)
    if summary.report:
        out.print(escape(f"report (every candidate, plots): {summary.report}"),
                  soft_wrap=True)
    uri = summary.tracking_uri
    if summary.tracking_error:
        out.print(f"[yellow]MLflow was unreachable ({escape(summary.tracking_error)}); "
                  f"{summary.unlogged} windows are kept locally and synced on the next run[/]")
    where = summary.run_link or f"mlflow ui --backend-store-uri {uri}"
    out.print(escape(f"results: {where}  (experiment '{summary.experiment}', parent run "
                     f"{summary.parent_run_id})"), soft_wrap=True)
    for w in summary.realism:
        out.print(f"[yellow]workload warning:[/] {escape(w)}", soft_wrap=True)
    for line in summary.services:
        out.print(escape(line), highlight=False, soft_wrap=True)
    for line in summary.beside:
        out.print(escape(line), highlight=False, soft_wrap=True)
    deploy = deploy_lines(summary.table, [p.model_dump() for p in summary.promotions])
    if deploy:
        out.print("[bold]what to deploy, per traffic class[/]")
        for line in deploy:
            out.print(escape(f"  {line}"), highlight=False, soft_wrap=True)


def print_headroom(reports: Sequence[Headroom], out: Console) -> None:
    """Per engine config: fit, KV capacity and what the drafter costs; one breakdown per
    drafter, with its fixes and the model's assumptions."""
    colors = {"fits": "green", "warn": "yellow", "refuse": "red"}
    summary = Table(title="headroom")
    for col in ("engine config", "fit", "KV tokens", "lost to drafter", "max conc. @ context",
                "reason"):
        summary.add_column(col)
    for h in reports:
        summary.add_row(h.engine, f"[{colors[h.fit]}]{h.fit}[/]", f"{h.capacity.tokens:,}",
                        f"{h.drafter_cost_tokens:,} ({h.drafter_cost_percent:.1f}%)",
                        str(h.concurrency_at_context), "; ".join(h.reasons))
    shown: dict[str, Headroom] = {}
    for h in reports:  # one breakdown per distinct drafter (N changes only slots)
        shown.setdefault(h.engine.rsplit("-n", 1)[0], h)
    for h in shown.values():
        table = Table(title=f"{h.engine}: {h.fit}", title_justify="left")
        table.add_column("item")
        table.add_column("value", justify="right")
        table.add_column("note")
        for r in h.rows:
            table.add_row(r.item, r.value, r.note)
        out.print(table)
        for fix in h.fixes:
            out.print(f"  fix: {fix}")
    out.print(summary)
    out.print("assumptions: " + "; ".join(reports[0].assumptions) if reports else "")




def round_lines(progress: SearchState, names: Mapping[str, str]) -> list[str]:
    """Plain log lines: what the last finished round decided, and what runs next."""
    def name(h: str) -> str:
        return names.get(h, h[:8])

    lines = []
    if progress.rounds:
        r = progress.rounds[-1]
        lines.append(f"round {r.index} ({r.stage}) done: {len(r.starts)} engine starts; spent "
                     f"{r.spent.engine_starts} starts, {r.spent.windows} windows, "
                     f"{r.spent.engine_seconds:.0f} engine-s")
        more = progress.current is not None
        for b in r.states:
            fresh = [f"{name(h)} ({why})" for h, why in b.dropped if why.startswith(
                f"round {r.index}:")]
            who = ", ".join(name(h) for h in b.contenders)
            word = b.word(more)
            lines.append(f"  {b.traffic_class} {b.band}: {word}"
                         + (f" [{who}]" if who and b.status != "off" else "")
                         + (f"; {b.why}" if b.why else "")
                         + ("; measured again on the next round's starts"
                            if more and b.left_open else "")
                         + (f"; dropped {'; '.join(fresh)}" if fresh else ""))
            if r.index == 0:  # the probe round's chain checks
                lines += [f"    {name(h)}'s series: {note}" for h, note in b.notes]
    for p in progress.problems:
        lines.append(f"race stopped: {p}")
    if progress.current is not None:
        c = progress.current
        lines.append(f"round {c.index} ({c.stage}): " + ", ".join(
            f"#{s.seq} {name(s.engine_hash)}" for s in c.starts))
    return lines
