"""`doit publish` against a real S3 API (moto's server on loopback) and a local
directory: content-addressed entries, provenance, checksums, the index, and
nothing published unless everything verified; entries that appear whole or not
at all, even with two publishers or a killed one; published bytes checked on
every republish. Also: the CI workflow runs the script that .ci/run runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import edgebuild.run.publish
from edgebuild.errors import PublishError
from edgebuild.core.faults import FAULT_ENV, InjectedFault
from edgebuild.run.publish import EntryFiles, publish, put_entry, read_index
from edgebuild.cache.location import Location

from helpers import REPO, TOWER_MANIFEST, clone_project, git, flipped, waits_released

STRICT = (
    "  strict:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
    "    verify:\n      providers: [DmlExecutionProvider]\n"
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_publish_twice_publishes_once(remote_url: str, verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    git(project.root, "init", "-q")
    git(project.root, "add", "artifacts.yaml", "dodo.py")
    git(project.root, "commit", "-q", "-m", "manifest")
    commit = git(project.root, "rev-parse", "HEAD")
    fingerprint = project.project().artifact("t").fingerprint
    where = f"{remote_url}/t/{fingerprint}"

    first = project.doit("publish", "--to", remote_url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"published t {fingerprint[:12]} to {where}\n" in first.stdout
    assert f"updated {remote_url}/index.json" in first.stdout

    destination = Location(remote_url)
    index_bytes = destination.read("index.json")
    index = json.loads(index_bytes)
    checksums = destination.read(f"t/{fingerprint}/SHA256SUMS")
    assert index["format"] == 1
    row = index["artifacts"]["t"][fingerprint]
    assert row["path"] == f"t/{fingerprint}/"
    assert row["checksum"] == "sha256:" + sha256(checksums)
    assert row["kind"] == "qwen3_5_vision_tower"
    assert (row["commit"], row["signed"], index["latest"]) == (commit, False, {"t": fingerprint})

    # SHA256SUMS covers every published file, in `sha256sum -c` form, and each matches.
    listed = dict(line.split("  ")[::-1] for line in checksums.decode().splitlines())
    # (Unsigned: this runner has no EDGEBUILD_SIGNING_KEY, so no model.sig; test_release.py signs.)
    assert set(listed) == {"model.onnx", "model.onnx.data", "tower.json", "consumer.json", "report.json", "report.md", "provenance.json",
                           "provenance.intoto.json"}
    for name, digest in listed.items():
        assert sha256(destination.read(f"t/{fingerprint}/{name}")) == digest
    built = project.root / "build" / "t"
    assert destination.read(f"t/{fingerprint}/model.onnx.data") == (built / "model.onnx.data").read_bytes()

    # Provenance: enough to trace the file back to its inputs.
    provenance = json.loads(destination.read(f"t/{fingerprint}/provenance.json"))
    record = json.loads((built / ".edgebuild.json").read_text())
    assert provenance["fingerprint"] == fingerprint
    assert provenance["inputs"] == record["inputs"] and provenance["versions"] == record["versions"]
    assert provenance["manifest"]["file"] == "artifacts.yaml" and provenance["manifest"]["entry"] == "t"
    assert provenance["manifest"]["parameters"]["image_size"] == [64, 64]
    assert provenance["git"] == {"commit": commit, "dirty": False, "allow_dirty": False}
    assert provenance["edgebuild_version"] == "0.1.0"
    assert provenance["verification"]["passed"] is True
    assert provenance["outputs"]["model.onnx.data"] == {
        "size": record["outputs"]["model.onnx.data"]["size"],
        "blake3": record["outputs"]["model.onnx.data"]["digest"],
        "sha256": listed["model.onnx.data"],
    }

    second = project.doit("publish", "--to", remote_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"t {fingerprint[:12]} already published at {where}\n" in second.stdout
    assert "updated" not in second.stdout
    assert destination.read("index.json") == index_bytes


@pytest.mark.slow
def test_failed_verification_publishes_nothing(verified_seed: Path, tmp_path: Path, s3_bucket: str) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    project.manifest(TOWER_MANIFEST + STRICT)
    directory = str(tmp_path / "published")
    result = project.doit("publish", "--to", directory, "--allow-dirty")
    assert result.returncode == 1
    assert result.stderr.endswith(
        "edgebuild: error: nothing published:\n  strict: verification failed (see build/strict/report.md)\n"
    )
    # The same refusal, in process, for an S3 destination (verifying once is enough).
    with pytest.raises(PublishError) as error:
        workspace = project.project()
        publish(workspace, [workspace.artifact("t"), workspace.artifact("strict")], s3_bucket, allow_dirty=True)
    assert str(error.value) == "nothing published:\n  strict: verification failed (see build/strict/report.md)"
    for destination in (Location(directory), Location(s3_bucket)):
        assert destination.read("index.json") is None
        assert not destination.fs.exists(destination.path("t"))
    # Named alone, the verified one publishes.
    alone = project.doit("publish", "t", "--to", s3_bucket, "--allow-dirty")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert list(json.loads(Location(s3_bucket).read("index.json"))["artifacts"]) == ["t"]


@pytest.mark.slow
def test_index_gathers_every_artifact_and_never_overwrites(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    destination = tmp_path / "published"
    assert project.doit("publish", "--to", f"file://{destination}", "--allow-dirty").returncode == 0
    # Another artifact with the same build (restored from the store, verified): a second row.
    project.manifest(TOWER_MANIFEST + "  t_copy:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n")
    result = project.doit("publish", "t_copy", "--to", str(destination), "--allow-dirty")
    assert result.returncode == 0, result.stdout + result.stderr
    fingerprint = project.project().artifact("t").fingerprint
    index = json.loads((destination / "index.json").read_text())
    assert {name: list(rows) for name, rows in index["artifacts"].items()} == {"t": [fingerprint], "t_copy": [fingerprint]}

    # The destination claims other bytes under this key (another build of the same
    # fingerprint): an error, and nothing there is touched.
    sums = destination / "t" / fingerprint / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    lines = [("0" * 64 + "  model.onnx") if line.endswith("  model.onnx") else line for line in lines]
    sums.write_text("\n".join(lines) + "\n")
    before = {path: path.read_bytes() for path in destination.rglob("*") if path.is_file()}
    clash = project.doit("publish", "t", "--to", str(destination), "--allow-dirty")
    assert clash.returncode == 1
    assert clash.stderr.endswith(
        f"edgebuild: error: {destination}/t/{fingerprint}: already published with different content "
        "(model.onnx); not overwritten\n"
    )
    assert {path: path.read_bytes() for path in destination.rglob("*") if path.is_file()} == before


@pytest.mark.slow
def test_publish_refuses_what_no_commit_describes(verified_seed: Path, tmp_path: Path) -> None:
    """Outside git, with no commit, with uncommitted changes: refused before anything
    runs, unless --allow-dirty, which the provenance records. The lock file, which
    `doit verify` rewrites just before publishing, does not count."""
    project = clone_project(verified_seed, tmp_path / "clone")
    destination = tmp_path / "published"
    advice = "commit, or pass --allow-dirty to publish anyway (recorded in provenance.json)"

    outside = project.doit("publish", "--to", str(destination))
    assert outside.returncode == 3
    assert outside.stderr == (
        f"edgebuild: error: {project.root} is not in a git work tree, so no commit records what produced "
        f"these artifacts; {advice}\n"
    )
    assert outside.stdout == "" and not destination.exists()

    git(project.root, "init", "-q")
    no_commit = project.doit("publish", "--to", str(destination))
    assert no_commit.returncode == 3
    assert no_commit.stderr == f"edgebuild: error: the git repository at {project.root} has no commit yet; {advice}\n"

    git(project.root, "add", "artifacts.yaml", "dodo.py", "artifacts.lock")
    git(project.root, "commit", "-q", "-m", "manifest")
    commit = git(project.root, "rev-parse", "HEAD")
    lock = project.root / "artifacts.lock"
    lock.write_text(json.dumps(json.loads(lock.read_text())))  # rewritten (verify puts it back)
    (project.root / "artifacts.yaml").write_text(TOWER_MANIFEST + "    description: edited\n")
    dirty = project.doit("publish", "--to", str(destination))
    assert dirty.returncode == 3
    assert dirty.stderr == f"edgebuild: error: the work tree has uncommitted changes (artifacts.yaml); {advice}\n"
    assert not destination.exists()

    allowed = project.doit("publish", "--to", str(destination), "--allow-dirty")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    fingerprint = project.project().artifact("t").fingerprint
    provenance = json.loads((destination / "t" / fingerprint / "provenance.json").read_text())
    assert provenance["git"] == {"commit": commit, "dirty": True, "allow_dirty": True}

    git(project.root, "commit", "-q", "-am", "describe t")
    lock.write_text(json.dumps(json.loads(lock.read_text())))
    clean = project.doit("publish", "--to", str(destination))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"t {fingerprint[:12]} already published" in clean.stdout


def test_work_tree_check(tmp_path: Path) -> None:
    """What counts as uncommitted: tracked files changed, the manifest untracked;
    not the lock file, not other untracked files."""
    from edgebuild.core.manifest import load_manifest
    from edgebuild.core.project import BuildGraph
    from edgebuild.run.publish import check_work_tree

    (tmp_path / "artifacts.yaml").write_text(TOWER_MANIFEST)
    (tmp_path / "artifacts.lock").write_text("{}")
    project = BuildGraph(load_manifest(tmp_path / "artifacts.yaml"))
    git(tmp_path, "init", "-q")
    (tmp_path / "other.txt").write_text("x")
    git(tmp_path, "add", "other.txt", "artifacts.lock")
    git(tmp_path, "commit", "-q", "-m", "first")
    with pytest.raises(PublishError) as error:
        check_work_tree(project)
    assert "uncommitted changes (artifacts.yaml (untracked))" in str(error.value)
    git(tmp_path, "add", "artifacts.yaml")
    git(tmp_path, "commit", "-q", "-m", "manifest")
    commit = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "artifacts.lock").write_text('{"changed": true}')
    (tmp_path / "untracked.txt").write_text("y")
    assert check_work_tree(project) == {"commit": commit, "dirty": False, "allow_dirty": False}
    (tmp_path / "other.txt").write_text("changed")
    git(tmp_path, "mv", "other.txt", "moved.txt")
    with pytest.raises(PublishError) as error:
        check_work_tree(project)
    assert str(error.value) == (
        "the work tree has uncommitted changes (moved.txt); "
        "commit, or pass --allow-dirty to publish anyway (recorded in provenance.json)"
    )
    assert check_work_tree(project, allow_dirty=True) == {"commit": commit, "dirty": True, "allow_dirty": True}


def test_publish_needs_a_destination(project_dir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit("publish")
    assert result.returncode == 3
    assert "give --to DEST: a directory or an fsspec URL such as s3://bucket/artifacts" in result.stderr


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"format": 7}', "expected an index of format 1, found format 7"),
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("[]", "expected an index of format 1 (an object), found an array"),
        ('{"format": 1, "artifacts": []}', "'artifacts' is an array, expected an object"),
        ('{"format": 1, "artifacts": {"t": "x"}}', "artifacts['t'] is a string, expected an object of fingerprints"),
        ('{"format": 1, "artifacts": {"t": {"ab": null}}}', "artifacts['t']['ab'] is null, expected an object"),
    ],
    ids=["format", "not-json", "array", "artifacts-array", "rows-string", "row-null"],
)
def test_unreadable_index_is_not_overwritten(text: str, problem: str, tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text(text)
    with pytest.raises(PublishError) as error:
        read_index(Location(str(tmp_path)))
    assert str(error.value) == f"{tmp_path}/index.json: {problem}; not overwritten"
    assert (tmp_path / "index.json").read_text() == text


# --- one entry: whole or not at all, checked when found --------------------------------

FINGERPRINT = "ab" * 32
ENTRY_FILES = {"model.bin", "report.json", "provenance.json", "SHA256SUMS"}


def entry_files(root: Path, model: bytes = b"weights" * 1000, report: bytes = b'{"passed": true}\n') -> EntryFiles:
    """An entry of artifact ``art`` as publishing prepares it: an output file on disk,
    a report and provenance in memory."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.bin").write_bytes(model)
    files = {"model.bin": root / "model.bin", "report.json": report, "provenance.json": b'{"format": 1}\n'}
    return EntryFiles.of("art", FINGERPRINT, files)


