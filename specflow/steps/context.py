"""A sweep's context, rebuilt from (overrides, ledger) by every step that needs it.

Opening validates and compiles the config, checks it against the installed vLLM, builds the tiny
local models when the spec points at them, computes headroom, materialises the workloads into
the sweep's directory (content-addressed, so a second open finds them) and reopens the sweep's
MLflow parent run (found by its sweep-id tag), pushing the windows an earlier step or run kept
locally while MLflow was unreachable. Nothing is cached in the process.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import json
import logging
import subprocess
import tempfile
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specflow.config.artifact import artifact_config
from specflow.config.compose import Loaded, load_plan, model_locations
from specflow.demo import tiny
from specflow.engine import device, vllm_check
from specflow.engine.runner import RESULT_FILE, Window, output_digests, plan_windows
from specflow.records.measurement import Measurement
from specflow.records.store import Store, StoreError, is_url, shown
from specflow.results.ledger import Ledger, SweepInfo, sweep_id
from specflow.results.tracking import Tracker
from specflow.search import predict
from specflow.search.plan import EngineStart, Shape
from specflow.spec.compile import EngineConfig, SweepPlan, store_settings
from specflow.spec.errors import Problem, SpecError
from specflow.spec.hfcache import local_model
from specflow.spec.memory import Headroom, headroom
from specflow.spec.schema import Spec
from specflow.workloads import MaterializedWorkload, materialize_all

log = logging.getLogger("specflow.steps")

OnWindow = Callable[[Measurement], None]
"""Progress callback: called with each finished (or failed) window."""
OnRound = Callable[[list[str], int], None]
"""Called in-process with each racing round's log lines (what it decided, what runs next) and
the number of windows the next round plans (0: the race is over).
Lives here, not in pipelines/: a served flow run loads the flow's module keeping only its
imports, so its parameter annotations must name imported things."""


@dataclass
class Context:
    """An opened sweep: validated spec, plan, vLLM facts, headroom, datasets, windows, ledger and
    the MLflow parent run (None while MLflow is unreachable)."""

    overrides: tuple[str, ...]
    loaded: Loaded
    plan: SweepPlan
    facts: vllm_check.VllmFacts
    ledger: Ledger
    headroom: dict[str, Headroom]
    datasets: dict[str, MaterializedWorkload]
    windows: list[Window]
    """The opening windows of every engine config (closing baseline windows: `closing_windows`)."""
    tracker: Tracker | None = None
    parent_run_id: str | None = None
    tracking_error: str | None = None
    synced: int = 0
    """Windows kept locally by an earlier step or run and pushed to MLflow on opening."""
    notes: list[str] = field(default_factory=list)
    pins: dict[str, str] = field(default_factory=dict)
    """`pins`: versions and revisions, in `sweep.json` and on the MLflow parent run."""

    @property
    def spec(self) -> Spec:
        return self.loaded.spec

    @property
    def sid(self) -> str:
        return self.ledger.sid

    @property
    def workdir(self) -> Path:
        return self.ledger.dir

    def engine(self, engine_hash: str) -> EngineConfig:
        for ec in self.plan.engine_configs:
            if ec.hash == engine_hash:
                return ec
        raise KeyError(engine_hash)

    def baseline(self) -> EngineConfig | None:
        return next((ec for ec in self.plan.engine_configs if ec.method == "none"), None)

    def shape(self) -> Shape:
        """What the round planner may measure: the plan's configs, points and budget."""
        sweep = self.spec.sweep
        base = self.baseline()
        b = sweep.budget
        return Shape(
            design=sweep.design, baseline=base.hash if base is not None else "",
            candidates=tuple(ec.hash for ec in self.plan.engine_configs if ec.method != "none"),
            workloads={n: w.traffic_class for n, w in self.spec.workload.items()},
            concurrency=tuple(sweep.concurrency), repeats=sweep.repeats,
            closing_repeats=sweep.closing_baseline_repeats,
            budget=b, baseline_every=b.baseline_every,
            engines={ec.hash: ec for ec in self.plan.engine_configs},
            search=sweep.search, chains=predict.chains(self.plan.engine_configs),
            kv_capacity=self.kv_capacity())

    def kv_capacity(self) -> dict[str, int]:
        """Engine hash -> requests its KV cache holds at the workloads' context (headroom)."""
        return {h: r.concurrency_at_context for h, r in self.headroom.items()}

    def start_windows(self, start: EngineStart) -> list[Window]:
        """The windows of one planned engine start."""
        firsts = {(w.workload, w.concurrency): w for w in self.windows if w.repeat == 0}
        template = {w.workload: w for w in self.windows if w.repeat == 0}
        # a schedule is measured at levels around its thresholds, which may be new levels
        return [replace(firsts.get((k.workload, k.concurrency), template[k.workload]),
                        concurrency=k.concurrency, repeat=k.repeat, start=k.start)
                for k in start.window_keys()]

    def closing_windows(self) -> list[Window]:
        """Baseline windows re-measured at the end (repeat ids after the opening ones)."""
        n, r0 = self.spec.sweep.closing_baseline_repeats, self.spec.sweep.repeats
        firsts = [w for w in self.windows if w.repeat == 0]
        return [replace(w, repeat=r0 + i) for i in range(n) for w in firsts]

    def went_offline(self, exc: BaseException) -> None:
        """MLflow failed: keep results in the ledger only; they are synced on the next run."""
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if self.tracking_error is None:
            log.warning("MLflow unreachable (%s): results stay in %s and are synced on the next "
                        "run", first, shown(self.ledger.location))
        self.tracking_error = first
        self.tracker = None

    def push_unlogged(self, engines: Container[str] | None = None) -> int:
        """Log the windows MLflow has not received (kept while it was unreachable, or left by a
        killed run); only those of `engines` when given (a worker pushes only the windows of
        the config it owns: another worker may be logging its own at this moment)."""
        pushed = 0
        for entry in self.ledger.unlogged():
            if self.tracker is None:
                break
            if engines is not None and entry.measurement.key.engine_hash not in engines:
                continue
            self.log(entry.measurement)
            pushed += self.tracker is not None
        return pushed

    def log(self, m: Measurement) -> None:
        """Log one window to MLflow (idempotent: its child run is found again by point id)."""
        if self.tracker is None or self.parent_run_id is None:
            return
        entry = self.ledger.get(m.key.id)
        try:
            ec: EngineConfig | None = self.engine(m.key.engine_hash)
        except KeyError:
            ec = None
        files = [Path(p) for p in m.artifacts.values()]
        ds = self.datasets.get(m.key.workload)
        private = ds is None or ds.private  # a window of no known dataset: as if private
        # the engine served every workload of its start: where any is private, its log may
        # quote their requests whichever window it is attached to
        shared = any(d.private for d in self.datasets.values())
        with tempfile.TemporaryDirectory() as tmp:
            if private:  # production text stays in the work directory
                files = [redacted(f, Path(tmp)) for f in files]
            elif shared:
                files = [Path(tmp) / "withheld" if k == "engine_log" else Path(p)
                         for k, p in m.artifacts.items()]
            if (private or shared) and m.failure_detail:  # a log's tail may quote a request
                m = replace(m, failure_detail=WITHHELD.format(m.failure or "failed",
                                                              self.ledger.dir))
            try:
                run_id = self.tracker.log_window(self.parent_run_id, m, ec, files,
                                                run_id=entry.run_id if entry else None)
            except Exception as exc:  # noqa: BLE001 - any store failure: the window stays unlogged in the ledger
                self.went_offline(exc)
                return
        self.ledger.mark_logged(m.key.id, run_id)


