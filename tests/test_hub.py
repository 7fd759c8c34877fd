"""Checkpoints from the Hugging Face cache: a repo id at a commit or a ref, resolved
offline; a missing revision or file is one error with the command that downloads it;
the fingerprint is the one of the same files by path; the repo, commit and etags go
into the record, the lock file and the provenance. Each test lays out a cache under
its own temporary directory, and no socket may connect while it runs."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgebuild.errors import CheckpointError
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace

from helpers import REPO, TOWER_MANIFEST, clone_project, flip_bits

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
CALIBRATION = REPO / "data" / "calibration"


def cache_snapshot(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """``source``'s files as the Hugging Face cache keeps a download of ``repo_id`` at
    ``commit``: content under ``blobs/<etag>`` (sha256 for SafeTensors, as the Hub's
    LFS files; the git blob id for the small ones), ``snapshots/<commit>/<file>`` a
    relative link to it, and ``refs/<ref>`` holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for path in sorted(source.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            etag = hashlib.sha256(data).hexdigest()
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / etag).write_bytes(data)
        relative = path.relative_to(source)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(relative.parts) + 1), "blobs", etag))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache that this process and its children use, offline."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(f"a test of the Hugging Face cache tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def write_manifest(root: Path, checkpoint: str, artifact: str = "tower") -> BuildGraph:
    artifacts = {
        "tower": """\
            t:
              kind: qwen3_5_vision_tower
              checkpoint: c
              image_size: 64
        """,
        "siglip": f"""\
            q:
              kind: siglip_f143
              checkpoint: c
              calibration:
                images: ["{CALIBRATION}/*.png"]
              algorithm: nearest
        """,
    }[artifact]
    text = "checkpoints:\n  c:\n" + textwrap.indent(textwrap.dedent(checkpoint), "    ")
    text += "artifacts:\n" + textwrap.indent(textwrap.dedent(artifacts), "  ")
    root.mkdir(parents=True, exist_ok=True)
    (root / "artifacts.yaml").write_text(text)
    return Workspace.open(root / "artifacts.yaml", root)


def etags(snapshot: Path, names: list[str]) -> dict[str, str]:
    return {name: Path(os.readlink(snapshot / name)).name for name in names}


# The tower's fingerprint covers the image processor's file too (its build carries it
# in consumer.json), so its etag is in the provenance.
QWEN_FILES = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
              "model.safetensors.index.json", "preprocessor_config.json"]


# --- resolving ------------------------------------------------------------------------------

def test_repo_at_a_commit_is_the_checkpoint_by_path(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    snapshot = cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    by_hub = write_manifest(tmp_path / "hub", f"hf: org/tiny-qwen\nrevision: {COMMIT}\n")
    by_path = write_manifest(tmp_path / "path", f"path: {qwen_checkpoint}\n")
    record = by_hub.record(by_hub.artifact("t"))
    assert record.fingerprint == by_path.fingerprint(by_path.artifact("t"))
    assert record.inputs == by_path.record(by_path.artifact("t")).inputs
    assert record.inputs_named["checkpoint"] == f"checkpoint 'c' (org/tiny-qwen at {COMMIT[:12]})"
    assert record.to_json()["checkpoint_origins"] == {
        "checkpoint": {"hf": "org/tiny-qwen", "revision": COMMIT, "commit": COMMIT, "files": etags(snapshot, QWEN_FILES)}
    }
    assert by_path.record(by_path.artifact("t")).checkpoint_origins == {}


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1"])
def test_repo_at_a_ref_records_the_commit_it_resolved_to(
    tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path, revision: str
) -> None:
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT, refs=("main", "v1.0", "refs/pr/1"))
    line = "" if revision == "main" else f"revision: {revision}\n"  # main is the default
    record = write_manifest(tmp_path, f"hf: org/tiny-qwen\n{line}").artifact("t").record
    origin = record.checkpoint_origins["checkpoint"]
    assert (origin.hf, origin.revision, origin.commit) == ("org/tiny-qwen", revision, COMMIT)
    assert record.inputs_named["checkpoint"] == f"checkpoint 'c' (org/tiny-qwen at {revision} (commit {COMMIT[:12]}))"


