"""The steps of a sweep, callable without Prefect: prepare, measure one engine config, sync,
decide and promote. `pipelines/` sequences them as Prefect tasks; the CLI runs that flow.

Everything a step needs is re-derived from the overrides (cheap, deterministic), so each engine
config's step can run in a separate process or on a separate worker.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specflow.results import ledger as ledger_mod
from specflow.engine import probe
from specflow.core.compile import EngineConfig, SweepPlan
from specflow.config.compose import Loaded, load_plan
from specflow.core.errors import Problem, SpecError
from specflow.results.ledger import Ledger
from specflow.core.memory import Headroom
from specflow.core.records import Measurement, PointKey

log = logging.getLogger("specflow.steps.sweep")

OnPoint = Callable[[Measurement], None]

PROGRESS: dict[str, Any] = {}
"""Process-local hooks set by the CLI (`on_point`: called with each finished window)."""

RETRYABLE_START_FAILURES = frozenset({"start_failed", "hang", "busy_port"})
"""Engine start failures a second attempt can cure (OOM and bad configs cannot)."""


class EngineStartFailed(RuntimeError):
    """The engine config's engine did not start; its windows are recorded as failed."""


@dataclass
class Context:
    """A prepared sweep: validated spec, plan, datasets, windows, ledger, tracking."""

    overrides: tuple[str, ...]
    loaded: Loaded
    plan: SweepPlan
    facts: probe.VllmFacts
    ledger: Ledger
    workdir: Path
    headroom: dict[str, Headroom]
    datasets: dict[str, Any]
    windows: list[Any]
    tracker: Any = None
    parent_run_id: str | None = None
    tracking_error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def spec(self) -> Any:
        return self.loaded.spec

    @property
    def sid(self) -> str:
        return self.ledger.sid

    def engine(self, engine_hash: str) -> EngineConfig:
        for ec in self.plan.engine_configs:
            if ec.hash == engine_hash:
                return ec
        raise KeyError(engine_hash)

    def point_ids(self, ec: EngineConfig) -> list[str]:
        return [w.key(ec).id for w in self.windows]


# --------------------------------------------------------------------------------------------
# prepare


def _local_models(loaded: Loaded) -> bool:
    """Whether the spec points at the tiny local models (built on demand)."""
    root = Path(loaded.spec.paths.models).resolve()
    paths = [loaded.spec.target.model] + [
        c.model for d in loaded.spec.drafter.values() for c in d.checkpoints.values()]
    return any(Path(p).resolve().is_relative_to(root) for p in paths)


def experiment_name(loaded: Loaded) -> str:
    s = loaded.spec
    return s.tracking.experiment or f"specflow/{s.target.name}/{s.hardware.name}"


def pins(ctx_loaded: Loaded, facts: probe.VllmFacts) -> dict[str, str]:
    """Versions and revisions that make a result reproducible (logged on the parent run)."""
    from specflow.engine import device

    s = ctx_loaded.spec
    out = {"specflow": md.version("specflow"), "vllm": facts.version,
           "vllm_distribution": facts.distribution, "torch": facts.torch or "unknown",
           "target_model": s.target.model, "target_revision": s.target.revision or "unpinned"}
    for name, d in s.drafter.items():
        ckpt = d.checkpoints.get(s.target.name)
        if ckpt is not None:
            out[f"drafter.{name}"] = f"{ckpt.model}@{ckpt.revision or 'unpinned'}"
    devices = device.probe()
    out["device"] = devices[0].name if devices else "cpu"
    out["driver"] = devices[0].driver if devices else "none"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10, check=False)
        out["git_commit"] = commit.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        out["git_commit"] = "unknown"
    return out


def headroom_reports(loaded: Loaded, plan: SweepPlan) -> list[Headroom]:
    """Headroom of every engine config, with the real device memory when one is present."""
    from specflow.engine import device
    from specflow.core import memory

    total = free = None
    if loaded.spec.headroom.use_device_probe:
        found = [d for d in device.probe() if d.vendor == loaded.spec.hardware.vendor]
        if found:
            total, free = found[0].total_bytes, found[0].free_bytes
    return [memory.headroom(loaded.spec, ec, device_total_bytes=total, device_free_bytes=free)
            for ec in plan.engine_configs]


