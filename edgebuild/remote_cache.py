"""The remote cache: verified builds shared between CI runners and laptops.

Before building, an artifact whose fingerprint the remote holds is pulled
instead; after a build passes verification it is pushed. The layout under the
remote's root is content-addressed twice over::

    v1/entries/<fp[:2]>/<fp>.json     which files make up the build of <fp>
    v1/blobs/<d[:2]>/<d>              a file's bytes, under their blake3 digest

Files live under their digest, not under the fingerprint, so two runners that
push the same fingerprint at once (with byte-different but equally valid
outputs, or reports with different timings) never mix their files: each blob
key has exactly one possible content, and the entry, written last in a single
write, names a consistent set. A blob is uploaded only when missing, and
identical files (a config shared by several artifacts) are stored once.

Trust: a pull downloads into a scratch directory and checks every file's size
and digest against the entry, the entry's outputs against the build record,
and the record against the fingerprint it is filed under (its inputs must hash
to it). Anything that does not match is reported, dropped from the remote (so
the next push replaces it) and rebuilt; it is never used. A push first checks
the local store entry against its record, so a file damaged locally is never
uploaded.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from .atomic import scratch_prefix
from .errors import RecordError, RemoteError, StoreError
from .hashing import canonical_json, file_digest
from .record import RECORD_FILE, REPORT_FILES, BuildRecord, parse_record
from .remote import Location
from .store import Store

REMOTE_FORMAT = 1
PREFIX = f"v{REMOTE_FORMAT}"

Log = Callable[[str], None]


class CorruptEntry(Exception):
    """A remote entry that must not be used; the message says what is wrong with it."""

    def __init__(self, message: str, bad_blobs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.bad_blobs = bad_blobs


def entry_key(fingerprint: str) -> str:
    return f"{PREFIX}/entries/{fingerprint[:2]}/{fingerprint}.json"


def blob_key(digest: str) -> str:
    return f"{PREFIX}/blobs/{digest[:2]}/{digest}"


class RemoteCache:
    def __init__(self, location: Location) -> None:
        self.location = location

    @classmethod
    def open(cls, spec: str, base: Path | None = None) -> "RemoteCache":
        return cls(Location(spec, base))

    @property
    def label(self) -> str:
        return self.location.label

    # --- reading ------------------------------------------------------------------

    def entry(self, fingerprint: str) -> dict[str, Any] | None:
        """The entry of ``fingerprint`` as stored (``None`` when absent).
        Raises :class:`CorruptEntry` when it is not a readable entry."""
        raw = self.location.read(entry_key(fingerprint))
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
            files = entry["files"]
            valid = (
                entry.get("format") == REMOTE_FORMAT
                and entry.get("fingerprint") == fingerprint
                and isinstance(files, dict)
                and RECORD_FILE in files
                and all(isinstance(meta["size"], int) and isinstance(meta["digest"], str) for meta in files.values())
            )
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            raise CorruptEntry(f"{entry_key(fingerprint)} is not an entry of format {REMOTE_FORMAT} for this fingerprint")
        return entry

    def has_entry(self, fingerprint: str) -> bool:
        """Whether a readable entry is there (one read; blobs not checked)."""
        try:
            return self.entry(fingerprint) is not None
        except CorruptEntry:
            return False

    def has(self, fingerprint: str) -> bool:
        """Whether a complete entry is there: readable, and every blob present at its size."""
        try:
            entry = self.entry(fingerprint)
        except CorruptEntry:
            return False
        return entry is not None and not self._missing_blobs(entry)

    def pull(self, name: str, fingerprint: str, store: Store, target: Path, scratch_root: Path, log: Log) -> BuildRecord | None:
        """Put the remote build of ``fingerprint`` into ``store`` and materialise it at
        ``target``. Returns the record; ``None`` when the remote has no such entry or
        the entry is corrupt (which is then reported and dropped)."""
        scratch_root.mkdir(parents=True, exist_ok=True)
        # The artifact's scratch prefix: a pull killed half-way is cleaned up like a build.
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(name) + "pull~", dir=scratch_root))
        try:
            try:
                entry = self.entry(fingerprint)
                if entry is None:
                    return None
                record = self._download(entry, fingerprint, scratch)
            except CorruptEntry as corrupt:
                log(f"remote cache: entry {fingerprint[:12]} is corrupt ({corrupt}); dropped, building instead")
                self._drop(fingerprint, corrupt.bad_blobs)
                return None
            store.put(fingerprint, scratch)
            store.put_report(fingerprint, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        restored = store.restore(fingerprint, target, scratch_root)
        if restored is None:
            raise StoreError(f"{name}: the build pulled from {self.label} did not survive the local store's check")
        return restored

    def _download(self, entry: dict[str, Any], fingerprint: str, scratch: Path) -> BuildRecord:
        files: dict[str, dict[str, Any]] = entry["files"]
        for relative, meta in sorted(files.items()):
            path = scratch / relative
            if not _inside(scratch, path):
                raise CorruptEntry(f"file name {relative!r} points outside the artifact")
            if not self.location.download(blob_key(meta["digest"]), path):
                raise CorruptEntry(f"{relative}: blob {meta['digest'][:12]} is missing")
            size = path.stat().st_size
            if size != meta["size"]:
                raise CorruptEntry(f"{relative}: {size} bytes, expected {meta['size']}", (meta["digest"],))
            digest = file_digest(path)
            if digest != meta["digest"]:
                raise CorruptEntry(f"{relative}: digest {digest[:12]}, expected {meta['digest'][:12]}", (meta["digest"],))
        try:
            record = parse_record((scratch / RECORD_FILE).read_bytes(), RECORD_FILE)
        except RecordError as error:
            raise CorruptEntry(str(error)) from None
        hashes_to = record.hashes_to()
        if record.fingerprint != fingerprint or hashes_to != fingerprint:
            raise CorruptEntry(f"{RECORD_FILE} describes fingerprint {hashes_to[:12]}, not {fingerprint[:12]}")
        outputs = {relative: meta for relative, meta in files.items() if relative not in (RECORD_FILE, *REPORT_FILES)}
        if record.to_json(only=("outputs",))["outputs"] != outputs:
            raise CorruptEntry(f"the files listed do not match the outputs in {RECORD_FILE}")
        return record

    def _missing_blobs(self, entry: dict[str, Any]) -> list[str]:
        return [
            relative
            for relative, meta in entry["files"].items()
            if self.location.size(blob_key(meta["digest"])) != meta["size"]
        ]

    def _drop(self, fingerprint: str, bad_blobs: tuple[str, ...]) -> None:
        """Remove a corrupt entry (and the blobs known to be bad) so that the next push replaces it."""
        self.location.delete(entry_key(fingerprint))
        for digest in bad_blobs:
            self.location.delete(blob_key(digest))

    # --- writing ------------------------------------------------------------------

    def push(self, fingerprint: str, store: Store, log: Log) -> bool:
        """Upload the stored build of ``fingerprint`` (outputs, record, reports).
        ``False`` when the remote already holds a complete entry for it."""
        directory = store.entry_dir(fingerprint)
        record = store.record(fingerprint)
        if record is None:
            raise StoreError(f"store entry {fingerprint[:12]} is missing; nothing to push")
        changed = record.changed_outputs(directory)
        if changed:
            raise StoreError(
                f"store entry {fingerprint[:12]}: {', '.join(changed)} changed since build; not pushed to {self.label}"
            )
        if self.has(fingerprint):
            log(f"remote cache: {fingerprint[:12]} already in {self.label}")
            return False
        files = record.to_json(only=("outputs",))["outputs"]
        for name in (RECORD_FILE, *REPORT_FILES):
            path = directory / name
            if path.is_file():
                files[name] = {"size": path.stat().st_size, "digest": file_digest(path)}
        for relative, meta in sorted(files.items()):
            key = blob_key(meta["digest"])
            if self.location.size(key) == meta["size"]:
                continue
            self.location.upload(directory / relative, key)
            size = self.location.size(key)
            if size != meta["size"]:
                raise RemoteError(f"{self.location.where(key)}: uploaded {relative} but found {size} bytes, expected {meta['size']}")
        entry = {"format": REMOTE_FORMAT, "fingerprint": fingerprint, "files": files}
        # Last, in one write: until it exists, nobody pulls a partial upload.
        self.location.write(entry_key(fingerprint), (canonical_json(entry) + "\n").encode())
        log(f"remote cache: pushed {fingerprint[:12]} to {self.label} ({len(files)} files)")
        return True


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())
