"""Traffic classes behave differently on the real engine: one ngram engine, two classes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specflow import workloads
from specflow.config.compose import load_plan
from specflow.engine.runner import plan_windows, run_engine


@pytest.mark.engine
def test_ngram_acceptance_differs_between_traffic_classes(tmp_path: Path, tiny_models: Path
                                                         ) -> None:
    models = tiny_models  # built once per session
    loaded, plan = load_plan([
        "experiment=cpu_tiny", f"paths.models={models}", "drafter=[ngram]",
        "sweep.include_baseline=false", "+sweep.num_speculative_tokens.ngram=[3]",
        "workload=[chat,structured_json]", "workload.chat.num_prompts=8",
        "workload.structured_json.num_prompts=8", "workload.chat.max_tokens=48",
        "workload.structured_json.max_tokens=48", "target.max_model_len=1024",
        "sweep.concurrency=[4]", "sweep.repeats=1",
    ])
    spec = loaded.spec
    (ec,) = plan.engine_configs
    data = workloads.materialize_all(spec.workload, tmp_path / "datasets",
                                     tokenizer=str(models / "target"))
    assert {m.traffic_class for m in data.values()} == {"chat", "structured"}
    windows = plan_windows(spec.workload, {n: m.path for n, m in data.items()},
                           spec.sweep.concurrency, 1, 1)
    results = {m.key.workload: m for m in run_engine(ec, spec.backend, windows, tmp_path / "run",
                                                     tokenizer=str(models / "target"))}
    assert all(m.ok for m in results.values()), {k: m.failure_detail for k, m in results.items()}
    chat, structured = results["chat"], results["structured_json"]
    print(f"ngram acceptance: chat {chat.acceptance_rate:.3f} ({chat.draft_tokens} drafted), "
          f"structured_json {structured.acceptance_rate:.3f} ({structured.draft_tokens} drafted)")
    assert chat.draft_tokens and structured.draft_tokens
    # the same engine, the same N: what is generated decides how much prompt lookup pays
    assert chat.acceptance_rate != structured.acceptance_rate
    assert chat.draft_tokens != structured.draft_tokens


NO_TORCH = """
import sys
from pathlib import Path
from specflow import workloads
from specflow.config.compose import load_plan
loaded, _ = load_plan(["experiment=cpu_tiny", "paths.models=" + sys.argv[1]])
data = workloads.materialize_all(loaded.spec.workload, Path(sys.argv[2]),
                                 tokenizer=sys.argv[1] + "/target")
print(sorted(data), all(m.mean_prompt_tokens for m in data.values()), "torch" in sys.modules)
"""


def test_materialising_with_the_targets_tokenizer_imports_no_torch(tmp_path: Path,
                                                                   tiny_models: Path) -> None:
    """A main job's preparation (compose, then every workload rendered and counted with the
    target's tokenizer) never imports torch: AutoTokenizer's import would (~5 s a process)."""
    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(tiny_models), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["['chat',", "'code_completion']", "True", "False"]
