"""Every benchmark in bench/ still composes its configs and runs end to end at its smoke size
(`--smoke`): exit 0, no traceback, and its last stdout line one JSON object of figures.

What a benchmark measures is not checked here (its figures at smoke size mean nothing; measured
ones live in docs/benchmarks.md). A new `bench/*.py` is collected on its own and fails until it
has a `--smoke` flag. tests/config/test_fuzz.py checks the fuzzer's results; the GPU check's smoke
size is run (once) and checked by tests/demo/test_realshape.py, scale-out's by the scale-out
scenario (tests/pipelines/test_scale_out.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ELSEWHERE = {"gpu_check": "tests/demo/test_realshape.py",
             "scale_out": "tests/pipelines/test_scale_out.py"}
"""Benchmarks whose smoke size another module runs and checks: the GPU check through its shell
wrapper, scale-out on the work pool and servers of the scale-out scenario (no second Prefect
server, MLflow server and pair of workers)."""
BENCHES = sorted(b for b in (ROOT / "bench").glob("*.py") if b.stem not in ELSEWHERE)
MAIN_JOB = frozenset({"search_cost", "vs_vllm_sweep"})
"""The benchmarks that run the main job in their own process: pointed at this worker's Prefect
API (tests/conftest.py), as a production install is, instead of starting Prefect's temporary
server each."""

ENGINE = frozenset({"capacity", "engine_start", "runner_overhead", "search_cost",
                    "vs_vllm_sweep"})
"""The benchmarks that start the real vLLM engine."""

ARGS = {stem: ["--workdir", "{tmp}/work", "--models", "{models}"] for stem in ENGINE}
"""Where a benchmark takes a directory: the test's own, and the session's tiny models (built
once per worker; the others write nothing, or only under TMPDIR, which is the test's too; the
GPU check removes its ~4 GB of checkpoints itself)."""

COUNT = {
    "capacity": "trials",
    "decision_quality": "trials",
    "search_cost_simulated": "starts_grid",
    "fuzz_configs": "total",
    "headroom_matrix": "combinations",
    "engine_start": "spawned_start_s",
    "runner_overhead": "window_wall_s_driver",
    "search_cost": "grid_starts",
    "vs_vllm_sweep": "pairs",
}
"""A figure of each benchmark's JSON line that is positive whenever it measured anything."""


@pytest.mark.parametrize("bench", [
    pytest.param(b, id=b.stem, marks=[pytest.mark.engine] if b.stem in ENGINE else [])
    for b in BENCHES])
def test_the_benchmark_runs_end_to_end_at_its_smoke_size(bench: Path, tmp_path: Path,
                                                         request: pytest.FixtureRequest) -> None:
    """`python bench/<name>.py --smoke` in a subprocess, in the suite's hermetic environment
    with TMPDIR the test's directory: exit 0, no traceback on stderr, and the last non-empty
    stdout line a JSON object whose count figure (COUNT) is positive."""
    models = request.getfixturevalue("tiny_models") if bench.stem in ARGS else None
    args = [a.format(tmp=tmp_path, models=models) for a in ARGS.get(bench.stem, [])]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    if bench.stem in MAIN_JOB:
        env |= {"PREFECT_API_URL": request.getfixturevalue("prefect_api"),
                "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.run([sys.executable, str(bench), "--smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False, env=env)
    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, tail
    assert "Traceback" not in proc.stderr, tail
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, tail
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict) and figures, lines[-1]
    if bench.stem in COUNT:
        assert figures[COUNT[bench.stem]] > 0, lines[-1]


def test_every_benchmark_has_a_smoke_run_in_the_suite() -> None:
    """Each `bench/*.py` is run at its smoke size here or by the module ELSEWHERE names."""
    for stem, module in ELSEWHERE.items():
        assert "--smoke" in (ROOT / module).read_text(), (stem, module)
    assert {b.stem for b in BENCHES} | set(ELSEWHERE) == {
        b.stem for b in (ROOT / "bench").glob("*.py")}
