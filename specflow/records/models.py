"""Models kept at a URL (`paths.models=s3://bucket/models`), copied to each node's own disk.

A GPU node of a cluster reads weights from its own disk; what it shares with the fleet is the
bucket. A model location that is a URL is copied on first use into the node-local cache
(`hfcache.model_cache`: `$XDG_CACHE_HOME/specflow/models`, a hostPath on Kubernetes, so it
survives the pod) and every later use on that node reads the copy:

- `fetch(url, weights=False)`: the small files (config, tokenizer, generation config) and each
  safetensors file's header alone (two ranged reads), into `<name>-<hash>.meta`: what reading
  the architecture and tokenizing prompts need, in seconds, on any process (the flow that
  fans out included, which holds no GPU and never needs the weights);
- `fetch(url)`: the whole directory, on the node that starts the engine, before its start
  timeout begins.

A copy is made in a temporary directory beside its destination, marked complete, then renamed
into place, under a lock per copy: processes of one node wait for one another and share it; a
copy interrupted midway is redone. A Hugging Face id is not copied here: vLLM resolves it in
each node's own HF_HOME (the same hostPath), and a local path is used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

from specflow.records.store import Store
from specflow.spec.hfcache import COMPLETE, local_model, model_cache
from specflow.spec.locations import is_url

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5")
"""Files that hold tensors (left out of the small copy)."""


def fetch(location: str, *, weights: bool = True, setting: str = "paths.models") -> Path:
    """The node-local copy of a model at a URL, made if it is not there (see the module
    docstring); StoreError naming `setting` when the store refuses or cannot be reached,
    FileNotFoundError when there is no model at the URL."""
    if not is_url(location):
        return Path(local_model(location))
    dest = model_cache(location, weights=weights)
    if (dest / COMPLETE).is_file():
        return dest
    with _locked(dest):
        if (dest / COMPLETE).is_file():  # another process of this node made it meanwhile
            return dest
        store = Store(location, setting=setting)
        keys = [k for k in store.files() if not k.rsplit("/", 1)[-1].startswith(".")]
        if "config.json" not in keys:
            raise FileNotFoundError(f"{setting}: no model at {location} (no config.json there)")
        tmp = dest.with_name(f".{dest.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for key in keys:
            if weights or not key.endswith(WEIGHTS):
                store.download(key, tmp / key)
            elif key.endswith(".safetensors"):
                _header_only(store, key, tmp / key)
        (tmp / COMPLETE).write_text(location + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


def _header_only(store: Store, key: str, dest: Path) -> None:
    """A safetensors file's length prefix and JSON header, no tensor data (what
    `architecture.safetensors_params` reads)."""
    head = store.read_range(key, 0, 8)
    (n,) = struct.unpack("<Q", head)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(head + store.read_range(key, 8, 8 + n))


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(f".{dest.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
