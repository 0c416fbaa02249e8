"""The ledger on an object store: a real S3-compatible server on loopback (moto's standalone
server, started and stopped here), through the same storage layer (fsspec) as a local path.

What holds: the ledger on a bucket reads back exactly what the same writes give on a local
path (windows, a torn window quarantined, leases, engine starts, `sweep.json`); a record is
created once (a second conditional create changes nothing); `compare` finds a sweep on the
bucket by id and by URL. Faults: a bucket that does not exist and refused credentials are one
clear message naming `tracking.workdir`, without the secret; a store unreachable for a while is
waited out and the write lands; unreachable past `store_grace_s` is a clear error.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specflow.records.measurement import MEASUREMENT
from specflow.records.store import Store, StoreError
from specflow.results import comparing
from specflow.results.ledger import Ledger, is_sweep, renew_lease, sweep_ids
from tests.builders import BASELINE, window
from tests.pipelines import live

GOOD = window(BASELINE, 100.0, c=1)
BAD = window(BASELINE, 100.0, c=4)


def _fresh_s3() -> None:
    """Credentials are read when a filesystem is made: forget the ones made before."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.S3Server]:
    server = live.S3Server(tmp_path_factory.mktemp("s3")).start()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    _fresh_s3()
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _fresh_s3()
        server.stop()


def _fill(ledger: Ledger) -> None:
    ledger.record(GOOD, run_id="run-good")
    ledger.record(BAD)
    ledger.mark_logged(GOOD.key.id, "run-good")
    ledger.engine_started("baseline", BASELINE.hash, "host-a", ("0",))
    renew_lease(ledger.lease_path("engine-abc"), flow_run_id="r1", devices=["0"])


def _seen(ledger: Ledger) -> dict:
    lease = ledger.lease("engine-abc")
    return {"entries": sorted((e.measurement.key.id, e.run_id, e.logged, MEASUREMENT.dump_json(
                e.measurement)) for e in ledger.entries()),
            "finished": ledger.finished(), "unlogged": [e.measurement.key.id
                                                        for e in ledger.unlogged()],
            "starts": [(e.engine, e.hash, e.host, e.devices) for e in ledger.engine_starts()],
            "lease": (lease.flow_run_id, lease.devices) if lease else None}


def test_a_ledger_on_a_bucket_reads_back_what_a_local_one_does(s3: live.S3Server,
                                                               tmp_path: Path) -> None:
    url = s3.bucket("ledger") + "/team/specflow"
    remote = Ledger(url, "sweep1", scratch=tmp_path / "scratch")
    local = Ledger(tmp_path / "local", "sweep1")
    for ledger in (remote, local):
        _fill(ledger)
    assert _seen(remote) == _seen(local)
    assert remote.location == f"{url}/sweeps/sweep1"
    assert str(remote.lease_path("engine-abc")) == f"{url}/sweeps/sweep1/leases/engine-abc.json"
    assert remote.dir == (tmp_path / "scratch" / "sweeps" / "sweep1").resolve()  # its own files
    assert not (remote.dir / "windows").exists()  # no record kept beside them

    # a torn window object: moved aside into windows/quarantine/, measured again
    store = Store(url).sub("sweeps", "sweep1")
    store.write(Ledger._key(BAD.key.id), b'{"measurement": {"key": {"engine_hash": "ab')
    assert remote.get(BAD.key.id) is None
    assert BAD.key.id not in {e.measurement.key.id for e in remote.entries()}
    assert len(store.names("windows/quarantine")) == 1
    remote.record(BAD)
    assert remote.get(BAD.key.id) is not None

    # created once: a second conditional create is refused and changes nothing
    assert store.create("once.json", b"first") is True
    assert store.create("once.json", b"second") is False
    assert store.read_bytes("once.json") == b"first"
    local_store = Store(tmp_path / "local")
    assert local_store.create("once.json", b"first") is True
    assert local_store.create("once.json", b"second") is False
    assert local_store.read_bytes("once.json") == b"first"

    # a report written in the scratch directory is published beside the records
    report = remote.dir / "report" / "report.md"
    report.parent.mkdir(parents=True)
    report.write_text("# decision\n")
    remote.publish([report])
    assert store.read_bytes("report/report.md") == b"# decision\n"

    # found again as local sweeps are: by id under the workdir, and by its URL
    assert sweep_ids(url) == ["sweep1"] and is_sweep(url, "sweep1")
    assert not is_sweep(url, "nope")
    for ref in ("sweep1", f"{url}/sweeps/sweep1"):
        side = comparing.resolve(ref, "compare A", workdir=url, tracking_uri="sqlite:///x.db",
                                 output_dir=tmp_path / "promoted")
        assert sorted(m.key.id for m in side.measurements) == sorted(
            [GOOD.key.id, BAD.key.id])
    with pytest.raises(comparing.SpecError) as err:
        comparing.resolve("0123abcd", "compare A", workdir=url, tracking_uri="sqlite:///x.db",
                          output_dir=tmp_path / "promoted")
    assert "sweep1" in str(err.value.problems[0].expected)