def published_files(location: Location) -> set[str]:
    """Every file under ``art/<fingerprint>/`` (a temporary file there would show)."""
    prefix = location.path(f"art/{FINGERPRINT}")
    return {path[len(prefix) + 1:] for path in location.fs.find(prefix)}


def assert_consistent(location: Location) -> bytes:
    """The entry's SHA256SUMS lists exactly the files there, each with its bytes (`sha256sum -c`)."""
    sums = location.read(f"art/{FINGERPRINT}/SHA256SUMS")
    listed = dict(line.split("  ")[::-1] for line in sums.decode().splitlines())
    assert set(listed) | {"SHA256SUMS"} == published_files(location)
    for name, digest in listed.items():
        assert sha256(location.read(f"art/{FINGERPRINT}/{name}")) == digest, name
    return sums


def snapshot(location: Location) -> dict[str, bytes]:
    return {path: location.fs.cat_file(path) for path in location.fs.find(location.root)}


def test_entry_is_written_whole_then_found_published(remote_url: str, tmp_path: Path) -> None:
    location = Location(remote_url)
    messages: list[str] = []
    first = put_entry(location, entry_files(tmp_path / "build"), messages.append)
    assert first.written is True and first.path == f"art/{FINGERPRINT}/"
    assert published_files(location) == ENTRY_FILES
    assert first.checksum == "sha256:" + sha256(assert_consistent(location))
    if location.is_local:
        # The staging directory was renamed into place: nothing else under art/.
        assert sorted(os.listdir(location.local_path("art"))) == [FINGERPRINT]
    again = put_entry(location, entry_files(tmp_path / "build"), messages.append)
    assert again.written is False and again.checksum == first.checksum
    assert messages == [
        f"published art {FINGERPRINT[:12]} to {remote_url}/art/{FINGERPRINT}",
        f"art {FINGERPRINT[:12]} already published at {remote_url}/art/{FINGERPRINT}",
    ]


