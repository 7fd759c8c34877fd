"""The local store's layout (entries by fingerprint, blobs by digest, as the remote's):
shared files stored once, gc by reachability, a pull that downloads only what the
store lacks, the store of the old layout moved in on first use, and the batched size
check a push makes, on a directory and on the real S3 API (moto's server on loopback)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from edgebuild.cache.entries import blob_key, entry_key
from edgebuild.cache.location import Location
from edgebuild.cache.remote import RemoteCache
from edgebuild.cache.store import Store
from edgebuild.core.hashing import file_digest
from edgebuild.core.hashing import digest_bytes as file_digest_of
from edgebuild.core.record import RECORD_FILE, BuildRecord, output_manifest, read_record
from edgebuild.errors import StoreError

from helpers import flip_bits, seeded_bytes


def built(root: Path, size: int, weights: bytes) -> Path:
    """An artifact directory as a build leaves it: weights, a config, the record."""
    root.mkdir(parents=True)
    (root / "model.bin").write_bytes(weights)
    (root / "config.json").write_text('{"hidden": 8}\n')
    record = BuildRecord.create(kind="k", params={"size": size}, inputs={}, code={}, versions={})
    record.completed(root.name, {}, 0.0, output_manifest(root)).write(root)
    return root


def fingerprint_of(directory: Path) -> str:
    return json.loads((directory / RECORD_FILE).read_text())["fingerprint"]


def test_two_builds_share_their_identical_files_and_gc_frees_only_what_none_reaches(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    shared = seeded_bytes(1 << 16, 1)
    first = built(tmp_path / "a", 1, shared)
    second = built(tmp_path / "b", 2, shared)
    third = built(tmp_path / "c", 3, seeded_bytes(1 << 15, 2))
    for directory in (first, second, third):
        store.put(fingerprint_of(directory), directory)
    entries = {entry.fingerprint: entry for entry in store.entries()}
    assert len(entries) == 3
    # One config for all three, one model.bin for a and b, c's own, a record each.
    assert len(store.blobs()) == 1 + 1 + 1 + 3
    old = time.time() - 7200
    for directory in (first, third):
        os.utime(store.entry_path(fingerprint_of(directory)), (old, old))

    result = store.gc(max_bytes=None, max_age_seconds=3600, keep=set())
    assert sorted(entry.fingerprint for entry in result.removed) == sorted(map(fingerprint_of, (first, third)))
    # a's weights and the config stay (b reaches them): only the records and c's weights are freed.
    freed = sum((directory / RECORD_FILE).stat().st_size for directory in (first, third)) + (third / "model.bin").stat().st_size
    assert result.freed_bytes == freed
    assert set(store.blobs()) == {file_digest(path) for path in second.iterdir()}
    restored = store.restore(fingerprint_of(second), tmp_path / "out", tmp_path / ".tmp")
    assert restored is not None and (tmp_path / "out" / "model.bin").read_bytes() == shared


def test_gc_fits_the_size_counting_each_blob_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    shared = seeded_bytes(1 << 16, 3)
    directories = [built(tmp_path / name, size, shared) for size, name in enumerate("ab")]
    for age, directory in zip((300, 200), directories):
        store.put(fingerprint_of(directory), directory)
        os.utime(store.entry_path(fingerprint_of(directory)), (time.time() - age,) * 2)
    # Both entries together take one copy of the weights: under 1.5x of it, nothing goes.
    assert store.gc(max_bytes=int(1.5 * (1 << 16)), max_age_seconds=None, keep=set()).removed == []
    result = store.gc(max_bytes=1 << 10, max_age_seconds=None, keep={fingerprint_of(directories[1])})
    assert [entry.fingerprint for entry in result.removed] == [fingerprint_of(directories[0])]
    assert result.freed_bytes == (directories[0] / RECORD_FILE).stat().st_size


def test_a_damaged_blob_drops_the_entry_and_the_blob(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    directory = built(tmp_path / "a", 1, seeded_bytes(4096, 4))
    fingerprint = fingerprint_of(directory)
    store.put(fingerprint, directory)
    blob = store.files(fingerprint)["model.bin"]
    flip_bits(blob, 7, 0x10)
    data = blob.read_bytes()
    said: list[str] = []
    assert store.restore(fingerprint, tmp_path / "out", tmp_path / ".tmp", said.append) is None
    assert not store.has(fingerprint) and not blob.exists() and not (tmp_path / "out").exists()
    # Named, never repaired without a word: a stored file does not change by itself.
    assert said == [
        f"warning: the store's build of {fingerprint[:12]} is damaged (model.bin: digest {file_digest_of(data)[:12]}, "
        f"expected {blob.name[:12]}); stored files do not change by themselves: check the disk under {store.root}, "
        "and who else writes there. It was dropped"
    ]


@pytest.mark.parametrize("damage, problem", [
    (lambda entry: entry.write_text("{not json"), "v1/entries/{fp2}/{fp}.json is not an entry of format 1 for this fingerprint"),
    (lambda entry: (entry.unlink(), os.mkfifo(entry)), "v1/entries/{fp2}/{fp}.json: a FIFO (named pipe), not a regular file"),
    (lambda record: record.write_text("{}"), ".edgebuild.json: 2 bytes, expected {size}"),
    (lambda record: record.unlink(), ".edgebuild.json: blob {record} is missing"),
])
def test_a_damaged_entry_or_record_is_named_and_dropped(tmp_path: Path, damage, problem: str) -> None:
    store = Store(tmp_path / "store")
    directory = built(tmp_path / "a", 1, seeded_bytes(4096, 0))
    fingerprint = fingerprint_of(directory)
    store.put(fingerprint, directory)
    entry = store.entry(fingerprint)
    record_blob = store.blob_path(entry["files"][RECORD_FILE]["digest"])
    damage(store.entry_path(fingerprint) if "entries" in problem else record_blob)
    said: list[str] = []
    assert store.restore(fingerprint, tmp_path / "out", tmp_path / ".tmp", said.append) is None
    expected = problem.format(fp=fingerprint, fp2=fingerprint[:2], size=(directory / RECORD_FILE).stat().st_size,
                              record=record_blob.name[:12])
    assert said == [f"warning: the store's build of {fingerprint[:12]} is damaged ({expected}); stored files do not "
                    f"change by themselves: check the disk under {store.root}, and who else writes there. It was dropped"]
    assert not store.entry_path(fingerprint).exists() and not (tmp_path / "out").exists()
    # Gone, it is simply not there: nothing more is said.
    assert store.restore(fingerprint, tmp_path / "out", tmp_path / ".tmp", said.append) is None and len(said) == 1


@pytest.mark.parametrize("link", ["to a file with the same bytes", "to a directory"])
def test_a_link_in_a_build_directory_is_never_stored_nor_an_intact_output(tmp_path: Path, link: str) -> None:
    """Outputs are regular files inside the build directory: a link there -- even to the
    same bytes -- is an output changed since the build, and the store refuses it."""
    store = Store(tmp_path / "store")
    directory = built(tmp_path / "a", 1, seeded_bytes(4096, 0))
    record = read_record(directory)
    outside = tmp_path / "outside"
    if link == "to a directory":
        outside.mkdir()
        (directory / "extra").symlink_to(outside)
        assert record.changed_outputs(directory) == []
    else:
        outside.write_bytes((directory / "config.json").read_bytes())
        (directory / "config.json").unlink()
        (directory / "config.json").symlink_to(outside)
        assert record.changed_outputs(directory) == ["config.json"]
    name = "extra" if link == "to a directory" else "config.json"
    with pytest.raises(StoreError) as caught:
        store.put(fingerprint_of(directory), directory)
    assert str(caught.value) == (f"{directory / name}: a symbolic link to {outside}; a build's outputs are regular files "
                                 "inside its directory, and only those are stored")
    assert store.blobs() == {} and list(store.entries()) == []


def test_a_pull_downloads_only_the_blobs_the_store_lacks(tmp_path: Path) -> None:
    """Weights another build already brought are not downloaded again: the remote may
    even have lost them, and the pull still completes from the store's own blob."""
    (tmp_path / "remote").mkdir()
    remote = RemoteCache.open(str(tmp_path / "remote"))
    shared = seeded_bytes(1 << 16, 5)
    first, second = built(tmp_path / "a", 1, shared), built(tmp_path / "b", 2, shared)
    source = Store(tmp_path / "source")
    for directory in (first, second):
        source.put(fingerprint_of(directory), directory)
        assert remote.push(fingerprint_of(directory), source, lambda message: None)

    store = Store(tmp_path / "store")
    assert remote.pull("a", fingerprint_of(first), store, tmp_path / "build" / "a", tmp_path / "build" / ".tmp", print)
    remote.location.delete(blob_key(file_digest(first / "model.bin")))
    record = remote.pull("b", fingerprint_of(second), store, tmp_path / "build" / "b", tmp_path / "build" / ".tmp", print)
    assert record is not None and (tmp_path / "build" / "b" / "model.bin").read_bytes() == shared
    # Nothing of either pull is left in the store's scratch.
    assert list(store.scratch_dir.iterdir()) == []


