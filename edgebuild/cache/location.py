"""A remote location: a directory, or any URL fsspec knows (``file://``, ``s3://``,
``gs://``, ``hf://`` ...). The remote cache and ``doit publish`` both go through
this one class, so a shared disk, an object store and a model hub are served by
the same code.

Writes never leave a half-written object where a reader looks:

- on a filesystem (a directory, ``file://``, ``sftp://``) the bytes go to a
  temporary key beside the target, which is then renamed over it;
- on an object store (S3 and the like) a single PUT is already all-or-nothing
  (a reader sees the old object or the new one, never a prefix), and there is
  no rename, only copy + delete, so the object is written in place.

Keys are confined to the root: :meth:`Location.path` refuses any key that is
not a plain relative path (no ``..``, no absolute path, no empty or ``.``
component, no backslash, no control character), so a key built from something
read off a remote can never name a file outside it.

Errors: every failure of a backend -- opening it (an FTP server refusing the
connection, a protocol fsspec does not know, a package it needs) or any call on it
(``OSError``, a client library's own connection errors, an HTTP server that cannot
be reached, which fsspec reports as a missing file) -- is one :class:`RemoteError`
line, raised here, naming the location and the setting it came from
(``EDGEBUILD_REMOTE_CACHE=ftp://...: cannot reach it: ...``): this class is the one
boundary between edgebuild and the backends, so no caller catches per backend.

Endpoints: for ``s3://`` the ``s3_endpoint`` setting (``EDGEBUILD_S3_ENDPOINT_URL``)
sets the endpoint (an S3-compatible server: MinIO, Ceph, a loopback test
server); botocore's own ``AWS_ENDPOINT_URL_S3`` and fsspec's configuration
(``FSSPEC_S3_ENDPOINT_URL``, ``~/.config/fsspec/``) work as well. Credentials
are whatever the backend normally reads (for S3: the ``AWS_*`` variables, a
profile, an instance role).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, TypeVar

from edgebuild.core.files import UnreadableFile, open_regular, read_bytes
from edgebuild.errors import RemoteError

# ``Location(spec)`` without an endpoint: this process's setting (EDGEBUILD_S3_ENDPOINT_URL).
FROM_SETTINGS = "from settings"
READ_CHUNK = 16 * 1024 * 1024
T = TypeVar("T")

# Protocols whose single-object writes are atomic and that have no real rename.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oci", "oss", "memory", "hf"})
# Object stores whose paths start with a bucket (or container): a prefix under it
# exists only through its objects, so the bucket is what must exist.
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oci", "oss"})
# What a backend raises for an unreachable or refusing remote. s3fs maps S3's
# error codes onto OSError subclasses, but a connection failure surfaces as the
# client library's own type (botocore's EndpointConnectionError, aiohttp's
# errors, ...), and every fsspec backend has its own: at this boundary any
# exception is reported as a RemoteError that names its type.
_BACKEND_ERRORS: tuple[type[BaseException], ...] = (Exception,)


class UnfitObject(RemoteError):
    """What is at a key is not a file of the size a reader allows (a directory, a FIFO,
    something too large): a remote's content, not its reachability, is wrong. ``what``
    says what it is instead, for a caller that names the key its own way."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}; not read")
        self.what = what


def is_url(spec: str) -> bool:
    return "://" in spec


def plain_path_problem(name: str) -> str | None:
    """What keeps ``name`` from being a plain relative POSIX path that stays under
    the directory it is joined to; ``None`` when it is one."""
    if not name:
        return "is empty"
    if name.startswith("/"):
        return "is absolute"
    if "\\" in name:
        return "contains a backslash"
    if any(ord(character) < 32 or character == "\x7f" for character in name):
        return "contains a control character"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component"
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' component"
    return None


def storage_options(protocol: str, s3_endpoint: str | None) -> dict[str, Any]:
    """Options for the fsspec filesystem of ``protocol`` that edgebuild sets itself."""
    if protocol in ("s3", "s3a") and s3_endpoint:
        return {"endpoint_url": s3_endpoint}
    return {}


def shown_setting(setting: str | None, spec: str) -> str:
    """How an error names a location and where it was set: ``EDGEBUILD_REMOTE_CACHE=URL``
    for a variable or a manifest key, ``--to URL`` for an option, the spec alone for none."""
    if not setting:
        return spec
    return f"{setting} {spec}" if setting.startswith("-") else f"{setting}={spec}"