def test_republish_checks_the_published_bytes(remote_url: str, tmp_path: Path) -> None:
    """A published file changed in place is an error naming it, never 'already published'."""
    location = Location(remote_url)
    item = entry_files(tmp_path / "build")
    put_entry(location, item, lambda message: None)
    where = f"{remote_url}/art/{FINGERPRINT}"
    model = location.read(f"art/{FINGERPRINT}/model.bin")
    location.write(f"art/{FINGERPRINT}/model.bin", flipped(model, 100, 0x01))
    before = snapshot(location)
    with pytest.raises(PublishError) as error:
        put_entry(location, item, lambda message: None)
    assert str(error.value) == (
        f"{where}: published file model.bin does not match SHA256SUMS; not overwritten (delete {where}/ and publish again)"
    )
    assert snapshot(location) == before

    location.write(f"art/{FINGERPRINT}/model.bin", model)
    location.delete(f"art/{FINGERPRINT}/report.json")
    before = snapshot(location)
    with pytest.raises(PublishError) as error:
        put_entry(location, item, lambda message: None)
    assert str(error.value) == (
        f"{where}: published file report.json is missing; not overwritten (delete {where}/ and publish again)"
    )
    assert snapshot(location) == before


@pytest.mark.parametrize("name", ["model.bin", "SHA256SUMS"])
def test_a_fifo_in_a_published_entry_is_one_line_never_waited_on(name: str, tmp_path: Path) -> None:
    """A republish read a FIFO in the destination's entry and waited for a writer forever."""
    location = Location(str(tmp_path / "dest"))
    item = entry_files(tmp_path / "build")
    put_entry(location, item, lambda message: None)
    fifo = location.local_path(f"art/{FINGERPRINT}/{name}")
    fifo.unlink()
    os.mkfifo(fifo)
    with waits_released(fifo) as released, pytest.raises(PublishError) as error:
        put_entry(location, item, lambda message: None)
    assert released == []
    where = f"{tmp_path / 'dest'}/art/{FINGERPRINT}"
    found = "published file model.bin" if name == "model.bin" else "SHA256SUMS"
    assert str(error.value) == (
        f"{where}: {found} is a FIFO (named pipe), not a regular file; not overwritten (delete {where}/ and publish again)"
    )
    assert published_files(location) == ENTRY_FILES


