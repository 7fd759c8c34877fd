"""The one cache layout, shared by the local store and the remote cache.

Both are content-addressed twice over, as Bazel's action cache and CAS are::

    v1/entries/<fp[:2]>/<fp>.json     which files make up the build of <fp>
    v1/blobs/<d[:2]>/<d>              a file's bytes, under their blake3 digest

An entry is ``{"format": 1, "fingerprint": fp, "files": {relative: {"size", "digest"}}}``
(a remote entry may carry a ``signature`` as well). The files are the build's outputs,
its record and, once verified, its report. A file lives under its digest, not under
the fingerprint, so identical files (a config several artifacts share, the same
weights behind two fingerprints) are stored once, and each blob key has exactly one
possible content.

Everything here is the validation both sides use: what a well-formed entry is, and
whether a blob holds the bytes its name promises. Neither side serves a file before
it has been checked with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.cache.location import plain_path_problem, quoted
from edgebuild.core.files import UnreadableFile, parse_json
from edgebuild.core.hashing import file_digest, is_digest
from edgebuild.core.record import RECORD_FILE

CACHE_FORMAT = 1
PREFIX = f"v{CACHE_FORMAT}"
# An entry lists an artifact's files and their digests: kilobytes. Read no more than this.
ENTRY_BYTES = 16 << 20


class CorruptEntry(Exception):
    """An entry that must not be used; the message says what is wrong with it.
    ``bad_blobs``: digests whose blobs hold other bytes (those blobs are bad for every
    entry that names them, not only this one)."""

    def __init__(self, message: str, bad_blobs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.bad_blobs = bad_blobs


ENTRY_SUFFIX = ".json"


def entry_key(fingerprint: str) -> str:
    return f"{PREFIX}/entries/{fingerprint[:2]}/{fingerprint}{ENTRY_SUFFIX}"


def blob_key(digest: str) -> str:
    return f"{PREFIX}/blobs/{digest[:2]}/{digest}"


def parse_entry(raw: bytes, fingerprint: str) -> dict[str, Any]:
    """The entry of ``fingerprint`` in ``raw``, checked for shape (not against any blob);
    :class:`CorruptEntry` when it is not a usable entry for this fingerprint."""
    try:
        entry = parse_json(raw)
    except UnreadableFile:
        entry = None
    if (
        not isinstance(entry, dict)
        or entry.get("format") != CACHE_FORMAT
        or entry.get("fingerprint") != fingerprint
        or not isinstance(entry.get("files"), dict)
        or RECORD_FILE not in entry["files"]
    ):
        raise CorruptEntry(f"{entry_key(fingerprint)} is not an entry of format {CACHE_FORMAT} for this fingerprint")
    problem = files_problem(entry["files"])
    if problem:
        raise CorruptEntry(problem)
    return entry


def files_problem(files: dict[str, Any]) -> str | None:
    """What makes an entry's ``files`` unusable (``None`` when nothing does): a file
    name that is not a plain relative path inside the artifact, a size that is not
    a byte count, a digest no blob key may be built from, or two names where one
    is the other's directory."""
    for relative, meta in sorted(files.items()):
        problem = plain_path_problem(relative)
        if problem:
            return f"file name {quoted(relative)} {problem}"
        if not isinstance(meta, dict):
            return f"{relative}: not a size and a digest"
        size, digest = meta.get("size"), meta.get("digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"{relative}: size {quoted(size)} is not a byte count"
        # The only digest a blob key may be built from: blake3's, lowercase hex.
        if not is_digest(digest):
            return f"{relative}: digest {quoted(digest)} is not a blake3 digest of 64 lowercase hex digits"
    for relative in sorted(files):
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            directory = "/".join(parts[:depth])
            if directory in files:
                return f"file names {quoted(directory)} and {quoted(relative)} collide (one would be the other's directory)"
    return None


def check_blob(path: Path, relative: str, meta: dict[str, Any]) -> None:
    """Raise :class:`CorruptEntry` unless the local file ``path`` holds the bytes the
    entry promises for ``relative``: its size and its blake3 digest.

    Blobs live under their digest: bytes that hash to something else are a bad blob
    whatever the entry says, while bytes that do hash to the key are good even if the
    entry states another size (then only the entry is bad)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptEntry(f"{relative}: blob {meta['digest'][:12]} is missing") from None
    digest = file_digest(path)
    bad_blob = (meta["digest"],) if digest != meta["digest"] else ()
    if size != meta["size"]:
        raise CorruptEntry(f"{relative}: {size} bytes, expected {meta['size']}", bad_blob)
    if bad_blob:
        raise CorruptEntry(f"{relative}: digest {digest[:12]}, expected {meta['digest'][:12]}", bad_blob)