def test_the_store_of_the_old_layout_is_moved_in_on_first_use(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kept = built(tmp_path / "a", 1, seeded_bytes(4096, 6))
    damaged = built(tmp_path / "b", 2, seeded_bytes(4096, 7))
    for directory in (kept, damaged):
        fingerprint = fingerprint_of(directory)
        old = root / fingerprint[:2] / fingerprint
        old.parent.mkdir(parents=True, exist_ok=True)
        directory.rename(old)
        (old / ".last-used").write_text("1000000000.0\n")
    (root / fingerprint_of_old(root, 0) / ".unvouched").write_text("pulled from somewhere: it is unsigned\n")
    first, second = sorted(path for prefix in root.iterdir() for path in prefix.iterdir())
    flip_bits(second / "model.bin", 0)
    weights = (first / "model.bin").read_bytes()

    store = Store(root)
    assert [entry.fingerprint for entry in store.entries()] == [first.name]
    assert [path.name for path in root.iterdir() if path.name != ".tmp"] == ["v1"]
    entry = next(store.entries())
    assert entry.last_used == 1000000000.0
    assert store.unvouched(first.name) == "pulled from somewhere: it is unsigned"
    assert store.restore(first.name, tmp_path / "out", tmp_path / ".tmp") is not None
    assert (tmp_path / "out" / "model.bin").read_bytes() == weights
    assert list(store.scratch_dir.iterdir()) == []


def test_the_move_from_the_old_layout_says_what_it_dropped_and_why(tmp_path: Path) -> None:
    """A damaged entry of the old layout is not moved in: it was dropped without a word;
    now one line each names it and what is wrong with it."""
    root = tmp_path / "store"
    fingerprints = []
    for index in range(4):
        directory = built(tmp_path / f"b{index}", index, seeded_bytes(4096, 10 + index))
        fingerprints.append(fingerprint_of(directory))
        old = root / fingerprints[-1][:2] / fingerprints[-1]
        old.parent.mkdir(parents=True, exist_ok=True)
        directory.rename(old)
    intact, changed, unreadable, misfiled = fingerprints

    def old(fingerprint: str) -> Path:
        return root / fingerprint[:2] / fingerprint
    flip_bits(old(changed) / "model.bin", 100)
    flip_bits(old(unreadable) / RECORD_FILE, 0)  # '{' XOR 0xFF: not even UTF-8
    other = "0" * 64
    (root / "00").mkdir(exist_ok=True)
    old(misfiled).rename(root / "00" / other)

    messages: list[str] = []
    store = Store(root, log=messages.append)
    assert [entry.fingerprint for entry in store.entries()] == [intact]

    def dropped(fingerprint: str, why: str) -> str:
        return (f"warning: the store's build of {fingerprint[:12]} (old layout) is damaged ({why}); stored files do not "
                f"change by themselves: check the disk under {root}, and who else writes there. It was dropped in the "
                "move to the new layout")

    assert sorted(messages) == sorted([
        dropped(changed, "model.bin missing or changed since the build"),
        dropped(unreadable, f"{RECORD_FILE}: not a build record (not valid JSON: 'utf-8' codec can't decode byte 0x84 in "
                            "position 0: invalid start byte)"),
        dropped(other, f"{RECORD_FILE} describes fingerprint {misfiled[:12]}, not {other[:12]}"),
    ])
    assert [path.name for path in root.iterdir() if path.name != ".tmp"] == ["v1"]
    # Said once: the move runs once per store.
    store.entries()
    assert len(messages) == 3


def fingerprint_of_old(root: Path, index: int) -> str:
    """The relative path of the index-th entry of an old-layout store, in sorted order."""
    paths = sorted(path for prefix in root.iterdir() for path in prefix.iterdir())
    return str(paths[index].relative_to(root))


@pytest.fixture
def remote_root(remote_url: str) -> str:
    if "://" not in remote_url:
        Path(remote_url).mkdir()
    return remote_url


def test_sizes_asks_every_key_in_one_batch(remote_root: str, tmp_path: Path) -> None:
    location = Location(remote_root)
    location.write("v1/blobs/aa/one", b"12345")
    location.write("v1/blobs/bb/two", b"")
    keys = ["v1/blobs/aa/one", "v1/blobs/bb/two", "v1/blobs/cc/none", entry_key("ab" * 32)]
    assert location.sizes(keys) == {keys[0]: 5, keys[1]: 0, keys[2]: None, keys[3]: None}
    assert location.sizes([]) == {}


def test_a_listed_store_answers_what_its_listing_lacks_without_a_look_up(tmp_path: Path) -> None:
    """Inside ``listed()``, an entry or refusal note the listing of its directory does not
    show is absent; what it shows is read as usual; what appears after its directory was
    listed is seen only outside."""
    store = Store(tmp_path / "store")
    stored = built(tmp_path / "a", 1, seeded_bytes(1 << 10, 1))
    fingerprint = fingerprint_of(stored)
    store.put(fingerprint, stored)
    refused, absent, late = "ab" + "1" * 62, "cd" + "2" * 62, "cd" + "3" * 62
    store.remember_rejection(refused, "the compiler said no")
    # A directory of entries that cannot be listed: its look-ups go their own way.
    (tmp_path / "store" / entry_key("ee" + "4" * 62)).parent.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "store" / entry_key("ee" + "4" * 62)).parent.write_text("not a directory\n")
    with store.listed():
        assert store.has(fingerprint) and store.record(fingerprint).fingerprint == fingerprint
        assert store.rejection(refused)["message"] == "the compiler said no"
        assert not store.has(absent) and store.rejection(absent) is None
        store.remember_rejection(late, "refused after the listing")
        assert store.rejection(late) is None
        assert not store.has("ee" + "4" * 62) and store.rejection("ee" + "4" * 62) is None
    assert store.rejection(late)["message"] == "refused after the listing"
    assert store.has(fingerprint) and not store.has(absent)
