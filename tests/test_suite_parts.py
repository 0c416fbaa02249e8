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
    """Each LIGHT module, and the conftest.py beside it whose fixtures it gets."""
    files: set[Path] = set()
    for entry in LIGHT:
        path = ROOT / entry
        assert path.exists(), f"LIGHT names {entry}, which does not exist"
        found = sorted(path.glob("test_*.py")) if path.is_dir() else [path]
        files |= {*found, *(f.parent / "conftest.py" for f in found
                            if f.parent != ROOT / "tests" and (f.parent / "conftest.py").exists())}
    return sorted(files)


def test_light_modules_start_nothing_and_keep_no_clock() -> None:
    """Every LIGHT entry exists, and no light module (nor its directory's conftest.py) names
    what needs CPU on time."""
    files = _modules()
    assert len(files) >= 20
    found: set[str] = set()
    for f in files:
        text = f.read_text()
        found |= {f"{f.relative_to(ROOT)}: {word}" for word in CLOCKS if word in text}
        if "@given" in text and "deadline=None" not in text:
            found.add(f"{f.relative_to(ROOT)}: @given without deadline=None")
    assert not found, sorted(found)