def test_a_missing_bucket_and_refused_credentials_are_clear_errors_without_the_secret(
        s3: live.S3Server, tmp_path: Path) -> None:
    with pytest.raises(StoreError) as err:
        Store("s3://no-such-bucket/x").check()
    assert "tracking.workdir" in str(err.value) and "'no-such-bucket' does not exist" in str(
        err.value)

    secured = live.S3Server(tmp_path, auth=True).start()
    try:
        url = secured.bucket("secured") + "/p"
        saved = dict(os.environ)
        try:
            os.environ.update(secured.env)
            _fresh_s3()
            Store(url).check()  # the right key: fine
            Store(url).write("a.json", b"{}")
            os.environ.update(AWS_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG1",
                              AWS_SECRET_ACCESS_KEY="wrong-secret-never-shown")
            _fresh_s3()
            with pytest.raises(StoreError) as refused:
                Store(url).check()
            text = str(refused.value)
            assert "tracking.workdir" in text and "refused access" in text
            assert "AWS_ACCESS_KEY_ID" in text  # the setting to fix
            assert "wrong-secret-never-shown" not in text
            assert secured.env["AWS_SECRET_ACCESS_KEY"] not in text
        finally:
            os.environ.clear()
            os.environ.update(saved)
            _fresh_s3()
    finally:
        secured.stop()


@pytest.mark.parametrize("mode", ["drop", "503"])
def test_an_unreachable_store_is_waited_out_then_a_clear_error(s3: live.S3Server,
                                                               mode: str) -> None:
    """The link to the store is cut (connections dropped, or an ingress answering 503) when a
    write starts and mended 3 s later: the write waits and lands. Cut for longer than the grace:
    the error says for how long, and where."""
    url = s3.bucket(f"outage-{mode}") + "/prefix"
    saved = os.environ["AWS_ENDPOINT_URL_S3"]
    with live.Outage(s3.port, mode) as link:
        os.environ["AWS_ENDPOINT_URL_S3"] = link.url
        _fresh_s3()
        try:
            store = Store(url, grace_s=120)
            store.write("before.json", b"{}")
            link.cut()
            threading.Timer(3.0, link.mend).start()
            t0 = time.monotonic()
            store.write("w.json", b"{}")
            assert time.monotonic() - t0 >= 2.5
            assert store.read_bytes("w.json") == b"{}"
            link.cut()
            with pytest.raises(StoreError) as gone:
                Store(url, grace_s=3).write("x.json", b"{}")
            text = str(gone.value)
            assert f"{url} could not be reached for 3 s" in text and "tracking.workdir" in text
        finally:
            os.environ["AWS_ENDPOINT_URL_S3"] = saved
            _fresh_s3()


