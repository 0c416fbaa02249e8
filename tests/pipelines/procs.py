"""Live processes (psutil): what a test checks has not outlived a run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil


def _live() -> Iterator[tuple[psutil.Process, str]]:
    """(the process, its command line) of every live, non-zombie process."""
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"]  # None where it cannot be read
        if cmdline is not None and proc.info["status"] != psutil.STATUS_ZOMBIE:
            yield proc, " ".join(cmdline)


def _environ(proc: psutil.Process) -> dict[str, str]:
    """The environment of `proc`; empty where it cannot be read (gone, another user's)."""
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def processes_using(path: Path, but: int | None = None) -> list[str]:
    """Command lines of live processes that mention `path` (engines, load generators), except
    the process `but`."""
    return [f"{proc.pid}: {cmd[:200]}" for proc, cmd in _live()
            if str(path) in cmd and proc.pid != but]


def processes_of(tmp: Path) -> list[str]:
    """Live processes started for the test in `tmp` (they inherit its PREFECT_HOME)."""
    home = str(tmp / "prefect")
    return [cmd[:200] for proc, cmd in _live() if _environ(proc).get("PREFECT_HOME") == home]


def pids_with_env(name: str, value: str) -> list[int]:
    """PIDs of live processes whose environment sets `name` to `value` (a worker's device set)."""
    return [proc.pid for proc, _ in _live() if _environ(proc).get(name) == value]
