"""The local store: every built artifact kept under its fingerprint.

When a fingerprint is already stored, the build restores it instead of
exporting again: switching a parameter back, or deleting ``build/``, costs a
clone of the files, not an export.

The layout is the remote cache's (``entries.py``), under ``cache/store/``:
entries by fingerprint, blobs by digest, so a file two builds share (a config,
the same weights behind two fingerprints) is stored once, and ``gc`` removes an
entry and then every blob no remaining entry reaches. Beside an entry,
``<fp>.unvouched`` says it was pulled and no trusted key vouched for it; the
entry file's modification time is when it was last used. ``<fp>.vouched`` names the
key whose signature a pulled entry's report was taken under (its id, and the remote it
came from): the report counts only while that key is still trusted here, and the note
goes once the build is verified here. ``<fp>.rejected``, where
no entry is, says the build of that fingerprint was refused by its target's tool
(:class:`~edgebuild.errors.BuildRejected`), and why: it is not tried again.
``failed/<fp>.json`` is the report of the latest failed verification of that build (the
latest 64 builds' kept), for ``doit diff`` to show; it is no part of any entry.

A blob is written once: a build's file is copied into it (a reflink where the
filesystem has them, else written past the page cache: ``copying.py``), a pulled
file is renamed into it from the pull's scratch. Writes go to ``cache/store/.tmp/`` and are
renamed into place (the blobs first, the entry last), so a killed write leaves
a temporary file there, which ``gc`` removes, and never an entry whose files
are not all there. A restore re-checks every blob against its digest and drops
an entry with a bad one rather than serve it: a store on disk can be damaged
like anything else.

The store's earlier layout (``cache/store/<fp[:2]>/<fp>/``, a directory
of files per fingerprint) is moved into this layout the first time a command
opens the store: its files are renamed into blobs, nothing is copied.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from edgebuild.cache.copying import copy_file
from edgebuild.cache.entries import (
    CACHE_FORMAT, ENTRY_BYTES, ENTRY_SUFFIX, PREFIX, CorruptEntry, blob_key, check_blob, entry_key, parse_entry,
)
from edgebuild.core.atomic import new_directory, write_text
from edgebuild.core.faults import fault_point
from edgebuild.core.files import (
    RECORD_BYTES, SMALL_BYTES, NotRegular, UnreadableFile, read_bytes, read_text, regular_file_below, regular_tree,
)
from edgebuild.core.hashing import canonical_json, digest_bytes, file_digest, is_digest
from edgebuild.errors import RecordError, StoreError
from edgebuild.core.record import DERIVED_FILES, RECORD_FILE, REPORT_FILES, BuildRecord, parse_record
from edgebuild.core.report import read_report_file, report_passed

# Beside an entry pulled from a remote cache that no trusted key signed: where it came
# from and why it is not taken as verified. Removed once it is verified here.
UNVOUCHED_SUFFIX = ".unvouched"
REJECTED_SUFFIX = ".rejected"
# Beside an entry whose report was pulled under a trusted signature: which key, from where.
VOUCHED_SUFFIX = ".vouched"
# Where blobs and entries are written before they are renamed into place, and removed from.
SCRATCH_DIR = ".tmp"
# The reports of the latest failed verifications, one per fingerprint, outside every entry.
FAILED_DIR = "failed"
FAILED_REPORTS_KEPT = 64
# A blob no entry reaches is kept this long: a build that found it present may be
# about to write the entry that names it.
UNREACHED_BLOB_GRACE_SECONDS = 3600.0
# The earlier layout: cache/store/<fp[:2]>/<fp>/<files>, with these markers.
_LEGACY_LAST_USED = ".last-used"
_LEGACY_UNVOUCHED = ".unvouched"


def materialise(sources: dict[str, Path], target: Path, scratch_root: Path) -> None:
    """Make ``target`` a directory holding each relative name in ``sources`` with the
    content of its path there, atomically (cloned into a fresh directory beside it,
    then renamed into place)."""
    with new_directory(target, scratch_root) as scratch:
        for name, source in sources.items():
            destination = scratch / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            copy_file(source, destination)



def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def damaged(root: Path, what: str, corrupt: CorruptEntry, done: str) -> str:
    """What a command says of something of the store under ``root`` it found damaged."""
    return (f"warning: {what} is damaged ({corrupt}); stored files do not change by themselves: check the disk under "
            f"{root}, and who else writes there. {done}")


@dataclass(frozen=True)
class StoreEntry:
    fingerprint: str
    # Every file of the build (record and reports included), shared blobs counted in full.
    size: int
    last_used: float
    # The artifact whose build this is (from its record; ``None`` when unreadable).
    artifact: str | None = None
    # The digests of its blobs, each with its size.
    blobs: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class GcResult:
    removed: list[StoreEntry]
    # What the removal gives back: blobs no remaining entry reaches, once each.
    freed_bytes: int
    # Blobs no entry reached (left by an interrupted write or a rejected pull), removed too.
    unreached_blobs: int


class Store:
    def __init__(self, root: Path, log: Callable[[str], None] | None = None) -> None:
        self.root = root
        # Where the move from the old layout says what it dropped: it runs on whatever
        # first touches the store, which may pass no log of its own (stderr then).
        self.log = log if log is not None else _warn
        self._migrated = False
        # Inside :meth:`listed`: each entry directory's names, listed once (``None``: not listable).
        self._listings: dict[str, frozenset[str] | None] | None = None

    # --- layout -------------------------------------------------------------------

    def entry_path(self, fingerprint: str) -> Path:
        return self.root / entry_key(fingerprint)

    def blob_path(self, digest: str) -> Path:
        return self.root / blob_key(digest)

    @property
    def scratch_dir(self) -> Path:
        return self.root / SCRATCH_DIR

    def _unvouched_path(self, fingerprint: str) -> Path:
        return self.entry_path(fingerprint).with_suffix(UNVOUCHED_SUFFIX)

    def _rejected_path(self, fingerprint: str) -> Path:
        return self.entry_path(fingerprint).with_suffix(REJECTED_SUFFIX)

    def _vouched_path(self, fingerprint: str) -> Path:
        return self.entry_path(fingerprint).with_suffix(VOUCHED_SUFFIX)

    # --- reading ------------------------------------------------------------------

    @contextmanager
    def listed(self) -> Iterator[None]:
        """Inside, an entry or refusal note that the listing of its directory (made the first
        time one of its fingerprints is asked for) does not show is absent, without a look-up
        of its own: for a report over many artifacts (``doit status``), most of them not in
        the store, where two failed opens an artifact were a tenth of the time. What is
        listed is read as usual; what appears after its directory was listed is not seen."""
        self._listings = {}
        try:
            yield
        finally:
            self._listings = None

    def _unlisted(self, fingerprint: str, suffix: str) -> bool:
        """Whether :meth:`listed` is on and its listing shows no ``<fingerprint><suffix>``."""
        if self._listings is None:
            return False
        prefix = fingerprint[:2]
        if prefix not in self._listings:
            try:
                self._listings[prefix] = frozenset(os.listdir(self.entry_path(fingerprint).parent))
            except FileNotFoundError:
                self._listings[prefix] = frozenset()
            except OSError:
                # Not listable (not a directory, no permission): each look-up finds out for itself.
                self._listings[prefix] = None
        names = self._listings[prefix]
        return names is not None and f"{fingerprint}{suffix}" not in names

    def entry(self, fingerprint: str) -> dict[str, Any] | None:
        """The entry of ``fingerprint`` (``None`` when there is none, or it is not a
        well-formed entry: such an entry is never served). Blobs are not checked here."""
        try:
            return self._read_entry(fingerprint)
        except CorruptEntry:
            return None

    def _read_entry(self, fingerprint: str) -> dict[str, Any] | None:
        """The entry of ``fingerprint``; ``None`` when there is none; :class:`CorruptEntry`
        for one that cannot be read or is not a well-formed entry of this fingerprint."""
        self._migrate_legacy()
        if self._unlisted(fingerprint, ENTRY_SUFFIX):
            return None
        path = self.entry_path(fingerprint)
        try:
            raw = read_bytes(path, ENTRY_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UnreadableFile as error:
            raise CorruptEntry(f"{entry_key(fingerprint)}: {error}") from None
        except OSError as error:
            raise CorruptEntry(f"{entry_key(fingerprint)}: cannot read it ({error.strerror or error})") from None
        return parse_entry(raw, fingerprint)

    def files(self, fingerprint: str) -> dict[str, Path]:
        """Each file of the stored build of ``fingerprint`` and the blob holding it
        (empty when there is none). The blobs are not checked: :meth:`restore` does."""
        entry = self.entry(fingerprint)
        if entry is None:
            return {}
        return {relative: self.blob_path(meta["digest"]) for relative, meta in entry["files"].items()}

    def record(self, fingerprint: str) -> BuildRecord | None:
        """The record of the stored build of ``fingerprint``; ``None`` when there is none
        or it is unreadable or not this fingerprint's (such an entry is never served)."""
        entry = self.entry(fingerprint)
        if entry is None:
            return None
        return self._record_of(entry, fingerprint)

    def _record_of(self, entry: dict[str, Any], fingerprint: str) -> BuildRecord | None:
        try:
            return self._read_record(entry, fingerprint)
        except CorruptEntry:
            return None

    def _read_record(self, entry: dict[str, Any], fingerprint: str) -> BuildRecord:
        """The record ``entry`` names; :class:`CorruptEntry` when its blob is missing, not
        at its size, not a record, or the record of another fingerprint."""
        meta = entry["files"][RECORD_FILE]
        path = self.blob_path(meta["digest"])

        def bad(problem: str) -> CorruptEntry:
            # The blob is bad for every entry only when its bytes are not what its name says.
            try:
                wrong = digest_bytes(read_bytes(path, RECORD_BYTES)) != meta["digest"]
            except (OSError, UnreadableFile):
                wrong = os.path.lexists(path)
            return CorruptEntry(f"{RECORD_FILE}: {problem}", (meta["digest"],) if wrong else ())

        try:
            if meta["size"] > RECORD_BYTES:
                raise CorruptEntry(f"{RECORD_FILE}: {meta['size']} bytes, more than a record may hold")
            raw = read_bytes(path, RECORD_BYTES)
        except FileNotFoundError:
            raise CorruptEntry(f"{RECORD_FILE}: blob {meta['digest'][:12]} is missing") from None
        except UnreadableFile as error:
            raise bad(str(error)) from None
        except OSError as error:
            raise CorruptEntry(f"{RECORD_FILE}: cannot read it ({error.strerror or error})") from None
        if len(raw) != meta["size"]:
            raise bad(f"{len(raw)} bytes, expected {meta['size']}")
        try:
            record = parse_record(raw, RECORD_FILE)
        except RecordError as error:
            raise bad(str(error).removeprefix(f"{RECORD_FILE}: ")) from None
        if record.fingerprint != fingerprint:
            raise CorruptEntry(f"{RECORD_FILE} is the record of fingerprint {record.fingerprint[:12]}")
        return record

    def has(self, fingerprint: str) -> bool:
        return self.record(fingerprint) is not None

    def report(self, fingerprint: str) -> dict[str, Any] | None:
        """The verification report kept with the stored build of ``fingerprint``."""
        from edgebuild.core.report import REPORT_JSON, read_report_file

        path = self.files(fingerprint).get(REPORT_JSON)
        return read_report_file(path) if path is not None else None

    def has_report(self, fingerprint: str, verify_fingerprint: str) -> bool:
        """Whether the stored build of ``fingerprint`` keeps a report of ``verify_fingerprint``."""
        report = self.report(fingerprint)
        return report is not None and report.get("verify_fingerprint") == verify_fingerprint

    def unvouched(self, fingerprint: str) -> str | None:
        """Why the stored build of ``fingerprint`` is a pulled one nobody trusted vouched
        for; ``None`` when it was built or verified here, or signed by a trusted key."""
        path = self._unvouched_path(fingerprint)
        try:
            return read_text(path, SMALL_BYTES).strip() or "pulled, unsigned"
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnreadableFile, UnicodeDecodeError):
            # There, but not a note of ours: still not vouched for (never trusted by accident).
            return "pulled, unsigned" if os.path.lexists(path) else None

    def vouched_by(self, fingerprint: str) -> dict[str, str] | None:
        """``{"key", "from"}`` when the report of the stored build of ``fingerprint`` was
        pulled under the signature of that key (:meth:`mark_vouched`); ``None`` when it
        was judged here, or no report came with it. A note that cannot be read names no
        key any list holds, so the report is judged again rather than taken."""
        if self._unlisted(fingerprint, VOUCHED_SUFFIX):
            return None
        path = self._vouched_path(fingerprint)
        try:
            note = json.loads(read_text(path, SMALL_BYTES))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnreadableFile, UnicodeDecodeError, ValueError):
            return {"key": "(unreadable)", "from": "a remote cache"} if os.path.lexists(path) else None
        if not (isinstance(note, dict) and isinstance(note.get("key"), str) and isinstance(note.get("from"), str)):
            return {"key": "(unreadable)", "from": "a remote cache"}
        return {"key": note["key"], "from": note["from"]}

    def rejection(self, fingerprint: str) -> dict[str, Any] | None:
        """``{"message", "at"}`` when the build of ``fingerprint`` was refused by its
        target's tool (:meth:`remember_rejection`); ``None`` otherwise, or when the note
        cannot be read (then the build is simply tried)."""
        if self._unlisted(fingerprint, REJECTED_SUFFIX):
            return None
        try:
            note = json.loads(read_text(self._rejected_path(fingerprint), SMALL_BYTES * 4))
        except (OSError, UnreadableFile, UnicodeDecodeError, ValueError):
            return None
        return note if isinstance(note, dict) and isinstance(note.get("message"), str) else None

    # --- writing ------------------------------------------------------------------

    def remember_rejection(self, fingerprint: str, message: str) -> None:
        """Keep why the build of ``fingerprint`` was refused (the first lines of the
        message), so that it is not tried again while the fingerprint is the same."""
        path = self._rejected_path(fingerprint)
        path.parent.mkdir(parents=True, exist_ok=True)
        note = {"message": message[:SMALL_BYTES * 3], "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        write_text(path, json.dumps(note, sort_keys=True) + "\n")

    def forget_rejection(self, fingerprint: str) -> None:
        self._rejected_path(fingerprint).unlink(missing_ok=True)

    def keep_failed_report(self, fingerprint: str, report: Path) -> None:
        """Keep the report of a verification of the build of ``fingerprint`` that failed
        (``report``, as it was written), under ``failed/``: ``doit diff`` shows a failed
        build's checks from it. The latest :data:`FAILED_REPORTS_KEPT` are kept. It is no
        part of any entry: nothing that asks whether a build is verified (its state, a
        push, a publish, a fetch) reads it. A report that passed is not kept here."""
        found = read_report_file(report)
        if not is_digest(fingerprint) or found is None or found.get("fingerprint") != fingerprint \
                or report_passed(found):
            return
        directory = self.root / FAILED_DIR
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / f"{fingerprint}.json", json.dumps(found, sort_keys=True) + "\n")
        kept = []
        for path in directory.glob("*.json"):
            try:
                kept.append((path.stat().st_mtime, path.name, path))
            except FileNotFoundError:
                continue
        for _, _, path in sorted(kept, reverse=True)[FAILED_REPORTS_KEPT:]:
            path.unlink(missing_ok=True)

    def failed_report(self, fingerprint: str) -> dict[str, Any] | None:
        """The report of the latest failed verification of the build of ``fingerprint``
        kept by :meth:`keep_failed_report`; ``None`` when none is, or what is there is not
        a failed report of that build."""
        if not is_digest(fingerprint):
            return None
        found = read_report_file(self.root / FAILED_DIR / f"{fingerprint}.json")
        if found is None or found.get("fingerprint") != fingerprint or report_passed(found):
            return None
        return found

    def put(self, fingerprint: str, directory: Path) -> None:
        """Store the artifact directory ``directory`` (outputs + record, not its report)
        under ``fingerprint``. The entry appears whole or not at all; a second writer of
        the same fingerprint simply finds it there."""
        self._migrate_legacy()
        if self.entry(fingerprint) is not None:
            self.touch(fingerprint)
            return
        try:
            # The build hashed its outputs as it wrote them: not hashed again here (a
            # restore checks every blob before it serves one).
            record = parse_record(read_bytes(directory / RECORD_FILE, RECORD_BYTES), RECORD_FILE)
            known = record.to_json(only=("outputs",))["outputs"]
        except (OSError, UnreadableFile, RecordError):
            known = {}
        try:
            listed = regular_tree(directory)
        except NotRegular as found:
            raise StoreError(f"{directory / found.relative}: {found}; a build's outputs are regular files inside its "
                             "directory, and only those are stored") from None
        files = {}
        for relative in listed:
            if Path(relative).name not in REPORT_FILES and relative not in DERIVED_FILES:
                files[relative] = self.add_blob(directory / relative, known.get(relative))
        fault_point("store.before_rename")
        self._write_entry(fingerprint, files)

    def put_files(self, fingerprint: str, files: dict[str, dict[str, Any]], directory: Path) -> None:
        """Store under ``fingerprint`` the files of ``directory`` named in ``files`` (a
        checked entry's ``files``: the digests are known to be right), renaming each into
        its blob: a pulled file is written once."""
        self._migrate_legacy()
        for relative, meta in files.items():
            if (directory / relative).is_file():
                self.add_blob(directory / relative, meta, move=True)
            # Otherwise the store held the blob already (and a restore finds out if it
            # is gone since).
        self._write_entry(fingerprint, files)

    def put_report(self, fingerprint: str, directory: Path) -> None:
        """Keep the verification report beside the stored outputs (a report written
        here, or pulled under a trusted signature: the build is vouched for now)."""
        entry = self.entry(fingerprint)
        if entry is None:
            return
        files = dict(entry["files"])
        # The record too: it seals the report's digest now (verification.py).
        for name in (*REPORT_FILES, RECORD_FILE):
            if regular_file_below(directory, name) is not None:
                files[name] = self.add_blob(directory / name)
        self._write_entry(fingerprint, files)
        self._unvouched_path(fingerprint).unlink(missing_ok=True)
        self._vouched_path(fingerprint).unlink(missing_ok=True)

    def mark_vouched(self, fingerprint: str, key: str, source: str) -> None:
        """Say that the stored build of ``fingerprint`` came with a report signed by
        ``key`` (its id) at ``source``: the report counts only while that key is trusted."""
        if self.entry_path(fingerprint).is_file():
            write_text(self._vouched_path(fingerprint), json.dumps({"key": key, "from": source}, sort_keys=True) + "\n")

    def mark_unvouched(self, fingerprint: str, why: str) -> None:
        """Say that the stored build of ``fingerprint`` was pulled and nobody trusted
        vouched for it (``why``): if it fails verification here, it is exported instead."""
        if self.entry_path(fingerprint).is_file():
            self._unvouched_path(fingerprint).write_text(why + "\n")

    def add_blob(self, source: Path, meta: dict[str, Any] | None = None, move: bool = False) -> dict[str, Any]:
        """Put the bytes of ``source`` into the store under their digest and return the
        file's ``{"size", "digest"}``. ``meta``: that, known already. ``move``: rename
        ``source`` into place (it is on this filesystem and may be consumed) instead of
        cloning it. A blob already there is not written again."""
        if meta is None:
            meta = {"size": source.stat().st_size, "digest": file_digest(source)}
        blob = self.blob_path(meta["digest"])
        try:
            if blob.stat().st_size == meta["size"]:
                # Used again now: gc's grace for unreached blobs counts from here.
                os.utime(blob)
                return meta
        except FileNotFoundError:
            pass
        blob.parent.mkdir(parents=True, exist_ok=True)
        if move:
            try:
                os.replace(source, blob)
                return meta
            except OSError as error:
                if error.errno != errno.EXDEV:
                    raise
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="blob~", dir=self.scratch_dir)
        os.close(handle)
        try:
            copy_file(source, Path(name), cold=True)
            os.replace(name, blob)
        finally:
            Path(name).unlink(missing_ok=True)
        return meta

    def _write_entry(self, fingerprint: str, files: dict[str, dict[str, Any]]) -> None:
        entry = {"format": CACHE_FORMAT, "fingerprint": fingerprint, "files": dict(sorted(files.items()))}
        path = self.entry_path(fingerprint)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="entry~", dir=self.scratch_dir)
        try:
            with os.fdopen(handle, "w") as writer:
                writer.write(canonical_json(entry) + "\n")
            os.replace(name, path)
        finally:
            Path(name).unlink(missing_ok=True)

    def restore(self, fingerprint: str, target: Path, scratch_root: Path,
                log: Callable[[str], None] | None = None) -> BuildRecord | None:
        """Materialise the stored entry at ``target``; ``None`` when there is none. A
        damaged one -- an entry that does not parse, a record or blob that is missing or
        does not hold its bytes -- is dropped (with its bad blobs) and ``None`` returned,
        after ``log`` says so: stored bytes do not change by themselves, so it is a failing
        disk or someone writing the store, and the user hears of it."""
        try:
            entry = self._read_entry(fingerprint)
            if entry is None:
                return None
            record = self._read_record(entry, fingerprint)
            outputs = record.to_json(only=("outputs",))["outputs"]
            files = entry["files"]
            if any(files.get(relative) != meta for relative, meta in outputs.items()):
                raise CorruptEntry("the files listed do not match the outputs in the record")
            for relative, meta in files.items():
                check_blob(self.blob_path(meta["digest"]), relative, meta)
        except CorruptEntry as corrupt:
            self.remove(fingerprint)
            for digest in corrupt.bad_blobs:
                self.blob_path(digest).unlink(missing_ok=True)
            if log is not None:
                log(damaged(self.root, f"the store's build of {fingerprint[:12]}", corrupt, "It was dropped"))
            return None
        materialise({relative: self.blob_path(meta["digest"]) for relative, meta in files.items()}, target, scratch_root)
        self.touch(fingerprint)
        return record

    def touch(self, fingerprint: str) -> None:
        try:
            os.utime(self.entry_path(fingerprint))
        except OSError:
            pass

    def remove(self, fingerprint: str) -> None:
        """Remove the entry of ``fingerprint``; its blobs stay until ``gc`` finds no
        entry reaching them (other entries may share them)."""
        self.entry_path(fingerprint).unlink(missing_ok=True)
        self._unvouched_path(fingerprint).unlink(missing_ok=True)
        self._vouched_path(fingerprint).unlink(missing_ok=True)

    def remove_leftovers(self, older_than_seconds: float = 3600.0) -> int:
        """Remove what killed writes and removals left under ``.tmp/`` (only what is
        older than ``older_than_seconds``: a younger one may be a write in progress)."""
        removed = 0
        if self.scratch_dir.is_dir():
            now = time.time()
            for leftover in self.scratch_dir.iterdir():
                if now - leftover.lstat().st_mtime > older_than_seconds:
                    if leftover.is_dir() and not leftover.is_symlink():
                        shutil.rmtree(leftover, ignore_errors=True)
                    else:
                        leftover.unlink(missing_ok=True)
                    removed += 1
        return removed

    # --- listing and gc -----------------------------------------------------------

    def entries(self) -> Iterator[StoreEntry]:
        self._migrate_legacy()
        directory = self.root / PREFIX / "entries"
        if not directory.is_dir():
            return
        for path in sorted(directory.glob("*/*.json")):
            fingerprint = path.stem
            entry = self.entry(fingerprint)
            if entry is None:
                continue
            try:
                last_used = path.stat().st_mtime
            except FileNotFoundError:
                continue
            record = self._record_of(entry, fingerprint)
            blobs = tuple(sorted({(meta["digest"], meta["size"]) for meta in entry["files"].values()}))
            yield StoreEntry(fingerprint, sum(meta["size"] for meta in entry["files"].values()), last_used,
                             record.artifact if record is not None else None, blobs)

    def blobs(self) -> dict[str, tuple[int, float]]:
        """Every blob: digest -> (size, modification time)."""
        found = {}
        directory = self.root / PREFIX / "blobs"
        if directory.is_dir():
            for path in directory.glob("*/*"):
                try:
                    status = path.stat()
                except FileNotFoundError:
                    continue
                found[path.name] = (status.st_size, status.st_mtime)
        return found

    def size(self) -> int:
        """The bytes the store's blobs take (each once, however many entries share it)."""
        return sum(size for size, _ in self.blobs().values())

    def gc(self, max_bytes: int | None, max_age_seconds: float | None, keep: set[str], dry_run: bool = False,
           unreached_grace_seconds: float = UNREACHED_BLOB_GRACE_SECONDS) -> GcResult:
        """Remove entries older than ``max_age_seconds``, then the least recently used
        until the store fits in ``max_bytes``, then every blob no remaining entry reaches.
        Fingerprints in ``keep`` (the current builds) are never removed. A blob shared
        with a remaining entry frees nothing, so the size counts each blob once."""
        now = time.time()
        entries = sorted(self.entries(), key=lambda entry: entry.last_used)
        blobs = self.blobs()
        references: dict[str, int] = {}
        for entry in entries:
            for digest, _ in entry.blobs:
                references[digest] = references.get(digest, 0) + 1
        total = sum(size for size, _ in blobs.values())
        removed: list[StoreEntry] = []
        freed = 0

        def drop(entry: StoreEntry) -> None:
            nonlocal total, freed
            removed.append(entry)
            for digest, size in entry.blobs:
                references[digest] -= 1
                if references[digest] == 0 and digest in blobs:
                    total -= size
                    freed += size

        for entry in entries:
            if entry.fingerprint in keep:
                continue
            if max_age_seconds is not None and now - entry.last_used > max_age_seconds:
                drop(entry)
            elif max_bytes is not None and total > max_bytes:
                drop(entry)
        unreached = [
            digest for digest, (_, modified) in blobs.items()
            if digest not in references and now - modified > unreached_grace_seconds
        ]
        if not dry_run:
            for entry in removed:
                self.remove(entry.fingerprint)
            for digest, count in references.items():
                if count == 0:
                    self.blob_path(digest).unlink(missing_ok=True)
            for digest in unreached:
                self.blob_path(digest).unlink(missing_ok=True)
        return GcResult(removed, freed, len(unreached))

    # --- the earlier layout --------------------------------------------------------

    def _migrate_legacy(self) -> None:
        """Move entries of the old layout (``<fp[:2]>/<fp>/``, one directory of files per
        fingerprint) into this one, once per process: each directory is claimed by a
        rename into ``.tmp/`` (of two processes, one migrates it), its intact files are
        renamed into blobs, and a damaged one is dropped."""
        if self._migrated:
            return
        self._migrated = True
        try:
            prefixes = [path for path in self.root.iterdir()
                        if len(path.name) == 2 and all(c in "0123456789abcdef" for c in path.name) and path.is_dir()]
        except OSError:
            return
        for prefix in prefixes:
            for old in list(prefix.iterdir()):
                self.scratch_dir.mkdir(parents=True, exist_ok=True)
                claimed = Path(tempfile.mkdtemp(prefix="legacy~", dir=self.scratch_dir)) / "entry"
                try:
                    os.rename(old, claimed)
                except OSError:
                    continue
                try:
                    self._adopt_legacy(old.name, claimed)
                except CorruptEntry as corrupt:
                    self.log(damaged(self.root, f"the store's build of {old.name[:12]} (old layout)", corrupt,
                                     "It was dropped in the move to the new layout"))
                finally:
                    shutil.rmtree(claimed.parent, ignore_errors=True)
            try:
                prefix.rmdir()
            except OSError:
                pass

    def _adopt_legacy(self, fingerprint: str, directory: Path) -> None:
        """Move the old layout's entry in ``directory`` in; :class:`CorruptEntry` (nothing
        moved) for one whose record cannot be read, is of another fingerprint, or lists
        outputs that are missing or hold other bytes."""
        try:
            record = parse_record(read_bytes(directory / RECORD_FILE, RECORD_BYTES), RECORD_FILE)
        except UnreadableFile as error:
            raise CorruptEntry(f"{RECORD_FILE}: {error}") from None
        except (OSError, RecordError) as error:
            raise CorruptEntry(str(error)) from None
        if record.fingerprint != fingerprint:
            raise CorruptEntry(f"{RECORD_FILE} describes fingerprint {record.fingerprint[:12]}, not {fingerprint[:12]}")
        changed = record.changed_outputs(directory)
        if changed:
            raise CorruptEntry(f"{', '.join(changed)} missing or changed since the build")
        outputs = record.to_json(only=("outputs",))["outputs"]
        files = {}
        for relative, meta in outputs.items():
            files[relative] = self.add_blob(directory / relative, meta, move=True)
        for name in (RECORD_FILE, *REPORT_FILES):
            if (directory / name).is_file():
                files[name] = self.add_blob(directory / name, move=True)
        self._write_entry(fingerprint, files)
        try:
            last_used = float(read_text(directory / _LEGACY_LAST_USED, SMALL_BYTES))
            os.utime(self.entry_path(fingerprint), (last_used, last_used))
        except (OSError, UnreadableFile, ValueError):
            pass
        try:
            why = read_text(directory / _LEGACY_UNVOUCHED, SMALL_BYTES)
        except FileNotFoundError:
            return
        except (OSError, UnreadableFile):
            why = "pulled, unsigned\n"
        self._unvouched_path(fingerprint).write_text(why)
