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

Trust: everything read from the remote is untrusted. An entry is used only if
every digest in it is a well-formed blake3 digest (64 lowercase hex digits: a
key is built from it) and every file name a plain relative path inside the
artifact (no ``..``, no absolute path, no empty or ``.`` component, no
backslash, no control character, no name that is also another's directory). A
pull then downloads into a scratch directory and checks every file's size and
digest against the entry, the entry's outputs against the build record, and the
record against the fingerprint it is filed under (its inputs must hash to it).
Anything that does not match is reported, dropped from the remote (so the next
push replaces it) and rebuilt; it is never used. Dropping removes the entry's
own key, and a blob only when its bytes do not hash to its digest (an entry
that merely lies about a blob must not delete it from the entries that share
it). Every key stays under the remote's root (:meth:`Location.path` refuses any
other), and under ``v1/entries/`` or ``v1/blobs/``. A push first checks the
local store entry against its record, so a file damaged locally is never
uploaded.

The remote's root must exist (the directory, or the bucket): it is checked once
per process, and a missing one is an error naming it, never a silent miss. It
is never created: a shared directory that is missing is more likely an
unmounted disk than a new cache, so the first user creates it (``mkdir -p``).

Verified, or only built: an entry whose digests, record and fingerprint all agree is
a consistent build, not a verified one -- whoever can write the remote can write
such an entry around any weights. Its report counts as a verdict here only when the
entry is signed by a trusted key (``signing.py``); otherwise the pull brings the build
without its report, the store marks it as pulled unvouched, and ``doit verify`` judges
it here. A runner with a signing key signs what it pushes, and replaces an entry it
finds there unsigned or signed by a key it does not trust.

Read-only (the ``remote_readonly`` setting: ``EDGEBUILD_REMOTE_CACHE_READONLY=1``, or
``--remote-readonly``): pull,
never push. A shared cache is written only by trusted builds (CI on the protected
branch); a pull request's build reads it and keeps what it makes to itself, so
code nobody has reviewed can never put bytes where everyone else pulls from.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.atomic import scratch_prefix
from edgebuild.errors import RecordError, RemoteError, StoreError, UnvouchedEntry
from edgebuild.core.hashing import canonical_json, digest_bytes, file_digest, is_digest
from edgebuild.core.record import RECORD_FILE, REPORT_FILES, BuildRecord, parse_record
from edgebuild.cache.location import FROM_SETTINGS, Location, UnfitObject, plain_path_problem, quoted
from edgebuild.core.files import RECORD_BYTES, REPORT_BYTES, UnreadableFile, parse_json
from edgebuild.core.report import REPORT_FORMAT, REPORT_JSON
from edgebuild.cache.signing import Trust
from edgebuild.cache.store import Store

REMOTE_FORMAT = 1
# An entry lists an artifact's files and their digests: kilobytes. Read no more than this.
ENTRY_BYTES = 16 << 20
PREFIX = f"v{REMOTE_FORMAT}"

Log = Callable[[str], None]



