"""Where specflow keeps its records: a local directory or an object store, by URL.

`tracking.workdir` is a path (`.specflow`, `/srv/specflow`) or any fsspec URL (`s3://bucket/
prefix`, `gs://bucket/prefix`, `memory://x`). One layer, fsspec, serves both; what differs is
only how a write is made safe:

- `write` replaces a record whole: on a local disk `atomic_write` (a temporary file renamed over
  the destination); on an object store one PUT, which is atomic (a reader gets the old object or
  the new one, never a part).
- `create` writes a record only where none exists (False when one does): on a local disk a
  hard link of the finished temporary file (which fails if the name exists); on S3 a PUT with
  `If-None-Match: *` (s3fs `mode="create"`), which the server refuses when the key exists.

Credentials come from the environment the backend reads (for S3: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, `AWS_ENDPOINT_URL_S3` for another
endpoint; for GCS: `GOOGLE_APPLICATION_CREDENTIALS`), never from a config, and never appear in
a message: a URL is shown without any user or password part.

A store that cannot be reached (dropped connections, 5xx answers) is waited out for `grace_s`,
then `StoreError` says so; refused credentials and a bucket that does not exist are `StoreError`
at once, naming the setting.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
import urllib.parse
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from specflow.records.fsio import atomic_write, fsync_dir

DEFAULT_GRACE_S = 300.0
"""How long an unreachable store is waited out before an operation fails."""

CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, AWS_SESSION_TOKEN; "
          "AWS_ENDPOINT_URL_S3 for an S3-compatible server)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the node's service account)",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS (or the node's service account)",
    "az": "AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and a key or "
          "identity)",
    "abfs": "AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and a key or "
            "identity)",
}
"""Where each backend takes its credentials from (said when they are refused)."""


class StoreError(Exception):
    """A store specflow cannot use: unreachable past its grace, credentials refused, a bucket
    that does not exist. The message names the setting and the URL (no secret)."""


def is_url(location: str | Path) -> bool:
    """Whether a location is a URL (`scheme://...`) rather than a local path."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def shown(location: str | Path) -> str:
    """A location as messages show it: a URL without its user and password."""
    text = str(location)
    if not is_url(text):
        return text
    parts = urllib.parse.urlsplit(text)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _transient(exc: BaseException) -> bool:
    """An error worth waiting out: a connection that failed or dropped, a timeout, a 5xx."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError)):
        return False
    names = {t.__name__ for t in type(exc).__mro__}
    if names & {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                "ConnectTimeoutError", "ClientConnectorError", "ServerDisconnectedError",
                "ClientOSError", "ConnectionError", "TimeoutError", "ProxyConnectionError"}:
        return True
    status = getattr(exc, "response", None)
    if isinstance(status, dict):
        code = status.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return isinstance(code, int) and code >= 500
    text = str(exc)
    return any(s in text for s in ("Could not connect", "Connection was closed",
                                   "Service Unavailable", "Internal Error", "SlowDown"))


class Store:
    """A directory of records at `location` (a path or an fsspec URL); keys are `/`-joined
    relative names."""

    def __init__(self, location: str | Path, *, setting: str = "tracking.workdir",
                 grace_s: float = DEFAULT_GRACE_S, storage_options: dict | None = None):
        self.setting = setting
        self.grace_s = grace_s
        text = str(location).removeprefix("file://")
        if is_url(text):
            self.fs, root = fsspec.core.url_to_fs(text, **(storage_options or {}))
            self.root = root.rstrip("/")
            self.url = text.rstrip("/")
        else:
            self.fs = LocalFileSystem()
            self.root = str(Path(text).expanduser().resolve())
            self.url = self.root
        self.local = isinstance(self.fs, LocalFileSystem)

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0] if is_url(self.url) else "file"

    def __repr__(self) -> str:
        return f"Store({shown(self.url)!r})"

    def sub(self, *parts: str) -> Store:
        """The store of a sub-directory (the same filesystem and its connections)."""
        if self.local:
            return Store(self.join(*parts), setting=self.setting, grace_s=self.grace_s)
        out = copy.copy(self)
        key = "/".join(p.strip("/") for p in parts if p)
        out.root, out.url = self._full(key), self.join(*parts)
        return out

    def join(self, *parts: str) -> str:
        """The location of a key (a path, or a URL on an object store)."""
        key = "/".join(p.strip("/") for p in parts if p)
        return f"{self.url}/{key}" if key else self.url

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def path(self, key: str = "") -> Path:
        """The local path of a key (a local store only)."""
        if not self.local:
            raise ValueError(f"{shown(self.url)} is not a local directory")
        return Path(self._full(key))

    # -- the operations, each retried while the store is unreachable -------------------------

    def _call(self, what: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + self.grace_s
        delay = 0.5
        while True:
            try:
                return fn(*args, **kwargs)
            except (FileNotFoundError, FileExistsError):
                raise
            except PermissionError as exc:
                raise self._refused(exc) from None
            except Exception as exc:
                if self.local or not _transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"{self.setting}: {shown(self.url)} could not be reached for "
                        f"{self.grace_s:g} s while {what} (last: {_one_line(exc)}); what was "
                        f"written before is kept, the same command goes on from it") from None
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _refused(self, exc: PermissionError) -> Exception:
        if self.local:
            return exc
        creds = CREDENTIALS.get(self.scheme, "the backend's standard environment variables")
        return StoreError(f"{self.setting}: {shown(self.url)} refused access "
                          f"({_one_line(exc)}); the credentials come from {creds}")

    def check(self) -> None:
        """Raise StoreError unless the store can be listed (its bucket exists, the credentials
        are accepted); a local directory is created."""
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            return
        bucket = self.root.split("/", 1)[0]
        try:
            self._call("checking it", self.fs.ls, bucket, refresh=True)
        except FileNotFoundError:
            raise StoreError(f"{self.setting}: {shown(self.url)}: the bucket {bucket!r} does not "
                             f"exist (create it, or name one that does)") from None

    def read_bytes(self, key: str) -> bytes:
        """A record's bytes (FileNotFoundError when there is none)."""
        if self.local:
            return Path(self._full(key)).read_bytes()
        return self._call(f"reading {key}", self.fs.cat_file, self._full(key))

    def read_many(self, keys: list[str]) -> dict[str, bytes]:
        """Several records' bytes at once (those that exist): an object store fetches them
        concurrently (fsspec's batched `cat`), a local disk reads them one by one."""
        out = {}
        if self.local:
            for key in keys:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    out[key] = Path(self._full(key)).read_bytes()
            return out
        if not keys:
            return out
        full = {self._full(k): k for k in keys}
        got = self._call(f"reading {len(keys)} records", self.fs.cat, list(full),
                         on_error="return")
        for path, data in got.items():
            if isinstance(data, bytes):
                out[full[path]] = data
            elif not isinstance(data, FileNotFoundError):
                raise data
        return out

    def write(self, key: str, data: str | bytes) -> None:
        """Write a record whole (replacing any): readers see the old or the new, never a part."""
        if self.local:
            atomic_write(Path(self._full(key)), data)
            return
        blob = data.encode("utf-8") if isinstance(data, str) else data
        self._call(f"writing {key}", self.fs.pipe_file, self._full(key), blob)

    def create(self, key: str, data: str | bytes) -> bool:
        """Write a record only if the key has none; False (and nothing written) if it has. A
        backend without conditional writes makes it a plain write: specflow creates only keys
        unique by construction (engine-start events), so the condition is a second guard."""
        blob = data.encode("utf-8") if isinstance(data, str) else data
        if not self.local:
            try:
                self._call(f"creating {key}", self.fs.pipe_file, self._full(key), blob,
                           mode="create")
            except FileExistsError:
                return False
            except TypeError:  # a backend without conditional writes: a plain PUT, which is
                # safe for specflow's created keys (engine-start events: unique names)
                self.write(key, blob)
            return True
        path = Path(self._full(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(name, 0o644)
            try:
                os.link(name, path)
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)
        fsync_dir(path.parent)
        return True

    def exists(self, key: str) -> bool:
        if self.local:
            return Path(self._full(key)).exists()
        return bool(self._call(f"looking for {key}", self.fs.exists, self._full(key)))

    def isdir(self, key: str) -> bool:
        """Whether a key is a directory (on an object store: a prefix with records under it)."""
        if self.local:
            return Path(self._full(key)).is_dir()
        return bool(self._call(f"looking for {key}/", self.fs.isdir, self._full(key)))

    def names(self, key: str = "", suffix: str = "") -> list[str]:
        """The names directly under a directory ending in `suffix`, sorted (none: [])."""
        if self.local:
            d = Path(self._full(key))
            return sorted(p.name for p in d.iterdir() if p.name.endswith(suffix)) \
                if d.is_dir() else []
        try:
            found = self._call(f"listing {key}/", self.fs.ls, self._full(key), detail=False,
                               refresh=True)
        except FileNotFoundError:
            return []
        return sorted(n for n in (str(p).rstrip("/").rsplit("/", 1)[-1] for p in found)
                      if n.endswith(suffix))

    def move(self, src: str, dst: str) -> None:
        """Move a record (FileNotFoundError when it is gone)."""
        if self.local:
            target = Path(self._full(dst))
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._full(src), target)
            fsync_dir(Path(self._full(src)).parent)
            return
        self._call(f"moving {src}", self.fs.mv, self._full(src), self._full(dst))

    def upload(self, local: Path, key: str) -> None:
        """Copy a local file into the store (a local store: nothing when it is already there)."""
        if self.local and Path(self._full(key)).resolve() == local.resolve():
            return
        self.write(key, local.read_bytes())


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
