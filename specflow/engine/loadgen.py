"""Load generators: run `vllm bench serve` jobs against a server.

`BenchDriver` keeps one process of the vLLM environment alive per engine and runs every window
in it (see `bench_driver.py`); `BenchProcess` starts one `vllm bench serve` per window (the
fallback when no interpreter of the vLLM environment can be derived from the command prefix).
Both take the same argv and produce the same result files; only process reuse differs.
Inside `shared_drivers()` (a sweep's flow run) an idle driver is kept from one engine start to
the next, so its imports are paid once per sweep, not once per engine start.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, Protocol

from specflow.engine.launcher import vllm_command
from specflow.engine.server import die_with_parent, group_members, kill_group

DRIVER = Path(__file__).with_name("bench_driver.py")
"""The driver script, run by path with the vLLM environment's interpreter."""
DRIVER_READY_TIMEOUT_S = 300.0
"""Seconds the driver may take to import vLLM's benchmark."""

LoadGeneratorKind = Literal["driver", "process"]
"""`driver`: one long-lived process per engine; `process`: one `vllm bench serve` per window."""


class LoadGeneratorError(RuntimeError):
    """The load generator could not be started."""


@dataclass(frozen=True)
class JobResult:
    """How one bench job ended (its numbers are in the result file it wrote)."""

    ok: bool
    error: str = ""
    wall_s: float = 0.0
    """Seconds from submitting the job to its answer, as seen by specflow."""
    timed_out: bool = False


class LoadGenerator(Protocol):
    """Runs `vllm bench serve` argv lists, one at a time."""

    def run(self, argv: Sequence[str], log: Path, timeout_s: float,
            per_request: Path | None = None) -> JobResult:
        """Run one job; `per_request` receives the per-request speculative-decoding metrics
        where the generator can read them (the driver; not a `vllm bench serve` process)."""
        ...

    def pids(self) -> list[int]: ...

    def close(self) -> None: ...


def bench_env(extra: Mapping[str, str] | None = None, api_key: str | None = None
              ) -> dict[str, str]:
    """Environment of the load generator: ours, offline by default, the API key only if given."""
    env = {"HF_HUB_OFFLINE": "1", **os.environ, **(extra or {})}
    env.pop("OPENAI_API_KEY", None)  # never send an unrelated key to the server under test
    env.pop("VLLM_API_KEY", None)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