@dataclass(frozen=True)
class RemoteEntry:
    """One build the remote cache holds, as ``doit cache`` lists it."""

    fingerprint: str
    # From the entry's build record; ``None`` when that cannot be read.
    artifact: str | None
    # Every file of the build, record and reports included.
    size: int
    # When the entry was written (POSIX time), if the backend says.
    pushed: float | None


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
    def __init__(self, location: Location, readonly: bool = False, trust: Trust | None = None) -> None:
        self.location = location
        self.readonly = readonly
        self.trust = trust if trust is not None else Trust()
        self._root_checked = False

    @classmethod
    def open(cls, spec: str, base: Path | None = None, readonly: bool = False,
             s3_endpoint: str | None = FROM_SETTINGS, trust: Trust | None = None) -> "RemoteCache":
        return cls(Location(spec, base, s3_endpoint), readonly, trust)

    @property
    def label(self) -> str:
        return self.location.label

    def takes_pushes(self, fingerprint: str) -> bool:
        """Whether a push of ``fingerprint`` would change the remote: not read-only, and no
        readable entry yet, or (with a signing key) one that no trusted key signed."""
        if self.readonly:
            return False
        entry = self.readable_entry(fingerprint)
        return entry is None or self._replaces(entry)

    def settled(self, fingerprint: str) -> bool:
        """Whether the remote holds ``fingerprint`` as this runner would leave it: a readable
        entry with every blob present, that a push would not replace. One entry read."""
        entry = self.readable_entry(fingerprint)
        return entry is not None and self._settles(entry)

    def _settles(self, entry: dict[str, Any]) -> bool:
        return not self._replaces(entry) and not self._missing_blobs(entry)

    def _replaces(self, entry: dict[str, Any]) -> bool:
        """Whether a push replaces ``entry``: this runner signs, and nobody it trusts signed it."""
        return self.trust.signing_key is not None and self.trust.distrust(entry) is not None

    # --- reading ------------------------------------------------------------------

    def entry(self, fingerprint: str) -> dict[str, Any] | None:
        """The entry of ``fingerprint`` as stored (``None`` when absent).
        Raises :class:`CorruptEntry` when it is not a well-formed entry, and
        :class:`RemoteError` when the remote's root is missing or unreachable."""
        # Every pull, check and push starts here: the one place to check the root.
        if not self._root_checked:
            self.location.check_root()
            self._root_checked = True
        try:
            raw = self.location.read(entry_key(fingerprint), limit=ENTRY_BYTES)
        except UnfitObject as error:
            raise CorruptEntry(f"{entry_key(fingerprint)} is not an entry of format {REMOTE_FORMAT} ({error})") from None
        if raw is None:
            return None
        try:
            entry = parse_json(raw)
        except UnreadableFile:
            entry = None
        if (
            not isinstance(entry, dict)
            or entry.get("format") != REMOTE_FORMAT
            or entry.get("fingerprint") != fingerprint
            or not isinstance(entry.get("files"), dict)
            or RECORD_FILE not in entry["files"]
        ):
            raise CorruptEntry(f"{entry_key(fingerprint)} is not an entry of format {REMOTE_FORMAT} for this fingerprint")
        problem = _files_problem(entry["files"])
        if problem:
            raise CorruptEntry(problem)
        return entry

    def entries(self) -> list[RemoteEntry]:
        """Every readable entry (corrupt ones are left out: a pull drops them), with
        the artifact named in its build record. One read per entry and per record."""
        if not self._root_checked:
            self.location.check_root()
            self._root_checked = True
        found = []
        for key, (_, pushed) in sorted(self.location.listing(f"{PREFIX}/entries").items()):
            fingerprint = key.rsplit("/", 1)[-1].removesuffix(".json")
            if not key.endswith(".json") or not is_digest(fingerprint):
                continue
            entry = self.readable_entry(fingerprint)
            if entry is None:
                continue
            artifact = None
            try:
                raw = self.location.read(blob_key(entry["files"][RECORD_FILE]["digest"]), limit=RECORD_BYTES)
            except UnfitObject:
                raw = None
            if raw is not None:
                try:
                    artifact = parse_record(raw, RECORD_FILE).artifact
                except RecordError:
                    pass
            size = sum(meta["size"] for meta in entry["files"].values())
            found.append(RemoteEntry(fingerprint, artifact, size, pushed))
        return found

    def described(self, fingerprint: str) -> tuple[BuildRecord | None, dict[str, Any] | None]:
        """The build record and the verification report of the remote build of
        ``fingerprint``, without its outputs: ``(None, None)`` when there is none. Each
        file is checked against the digest the entry gives it, and the record against the
        fingerprint (a corrupt entry is treated as absent here; a pull drops it). For
        reading only -- `doit diff` shows what a build was; nothing trusts it as verified."""
        entry = self.readable_entry(fingerprint)
        if entry is None:
            return None, None

        def blob(relative: str, limit: int) -> bytes | None:
            meta = entry["files"].get(relative)
            if meta is None:
                return None
            try:
                data = self.location.read(blob_key(meta["digest"]), limit=limit)
            except UnfitObject:
                return None
            return data if data is not None and digest_bytes(data) == meta["digest"] else None

        raw_record = blob(RECORD_FILE, RECORD_BYTES)
        try:
            record = parse_record(raw_record, RECORD_FILE) if raw_record is not None else None
        except RecordError:
            record = None
        if record is None or record.fingerprint != fingerprint or record.hashes_to() != fingerprint:
            return None, None
        raw_report = blob(REPORT_JSON, REPORT_BYTES)
        try:
            report = parse_json(raw_report) if raw_report is not None else None
        except UnreadableFile:
            report = None
        if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT or report.get("fingerprint") != fingerprint:
            report = None
        return record, report

    def has_entry(self, fingerprint: str) -> bool:
        """Whether a readable entry is there (one read; blobs not checked)."""
        return self.readable_entry(fingerprint) is not None

    def has(self, fingerprint: str) -> bool:
        """Whether a complete entry is there: readable, and every blob present at its size."""
        entry = self.readable_entry(fingerprint)
        return entry is not None and not self._missing_blobs(entry)

    def readable_entry(self, fingerprint: str) -> dict[str, Any] | None:
        """:meth:`entry`, with a corrupt entry taken as absent (a pull reports and drops it)."""
        try:
            return self.entry(fingerprint)
        except CorruptEntry:
            return None

    def pull(self, name: str, fingerprint: str, store: Store, target: Path, scratch_root: Path, log: Log,
             vouched_only: bool = False) -> BuildRecord | None:
        """Put the remote build of ``fingerprint`` into ``store`` and materialise it at
        ``target``, with its report only when a trusted key signed the entry. Returns the
        record; ``None`` when the remote has no such entry or the entry is corrupt (which
        is then reported and dropped). ``vouched_only``: an entry no trusted key signed
        is an :class:`UnvouchedEntry` error, and nothing is written."""
        scratch_root.mkdir(parents=True, exist_ok=True)
        # The artifact's scratch prefix: a pull killed half-way is cleaned up like a build.
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(name) + "pull~", dir=scratch_root))
        try:
            try:
                entry = self.entry(fingerprint)
                if entry is None:
                    return None
                distrust = self.trust.distrust(entry)
                if distrust is not None and vouched_only:
                    raise UnvouchedEntry(
                        f"{name}: the build of {fingerprint[:12]} in {self.label} is not taken as verified: {distrust}; "
                        "--pull-only takes only builds signed by a trusted key (sign pushes with EDGEBUILD_SIGNING_KEY, "
                        "or verify it here without --pull-only)"
                    )
                self._download(entry, fingerprint, scratch)
            except CorruptEntry as corrupt:
                log(f"remote cache: entry {fingerprint[:12]} is corrupt ({corrupt}); dropped, building instead")
                self._drop(fingerprint, corrupt.bad_blobs)
                return None
            store.put(fingerprint, scratch)
            if distrust is None:
                store.put_report(fingerprint, scratch)
            else:
                # A consistent build, but nobody trusted says it passed: its report is left
                # behind, and `doit verify` judges it here.
                store.mark_unvouched(fingerprint, f"pulled from {self.label}: {distrust}")
                log(f"remote cache: {fingerprint[:12]} is pulled as a build, not as verified ({distrust}); "
                    "verification judges it here")
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
            if not self.location.download(blob_key(meta["digest"]), path):
                raise CorruptEntry(f"{relative}: blob {meta['digest'][:12]} is missing")
            digest = file_digest(path)
            # Blobs live under their digest: bytes that hash to something else are a
            # bad blob whatever the entry says, while bytes that do hash to the key are
            # good, even if the entry states another size (then only the entry is bad).
            bad_blob = (meta["digest"],) if digest != meta["digest"] else ()
            size = path.stat().st_size
            if size != meta["size"]:
                raise CorruptEntry(f"{relative}: {size} bytes, expected {meta['size']}", bad_blob)
            if bad_blob:
                raise CorruptEntry(f"{relative}: digest {digest[:12]}, expected {meta['digest'][:12]}", bad_blob)
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
        ``False`` when the remote already holds a complete entry for it, or is read-only."""
        if self.readonly:
            log(f"remote cache: read-only, {fingerprint[:12]} not pushed to {self.label}")
            return False
        directory = store.entry_dir(fingerprint)
        record = store.record(fingerprint)
        if record is None:
            raise StoreError(f"store entry {fingerprint[:12]} is missing; nothing to push")
        changed = record.changed_outputs(directory)
        if changed:
            raise StoreError(
                f"store entry {fingerprint[:12]}: {', '.join(changed)} changed since build; not pushed to {self.label}"
            )
        existing = self.readable_entry(fingerprint)
        if existing is not None and self._settles(existing):
            log(f"remote cache: {fingerprint[:12]} already in {self.label}")
            return False
        replacing = existing is not None and self._replaces(existing)
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
        entry = self.trust.sign({"format": REMOTE_FORMAT, "fingerprint": fingerprint, "files": files})
        # Last, in one write: until it exists, nobody pulls a partial upload.
        self.location.write(entry_key(fingerprint), (canonical_json(entry) + "\n").encode())
        signed = f", signed by key {entry['signature']['key'][:16]}" if "signature" in entry else ""
        replaced = " (replacing an entry no trusted key signed)" if replacing else ""
        log(f"remote cache: pushed {fingerprint[:12]} to {self.label} ({len(files)} files{signed}){replaced}")
        return True

    def drop(self, fingerprint: str) -> None:
        """Remove the entry of ``fingerprint`` (its blobs stay: other entries may share
        them), so that the next push replaces it. Never on a read-only remote."""
        if not self.readonly:
            self.location.delete(entry_key(fingerprint))


def _files_problem(files: dict[str, Any]) -> str | None:
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