def test_a_moved_ref_with_the_same_files_is_the_same_artifact(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    before = write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, OTHER_COMMIT)  # main moves on
    after = write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record
    assert after.fingerprint == before.fingerprint
    assert after.checkpoint_origins["checkpoint"].commit == OTHER_COMMIT


# --- what is not in the cache -----------------------------------------------------------------

def test_a_revision_not_in_the_cache_is_one_error(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    project = write_manifest(tmp_path, f"hf: org/tiny-qwen\nrevision: {OTHER_COMMIT}\n")
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("t"))
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: org/tiny-qwen at revision {OTHER_COMMIT} "
        f"is not in the Hugging Face cache ({hub_cache}); download it with: "
        f"hf download org/tiny-qwen --revision {OTHER_COMMIT}"
    )
    project = write_manifest(tmp_path, "hf: org/elsewhere\nrevision: dev\n")
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("t"))
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: org/elsewhere at revision dev "
        f"is not in the Hugging Face cache ({hub_cache}); download it with: hf download org/elsewhere --revision dev"
    )


def test_a_partial_download_names_every_missing_file(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    snapshot = cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    (snapshot / "config.json").unlink()
    # A blob pruned from under its link.
    (snapshot / "model-00002-of-00002.safetensors").resolve().unlink()
    project = write_manifest(tmp_path, "hf: org/tiny-qwen\n")
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("t"))
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: org/tiny-qwen at main (commit {COMMIT[:12]}) "
        f"lacks config.json, model-00002-of-00002.safetensors in the Hugging Face cache ({snapshot}); "
        f"download them with: hf download org/tiny-qwen config.json model-00002-of-00002.safetensors --revision {COMMIT}"
    )


def test_a_file_only_the_kind_reads_is_checked_too(tmp_path: Path, hub_cache: Path, siglip_checkpoint: Path) -> None:
    """The SigLIP kind reads preprocessor_config.json; the tower kind does not."""
    snapshot = cache_snapshot(hub_cache, "org/tiny-siglip", siglip_checkpoint, COMMIT)
    (snapshot / "preprocessor_config.json").unlink()
    project = write_manifest(tmp_path, f"hf: org/tiny-siglip\nrevision: {COMMIT}\n", artifact="siglip")
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("q"))
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: org/tiny-siglip at {COMMIT[:12]} "
        f"lacks preprocessor_config.json in the Hugging Face cache ({snapshot}); "
        f"download it with: hf download org/tiny-siglip preprocessor_config.json --revision {COMMIT}"
    )


def test_siglip_from_the_cache_is_the_checkpoint_by_path(tmp_path: Path, hub_cache: Path, siglip_checkpoint: Path) -> None:
    snapshot = cache_snapshot(hub_cache, "org/tiny-siglip", siglip_checkpoint, COMMIT)
    record = write_manifest(tmp_path / "hub", "hf: org/tiny-siglip\n", artifact="siglip").artifact("q").record
    by_path = write_manifest(tmp_path / "path", f"path: {siglip_checkpoint}\n", artifact="siglip").artifact("q").record
    assert record.fingerprint == by_path.fingerprint
    files = ["config.json", "model.safetensors", "preprocessor_config.json"]
    assert record.checkpoint_origins["checkpoint"].files == etags(snapshot, files)
    # Blob names as the Hub gives them: sha256 of a large file, the git blob id of a small one.
    weights = (snapshot / "model.safetensors").read_bytes()
    assert record.checkpoint_origins["checkpoint"].files["model.safetensors"] == hashlib.sha256(weights).hexdigest()


# --- where the origin is kept ------------------------------------------------------------------