@pytest.mark.parametrize(
    "sums",
    [b"garbage\n", ("0" * 64 + "  ../victim.txt\n").encode(), ("0" * 64 + "  model.bin\n").encode() * 2],
    ids=["not-a-checksum-line", "outside-the-entry", "listed-twice"],
)
def test_malformed_published_checksums_are_an_error(sums: bytes, tmp_path: Path) -> None:
    victim = tmp_path / "dest" / "art" / "victim.txt"
    location = Location(str(tmp_path / "dest"))
    item = entry_files(tmp_path / "build")
    put_entry(location, item, lambda message: None)
    victim.write_text("keep\n")
    location.write(f"art/{FINGERPRINT}/SHA256SUMS", sums)
    with pytest.raises(PublishError) as error:
        put_entry(location, item, lambda message: None)
    line = 2 if sums.count(b"\n") == 2 else 1
    assert str(error.value) == (
        f"{tmp_path / 'dest'}/art/{FINGERPRINT}/SHA256SUMS: line {line} is not '<sha256>  <file>' for a new file; "
        "not overwritten"
    )
    assert victim.read_text() == "keep\n"


def test_entry_directory_without_checksums_is_not_overwritten(tmp_path: Path) -> None:
    """What an interrupted publish of an older edgebuild left at the final path."""
    location = Location(str(tmp_path / "dest"))
    location.write(f"art/{FINGERPRINT}/model.bin", b"partial")
    where = f"{tmp_path / 'dest'}/art/{FINGERPRINT}"
    with pytest.raises(PublishError) as error:
        put_entry(location, entry_files(tmp_path / "build"), lambda message: None)
    assert str(error.value) == (
        f"{where}: holds files but no SHA256SUMS (a publish that was interrupted or is still running); "
        f"not overwritten (delete {where}/ if no publish is running)"
    )
    assert published_files(location) == {"model.bin"}


