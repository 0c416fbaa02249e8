"""Helpers of the workloads tests: the conf/workload entries, specs, the rows of a dataset."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from specflow.config.compose import conf_dir, load, options
from specflow.spec.schema import WorkloadSpec
from specflow.workloads import MIN_PROMPTS

CONF = conf_dir()
ENTRIES = options("workload", CONF)
RAW = {n: yaml.safe_load((CONF / "workload" / f"{n}.yaml").read_text())[n] for n in ENTRIES}
TRACES = [n for n in ENTRIES if RAW[n]["source"]["kind"] == "trace"]
"""Entries that read the user's own request log (tests/spec/test_traces.py, test_trace_replay)."""
OFFLINE = [n for n in ENTRIES if not RAW[n].get("needs_hub", False) and n not in TRACES]
HUB = [n for n in ENTRIES if RAW[n].get("needs_hub", False)]


def spec_of(name: str, *overrides: str) -> WorkloadSpec:
    """The conf/workload entry `name`, composed with `overrides`."""
    return load([f"workload=[{name}]", *overrides]).spec.workload[name]


def prompt_rows(path: Path) -> list[dict]:
    """The rows of a materialised dataset file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def generated(generator: str, **fields: object) -> WorkloadSpec:
    """A plain-text workload of an offline generator (`fields` override)."""
    data: dict = {"traffic_class": "synthetic", "source": {"kind": "generated",
                                                            "generator": generator},
                  "chat_template": False, "num_prompts": MIN_PROMPTS}
    data.update(fields)
    return WorkloadSpec.model_validate(data)

