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

import json
import os
import stat
from pathlib import Path
from typing import Any

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


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


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
