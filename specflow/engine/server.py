"""Engine lifecycle: start `vllm serve` for one EngineConfig, wait until it is ready, stop it.

The engine runs in its own process group with its output in one log file per engine config.
Every way a start can go wrong is told apart and reported with the log tail: the process died
before it was ready (`start_failed`), ran out of memory (`oom`), never became ready (`hang`),
or could not bind its port (`busy_port`, retried once on another free port). Stopping signals
the whole group (SIGTERM, then SIGKILL) and checks by PID that nothing of it is left.

An `Endpoint` is a server specflow did not start: same interface, no lifecycle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import psutil
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_incrementing

from specflow.engine import forkserver
from specflow.engine.forkserver import (
    ForkedProcess,
    ForkServerError,
    die_with_parent,
    forkable,
    process_alive,
)
from specflow.engine.launcher import vllm_command
from specflow.records import models
from specflow.records.store import StoreError, shown
from specflow.spec.compile import EngineConfig, secret_option
from specflow.spec.hfcache import local_model
from specflow.spec.locations import is_url
from specflow.spec.schema import EndpointBackend, LocalBackend

FailureKind = Literal["start_failed", "oom", "hang", "busy_port", "crashed", "killed",
                      "unreachable"]
"""Why an engine is not (or no longer) serving."""

LOG_TAIL_LINES = 40
"""Lines of the server log kept in a failure's detail."""
HEALTH_POLL_S = 0.5
"""Interval between readiness checks."""
DEFAULT_ENV = {"HF_HUB_OFFLINE": "1"}
"""Engine environment defaults (lowest precedence): never reach the hub unless asked to."""
_OOM_MARKERS = re.compile(
    r"out of memory|OutOfMemoryError|Cannot allocate memory|std::bad_alloc|\bOOM\b")
_BUSY_MARKER = re.compile(r"address already in use", re.IGNORECASE)


@dataclass(frozen=True)
class EngineFailure:
    """An engine that is not serving: the kind, one line of explanation and the log tail."""

    kind: FailureKind
    message: str
    log_tail: str = ""

    @property
    def detail(self) -> str:
        """Message plus log tail, as recorded in a Measurement's failure_detail."""
        return f"{self.message}\n--- log tail ---\n{self.log_tail}" if self.log_tail \
            else self.message


class EngineStartError(RuntimeError):
    """The engine could not be started; carries the classified failure."""

    def __init__(self, failure: EngineFailure):
        self.failure = failure
        super().__init__(f"{failure.kind}: {failure.message}")

    def __reduce__(self) -> tuple[type[EngineStartError], tuple[EngineFailure]]:
        return type(self), (self.failure,)  # (a task's exception crosses processes pickled)


# --------------------------------------------------------------------------------------------
# Pure helpers


def classify_exit(returncode: int | None, log_tail: str, oom_kills: int = 0, *,
                  starting: bool) -> tuple[FailureKind, str]:
    """Kind and message for an engine whose leader process exited with `returncode`.

    `oom_kills` is how many processes the kernel OOM killer killed in this cgroup meanwhile.
    """
    if starting and _BUSY_MARKER.search(log_tail):
        return "busy_port", "the port was already in use"
    if _OOM_MARKERS.search(log_tail):
        return "oom", f"out of memory (exit code {returncode}; the log reports it)"
    if oom_kills > 0:
        return "oom", (f"killed by the kernel OOM killer (exit code {returncode}; "
                       f"{oom_kills} OOM kill(s) in this cgroup meanwhile)")
    if returncode == -signal.SIGKILL:
        return "killed", ("killed by SIGKILL from outside specflow (the cgroup shows no OOM "
                          "kill; if none is readable, check dmesg for the OOM killer)")
    if returncode is not None and returncode < 0:
        return "crashed", f"killed by signal {signal.Signals(-returncode).name}"
    if starting:
        return "start_failed", f"exited with code {returncode} before it was ready"
    return "crashed", f"exited with code {returncode} while serving"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with the values of secret options (the ones compile refuses in extra_args, spelt
    in full or abbreviated) replaced, for logs and records."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide and not a.startswith("-"):
            out.append("***")
            hide = False
            continue
        hide = secret_option(a) is not None
        if hide and "=" in a:
            out.append(a.split("=", 1)[0] + "=***")
            hide = False
        else:
            out.append(a)
    return out


