"""MLflow tracking: one experiment per target x hardware, a parent run per sweep, a child run
per measured window. Every call may fail (store unreachable): callers keep the ledger entry
unlogged and it is synced on the next run, so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from specflow.champions.promote import Promotion, record_json
from specflow.records.measurement import MEASUREMENT, Measurement
from specflow.spec.compile import EngineConfig, SweepPlan
from specflow.spec.serialize import as_json

log = logging.getLogger("specflow.results.tracking")

SWEEP_TAG = "specflow.sweep_id"
WINDOW_TAG = "specflow.window_id"
KIND_TAG = "specflow.kind"


def mlflow_client(uri: str) -> Any:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def window_metrics(m: Measurement) -> dict[str, float]:
    """Scalar metrics of a measured window (no sentinel values: absent stays absent)."""
    out: dict[str, float] = {
        "output_throughput": m.output_throughput,
        "request_throughput": m.request_throughput,
        "total_token_throughput": m.total_token_throughput,
        "duration_s": m.duration_s,
        "completed": float(m.completed),
        "failed_requests": float(m.failed),
        "total_output_tokens": float(m.total_output_tokens),
    }
    out.update({k: float(v) for k, v in m.latency_ms.items()})
    if m.request_rate is not None:  # open loop: the offered rate, and whether it overloaded
        out["overload"] = float(m.overload)
    for name in ("acceptance_rate", "mean_acceptance_length", "num_drafts", "draft_tokens",
                 "accepted_tokens", "request_rate", "backlog_growth"):
        value = getattr(m, name)
        if value is not None:
            out[name] = float(value)
    return out


def window_params(m: Measurement, ec: EngineConfig | None) -> dict[str, str]:
    return {
        "method": m.method, "drafter": m.drafter, "num_speculative_tokens":
            str(m.num_speculative_tokens), "workload": m.key.workload,
        "traffic_class": m.traffic_class, "concurrency": str(m.key.concurrency),
        "repeat": str(m.key.repeat), "engine_config_hash": m.key.engine_hash,
        "engine_config": m.engine, "prompt_hash": m.prompt_hash,
        "checkpoint": (ec.checkpoint if ec else None) or "",
        "checkpoint_revision": (ec.checkpoint_revision if ec else None) or "",
    }


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow 3's UI opens an experiment without this tag on the GenAI traces overview (empty for a
sweep); with it, on the runs table, where the sweep's parent and window runs are."""


UI_VIEW = "workflowType=machine_learning"
"""The MLflow UI's "Model training" view (runs table, model metrics) as a URL parameter."""
MLFLOW_UI = "http://127.0.0.1:5000"
"""Where `mlflow ui` serves by default."""


