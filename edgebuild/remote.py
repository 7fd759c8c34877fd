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

Endpoints: for ``s3://`` the environment variable ``EDGEBUILD_S3_ENDPOINT_URL``
sets the endpoint (an S3-compatible server: MinIO, Ceph, a loopback test
server); botocore's own ``AWS_ENDPOINT_URL_S3`` and fsspec's configuration
(``FSSPEC_S3_ENDPOINT_URL``, ``~/.config/fsspec/``) work as well. Credentials
are whatever the backend normally reads (for S3: the ``AWS_*`` variables, a
profile, an instance role).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from .errors import RemoteError

S3_ENDPOINT_ENV = "EDGEBUILD_S3_ENDPOINT_URL"

# Protocols whose single-object writes are atomic and that have no real rename.
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oci", "oss", "memory", "hf"})
# What a backend raises for an unreachable or refusing remote. s3fs maps S3's
# error codes onto OSError subclasses, but a connection failure surfaces as the
# client library's own type (botocore's EndpointConnectionError, aiohttp's
# errors, ...), and every fsspec backend has its own: at this boundary any
# exception is reported as a RemoteError that names its type.
_BACKEND_ERRORS: tuple[type[BaseException], ...] = (Exception,)


def is_url(spec: str) -> bool:
    return "://" in spec


def storage_options(protocol: str) -> dict[str, Any]:
    """Options for the fsspec filesystem of ``protocol`` that edgebuild sets itself."""
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get(S3_ENDPOINT_ENV)
        if endpoint:
            return {"endpoint_url": endpoint}
    return {}


class Location:
    """Keys (``a/b/c.json``, always with '/') under one root of one filesystem.

    ``label`` is what messages show: the spec as the user wrote it.
    """

    def __init__(self, spec: str, base: Path | None = None) -> None:
        self.label = spec
        if is_url(spec):
            protocol = spec.split("://", 1)[0]
            url = spec
        else:
            path = Path(spec).expanduser()
            if not path.is_absolute():
                path = (base or Path.cwd()) / path
            protocol, url = "file", os.path.normpath(path)
        self._url = url
        self._options = storage_options(protocol)
        self._pid = -1
        filesystem, root = self._open()
        self.root = root.rstrip("/")
        protocols = filesystem.protocol if isinstance(filesystem.protocol, tuple) else (filesystem.protocol,)
        self.is_object_store = bool(OBJECT_STORE_PROTOCOLS.intersection(protocols))
        self.is_local = "file" in protocols

    def _open(self) -> tuple[Any, str]:
        import fsspec.core

        try:
            self._fs, root = fsspec.core.url_to_fs(self._url, **self._options)
        except (ImportError, ValueError) as error:
            raise RemoteError(f"{self.label}: cannot open this location: {error}") from None
        self._pid = os.getpid()
        # Listings cached by another call of this process could hide what another
        # process wrote meanwhile; every read below asks the backend.
        self._fs.invalidate_cache()
        return self._fs, root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem; opened again in a forked process (``doit -n 2``),
        where the parent's client and its event loop must not be used."""
        if self._pid != os.getpid():
            self._open()
        return self._fs

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def local_path(self, key: str) -> Path:
        """The path of ``key`` on this machine (only for a local location)."""
        assert self.is_local
        return Path(self.path(key))

    def where(self, key: str) -> str:
        """``key`` as messages show it: under the location the user named."""
        return f"{self.label.rstrip('/')}/{key}"

    # --- reads ------------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        """The bytes at ``key``; ``None`` when there is nothing there."""
        try:
            return self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            return None
        except _BACKEND_ERRORS as error:
            raise RemoteError(f"{self.where(key)}: cannot read: {_describe(error)}") from None

    def size(self, key: str) -> int | None:
        """The size of the object at ``key``; ``None`` when there is none."""
        try:
            info = self.fs.info(self.path(key))
        except FileNotFoundError:
            return None
        except _BACKEND_ERRORS as error:
            raise RemoteError(f"{self.where(key)}: cannot read: {_describe(error)}") from None
        return int(info["size"]) if info.get("type") != "directory" else None

    def download(self, key: str, target: Path) -> bool:
        """Copy ``key`` to the local file ``target``; ``False`` when there is no such object."""
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.fs.get_file(self.path(key), str(target))
        except FileNotFoundError:
            return False
        except _BACKEND_ERRORS as error:
            raise RemoteError(f"{self.where(key)}: cannot download: {_describe(error)}") from None
        return True

    # --- writes -----------------------------------------------------------------

    def write(self, key: str, data: bytes) -> None:
        """Put ``data`` at ``key`` so that a reader sees the old object or the new one."""
        self._put(key, lambda path: self.fs.pipe_file(path, data))

    def upload(self, source: Path, key: str) -> None:
        """Copy the local file ``source`` to ``key``, with the same guarantee as :meth:`write`."""
        self._put(key, lambda path: self.fs.put_file(str(source), path))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass
        except _BACKEND_ERRORS as error:
            raise RemoteError(f"{self.where(key)}: cannot delete: {_describe(error)}") from None

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
            raise RemoteError(f"{self.where(key)}: cannot write: {_describe(error)}") from None


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if isinstance(error, OSError) else f"{type(error).__name__}: {text}"