def argv_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in an argv (`--flag v` or `--flag=v`), last one wins."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def served_model_name(ec: EngineConfig) -> str:
    """The model name the engine answers to (`--served-model-name`, else the model)."""
    return argv_value(ec.serve_argv, "--served-model-name") or ec.serve_argv[2]


def tokenizer_of(ec: EngineConfig) -> str:
    """The tokenizer the engine uses (`--tokenizer`, else the model path or id)."""
    return argv_value(ec.serve_argv, "--tokenizer") or ec.serve_argv[2]


def _model_words(argv: Sequence[str]) -> list[tuple[int, str | None]]:
    """Where an argv names a model: (index, None) for a word that is a location, (index, key)
    for a JSON word (`--speculative-config`) whose `key` is one."""
    out: list[tuple[int, str | None]] = [(2, None)] if len(argv) > 2 else []
    for i, word in enumerate(argv[:-1]):
        if word == "--tokenizer":
            out.append((i + 1, None))
        elif word == "--speculative-config":
            out.append((i + 1, "model"))
    return out


def model_locations(argv: Sequence[str]) -> list[str]:
    """The model locations a serve argv names (target, tokenizer, draft checkpoint)."""
    found = []
    for i, key in _model_words(argv):
        value = argv[i] if key is None else json.loads(argv[i]).get(key)
        if isinstance(value, str):
            found.append(value)
    return found


def on_this_node(argv: Sequence[str]) -> list[str]:
    """A serve argv with each model location as this node reaches it (`local_model`: a URL as
    its node-local copy, `~` expanded); the compiled argv, the engine's identity, keeps them as
    written, the same on every node."""
    out = list(argv)
    for i, key in _model_words(out):
        if key is None:
            out[i] = local_model(out[i])
            continue
        cfg = json.loads(out[i])
        if isinstance(cfg.get(key), str) and local_model(cfg[key]) != cfg[key]:
            out[i] = json.dumps({**cfg, key: local_model(cfg[key])}, sort_keys=True,
                                separators=(",", ":"))
    return out


def free_port(host: str, exclude: Sequence[int] = ()) -> int:
    """A port the OS considers free on `host` now (another process may still take it)."""
    for _ in range(16):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise OSError(f"no free port on {host} outside {list(exclude)}")


_KV_LINE = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU)(?: \+ host)? KV cache size: ([\d,]+) tokens")
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")


@dataclass(frozen=True)
class ReportedKv:
    """The KV cache an engine start reported in its log (what the memory model estimates)."""

    tokens: int
    """vLLM's "KV cache size: N tokens"."""
    available_gib: float | None
    """vLLM's "Available KV cache memory: X GiB" (GPU workers), else None."""


