"""What a person sees in the terminal: sweep progress, the decision summary, headroom tables."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specflow.core.memory import Headroom
from specflow.core.records import Measurement
from specflow.core.rounds import Progress as RaceProgress


@contextlib.contextmanager
def sweep_progress(console: Console, title: str, total: int | None
                   ) -> Iterator[Callable[[Measurement], None]]:
    """A progress bar over the sweep's windows; yields the `on_point` callback that advances it."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=console,
                  transient=False) as progress:
        bar = progress.add_task(title, total=total, last="")

        def on_point(m: Measurement) -> None:
            state = "ok" if m.ok else f"[red]{escape(m.failure or 'failed')}[/]"
            extra = f" acc={m.acceptance_rate:.2f}" if m.acceptance_rate is not None else ""
            progress.update(bar, advance=1, last=f"{escape(m.engine)} {escape(m.key.workload)} "
                            f"c{m.key.concurrency} "
                            f"{f'b{m.key.block} ' if m.key.block else ''}r{m.key.repeat}: {state} "
                            f"{m.output_throughput:.1f} tok/s{extra}")

        yield on_point


def print_outcome(summary: dict[str, Any], out: Console, elapsed: float) -> None:
    """The decision per class and band (the full table with every candidate is in the report)."""

    rows = summary["table"]
    if rows:
        table = Table(title="decision per traffic class and concurrency band")
        for col in ("class", "band", "deploy", "N", "speedup [CI]", "runner-up / why not"):
            table.add_column(col, overflow="fold")
        for (cls, band) in dict.fromkeys((r["traffic_class"], r["band"]) for r in rows):
            mine = [r for r in rows if (r["traffic_class"], r["band"]) == (cls, band)]
            win = next(r for r in mine if r["verdict"] in ("winner", "unresolved"))
            others = sorted((r for r in mine if r is not win and r["speedup"] is not None),
                            key=lambda r: -(r["lo"] or 0))
            best = others[0] if others else None
            why = (f"{best['engine']}: {best['speedup']:.3f} [{best['lo']:.3f}, {best['hi']:.3f}] "
                   f"{best['verdict']}" if best else "")
            deploy = win["engine"] if win["verdict"] == "winner" else "unresolved (champion kept)"
            table.add_row(cls, band, deploy, str(win["N"]),
                          f"{win['speedup']:.3f} [{win['lo']:.3f}, {win['hi']:.3f}]", escape(why))
        out.print(table)
    for p in summary["problems"]:
        out.print(f"[yellow]no decision:[/] {escape(p)}")
    out.print(f"{summary['ok']}/{summary['points']} windows ok in {elapsed:.0f} s; "
              f"missing {len(summary['missing'])}")
    for p in summary["promotions"]:
        out.print(escape(f"{p['status']} {p['traffic_class']}: {p['path']}"))
    if summary["report"]:
        out.print(escape(f"report (every candidate, plots): {summary['report']}"))
    uri = summary["tracking_uri"]
    if summary["tracking_error"]:
        out.print(f"[yellow]MLflow was unreachable ({escape(summary['tracking_error'])}); "
                  f"{summary['unlogged']} windows are kept locally and synced on the next run[/]")
    out.print(escape(f"results: mlflow ui --backend-store-uri {uri}  (experiment "
                     f"'{summary['experiment']}', parent run {summary['parent_run_id']})"))


def print_headroom(reports: Sequence[Headroom], out: Console) -> None:
    """Per engine config: verdict, KV capacity and what the drafter costs; one breakdown per
    drafter, with its fixes and the model's assumptions."""
    colors = {"fits": "green", "warn": "yellow", "refuse": "red"}
    summary = Table(title="headroom")
    for col in ("engine config", "verdict", "KV tokens", "lost to drafter", "max conc. @ context",
                "reason"):
        summary.add_column(col)
    for h in reports:
        summary.add_row(h.engine, f"[{colors[h.verdict]}]{h.verdict}[/]", f"{h.capacity.tokens:,}",
                        f"{h.drafter_cost_tokens:,} ({h.drafter_cost_percent:.1f}%)",
                        str(h.concurrency_at_context), "; ".join(h.reasons))
    shown: dict[str, Headroom] = {}
    for h in reports:  # one breakdown per distinct drafter (N changes only slots)
        shown.setdefault(h.engine.rsplit("-n", 1)[0], h)
    for h in shown.values():
        table = Table(title=f"{h.engine}: {h.verdict}", title_justify="left")
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




def round_lines(progress: RaceProgress, names: Mapping[str, str]) -> list[str]:
    """Plain log lines: what the last finished round decided, and what runs next."""
    def name(h: str) -> str:
        return names.get(h, h[:8])

    lines = []
    if progress.rounds:
        r = progress.rounds[-1]
        lines.append(f"round {r.index} ({r.stage}) done: {len(r.starts)} engine starts; spent "
                     f"{r.spent.engine_starts} starts, {r.spent.windows} windows, "
                     f"{r.spent.engine_seconds:.0f} engine-s")
        for b in r.states:
            fresh = [f"{name(h)} ({why})" for h, why in b.dropped if why.startswith(
                f"round {r.index}:")]
            who = ", ".join(name(h) for h in b.contenders)
            lines.append(f"  {b.traffic_class} {b.band}: {b.status}"
                         + (f" [{who}]" if who and b.status != "off" else "")
                         + (f"; {b.why}" if b.why else "")
                         + (f"; dropped {'; '.join(fresh)}" if fresh else ""))
    for p in progress.problems:
        lines.append(f"race stopped: {p}")
    if progress.current is not None:
        c = progress.current
        lines.append(f"round {c.index} ({c.stage}): " + ", ".join(
            f"#{s.seq} {name(s.engine_hash)}" for s in c.starts))
    return lines