WITHHELD = ("{} (the log's tail is withheld: this sweep replays production text; it is in "
            "{} under runs/)")
"""A private window's failure detail as MLflow gets it."""
def redacted(path: Path, tmp: Path) -> Path:
    """The copy of a window's file that may leave the work directory for a private workload:
    a bench result with each text replaced by its sha256 (as the measurement holds it), no log
    at all (a server's or the bench's log may quote a request); the per-request records and
    counters (hashes and numbers) as they are."""
    if path.suffix == ".log":
        return tmp / "withheld"  # not a file: log_window skips it
    if path.name != RESULT_FILE or not path.is_file():
        return path
    data = json.loads(path.read_text(encoding="utf-8"))
    data["generated_texts"] = list(output_digests(data))  # as the measurement holds them
    out = tmp / path.name
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


def experiment_name(loaded: Loaded) -> str:
    s = loaded.spec
    return s.tracking.experiment or f"specflow/{s.target.name}/{s.hardware.name}"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def pins(loaded: Loaded, facts: vllm_check.VllmFacts) -> dict[str, str]:
    """Versions and revisions that make a result reproducible (logged on the parent run)."""
    s = loaded.spec
    out = {"specflow": md.version("specflow"), "vllm": facts.version,
           "vllm_distribution": facts.distribution, "torch": facts.torch or "unknown",
           "target_model": s.target.model, "target_revision": s.target.revision or "unpinned"}
    for name, d in s.drafter.items():
        ckpt = d.checkpoints.get(s.target.name)
        if ckpt is not None:
            out[f"drafter.{name}"] = f"{ckpt.model}@{ckpt.revision or 'unpinned'}"
    devices = device.detect()
    out["device"] = devices[0].name if devices else "cpu"
    out["driver"] = devices[0].driver if devices else "none"
    out["git_commit"] = _git_commit()
    return out