class Tracker:
    """A thin MLflow client for specflow's runs."""

    def __init__(self, uri: str, experiment: str, artifact_root: Path | str | None = None):
        self.uri = uri
        self.experiment = experiment
        self.artifact_root = artifact_root
        self.client = mlflow_client(uri)
        self._experiment_id: str | None = None

    def check(self) -> None:
        """Raise if the store cannot be reached (fast, before a sweep relies on it)."""
        self.experiment_id()

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                root = self.artifact_root
                location = (root.resolve().as_uri() if isinstance(root, Path) else root) \
                    if root else None
                self._experiment_id = self.client.create_experiment(
                    self.experiment, artifact_location=location,
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            else:
                self._experiment_id = exp.experiment_id
                if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # made by an older specflow
                    self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG,
                                                   EXPERIMENT_KIND)
        return self._experiment_id

    def run_link(self, run_id: str) -> str:
        """Where a person opens the run: its page on a tracking server (an http(s) URI); for
        a local store, the `mlflow ui` command and the page at its default address. The page
        asks for MLflow's "Model training" view: MLflow 3.17's UI otherwise opens an
        experiment on its GenAI overview whatever the experiment's tags say (the view is a
        browser setting)."""
        page = f"#/experiments/{self.experiment_id()}/runs/{run_id}?{UI_VIEW}"
        if self.uri.startswith(("http://", "https://")):
            return f"{self.uri.rstrip('/')}/{page}"
        return f"mlflow ui --backend-store-uri {self.uri}, then open {MLFLOW_UI}/{page}"

    def _find(self, tags: dict[str, str]) -> list[Any]:
        flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        return self.client.search_runs([self.experiment_id()], filter_string=flt, max_results=5000)

    def parent(self, sid: str, plan: SweepPlan, config_yaml: str, pins: dict[str, str],
               run_name: str) -> str:
        """The sweep's parent run, created once and reused when the sweep resumes."""
        found = self._find({SWEEP_TAG: sid, KIND_TAG: "sweep"})
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {SWEEP_TAG: sid, KIND_TAG: "sweep", "mlflow.runName": run_name,
                **{f"pin.{k}": v for k, v in pins.items()}}
        run = self.client.create_run(self.experiment_id(), tags=tags, run_name=run_name)
        run_id = run.info.run_id
        from mlflow.entities import Param

        params = {"target": plan.target, "hardware": plan.hardware, "plan_hash": plan.hash,
                  "engine_configs": str(len(plan.engine_configs)),
                  "workloads": ",".join(plan.workloads),
                  "concurrency": ",".join(map(str, plan.concurrency)),
                  "repeats": str(plan.repeats), "num_windows": str(plan.num_windows)}
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.yaml").write_text(config_yaml)
            (Path(tmp) / "plan.json").write_text(json.dumps(as_json(plan), indent=2))
            (Path(tmp) / "pins.json").write_text(json.dumps(pins, indent=2))
            for name in ("config.yaml", "plan.json", "pins.json"):
                self.client.log_artifact(run_id, str(Path(tmp) / name))
        return run_id

    def log_window(self, parent_id: str, m: Measurement, ec: EngineConfig | None,
                  files: Sequence[Path] = (), run_id: str | None = None) -> str:
        """Create (or complete) the child run of one window; returns its run id."""
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.utils.time import get_current_time_millis

        name = f"{m.engine} {m.key.workload} c{m.key.concurrency} r{m.key.repeat}"
        if run_id is None:
            existing = self._find({WINDOW_TAG: m.key.id, "mlflow.parentRunId": parent_id})
            run_id = existing[0].info.run_id if existing else None
        logged: set[str] = set()  # metric keys already on the run (one log_batch: all or none)
        if run_id is None:
            run = self.client.create_run(self.experiment_id(), run_name=name, tags={
                "mlflow.parentRunId": parent_id, WINDOW_TAG: m.key.id, KIND_TAG: "window",
                "mlflow.runName": name})
            run_id = run.info.run_id
            params = window_params(m, ec)
        else:
            # completing a run a killed logger left behind: only what it had not logged yet,
            # so that no metric's history holds the window twice
            found = self.client.get_run(run_id)
            if found.info.status == "FINISHED":
                return run_id  # logged completely before (a sync that lost only the ledger mark)
            self.client.update_run(run_id, status="RUNNING")
            logged = set(found.data.metrics)
            params = {k: v for k, v in window_params(m, ec).items() if k not in found.data.params}
        if params:
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        now = get_current_time_millis()
        tags = [RunTag("specflow.status", m.status)]
        if m.ok:
            metrics = [Metric(k, v, now, 0) for k, v in window_metrics(m).items()]
            metrics += [Metric("acceptance_per_position", v, now, i)
                        for i, v in enumerate(m.per_position_acceptance)]
            metrics = [mt for mt in metrics if mt.key not in logged]
            self.client.log_batch(run_id, metrics=metrics, tags=tags)
        else:
            tags += [RunTag("specflow.failure", m.failure or "unknown"),
                     RunTag("specflow.failure_detail", (m.failure_detail or "")[-4000:])]
            self.client.log_batch(run_id, tags=tags)
        with tempfile.TemporaryDirectory() as tmp:
            if ec is not None:
                spec_file = Path(tmp) / "speculative_config.json"
                spec_file.write_text(json.dumps(ec.speculative_config, indent=2))
                argv_file = Path(tmp) / "serve_argv.json"
                argv_file.write_text(json.dumps(list(ec.serve_argv), indent=2))
                self.client.log_artifact(run_id, str(spec_file))
                self.client.log_artifact(run_id, str(argv_file))
            record = Path(tmp) / "measurement.json"
            record.write_text(json.dumps(MEASUREMENT.dump_python(m, mode="json"), indent=1))
            self.client.log_artifact(run_id, str(record))
        for f in files:
            if Path(f).is_file():
                self.client.log_artifact(run_id, str(f))
        self.client.set_terminated(run_id, status="FINISHED" if m.ok else "FAILED")
        return run_id

    def log_summary(self, run_id: str, metrics: dict[str, float], files: Iterable[Path],
                    status: str = "FINISHED", artifact_path: str | None = None) -> None:
        """Metrics and files (report, plots) on the parent run, then close it."""
        from mlflow.entities import Metric
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        if metrics:
            self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0)
                                                   for k, v in metrics.items()])
        self.log_files(run_id, files, artifact_path)
        self.client.set_terminated(run_id, status=status)

    def log_files(self, run_id: str, files: Iterable[Path], artifact_path: str | None = None
                  ) -> None:
        """Files as artifacts of a run (under `artifact_path`), those that exist."""
        for f in files:
            if Path(f).is_file():
                self.client.log_artifact(run_id, str(f), artifact_path)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Tags on a run, in one batch (values cut to MLflow's 5,000 characters)."""
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v[:5000]) for k, v in tags.items()])

    def set_note(self, run_id: str, markdown: str) -> None:
        """The run's description (`mlflow.note.content`), shown first on its page."""
        self.client.set_tag(run_id, "mlflow.note.content", markdown)

    def log_round(self, run_id: str, index: int, metrics: dict[str, float],
                  tags: dict[str, str]) -> None:
        """A racing round's trail on the parent run: metrics at step = round (idempotent: a
        replayed round logs the same values at the same step), tags per round."""
        from mlflow.entities import Metric, RunTag
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, index)
                                               for k, v in metrics.items()],
                              tags=[RunTag(k, v[:5000]) for k, v in tags.items()])

    def register_champion(self, parent_id: str, promotion: Promotion, target: str,
                          hardware: str) -> str:
        """Mirror a champion in the model registry (`specflow-<target>-<class>`, alias
        `champion`), with its file as an artifact of the sweep's parent run; returns the version."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

        cls = promotion.traffic_class
        name = f"specflow-{target}-{cls}".replace("_", "-")
        if isinstance(promotion.path, Path):
            self.client.log_artifact(parent_id, str(promotion.path), f"promoted/{cls}")
        else:  # on an object store: the same record, from a local copy
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / "champion.json"
                copy.write_text(record_json(promotion.record))
                self.client.log_artifact(parent_id, str(copy), f"promoted/{cls}")
        try:
            self.client.create_registered_model(name, description=(
                f"specflow champion for {target} on {hardware}, traffic class {cls}: a "
                "speculative-decoding config"))
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
        mv = self.client.create_model_version(
            name, f"runs:/{parent_id}/promoted/{cls}", run_id=parent_id,
            tags={"specflow.version": promotion.version,
                  "specflow.decision": promotion.record.outcome})
        self.client.set_registered_model_alias(name, "champion", mv.version)
        return str(mv.version)