@pytest.mark.engine
def test_a_sweep_on_a_bucket_resumes_after_a_kill_and_decides_as_on_a_local_path(
        s3: live.S3Server, tmp_path: Path, tiny_models: Path, prefect_api: str) -> None:
    """The main job with `tracking.workdir` on the bucket, its MLflow artifacts there too, and
    each run with its own scratch directory (as another machine): SIGKILLed after its first
    window, run again: the windows measured before are kept as they were, the rest measured,
    one MLflow child run per window, its artifacts in the bucket. The decision equals the one
    the decision step makes from the same windows copied to a local path; `compare` and
    `profile` read the sweep from the bucket."""
    import io
    import signal
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient
    from rich.console import Console

    from specflow import steps
    from specflow.results.console import print_outcome
    from tests.pipelines.procs import processes_using
    from tests.pipelines.test_pipeline import SMALL, _env

    url = s3.bucket("sweeps") + "/specflow"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [*SMALL, "drafter=[none,ngram]", "sweep.closing_baseline_repeats=0",
              f"paths.models={tiny_models}",
              f"tracking.uri={uri}", f"promote.output_dir={tmp_path / 'promoted'}"]
    env = dict(_env(tmp_path, prefect_api), COLUMNS="80")

    def main(scratch: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "specflow", *common, f"tracking.workdir={url}",
                f"tracking.scratch={tmp_path / scratch}", *extra]

    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(main("scratch-1"), cwd=tmp_path, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def one_window_in_the_bucket() -> bool:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            sids = sweep_ids(url)
            return bool(sids) and any(e.measurement.ok for e in Ledger(
                url, sids[0], scratch=tmp_path / "reader").entries())

        live.wait_for("a window in the bucket", one_window_in_the_bucket, 600,
                      tmp_path / "first.log", every_s=0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    live.wait_for("no engine left", lambda: not processes_using(tiny_models), 60)
    (sid,) = sweep_ids(url)
    ledger = Ledger(url, sid, scratch=tmp_path / "reader")
    before = {e.measurement.key.id: e.measurement for e in ledger.entries() if e.measurement.ok}
    assert before

    again = subprocess.run(main("scratch-2"), cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    after = {e.measurement.key.id: e for e in ledger.entries()}
    assert {k: after[k].measurement for k in before} == before  # not measured again
    ctx = steps.open_sweep([*common, f"tracking.workdir={url}",
                            f"tracking.scratch={tmp_path / 'reader'}"], tracking=False)
    expected = sorted(w.key(ec).id for ec in ctx.plan.engine_configs for w in ctx.windows)
    assert sorted(after) == expected and all(e.measurement.ok and e.logged
                                             for e in after.values())
    assert not (tmp_path / "work").exists() and not (tmp_path / ".specflow").exists()

    client = MlflowClient(uri)
    (exp,) = [x for x in client.search_experiments() if x.name.startswith("specflow/")]
    assert exp.artifact_location == f"{url}/mlartifacts"
    children = [r for r in client.search_runs([exp.experiment_id], max_results=1000)
                if r.data.tags.get("specflow.kind") == "window"]
    assert sorted(r.data.tags["specflow.window_id"] for r in children) == expected
    store = Store(url)
    for r in children:
        key = r.info.artifact_uri.removeprefix(url + "/")
        assert r.info.artifact_uri.startswith(f"{url}/mlartifacts/")
        assert "measurement.json" in store.names(key)

    # the same windows on a local path: the same decision, nothing missing
    local = tmp_path / "local"
    store.fs.get(f"{store.root}/sweeps/{sid}", str(local / "sweeps" / sid), recursive=True)
    here = steps.open_sweep([*common, f"tracking.workdir={local}",
                             f"promote.output_dir={tmp_path / 'promoted-local'}"],
                            tracking=False)
    assert here.sid == sid and steps.missing(here) == []
    shown = io.StringIO()
    print_outcome(steps.outcome_summary(here, steps.decide(here)),
                  Console(file=shown, width=80, highlight=False), 0.0)
    assert live.decision_lines(shown.getvalue()) == live.decision_lines(again.stdout)
    assert store.read_bytes(f"sweeps/{sid}/report/report.md")  # the report beside the records

    # compare and profile read the sweep from the bucket
    for cmd in (["compare", sid, f"{url}/sweeps/{sid}"], ["profile", sid]):
        got = subprocess.run([sys.executable, "-m", "specflow", *cmd, f"tracking.workdir={url}",
                              f"tracking.uri={uri}"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300, check=False)
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stdout + got.stderr
        assert sid in got.stdout or "ngram" in got.stdout, got.stdout