def test_second_publisher_of_one_fingerprint_never_mixes_files(
    remote_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two publishers of one fingerprint with equally valid but different reports, the
    second running entirely while the first has written its files and not yet made
    its entry appear: exactly one entry, and its SHA256SUMS matches every file."""
    location = Location(remote_url)
    first = entry_files(tmp_path / "first", report=b'{"passed": true, "seconds": 1}\n')
    second = entry_files(tmp_path / "second", report=b'{"passed": true, "seconds": 2}\n')
    where = f"{remote_url}/art/{FINGERPRINT}"
    first_messages: list[str] = []
    second_outcome: list[str] = []

    def second_publisher_runs(point: str) -> None:
        assert point == "publish.after_files"
        monkeypatch.setattr(edgebuild.run.publish, "fault_point", lambda point: None)
        try:
            put_entry(Location(remote_url), second, second_outcome.append)
        except PublishError as error:
            second_outcome.append(str(error))

    monkeypatch.setattr(edgebuild.run.publish, "fault_point", second_publisher_runs)
    result = put_entry(location, first, first_messages.append)
    sums = assert_consistent(location)
    if location.is_local:
        # The second renamed its directory into place first; the first finds it published.
        assert second_outcome == [f"published art {FINGERPRINT[:12]} to {where}"]
        assert result.written is False and sums == second.checksums
        assert first_messages == [f"art {FINGERPRINT[:12]} already published at {where}"]
        assert sorted(os.listdir(location.local_path("art"))) == [FINGERPRINT]
    else:
        # On S3 no key is overwritten: the first's files are there, so the second stops.
        assert second_outcome == [
            f"{where}: report.json holds other bytes, from another publish of this fingerprint that is unfinished "
            f"or still running; not overwritten (delete {where}/ if no publish is running)"
        ]
        assert result.written is True and sums == first.checksums


def test_second_publisher_with_other_outputs_is_refused(
    remote_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with a byte-different build: whichever loses says so; the entry is
    the winner's, whole."""
    location = Location(remote_url)
    first = entry_files(tmp_path / "first", model=b"one build" * 100)
    second = entry_files(tmp_path / "second", model=b"another build" * 100)
    where = f"{remote_url}/art/{FINGERPRINT}"
    second_outcome: list[str] = []

    def second_publisher_runs(point: str) -> None:
        monkeypatch.setattr(edgebuild.run.publish, "fault_point", lambda point: None)
        try:
            put_entry(Location(remote_url), second, second_outcome.append)
        except PublishError as error:
            second_outcome.append(str(error))

    monkeypatch.setattr(edgebuild.run.publish, "fault_point", second_publisher_runs)
    if location.is_local:
        with pytest.raises(PublishError) as error:
            put_entry(location, first, lambda message: None)
        assert str(error.value) == f"{where}: already published with different content (model.bin); not overwritten"
        assert second_outcome == [f"published art {FINGERPRINT[:12]} to {where}"]
        assert assert_consistent(location) == second.checksums
    else:
        assert put_entry(location, first, lambda message: None).written is True
        assert second_outcome == [
            f"{where}: model.bin holds other bytes, from another publish of this fingerprint that is unfinished "
            f"or still running; not overwritten (delete {where}/ if no publish is running)"
        ]
        assert assert_consistent(location) == first.checksums


KILLED_PUBLISH = """
import sys
from pathlib import Path
from edgebuild.run.publish import EntryFiles, put_entry
from edgebuild.cache.location import Location
root = Path(sys.argv[2])
files = {"model.bin": root / "model.bin", "report.json": (root / "report.json").read_bytes(),
         "provenance.json": b'{"format": 1}\\n'}
put_entry(Location(sys.argv[1]), EntryFiles.of("art", sys.argv[3], files), print)
"""


def test_killed_publish_leaves_no_entry_and_a_retry_publishes(remote_url: str, tmp_path: Path) -> None:
    item = entry_files(tmp_path / "build")
    (tmp_path / "build" / "report.json").write_bytes(item.files["report.json"])
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_PUBLISH, remote_url, str(tmp_path / "build"), FINGERPRINT],
        cwd=REPO, env={**os.environ, FAULT_ENV: "publish.after_files=kill"}, capture_output=True, text=True, timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    location = Location(remote_url)
    assert location.read(f"art/{FINGERPRINT}/SHA256SUMS") is None
    if location.is_local:
        # Its files are in a staging directory beside the entry, never at the entry's path
        # (and the lock its publisher held while it lived).
        staging, lock = sorted(os.listdir(location.local_path("art")))
        assert staging.startswith(f".{FINGERPRINT}.") and staging.endswith(".partial") and lock == f"{staging}.lock"
        assert sorted(os.listdir(location.local_path(f"art/{staging}"))) == sorted(ENTRY_FILES)
    else:
        assert published_files(location) == ENTRY_FILES - {"SHA256SUMS"}
    # The retry (the same bytes) publishes a whole entry, with no leftover inside it.
    assert put_entry(location, item, lambda message: None).written is True
    assert published_files(location) == ENTRY_FILES
    assert assert_consistent(location) == item.checksums
    if location.is_local:
        # The abandoned staging directory went with the retry: only the entry is left.
        assert os.listdir(location.local_path("art")) == [FINGERPRINT]


