"""The data files of a Hugging Face dataset split, found locally only (nothing is downloaded).

Where they may be: a local file or directory named by `source.dataset`; a snapshot in the hub
cache (`specflow.spec.hfcache`: the pinned revision, else `main`, else the hub's auto-converted
parquet branch, else the only snapshot); the `datasets` library's own arrow cache. Within a
snapshot or directory the split's files are chosen by the dataset card's `configs:` when it has
them, else by the Hub's file naming conventions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from specflow.spec import hfcache
from specflow.spec.errors import Problem, did_you_mean, one_of
from specflow.spec.schema import HfSource
from specflow.workloads.model import Fail

DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".arrow", ".csv")
"""File types read as data (see `specflow.workloads.tables`)."""
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json", "dataset_infos.json"}


def hf_files(src: HfSource, where: str) -> tuple[list[Path], str]:
    """Data files of the split, and a description of where they came from."""
    local = Path(src.dataset).expanduser()
    if local.is_file():
        return [local], str(local)
    hub_repo = hfcache.repo_dir(src.dataset, "dataset")
    if local.is_dir() and (_looks_like_path(src.dataset) or not hub_repo.is_dir()):
        return _split_files(local, src, where), str(local)
    if _looks_like_path(src.dataset):
        raise Fail(Problem(f"{where}.dataset", "no such file or directory", src.dataset,
                           "an existing local dataset directory or file, or a dataset id"))
    for snapshot in _hub_snapshots(src, where):
        if _data_files(snapshot):
            return _split_files(snapshot, src, where), f"the HF cache ({snapshot})"
    files = _datasets_cache_files(src, where)
    if files:
        return files, f"the datasets cache ({files[0].parent})"
    if src.download:
        snapshot = _download(src, where)
        return _split_files(snapshot, src, where), f"downloaded to the HF cache ({snapshot})"
    raise Fail(Problem(
        f"{where}.dataset",
        f"not in the local Hugging Face cache (searched {hfcache.hub_cache()} and "
        f"{hfcache.datasets_cache()}) and specflow never downloads datasets (offline)",
        src.dataset,
        f"a cached dataset or a local path: download it on a connected machine with "
        f"`hf download {src.dataset} --repo-type dataset` (the cache is $HF_HOME/hub) and copy "
        "the cache here, or set source.dataset to a local directory or file, or set "
        "source.kind=jsonl, or source.download=true to let specflow download it here",
    ))


def _download(src: HfSource, where: str) -> Path:
    """The dataset downloaded into the local HF cache (`source.download: true` only; a token,
    if the dataset needs one, comes from HF_TOKEN / the hf login and is never logged)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(src.dataset, repo_type="dataset",
                                      revision=src.revision))
    except Exception as exc:  # noqa: BLE001 - offline, unknown, gated: one problem line
        raise Fail(Problem(f"{where}.download", f"could not download the dataset "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
                           src.dataset, "a reachable hub (HF_HUB_OFFLINE unset) and a dataset "
                           "id it holds (and HF_TOKEN for a gated one)")) from None


def _looks_like_path(dataset: str) -> bool:
    return dataset.startswith(("/", ".", "~")) or dataset.count("/") > 1 or \
        dataset.endswith(DATA_SUFFIXES)


def _hub_snapshots(src: HfSource, where: str) -> list[Path]:
    """Snapshot directories to try, most specific first: the pinned revision, else `main`
    (then the hub's auto-converted parquet branch), else the only snapshot there is."""
    snaps = hfcache.repo_dir(src.dataset, "dataset") / "snapshots"
    if not snaps.is_dir():
        return []
    present = sorted(p.name for p in snaps.iterdir() if p.is_dir())

    def by_ref(ref: str) -> Path | None:
        return hfcache.snapshot(src.dataset, ref, "dataset")

    if src.revision is not None:
        found = by_ref(src.revision)
        if found is None:
            raise Fail(Problem(f"{where}.revision", "not in the local Hugging Face cache",
                               src.revision, one_of(present) if present else "a cached revision",
                               did_you_mean(src.revision, present)))
        return [found]
    out = [p for p in (by_ref("main"), by_ref("refs/convert/parquet"),
                       by_ref("convert/parquet")) if p is not None]
    if not out and len(present) == 1:
        out = [snaps / present[0]]
    elif not out and len(present) > 1:
        raise Fail(Problem(f"{where}.revision", "several cached snapshots and no `main` ref",
                           None, one_of(present)))
    return out


def _data_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or path.name in _METADATA_FILES:
            continue
        if path.suffix in DATA_SUFFIXES and path.is_file():
            files.append(path)
    return files


def split_of(rel: Path) -> str:
    """The split a data file belongs to by Hub naming conventions."""
    stem = rel.name.split(".", 1)[0]
    dirs = [p.removeprefix("partial-") for p in rel.parts[:-1]]
    if dirs and (stem.isdigit() or re.fullmatch(r"data(-\d.*)?", stem)):
        return dirs[-1]  # <config>/<split>/0000.parquet, <split>/data-00000-of-00001.arrow
    m = re.match(r"(.+?)[-_]\d", stem)  # test-00000-of-00001.parquet, train_0.jsonl
    return m.group(1) if m else stem


