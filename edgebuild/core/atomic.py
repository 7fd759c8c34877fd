"""Atomic writes: a reader sees the old content or the new, never half of either
(write beside the target, then rename over it).

Every writer in edgebuild goes through here (reports, the lock file, the stat
cache, the store, build directories, fixtures), so a killed process leaves at
most a temporary name that the next writer of the same target removes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def scratch_prefix(name: str) -> str:
    """Temporary names for target ``name`` start with this. '~' never occurs in an
    artifact name, so one artifact's prefix never matches another's."""
    return f"{name}~"


def write_bytes(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as error:
        # The temporary name means nothing to a reader: name the file being written.
        error.filename, error.filename2 = str(path), None
        raise
    finally:
        temporary.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


@contextmanager
def new_directory(target: Path, scratch_root: Path, replace: bool = True) -> Iterator[Path]:
    """Yield an empty scratch directory; when the block completes, it becomes ``target``.

    ``replace=True``: an existing ``target`` is swapped out (moved aside, then removed).
    ``replace=False``: an existing ``target`` wins and the new content is dropped: for
    content-addressed places (the store, fixtures) where both are the same thing.
    If the block raises, ``target`` is untouched and the scratch directory removed.
    """
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(target.name), dir=scratch_root))
    try:
        yield scratch
        if replace:
            replace_directory(scratch, target, scratch_root)
        else:
            try:
                os.rename(scratch, target)
            except OSError:
                if not target.is_dir():
                    raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def replace_directory(new: Path, target: Path, scratch_root: Path) -> None:
    """Rename ``new`` to ``target``; an old ``target`` is moved aside first and removed after."""
    old = move_aside(target, scratch_root)
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def move_aside(target: Path, scratch_root: Path) -> Path | None:
    """Rename ``target`` into a fresh directory under ``scratch_root`` and return that
    directory (``None`` when there is no ``target``): ``target`` is gone at once, and
    whatever kills the removal that follows leaves a leftover there, never half of it."""
    if not target.exists():
        return None
    scratch_root.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=scratch_prefix(target.name) + "old~", dir=scratch_root))
    os.rename(target, aside / "content")
    return aside


def remove_directory(target: Path, scratch_root: Path) -> None:
    """Remove the directory ``target``: moved aside first (:func:`move_aside`), then deleted."""
    aside = move_aside(target, scratch_root)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def remove_leftovers(name: str, scratch_root: Path) -> None:
    """Remove temporary directories a killed writer of ``name`` left behind.
    Only safe under the lock every writer of ``name`` holds."""
    if scratch_root.is_dir():
        for leftover in scratch_root.glob(f"{scratch_prefix(name)}*"):
            shutil.rmtree(leftover, ignore_errors=True)