class Location:
    """Keys (``a/b/c.json``, always with '/') under one root of one filesystem.

    ``label`` is what messages show: the spec as the user wrote it; ``setting`` what
    set it (``EDGEBUILD_REMOTE_CACHE``, ``--to``, ...), which an error about reaching
    the location names with it (:attr:`shown`).
    """

    def __init__(self, spec: str, base: Path | None = None, s3_endpoint: str | None = FROM_SETTINGS,
                 setting: str | None = None) -> None:
        if s3_endpoint == FROM_SETTINGS:
            from edgebuild.core.config import Settings

            s3_endpoint = Settings.from_environ().s3_endpoint
        self.label = spec
        self.shown = shown_setting(setting, spec)
        self.s3_endpoint = s3_endpoint
        if is_url(spec):
            protocol, rest = spec.split("://", 1)
            if protocol in ("file", "local") and not rest.startswith("/"):
                # fsspec takes file://HOST/x for the relative path HOST/x, and file:// for the
                # working directory: a cache that follows wherever the command is typed.
                raise RemoteError(f"{self.shown}: expected {protocol}:///ABSOLUTE/PATH (or the directory's path alone); "
                                  f"{protocol}://{rest} names no directory on this machine")
            url = spec
        else:
            path = Path(spec).expanduser()
            if not path.is_absolute():
                path = (base or Path.cwd()) / path
            protocol, url = "file", os.path.normpath(path)
        self._url = url
        self._options = storage_options(protocol, s3_endpoint)
        self._pid = -1
        filesystem, root = self._open()
        self.root = root.rstrip("/")
        protocols = filesystem.protocol if isinstance(filesystem.protocol, tuple) else (filesystem.protocol,)
        self.is_object_store = bool(OBJECT_STORE_PROTOCOLS.intersection(protocols))
        self.has_buckets = bool(BUCKET_PROTOCOLS.intersection(protocols))
        self.is_local = "file" in protocols
        if self.has_buckets and not self.root.strip("/").split("/", 1)[0]:
            # Else the first key's first part would become the bucket (s3://t/<fp>/...).
            raise RemoteError(f"{self.shown}: names no bucket; expected {protocol}://BUCKET or {protocol}://BUCKET/PREFIX")

    @property
    def url(self) -> str:
        """The location as another process opens it, whatever its working directory: an
        absolute path for a directory, the URL as given otherwise."""
        return self._url

    def _open(self) -> tuple[Any, str]:
        import fsspec.core

        try:
            self._fs, root = fsspec.core.url_to_fs(self._url, **self._options)
            # Listings cached by another call of this process could hide what another
            # process wrote meanwhile; every read below asks the backend.
            self._fs.invalidate_cache()
        except (ImportError, ValueError) as error:
            # No such protocol, or its package is not installed.
            raise RemoteError(f"{self.shown}: cannot open this location: {error}") from None
        except _BACKEND_ERRORS as error:
            # Some backends connect as they open (ftp://, sftp://, smb://).
            raise RemoteError(f"{self.shown}: cannot reach it: {_describe(error)}") from None
        self._pid = os.getpid()
        return self._fs, root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem; opened again in a forked process (``doit -n 2``),
        where the parent's client and its event loop must not be used."""
        if self._pid != os.getpid():
            self._open()
        return self._fs

    def path(self, key: str) -> str:
        """The backend's path of ``key``; ``""`` is the root itself. The one place keys
        become paths, so the one place that keeps them under the root."""
        if not key:
            return self.root
        problem = plain_path_problem(key)
        if problem:
            raise RemoteError(f"{self.label}: key {quoted(key)} {problem}; refused (only keys under the root are used)")
        return f"{self.root}/{key}"

    def local_path(self, key: str) -> Path:
        """The path of ``key`` on this machine (only for a local location)."""
        assert self.is_local
        return Path(self.path(key))

    def where(self, key: str) -> str:
        """``key`` as messages show it: under the location the user named."""
        return f"{self.label.rstrip('/')}/{key}"

    def check_root(self) -> None:
        """Raise :class:`RemoteError` unless the root is there: the directory on a
        filesystem, the bucket on an object store. Nothing creates it: a shared
        directory that is missing is more likely an unmounted disk than a new cache."""
        container = self.root.split("/", 1)[0] if self.has_buckets else self.root
        try:
            info = self.fs.info(container)
        except FileNotFoundError as error:
            self._absent(error, "reach", "")
            info = None
        except _BACKEND_ERRORS as error:
            raise RemoteError(f"{self.shown}: cannot reach it: {_describe(error)}") from None
        if self.has_buckets:
            if info is None:
                raise RemoteError(f"{self.shown}: bucket {container!r} does not exist (or these credentials cannot see it)")
        elif info is None:
            create = f"create it (mkdir -p {shlex.quote(container)}) or mount the shared disk" if self.is_local else "create it"
            raise RemoteError(f"{self.shown}: no such directory; {create}")
        elif info.get("type") != "directory":
            raise RemoteError(f"{self.shown}: not a directory")

    def _failed(self, verb: str, key: str, error: BaseException) -> RemoteError:
        """The one line for a backend's failure to ``verb`` ``key`` (``""``: the location itself)."""
        what = f" {key}" if key else " it"
        return RemoteError(f"{self.shown}: cannot {verb}{what}: {_describe(error)}")

    def _absent(self, error: FileNotFoundError, verb: str, key: str) -> None:
        """Let ``error`` mean "nothing there" only when it is not a failure to reach the
        backend in disguise: fsspec's HTTP backend answers a refused connection with
        ``FileNotFoundError``, the connection error as its cause."""
        cause = _unreachable(error)
        if cause is not None:
            raise self._failed(verb, key, cause) from None

    # --- reads ------------------------------------------------------------------

    def read(self, key: str, limit: int | None = None) -> bytes | None:
        """The bytes at ``key``; ``None`` when there is nothing there. A :class:`UnfitObject`
        for anything but a file (a FIFO would hang the read, a device never end it) and,
        with ``limit``, for a file of more than ``limit`` bytes: what a remote holds is not
        trusted to be small, or a file."""
        data = self._read_file(
            key, "read", lambda local: read_bytes(local, sys.maxsize if limit is None else limit),
            lambda path: self.fs.cat_file(path) if limit is None else self.fs.cat_file(path, start=0, end=limit + 1),
            limit)
        if data is not None and limit is not None and len(data) > limit:
            raise UnfitObject(self.where(key), f"more than the {limit} bytes it may hold")
        return data

    def _read_file(self, key: str, verb: str, local: Callable[[Path], T], remote: Callable[[str], T],
                   limit: int | None = None) -> T | None:
        """``local(path)`` of ``key`` on a local location, through edgebuild's own readers
        (regular files only: a FIFO is refused, never waited on, even one swapped in after
        a check); elsewhere ``remote(path)``, once the backend says it is a file of at most
        ``limit`` bytes (an SFTP server's FIFO no local open can refuse; an object store is
        asked only when there is a limit). ``None`` when
        nothing is there; :class:`UnfitObject` for what is not such a file."""
        path = self.path(key)
        try:
            if self.is_local:
                return local(self.local_path(key))
            if self.is_object_store and limit is None:
                # No FIFO or device in an object store: no request to ask before each blob.
                return remote(path)
            info = self.fs.info(path)
            if info.get("type") != "file":
                raise UnfitObject(self.where(key), f"a {info.get('type') or 'thing'} that is not a file")
            size = int(info.get("size") or 0)
            if limit is not None and size > limit:
                raise UnfitObject(self.where(key), f"{size} bytes, more than the {limit} it may hold")
            return remote(path)
        except FileNotFoundError as error:
            self._absent(error, verb, key)
            return None
        except UnreadableFile as error:
            raise UnfitObject(self.where(key), str(error)) from None
        except RemoteError:
            raise
        except _BACKEND_ERRORS as error:
            raise self._failed(verb, key, error) from None

    def size(self, key: str) -> int | None:
        """The size of the object at ``key``; ``None`` when there is none."""
        path = self.path(key)
        try:
            info = self.fs.info(path)
        except FileNotFoundError as error:
            self._absent(error, "read", key)
            return None
        except _BACKEND_ERRORS as error:
            raise self._failed("read", key, error) from None
        return _file_size(info)

    def sizes(self, keys: list[str]) -> dict[str, int | None]:
        """:meth:`size` of each key, asked in one batch: on an object store the requests
        go out together on the filesystem's event loop, so a push of an entry of many
        files waits for one round trip, not one per file."""
        if not keys:
            return {}
        if not self.is_object_store or not hasattr(self.fs, "_info"):
            return {key: self.size(key) for key in keys}
        import asyncio

        from fsspec.asyn import sync

        async def one(key: str) -> int | None:
            try:
                info = await self.fs._info(self.path(key))
            except FileNotFoundError as error:
                self._absent(error, "read", key)
                return None
            return _file_size(info)

        async def every() -> list[Any]:
            return await asyncio.gather(*(one(key) for key in keys), return_exceptions=True)

        try:
            found = sync(self.fs.loop, every)
        except _BACKEND_ERRORS as error:
            raise self._failed("read", "", error) from None
        sizes = {}
        for key, size in zip(keys, found):
            if isinstance(size, BaseException):
                if isinstance(size, _BACKEND_ERRORS) and not isinstance(size, RemoteError):
                    raise self._failed("read", key, size) from None
                raise size
            sizes[key] = size
        return sizes

    def download(self, key: str, target: Path) -> bool:
        """Copy ``key`` to the local file ``target``; ``False`` when there is no such object.
        :class:`UnfitObject` when it is not a file (see :meth:`read`)."""
        target.parent.mkdir(parents=True, exist_ok=True)

        def copy(local: Path) -> bool:
            with open_regular(local) as reader, target.open("wb") as writer:
                shutil.copyfileobj(reader, writer, READ_CHUNK)
            return True

        def get(path: str) -> bool:
            self.fs.get_file(path, str(target))
            return True

        return bool(self._read_file(key, "download", copy, get))

    def digest(self, key: str, hasher: Any) -> str | None:
        """The hex digest of the bytes at ``key``, streamed through ``hasher`` (a fresh
        ``hashlib`` object); ``None`` when there is nothing there. :class:`UnfitObject`
        when it is not a file (see :meth:`read`)."""

        def hashed(handle: Any) -> str:
            with handle:
                while chunk := handle.read(READ_CHUNK):
                    hasher.update(chunk)
            return hasher.hexdigest()

        return self._read_file(key, "read", lambda local: hashed(open_regular(local)),
                               lambda path: hashed(self.fs.open(path, "rb")))

    def listing(self, prefix: str) -> dict[str, tuple[int, float | None]]:
        """Every object under the key ``prefix``: key -> (size, modification time as a
        POSIX timestamp, ``None`` when the backend gives none)."""
        base = self.path(prefix)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError as error:
            self._absent(error, "list", prefix)
            return {}
        except _BACKEND_ERRORS as error:
            raise self._failed("list", prefix, error) from None
        listing = {}
        for path, info in found.items():
            if info.get("type") == "directory" or not path.startswith(base.rstrip("/") + "/"):
                continue
            key = f"{prefix}/{path[len(base.rstrip('/')) + 1:]}"
            listing[key] = (int(info.get("size") or 0), _modified(info))
        return listing

    # --- writes -----------------------------------------------------------------

    def write(self, key: str, data: bytes) -> None:
        """Put ``data`` at ``key`` so that a reader sees the old object or the new one."""
        self._put(key, lambda path: self.fs.pipe_file(path, data))

    def upload(self, source: Path, key: str) -> None:
        """Copy the local file ``source`` to ``key``, with the same guarantee as :meth:`write`."""
        self._put(key, lambda path: self.fs.put_file(str(source), path))

    def create(self, key: str, content: bytes | Path) -> bool:
        """Put ``content`` (bytes, or a local file) at ``key`` only if nothing is there;
        ``False`` when something already is. On S3 this is one conditional write
        (``If-None-Match: *``), so of two writers exactly one succeeds; a backend
        without conditional writes gets fsspec's check-then-write. Not for a local
        directory, whose backend ignores the condition: rename a directory there."""
        assert not self.is_local
        path = self.path(key)
        try:
            if isinstance(content, bytes):
                self.fs.pipe_file(path, content, mode="create")
            else:
                self.fs.put_file(str(content), path, mode="create")
        except FileExistsError:
            return False
        except _BACKEND_ERRORS as error:
            raise self._failed("write", key, error) from None
        return True

    def delete(self, key: str) -> None:
        path = self.path(key)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError as error:
            self._absent(error, "delete", key)
        except _BACKEND_ERRORS as error:
            raise self._failed("delete", key, error) from None

    def _put(self, key: str, write: Any) -> None:
        target = self.path(key)
        try:
            if self.is_object_store:
                write(target)
                return
            parent = target.rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            temporary = f"{parent}/.{key.rsplit('/', 1)[-1]}.{uuid.uuid4().hex}.tmp"
            try:
                write(temporary)
                self.fs.mv(temporary, target)
            finally:
                if self.fs.exists(temporary):
                    self.fs.rm_file(temporary)
        except _BACKEND_ERRORS as error:
            raise self._failed("write", key, error) from None


def _file_size(info: dict[str, Any]) -> int | None:
    """The size of the object an fsspec ``info`` dict describes; ``None`` for what is not a
    file (a directory, a FIFO): no blob of any size, so a push writes the blob over it."""
    return int(info["size"]) if info.get("type") == "file" else None


def _modified(info: dict[str, Any]) -> float | None:
    """The modification time in an fsspec ``info`` dict: ``mtime`` (local, a number or
    a datetime), ``LastModified`` (S3), ``updated`` (GCS) ..., as a POSIX timestamp."""
    from datetime import datetime

    for key in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def quoted(value: object) -> str:
    """``value`` as a message shows it: its repr (escaped), cut short, since it may
    come from a remote and be of any length."""
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _unreachable(error: BaseException) -> BaseException | None:
    """The error behind ``error`` (its cause or context, transitively) that is a failure to
    reach a backend -- an ``OSError`` other than a missing file, such as aiohttp's
    ``ClientConnectorError`` -- or ``None``."""
    seen: set[int] = set()
    current = error.__cause__ or error.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and not isinstance(current, FileNotFoundError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if isinstance(error, OSError) else f"{type(error).__name__}: {text}"