def test_a_live_publishers_staging_is_left_alone(tmp_path: Path) -> None:
    """Cleaning up after killed publishes must not pull the files from under one at work."""
    import fcntl

    from edgebuild.run.publish import _remove_abandoned_staging

    art = tmp_path / "art"
    live, dead = art / f".{FINGERPRINT}.aaaa.partial", art / f".{FINGERPRINT}.bbbb.partial"
    for staging in (live, dead):
        staging.mkdir(parents=True)
        (staging / "model.bin").write_bytes(b"x")
        Path(f"{staging}.lock").touch()
    with open(f"{live}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _remove_abandoned_staging(art)
    assert sorted(os.listdir(art)) == [live.name, f"{live.name}.lock"]


def test_killed_s3_publish_then_other_bytes_is_an_error(s3_bucket: str, tmp_path: Path) -> None:
    """On S3 an unfinished entry holding other bytes is never overwritten: the message says what to delete."""
    item = entry_files(tmp_path / "build")
    (tmp_path / "build" / "report.json").write_bytes(item.files["report.json"])
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_PUBLISH, s3_bucket, str(tmp_path / "build"), FINGERPRINT],
        cwd=REPO, env={**os.environ, FAULT_ENV: "publish.after_files=kill"}, capture_output=True, text=True, timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    location = Location(s3_bucket)
    before = snapshot(location)
    where = f"{s3_bucket}/art/{FINGERPRINT}"
    with pytest.raises(PublishError) as error:
        put_entry(location, entry_files(tmp_path / "other", report=b'{"passed": true, "seconds": 3}\n'), print)
    assert str(error.value) == (
        f"{where}: report.json holds other bytes, from another publish of this fingerprint that is unfinished "
        f"or still running; not overwritten (delete {where}/ if no publish is running)"
    )
    assert snapshot(location) == before


