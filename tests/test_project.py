"""The project: where it keeps its caches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_project_caches_compiled_kernels_under_its_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgebuild.run.workspace import Workspace

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    (tmp_path / "artifacts.yaml").write_text("artifacts: {}\n")
    project = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert os.environ["NUMBA_CACHE_DIR"] == str(project.layout.cache_dir / "numba")


def test_task_generation_pauses_the_collector_then_freezes_what_it_made(tmp_path: Path, qwen_checkpoint: Path) -> None:
    """No cyclic collection while a manifest's tasks are made (each would traverse every
    task made so far); the collector is back on once they are, and they are frozen."""
    import gc

    from edgebuild.cli.tasks import artifact_tasks
    from edgebuild.run.workspace import Workspace

    (tmp_path / "artifacts.yaml").write_text(
        f"checkpoints:\n  qwen:\n    path: {qwen_checkpoint}\nartifacts:\n"
        "  tower_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n"
        "      image_size: [32, 64, 96]\n"
    )
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert gc.isenabled()
    enabled_while = []
    try:
        for task in artifact_tasks(workspace):
            enabled_while.append(gc.isenabled())
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
    assert enabled_while == [False] * 7  # three builds, the verify group, three verifications


def test_parameters_read_checkpoint_and_source_from_a_field_or_a_property() -> None:
    """``checkpoint_names``/``source_artifacts`` read fields without pydantic's missing-
    attribute path, and still take a plugin's property of that name."""
    from typing import Literal

    from edgebuild.plugin import ArtifactParams

    class Plain(ArtifactParams):
        kind: Literal["plain"]

    class Derived(ArtifactParams):
        kind: Literal["derived"]
        upstream: str

        @property
        def source(self) -> str:
            return self.upstream

    class Fielded(ArtifactParams):
        kind: Literal["fielded"]
        checkpoint: str
        source: str | None = None

    assert Plain(kind="plain").source_artifacts() == [] and Plain(kind="plain").checkpoint_names() == []
    assert Derived(kind="derived", upstream="tower").source_artifacts() == ["tower"]
    fielded = Fielded(kind="fielded", checkpoint="qwen")
    assert fielded.checkpoint_names() == ["qwen"] and fielded.source_artifacts() == []
    assert Plain(kind="plain").verify_parameters() == {}


def test_a_fingerprint_asked_first_is_the_records(tmp_path: Path, qwen_checkpoint: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint is answered without making (validating) the record: `doit status` asks
    for no more. The record made afterwards holds it, its fields hash to it, and it is made once."""
    from edgebuild.core.record import BuildRecord
    from edgebuild.run.workspace import Workspace

    made: list[str] = []
    validate = BuildRecord.__init__

    def counted(self, **fields) -> None:
        made.append(fields["fingerprint"])
        validate(self, **fields)

    monkeypatch.setattr(BuildRecord, "__init__", counted)

    (tmp_path / "artifacts.yaml").write_text(
        f"checkpoints:\n  qwen:\n    path: {qwen_checkpoint}\nartifacts:\n"
        "  tower_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n"
        "      image_size: [32, 64]\n"
    )
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    fingerprints = {name: workspace.artifact(name).fingerprint for name in ("tower_32", "tower_64")}
    assert len(set(fingerprints.values())) == 2 and made == []
    for name, fingerprint in fingerprints.items():
        record = workspace.artifact(name).record
        assert record.fingerprint == fingerprint == record.hashes_to()
        assert workspace.artifact(name).record is record
    assert made == list(fingerprints.values())
