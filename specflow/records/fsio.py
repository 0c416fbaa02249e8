"""One way to write a file so that readers see its old content or all of the new, never a part.

Every writer in specflow (ledger points, promoted configs, the probe cache, window records,
materialised datasets) goes through `atomic_write`: a temporary file in the same directory,
fsynced, `os.replace`d over the destination, then the directory fsynced so the rename survives a
crash; the temporary file is removed when anything fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

BeforeReplace = Callable[[Path, Path], None]
"""Called with (temporary file, destination) just before the replace (fault injection)."""


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new entry in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: str | bytes, before_replace: BeforeReplace | None = None,
                 *, exclusive: bool = False) -> bool:
    """Write `data` to `path` atomically and durably (parents are created). `exclusive`: only
    where `path` does not exist (a hard link of the finished file, refused if the name exists):
    False, and nothing written, when it does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates owner-only files
        if before_replace is not None:
            before_replace(tmp, path)
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return True


def atomic_write_json(path: Path, data: Any, before_replace: BeforeReplace | None = None,
                      indent: int = 2) -> None:
    """`atomic_write` of `data` as sorted, indented JSON with a final newline."""
    atomic_write(path, json.dumps(data, indent=indent, sort_keys=True) + "\n", before_replace)
