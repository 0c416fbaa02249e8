"""Where the Hugging Face caches are on this machine, as huggingface_hub resolves them.

One locator for every reader (model snapshots for headroom, dataset snapshots for workloads):
HF_HUB_CACHE (or the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, where HF_HOME defaults to
XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface. Nothing here downloads anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

RepoType = Literal["model", "dataset"]


def hf_home() -> Path:
    """$HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface"


def hub_cache() -> Path:
    """The hub cache holding `models--*` and `datasets--*` repositories."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(env).expanduser() if env else hf_home() / "hub"


def datasets_cache() -> Path:
    """The `datasets` library's own cache ($HF_DATASETS_CACHE, else HF_HOME/datasets)."""
    env = os.environ.get("HF_DATASETS_CACHE")
    return Path(env).expanduser() if env else hf_home() / "datasets"


def repo_dir(repo_id: str, repo_type: RepoType = "model") -> Path:
    """The cache directory of one hub repository (it may not exist)."""
    return hub_cache() / f"{repo_type}s--{repo_id.replace('/', '--')}"


def snapshot(repo_id: str, revision: str | None = None, repo_type: RepoType = "model"
             ) -> Path | None:
    """The cached snapshot of `revision` (a ref such as `main`, or a commit), if present."""
    repo = repo_dir(repo_id, repo_type)
    ref = revision or "main"
    ref_file = repo / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snap = repo / "snapshots" / commit
    return snap if snap.is_dir() else None