def test_publish_that_fails_after_its_files_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, "publish.after_files=raise")
    location = Location(str(tmp_path / "dest"))
    with pytest.raises(InjectedFault) as error:
        put_entry(location, entry_files(tmp_path / "build"), lambda message: None)
    assert str(error.value) == f"{FAULT_ENV}=publish.after_files=raise"
    assert os.listdir(tmp_path / "dest" / "art") == []


def test_a_destination_is_checked_before_anything_is_built(project_dir, tmp_path: Path) -> None:
    """No bucket, inside the git work tree, an index this version cannot merge into: each
    one line before the build, and nothing written anywhere."""
    import subprocess as run

    project_dir.manifest(TOWER_MANIFEST)
    no_bucket = project_dir.doit("publish", "t", "--to", "s3://", "--allow-dirty")
    assert no_bucket.returncode == 3
    assert no_bucket.stderr.strip().splitlines()[-1] == (
        "edgebuild: error: --to s3://: names no bucket; expected s3://BUCKET or s3://BUCKET/PREFIX")

    index = tmp_path / "dest" / "index.json"
    index.parent.mkdir()
    index.write_text("[" * 100_000)
    malformed = project_dir.doit("publish", "t", "--to", str(index.parent), "--allow-dirty")
    assert malformed.returncode == 3
    assert malformed.stderr.strip().splitlines()[-1] == (
        f"edgebuild: error: {index}: not valid JSON: nested too deeply; not overwritten")

    run.run(["git", "init", "-q"], cwd=project_dir.root, check=True)
    (project_dir.root / ".gitignore").write_text("/dist/\n")
    here = project_dir.doit("publish", "t", "--to", ".", "--allow-dirty")
    assert here.returncode == 3
    assert here.stderr.strip().splitlines()[-1] == (
        f"edgebuild: error: .: inside the git work tree {project_dir.root}, where published files would be untracked "
        "files of the repository; publish outside it, or into a folder its .gitignore ignores")
    assert not (project_dir.root / "build").exists() and index.read_text() == "[" * 100_000
    # A folder git ignores is a destination (dist/ for a local try).
    from edgebuild.run.publish import check_destination

    assert check_destination(project_dir.project(), str(project_dir.root / "dist")).is_local
    with pytest.raises(PublishError):
        check_destination(project_dir.project(), str(project_dir.root / "published"))


