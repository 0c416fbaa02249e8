"""The one atomic writer: all or nothing, durable, no temp file left behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from specflow.records import fsio


def test_writes_json_and_text_atomically(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b.json"  # parents are created
    fsio.atomic_write_json(path, {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert path.read_text().endswith("\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    fsio.atomic_write(path, b"raw")
    assert path.read_bytes() == b"raw"
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]


def test_fsyncs_the_file_and_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fsio.atomic_write(tmp_path / "x.txt", "x")
    assert synced == ["file", "dir"]  # the data first, then the rename


def test_failure_keeps_the_old_content_and_removes_the_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "champion.json"
    fsio.atomic_write_json(path, {"version": 1})

    def crash(tmp: Path, dest: Path) -> None:
        assert tmp.parent == dest.parent and tmp.read_text().startswith("{")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fsio.atomic_write_json(path, {"version": 2}, before_replace=crash)
    assert json.loads(path.read_text()) == {"version": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["champion.json"]
    with pytest.raises(TypeError):  # not JSON: nothing written, nothing left
        fsio.atomic_write_json(path, {"x": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["champion.json"]
