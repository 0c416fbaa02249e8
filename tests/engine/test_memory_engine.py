"""The headroom estimate against the capacity the real vLLM engine prints at start."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from specflow.config.compose import load_plan
from specflow.core.memory import headroom
from specflow.engine.launcher import vllm_command

KV_LINE = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reported_kv_tokens(argv: list[str], log: Path, timeout: float = 300) -> int:
    """Start the engine, wait for its KV-cache line, stop it; returns the token capacity."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = KV_LINE.search(log.read_text(errors="replace"))
            if m:
                return int(m.group(1).replace(",", ""))
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"no KV cache line from the engine (exit {proc.poll()}):\n{tail}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.engine
def test_estimated_kv_capacity_equals_vllm_log(tmp_path: Path, tiny_models: Path) -> None:
    models = tiny_models
    # max_model_len 1000 is not a multiple of the CPU block size (128): vLLM reports
    # int(num_blocks / ceil(1000 / 128) * 1000), which the estimate must reproduce
    loaded, plan = load_plan([
        "experiment=cpu_demo", f"paths.models={models}", "target.max_model_len=1000",
        "drafter=[none,draft_model,eagle3]", "+sweep.num_speculative_tokens.draft_model=[2]",
        "+sweep.num_speculative_tokens.eagle3=[2]", "backend.engine.kv_cache_memory_bytes=50000000",
    ])
    assert [e.name for e in plan.engine_configs] == ["baseline", "draft_model-n2", "eagle3-n2"]
    seen = {}
    for ec in plan.engine_configs:
        estimate = headroom(loaded.spec, ec)
        argv = [*vllm_command(), *ec.serve_argv[1:], "--host", "127.0.0.1",
                "--port", str(_free_port())]
        reported = _reported_kv_tokens(argv, tmp_path / f"{ec.name}.log")
        seen[ec.name] = (estimate.capacity.tokens, reported)
        assert abs(estimate.capacity.tokens - reported) <= estimate.capacity.block_size, seen
    print("estimated vs reported KV tokens:", seen)
    # the drafters cost capacity, and the estimate says how much
    assert seen["draft_model-n2"][1] < seen["eagle3-n2"][1] < seen["baseline"][1]
