"""The light part of the suite (tests/conftest.py, LIGHT) is what `make test` may run at the
lowest priority beside the heavy part: its modules start no process and keep no clock, so they
pass however little CPU they get."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LIGHT

ROOT = Path(__file__).resolve().parent.parent
CLOCKS = ("subprocess", "Popen", "os.fork", "time.sleep", "timeout", "lease_s", "prefect_api",
          "tiny_models", "run_cli")
"""What a light module must not use: a process of its own, a server, the engine's models, or
a clock that a starved process could run out of (Hypothesis's per-example deadline too: a
light module that uses `@given` sets `deadline=None`)."""


def _modules() -> list[Path]:
    files: list[Path] = []
    for entry in LIGHT:
        path = ROOT / entry
        assert path.exists(), f"LIGHT names {entry}, which does not exist"
        files += sorted(path.glob("test_*.py")) if path.is_dir() else [path]
    return files


def test_light_modules_start_nothing_and_keep_no_clock() -> None:
    """Every LIGHT entry exists, and no light module names what needs CPU on time."""
    files = _modules()
    assert len(files) >= 20
    found = {f"{f.relative_to(ROOT)}: {word}" for f in files for word in CLOCKS
             if word in f.read_text()}
    found |= {f"{f.relative_to(ROOT)}: @given without deadline=None" for f in files
              if "@given" in f.read_text() and "deadline=None" not in f.read_text()}
    assert not found, sorted(found)
