"""Every yaml of every group in conf/ composes with Hydra, validates and compiles."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import yaml

from specflow.config.compose import conf_dir, load, load_plan, options
from specflow.config.validation import GROUPS, MULTI
from specflow.workloads import realism_warnings

CONF = conf_dir()


def _raw(group: str, name: str) -> dict:
    return yaml.safe_load((CONF / group / f"{name}.yaml").read_text())


@functools.cache
def _trace() -> Path:
    """The demo request log (two classes of 24 requests), for the trace and service entries."""
    from specflow.demo import traces

    return traces.write(Path(tempfile.mkdtemp(prefix="sf-trace-")) / "trace.jsonl")


def _overrides_for(group: str, name: str) -> list[str]:
    """Overrides that select this entry in a context where it is meant to work."""
    if (group, name) in (("workload", "trace"), ("service", "shared")):
        return ["workload=[trace]", f"workload.trace.source.path={_trace()}",
                "workload.trace.num_prompts=16",
                *(["service=[shared]", "service.shared.num_prompts=32"] if group == "service"
                  else [])]
    if group == "service":
        return [f"workload=[{','.join(_raw(group, name)[name]['classes'])}]",
                f"service=[{name}]"]
    if group == "drafter":
        entry = _raw(group, name)[name]
        targets = entry.get("targets") or ["qwen3_8b"]
        return [f"drafter=[none,{name}]", f"target={targets[0]}"]
    if group == "workload":
        return [f"workload=[{name}]"]
    if group == "backend" and name == "endpoint":
        return ["backend=endpoint", "backend.served_model_name=qwen3_8b"]
    return [f"{group}={name}"]


CASES = [(g, n) for g in GROUPS for n in options(g, CONF)]


def test_every_group_has_entries() -> None:
    for group in GROUPS:
        assert options(group, CONF), f"conf/{group}/ is empty"


@pytest.mark.parametrize(("group", "name"), CASES, ids=[f"{g}/{n}" for g, n in CASES])
def test_entry_composes_validates_and_compiles(group: str, name: str) -> None:
    loaded, plan = load_plan(_overrides_for(group, name))
    spec = loaded.spec
    if (group, name) == ("workload", "trace"):  # split into its classes
        assert set(spec.workload) == {"router", "sql-agent"}
    elif group in MULTI:
        assert name in getattr(spec, group)
    elif group in ("target", "hardware"):
        assert getattr(spec, group).name == name
    elif group != "experiment":
        assert loaded.choices[group] == name
    assert plan.engine_configs and plan.engine_configs[0].method == "none"
    assert plan.num_windows == (len(plan.engine_configs) * len(plan.workloads)
                               * len(plan.concurrency) * plan.repeats)


@pytest.mark.parametrize("name", options("drafter", CONF))
def test_drafter_file_nests_under_its_own_name(name: str) -> None:
    assert list(_raw("drafter", name)) == [name]


@pytest.mark.parametrize("name", options("workload", CONF))
def test_workload_file_nests_under_its_own_name(name: str) -> None:
    assert list(_raw("workload", name)) == [name]


@pytest.mark.parametrize("name", options("experiment", CONF))
def test_experiment_is_a_global_overlay(name: str) -> None:
    first = (CONF / "experiment" / f"{name}.yaml").read_text().splitlines()[0]
    assert first.strip() == "# @package _global_"


def test_required_entries_exist() -> None:
    assert set(options("target", CONF)) >= {
        "qwen3_8b", "gemma4_26b_a4b", "gemma4_31b", "qwen3_5_27b", "qwen3_5_122b_a10b",
        "qwen3_6_35b_a3b", "llama3_1_8b", "tiny"}
    assert set(options("drafter", CONF)) >= {
        "none", "ngram", "suffix", "mtp", "gemma4_mtp", "eagle3", "dflash", "dspark",
        "draft_model"}
    assert set(options("hardware", CONF)) >= {
        "h200", "h100_80gb", "mi300x", "mi355x", "rtx_pro_6000_96gb", "cpu"}


def test_targets_state_memory_facts() -> None:
    for name in options("target", CONF):
        t = load([f"target={name}"]).spec.target
        assert t.arch.layers, name
        assert t.arch.num_params > 0 and t.arch.hidden_size > 0 and t.arch.vocab_size > 0
        assert t.max_model_len > 0 and t.tensor_parallel_size >= 1


def test_cpu_demo_is_a_small_real_sweep_with_a_known_answer() -> None:
    """The CPU demo: the agreeing MiMo-style target (its outputs repeat themselves), n-gram lookup
    (a true winner on long answers) and a random draft model (a true loser), two classes whose
    answers differ, raced within a budget sized for a 2-core machine; its workloads trip none of
    the realism warnings."""
    loaded, plan = load_plan(["experiment=cpu_demo"])
    assert plan.target == "tiny_mimo_mtp2" and plan.hardware == "cpu"
    assert {e.name for e in plan.engine_configs} == {"baseline", "ngram-n8",
                                                     "draft_model_random-n2"}
    assert len(plan.workloads) == 2 and plan.concurrency == (4,) and plan.repeats == 2
    assert loaded.spec.sweep.design == "race" and loaded.spec.sweep.budget.engine_starts == 10
    assert loaded.spec.promote.min_repeats <= plan.repeats
    classes = {loaded.spec.workload[w].traffic_class for w in plan.workloads}
    assert classes == {"code", "classify"}
    for w in plan.workloads:
        assert realism_warnings(w, loaded.spec.workload[w], plan.concurrency) == [], w
    assert not plan.warnings
    assert all("--enforce-eager" in e.serve_argv for e in plan.engine_configs)
