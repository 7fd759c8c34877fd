"""How the store copies files (``edgebuild/cache/copying.py``): every route gives the
same bytes and times, whatever the size's alignment, and a filesystem that takes no
direct writes (tmpfs) falls back instead of failing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgebuild.cache import copying
from edgebuild.cache.copying import DIRECT, KERNEL, PLAIN, REFLINK, copy_file
from edgebuild.cache.store import Store

from helpers import seeded_bytes

# Small chunks, so that several chunks and a ragged tail cost a few megabytes.
CHUNK = 1 << 20
MINIMUM = 1 << 16
SIZES = [0, 1, 4095, MINIMUM, CHUNK, CHUNK * 2 + 4096 + 17]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch) -> None:
    monkeypatch.setattr(copying, "_DIRECT_CHUNK", CHUNK)
    monkeypatch.setattr(copying, "_DIRECT_MINIMUM", MINIMUM)


def written(path: Path, size: int) -> bytes:
    data = seeded_bytes(size, size)
    path.write_bytes(data)
    os.utime(path, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return data


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("cold", [False, True])
def test_every_size_is_copied_exactly_with_its_times(tmp_path: Path, size: int, cold: bool) -> None:
    source = tmp_path / "source"
    data = written(source, size)
    target = tmp_path / "target"
    target.write_bytes(b"x" * (size + 9000))  # longer than the copy: truncated, not overlaid
    how = copy_file(source, target, cold=cold)
    assert target.read_bytes() == data
    assert target.stat().st_mtime_ns == source.stat().st_mtime_ns
    assert how in (REFLINK, DIRECT, KERNEL, PLAIN)
    if how == DIRECT:
        assert cold and size >= MINIMUM


def test_a_cold_copy_on_this_filesystem_goes_past_the_page_cache_or_shares_extents(tmp_path: Path) -> None:
    """The test directory's filesystem (ext4 on the test machine) takes O_DIRECT; one
    with reflinks clones instead. Either way, not a buffered copy."""
    source = tmp_path / "source"
    written(source, CHUNK + 5)
    how = copy_file(source, tmp_path / "target", cold=True)
    if how not in (REFLINK, DIRECT):
        pytest.skip(f"{tmp_path}'s filesystem takes neither reflinks nor direct writes ({how}): a property of the "
                    "machine's filesystem, which no test set-up installs")
    assert (tmp_path / "target").read_bytes() == source.read_bytes()


def test_another_filesystem_gets_the_same_bytes(tmp_path: Path) -> None:
    """tmpfs: it has no reflinks, and takes O_DIRECT only on newer kernels (6.6 on)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm on this machine (a tmpfs no test set-up installs)")
    source = tmp_path / "source"
    data = written(source, CHUNK + 3)
    target = shm / f"edgebuild-copy-test-{os.getpid()}"
    try:
        assert copy_file(source, target, cold=True) in (DIRECT, KERNEL)
        assert target.read_bytes() == data
    finally:
        target.unlink(missing_ok=True)


def test_without_direct_io_a_cold_copy_is_an_in_kernel_one(tmp_path: Path, monkeypatch) -> None:
    """A platform without O_DIRECT (macOS) or a filesystem that refuses it."""
    monkeypatch.delattr(copying.os, "O_DIRECT", raising=False)
    monkeypatch.setattr(copying, "_reflink", lambda reader, writer: False)
    source = tmp_path / "source"
    data = written(source, CHUNK + 3)
    assert copy_file(source, tmp_path / "target", cold=True) == KERNEL
    assert (tmp_path / "target").read_bytes() == data


def test_a_source_shorter_than_its_size_is_an_error_not_a_padded_blob(tmp_path: Path) -> None:
    """A file truncated between the copy's stat and its read."""
    source = tmp_path / "source"
    written(source, CHUNK * 2)
    target = tmp_path / "target"
    target.touch()
    with open(source, "rb") as reader, pytest.raises(OSError, match="shorter than its size"):
        copying._direct_copy(reader, target, CHUNK * 3)


def test_a_stored_blob_is_cold_copied_and_restores_to_the_same_bytes(tmp_path: Path) -> None:
    from edgebuild.core.hashing import file_digest

    store = Store(tmp_path / "store")
    source = tmp_path / "weights.bin"
    data = written(source, CHUNK + 4097)
    meta = store.add_blob(source)
    blob = store.blob_path(meta["digest"])
    assert blob.read_bytes() == data and file_digest(blob) == meta["digest"]
