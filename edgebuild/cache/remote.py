"""The remote cache: verified builds shared between CI runners and laptops.

Before building, an artifact whose fingerprint the remote holds is pulled
instead; after a build passes verification it is pushed. The layout under the
remote's root is the local store's (``entries.py``), content-addressed twice over::

    v1/entries/<fp[:2]>/<fp>.json     which files make up the build of <fp>
    v1/blobs/<d[:2]>/<d>              a file's bytes, under their blake3 digest

and the same code checks an entry and its blobs on both sides. Files live under their digest, not under the fingerprint, so two runners that
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
pull then downloads each blob the local store lacks into a scratch directory
beside the store and checks every file's size and digest against the entry, the entry's outputs against the build record, and the
record against the fingerprint it is filed under (its inputs must hash to it).
Anything that does not match is reported, dropped from the remote (so the next
push replaces it) and rebuilt; it is never used. Only then are the files renamed into the local
store's blobs (each pulled byte is written once locally) and cloned into
``build/``. Dropping removes the entry's
own key, and a blob only when its bytes do not hash to its digest (an entry
that merely lies about a blob must not delete it from the entries that share
it). Every key stays under the remote's root (:meth:`Location.path` refuses any
other), and under ``v1/entries/`` or ``v1/blobs/``. A push first checks the
local store entry against its record, so a file damaged locally is never
uploaded, and which blobs the remote lacks is asked in one batch (concurrent
requests on an object store).

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
from edgebuild.core.hashing import canonical_json, digest_bytes, is_digest
from edgebuild.core.record import RECORD_FILE, REPORT_FILES, BuildRecord, parse_record
from edgebuild.cache.entries import (
    CACHE_FORMAT, ENTRY_BYTES, PREFIX, CorruptEntry, blob_key, check_blob, entry_key, parse_entry,
)
from edgebuild.cache.location import FROM_SETTINGS, Location, UnfitObject
from edgebuild.core.files import RECORD_BYTES, REPORT_BYTES, UnreadableFile, parse_json, read_bytes
from edgebuild.core.report import REPORT_FORMAT, REPORT_JSON
from edgebuild.cache.signing import Trust
from edgebuild.cache.store import Store, damaged

REMOTE_FORMAT = CACHE_FORMAT

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


class RemoteCache:
    def __init__(self, location: Location, readonly: bool = False, trust: Trust | None = None) -> None:
        self.location = location
        self.readonly = readonly
        self.trust = trust if trust is not None else Trust()
        self._root_checked = False

    @classmethod
    def open(cls, spec: str, base: Path | None = None, readonly: bool = False,
             s3_endpoint: str | None = FROM_SETTINGS, trust: Trust | None = None,
             setting: str | None = None) -> "RemoteCache":
        """The remote cache at ``spec``; ``setting`` is what set it (``EDGEBUILD_REMOTE_CACHE``),
        named by every error about reaching it."""
        return cls(Location(spec, base, s3_endpoint, setting), readonly, trust)

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
        return parse_entry(raw, fingerprint)

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
        is an :class:`UnvouchedEntry` error, and nothing is written.

        Each blob the store lacks is downloaded once, into a scratch directory on the
        store's filesystem, checked, and renamed into the store; blobs the store holds
        already (a file another build shares) are not downloaded at all."""
        store.scratch_dir.mkdir(parents=True, exist_ok=True)
        # The artifact's scratch prefix: a pull killed half-way leaves a leftover gc removes.
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(name) + "pull~", dir=store.scratch_dir))
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
                files = self._download(entry, fingerprint, store, scratch, log)
            except CorruptEntry as corrupt:
                log(f"remote cache: entry {fingerprint[:12]} is corrupt ({corrupt}); dropped, building instead")
                self._drop(fingerprint, corrupt.bad_blobs)
                return None
            if distrust is not None:
                # A consistent build, but nobody trusted says it passed: its report is left
                # behind, and `doit verify` judges it here.
                files = {relative: meta for relative, meta in files.items() if relative not in REPORT_FILES}
            store.put_files(fingerprint, files, scratch)
            if distrust is None and REPORT_JSON in files:
                # Taken under this key's signature: it counts while the key is trusted here.
                store.mark_vouched(fingerprint, entry["signature"]["key"], self.label)
            if distrust is not None:
                store.mark_unvouched(fingerprint, f"pulled from {self.label}: {distrust}")
                log(f"remote cache: {fingerprint[:12]} is pulled as a build, not as verified ({distrust}); "
                    "verification judges it here")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        restored = store.restore(fingerprint, target, scratch_root, log)
        if restored is None:
            raise StoreError(f"{name}: the build pulled from {self.label} did not survive the local store's check")
        return restored

    def _download(self, entry: dict[str, Any], fingerprint: str, store: Store, scratch: Path,
                  log: Log) -> dict[str, dict[str, Any]]:
        """Download into ``scratch`` every file of ``entry`` whose blob the store lacks,
        check each, and check the record against the fingerprint. Returns the entry's
        files; those downloaded are in ``scratch``, the rest are the store's already. A
        damaged blob of the store is named through ``log``, removed and downloaded."""
        files: dict[str, dict[str, Any]] = entry["files"]
        for relative, meta in sorted(files.items()):
            path = scratch / relative
            stored = store.blob_path(meta["digest"])
            if stored.is_file():
                # Read, not written: a blob the store holds is checked and used. A bad one
                # (damaged on disk) is named, removed and downloaded like a missing one.
                try:
                    check_blob(stored, relative, meta)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    continue
                except CorruptEntry as corrupt:
                    stored.unlink(missing_ok=True)
                    log(damaged(store.root, f"the store's blob {meta['digest'][:12]}", corrupt,
                                "It was removed and is downloaded again"))
            try:
                downloaded = self.location.download(blob_key(meta["digest"]), path)
            except UnfitObject as error:
                # A FIFO, device or directory where a blob belongs: no bytes of any digest.
                raise CorruptEntry(f"{relative}: {error}", (meta["digest"],)) from None
            if not downloaded:
                raise CorruptEntry(f"{relative}: blob {meta['digest'][:12]} is missing")
            check_blob(path, relative, meta)
        record_path = scratch / RECORD_FILE
        if not record_path.is_file():
            record_path = store.blob_path(files[RECORD_FILE]["digest"])
        try:
            record = parse_record(read_bytes(record_path, RECORD_BYTES), RECORD_FILE)
        except UnreadableFile as error:
            raise CorruptEntry(f"{RECORD_FILE}: {error}") from None
        except (OSError, RecordError) as error:
            raise CorruptEntry(str(error)) from None
        hashes_to = record.hashes_to()
        if record.fingerprint != fingerprint or hashes_to != fingerprint:
            raise CorruptEntry(f"{RECORD_FILE} describes fingerprint {hashes_to[:12]}, not {fingerprint[:12]}")
        outputs = {relative: meta for relative, meta in files.items() if relative not in (RECORD_FILE, *REPORT_FILES)}
        if record.to_json(only=("outputs",))["outputs"] != outputs:
            raise CorruptEntry(f"the files listed do not match the outputs in {RECORD_FILE}")
        return files

    def _missing_blobs(self, entry: dict[str, Any]) -> list[str]:
        """The files of ``entry`` whose blob the remote lacks (or holds at another size):
        one batch of size requests, not one round trip after another."""
        files = entry["files"]
        sizes = self.location.sizes([blob_key(meta["digest"]) for meta in files.values()])
        return [relative for relative, meta in files.items() if sizes[blob_key(meta["digest"])] != meta["size"]]

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
        stored = store.entry(fingerprint)
        if stored is None or store.record(fingerprint) is None:
            raise StoreError(f"store entry {fingerprint[:12]} is missing; nothing to push")
        files: dict[str, dict[str, Any]] = stored["files"]
        changed = []
        for relative, meta in sorted(files.items()):
            try:
                check_blob(store.blob_path(meta["digest"]), relative, meta)
            except CorruptEntry:
                changed.append(relative)
        if changed:
            raise StoreError(
                f"store entry {fingerprint[:12]}: {', '.join(changed)} changed since build; not pushed to {self.label}"
            )
        existing = self.readable_entry(fingerprint)
        if existing is not None and self._settles(existing):
            log(f"remote cache: {fingerprint[:12]} already in {self.label}")
            return False
        replacing = existing is not None and self._replaces(existing)
        keys = {relative: blob_key(meta["digest"]) for relative, meta in files.items()}
        present = self.location.sizes(list(keys.values()))
        uploaded = []
        for relative, meta in sorted(files.items()):
            if present[keys[relative]] == meta["size"] or keys[relative] in uploaded:
                continue
            self.location.upload(store.blob_path(meta["digest"]), keys[relative])
            uploaded.append(keys[relative])
        after = self.location.sizes(uploaded)
        for relative, meta in sorted(files.items()):
            if keys[relative] in after and after[keys[relative]] != meta["size"]:
                raise RemoteError(f"{self.location.where(keys[relative])}: uploaded {relative} but found "
                                  f"{after[keys[relative]]} bytes, expected {meta['size']}")
        entry = self.trust.sign({"format": REMOTE_FORMAT, "fingerprint": fingerprint, "files": dict(files)})
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
