"""Run a command with a full filesystem mounted over one directory (a fault-injection helper).

    unshare -rm -- python -m tests.full_disk DIR -- COMMAND ARGS...

Inside a private mount namespace (`unshare -rm`: no privileges needed where user namespaces are
enabled), a small tmpfs is mounted over DIR and filled until the kernel answers ENOSPC, then
COMMAND replaces this process. Everything COMMAND and its children write under DIR fails with
"No space left on device", as on a real full disk; everything else is untouched. The mount
vanishes with the namespace, so DIR's earlier contents reappear afterwards.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path


def fill(directory: Path) -> int:
    """Write into `directory` until its filesystem is full; returns the bytes written."""
    written = 0
    with open(directory / ".fill", "wb", buffering=0) as fh:
        while True:
            try:
                written += fh.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m tests.full_disk DIR -- COMMAND ARGS...")
    target = Path(argv[0])
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "specflow-full", str(target)],
                   check=True)
    fill(target)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
