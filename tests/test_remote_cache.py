"""The remote cache against a real S3 API (moto's server on loopback) and a local
directory: push and pull, checksums on both ways, corrupt entries reported and
rebuilt, hostile entries that never reach outside the remote, a missing remote
as an error, two clones sharing one remote through the real doit CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from edgebuild.run.builder import make_current
from edgebuild.errors import ManifestError, RemoteError, StoreError
from edgebuild.core.hashing import file_digest
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.core.record import RECORD_FILE, BuildRecord, output_manifest
from edgebuild.cache.location import Location, quoted
from edgebuild.cache.entries import blob_key, entry_key
from edgebuild.cache.remote import RemoteCache
from edgebuild.cache.store import Store

from helpers import (
    TOWER_MANIFEST, clone_project, fresh_clone, signing_env, flip_bits, flipped, lay_out_plugin, pretend_built, waits_released,
)


@pytest.fixture
def remote_url(remote_url: str) -> str:
    """conftest's remotes, with the directory one created first: edgebuild never
    creates a remote cache's root (a missing shared directory is an error)."""
    if "://" not in remote_url:
        Path(remote_url).mkdir()
    return remote_url


def stored_build(root: Path, params: dict | None = None) -> tuple[Store, str]:
    """A store holding one verified build of a made-up artifact: two outputs, the
    record (whose fingerprint is what its inputs hash to), a report."""
    directory = root / "artifact"
    directory.mkdir(parents=True)
    (directory / "model.bin").write_bytes(bytes(range(256)) * 64)
    (directory / "config.json").write_text('{"hidden": 8}\n')
    record = BuildRecord.create(kind="k", params=params or {"size": 64}, inputs={}, code={}, versions={})
    record = record.completed("artifact", {}, 0.0, output_manifest(directory))
    record.write(directory)
    store = Store(root / "store")
    store.put(record.fingerprint, directory)
    (directory / "report.json").write_text('{"passed": true}\n')
    store.put_report(record.fingerprint, directory)
    return store, record.fingerprint