def prepare(overrides: Sequence[str], *, tracking: bool = True) -> Context:
    """Validate, probe vLLM, check headroom, materialise workloads; open the ledger and MLflow.

    Raises SpecError for anything the user must fix (exit 2).
    """
    from specflow.demo import tiny
    from specflow.workloads import generate as workloads
    from specflow.engine.runner import plan_windows

    overrides = tuple(overrides)
    loaded, plan = load_plan(overrides)
    spec = loaded.spec
    try:
        facts = probe.facts(spec.backend.vllm_command)
    except probe.ProbeError as exc:
        raise SpecError([Problem("backend.vllm_command", f"cannot reach vLLM ({exc})",
                                 spec.backend.vllm_command, "a command that runs vLLM")]) from None
    problems = [p for ec in plan.engine_configs if ec.speculative_config
                for p in probe.check_speculative_config(
                    facts, ec.speculative_config, f"drafter.{ec.drafter}.speculative_config")]
    if problems:
        raise SpecError(problems)
    if _local_models(loaded):
        tiny.build_all(Path(spec.paths.models))
    workdir = Path(spec.tracking.workdir).resolve()
    ledger = Ledger(workdir, ledger_mod.sweep_id(plan.hash, facts.version))
    reports = {ec.hash: h for ec, h in zip(plan.engine_configs, headroom_reports(loaded, plan))}
    tokenizer = spec.target.tokenizer or spec.target.model
    local_tok = Path(tokenizer).expanduser()
    datasets = workloads.materialize_all(
        spec.workload, ledger.dir / "datasets",
        tokenizer=str(local_tok) if local_tok.is_dir() else None,
        concurrency=spec.sweep.concurrency)
    windows = plan_windows(spec.workload, {n: m.path for n, m in datasets.items()},
                           spec.sweep.concurrency, spec.sweep.repeats,
                           spec.sweep.warmup_requests)
    ctx = Context(overrides, loaded, plan, facts, ledger, ledger.dir, reports, datasets, windows)
    for m in datasets.values():
        ctx.notes.extend(m.warnings)
    if tracking:
        open_tracking(ctx)
    return ctx


def open_tracking(ctx: Context) -> None:
    """Reach MLflow and open (or reopen) the sweep's parent run; offline is not fatal."""
    from omegaconf import OmegaConf

    from specflow.results.tracking import Tracker

    spec = ctx.spec
    try:
        ctx.tracker = Tracker(spec.tracking.uri, experiment_name(ctx.loaded),
                              Path(spec.tracking.workdir).resolve() / "mlartifacts")
        ctx.tracker.check()
        run_name = f"sweep {ctx.plan.target} on {ctx.plan.hardware} ({ctx.plan.hash[:8]})"
        ctx.parent_run_id = ctx.tracker.parent(
            ctx.sid, ctx.plan, OmegaConf.to_yaml(OmegaConf.create(ctx.loaded.raw)),
            pins(ctx.loaded, ctx.facts), run_name)
    except Exception as exc:  # any store failure: keep results locally, sync next run
        _offline(ctx, exc)


def _offline(ctx: Context, exc: BaseException) -> None:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if ctx.tracking_error is None:
        log.warning("MLflow unreachable (%s): results stay in %s and are synced on the next run",
                    first, ctx.ledger.points)
    ctx.tracking_error = first
    ctx.tracker = None


def _log(ctx: Context, m: Measurement) -> None:
    if ctx.tracker is None or ctx.parent_run_id is None:
        return
    entry = ctx.ledger.get(m.key.id)
    try:
        ec = ctx.engine(m.key.engine_hash)
    except KeyError:
        ec = None
    files = [Path(p) for p in m.artifacts.values()] if m.artifacts else []
    try:
        run_id = ctx.tracker.log_point(ctx.parent_run_id, m, ec, files,
                                       run_id=entry.run_id if entry else None)
    except Exception as exc:
        _offline(ctx, exc)
        return
    ctx.ledger.mark_logged(m.key.id, run_id)


def sync(ctx: Context) -> int:
    """Push points MLflow has not received (an earlier run was offline); returns how many."""
    pushed = 0
    for entry in ctx.ledger.unlogged():
        if ctx.tracker is None:
            break
        _log(ctx, entry.measurement)
        pushed += ctx.tracker is not None
    return pushed


# --------------------------------------------------------------------------------------------
# measure


