"""artifacts.lock, written by `doit build` / `doit verify`; and verification catching
outputs changed in build/ since they were built, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild.core.lock_format import LOCK_FORMAT, read_lock, render_lock
from edgebuild.run.lockfile import significant
from edgebuild.errors import LockfileError

from helpers import TOWER_MANIFEST, clone_project, flip_bits

LOCK_KEYS = {
    "kind", "fingerprint", "inputs", "inputs_named", "config_values", "checkpoint_origins", "params", "code", "verify_code", "versions", "outputs", "verified",
    "verify_fingerprint", "cost", "verify", "verify_parts",
}


def lock_of(root: Path) -> dict:
    return json.loads((root / "artifacts.lock").read_text())


@pytest.mark.slow
def test_verify_writes_the_lock(verified_seed: Path) -> None:
    lock = lock_of(verified_seed)
    assert lock["format"] == LOCK_FORMAT and list(lock["artifacts"]) == ["t"]
    entry = lock["artifacts"]["t"]
    assert set(entry) == LOCK_KEYS
    record = json.loads((verified_seed / "build" / "t" / ".edgebuild.json").read_text())
    for key in ("kind", "fingerprint", "inputs", "params", "code", "versions", "outputs"):
        assert entry[key] == record[key]
    # The cost, from the record and the report, to two significant figures.
    report = json.loads((verified_seed / "build" / "t" / "report.json").read_text())
    assert entry["cost"] == {
        "build_seconds": significant(record["build_seconds"]),
        "verify_seconds": significant(report["metrics"]["verify_seconds"]),
        "peak_rss_bytes": int(significant(float(record["build_info"]["peak_rss_bytes"]))),
    }
    assert 2**20 < entry["cost"]["peak_rss_bytes"] < 2**40
    assert entry["params"]["image_size"] == [64, 64]
    assert set(entry["inputs"]) == {"checkpoint"}
    assert entry["checkpoint_origins"] == {}  # a fixture, not a Hugging Face checkpoint
    assert entry["versions"]["torch"] and entry["versions"]["onnxruntime"]
    assert set(entry["outputs"]) == {"model.onnx", "model.onnx.data", "tower.json", "consumer.json"}
    assert all(set(meta) == {"size", "digest"} for meta in entry["outputs"].values())
    assert entry["verified"] is True
    # What it is judged with: its thresholds, and each other part of its verification fingerprint by digest.
    assert entry["verify"] == report["verify"] and entry["verify_parts"] == report["verify_parts"]
    # The judging code, and the tools that compute its coverage certificates (the tower's graph: onnxruntime's
    # usability checker for NNAPI and Core ML).
    assert set(entry["verify_parts"]) == {"code", "coverage_tools"}
    report = json.loads((verified_seed / "build" / "t" / "report.json").read_text())
    assert entry["verify_fingerprint"] == report["verify_fingerprint"]
    # Canonical: sorted keys, no timestamps, so an unchanged build never changes it.
    assert (verified_seed / "artifacts.lock").read_text() == render_lock(lock["artifacts"])


@pytest.mark.slow
def test_lock_follows_builds_failures_and_the_manifest(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    before = (project.root / "artifacts.lock").read_bytes()
    # A no-op leaves it byte for byte.
    assert project.doit("build").returncode == 0
    assert (project.root / "artifacts.lock").read_bytes() == before

    # A second artifact with the same build (restored from the store), whose
    # verification cannot pass: it is in the lock, verified false.
    project.manifest(
        TOWER_MANIFEST
        + "  strict:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
        + "    verify:\n      providers: [DmlExecutionProvider]\n"
    )
    result = project.doit("verify")
    assert result.returncode != 0
    lock = lock_of(project.root)["artifacts"]
    assert lock["t"]["verified"] is True and lock["strict"]["verified"] is False
    assert lock["strict"]["fingerprint"] == lock["t"]["fingerprint"]

    # `doit build t` refreshes t's entry only; dropping strict from the manifest drops its entry.
    project.manifest(TOWER_MANIFEST)
    assert project.doit("build", "t").returncode == 0
    assert list(lock_of(project.root)["artifacts"]) == ["t"]


@pytest.mark.slow
def test_tampered_output_fails_verification_by_name(verified_seed: Path, tmp_path: Path) -> None:
    """Verification itself checks every output against its recorded digest (called
    directly here: ``doit verify`` first runs the build step, which restores it)."""
    from edgebuild.run.builder import verify_artifact
    from edgebuild.errors import VerificationFailed

    project = clone_project(verified_seed, tmp_path / "clone")
    data = project.root / "build" / "t" / "model.onnx.data"
    # Same size, one byte different, written in place.
    flip_bits(data, 1000)
    with pytest.raises(VerificationFailed) as caught:
        workspace = project.project()
        verify_artifact(workspace, workspace.artifact("t"), log=lambda message: None)
    assert "t: verification failed: outputs_intact = 3 (limit == 4): changed since build: model.onnx.data" in str(caught.value)
    report = json.loads((project.root / "build" / "t" / "report.json").read_text())
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["outputs_intact"]
    # Through the CLI the build step names the file and restores it; then it verifies.
    result = project.doit("verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[t] build/t: model.onnx.data changed or missing since the build; replacing it" in result.stderr
    assert lock_of(project.root)["artifacts"]["t"]["verified"] is True


@pytest.mark.slow
def test_truncated_output_is_named_and_replaced(verified_seed: Path, tmp_path: Path) -> None:
    """A truncated output no longer looks built (its size is off): `doit verify`
    names it, replaces the build from the store, and verifies that."""
    project = clone_project(verified_seed, tmp_path / "clone")
    data = project.root / "build" / "t" / "model.onnx.data"
    expected = data.read_bytes()
    data.write_bytes(expected[:100])
    result = project.doit("verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[t] build/t: model.onnx.data changed or missing since the build; replacing it" in result.stderr
    assert "[t] restored from the store" in result.stderr
    assert data.read_bytes() == expected
    assert lock_of(project.root)["artifacts"]["t"]["verified"] is True


def test_unreadable_lock_stops_before_building(tmp_path: Path, project_dir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    lock = project_dir.root / "artifacts.lock"
    lock.write_text('{"format": 1, "artifacts": {<<<<<<< HEAD\n')
    result = project_dir.doit("build")
    assert result.returncode == 3
    assert "ERROR: artifacts.lock: not valid JSON: Expecting property name enclosed in double quotes: line 1 column 29 (char 28); expected a JSON lock file (delete it and run `doit build` to write it afresh)" in result.stderr
    assert not (project_dir.root / "build").exists()


def test_lock_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "artifacts.lock"
    path.write_text('{"format": 2, "artifacts": {}}')
    with pytest.raises(LockfileError) as error:
        read_lock(path)
    assert str(error.value) == (
        f"{path}: expected a lock file of format 1, found format 2; delete it and run `doit build` to write it afresh"
    )
    assert read_lock(tmp_path / "missing.lock") == {}


def test_a_cost_is_rewritten_only_when_it_moves_by_more_than_half_again() -> None:
    from edgebuild.run.lockfile import steady_cost

    before = {"build_seconds": 10.0, "verify_seconds": 2.0, "peak_rss_bytes": 1_000_000_000}
    jitter = {"build_seconds": 14.0, "verify_seconds": 1.4, "peak_rss_bytes": 1_100_000_000}
    assert steady_cost(before, jitter) == before
    moved = {"build_seconds": 16.0, "verify_seconds": 2.1, "peak_rss_bytes": 400_000_000}
    assert steady_cost(before, moved) == {"build_seconds": 16.0, "verify_seconds": 2.0, "peak_rss_bytes": 400_000_000}
    # Unknown on either side: the new figure.
    assert steady_cost({"verify_seconds": None}, {"verify_seconds": 3.0}) == {"verify_seconds": 3.0}
    assert steady_cost(before, {"verify_seconds": None}) == {"verify_seconds": None}


def test_a_rebuild_that_took_other_seconds_leaves_the_lock_unchanged(tmp_path: Path) -> None:
    from edgebuild.core.hashing import file_digest
    from edgebuild.core.record import read_record
    from edgebuild.run.lockfile import update_lock
    from edgebuild.run.workspace import Workspace
    from helpers import pretend_built

    (tmp_path / "artifacts.yaml").write_text(TOWER_MANIFEST)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    artifact = workspace.artifact("t")
    output = artifact.directory / "model.onnx"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"graph")
    pretend_built(workspace, "t", {"model.onnx": file_digest(output)})

    def rebuilt(seconds: float) -> None:
        record = read_record(artifact.directory)
        record.model_copy(update={"build_seconds": seconds}).write(artifact.directory)

    rebuilt(100.0)
    assert update_lock(workspace, [artifact])
    locked = (tmp_path / "artifacts.lock").read_bytes()
    rebuilt(131.0)  # another runner, another machine's seconds
    assert not update_lock(workspace, [artifact]) and (tmp_path / "artifacts.lock").read_bytes() == locked
    rebuilt(160.0)
    assert update_lock(workspace, [artifact])
    assert json.loads((tmp_path / "artifacts.lock").read_text())["artifacts"]["t"]["cost"]["build_seconds"] == 160.0


def test_shard_lock_files_merge_into_the_lock_of_one_run() -> None:
    """Each shard wrote the committed lock with its own artifacts' entries refreshed (and
    entries of artifacts no longer in the manifest dropped): the merge takes each artifact
    from the shard that changed it. Costs aside, the result is compared with the committed one."""
    from edgebuild.run.lockfile import lock_changes, merge_shard_locks

    def entry(fingerprint: str, seconds: float = 1.0) -> dict:
        return {"fingerprint": fingerprint, "cost": {"build_s": seconds}}

    committed = {"a": entry("a1"), "b": entry("b1"), "gone": entry("g1")}
    first = {"a": entry("a2"), "b": entry("b1")}                  # built a, dropped gone
    second = {"a": entry("a1"), "b": entry("b1", 9.0), "new": entry("n1")}  # b's cost moved; a new artifact
    merged = merge_shard_locks(committed, [first, second])
    assert merged == {"a": entry("a2"), "b": entry("b1", 9.0), "new": entry("n1")}
    assert lock_changes(committed, merged) == ["a", "gone", "new"]
    assert lock_changes(merged, merged | {"b": entry("b1", 2.0)}) == []
    # No shard changed anything: the committed lock as it was.
    assert merge_shard_locks(committed, [dict(committed), dict(committed)]) == committed
    assert merge_shard_locks(committed, []) == committed
    with pytest.raises(LockfileError) as error:
        merge_shard_locks(committed, [first, {"a": entry("a3"), "b": entry("b1")}])
    assert str(error.value) == "a: two shards wrote different lock entries for it; each artifact is built by one shard"
