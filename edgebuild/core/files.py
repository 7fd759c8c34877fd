"""Reading a file edgebuild did not just write, bounded: only a regular file, at most so
many bytes, and JSON of bounded nesting.

Everything edgebuild reads back -- the manifest, the lock file, build records, reports,
the stat cache, doit's state, remote entries, a destination's index, Hugging Face refs --
comes through here, so that ``EDGEBUILD_MANIFEST=/dev/zero`` is one line instead of a
process that grows until the kernel kills it, a FIFO is refused instead of hanging the
command, and a report of 200,000 nested ``[`` is "nested too deeply" instead of a
RecursionError. The caller turns :class:`UnreadableFile` into its own error class (a
manifest error, a lock file error, ...), with its own context.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from edgebuild.core.console import format_size

# Caps per kind of file: far above anything real, far below what hurts a machine.
MANIFEST_BYTES = 16 << 20
LOCK_BYTES = 256 << 20
RECORD_BYTES = 64 << 20
REPORT_BYTES = 64 << 20
CACHE_BYTES = 512 << 20
SMALL_BYTES = 4096
# Nesting of JSON containers edgebuild writes or reads: records and reports nest a few
# levels; this leaves room and stops well before Python's own recursion limit.
MAX_JSON_DEPTH = 64


class UnreadableFile(Exception):
    """A file that is not a regular file, too large, not UTF-8, or not JSON of bounded
    depth; the message says which (without the path: the caller names it)."""


class NotRegular(UnreadableFile):
    """A path in a tree of outputs, or on the way to a file edgebuild writes, that is a
    symbolic link or neither a regular file nor a directory. ``relative`` names it under
    the root it was found in; the message says what it is (``a symbolic link to /etc``)."""

    def __init__(self, relative: str, what: str) -> None:
        super().__init__(what)
        self.relative = relative


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def describe_entry(path: Path, mode: int) -> str:
    """What a path that is not a regular file is, in words (``mode``: its ``lstat``)."""
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)}"
        except OSError:
            return "a symbolic link"
    return _kind(mode)


# --- links: one rule --------------------------------------------------------------------
#
# Outputs are regular files inside the build directory, and edgebuild writes only where it
# was asked to. So, below a root -- a build's directory, the project ``init`` lays out, the
# directory ``fetch --to`` creates its target in, the ``fixture`` directory, a local
# ``publish`` destination -- a symbolic link is never followed to
# write, nor taken as an output: it is an error naming it, found before anything is
# recorded, stored, written or downloaded. Above the root (a ``build/`` or a checkout on
# another disk, linked) links are the user's own business. Reading inputs follows links
# (a checkpoint directory linked from elsewhere is the same checkpoint).


def regular_tree(directory: Path) -> list[str]:
    """Every file under ``directory`` (relative POSIX paths, sorted; hidden ones included),
    without following a link. :class:`NotRegular` for the first entry (in sorted order) that
    is a symbolic link -- to a file, to a directory or to nothing -- or a FIFO, socket or
    device: a tree of outputs holds regular files and directories only."""
    found: list[str] = []
    pending = [""]
    while pending:
        folder = pending.pop()
        with os.scandir(directory / folder if folder else directory) as entries:
            listed = sorted(entries, key=lambda entry: entry.name)
        for entry in listed:
            relative = f"{folder}/{entry.name}" if folder else entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append(relative)
            elif stat.S_ISREG(mode):
                found.append(relative)
            else:
                raise NotRegular(relative, describe_entry(Path(entry.path), mode))
    return sorted(found)


def regular_file_below(directory: Path, relative: str) -> os.stat_result | None:
    """The ``lstat`` of ``directory/relative`` when every folder on the way below
    ``directory`` is a directory (not a link to one) and the file is a regular file (not a
    link to one); ``None`` otherwise (missing included)."""
    current = directory
    parts = Path(relative).parts
    try:
        for part in parts[:-1]:
            current = current / part
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return None
        info = os.lstat(current / parts[-1])
    except (OSError, IndexError):
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def link_on_the_way(root: Path, relative: str | Path) -> Path | None:
    """The first path below ``root`` on the way to ``root/relative`` (``relative`` itself
    included) that is a symbolic link, dangling or not; ``None`` when there is none (a
    part that does not exist yet is no link: it is to be made)."""
    current = root
    for part in Path(relative).parts:
        current = current / part
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return current
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
    return None


def read_bytes(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them. Raises
    ``FileNotFoundError`` (and other ``OSError``) as ``open`` does; :class:`UnreadableFile`
    for a path that is not a regular file or holds more than ``limit`` bytes."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise UnreadableFile(f"{_kind(info.st_mode)}, not a regular file")
    if info.st_size > limit:
        raise UnreadableFile(f"{format_size(info.st_size)}, more than the {format_size(limit)} a file of this kind may hold")
    # O_NONBLOCK: a path swapped for a FIFO after the stat must not hang the open.
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UnreadableFile("not a regular file")
        # The size the stat saw, plus whatever the file grew by since, up to the limit:
        # ``read(limit + 1)`` would allocate the whole limit up front, for any file.
        chunks = [handle.read(info.st_size + 1)]
        total = len(chunks[0])
        while total <= limit and len(chunks[-1]) > 0 and total > info.st_size:
            chunks.append(handle.read(min(1 << 20, limit + 1 - total)))
            total += len(chunks[-1])
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
    if len(data) > limit:
        raise UnreadableFile(f"more than the {format_size(limit)} a file of this kind may hold")
    return data


class IrregularFile(UnreadableFile, OSError):
    """What :func:`open_regular` and :func:`open_lock` raise for a path that is not a
    regular file: an :class:`UnreadableFile` and an ``OSError`` (``EINVAL``, the path as
    its ``filename``), so a caller's handler of either names it in one line."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(errno.EINVAL, what, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