def headroom_reports(loaded: Loaded, plan: SweepPlan) -> list[Headroom]:
    """Headroom of every engine config, with the real device memory when one is present."""
    total = free = None
    if loaded.spec.headroom.use_device_memory:
        found = [d for d in device.detect() if d.vendor == loaded.spec.hardware.vendor]
        if found:
            total, free = found[0].total_bytes, found[0].free_bytes
    return [headroom(loaded.spec, ec, device_total_bytes=total, device_free_bytes=free)
            for ec in plan.engine_configs]


def _local_models(loaded: Loaded) -> bool:
    """Whether the spec points at the tiny local models (built on demand)."""
    if is_url(loaded.spec.paths.models):
        return False
    root = Path(loaded.spec.paths.models).expanduser().resolve()
    return any(Path(p).expanduser().resolve().is_relative_to(root)
               for p in model_locations(loaded.spec).values() if not is_url(p))


def _vllm_facts(loaded: Loaded, plan: SweepPlan) -> vllm_check.VllmFacts:
    """The installed vLLM's facts; every speculative config must be one it accepts."""
    spec = loaded.spec
    try:
        facts = vllm_check.facts(spec.backend.vllm_command)
    except vllm_check.VllmCheckError as exc:
        raise SpecError([Problem("backend.vllm_command", f"cannot reach vLLM ({exc})",
                                 spec.backend.vllm_command, "a command that runs vLLM")]) from None
    problems = vllm_check.check_plan(facts, plan.engine_configs)
    if problems:
        raise SpecError(problems)
    return facts


def measured_settings(spec: Spec) -> dict[str, Any]:
    """Besides the plan, what changes what a window measures (part of the sweep's identity):
    the workloads (prompts, output lengths, sources), the warm-up, the design, the search
    (named only when adaptive: an exhaustive search keeps the identity of a sweep without one)
    and the classes decided on latency with the statistic, or on capacity with the search and
    its SLOs (each named only where there is one, for the same reason), which `compare` scores
    their speedups on."""
    out = {"workload": {k: w.model_dump(mode="json") for k, w in spec.workload.items()},
           "warmup_requests": spec.sweep.warmup_requests,
           "warmup_scope": "first window per level", "design": spec.sweep.design}
    if spec.sweep.search != "exhaustive" and spec.sweep.design == "race":
        out["search"] = spec.sweep.search
    latency = sorted({c for w in spec.workload.values() if (c := w.traffic_class)
                      and spec.promote.objective_for(c) == "latency"})
    if latency:
        out["latency"] = {"classes": latency, "statistic": spec.promote.latency_statistic}
    searched = sorted({c for w in spec.workload.values() if (c := w.traffic_class)
                       and spec.promote.objective_for(c) == "capacity"})
    if searched:
        out["capacity"] = {"classes": searched, **spec.promote.capacity.model_dump(
            mode="json", exclude={"target_load", "slo"}),
            "slo": spec.promote.capacity_slo.model_dump(mode="json")}
    return out