def driver_python(prefix: Sequence[str]) -> str | None:
    """The vLLM environment's interpreter behind a CLI prefix, or None if it cannot be told.

    `[python, -m, module]` names it; a `vllm` console script names it in its shebang.
    """
    if len(prefix) >= 3 and prefix[1] == "-m":
        return prefix[0]
    if len(prefix) != 1:
        return None
    exe = shutil.which(prefix[0])
    if exe is None:
        return None
    try:
        with open(exe, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = shlex.split(first[2:])
    if len(parts) == 1 and "python" in Path(parts[0]).name:
        return parts[0]
    if len(parts) == 2 and Path(parts[0]).name == "env" and "python" in parts[1]:
        return shutil.which(parts[1])
    return None


class BenchDriver:
    """One long-lived bench process; windows are jobs sent to it over a pipe."""

    def __init__(self, python: str, env: Mapping[str, str], log: Path):
        self.python = python
        self.env = dict(env)
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.import_s: float | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._next_id = 0
        self._ready = False
        self._launch_error = ""
        self._seen: set[int] = set()

    def launch(self) -> None:
        """Start the process (returns at once; `wait_ready` waits for its imports)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._launch_error = ""
        try:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([self.python, str(DRIVER)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, env=self.env,
                                             text=True, start_new_session=True,
                                             preexec_fn=die_with_parent)
        except OSError as exc:  # reported by wait_ready
            self._launch_error = f"cannot run {self.python}: {exc}"
            return
        self._seen.add(self.proc.pid)
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self._lines),
                         daemon=True).start()

    def idle(self) -> bool:
        """Alive, its imports done, and no job running (jobs run one at a time, to the end)."""
        return self._ready and self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = DRIVER_READY_TIMEOUT_S) -> None:
        """Block until the driver has imported vLLM; raises LoadGeneratorError if it cannot."""
        if self.idle():
            return
        if self.proc is None and not self._launch_error:
            self.launch()
        if self._launch_error:
            raise LoadGeneratorError(self._launch_error)
        msg = self._answer(timeout_s)
        if msg is None or not msg.get("ready"):
            self.close()
            raise LoadGeneratorError(f"the bench driver did not start (see {self.log})")
        self.import_s = float(msg["import_s"])
        self._ready = True

    def run(self, argv: Sequence[str], log: Path, timeout_s: float,
            per_request: Path | None = None) -> JobResult:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.launch()
            try:
                self.wait_ready()
            except LoadGeneratorError as exc:
                return JobResult(False, str(exc))
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        job = {"id": self._next_id, "argv": list(argv), "log": str(log),
               "per_request": str(per_request) if per_request else None}
        start = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return JobResult(False, f"the bench driver died (see {self.log})",
                             time.perf_counter() - start)
        msg = self._answer(timeout_s)
        wall = time.perf_counter() - start
        if msg is None:
            timed_out = self.proc.poll() is None
            self.close(graceful=False)
            return JobResult(False, f"no answer within {timeout_s:g} s" if timed_out
                             else f"the bench driver died (see {self.log})", wall, timed_out)
        return JobResult(bool(msg["ok"]), str(msg.get("error") or ""), wall)

    def pids(self) -> list[int]:
        """Processes this generator started (alive or not)."""
        return sorted(self._seen)

    def close(self, graceful: bool = True) -> None:
        """End the driver: close its stdin if it is idle, then kill its group.

        An idle driver has flushed every answer and job log (bench_driver flushes both before
        it answers), so nothing is lost by not waiting for its interpreter's shutdown with vLLM
        imported, which takes seconds per engine start."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if graceful and self._ready:  # idle between jobs: the end of its stdin is its exit
            with contextlib.suppress(OSError):
                if proc.stdin:
                    proc.stdin.close()
        self._ready = False
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def _answer(self, timeout_s: float) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue

    @staticmethod
    def _read(stream: IO[str] | None, out: queue.Queue[str | None]) -> None:
        if stream is not None:
            for line in stream:
                out.put(line)
        out.put(None)


class BenchProcess:
    """One `vllm bench serve` process per window (in its own process group)."""

    def __init__(self, prefix: Sequence[str], env: Mapping[str, str]):
        self.prefix = list(prefix)
        self.env = dict(env)
        self._seen: set[int] = set()

    def run(self, argv: Sequence[str], log: Path, timeout_s: float,
            per_request: Path | None = None) -> JobResult:
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen([*self.prefix, "bench", "serve", *argv],
                                        stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True, preexec_fn=die_with_parent)
        except OSError as exc:
            return JobResult(False, f"cannot run {self.prefix[0]}: {exc}")
        self._seen.add(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
            return JobResult(False, f"no result within {timeout_s:g} s",
                             time.perf_counter() - start, timed_out=True)
        finally:
            if group_members(proc.pid):
                kill_group(proc.pid, signal.SIGKILL)
        wall = time.perf_counter() - start
        return JobResult(rc == 0, "" if rc == 0 else f"vllm bench serve exited with {rc}", wall)

    def pids(self) -> list[int]:
        return sorted(self._seen)

    def close(self) -> None:
        """Nothing stays running between windows."""


class SharedDrivers:
    """Idle bench drivers kept between engine starts, one per interpreter and environment.

    A driver holds no state of the engine it measured: each job names its server, tokenizer
    and files in its argv. Only a driver that answered every job it was sent is kept."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, tuple[tuple[str, str], ...]], BenchDriver] = {}

    @staticmethod
    def _key(python: str, env: Mapping[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
        return python, tuple(sorted(env.items()))

    def take(self, python: str, env: Mapping[str, str], log: Path) -> BenchDriver:
        """The idle driver for this interpreter and environment, or a new one (launched)."""
        driver = self._idle.pop(self._key(python, env), None)
        if driver is not None and driver.idle():
            return driver
        if driver is not None:
            driver.close()
        driver = BenchDriver(python, env, log)
        driver.launch()
        return driver

    def give_back(self, driver: BenchDriver) -> None:
        """Keep `driver` for the next engine start if it is idle; else end it."""
        key = self._key(driver.python, driver.env)
        if not driver.idle() or key in self._idle:
            driver.close()
            return
        self._idle[key] = driver

    def close(self) -> None:
        for driver in self._idle.values():
            driver.close()
        self._idle.clear()


_SHARED: contextvars.ContextVar[SharedDrivers | None] = contextvars.ContextVar(
    "specflow_shared_drivers", default=None)


@contextlib.contextmanager
def shared_drivers() -> Iterator[SharedDrivers]:
    """Within this block, engine starts reuse an idle bench driver instead of launching one
    each; every driver kept is ended when the block ends."""
    pool = SharedDrivers()
    token = _SHARED.set(pool)
    try:
        yield pool
    finally:
        _SHARED.reset(token)
        pool.close()


def make_load_generator(kind: LoadGeneratorKind, command: Sequence[str] | None,
                        env: Mapping[str, str], log: Path) -> BenchDriver | BenchProcess:
    """A driver when asked for and an interpreter can be derived; else one process per window.

    A driver is launched here but not waited for, so its imports overlap the engine start;
    inside `shared_drivers()` an idle one is reused.
    """
    prefix = vllm_command(list(command) if command else None)
    python = driver_python(prefix) if kind == "driver" else None
    if python is None:
        return BenchProcess(prefix, env)
    pool = _SHARED.get()
    if pool is not None:
        return pool.take(python, env, log)
    driver = BenchDriver(python, env, log)
    driver.launch()
    return driver


def release(gen: BenchDriver | BenchProcess) -> None:
    """Done with `gen` for this engine start: kept for the next one inside `shared_drivers()`,
    else ended."""
    pool = _SHARED.get()
    if pool is not None and isinstance(gen, BenchDriver):
        pool.give_back(gen)
    else:
        gen.close()
