"""`tracking.workdir` as an object-store URL, validated before anything starts: a scheme fsspec
knows, a bucket named, no credentials written into it (they come from the environment)."""

from __future__ import annotations

import pytest

from specflow.config.compose import load_plan
from specflow.spec.errors import SpecError


def _problems(workdir: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_plan(["experiment=cpu_tiny", f"tracking.workdir={workdir}"])
    return [p.render() for p in err.value.problems if p.path == "tracking.workdir"]


def test_a_bucket_url_is_a_workdir_and_a_bad_one_is_named() -> None:
    _, plan = load_plan(["experiment=cpu_tiny", "tracking.workdir=s3://results/specflow"])
    assert plan.engine_configs
    (unknown,) = _problems("s4://results/specflow")
    assert "'s4' is not a filesystem fsspec knows" in unknown and "s3" in unknown
    (nobucket,) = _problems("s3:///specflow")
    assert "no bucket named" in nobucket and "s3://BUCKET/PREFIX" in nobucket


def test_credentials_written_into_the_url_are_refused_and_never_shown() -> None:
    (creds,) = _problems("s3://AKIAEXAMPLE:hunter2secret@results/specflow")
    assert "credentials written into the URL" in creds and "AWS_ACCESS_KEY_ID" in creds
    assert "hunter2secret" not in creds and "AKIAEXAMPLE" not in creds


def test_champions_follow_a_bucket_workdir_unless_placed_elsewhere() -> None:
    """With the ledger in a bucket, the default `promote.output_dir` (relative) is under it, so
    a fleet's champions are not left on the disk of the process that decided; an absolute path
    or a URL of its own stays as given, and a URL of its own is checked like the workdir."""
    loaded, _ = load_plan(["experiment=cpu_tiny", "tracking.workdir=s3://results/specflow/"])
    assert loaded.spec.promote.output_dir == "s3://results/specflow/promoted"
    for given in ("/srv/champions", "s3://elsewhere/champions"):
        loaded, _ = load_plan(["experiment=cpu_tiny", "tracking.workdir=s3://results/specflow",
                               f"promote.output_dir={given}"])
        assert loaded.spec.promote.output_dir == given
    loaded, _ = load_plan(["experiment=cpu_tiny"])
    assert loaded.spec.promote.output_dir == "promoted"
    with pytest.raises(SpecError) as err:
        load_plan(["experiment=cpu_tiny", "promote.output_dir=s3://k:secret@b/champions"])
    (creds,) = [p.render() for p in err.value.problems]
    assert creds.startswith("promote.output_dir") and "secret" not in creds