def reported_kv(log: Path) -> ReportedKv | None:
    """The first KV capacity a server log reports, or None where it reports none (yet)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    found = _KV_LINE.search(text)
    if found is None:
        return None
    memory = _KV_MEMORY.search(text)
    return ReportedKv(int(found.group(1).replace(",", "")),
                      float(memory.group(1)) if memory else None)


def tail(path: Path, start: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file from byte offset `start` on."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(start, size - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# Processes (psutil: a process is its PID and start time, so a reused PID is another process)


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes of process group `pgid` (psutil has no process-group query)."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == pgid and process_alive(proc):
                members.append(proc)
    return members


def kill_group(pgid: int, sig: int) -> None:
    """Signal a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def oom_kill_count() -> int | None:
    """The kernel OOM killer's kill counter of this cgroup (v2 or v1), None when unreadable."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0
             ) -> tuple[int, str]:
    """(status, body) of a GET (the body only for a 2xx); status 0 when the server cannot be
    reached."""
    try:
        resp = httpx.get(url, headers=dict(headers or {}), timeout=timeout,
                         follow_redirects=True)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError):
        return 0, ""
    return resp.status_code, resp.text if resp.is_success else ""


# --------------------------------------------------------------------------------------------
# Servers


class Server:
    """What the load generator needs from a running server."""

    base_url: str
    """`http://host:port`, without `/v1`."""
    model_name: str
    """Model name requests are sent with."""
    tokenizer: str
    """Tokenizer the load generator counts tokens with."""
    api_key: str | None
    """Bearer token the server requires (never written anywhere)."""
    log_path: Path | None = None
    """Server log, when specflow has it."""

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def failure(self) -> EngineFailure | None:
        """Why the server is not serving now, or None when it is."""
        raise NotImplementedError


class Endpoint(Server):
    """A server specflow did not start: measured as is, never started or stopped."""

    def __init__(self, backend: EndpointBackend, tokenizer: str):
        self.base_url = backend.url.rstrip("/").removesuffix("/v1")
        self.model_name = backend.served_model_name
        self.tokenizer = tokenizer
        self.api_key = os.environ.get(backend.api_key_env) if backend.api_key_env else None
        self.log_path = None

    def failure(self) -> EngineFailure | None:
        status, _ = http_get(f"{self.base_url}/health", self.auth_headers)
        if status == 200:
            return None
        return EngineFailure("unreachable", f"GET {self.base_url}/health answered "
                             f"{status or 'nothing'}")


def engine_env(ec: EngineConfig, backend: LocalBackend) -> dict[str, str]:
    """The environment `vllm serve` runs in for `ec`: specflow's defaults, this process's, the
    backend's, what the executor needs and the API key the backend names."""
    env = {**DEFAULT_ENV, **os.environ, **backend.env}
    if argv_value(ec.serve_argv, "--distributed-executor-backend") == "uni":
        # vLLM's CPU platform turns `uni` back into `mp` unless this is 0; `vllm serve`
        # keeps its engine core in a process of its own either way.
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if backend.api_key_env and os.environ.get(backend.api_key_env):
        env["VLLM_API_KEY"] = os.environ[backend.api_key_env]  # vllm serve reads it
    return env