def test_lock_entry_and_provenance_name_the_repo_and_commit(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    from edgebuild.run.lockfile import lock_entry
    from edgebuild.run.publish import provenance_record

    snapshot = cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    project = write_manifest(tmp_path, "hf: org/tiny-qwen\n")
    record = project.record(project.artifact("t"))
    # As if built: the record in place, no outputs to check.
    project.layout.artifact_dir("t").mkdir(parents=True)
    record.completed("t", {}, 0.0, {}).write(project.layout.artifact_dir("t"))
    expected = {"checkpoint": {"hf": "org/tiny-qwen", "revision": "main", "commit": COMMIT,
                               "files": etags(snapshot, QWEN_FILES)}}
    entry = lock_entry(project, project.artifact("t"))
    assert entry is not None and entry["checkpoint_origins"] == expected
    assert entry["fingerprint"] == record.fingerprint
    provenance = provenance_record(project, project.artifact("t"), record.completed("t", {}, 0.0, {}).to_json(), {}, None)
    assert provenance["checkpoint_origins"] == expected
    assert provenance["inputs"] == record.inputs


def test_resolving_a_path_checkpoint_never_imports_huggingface_hub(tmp_path: Path, qwen_checkpoint: Path) -> None:
    write_manifest(tmp_path, f"path: {qwen_checkpoint}\n")
    code = (
        "import sys; from edgebuild.run.workspace import Workspace; "
        f"print(Workspace.open({str(tmp_path / 'artifacts.yaml')!r}, {str(tmp_path)!r}).artifact('t').fingerprint[:12]); "
        "print('huggingface_hub' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1] == "False"


@pytest.mark.slow
def test_doit_verify_from_the_cache_reuses_the_build_by_path(verified_seed: Path, tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    """The seed's tower, built from the fixture, with its checkpoint now named by repo id:
    the same fingerprint, so nothing is exported, and the lock file gains the origin."""
    import json

    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    project = clone_project(verified_seed, tmp_path / "p")
    project.manifest(TOWER_MANIFEST.replace("fixture: qwen3_5_vl_tiny", "hf: org/tiny-qwen"))
    result = project.doit("verify", env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-- t" in result.stdout + result.stderr
    lock = json.loads((project.root / "artifacts.lock").read_text())
    assert lock["artifacts"]["t"]["checkpoint_origins"]["checkpoint"]["commit"] == COMMIT


def test_doit_reports_a_missing_revision_in_one_line(tmp_path: Path, hub_cache: Path) -> None:
    from helpers import ProjectDir

    project = ProjectDir(tmp_path)
    project.manifest(TOWER_MANIFEST.replace("fixture: qwen3_5_vl_tiny", "hf: org/tiny-qwen"))
    result = project.doit("build", "t")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        f"artifacts.yaml:3:5: checkpoints -> qwen -> hf: org/tiny-qwen at revision main is not in the Hugging Face "
        f"cache ({hub_cache}); download it with: hf download org/tiny-qwen --revision main"
    ) in output
    assert "Traceback" not in output
    assert not (tmp_path / "build").exists()


# --- a cache that is not what it must be ------------------------------------------------------

def test_a_ref_with_a_trailing_newline_is_the_commit(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    (hub_cache / "models--org--tiny-qwen" / "refs" / "main").write_text(COMMIT + "\n")
    origin = write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record.checkpoint_origins["checkpoint"]
    assert origin.commit == COMMIT


@pytest.mark.parametrize("content, found", [
    ("../../../../elsewhere\n", "expected a 40-hex commit (what the Hub writes there), found '../../../../elsewhere\\n'"),
    (COMMIT.upper(), f"expected a 40-hex commit (what the Hub writes there), found {COMMIT.upper()!r}"),
    (f"{COMMIT}\n{OTHER_COMMIT}\n", "expected a 40-hex commit (what the Hub writes there), found "
     f"{(COMMIT + chr(10) + OTHER_COMMIT + chr(10))[:80]!r}"),
    ("x" * 5000, "4.9 KiB, more than the 4.0 KiB a file of this kind may hold; expected a ref file holding a 40-hex commit"),
    (None, "a FIFO (named pipe), not a regular file; expected a ref file holding a 40-hex commit"),
])
def test_a_ref_that_is_not_a_commit_is_one_error(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path,
                                                 content: str | None, found: str) -> None:
    """A ref is a 40-hex commit: never a path into (or out of) the cache, never read past a few bytes."""
    cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    ref = hub_cache / "models--org--tiny-qwen" / "refs" / "main"
    ref.unlink()
    if content is None:
        os.mkfifo(ref)
    else:
        ref.write_text(content)
    with pytest.raises(CheckpointError) as caught:
        write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record
    assert str(caught.value) == f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: {ref}: {found}"


def test_a_snapshot_that_leads_out_of_the_cache_is_refused(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    snapshots = hub_cache / "models--org--tiny-qwen" / "snapshots"
    snapshots.mkdir(parents=True)
    (snapshots / COMMIT).symlink_to(qwen_checkpoint)
    with pytest.raises(CheckpointError) as caught:
        write_manifest(tmp_path, f"hf: org/tiny-qwen\nrevision: {COMMIT}\n").artifact("t").record
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: {snapshots / COMMIT} leads to {qwen_checkpoint}, "
        f"outside the cache's folder of org/tiny-qwen ({hub_cache / 'models--org--tiny-qwen'}); expected the snapshot "
        "the Hub wrote there"
    )


def test_a_blob_whose_bytes_do_not_match_its_name_is_not_recorded(tmp_path: Path, hub_cache: Path,
                                                                  qwen_checkpoint: Path) -> None:
    """Recorded etags are checked ones: a blob edited (or bit-rotted) in the cache is an
    error naming it, not provenance that claims bytes the build did not read."""
    snapshot = cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    project = write_manifest(tmp_path, "hf: org/tiny-qwen\n")
    assert project.record(project.artifact("t")).checkpoint_origins["checkpoint"].files == etags(snapshot, QWEN_FILES)
    shard = snapshot / "model-00001-of-00002.safetensors"
    blob = shard.resolve()
    flip_bits(blob, -1)  # inside the last tensor's bytes
    with pytest.raises(CheckpointError) as caught:
        write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: checkpoints -> c -> hf: org/tiny-qwen at {COMMIT[:12]}: "
        f"model-00001-of-00002.safetensors links to the blob {blob.name} in the Hugging Face cache, whose bytes do not "
        f"match its name (found sha256 {hashlib.sha256(blob.read_bytes()).hexdigest()}); delete {blob} and download it again "
        f"with: hf download org/tiny-qwen model-00001-of-00002.safetensors --revision {COMMIT}"
    )


def test_check_deep_refuses_a_blob_the_build_would_refuse(tmp_path: Path, hub_cache: Path, qwen_checkpoint: Path) -> None:
    """`check --deep` says what the build would: a blob whose bytes do not match its name
    is the build's one error, not a pass followed by a refused build."""
    snapshot = cache_snapshot(hub_cache, "org/tiny-qwen", qwen_checkpoint, COMMIT)
    write_manifest(tmp_path, "hf: org/tiny-qwen\n")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgebuild", "check", "--deep"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)

    passed = check()
    assert (passed.returncode, passed.stdout, passed.stderr) == (0, "t\tqwen3_5_vision_tower\t\n", "")
    blob = (snapshot / "preprocessor_config.json").resolve()
    data = blob.read_bytes().replace(b"{", b"{ ", 1)
    blob.write_bytes(data)
    refused = check()
    assert refused.returncode == 2
    with pytest.raises(CheckpointError) as built:
        write_manifest(tmp_path, "hf: org/tiny-qwen\n").artifact("t").record
    assert refused.stderr == f"edgebuild: error: {str(built.value).replace(str(tmp_path) + '/', '', 1)}\n"
    assert refused.stderr == (
        f"edgebuild: error: artifacts.yaml:3:5: checkpoints -> c -> hf: org/tiny-qwen at {COMMIT[:12]}: "
        f"preprocessor_config.json links to the blob {blob.name} in the Hugging Face cache, whose bytes do not match "
        f"its name (found git-blob {hashlib.sha1(b'blob %d' % len(data) + bytes([0]) + data).hexdigest()}); delete "
        f"{blob} and download it again with: hf download org/tiny-qwen preprocessor_config.json --revision {COMMIT}\n"
    )