def flip_byte(location: Location, key: str) -> None:
    """Same size, one bit different: only a digest can tell."""
    data = location.read(key)
    location.write(key, flipped(data, len(data) // 2, 0x01))


def test_push_then_pull_into_another_store(remote_url: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    messages: list[str] = []
    assert cache.push(fingerprint, store, messages.append) is True
    assert messages == [f"remote cache: pushed {fingerprint[:12]} to {remote_url} (4 files)"]
    assert cache.push(fingerprint, store, messages.append) is False
    assert messages[-1] == f"remote cache: {fingerprint[:12]} already in {remote_url}"

    other = Store(tmp_path / "b" / "store")
    target = tmp_path / "b" / "build" / "art"
    record = cache.pull("art", fingerprint, other, target, tmp_path / "b" / "build" / ".tmp", messages.append)
    assert record is not None and record.fingerprint == fingerprint
    for name in ("model.bin", "config.json", RECORD_FILE):
        assert (target / name).read_bytes() == (store.files(fingerprint)[name]).read_bytes()
    # Unsigned: a build, not a verification (test_signing.py pulls signed ones with their report).
    assert not (target / "report.json").exists()
    assert other.has(fingerprint) and other.unvouched(fingerprint) == f"pulled from {remote_url}: it is unsigned"
    # The scratch directory of the pull is gone.
    assert list((tmp_path / "b" / "build" / ".tmp").iterdir()) == []


def test_pull_of_a_missing_fingerprint_is_a_miss(remote_url: str, tmp_path: Path) -> None:
    cache = RemoteCache.open(remote_url)
    messages: list[str] = []
    assert cache.pull("art", "ab" * 32, Store(tmp_path / "store"), tmp_path / "art", tmp_path / ".tmp", messages.append) is None
    assert messages == []


def test_corrupt_blob_is_reported_dropped_and_replaced(remote_url: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    cache.push(fingerprint, store, lambda message: None)
    digest = file_digest(store.files(fingerprint)["model.bin"])
    flip_byte(cache.location, blob_key(digest))
    corrupt = file_digest_of(cache.location, blob_key(digest), tmp_path)

    messages: list[str] = []
    other = Store(tmp_path / "b" / "store")
    pulled = cache.pull("art", fingerprint, other, tmp_path / "b" / "art", tmp_path / "b" / ".tmp", messages.append)
    assert pulled is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt "
        f"(model.bin: digest {corrupt[:12]}, expected {digest[:12]}); dropped, building instead"
    ]
    assert not other.has(fingerprint) and not (tmp_path / "b" / "art").exists()
    # Dropped: the entry and the bad blob are gone, so the next push replaces them.
    assert cache.location.read(entry_key(fingerprint)) is None
    assert cache.location.size(blob_key(digest)) is None
    assert cache.push(fingerprint, store, lambda message: None) is True
    assert cache.pull("art", fingerprint, other, tmp_path / "b" / "art", tmp_path / "b" / ".tmp", messages.append)


def file_digest_of(location: Location, key: str, scratch: Path) -> str:
    path = scratch / "downloaded"
    location.download(key, path)
    return file_digest(path)


def test_missing_blob_is_corrupt(remote_url: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    cache.push(fingerprint, store, lambda message: None)
    digest = file_digest(store.files(fingerprint)["config.json"])
    cache.location.delete(blob_key(digest))
    messages: list[str] = []
    assert cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp", messages.append) is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (config.json: blob {digest[:12]} is missing); dropped, building instead"
    ]
    assert not cache.has(fingerprint)


def test_record_that_does_not_hash_to_its_fingerprint_is_corrupt(remote_url: str, tmp_path: Path) -> None:
    """An entry filed under one fingerprint whose record describes other inputs is never used,
    even though every file matches the digests the entry lists."""
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    cache.push(fingerprint, store, lambda message: None)
    forged = json.loads((store.files(fingerprint)[RECORD_FILE]).read_text())
    forged["params"] = {"size": 65}
    forged_bytes = json.dumps(forged).encode()
    (tmp_path / "forged").write_bytes(forged_bytes)
    forged_digest = file_digest(tmp_path / "forged")
    cache.location.write(blob_key(forged_digest), forged_bytes)
    entry = json.loads(cache.location.read(entry_key(fingerprint)))
    entry["files"][RECORD_FILE] = {"size": len(forged_bytes), "digest": forged_digest}
    cache.location.write(entry_key(fingerprint), json.dumps(entry).encode())

    messages: list[str] = []
    assert cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp", messages.append) is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (.edgebuild.json describes fingerprint "
        f"{BuildRecord.model_validate(forged).hashes_to()[:12]}, not {fingerprint[:12]}); dropped, building instead"
    ]


def test_unreadable_entry_is_corrupt(tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(str(tmp_path / "remote"))
    cache.location.write(entry_key(fingerprint), b"{not json")
    messages: list[str] = []
    assert cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp", messages.append) is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt ({entry_key(fingerprint)} is not an entry of format 1 "
        "for this fingerprint); dropped, building instead"
    ]
    # A push replaces it.
    assert cache.push(fingerprint, store, lambda message: None) is True
    assert cache.has(fingerprint)


def fifo_in_place_of(location: Location, key: str) -> Path:
    """Replace the file at ``key`` of a directory remote with a FIFO nobody writes to."""
    path = location.local_path(key)
    path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where", ["entry", "blob"])
def test_a_fifo_in_a_directory_remote_is_a_corrupt_entry_never_waited_on(where: str, tmp_path: Path) -> None:
    """A FIFO where an entry or a blob belongs (on a shared disk anyone can write) was
    waited on by a read, or ended a pull with a copy error: it is a corrupt entry, said,
    dropped and replaced by the next push, like any other."""
    store, fingerprint = stored_build(tmp_path / "a")
    remote = tmp_path / "remote"
    remote.mkdir()
    cache = RemoteCache.open(str(remote))
    cache.push(fingerprint, store, lambda message: None)
    digest = file_digest(store.files(fingerprint)["model.bin"])
    key = entry_key(fingerprint) if where == "entry" else blob_key(digest)
    fifo = fifo_in_place_of(cache.location, key)
    messages: list[str] = []
    with waits_released(fifo) as released:
        # Every reader of a remote's files: listing, describing, checking, digesting, pulling.
        assert [entry.artifact for entry in cache.entries()] == ([] if where == "entry" else ["artifact"])
        assert cache.described(fingerprint)[0] is not None or where == "entry"
        assert cache.has(fingerprint) is False
        with pytest.raises(RemoteError) as unfit:
            cache.location.digest(key, __import__("hashlib").sha256())
        pulled = cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp",
                            messages.append)
    assert released == []
    assert str(unfit.value) == f"{remote}/{key}: a FIFO (named pipe), not a regular file; not read"
    problem = (f"{entry_key(fingerprint)} is not an entry of format 1 ({unfit.value})" if where == "entry"
               else f"model.bin: {unfit.value}")
    assert (pulled, messages) == (None, [f"remote cache: entry {fingerprint[:12]} is corrupt ({problem}); dropped, "
                                         "building instead"])
    assert not fifo.exists()
    assert cache.push(fingerprint, store, lambda message: None) is True
    assert cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp", messages.append)


@pytest.mark.parametrize("where", ["entry", "blob"])
def test_commands_take_a_fifo_in_a_directory_remote_as_a_corrupt_entry(where: str, project_dir, tmp_path: Path) -> None:
    """Through the real commands: ``doit cache`` lists around it, and a pull (``doit build
    --pull-only``, which exports nothing) says in one line that the entry is corrupt and
    was dropped, then that the artifact is not in the remote cache."""
    project_dir.manifest(TOWER_MANIFEST)
    workspace = project_dir.project()
    output = project_dir.root / "build" / "t" / "model.onnx"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"an exported graph")
    pretend_built(workspace, "t", {"model.onnx": file_digest(output)})
    fingerprint = workspace.record(workspace.artifact("t")).fingerprint
    store = Store(tmp_path / "store")
    store.put(fingerprint, output.parent)
    remote = tmp_path / "remote"
    remote.mkdir()
    cache = RemoteCache.open(str(remote))
    cache.push(fingerprint, store, lambda message: None)
    shutil.rmtree(project_dir.root / "build")
    key = entry_key(fingerprint) if where == "entry" else blob_key(file_digest(store.files(fingerprint)["model.onnx"]))
    fifo = fifo_in_place_of(cache.location, key)
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    with waits_released(fifo) as released:
        listed = project_dir.doit("cache", env=env)
        pulled = project_dir.doit("build", "--pull-only", "t", env=env)
    assert released == []
    assert listed.returncode == 0 and "Traceback" not in listed.stdout + listed.stderr, listed.stdout + listed.stderr
    assert "1 entry" in listed.stdout if where == "blob" else "0 entries" in listed.stdout, listed.stdout
    said = pulled.stdout + pulled.stderr
    assert pulled.returncode != 0 and "Traceback" not in said, said
    assert said.count(f"t: fingerprint {fingerprint[:12]} is neither built here, in the store nor in the remote cache") == 1
    unfit = f"{remote}/{key}: a FIFO (named pipe), not a regular file; not read"
    problem = f"{entry_key(fingerprint)} is not an entry of format 1 ({unfit})" if where == "entry" else f"model.onnx: {unfit}"
    assert f"[t] remote cache: entry {fingerprint[:12]} is corrupt ({problem}); dropped, building instead" in said, said
    assert not fifo.exists()


