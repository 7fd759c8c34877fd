"""The content-addressed store: every built artifact kept under its fingerprint.

``cache/store/<fp[:2]>/<fp>/`` holds the artifact's files and its build record
(and its report once verified). When a fingerprint is already stored, the
build restores it instead of exporting again: switching a parameter back, or
deleting ``build/``, costs a few links, not an export.

Entries are clones of the built files (reflinks where the filesystem has
them, copies otherwise). A restore still re-checks every file against the
digests in the record and throws a mismatching entry away rather than serve it:
a store on disk can be damaged like anything else.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .fingerprint import file_digest

STORE_FORMAT = 1
RECORD_FILE = ".edgebuild.json"
LAST_USED_FILE = ".last-used"
REPORT_FILES = ("report.json", "report.md")


def scratch_prefix(name: str) -> str:
    """Temporary directories of artifact ``name`` start with this. '~' never occurs in
    an artifact name, so one artifact's prefix never matches another's."""
    return f"{name}~"


def remove_leftovers(name: str, scratch_root: Path) -> None:
    """Remove temporary directories a killed build of ``name`` left behind.
    Only safe under the artifact's lock, which every writer of them holds."""
    if scratch_root.is_dir():
        for leftover in scratch_root.glob(f"{scratch_prefix(name)}*"):
            shutil.rmtree(leftover, ignore_errors=True)


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
    """Make ``target`` a directory holding ``names`` from ``source``, atomically.

    The files are cloned into a fresh directory beside the target, which is
    then renamed into place; an existing target is moved aside first.
    """
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(target.name), dir=scratch_root))
    try:
        for name in names:
            destination = scratch / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            clone_file(source / name, destination)
        replace_directory(scratch, target, scratch_root)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def replace_directory(new: Path, target: Path, scratch_root: Path) -> None:
    """Rename ``new`` to ``target``; an old ``target`` is moved aside first and removed after."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=scratch_prefix(target.name) + "old~", dir=scratch_root))
        os.rename(target, old / "content")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def changed_outputs(
    directory: Path,
    outputs: dict[str, dict[str, Any]],
    digest: Callable[[Path], str] | None = file_digest,
) -> list[str]:
    """The recorded outputs that are missing or whose size or digest no longer matches
    (empty when all match). ``digest=None`` compares sizes only (cheap); pass the stat
    cache's ``file_digest`` to skip files not written since they were last hashed."""
    changed = []
    for relative, meta in outputs.items():
        path = directory / relative
        if not path.is_file() or path.stat().st_size != meta["size"]:
            changed.append(relative)
        elif digest is not None and digest(path) != meta["digest"]:
            changed.append(relative)
    return changed


@dataclass(frozen=True)
class StoreEntry:
    fingerprint: str
    path: Path
    size: int
    last_used: float


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry_dir(self, fingerprint: str) -> Path:
        return self.root / fingerprint[:2] / fingerprint

    def record(self, fingerprint: str) -> dict[str, Any] | None:
        try:
            record = json.loads((self.entry_dir(fingerprint) / RECORD_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return record if record.get("fingerprint") == fingerprint else None

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
        scratch = Path(tempfile.mkdtemp(prefix=f".{fingerprint[:12]}.", dir=target.parent))
        try:
            for path in sorted(directory.rglob("*")):
                if path.is_file() and path.name not in REPORT_FILES:
                    destination = scratch / path.relative_to(directory)
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    clone_file(path, destination)
            (scratch / LAST_USED_FILE).write_text(f"{time.time()}\n")
            try:
                os.rename(scratch, target)
            except OSError:
                if not target.exists():
                    raise
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)

    def put_report(self, fingerprint: str, directory: Path) -> None:
        """Keep the verification report beside the stored outputs."""
        target = self.entry_dir(fingerprint)
        if not target.is_dir():
            return
        for name in REPORT_FILES:
            source = directory / name
            if source.is_file():
                temporary = target / f".{name}.{os.getpid()}.tmp"
                shutil.copy2(source, temporary)
                os.replace(temporary, target / name)

    def restore(self, fingerprint: str, target: Path, scratch_root: Path) -> dict[str, Any] | None:
        """Materialise the stored entry at ``target``; ``None`` (and the entry dropped)
        when it is missing or any file fails its digest."""
        record = self.record(fingerprint)
        if record is None:
            return None
        entry = self.entry_dir(fingerprint)
        if changed_outputs(entry, record.get("outputs", {})):
            self.remove(fingerprint)
            return None
        names = [*record.get("outputs", {}), RECORD_FILE]
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
        entry = self.entry_dir(fingerprint)
        if entry.exists():
            doomed = entry.with_name(f".{entry.name}.removing.{os.getpid()}")
            os.rename(entry, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def entries(self) -> Iterator[StoreEntry]:
        if not self.root.is_dir():
            return
        for prefix in sorted(self.root.iterdir()):
            if not prefix.is_dir():
                continue
            for entry in sorted(prefix.iterdir()):
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                size = sum(path.stat().st_size for path in entry.rglob("*") if path.is_file())
                try:
                    last_used = float((entry / LAST_USED_FILE).read_text())
                except (FileNotFoundError, ValueError):
                    last_used = entry.stat().st_mtime
                yield StoreEntry(entry.name, entry, size, last_used)

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