def _readme_configs(root: Path) -> list[dict[str, Any]] | None:
    """The `configs:` of a dataset card's YAML header, if it declares them."""
    readme = root / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    header = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(header)
    except yaml.YAMLError:
        return None
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return configs if isinstance(configs, list) and configs else None


def _split_files(root: Path, src: HfSource, where: str) -> list[Path]:
    """The files of `src.subset`/`src.split` under a snapshot or a local dataset directory."""
    configs = _readme_configs(root)
    if configs is not None:
        return _split_files_from_card(root, configs, src, where)
    files = [f.relative_to(root) for f in _data_files(root)]
    if not files:
        raise Fail(Problem(f"{where}.dataset", "holds no data files", str(root),
                           "parquet, jsonl, json, arrow or csv files"))
    if src.subset is not None:
        subsets = sorted({f.parts[0] for f in files if len(f.parts) > 1})
        files = [f for f in files if src.subset in f.parts[:-1]]
        if not files:
            raise Fail(Problem(f"{where}.subset", f"no such configuration in {root}", src.subset,
                               one_of(subsets) if subsets else "null (no configurations)",
                               did_you_mean(src.subset, subsets)))
    splits = sorted({split_of(f) for f in files})
    chosen = [f for f in files if split_of(f) == src.split]
    if not chosen:
        raise Fail(Problem(f"{where}.split", f"no such split in {root}", src.split,
                           one_of(splits), did_you_mean(src.split, splits)))
    tops = sorted({f.parts[0] for f in chosen if len(f.parts) > 1} - {"data"})
    if src.subset is None and len(tops) > 1:
        raise Fail(Problem(f"{where}.subset", "the dataset has several configurations", None,
                           one_of(tops)))
    return [root / f for f in chosen]


def _card_config(configs: list[dict[str, Any]], src: HfSource, where: str) -> dict[str, Any]:
    """The card's configuration of `src.subset` (else its default, else its only one)."""
    names = [str(c.get("config_name", "default")) for c in configs]
    if src.subset is not None:
        wanted = [c for c in configs if str(c.get("config_name", "default")) == src.subset]
    else:
        wanted = [c for c in configs if c.get("default")] or \
            [c for c in configs if c.get("config_name", "default") == "default"] or \
            (configs if len(configs) == 1 else [])
    if not wanted:
        raise Fail(Problem(f"{where}.subset", "no such configuration in the dataset card",
                           src.subset, one_of(names), did_you_mean(src.subset, names)))
    return wanted[0]


def _card_splits(data_files: object) -> dict[str, list[str]]:
    """Split -> file patterns of a card configuration's `data_files` (any of its forms)."""
    by_split: dict[str, list[str]] = {}
    if isinstance(data_files, str | list) and all(isinstance(d, str) for d in
                                                   ([data_files] if isinstance(data_files, str)
                                                    else data_files)):
        by_split["train"] = [data_files] if isinstance(data_files, str) else list(data_files)
    elif isinstance(data_files, list):
        for entry in data_files:
            if isinstance(entry, dict) and "split" in entry:
                paths = entry.get("path", [])
                by_split[str(entry["split"])] = [paths] if isinstance(paths, str) else list(paths)
    elif isinstance(data_files, dict):
        for split, paths in data_files.items():
            by_split[str(split)] = [paths] if isinstance(paths, str) else list(paths)
    return by_split


def _split_files_from_card(root: Path, configs: list[dict[str, Any]], src: HfSource,
                           where: str) -> list[Path]:
    by_split = _card_splits(_card_config(configs, src, where).get("data_files", []))
    if src.split not in by_split:
        splits = sorted(by_split)
        raise Fail(Problem(f"{where}.split", "no such split in the dataset card", src.split,
                           one_of(splits), did_you_mean(src.split, splits)))
    files = sorted({p for pattern in by_split[src.split] for p in root.glob(pattern)
                    if p.is_file()})
    if not files:
        raise Fail(Problem(f"{where}.split", f"the dataset card lists files that are not in "
                           f"{root}", by_split[src.split], "the data files of the snapshot"))
    return files


def _datasets_cache_files(src: HfSource, where: str) -> list[Path]:
    """Arrow files of the split in the `datasets` library's own cache, if it has them."""
    base = hfcache.datasets_cache() / src.dataset.replace("/", "___")
    if not base.is_dir():
        return []
    config = src.subset or "default"
    if not (base / config).is_dir():
        configs = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise Fail(Problem(f"{where}.subset", f"no such configuration in {base}", src.subset,
                           one_of(configs), did_you_mean(config, configs)))
    for build in sorted((base / config).glob("*/*")):
        files = sorted(build.glob(f"*-{src.split}.arrow")) + \
            sorted(build.glob(f"*-{src.split}-*-of-*.arrow"))
        if files:
            return files
    return []
