"""Models kept at a URL, copied to each node's own disk (`specflow.records.models`), through
fsspec's in-memory filesystem (the same storage layer as a bucket): the small copy holds the
config, the tokenizer and each safetensors header without its tensors, the full copy the whole
directory; each is made once and reused; a URL with no model is a clear error. A serve argv
names each node's own copy while the engine's identity keeps the URL."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fsspec
import pytest

from specflow.engine.server import model_locations, on_this_node
from specflow.records import models
from specflow.spec.hfcache import COMPLETE, local_model, model_cache

HEADER = json.dumps({"w": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]},
                     "__metadata__": {"format": "pt"}}).encode()


def _put_model(url: str) -> bytes:
    fs = fsspec.filesystem("memory")
    root = url.removeprefix("memory://")
    weights = struct.pack("<Q", len(HEADER)) + HEADER + bytes(128)
    fs.pipe({f"{root}/config.json": b'{"model_type": "llama"}',
             f"{root}/tokenizer.json": b'{"version": "1.0"}',
             f"{root}/sub/extra.txt": b"x",
             f"{root}/model.safetensors": weights})
    return weights


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "node"))
    return tmp_path / "node" / "specflow" / "models"


def test_a_model_at_a_url_is_copied_small_then_whole_once(cache: Path) -> None:
    url = "memory://bucket/models/tiny"
    weights = _put_model(url)

    meta = models.fetch(url, weights=False)
    assert meta == model_cache(url, weights=False) and meta.parent == cache
    assert meta.name.startswith("tiny-") and meta.name.endswith(".meta")
    assert (meta / "config.json").read_bytes() == b'{"model_type": "llama"}'
    assert (meta / "sub" / "extra.txt").read_bytes() == b"x"
    # the header alone: what reading the architecture needs, no tensor data
    assert (meta / "model.safetensors").read_bytes() == weights[:8 + len(HEADER)]
    assert local_model(url) == str(meta)  # tokenizers read the small copy until the whole one

    full = models.fetch(url)
    assert full == model_cache(url) and (full / COMPLETE).is_file()
    assert (full / "model.safetensors").read_bytes() == weights
    assert local_model(url) == str(full)
    assert not list(cache.glob(".*.partial"))

    # made once: a second fetch reads nothing from the store
    fsspec.filesystem("memory").rm("bucket/models/tiny", recursive=True)
    assert models.fetch(url) == full and models.fetch(url, weights=False) == meta


def test_a_copy_cut_midway_is_redone_and_no_model_is_a_clear_error(cache: Path) -> None:
    url = "memory://bucket/models/cut"
    _put_model(url)
    dest = model_cache(url)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("half")  # no completion mark: redone
    assert (models.fetch(url) / "config.json").read_bytes() == b'{"model_type": "llama"}'

    with pytest.raises(FileNotFoundError, match=r"target\.model: no model at memory://nothing"):
        models.fetch("memory://nothing/here", setting="target.model")
    assert models.fetch("~/models/x") == Path("~/models/x").expanduser()


def test_each_node_launches_its_own_copy_while_the_argv_keeps_the_url(cache: Path) -> None:
    url, draft = "s3://b/models/target", "s3://b/models/draft"
    spec_cfg = json.dumps({"method": "draft_model", "model": draft,
                           "num_speculative_tokens": 4}, sort_keys=True, separators=(",", ":"))
    argv = ("vllm", "serve", url, "--tokenizer", "~/tok", "--speculative-config", spec_cfg,
            "--served-model-name", "tiny")
    assert model_locations(argv) == [url, "~/tok", draft]
    here = on_this_node(argv)
    assert here[2] == str(model_cache(url, weights=False))  # nothing copied yet: the small one
    assert here[4] == str(Path("~/tok").expanduser())
    assert json.loads(here[6])["model"] == str(model_cache(draft, weights=False))
    assert here[7:] == list(argv[7:])
    hub = ("vllm", "serve", "Qwen/Qwen3-8B", "--speculative-config", '{"method":"ngram"}')
    assert on_this_node(hub) == list(hub)  # a Hugging Face id: each node's HF_HOME resolves it
