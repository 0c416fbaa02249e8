"""The Kubernetes work pool's base job template (pipelines/k8s/base-job-template.json), checked
without a cluster: Prefect's own validation of a work pool's template, the job variables a
deployment sets validated against its schema, and the Job the Kubernetes worker would submit
for a flow run rendered by that worker's own configuration class."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "pipelines" / "k8s" / "base-job-template.json"
VALUES = {"image": "registry.example.com/specflow:0.1.0", "gpu_count": 2,
          "mlflow_tracking_uri": "http://mlflow.specflow.svc:5000"}


def _template() -> dict:
    return json.loads(TEMPLATE.read_text())


def test_prefect_accepts_the_template_for_a_kubernetes_pool_and_its_variables() -> None:
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import ValidationError, validate

    t = _template()
    pool = WorkPoolCreate(name="gpu-k8s", type="kubernetes", base_job_template=t)
    assert pool.base_job_template == t  # every placeholder is a declared variable
    broken = json.loads(json.dumps(t))
    del broken["variables"]["properties"]["gpu_count"]
    with pytest.raises(ValueError, match="undeclared variable"):
        WorkPoolCreate(name="gpu-k8s", type="kubernetes", base_job_template=broken)
    validate(VALUES, t["variables"], raise_on_error=True, preprocess=True)
    for bad in ({**VALUES, "gpu_count": 0}, {k: v for k, v in VALUES.items() if k != "image"}):
        with pytest.raises(ValidationError):
            validate(bad, t["variables"], raise_on_error=True, preprocess=True)


def test_the_rendered_job_requests_the_gpus_needs_no_shared_volume_and_reads_its_secrets(
        ) -> None:
    """`from_template_and_values` without its last two steps, which resolve block and variable
    references through the Prefect API (the template has none): defaults, values, rendering,
    the worker's configuration model, then what the worker does for a flow run."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.templating import apply_values, find_placeholders
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as Config

    t = _template()
    assert not [p for p in find_placeholders(json.dumps(t["job_configuration"]))
                if p.type.value != "standard"]  # no block or variable references
    variables = Config._get_base_config_defaults(t["variables"]["properties"])
    config = Config(**apply_values(t["job_configuration"], {**variables, **VALUES}))
    run = FlowRun(id=uuid.uuid4(), flow_id=uuid.uuid4(), name="engine ngram-n3")
    config.prepare_for_flow_run(run)
    job = config.job_manifest
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == VALUES["image"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    # no shared volume: the ledger is on the object store; a node-local cache only
    assert container["volumeMounts"] == [{"name": "specflow-cache", "mountPath": "/cache"}]
    assert pod["volumes"] == [{"name": "specflow-cache", "hostPath": {
        "path": "/var/cache/specflow", "type": "DirectoryOrCreate"}}]
    assert "persistentVolumeClaim" not in json.dumps(job)
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HOME"]["value"] == "/cache/huggingface"  # weights: once per node
    assert env["XDG_CACHE_HOME"]["value"] == "/cache"  # tracking.scratch null: /cache/specflow
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the store's, from a Secret
        assert env[key]["valueFrom"]["secretKeyRef"] == {
            "name": "specflow-store", "key": key, "optional": True}
        assert "value" not in env[key]
    assert env["MLFLOW_TRACKING_URI"]["value"] == VALUES["mlflow_tracking_uri"]
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "specflow-hf", "key": "HF_TOKEN", "optional": True}
    assert "value" not in env["HF_TOKEN"]  # the token itself is never in the manifest
    assert env["PREFECT__FLOW_RUN_ID"]["value"] == str(run.id)  # the worker's own env kept
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