class LocalEngine(Server):
    """`vllm serve` for one EngineConfig in its own process group; a context manager.

    `start()` raises EngineStartError with the classified failure; `stop()` returns the PIDs
    that survived (none, unless the kernel refuses to kill them).
    """

    def __init__(self, ec: EngineConfig, backend: LocalBackend, log_dir: Path,
                 stop_timeout_s: float = 30.0):
        self.ec = ec
        self.backend = backend
        self.stop_timeout_s = stop_timeout_s
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{ec.name}-{ec.hash}.log"
        self.env = engine_env(ec, backend)
        self.api_key = argv_value(ec.serve_argv, "--api-key") or self.env.get("VLLM_API_KEY") \
            or None
        self.model_name = served_model_name(ec)
        self.tokenizer = local_model(tokenizer_of(ec))
        self.host = backend.host
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.attempts: list[dict[str, object]] = []
        self.start_s: float | None = None
        """Seconds from launch to ready."""
        self._seen: dict[int, psutil.Process] = {}
        self._log_offset = 0
        self._oom_before: int | None = None
        self._stopped = False

    # -- identity

    @property
    def base_url(self) -> str:  # type: ignore[override]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the `vllm serve` process (also the process group id)."""
        return self.proc.pid if self.proc else None

    def argv(self, port: int) -> list[str]:
        """The full command: the vLLM command prefix, `serve ...` and host/port."""
        prefix = vllm_command(self.backend.vllm_command)
        if self.ec.serve_argv[:1] != ("vllm",):
            raise ValueError(f"serve_argv must start with 'vllm': {self.ec.serve_argv[:2]}")
        # Per-request acceptance in each response (read by the bench driver); launch-only, so
        # not part of the engine's identity (its hash is the compiled serve argv).
        per_request = (["--per-request-spec-decode-metrics", "summary"]
                       if self.ec.speculative_config is not None else [])
        return [*prefix, *on_this_node(self.ec.serve_argv)[1:], *per_request, "--host",
                self.host, "--port", str(port)]

    @property
    def running(self) -> bool:
        """True between a launch and the stop that follows it."""
        return self.proc is not None and not self._stopped

    def processes(self) -> list[int]:
        """PIDs of every process of this engine seen so far, refreshed now: its process group
        and the leader's descendants (one that left the group too)."""
        if self.proc is not None and not self._stopped:
            found = group_members(self.proc.pid)
            leader = self._seen.get(self.proc.pid)
            if leader is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    found += leader.children(recursive=True)
            for proc in found:
                self._seen.setdefault(proc.pid, proc)
        return sorted(self._seen)

    # -- lifecycle

    def start(self) -> None:
        """Launch and wait for /health; retry once on another port if the port was busy."""
        if self.backend.api_key_env and not os.environ.get(self.backend.api_key_env):
            raise EngineStartError(EngineFailure(
                "start_failed", f"backend.api_key_env names ${self.backend.api_key_env}, which "
                "is not set; the engine is not started without its key"))
        self._copy_models()
        port = self.backend.port or free_port(self.host)
        t0 = time.monotonic()
        for attempt in (1, 2):
            self._launch(port)
            failure = self._wait_ready()
            self.attempts.append({"port": port, "outcome": failure.kind if failure else "ready"})
            if failure is None:
                self.start_s = time.monotonic() - t0
                self._mark(f"ready on {self.base_url} after {self.start_s:.1f} s")
                return
            self._kill()
            if failure.kind == "busy_port" and attempt == 1:
                port = free_port(self.host, exclude=[port])
                self._mark(f"port {self.port} was busy; retrying once on port {port}")
                continue
            raise EngineStartError(failure)

    def _copy_models(self) -> None:
        """Copy the models kept at a URL to this node's disk (`records.models`), before the
        start timeout begins; one that cannot be copied fails the start, saying which."""
        for location in model_locations(self.ec.serve_argv):
            if not is_url(location):
                continue
            self._mark(f"copying {shown(location)} to this node")
            try:
                where = models.fetch(location)
            except (StoreError, OSError) as exc:
                raise EngineStartError(EngineFailure(
                    "start_failed", f"engine '{self.ec.name}': its model {shown(location)} could "
                    f"not be copied to this node ({exc})")) from None
            self._mark(f"{shown(location)} is at {where}")
        self.tokenizer = local_model(tokenizer_of(self.ec))

    def failure(self) -> EngineFailure | None:
        """Why the engine is not serving now (process gone or unhealthy), or None."""
        if self.proc is None:
            return EngineFailure("start_failed", "the engine was never started")
        proc = self.proc

        def health() -> int:
            return -1 if proc.poll() is not None else http_get(f"{self.base_url}/health",
                                                                timeout=10.0)[0]

        # a busy server may miss one poll (waits of 1 s, then 2 s); a dead one misses all
        status = Retrying(retry=retry_if_result(lambda code: code not in (200, -1)),
                          stop=stop_after_attempt(3), wait=wait_incrementing(1.0, 1.0),
                          retry_error_callback=lambda state: state.outcome.result()
                          if state.outcome else 0)(health)
        if status == 200:
            return None
        rc = self.proc.poll()
        if rc is not None:
            return self._exited(rc, starting=False)
        return EngineFailure("crashed", f"engine '{self.ec.name}' runs but /health answered "
                             f"{status or 'nothing'} three times", tail(self.log_path,
                                                                        self._log_offset))

    def stop(self) -> list[int]:
        """SIGTERM the group, wait, SIGKILL what is left; returns PIDs still alive after it."""
        if self.proc is None or self._stopped:
            return self.survivors()
        self._kill()
        return self.survivors()

    def survivors(self) -> list[int]:
        """PIDs of this engine (seen at any time) that are still alive."""
        return sorted(p.pid for p in self._alive())

    def __enter__(self) -> LocalEngine:
        self.start()
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.stop()

    # -- internals

    def _mark(self, text: str) -> None:
        """A line of specflow's own in the engine log; a disk that refuses it (full) loses the
        line, never the engine's start or stop."""
        with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as f:
            f.write(f"=== specflow {time.strftime('%H:%M:%S')}: {text}\n")

    def _launch(self, port: int) -> None:
        self.port = port
        argv = self.argv(port)
        self._mark("starting: " + json.dumps(redact_argv(argv)))
        self._log_offset = self.log_path.stat().st_size
        self._oom_before = oom_kill_count()
        self._stopped = False
        self._seen = {}
        self.proc = None
        servers = forkserver.shared()
        if servers is not None and forkable(argv):
            try:
                self.proc = servers.spawn(argv, self.env, self.log_path,
                                          self.backend.startup_timeout_s)
                self._mark(f"forked from the fork server as pid {self.proc.pid}")
            except ForkServerError as exc:  # started the usual way instead, saying so
                self._mark(f"fork server: {exc}; starting a process of its own")
        if self.proc is None:
            self._popen(argv)
        assert self.proc is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            self._seen[self.proc.pid] = psutil.Process(self.proc.pid)

    def _popen(self, argv: list[str]) -> None:
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, env=self.env,
                                             start_new_session=True,
                                             preexec_fn=die_with_parent)
        except OSError as exc:  # e.g. backend.vllm_command names nothing runnable
            self._mark(f"cannot run {argv[0]}: {exc}")
            raise EngineStartError(EngineFailure(
                "start_failed", f"cannot run {argv[0]} (backend.vllm_command): {exc}")) from None

    def _exited(self, rc: int, starting: bool) -> EngineFailure:
        log_tail = tail(self.log_path, self._log_offset)
        now = oom_kill_count()
        kills = now - self._oom_before if now is not None and self._oom_before is not None else 0
        kind, msg = classify_exit(rc, log_tail, kills, starting=starting)
        return EngineFailure(kind, f"engine '{self.ec.name}' {msg}", log_tail)

    def _wait_ready(self) -> EngineFailure | None:
        assert self.proc is not None
        timeout = self.backend.startup_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            self.processes()
            rc = self.proc.poll()
            if rc is not None:
                return self._exited(rc, starting=True)
            if http_get(f"{self.base_url}/health", timeout=2.0)[0] == 200 and self._serves_model():
                return None
            if time.monotonic() >= deadline:
                return EngineFailure(
                    "hang", f"engine '{self.ec.name}' was not ready within {timeout:g} s "
                    f"(backend.startup_timeout_s)", tail(self.log_path, self._log_offset))
            time.sleep(HEALTH_POLL_S)

    def _serves_model(self) -> bool:
        """True when the server on our port is ours (not another process that took the port)."""
        status, body = http_get(f"{self.base_url}/v1/models", self.auth_headers)
        if status != 200:
            return False
        try:
            return any(m.get("id") == self.model_name for m in json.loads(body)["data"])
        except (ValueError, KeyError, TypeError):
            return False

    def _kill(self) -> None:
        """Stop the whole group: SIGTERM, wait up to stop_timeout_s, SIGKILL, wait, reap."""
        assert self.proc is not None
        pgid = self.proc.pid
        self.processes()
        kill_group(pgid, signal.SIGTERM)
        if not self._wait_gone(self.stop_timeout_s):
            self._mark("processes left after SIGTERM; sending SIGKILL")
            kill_group(pgid, signal.SIGKILL)
            for proc in self._alive():  # members that left the group
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()  # psutil refuses a PID that another process now has
            self._wait_gone(10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._stopped = True

    def _alive(self) -> list[psutil.Process]:
        """Processes of this engine (seen at any time, or in its group now) still alive."""
        alive = [p for p in self._seen.values() if process_alive(p)]
        if self.proc is not None:
            alive += [p for p in group_members(self.proc.pid) if p not in alive]
        return alive

    def _wait_gone(self, timeout: float) -> bool:
        """Wait until no process of this engine is alive (True) or `timeout` passes (False).

        Popen waits for the leader (psutil would reap it and lose its exit code for Popen);
        psutil waits for the rest, in short waits: a zombie whose parent never reaps it has
        ended, yet psutil.wait_procs would wait for it to the end of the timeout."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while (alive := self._alive()) and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.1)
            psutil.wait_procs([p for p in alive if p.pid != self.proc.pid], timeout=0.1)
        return not alive