def _open_checked(path: Path, flags: int, mode: str) -> BinaryIO:
    # O_NONBLOCK: opening a FIFO neither waits for a writer nor for a reader; the
    # descriptor's own stat then refuses it (and a device, socket or directory).
    descriptor = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise IrregularFile(path, f"{_kind(info.st_mode)}, not a regular file")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, mode)
    except BaseException:
        os.close(descriptor)
        raise


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened to be read as a stream, when it is a regular file: for a file read
    in full whatever its size (a checkpoint, an input file, a store blob, an output),
    which no cap fits. :class:`IrregularFile` for a FIFO, device, socket or directory
    (never waited on); ``OSError`` as ``open`` raises it."""
    return _open_checked(path, os.O_RDONLY, "rb")


def open_lock(path: Path) -> BinaryIO:
    """The lock file ``path`` (created if missing), opened to hold an ``flock`` on:
    :class:`IrregularFile` when something else is there (a FIFO opened for writing
    would wait for a reader forever)."""
    try:
        return _open_checked(path, os.O_RDWR | os.O_CREAT, "r+b")
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.path.lexists(path):
            raise
    # An flock needs no write access: a lock file that is there but cannot be written (a
    # read-only cache/) serialises its holders all the same.
    return _open_checked(path, os.O_RDONLY, "rb")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (:func:`open_lock`) for the duration of the
    block: the one mutex between edgebuild's processes (the store, the lock file, a
    publish destination)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_lock(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_text(path: Path, limit: int) -> str:
    """:func:`read_bytes`, decoded as UTF-8."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"not UTF-8 text (byte {error.start})") from None


def parse_json(data: str | bytes, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """JSON of at most ``max_depth`` nested containers (``None``: as deep as the parser
    goes); :class:`UnreadableFile` otherwise. Deeper than Python's recursion limit, the
    parser itself stops (RecursionError), at once."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise UnreadableFile("not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise UnreadableFile(f"not valid JSON: {error}") from None
    if max_depth is not None and _depth(value) > max_depth:
        raise UnreadableFile(f"JSON nested more than {max_depth} levels deep")
    return value


def read_json(path: Path, limit: int, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    return parse_json(read_text(path, limit), max_depth)


def json_kind(value: Any, qualified: bool = False) -> str:
    """What a JSON value is, for messages about a value of the wrong kind: ``null``, ``a
    number``, ``an array`` (``a JSON array`` when ``qualified``, beside other formats)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    container = "array" if isinstance(value, list) else "object"
    return f"a JSON {container}" if qualified else f"an {container}"


def _depth(value: Any) -> int:
    """How deeply ``value``'s lists and dicts nest (iteratively: no recursion)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        current, depth = pending.pop()
        if isinstance(current, dict):
            children = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
