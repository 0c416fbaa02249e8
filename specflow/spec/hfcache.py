"""Where the Hugging Face caches are on this machine, as huggingface_hub resolves them.

One locator for every reader (model snapshots for headroom, dataset snapshots for workloads).
The hub cache is wherever huggingface_hub's own precedence puts it (`huggingface_hub.constants`:
HF_HUB_CACHE, the older HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
~/.cache/huggingface/hub). Nothing here downloads anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Literal

from huggingface_hub import constants

from specflow.spec.locations import is_url

RepoType = Literal["model", "dataset"]


def _hub_constants() -> ModuleType:
    """huggingface_hub's constants as the environment sets them now.

    The imported module read the environment once, at import; the caches are looked up later,
    after a test or a caller may have set HF_HOME & co, so its code runs again in a module of
    our own (the imported one is left as it is; its deprecation warnings were shown then)."""
    spec = constants.__spec__
    assert spec is not None and spec.loader is not None  # a module imported from a file
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings(action="ignore"):
        spec.loader.exec_module(module)
    return module


def hf_home() -> Path:
    """huggingface_hub's HF_HOME: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
    ~/.cache/huggingface."""
    return Path(_hub_constants().HF_HOME)


def hub_cache() -> Path:
    """The hub cache holding `models--*` and `datasets--*` repositories."""
    return Path(_hub_constants().HF_HUB_CACHE)


def datasets_cache() -> Path:
    """The `datasets` library's own cache ($HF_DATASETS_CACHE, else HF_HOME/datasets); written
    out here because only `datasets`, not a dependency of specflow, knows it."""
    env = os.environ.get("HF_DATASETS_CACHE")
    return Path(env).expanduser() if env else hf_home() / "datasets"


def repo_dir(repo_id: str, repo_type: RepoType = "model") -> Path:
    """The cache directory of one hub repository (it may not exist). The name is what
    huggingface_hub's `repo_folder_name` makes, written out: that function lives in its download
    module, whose import brings in the whole HTTP stack."""
    return hub_cache() / f"{repo_type}s--{repo_id.replace('/', '--')}"


def snapshot(repo_id: str, revision: str | None = None, repo_type: RepoType = "model"
             ) -> Path | None:
    """The cached snapshot of `revision` (a ref such as `main`, or a commit), if present.

    Hand-written: huggingface_hub resolves a cached revision only inside `snapshot_download`,
    which raises where this answers None and brings in its HTTP stack."""
    repo = repo_dir(repo_id, repo_type)
    ref = revision or constants.DEFAULT_REVISION
    ref_file = repo / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snap = repo / "snapshots" / commit
    return snap if snap.is_dir() else None


def model_cache(location: str, *, weights: bool = True) -> Path:
    """The node-local copy of a model kept at a URL: `$XDG_CACHE_HOME/specflow/models/<name>-
    <hash of the URL>`; `weights=False`: the copy of its small files (config, tokenizer) and its
    safetensors headers, which reading the architecture and tokenizing prompts need."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "specflow"
    name = location.rstrip("/").rsplit("/", 1)[-1] or "model"
    key = hashlib.sha256(location.rstrip("/").encode()).hexdigest()[:12]
    return root / "models" / (f"{name}-{key}" if weights else f"{name}-{key}.meta")


COMPLETE = ".specflow-complete"
"""The file a finished node-local copy holds (a copy without it is redone)."""


def local_model(location: str) -> str:
    """A model location as a process on this node passes it to vLLM or a tokenizer: a URL as its
    node-local copy (the full one when there, else the small files), a `~` path expanded, a Hugging
    Face id or a plain path unchanged."""
    if is_url(location):  # an object store's: copied to each node's disk
        full = model_cache(location)
        return str(full if (full / COMPLETE).is_file() else model_cache(location, weights=False))
    return str(Path(location).expanduser()) if location.startswith("~") else location