def test_push_refuses_a_damaged_local_entry(remote_url: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    stored = store.files(fingerprint)["model.bin"]
    flip_bits(stored, 0)
    cache = RemoteCache.open(remote_url)
    with pytest.raises(StoreError) as error:
        cache.push(fingerprint, store, lambda message: None)
    assert str(error.value) == (
        f"store entry {fingerprint[:12]}: model.bin changed since build; not pushed to {remote_url}"
    )
    assert not cache.has_entry(fingerprint)


# --- an entry is untrusted: nothing outside the remote is read or removed ---------------


def rewrite_entry(cache: RemoteCache, fingerprint: str, change) -> None:
    """Let ``change`` edit the stored entry of ``fingerprint`` (a dict) in place."""
    entry = json.loads(cache.location.read(entry_key(fingerprint)))
    change(entry)
    cache.location.write(entry_key(fingerprint), json.dumps(entry).encode())


def blob_keys(store: Store, fingerprint: str) -> list[str]:
    """The blob keys of every file a push of ``fingerprint`` uploads."""
    files = store.files(fingerprint)
    names = ("model.bin", "config.json", RECORD_FILE, "report.json")
    return [blob_key(file_digest(files[name])) for name in names]


def pull_messages(cache: RemoteCache, fingerprint: str, root: Path) -> tuple[dict | None, list[str]]:
    messages: list[str] = []
    record = cache.pull("art", fingerprint, Store(root / "store"), root / "art", root / ".tmp", messages.append)
    return record, messages


def test_digest_that_points_outside_the_remote_never_touches_the_file(tmp_path: Path) -> None:
    """A digest of ``../../victim.txt`` once made a pull read that file, call it corrupt
    and delete it. The digest is refused before any key is built from it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("not the cache's\n")
    store, fingerprint = stored_build(tmp_path / "a")
    remote = tmp_path / "remote"
    remote.mkdir()
    cache = RemoteCache.open(str(remote))
    cache.push(fingerprint, store, lambda message: None)

    def point_at_the_victim(entry: dict) -> None:
        entry["files"]["model.bin"] = {"size": victim.stat().st_size, "digest": "../../victim.txt"}

    rewrite_entry(cache, fingerprint, point_at_the_victim)
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (model.bin: digest '../../victim.txt' is not a blake3 "
        "digest of 64 lowercase hex digits); dropped, building instead"
    ]
    assert victim.read_text() == "not the cache's\n"
    # Only the entry's own key is dropped; every blob stays (other entries may share them).
    assert cache.location.read(entry_key(fingerprint)) is None
    assert all(cache.location.size(key) is not None for key in blob_keys(store, fingerprint))


@pytest.mark.parametrize(
    ("digest", "shown"),
    [
        ("AB" * 32, "'" + "AB" * 32 + "'"),
        ("ab" * 31, "'" + "ab" * 31 + "'"),
        ("ab" * 32 + "\n", "'" + "ab" * 32 + "\\n'"),
        (7, "7"),
    ],
    ids=["uppercase", "short", "newline", "number"],
)
def test_malformed_digest_is_corrupt(digest: object, shown: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    (tmp_path / "remote").mkdir()
    cache = RemoteCache.open(str(tmp_path / "remote"))
    cache.push(fingerprint, store, lambda message: None)
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"]["config.json"].update(digest=digest))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (config.json: digest {shown} is not a blake3 "
        "digest of 64 lowercase hex digits); dropped, building instead"
    ]


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "'' is empty"),
        ("/etc/passwd", "'/etc/passwd' is absolute"),
        ("../victim.txt", "'../victim.txt' has a '..' component"),
        ("sub/../../victim.txt", "'sub/../../victim.txt' has a '..' component"),
        ("sub\\model.bin", "'sub\\\\model.bin' contains a backslash"),
        ("model\x00.bin", "'model\\x00.bin' contains a control character"),
        ("./model.bin", "'./model.bin' has an empty or '.' component"),
        ("sub//model.bin", "'sub//model.bin' has an empty or '.' component"),
        ("sub/", "'sub/' has an empty or '.' component"),
    ],
    ids=["empty", "absolute", "parent", "nested-parent", "backslash", "nul", "dot", "double-slash", "trailing-slash"],
)
def test_file_name_that_is_not_a_plain_relative_path_is_corrupt(name: str, problem: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    (tmp_path / "remote").mkdir()
    cache = RemoteCache.open(str(tmp_path / "remote"))
    cache.push(fingerprint, store, lambda message: None)
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"].update({name: entry["files"]["model.bin"]}))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (file name {problem}); dropped, building instead"
    ]
    assert cache.location.read(entry_key(fingerprint)) is None
    assert all(cache.location.size(key) is not None for key in blob_keys(store, fingerprint))
    assert not (tmp_path / "b" / "art").exists() and not (tmp_path / "victim.txt").exists()


def test_entry_with_an_empty_file_name_is_dropped_then_replaced(remote_url: str, tmp_path: Path) -> None:
    """Such an entry once failed every build ("Is a directory") and was never dropped."""
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    cache.push(fingerprint, store, lambda message: None)
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"].update({"": entry["files"]["model.bin"]}))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (file name '' is empty); dropped, building instead"
    ]
    assert not cache.has_entry(fingerprint)
    # The next verified build pushes it again, and it pulls.
    assert cache.push(fingerprint, store, lambda message: None) is True
    record, messages = pull_messages(cache, fingerprint, tmp_path / "c")
    assert record is not None and record.fingerprint == fingerprint
    assert [message for message in messages if "corrupt" in message] == []


def test_file_names_that_collide_as_file_and_directory_are_corrupt(tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    (tmp_path / "remote").mkdir()
    cache = RemoteCache.open(str(tmp_path / "remote"))
    cache.push(fingerprint, store, lambda message: None)
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"].update({"model.bin/inner": entry["files"]["config.json"]}))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (file names 'model.bin' and 'model.bin/inner' "
        "collide (one would be the other's directory)); dropped, building instead"
    ]


@pytest.mark.parametrize(("size", "shown"), [(-1, "-1"), (True, "True"), ("16384", "'16384'")])
def test_size_that_is_not_a_byte_count_is_corrupt(size: object, shown: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    (tmp_path / "remote").mkdir()
    cache = RemoteCache.open(str(tmp_path / "remote"))
    cache.push(fingerprint, store, lambda message: None)
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"]["model.bin"].update(size=size))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (model.bin: size {shown} is not a byte count); "
        "dropped, building instead"
    ]


def test_entry_that_misstates_a_good_blobs_size_drops_only_the_entry(remote_url: str, tmp_path: Path) -> None:
    """The blob's bytes hash to its key, so the blob is good (other entries may use it):
    only the entry that lies about it goes."""
    store, fingerprint = stored_build(tmp_path / "a")
    cache = RemoteCache.open(remote_url)
    cache.push(fingerprint, store, lambda message: None)
    model = store.files(fingerprint)["model.bin"]
    size = model.stat().st_size
    rewrite_entry(cache, fingerprint, lambda entry: entry["files"]["model.bin"].update(size=size + 1))
    record, messages = pull_messages(cache, fingerprint, tmp_path / "b")
    assert record is None
    assert messages == [
        f"remote cache: entry {fingerprint[:12]} is corrupt (model.bin: {size} bytes, expected {size + 1}); "
        "dropped, building instead"
    ]
    assert cache.location.read(entry_key(fingerprint)) is None
    assert cache.location.size(blob_key(file_digest(model))) == size


def test_location_refuses_keys_outside_its_root(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    location = Location(str(tmp_path / "remote"))
    for key, problem in [
        ("v1/blobs/../../../victim.txt", "has a '..' component"),
        (str(victim), "is absolute"),
        ("v1//blobs", "has an empty or '.' component"),
    ]:
        for action in (location.read, location.delete, location.size):
            with pytest.raises(RemoteError) as error:
                action(key)
            # A key from a remote may be of any length: it is shown cut short.
            assert str(error.value) == (
                f"{tmp_path / 'remote'}: key {quoted(key)} {problem}; refused (only keys under the root are used)"
            )
    assert victim.read_text() == "keep\n"


# --- the remote's root must exist -----------------------------------------------------


def test_missing_remote_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    missing = tmp_path / "shared" / "edgebuild-cache"
    cache = RemoteCache.open(str(missing))
    expected = f"{missing}: no such directory; create it (mkdir -p {missing}) or mount the shared disk"
    for attempt in (
        lambda: cache.has_entry(fingerprint),
        lambda: cache.pull("art", fingerprint, Store(tmp_path / "s"), tmp_path / "art", tmp_path / ".tmp", print),
        lambda: cache.push(fingerprint, store, print),
    ):
        with pytest.raises(RemoteError) as error:
            attempt()
        assert str(error.value) == expected
    assert not (tmp_path / "shared").exists()


def test_remote_root_is_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    (tmp_path / "remote").mkdir()
    cache = RemoteCache.open(str(tmp_path / "remote"))
    checks: list[None] = []
    check_root = cache.location.check_root
    monkeypatch.setattr(cache.location, "check_root", lambda: checks.append(check_root()))
    cache.push(fingerprint, store, lambda message: None)
    assert cache.has(fingerprint) and cache.has_entry(fingerprint)
    assert len(checks) == 1


def test_missing_bucket_is_an_error_naming_it(s3_env: str, tmp_path: Path) -> None:
    bucket = f"edgebuild-absent-{uuid.uuid4().hex[:12]}"
    cache = RemoteCache.open(f"s3://{bucket}/team/cache")
    with pytest.raises(RemoteError) as error:
        cache.has_entry("ab" * 32)
    assert str(error.value) == (
        f"s3://{bucket}/team/cache: bucket '{bucket}' does not exist (or these credentials cannot see it)"
    )


# --- where the remote is configured ------------------------------------------------


def test_remote_from_manifest_environment_or_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    manifest = tmp_path / "sub" / "artifacts.yaml"
    manifest.write_text(TOWER_MANIFEST + "remote_cache: ../shared-cache\n")
    project = Workspace.open(manifest, tmp_path)
    # Relative to the manifest, like every path in it.
    assert project.remote.location.root == str(tmp_path / "shared-cache")

    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", "s3://bucket/prefix")
    assert Workspace.open(manifest, tmp_path).remote_cache_spec == "s3://bucket/prefix"
    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", "off")
    assert Workspace.open(manifest, tmp_path).remote is None
    monkeypatch.delenv("EDGEBUILD_REMOTE_CACHE")
    manifest.write_text(TOWER_MANIFEST)
    assert Workspace.open(manifest, tmp_path).remote is None


def test_misspelt_remote_cache_key_is_an_error(tmp_path: Path) -> None:
    manifest = tmp_path / "artifacts.yaml"
    manifest.write_text(TOWER_MANIFEST + "remote_cahce: s3://bucket\n")
    with pytest.raises(ManifestError) as error:
        Workspace.open(manifest, tmp_path)
    assert str(error.value) == f"{manifest}:9:1: remote_cahce: unknown key 'remote_cahce' (did you mean 'remote_cache'?)"


# --- two clones, one remote, the real CLI --------------------------------------------


@pytest.mark.slow
@pytest.mark.workflow
def test_second_clone_pulls_and_a_corrupt_remote_file_is_rebuilt(remote_url: str, verified_seed: Path, tmp_path: Path,
                                                                  keys: dict[str, Path]) -> None:
    env = signing_env(keys, remote_url)
    first = clone_project(verified_seed, tmp_path / "first")
    fingerprint = first.project().artifact("t").fingerprint
    cache = RemoteCache.open(remote_url)

    # Verified before the remote was set: `doit verify` verifies again, which pushes.
    verified = first.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"[t] remote cache: pushed {fingerprint[:12]} to {remote_url} (7 files, signed by key " in verified.stderr
    assert cache.has(fingerprint)
    again = first.doit("verify", env=env)
    assert "-- verify:t" in again.stdout

    # A second clone, fresh: nothing built, no store, no doit state. Pulled, not exported.
    second = fresh_clone(verified_seed, tmp_path / "second")
    built = second.doit("build", "t", env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"[t] pulled from the remote cache {remote_url} in " in built.stderr
    assert "built in" not in built.stderr and "exported" not in built.stderr
    for name in ("model.onnx", "model.onnx.data", "tower.json"):
        assert (second.root / "build" / "t" / name).read_bytes() == (first.root / "build" / "t" / name).read_bytes()
    # ... and it is verified: its passing report came with it (into the store too) under the
    # team's signature, and the remote already has it, so nothing is left to do.
    checked = second.doit("verify", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "-- verify:t" in checked.stdout and checked.stderr == ""

    # The team's key taken off the trusted list: what came under its signature counts no more.
    withdrawn = {**env, "EDGEBUILD_TRUSTED_KEYS": f"{keys['other']}.pub"}
    withdrawn.pop("EDGEBUILD_SIGNING_KEY")
    status = second.doit("status", "t", env=withdrawn)
    assert "t  up to date (not verified)" in status.stdout, status.stdout
    assert re.search(r"build/t/report\.json is not taken as written: it was pulled from \S+ under the signature of "
                     r"key [0-9a-f]{16}, which is no longer a trusted key here \(EDGEBUILD_TRUSTED_KEYS\); "
                     r"`doit verify t` judges it again", status.stdout), status.stdout
    # Judged here, it counts again (this runner's own verdict), with or without the key.
    judged = second.doit("verify", "t", env={**withdrawn, "EDGEBUILD_REMOTE_CACHE": "off"})
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert "t  up to date (verified)" in second.doit("status", "t", env=withdrawn).stdout
    assert Store(second.root / "cache" / "store").vouched_by(fingerprint) is None

    # One remote file corrupted (same size): detected on pull, never used, rebuilt.
    entry = json.loads(cache.location.read(entry_key(fingerprint)))
    digest = entry["files"]["model.onnx.data"]["digest"]
    flip_byte(cache.location, blob_key(digest))
    shutil.rmtree(second.root / "build")
    shutil.rmtree(second.root / "cache" / "store")
    rebuilt = second.doit("build", "t", env=env)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert f"[t] remote cache: entry {fingerprint[:12]} is corrupt (model.onnx.data: digest " in rebuilt.stderr
    assert f", expected {digest[:12]}); dropped, building instead" in rebuilt.stderr
    assert "[t] built in" in rebuilt.stderr
    assert (second.root / "build" / "t" / "model.onnx.data").read_bytes() == (
        first.root / "build" / "t" / "model.onnx.data"
    ).read_bytes()
    # Verified, then pushed again: the remote is whole.
    repaired = second.doit("verify", env=env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"[t] remote cache: pushed {fingerprint[:12]} to {remote_url}" in repaired.stderr
    assert cache.has(fingerprint)


@pytest.mark.slow
def test_unverified_build_is_not_pushed(verified_seed: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    project = clone_project(verified_seed, tmp_path / "clone")
    # The manifest's remote_cache key, and a threshold no build meets: built, never pushed.
    project.manifest(
        TOWER_MANIFEST
        + "    verify:\n      providers: [DmlExecutionProvider]\n"
        + f"remote_cache: {remote}\n"
    )
    fingerprint = project.project().artifact("t").fingerprint
    result = project.doit("verify", "t")
    assert result.returncode != 0
    assert "t: verification failed: provider:DmlExecutionProvider" in result.stdout + result.stderr
    assert "remote cache" not in result.stderr
    assert not RemoteCache.open(str(remote)).has_entry(fingerprint)


@pytest.mark.slow
def test_unreachable_remote_is_an_error_that_says_how_to_go_without(
    verified_seed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = clone_project(verified_seed, tmp_path / "clone")
    shutil.rmtree(clone.root / "build")
    shutil.rmtree(clone.root / "cache" / "store")
    not_a_directory = tmp_path / "remote"
    not_a_directory.write_text("a file where the remote's directory should be")
    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", str(not_a_directory))
    project = clone.project()
    with pytest.raises(RemoteError) as error:
        make_current(project, project.artifact("t"), log=lambda message: None)
    assert str(error.value) == (
        f"t: EDGEBUILD_REMOTE_CACHE={not_a_directory}: not a directory "
        "(EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)"
    )
    assert not (clone.root / "build" / "t").exists()


# --- every backend's failure is one line naming the setting -----------------------------


@pytest.fixture
def refused_port():
    """A loopback port that refuses connections: bound, never listening, held for the test
    (a port closed by its last user could be taken by another process meanwhile)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def unreachable_remotes(port: int, missing: Path) -> list[tuple[str, str]]:
    """Locations on several fsspec backends that cannot be used, and what is said of each."""
    return [
        # FTP connects as the filesystem is made.
        (f"ftp://127.0.0.1:{port}/cache", "cannot reach it: [Errno 111] Connection refused"),
        ("nosuch://bucket/cache", "cannot open this location: Protocol not known: nosuch"),
        # fsspec's HTTP backend reports the refused connection as a missing file.
        (f"http://127.0.0.1:{port}/cache",
         f"cannot reach it: Cannot connect to host 127.0.0.1:{port} ssl:default [Connect call failed ('127.0.0.1', {port})]"),
        (f"file://{missing}", f"no such directory; create it (mkdir -p {missing}) or mount the shared disk"),
        # A scheme nobody serves, and file URLs that name no directory here (fsspec took the
        # first for the working directory, the second for a path relative to it).
        ("gopher://x/cache", "cannot open this location: Protocol not known: gopher"),
        ("file://", "expected file:///ABSOLUTE/PATH (or the directory's path alone); file:// names no directory on "
                    "this machine"),
        ("file://fileserver/cache", "expected file:///ABSOLUTE/PATH (or the directory's path alone); "
                                    "file://fileserver/cache names no directory on this machine"),
    ]


def test_every_backends_failure_is_one_remote_error_naming_the_location(refused_port: int, tmp_path: Path) -> None:
    for url, said in unreachable_remotes(refused_port, tmp_path / "missing"):
        with pytest.raises(RemoteError) as error:
            RemoteCache.open(url, setting="EDGEBUILD_REMOTE_CACHE").has_entry("ab" * 32)
        assert str(error.value) == f"EDGEBUILD_REMOTE_CACHE={url}: {said}", url
        # Options are named as they are typed; without a setting, the location alone.
        with pytest.raises(RemoteError) as error:
            Location(url, setting="--to").check_root()
        assert str(error.value) == f"--to {url}: {said}", url
        with pytest.raises(RemoteError) as error:
            Location(url).check_root()
        assert str(error.value) == f"{url}: {said}", url


def test_a_read_that_cannot_reach_the_backend_is_not_a_miss(refused_port: int, tmp_path: Path) -> None:
    """A key read from an HTTP server that refuses is an error, never "nothing there"
    (which would make a pull a miss and a build start)."""
    location = Location(f"http://127.0.0.1:{refused_port}/cache", setting="EDGEBUILD_REMOTE_CACHE")
    reason = f"Cannot connect to host 127.0.0.1:{refused_port} ssl:default [Connect call failed ('127.0.0.1', {refused_port})]"
    import hashlib

    for action, verb in ((location.read, "read"), (location.size, "read"),
                         (lambda key: location.digest(key, hashlib.sha256()), "read"),
                         (lambda key: location.download(key, tmp_path / "downloaded"), "download")):
        with pytest.raises(RemoteError) as error:
            action("v1/entries")
        assert str(error.value) == f"EDGEBUILD_REMOTE_CACHE=http://127.0.0.1:{refused_port}/cache: cannot {verb} v1/entries: {reason}"


def test_the_manifests_remote_cache_is_named_by_its_key(refused_port: int, tmp_path: Path) -> None:
    manifest = tmp_path / "artifacts.yaml"
    manifest.write_text(TOWER_MANIFEST + f"remote_cache: ftp://127.0.0.1:{refused_port}/cache\n")
    with pytest.raises(RemoteError) as error:
        Workspace.open(manifest, tmp_path).remote
    assert str(error.value) == (
        f"artifacts.yaml: remote_cache=ftp://127.0.0.1:{refused_port}/cache: cannot reach it: [Errno 111] Connection refused")


def test_commands_say_an_unusable_remote_in_one_line(project_dir, refused_port: int, tmp_path: Path) -> None:
    """doit cache and doit build, with EDGEBUILD_REMOTE_CACHE on each backend: one line
    naming the setting, no traceback; the build fails before anything is exported."""
    project_dir.manifest(TOWER_MANIFEST)
    for url, said in unreachable_remotes(refused_port, tmp_path / "missing"):
        listed = project_dir.doit("cache", env={"EDGEBUILD_REMOTE_CACHE": url})
        assert (listed.returncode, listed.stderr) == (1, f"edgebuild: error: EDGEBUILD_REMOTE_CACHE={url}: {said}\n"), url
    built = project_dir.doit("build", "t", env={"EDGEBUILD_REMOTE_CACHE": f"ftp://127.0.0.1:{refused_port}/cache"})
    assert built.returncode == 1 and "Traceback" not in built.stdout + built.stderr
    assert (f"t: EDGEBUILD_REMOTE_CACHE=ftp://127.0.0.1:{refused_port}/cache: cannot reach it: [Errno 111] Connection "
            "refused (EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)\n") in built.stdout + built.stderr
    assert not (project_dir.root / "build" / "t").exists()


def test_an_export_looks_the_entry_up_once(s3_bucket: str, s3_requests, tmp_path: Path) -> None:
    """The doit process asks the remote cache for the artifact, finds nothing, and hands
    the export to a worker process, which does not ask again (counted on the loopback S3
    server). Its verification then pushes it: the next project pulls it in one lookup."""
    from edgebuild.testing import TinyProject

    site = lay_out_plugin(tmp_path / "site")
    manifest = "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\nartifacts:\n  vc:\n    kind: vision_config_plugin\n    checkpoint: qwen\n"
    env = {"PYTHONPATH": str(site), "EDGEBUILD_REMOTE_CACHE": f"{s3_bucket}/team",
           "EDGEBUILD_S3_ENDPOINT_URL": os.environ["EDGEBUILD_S3_ENDPOINT_URL"]}
    project = TinyProject(tmp_path / "project")
    project.manifest(manifest)
    built = project.doit("build", env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "[vc] built in" in built.stderr
    fingerprint = json.loads((project.root / "build" / "vc" / RECORD_FILE).read_text())["fingerprint"]
    # One lookup of the entry: a HEAD of its key (and s3fs's listing of it as a prefix, when absent).
    lookups = [request for request in s3_requests(fingerprint) if request.startswith("HEAD ")]
    assert len(lookups) == 1, s3_requests(fingerprint)

    verified = project.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    before = len(s3_requests(fingerprint))
    other = TinyProject(tmp_path / "other")
    other.manifest(manifest)
    pulled = other.doit("build", env=env)
    assert pulled.returncode == 0 and "pulled from the remote cache" in pulled.stderr, pulled.stderr
    assert "built in" not in pulled.stderr
    pull_lookups = [request for request in s3_requests(fingerprint)[before:] if request.startswith("HEAD ") and "/entries/" in request]
    assert len(pull_lookups) == 1, s3_requests(fingerprint)[before:]
