"""The content-addressed store: every built artifact kept under its fingerprint.

``cache/store/<fp[:2]>/<fp>/`` holds the artifact's files and its build record
(and its report once verified). When a fingerprint is already stored, the
build restores it instead of exporting again: switching a parameter back, or
deleting ``build/``, costs a clone of the files, not an export.

Entries are clones of the built files (reflinks where the filesystem has
them, copies otherwise). A restore still re-checks every file against the
digests in the record and throws a mismatching entry away rather than serve it:
a store on disk can be damaged like anything else. Entries are written under
``cache/store/.tmp/`` and renamed into place, so a killed write leaves only a
temporary directory there, which ``gc`` removes.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from edgebuild.core.atomic import copy_file, new_directory, remove_directory
from edgebuild.errors import RecordError
from edgebuild.core.faults import fault_point
from edgebuild.core.record import RECORD_FILE, REPORT_FILES, BuildRecord, read_record

LAST_USED_FILE = ".last-used"
# Beside a build pulled from a remote cache whose entry no trusted key signed: where it
# came from and why it is not taken as verified. Removed once it is verified here.
UNVOUCHED_FILE = ".unvouched"
# Where entries are written before they are renamed into place, and removed from.
SCRATCH_DIR = ".tmp"


def clone_file(source: Path, target: Path) -> str:
    """Give ``target`` the content of ``source``: a reflink (copy-on-write clone) where
    the filesystem has them, an in-kernel copy otherwise.

    Not a hard link, although that would be cheaper: ``onnx.load`` refuses external
    data files with more than one link ("a potential hardlink attack"), so a
    hard-linked ``model.onnx.data`` is unusable for anyone who loads it with onnx.
    And a shared inode would let an in-place edit in ``build/`` change the store.
    """
    if hasattr(os, "copy_file_range"):
        try:
            with open(source, "rb") as reader, open(target, "wb") as writer:
                remaining = os.fstat(reader.fileno()).st_size
                while remaining > 0:
                    copied = os.copy_file_range(reader.fileno(), writer.fileno(), min(remaining, 1 << 30))
                    if copied == 0:
                        break
                    remaining -= copied
            if remaining <= 0:
                shutil.copystat(source, target)
                return "clone"
        except OSError:
            pass
    shutil.copy2(source, target)
    return "copy"


def materialise(source: Path, target: Path, scratch_root: Path, names: list[str]) -> None:
    """Make ``target`` a directory holding ``names`` from ``source``, atomically
    (cloned into a fresh directory beside it, then renamed into place)."""
    with new_directory(target, scratch_root) as scratch:
        for name in names:
            destination = scratch / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            clone_file(source / name, destination)


@dataclass(frozen=True)
class StoreEntry:
    fingerprint: str
    path: Path
    size: int
    last_used: float
    # The artifact whose build this is (from its record; ``None`` when unreadable).
    artifact: str | None = None


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry_dir(self, fingerprint: str) -> Path:
        return self.root / fingerprint[:2] / fingerprint

    @property
    def scratch_dir(self) -> Path:
        return self.root / SCRATCH_DIR

    def record(self, fingerprint: str) -> BuildRecord | None:
        """The record of the stored build of ``fingerprint``; ``None`` when there is none
        or it is unreadable (such an entry is never served)."""
        try:
            record = read_record(self.entry_dir(fingerprint))
        except RecordError:
            return None
        return record if record is not None and record.fingerprint == fingerprint else None

    def has(self, fingerprint: str) -> bool:
        return self.record(fingerprint) is not None

    def put(self, fingerprint: str, directory: Path) -> None:
        """Store the artifact directory ``directory`` (outputs + record) under ``fingerprint``.

        An entry appears whole or not at all; a second writer of the same
        fingerprint simply finds it there.
        """
        target = self.entry_dir(fingerprint)
        if target.exists():
            self.touch(fingerprint)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        with new_directory(target, self.scratch_dir, replace=False) as scratch:
            for path in sorted(directory.rglob("*")):
                if path.is_file() and path.name not in REPORT_FILES:
                    destination = scratch / path.relative_to(directory)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    clone_file(path, destination)
            (scratch / LAST_USED_FILE).write_text(f"{time.time()}\n")
            fault_point("store.before_rename")

    def put_report(self, fingerprint: str, directory: Path) -> None:
        """Keep the verification report beside the stored outputs (a report written
        here, or pulled under a trusted signature: the build is vouched for now)."""
        target = self.entry_dir(fingerprint)
        if not target.is_dir():
            return
        for name in REPORT_FILES:
            source = directory / name
            if source.is_file():
                copy_file(source, target / name)
        (target / UNVOUCHED_FILE).unlink(missing_ok=True)

    def mark_unvouched(self, fingerprint: str, why: str) -> None:
        """Say that the stored build of ``fingerprint`` was pulled and nobody trusted
        vouched for it (``why``): if it fails verification here, it is exported instead."""
        target = self.entry_dir(fingerprint)
        if target.is_dir():
            (target / UNVOUCHED_FILE).write_text(why + "\n")

    def unvouched(self, fingerprint: str) -> str | None:
        """Why the stored build of ``fingerprint`` is a pulled one nobody trusted vouched
        for; ``None`` when it was built or verified here, or signed by a trusted key."""
        try:
            return (self.entry_dir(fingerprint) / UNVOUCHED_FILE).read_text().strip() or "pulled, unsigned"
        except OSError:
            return None

    def has_report(self, fingerprint: str, verify_fingerprint: str) -> bool:
        """Whether the stored build of ``fingerprint`` keeps a report of ``verify_fingerprint``."""
        from edgebuild.core.report import read_report

        report = read_report(self.entry_dir(fingerprint))
        return report is not None and report.get("verify_fingerprint") == verify_fingerprint

    def restore(self, fingerprint: str, target: Path, scratch_root: Path) -> BuildRecord | None:
        """Materialise the stored entry at ``target``; ``None`` (and the entry dropped)
        when it is missing or any file fails its digest."""
        record = self.record(fingerprint)
        if record is None:
            return None
        entry = self.entry_dir(fingerprint)
        if record.changed_outputs(entry):
            self.remove(fingerprint)
            return None
        names = [*record.outputs, RECORD_FILE]
        names += [name for name in REPORT_FILES if (entry / name).is_file()]
        materialise(entry, target, scratch_root, names)
        self.touch(fingerprint)
        return record

    def touch(self, fingerprint: str) -> None:
        marker = self.entry_dir(fingerprint) / LAST_USED_FILE
        try:
            marker.write_text(f"{time.time()}\n")
        except OSError:
            pass

    def remove(self, fingerprint: str) -> None:
        # Renamed out of the way first: a removal killed half-way leaves a directory
        # under .tmp/ (which gc clears), never half an entry.
        remove_directory(self.entry_dir(fingerprint), self.scratch_dir)

    def remove_leftovers(self, older_than_seconds: float = 3600.0) -> int:
        """Remove what killed writes and removals left under ``.tmp/`` (only directories
        older than ``older_than_seconds``: a younger one may be a write in progress)."""
        removed = 0
        if self.scratch_dir.is_dir():
            now = time.time()
            for leftover in self.scratch_dir.iterdir():
                if now - leftover.stat().st_mtime > older_than_seconds:
                    shutil.rmtree(leftover, ignore_errors=True)
                    removed += 1
        return removed

    def entries(self) -> Iterator[StoreEntry]:
        if not self.root.is_dir():
            return
        for prefix in sorted(self.root.iterdir()):
            if not prefix.is_dir() or prefix.name.startswith("."):
                continue
            for entry in sorted(prefix.iterdir()):
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                size = sum(path.stat().st_size for path in entry.rglob("*") if path.is_file())
                try:
                    last_used = float((entry / LAST_USED_FILE).read_text())
                except (FileNotFoundError, ValueError):
                    last_used = entry.stat().st_mtime
                record = self.record(entry.name)
                yield StoreEntry(entry.name, entry, size, last_used, record.artifact if record is not None else None)

    def gc(self, max_bytes: int | None, max_age_seconds: float | None, keep: set[str], dry_run: bool = False) -> list[StoreEntry]:
        """Remove entries older than ``max_age_seconds``, then the least recently used
        until the store fits in ``max_bytes``. Fingerprints in ``keep`` (the current
        builds) are never removed."""
        now = time.time()
        entries = sorted(self.entries(), key=lambda entry: entry.last_used)
        removed = []
        remaining = []
        for entry in entries:
            if entry.fingerprint not in keep and max_age_seconds is not None and now - entry.last_used > max_age_seconds:
                removed.append(entry)
            else:
                remaining.append(entry)
        if max_bytes is not None:
            total = sum(entry.size for entry in remaining)
            for entry in list(remaining):
                if total <= max_bytes:
                    break
                if entry.fingerprint in keep:
                    continue
                remaining.remove(entry)
                removed.append(entry)
                total -= entry.size
        if not dry_run:
            for entry in removed:
                self.remove(entry.fingerprint)
        return removed