def _refused(ctx: Context, ec: EngineConfig, h: Headroom) -> list[Measurement]:
    out = []
    for w in ctx.windows:
        key = w.key(ec)
        out.append(Measurement(key=key, engine=ec.name, drafter=ec.drafter, method=ec.method,
                               num_speculative_tokens=ec.num_speculative_tokens,
                               traffic_class=w.traffic_class, status="failed",
                               failure="refused_by_headroom",
                               failure_detail="; ".join(h.reasons + h.fixes)))
    return out


def run_config(ctx: Context, engine_hash: str, on_point: OnPoint | None = None) -> dict[str, Any]:
    """Measure every missing window of one engine config; finished ones are not redone."""
    from specflow.engine.runner import run_engine

    ec = ctx.engine(engine_hash)
    h = ctx.headroom[ec.hash]
    finished = ctx.ledger.finished()
    todo = [w for w in ctx.windows if w.key(ec).id not in finished]
    summary = {"engine": ec.name, "hash": ec.hash, "skipped": len(ctx.windows) - len(todo),
               "ok": 0, "failed": 0, "started": False}
    if not todo:
        return summary
    if h.verdict == "refuse":
        measurements = _refused(ctx, ec, h)
    else:
        if ctx.spec.backend.kind == "local":
            ctx.ledger.event("engine_start", engine=ec.name, hash=ec.hash)
            summary["started"] = True
        tokenizer = ctx.spec.target.tokenizer or ctx.spec.target.model
        measurements = run_engine(ec, ctx.spec.backend, ctx.windows, ctx.workdir / "runs",
                                  skip=finished, tokenizer=tokenizer)
    for m in measurements:
        if m.key.id in finished:
            continue
        m = replace(m, prompt_hash=m.prompt_hash or ctx.datasets[m.key.workload].prompt_hash)
        ctx.ledger.record(m)
        _log(ctx, m)
        summary["ok" if m.ok else "failed"] += 1
        if on_point is not None:
            on_point(m)
    return summary


def measure(ctx: Context, engine_hash: str) -> dict[str, Any]:
    """`run_config` with the CLI's progress hook; raises EngineStartFailed when a retry may help."""
    summary = run_config(ctx, engine_hash, PROGRESS.get("on_point"))
    if summary["started"] and summary["ok"] == 0 and summary["failed"]:
        ec = ctx.engine(engine_hash)
        kinds = {e.measurement.failure for e in ctx.ledger.entries()
                 if e.measurement.key.engine_hash == ec.hash and not e.measurement.ok}
        if kinds and kinds <= RETRYABLE_START_FAILURES:
            raise EngineStartFailed(f"engine {ec.name} did not start ({', '.join(sorted(kinds))})")
    return summary


def missing(ctx: Context) -> list[PointKey]:
    """Windows of the plan without a successful measurement."""
    finished = ctx.ledger.finished()
    return [w.key(ec) for ec in ctx.plan.engine_configs for w in ctx.windows
            if w.key(ec).id not in finished]


def measurements(ctx: Context) -> list[Measurement]:
    """This sweep's measurements (latest per point)."""
    keys = {w.key(ec).id for ec in ctx.plan.engine_configs for w in ctx.windows}
    return [m for m in ctx.ledger.measurements() if m.key.id in keys]


def closing_windows(ctx: Context) -> list[Any]:
    """Baseline windows re-measured at the end of the sweep (repeat ids after the opening ones)."""
    n = ctx.spec.sweep.closing_baseline_repeats
    r0 = ctx.spec.sweep.repeats
    firsts = [w for w in ctx.windows if w.repeat == 0]
    return [replace(w, repeat=r0 + i) for i in range(n) for w in firsts]


def baseline(ctx: Context) -> EngineConfig | None:
    return next((ec for ec in ctx.plan.engine_configs if ec.method == "none"), None)


def run_closing_baseline(ctx: Context, on_point: OnPoint | None = None) -> dict[str, Any]:
    """Measure the baseline again after the candidates (skipped when already done)."""
    ec = baseline(ctx)
    if ec is None or not ctx.spec.sweep.closing_baseline_repeats:
        return {"engine": None, "skipped": 0, "ok": 0, "failed": 0, "started": False}
    opening = ctx.windows
    ctx.windows = closing_windows(ctx)
    try:
        return run_config(ctx, ec.hash, on_point)
    finally:
        ctx.windows = opening


# --------------------------------------------------------------------------------------------
# decide, promote, report


