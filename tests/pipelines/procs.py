"""Live processes, read from /proc: what a test checks has not outlived a run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def _live() -> Iterator[tuple[Path, str]]:
    """(the /proc entry, its command line) of every live, non-zombie process."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            yield proc, cmd


def processes_using(path: Path, but: int | None = None) -> list[str]:
    """Command lines of live processes that mention `path` (engines, load generators), except
    the process `but`."""
    return [f"{proc.name}: {cmd[:200]}" for proc, cmd in _live()
            if str(path) in cmd and proc.name != str(but)]


def processes_of(tmp: Path) -> list[str]:
    """Live processes started for the test in `tmp` (they inherit its PREFECT_HOME)."""
    marker = f"PREFECT_HOME={tmp / 'prefect'}".encode()
    found = []
    for proc, cmd in _live():
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(cmd[:200])
        except OSError:
            continue
    return found
