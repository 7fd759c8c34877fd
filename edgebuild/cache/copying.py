"""Copying a file's bytes into the store and out of it, as cheaply as the filesystem allows.

In order: a reflink (a copy-on-write clone: no bytes move) where the filesystem has
them (btrfs, XFS, ...); then, for a copy that nothing is about to read (a store blob),
a copy written past the page cache; then an in-kernel copy (``copy_file_range``); then
a plain one.

Why past the page cache: a buffered copy of a 1.6 GB build gives the kernel 1.6 GB of
new page-cache pages to allocate and fill, on top of the build's own. Where memory is
slow to hand out (a virtual machine whose guest pages are backed lazily by the host)
that, not the disk, is the cost: 0.34 to 4.5 GB/s for buffered writes on the 2-core
test machine, depending on how much of the guest's memory had been touched before,
against a steady 2.6 GB/s with ``O_DIRECT`` (``bench/store_copy.py``). A store blob is
read again only by a restore or a push, so keeping it out of the cache also leaves the
cache to the files a build is about to read.

Not a hard link, although that would be cheaper still: ``onnx.load`` refuses external
data files with more than one link ("a potential hardlink attack"), so a hard-linked
``model.onnx.data`` is unusable for anyone who loads it with onnx. And a shared inode
would let an in-place edit in ``build/`` change the store.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
from pathlib import Path

# Linux's FICLONE ioctl, _IOW(0x94, 9, int): make the target share the source's extents.
_FICLONE = 0x40049409
# O_DIRECT transfers must be aligned, in address, length and offset, to the device's
# logical block size; a page is a multiple of every common one.
_DIRECT_ALIGNMENT = 4096
# Written in chunks of this size: a write per chunk costs nothing next to its bytes.
_DIRECT_CHUNK = 64 << 20
# Below this a buffered copy is as fast, and leaves no direct-I/O edge cases to meet.
_DIRECT_MINIMUM = 4 << 20

# A reflink, then (for a copy nothing is about to read) O_DIRECT, then the fallbacks.
REFLINK, DIRECT, KERNEL, PLAIN = "reflink", "direct", "kernel", "plain"


def copy_file(source: Path, target: Path, cold: bool = False) -> str:
    """Give ``target`` (created or truncated) the content and times of ``source``; return
    how: :data:`REFLINK`, :data:`DIRECT`, :data:`KERNEL` or :data:`PLAIN`.

    ``cold``: nothing is about to read ``target`` (a store blob), so where the bytes must
    move they are written past the page cache, when the filesystem allows it.
    """
    with open(source, "rb") as reader, open(target, "wb") as writer:
        size = os.fstat(reader.fileno()).st_size
        if _reflink(reader.fileno(), writer.fileno()):
            how = REFLINK
        elif cold and size >= _DIRECT_MINIMUM and _direct_copy(reader, target, size):
            how = DIRECT
        elif _kernel_copy(reader.fileno(), writer.fileno(), size):
            how = KERNEL
        else:
            reader.seek(0)
            writer.seek(0)
            writer.truncate()
            shutil.copyfileobj(reader, writer, 1 << 20)
            how = PLAIN
    shutil.copystat(source, target)
    return how


def _reflink(reader: int, writer: int) -> bool:
    try:
        import fcntl

        fcntl.ioctl(writer, _FICLONE, reader)
        return True
    except (ImportError, OSError):
        # EOPNOTSUPP (ext4, tmpfs), EXDEV (another filesystem), EINVAL, ...: copy instead.
        return False


def _kernel_copy(reader: int, writer: int, size: int) -> bool:
    if not hasattr(os, "copy_file_range"):
        return False
    try:
        os.lseek(reader, 0, os.SEEK_SET)
        os.ftruncate(writer, 0)
        os.lseek(writer, 0, os.SEEK_SET)
        remaining = size
        while remaining > 0:
            copied = os.copy_file_range(reader, writer, min(remaining, 1 << 30))
            if copied == 0:
                return False
            remaining -= copied
        return True
    except OSError:
        return False


def _direct_copy(reader, target: Path, size: int) -> bool:
    """Copy ``size`` bytes of ``reader`` into ``target`` with ``O_DIRECT`` writes straight
    from a mapping of the source (no buffer, no copy through user space); ``False`` (and
    ``target`` empty) where the filesystem does not take direct writes (some network
    filesystems, tmpfs before Linux 6.6) or takes them at another alignment.

    Only the kernel reads the mapping (``write`` pins its pages): a source truncated
    meanwhile fails the write (``EFAULT``), where a read of the mapping here would kill
    the process (``SIGBUS``). The last partial block is read with ``pread`` into a block
    of its own, written whole, and cut back to ``size``."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return False
    if os.fstat(reader.fileno()).st_size < size:
        raise OSError(errno.EIO, f"{reader.name}: shorter than its size")
    try:
        handle = os.open(target, os.O_WRONLY | os.O_TRUNC | direct)
    except OSError:
        return False
    bulk = size - size % _DIRECT_ALIGNMENT
    try:
        # One window of the source mapped at a time: pages the writes pin stay resident
        # while mapped, and a whole-file mapping would add the file to the peak RSS.
        for offset in range(0, bulk, _DIRECT_CHUNK):
            length = min(_DIRECT_CHUNK, bulk - offset)
            with mmap.mmap(reader.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as window:
                _write_all(handle, memoryview(window), reader.name)
        if size > bulk:
            tail = os.pread(reader.fileno(), size - bulk, bulk)
            if len(tail) != size - bulk:
                raise OSError(errno.EIO, f"{reader.name}: shorter than its size")
            with mmap.mmap(-1, _DIRECT_ALIGNMENT) as block:
                block.write(tail)
                _write_all(handle, memoryview(block), reader.name)
            os.ftruncate(handle, size)
        return True
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        os.ftruncate(handle, 0)
        return False
    finally:
        os.close(handle)


def _write_all(handle: int, chunk: memoryview, source: str) -> None:
    expected = len(chunk)
    try:
        written = os.write(handle, chunk)
    except OSError as error:
        if error.errno == errno.EFAULT:
            raise OSError(errno.EIO, f"{source}: changed while it was copied") from None
        raise
    finally:
        chunk.release()
    if written != expected:
        raise OSError(errno.EIO, f"{source}: short direct write")
