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
- `replace_if` replaces a record only if it is still the version read (`read_tagged`): on S3 a
  PUT with `If-Match: <ETag>`, refused when another writer replaced it in between (a pointer
  swap, for champions); a local store's writers hold a lock instead.

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
import logging
import os
import time
import urllib.parse
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from specflow.records.fsio import BeforeReplace, atomic_write, fsync_dir
from specflow.spec.locations import is_url

__all__ = ["Store", "StoreError", "is_url", "shown"]

log = logging.getLogger("specflow.records.store")

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

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        """Could not be reached (not a setting to fix: the same command goes on later)."""


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
                        f"written before is kept, the same command goes on from it",
                        unreachable=True) from None
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

    def location(self, key: str) -> Path | str:
        """Where a key is, as a user reaches it: a local path, or a URL."""
        return Path(self._full(key)) if self.local else self.join(key)

    def read_tagged(self, key: str) -> tuple[bytes, str | None]:
        """A record's bytes with the tag of that very version (an object store's ETag), for
        `replace_if` (FileNotFoundError when there is none). A local store has no tags: its
        writers serialise with a lock."""
        if self.local:
            return self.read_bytes(key), None
        full = self._full(key)
        while True:  # the tag of the bytes read: the same before and after the read
            before = self._tag(key)
            data = self._call(f"reading {key}", self.fs.cat_file, full)
            if self._tag(key) == before:
                return data, before

    def _tag(self, key: str) -> str | None:
        info = self._call(f"looking at {key}", self.fs.info, self._full(key), refresh=True)
        tag = info.get("ETag") or info.get("etag") or info.get("generation")
        return str(tag) if tag is not None else None

    def replace_if(self, key: str, data: str | bytes, tag: str | None) -> bool:
        """Replace a record only if it is still the version `tag` names (None: only if there is
        none), in one conditional PUT (`If-Match` / `If-None-Match`); False when another writer
        got there first (read again and decide again). A local store writes (its writers hold
        a lock). A backend without conditional replaces writes, with a warning: of two writers
        at the same moment, the last one wins."""
        if self.local:
            self.write(key, data)
            return True
        if tag is None:
            return self.create(key, data)
        blob = data.encode("utf-8") if isinstance(data, str) else data
        try:
            self._call(f"replacing {key}", self.fs.pipe_file, self._full(key), blob, IfMatch=tag)
        except FileNotFoundError:  # removed since it was read
            return False
        except TypeError:
            log.warning("%s cannot replace %s conditionally; written unconditionally",
                        shown(self.url), key)
            self.write(key, blob)
        except OSError as exc:
            if _precondition_failed(exc):
                return False
            raise
        return True

    def write(self, key: str, data: str | bytes, before_replace: BeforeReplace | None = None
              ) -> None:
        """Write a record whole (replacing any): readers see the old or the new, never a part.
        `before_replace` (a local store): called before the rename (fault injection)."""
        if self.local:
            atomic_write(Path(self._full(key)), data, before_replace)
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
        return atomic_write(Path(self._full(key)), blob, exclusive=True)

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

    def files(self) -> list[str]:
        """Every record under the store, as keys relative to it, sorted."""
        if self.local:
            root = Path(self.root)
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        found = self._call("listing it", self.fs.find, self.root)
        return sorted(str(p)[len(self.root) + 1:] for p in found
                      if str(p).startswith(self.root + "/"))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a record (one ranged GET on an object store)."""
        return self._call(f"reading {key}", self.fs.cat_file, self._full(key), start=start,
                          end=end)

    def download(self, key: str, dest: Path) -> None:
        """Copy a record to a local file (streamed, not held in memory)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._call(f"copying {key}", self.fs.get_file, self._full(key), str(dest))

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


def _precondition_failed(exc: OSError) -> bool:
    """Whether a write was refused for its condition (HTTP 412, or 409 where S3 saw two
    conditional writes of one key at once)."""
    response = getattr(exc.__cause__, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in {"PreconditionFailed", "ConditionalRequestConflict"} or \
        "pre-conditions you specified did not hold" in str(exc)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