def open_sweep(overrides: Sequence[str], *, tracking: bool = True, sync: bool = True
               ) -> Context:
    """Build the sweep's context from its overrides and its ledger (see the module docstring).
    `sync=False`: push no unlogged window on opening (a worker pushes its own config's only).

    Raises SpecError for anything the user must fix (exit 2).
    """
    overrides = tuple(overrides)
    loaded, plan = load_plan(overrides)
    spec = loaded.spec
    facts = _vllm_facts(loaded, plan)
    if _local_models(loaded):
        tiny.build_all(Path(spec.paths.models).expanduser())
    measured = measured_settings(spec)
    ledger = open_ledger(spec, sweep_id(plan.hash, facts.version, measured))
    pinned = pins(loaded, facts)
    ledger.write_info(SweepInfo(
        sweep_id=ledger.sid, plan_hash=plan.hash, target=plan.target, hardware=plan.hardware,
        experiment=experiment_name(loaded), measured=measured, pins=pinned,
        opened_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        repeats=spec.sweep.repeats))
    reports = {ec.hash: h for ec, h in zip(plan.engine_configs, headroom_reports(loaded, plan),
                                                   strict=True)}
    local_tok = Path(local_model(spec.target.tokenizer or spec.target.model))
    datasets = materialize_all(spec.workload, ledger.dir / "datasets",
                               tokenizer=str(local_tok) if local_tok.is_dir() else None,
                               concurrency=spec.sweep.concurrency)
    windows = plan_windows(spec.workload, {n: m.path for n, m in datasets.items()},
                           spec.sweep.concurrency, spec.sweep.repeats, spec.sweep.warmup_requests)
    ctx = Context(overrides, loaded, plan, facts, ledger, reports, datasets, windows,
                  notes=[w for m in datasets.values() for w in m.warnings], pins=pinned)
    if tracking:
        _open_tracking(ctx, sync)
    return ctx


def open_ledger(spec: Spec, sid: str) -> Ledger:
    """The sweep's ledger in `tracking.workdir` (a path or an object-store URL); a store that
    refuses the credentials, or whose bucket does not exist, is a SpecError naming the
    setting; one that cannot be reached past its grace stays a StoreError."""
    tr = spec.tracking
    check_workdir(spec)
    try:
        return Ledger(tr.workdir, sid, scratch=tr.scratch, grace_s=tr.store_grace_s)
    except StoreError as exc:
        if exc.unreachable:
            raise
        raise _store_problem(exc, tr.workdir) from None


def check_workdir(spec: Spec) -> None:
    """SpecError naming `tracking.workdir` unless its store can be listed (the bucket exists,
    the credentials are accepted); a local directory is created. The same for
    `promote.output_dir` where it is a URL of its own."""
    problems = []
    for setting, location in store_settings(spec):
        if setting != "tracking.workdir" and not is_url(location):
            continue  # a local directory of champions is made when one is promoted
        try:
            Store(location, setting=setting, grace_s=spec.tracking.store_grace_s).check()
        except StoreError as exc:
            if exc.unreachable:  # not a setting to fix: exit 1 with the message, not 2
                raise
            problems += _store_problem(exc, location, setting).problems
    if problems:
        raise SpecError(problems)


def _store_problem(exc: StoreError, workdir: str, setting: str = "tracking.workdir"
                   ) -> SpecError:
    return SpecError([Problem(setting, str(exc).removeprefix(f"{setting}: ")
                              .removeprefix(f"{workdir}: "), workdir,
                              "a store this process can read and write")])


def artifact_root(workdir: str, tracking_uri: str) -> Path | str | None:
    """Where a new experiment keeps its artifacts: beside the ledger (`<workdir>/mlartifacts`);
    with the ledger on an object store and a tracking server, where the server sends them (its
    `--artifacts-destination`, proxied: None)."""
    if not is_url(workdir):
        return Path(workdir).resolve() / "mlartifacts"
    return None if tracking_uri.startswith(("http://", "https://")) \
        else Store(workdir).join("mlartifacts")


def _open_tracking(ctx: Context, sync: bool = True) -> None:
    """Reach MLflow and open (or reopen) the sweep's parent run; offline is not fatal."""
    spec = ctx.spec
    try:
        ctx.tracker = Tracker(spec.tracking.uri, experiment_name(ctx.loaded),
                              artifact_root(spec.tracking.workdir, spec.tracking.uri))
        ctx.tracker.check()
        run_name = f"sweep {ctx.plan.target} on {ctx.plan.hardware} ({ctx.plan.hash[:8]})"
        ctx.parent_run_id = ctx.tracker.parent(
            ctx.sid, ctx.plan, artifact_config(ctx.loaded), ctx.pins, run_name)
        ctx.synced = ctx.push_unlogged() if sync else 0
    except Exception as exc:  # noqa: BLE001 - any store failure: keep results locally, sync next run
        ctx.went_offline(exc)