@pytest.mark.parametrize("linked", ["t", "index.json"])
def test_a_link_below_a_local_destination_is_refused_before_anything_is_built(project_dir, tmp_path: Path,
                                                                             linked: str) -> None:
    """An artifact's folder or the index linked elsewhere would take published files
    there: refused in one line, nothing built, nothing written through it."""
    project_dir.manifest(TOWER_MANIFEST)
    destination, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    destination.mkdir()
    elsewhere.mkdir()
    (destination / linked).symlink_to(elsewhere)
    result = project_dir.doit("publish", "t", "--to", str(destination), "--allow-dirty")
    assert result.returncode == 3
    assert result.stderr.strip().splitlines()[-1] == (
        f"edgebuild: error: {destination / linked}: a symbolic link to {elsewhere}; publishing writes real files and "
        "folders inside the destination and never through a link: remove the link")
    assert not (project_dir.root / "build").exists() and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("inside", ["build", "build/published", "cache", "cache/store/x"])
def test_destination_inside_build_or_cache_is_refused(inside: str, project_dir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    for destination in (str(project_dir.root / inside), f"file://{project_dir.root / inside}"):
        with pytest.raises(PublishError) as error:
            workspace = project_dir.project()
            publish(workspace, [workspace.artifact("t")], destination)
        assert str(error.value) == (
            f"{destination}: inside the project's {inside.split('/')[0]}/ directory, which edgebuild replaces "
            "and prunes; publish somewhere else"
        )
    assert not (project_dir.root / "build").exists() and not (project_dir.root / "cache" / "store").exists()


# --- CI ---------------------------------------------------------------------------------


def test_workflow_runs_the_ci_steps_script() -> None:
    """The workflow is not untested text: its steps are scripts/ci_steps.sh, which .ci/run runs."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "scripts/ci_steps.sh" in runs
    assert any(step.get("uses", "").startswith("actions/cache") and "cache/" in str(step["with"]["path"]) for step in steps)
    ci_run = (REPO / ".ci" / "run").read_text()
    # The README's test command (its quickstart's second command), verbatim.
    quickstart = (REPO / "README.md").read_text().split("## Quickstart\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    test_command = [line for line in quickstart.splitlines() if line and not line.startswith("#")][1]
    assert re.search(r"python -m pytest( |$)", test_command) and test_command in ci_run
    assert "scripts/ci_steps.sh" in ci_run
    assert (REPO / "scripts" / "ci_steps.sh").stat().st_mode & 0o111


def test_an_untracked_input_file_is_an_uncommitted_change(tmp_path: Path, siglip_checkpoint: Path) -> None:
    """A calibration image a glob matches but git does not track: no commit reproduces the
    artifact, so publishing refuses (or, allowed, records the tree as dirty)."""
    import shutil

    from edgebuild.run.publish import check_work_tree
    from edgebuild.run.workspace import Workspace
    from helpers import commit, lay_out_siglip_inputs

    root = tmp_path / "p"
    root.mkdir()
    lay_out_siglip_inputs(root, siglip_checkpoint)
    (root / "artifacts.yaml").write_text(
        "checkpoints:\n  siglip:\n    path: ckpt\nartifacts:\n  q:\n    kind: siglip_f143\n    checkpoint: siglip\n"
        "    calibration:\n      images: [\"images/*.png\"]\n    held_out:\n      images: [\"held_out/*.png\"]\n"
        "  q_onnx:\n    kind: siglip_f143_onnx\n    source: q\n")
    (root / ".gitignore").write_text("/ckpt/\n/cache/\n/build/\n")
    commit(root, ".gitignore", "artifacts.yaml", "images", "held_out")
    workspace = Workspace.open(root / "artifacts.yaml", root)
    assert check_work_tree(workspace, artifacts=[workspace.artifact("q_onnx")])["dirty"] is False

    shutil.copy(sorted((root / "held_out").iterdir())[0], root / "images" / "zz [new].png")
    workspace = Workspace.open(root / "artifacts.yaml", root)
    # Read by q, which q_onnx is made from: publishing q_onnx alone is refused too.
    with pytest.raises(PublishError, match=r"uncommitted changes \(images/zz \[new\]\.png \(untracked\)\)"):
        check_work_tree(workspace, artifacts=[workspace.artifact("q_onnx")])
    assert check_work_tree(workspace, allow_dirty=True, artifacts=[workspace.artifact("q_onnx")])["dirty"] is True
