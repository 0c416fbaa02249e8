"""Live servers and processes for the pipeline tests: free loopback ports, a `prefect server`,
readiness waits, process-group stops, the ledger's window files as they are on disk."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} not ready:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def start_server(tmp: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    """`prefect server start` on loopback, its own process group (killed as a whole)."""
    with open(tmp / "server.log", "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "prefect", "server", "start",
                                 "--host", "127.0.0.1", "--port", str(port)],
                                cwd=tmp, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


class Outage:
    """A loopback TCP proxy in front of a live server, whose link can be cut: while cut, it
    drops every connection (`mode="drop"`: the client sees the server vanish) or answers every
    request with 503 (`mode="503"`: an ingress whose backend is gone). Open connections are cut
    too. Use as a context manager; `url` is the proxy's http://127.0.0.1:<port>."""

    def __init__(self, target_port: int, mode: str = "drop") -> None:
        self.target, self.mode = target_port, mode
        self.down = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.down.set()
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def mend(self) -> None:
        self.down.clear()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            if not self.down.is_set():
                threading.Thread(target=self._link, args=(conn,), daemon=True).start()
            elif self.mode == "503":
                threading.Thread(target=self._refuse, args=(conn,), daemon=True).start()
            else:
                conn.close()

    def _refuse(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            body = b'{"exception_message": "Service Unavailable"}'
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json"
                         b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))

    def _link(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            conn.close()
            return
        with self._lock:
            self._open.update((conn, up))

        def pipe(a: socket.socket, b: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := a.recv(65536):
                    b.sendall(data)
            for x in (a, b):
                with contextlib.suppress(OSError):
                    x.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pipe, args=(up, conn), daemon=True)
        back.start()
        pipe(conn, up)
        back.join()
        with self._lock:
            self._open.difference_update((conn, up))
        conn.close()
        up.close()

    def __enter__(self) -> Outage:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        self.cut()


def windows(work: Path | str) -> dict[str, dict]:
    """Each window's measurement as its ledger file holds it (by file name); `work` a path or
    an object store's URL."""
    if isinstance(work, str):
        from specflow.records.store import Store
        from specflow.results.ledger import sweep_ids

        store, found = Store(work), {}
        for sid in sweep_ids(work):
            for name in store.names(f"sweeps/{sid}/windows", ".json"):
                try:
                    found[name] = json.loads(store.read_bytes(f"sweeps/{sid}/windows/{name}"))[
                        "measurement"]
                except (OSError, ValueError, KeyError):
                    continue
        return found
    dirs = list((work / "sweeps").glob("*/windows")) if (work / "sweeps").is_dir() else []
    out = {}
    for d in dirs:
        for path in d.glob("*.json"):
            try:
                out[path.name] = json.loads(path.read_text())["measurement"]
            except (OSError, ValueError, KeyError):
                continue  # being replaced (atomic rename): read it next time
    return out


def wait_for(what: str, check, timeout: float, *logs: Path,  # noqa: ANN001
             every_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                              for p in logs if p.is_file())
            pytest.fail(f"{what}: not within {timeout:.0f} s\n{tails}")
        time.sleep(every_s)


def prefect(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


class MlflowServer:
    """A real `mlflow server` on loopback (sqlite store in a temp dir) that can be killed and
    started again on the same port and store."""

    def __init__(self, tmp: Path, env: dict[str, str], store: str | None = None,
                 artifacts: str | None = None) -> None:
        self.tmp, self.env, self.port, self.proc = tmp, env, port(), None
        self.uri = f"http://127.0.0.1:{self.port}"
        self.store = store or f"sqlite:///{tmp / 'mlflow-server.db'}"
        self.artifacts = artifacts
        """An `--artifacts-destination` (e.g. an s3:// URL) the server proxies artifacts to."""

    def start(self) -> None:
        log = open(self.tmp / "mlflow-server.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--workers", "1",
             "--backend-store-uri", self.store,
             *(["--artifacts-destination", self.artifacts] if self.artifacts else
               ["--default-artifact-root", (self.tmp / "server-artifacts").as_uri()])],
            cwd=self.tmp, env=self.env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.tmp / "mlflow-server.log").read_text()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        pytest.fail("mlflow server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


class S3Server:
    """moto's standalone S3-compatible server on loopback (`python -m moto.server`), started and
    stopped by the test. `auth=True`: it checks credentials as AWS does (moto's IAM; the first
    calls, unauthenticated, make a user and its key, given in `env`)."""

    def __init__(self, tmp: Path, *, auth: bool = False) -> None:
        self.tmp, self.auth, self.port, self.proc = tmp, auth, port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_ENDPOINT_URL_S3": self.url, "AWS_DEFAULT_REGION": "us-east-1",
                    "MLFLOW_S3_ENDPOINT_URL": self.url}

    def start(self) -> S3Server:
        log = open(self.tmp / f"s3-{self.port}.log", "ab")  # noqa: SIM115 - closed with the process
        env = dict(os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "3"} if self.auth else {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=self.tmp, env=env, stdout=log, stderr=log, start_new_session=True)
        wait_http(f"{self.url}/moto-api/", self.proc, self.tmp / f"s3-{self.port}.log", 120)
        if self.auth:
            import boto3

            iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1",
                               aws_access_key_id="x", aws_secret_access_key="x")
            iam.create_user(UserName="specflow")
            iam.put_user_policy(UserName="specflow", PolicyName="s3", PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [
                    {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
            key = iam.create_access_key(UserName="specflow")["AccessKey"]
            self.env.update(AWS_ACCESS_KEY_ID=key["AccessKeyId"],
                            AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
        return self

    def bucket(self, name: str) -> str:
        """Create a bucket; its URL."""
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                     aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"]
                     ).create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc)


def decision_lines(out: str) -> list[str]:
    """The decision lines the main job prints (narrow console: two lines per band)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "decision per traffic class" in line)
    end = next(i for i, line in enumerate(lines) if " windows ok in " in line)
    return [line.strip() for line in lines[start:end]]
