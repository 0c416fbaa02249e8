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

import json
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


def test_champions_on_a_bucket_swap_one_pointer_and_a_racing_promotion_decides_again(
        s3: live.S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Champions and their history in the bucket: `champion.json` is replaced by one
    conditional PUT (If-Match its ETag) and each version is a key written once. A promotion
    whose swap loses to another one (the champion changed after it read it) does not overwrite
    it: it reads the new champion and decides again against it, so the record names the
    champion it really replaced and nothing is lost from history. Restore, `compare
    champion:CLASS` and the MLflow registration work from the bucket."""
    import subprocess
    import sys

    from specflow.champions import promote
    from specflow.results.tracking import Tracker
    from tests.champions.test_promote import _promote

    out = s3.bucket("champions") + "/team/promoted"
    store = Store(out).sub("math")

    # the pointer swap itself: a stale tag is refused and changes nothing
    first = _promote("first", out)
    assert first.status == "promoted" and first.path == f"{out}/math/champion.json"
    body, tag = store.read_tagged("champion.json")
    assert store.replace_if("champion.json", body, tag) is True
    _, now = store.read_tagged("champion.json")
    assert store.replace_if("champion.json", b"{}", "\"0000\"") is False
    assert store.read_tagged("champion.json") == (body, now)

    # a competing promotion swaps first: the outer one decides again against it
    competitor: list[promote.Promotion] = []
    swap, raced = Store.replace_if, []

    def racing(self: Store, key: str, data: str | bytes, tag: str | None) -> bool:
        if key == "champion.json" and not raced:
            raced.append(key)
            competitor.append(_promote("slower", out))  # lands between the read and the swap
        return swap(self, key, data, tag)

    monkeypatch.setattr(Store, "replace_if", racing)
    second = _promote("second", out)
    monkeypatch.undo()
    (slower,) = competitor
    assert slower.status == "promoted" and slower.previous == first.version
    assert second.status == "promoted" and second.previous == slower.version  # not first
    assert promote.champion(out, "math").version == second.version
    assert promote.history(out, "math") == sorted([first.version, slower.version,
                                                   second.version])
    assert promote.promoted(out) == ["math"]

    # restore walks back through the bucket's history, from the command line too
    env = dict(os.environ, COLUMNS="200")
    got = subprocess.run([sys.executable, "-m", "specflow", "restore", "math",
                          f"promote.output_dir={out}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"restored math champion {slower.version} (was {second.version})" in got.stdout
    assert promote.champion(out, "math").version == slower.version

    # the registry mirrors a champion kept in the bucket (its record, from a local copy)
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "specflow/tiny/cpu",
                      artifact_root=tmp_path / "artifacts")
    parent = tracker.client.create_run(tracker.experiment_id()).info.run_id
    tracker.register_champion(parent, second, "tiny", "cpu")
    logged = tracker.client.download_artifacts(parent, "promoted/math/champion.json",
                                               str(tmp_path / "dl"))
    assert json.loads(Path(logged).read_text())["version"] == second.version

    # a champion in the bucket names its sweep; `compare champion:math` looks for it there
    with pytest.raises(comparing.SpecError) as err:
        comparing.resolve("champion:math", "compare A", workdir=tmp_path / "work",
                          tracking_uri="sqlite:///x.db", output_dir=out)
    assert "does not name the sweep" in err.value.problems[0].problem
    with pytest.raises(comparing.SpecError) as err:
        comparing.resolve("champion:math@nope", "compare A", workdir=tmp_path / "work",
                          tracking_uri="sqlite:///x.db", output_dir=out)
    assert second.version in str(err.value.problems[0].expected)


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
        s3: live.S3Server, tmp_path: Path, prefect_api: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job with `tracking.workdir` on the bucket, its MLflow artifacts and champions
    there too, its models in the bucket (`build-models` uploads them) and each run with its own
    scratch directory and node cache (as another machine): SIGKILLed after its first window;
    run again with its link to the store cut after one more window: past
    `tracking.store_grace_s` it ends with one line naming `tracking.workdir`, exit 1, no
    traceback; run again: each run copied the models to its own disk, the windows measured
    before are kept as they were, the rest measured, one MLflow child run per window, its
    artifacts in the bucket. The decision equals the one the decision step makes from the same
    windows copied to a local path, and its record is in the bucket; `compare` and `profile`
    read the sweep from the bucket."""
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
    env = dict(_env(tmp_path, prefect_api), COLUMNS="80")
    models = f"{url}/models"
    built = subprocess.run([sys.executable, "-m", "specflow", "build-models",
                            f"paths.models={models}"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    assert json.loads(built.stdout)["mimo_mtp1"] == f"{models}/mimo_mtp1"
    common = [*SMALL, "drafter=[none,ngram]", "sweep.closing_baseline_repeats=0",
              f"paths.models={models}", f"tracking.uri={uri}"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-reader"))

    def main(node: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "specflow", *common, f"tracking.workdir={url}",
                f"tracking.scratch={tmp_path / node / 'scratch'}", *extra]

    def node_env(node: str) -> dict[str, str]:
        return dict(env, XDG_CACHE_HOME=str(tmp_path / node / "cache"))

    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(main("node-1"), cwd=tmp_path, env=node_env("node-1"),
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
    live.wait_for("no engine left", lambda: not processes_using(tmp_path / "node-1"), 60)
    (sid,) = sweep_ids(url)
    ledger = Ledger(url, sid, scratch=tmp_path / "reader")
    before = {e.measurement.key.id: e.measurement for e in ledger.entries() if e.measurement.ok}
    assert before

    # the store unreachable mid-sweep past its grace: the run ends with one line, exit 1
    with live.Outage(s3.port, "503") as link:
        cut_env = dict(node_env("node-cut"), AWS_ENDPOINT_URL_S3=link.url,
                       MLFLOW_S3_ENDPOINT_URL=link.url)
        with open(tmp_path / "cut.log", "wb") as out, open(tmp_path / "cut.err", "wb") as err:
            cut = subprocess.Popen(main("node-cut", "tracking.store_grace_s=5"), cwd=tmp_path,
                                   env=cut_env, stdout=out, stderr=err, start_new_session=True)
        try:
            def another_window() -> bool:
                assert cut.poll() is None, (tmp_path / "cut.err").read_text()[-3000:]
                return len([e for e in ledger.entries() if e.measurement.ok]) > len(before)

            live.wait_for("another window in the bucket", another_window, 600,
                          tmp_path / "cut.err", every_s=0.2)
            link.cut()
            cut.wait(timeout=300)
        finally:
            if cut.poll() is None:
                os.killpg(cut.pid, signal.SIGKILL)
    said = (tmp_path / "cut.err").read_text()
    assert cut.returncode == 1, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    last = " ".join(said[said.rindex("error: "):].split())
    assert last.startswith(f"error: tracking.workdir: {url} could not be reached for 5 s"), last
    kept = {e.measurement.key.id: e.measurement for e in ledger.entries() if e.measurement.ok}
    assert {k: kept[k] for k in before} == before and len(kept) > len(before)
    before = kept
    live.wait_for("no engine left", lambda: not processes_using(tmp_path / "node-cut"), 60)

    again = subprocess.run(main("node-2"), cwd=tmp_path, env=node_env("node-2"),
                           capture_output=True, text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for node in ("node-1", "node-2"):  # each node ran its engines from its own copy
        copies = {p.parent.name.rsplit("-", 1)[0] for p in (tmp_path / node / "cache").glob(
            "specflow/models/*/.specflow-complete") if not p.parent.name.endswith(".meta")}
        assert "target" in copies, (node, copies)
    after = {e.measurement.key.id: e for e in ledger.entries()}
    assert {k: after[k].measurement for k in before} == before  # not measured again
    ctx = steps.open_sweep([*common, f"tracking.workdir={url}",
                            f"tracking.scratch={tmp_path / 'reader'}"], tracking=False)
    assert ctx.spec.promote.output_dir == f"{url}/promoted"
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
    # the decision's record (champion, or an undecided class's) in the bucket, not on this disk
    (cls,) = store.names("promoted")
    assert store.exists(f"promoted/{cls}/champion.json") or store.names(
        f"promoted/{cls}/unresolved") or store.names(f"promoted/{cls}/refused")
    assert not (tmp_path / "promoted").exists()

    # compare and profile read the sweep from the bucket
    for cmd in (["compare", sid, f"{url}/sweeps/{sid}"], ["profile", sid]):
        got = subprocess.run([sys.executable, "-m", "specflow", *cmd, f"tracking.workdir={url}",
                              f"tracking.uri={uri}"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300, check=False)
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stdout + got.stderr
        assert sid in got.stdout or "ngram" in got.stdout, got.stdout
