"""Where things are: a local path, or a URL of a store (`s3://bucket/prefix`, any fsspec URL)."""

from __future__ import annotations

from pathlib import Path


def is_url(location: str | Path) -> bool:
    """Whether a location is a URL (`scheme://...`) rather than a local path (`file://` is a
    local path)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")