@dataclass
class Outcome:
    """What the decision step produced."""

    decided: bool
    problems: list[str]
    report: Path | None
    plots: list[Path]
    promotions: list[Any]
    table: list[dict[str, Any]]


def _register(ctx: Context, promotion: Any) -> None:
    """Mirror a champion in the MLflow model registry (alias `champion`); offline is not fatal."""
    if ctx.tracker is None or ctx.parent_run_id is None:
        return
    name = f"specflow-{ctx.plan.target}-{promotion.traffic_class}".replace("_", "-")
    client = ctx.tracker.client
    try:
        client.log_artifact(ctx.parent_run_id, str(promotion.path),
                            f"promoted/{promotion.traffic_class}")
        try:
            client.create_registered_model(name, description=(
                f"specflow champion for {ctx.plan.target} on {ctx.plan.hardware}, "
                f"traffic class {promotion.traffic_class}: a speculative-decoding config"))
        except Exception:  # RESOURCE_ALREADY_EXISTS
            pass
        mv = client.create_model_version(
            name, f"runs:/{ctx.parent_run_id}/promoted/{promotion.traffic_class}",
            run_id=ctx.parent_run_id, tags={"specflow.version": promotion.version,
                                            "specflow.decision": str(
                                                promotion.record.get("outcome", ""))})
        client.set_registered_model_alias(name, "champion", mv.version)
    except Exception as exc:
        _offline(ctx, exc)


def decide(ctx: Context) -> Outcome:
    """Analyse every finished window, write the report and plots, promote per traffic class."""
    from specflow.core import analysis
    from specflow.core import promote
    from specflow.results import report

    base = baseline(ctx)
    ms = measurements(ctx)
    r0 = ctx.spec.sweep.repeats
    closing = [m for m in ctx.ledger.measurements()
               if base is not None and m.key.engine_hash == base.hash and m.key.repeat >= r0]
    refused = {h for h, r in ctx.headroom.items() if r.verdict == "refuse"}
    out_dir = ctx.workdir / "report"
    try:
        result = analysis.analyze(ms, ctx.spec.promote, closing_baseline=closing,
                                  refused_by_headroom=refused)
    except analysis.AnalysisError as exc:
        problems = list(getattr(exc, "problems", None) or [str(exc)])
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "report.md"
        path.write_text("# specflow decision report\n\nNo decision: the data cannot carry "
                        "one.\n\n" + "\n".join(f"- {p}" for p in problems) + "\n")
        return Outcome(False, problems, path, [], [], [])
    files = report.write_report(result, out_dir)
    engines = {ec.hash: ec for ec in ctx.plan.engine_configs}
    promotions = promote.promote_all(result, engines, ctx.spec.promote,
                                     on_promoted=lambda p: _register(ctx, p))
    table = [row for r in result.classes for row in analysis.decision_rows(r)]
    if ctx.tracker is not None and ctx.parent_run_id is not None:
        try:
            ctx.tracker.log_summary(ctx.parent_run_id, {
                "points_ok": sum(1 for m in ctx.ledger.measurements() if m.ok),
                "points_failed": sum(1 for m in ctx.ledger.measurements() if not m.ok)},
                [files.report, *files.plots], artifact_path="report")
        except Exception as exc:
            _offline(ctx, exc)
    return Outcome(True, [], files.report, list(files.plots), promotions, table)


def outcome_summary(ctx: Context, outcome: Outcome) -> dict[str, Any]:
    """A JSON-able summary of the sweep for the CLI and the flow's return value."""
    entries = list(ctx.ledger.entries())
    return {
        "decided": outcome.decided, "problems": outcome.problems,
        "report": str(outcome.report) if outcome.report else None,
        "plots": [str(p) for p in outcome.plots],
        "promotions": [{"traffic_class": p.traffic_class, "status": p.status,
                        "version": p.version, "path": str(p.path)} for p in outcome.promotions],
        "table": outcome.table,
        "points": len(entries), "ok": sum(e.measurement.ok for e in entries),
        "unlogged": sum(not e.logged for e in entries),
        "tracking_uri": ctx.spec.tracking.uri, "tracking_error": ctx.tracking_error,
        "experiment": experiment_name(ctx.loaded), "parent_run_id": ctx.parent_run_id,
        "missing": [k.id for k in missing(ctx)],
    }
