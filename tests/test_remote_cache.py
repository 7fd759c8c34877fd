"""The remote cache against a real S3 API (moto's server on loopback) and a local
directory: push and pull, checksums on both ways, corrupt entries reported and
rebuilt, two clones sharing one remote through the real doit CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgebuild.builder import build_artifact
from edgebuild.errors import ManifestError, RemoteError, StoreError
from edgebuild.hashing import file_digest
from edgebuild.project import Project
from edgebuild.record import RECORD_FILE, BuildRecord, output_manifest
from edgebuild.remote import Location
from edgebuild.remote_cache import RemoteCache, blob_key, entry_key
from edgebuild.store import Store

from helpers import TOWER_MANIFEST, clone_project


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
    data = bytearray(location.read(key))
    data[len(data) // 2] ^= 0x01
    location.write(key, bytes(data))


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
    for name in ("model.bin", "config.json", RECORD_FILE, "report.json"):
        assert (target / name).read_bytes() == (store.entry_dir(fingerprint) / name).read_bytes()
    assert other.has(fingerprint)
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
    digest = file_digest(store.entry_dir(fingerprint) / "model.bin")
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
    digest = file_digest(store.entry_dir(fingerprint) / "config.json")
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
    forged = json.loads((store.entry_dir(fingerprint) / RECORD_FILE).read_text())
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


def test_push_refuses_a_damaged_local_entry(remote_url: str, tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    stored = store.entry_dir(fingerprint) / "model.bin"
    data = bytearray(stored.read_bytes())
    data[0] ^= 0xFF
    stored.write_bytes(bytes(data))
    cache = RemoteCache.open(remote_url)
    with pytest.raises(StoreError) as error:
        cache.push(fingerprint, store, lambda message: None)
    assert str(error.value) == (
        f"store entry {fingerprint[:12]}: model.bin changed since build; not pushed to {remote_url}"
    )
    assert not cache.has_entry(fingerprint)


# --- where the remote is configured ------------------------------------------------


def test_remote_from_manifest_environment_or_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    manifest = tmp_path / "sub" / "artifacts.yaml"
    manifest.write_text(TOWER_MANIFEST + "remote_cache: ../shared-cache\n")
    project = Project.load(manifest, tmp_path)
    # Relative to the manifest, like every path in it.
    assert project.remote_cache.location.root == str(tmp_path / "shared-cache")

    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", "s3://bucket/prefix")
    assert Project.load(manifest, tmp_path).remote_cache_spec == "s3://bucket/prefix"
    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", "off")
    assert Project.load(manifest, tmp_path).remote_cache is None
    monkeypatch.delenv("EDGEBUILD_REMOTE_CACHE")
    manifest.write_text(TOWER_MANIFEST)
    assert Project.load(manifest, tmp_path).remote_cache is None


def test_misspelt_remote_cache_key_is_an_error(tmp_path: Path) -> None:
    manifest = tmp_path / "artifacts.yaml"
    manifest.write_text(TOWER_MANIFEST + "remote_cahce: s3://bucket\n")
    with pytest.raises(ManifestError) as error:
        Project.load(manifest, tmp_path)
    assert str(error.value) == f"{manifest}:9:1: remote_cahce: unknown key 'remote_cahce' (did you mean 'remote_cache'?)"


# --- two clones, one remote, the real CLI --------------------------------------------


def fresh_clone(seed: Path, target: Path):
    """The seed's checkout without anything it built or cached (a new clone)."""
    clone = clone_project(seed, target)
    for name in ("build", "cache", "artifacts.lock"):
        path = clone.root / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return clone


@pytest.mark.slow
def test_second_clone_pulls_and_a_corrupt_remote_file_is_rebuilt(remote_url: str, verified_seed: Path, tmp_path: Path) -> None:
    env = {"EDGEBUILD_REMOTE_CACHE": remote_url}
    first = clone_project(verified_seed, tmp_path / "first")
    fingerprint = first.project().fingerprint("t")
    cache = RemoteCache.open(remote_url)

    # Verified before the remote was set: `doit verify` verifies again, which pushes.
    verified = first.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"[t] remote cache: pushed {fingerprint[:12]} to {remote_url} (6 files)" in verified.stderr
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
    # ... and it verifies, and the remote already has it.
    checked = second.doit("verify", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ".  verify:t" in checked.stdout
    assert f"[t] remote cache: {fingerprint[:12]} already in {remote_url}" in checked.stderr

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
    project = clone_project(verified_seed, tmp_path / "clone")
    # The manifest's remote_cache key, and a threshold no build meets: built, never pushed.
    project.manifest(
        TOWER_MANIFEST
        + "    verify:\n      providers: [DmlExecutionProvider]\n"
        + f"remote_cache: {remote}\n"
    )
    fingerprint = project.project().fingerprint("t")
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
    fingerprint = project.fingerprint("t")
    with pytest.raises(RemoteError) as error:
        build_artifact(project, "t", log=lambda message: None)
    assert str(error.value) == (
        f"t: {not_a_directory}/{entry_key(fingerprint)}: cannot read: [Errno 20] Not a directory: "
        f"'{not_a_directory}/{entry_key(fingerprint)}' (EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)"
    )
    assert not (clone.root / "build" / "t").exists()
