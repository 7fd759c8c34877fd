"""`doit publish` against a real S3 API (moto's server on loopback) and a local
directory: content-addressed entries, provenance, checksums, the index, and
nothing published unless everything verified. Also: the CI workflow runs the
script that .ci/run runs."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from edgebuild.errors import PublishError
from edgebuild.publish import publish, read_index
from edgebuild.remote import Location

from helpers import REPO, TOWER_MANIFEST, clone_project

STRICT = (
    "  strict:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
    "    verify:\n      providers: [DmlExecutionProvider]\n"
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git(root: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", *args]
    return subprocess.run(command, cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_publish_twice_publishes_once(remote_url: str, verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    git(project.root, "init", "-q")
    git(project.root, "add", "artifacts.yaml", "dodo.py", "pyproject.toml")
    git(project.root, "commit", "-q", "-m", "manifest")
    commit = git(project.root, "rev-parse", "HEAD")
    fingerprint = project.project().fingerprint("t")
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

    # SHA256SUMS covers every published file, in `sha256sum -c` form, and each matches.
    listed = dict(line.split("  ")[::-1] for line in checksums.decode().splitlines())
    assert set(listed) == {"model.onnx", "model.onnx.data", "tower.json", "report.json", "report.md", "provenance.json"}
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
    assert provenance["git"] == {"commit": commit, "dirty": False}
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
    result = project.doit("publish", "--to", directory)
    assert result.returncode == 1
    assert result.stderr.endswith(
        "edgebuild: error: nothing published:\n  strict: verification failed (see build/strict/report.md)\n"
    )
    # The same refusal, in process, for an S3 destination (verifying once is enough).
    with pytest.raises(PublishError) as error:
        publish(project.project(), ["t", "strict"], s3_bucket)
    assert str(error.value) == "nothing published:\n  strict: verification failed (see build/strict/report.md)"
    for destination in (Location(directory), Location(s3_bucket)):
        assert destination.read("index.json") is None
        assert not destination.fs.exists(destination.path("t"))
    # Named alone, the verified one publishes.
    alone = project.doit("publish", "t", "--to", s3_bucket)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert list(json.loads(Location(s3_bucket).read("index.json"))["artifacts"]) == ["t"]


@pytest.mark.slow
def test_index_gathers_every_artifact_and_never_overwrites(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    destination = tmp_path / "published"
    assert project.doit("publish", "--to", f"file://{destination}").returncode == 0
    # Another artifact with the same build (restored from the store, verified): a second row.
    project.manifest(TOWER_MANIFEST + "  t_copy:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n")
    result = project.doit("publish", "t_copy", "--to", str(destination))
    assert result.returncode == 0, result.stdout + result.stderr
    fingerprint = project.project().fingerprint("t")
    index = json.loads((destination / "index.json").read_text())
    assert {name: list(rows) for name, rows in index["artifacts"].items()} == {"t": [fingerprint], "t_copy": [fingerprint]}

    # The destination claims other bytes under this key (another build of the same
    # fingerprint): an error, and nothing there is touched.
    sums = destination / "t" / fingerprint / "SHA256SUMS"
    lines = sums.read_text().splitlines()
    lines = [("0" * 64 + "  model.onnx") if line.endswith("  model.onnx") else line for line in lines]
    sums.write_text("\n".join(lines) + "\n")
    before = {path: path.read_bytes() for path in destination.rglob("*") if path.is_file()}
    clash = project.doit("publish", "t", "--to", str(destination))
    assert clash.returncode == 1
    assert clash.stderr.endswith(
        f"edgebuild: error: {destination}/t/{fingerprint}: already published with different content "
        "(model.onnx); not overwritten\n"
    )
    assert {path: path.read_bytes() for path in destination.rglob("*") if path.is_file()} == before


def test_publish_needs_a_destination(project_dir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit("publish")
    assert result.returncode == 3
    assert "give --to DEST: a directory or an fsspec URL such as s3://bucket/artifacts" in result.stderr


def test_unreadable_index_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"format": 7}')
    with pytest.raises(PublishError) as error:
        read_index(Location(str(tmp_path)))
    assert str(error.value) == f"{tmp_path}/index.json: expected an index of format 1, found format 7; not overwritten"


# --- CI ---------------------------------------------------------------------------------


def test_workflow_runs_the_ci_steps_script() -> None:
    """The workflow is not untested text: its steps are scripts/ci_steps.sh, which .ci/run runs."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "scripts/ci_steps.sh" in runs
    assert any(step.get("uses", "").startswith("actions/cache") and "cache/" in str(step["with"]["path"]) for step in steps)
    ci_run = (REPO / ".ci" / "run").read_text()
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest" in ci_run
    assert "scripts/ci_steps.sh" in ci_run
    assert (REPO / "scripts" / "ci_steps.sh").stat().st_mode & 0o111
