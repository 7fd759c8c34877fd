"""The Python API (``edgebuild.open_project``): build, verify, status and typed
reports without a doit process; ``import edgebuild`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import edgebuild
from edgebuild.api import ArtifactStatus, VerificationReport, VerifyResult
from edgebuild.errors import ManifestError
from edgebuild.core.report import Check

from helpers import REPO, TOWER_MANIFEST, clone_project

STRICT = (
    "  strict:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
    "    verify:\n      providers: [DmlExecutionProvider]\n"
)


def test_import_stays_light() -> None:
    code = (
        "import sys, edgebuild\n"
        "print(sorted(m for m in ('torch', 'pydantic', 'doit', 'edgebuild.api') if m in sys.modules))\n"
        "edgebuild.open_project\n"
        "print('edgebuild.api' in sys.modules, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout == "[]\nTrue False\n"
    assert set(edgebuild.__all__) >= {"open_project", "Project", "VerificationReport", "VerifyResult", "ArtifactStatus"}
    with pytest.raises(AttributeError, match="module 'edgebuild' has no attribute 'nothing'"):
        edgebuild.nothing  # noqa: B018


def test_errors(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(TOWER_MANIFEST.replace("image_size", "image_sise"))
    with pytest.raises(ManifestError, match="unknown key 'image_sise'"):
        edgebuild.open_project(tmp_path / "artifacts.yaml")
    (tmp_path / "artifacts.yaml").write_text(TOWER_MANIFEST)
    project = edgebuild.open_project(tmp_path / "artifacts.yaml")
    assert project.artifacts == ["t"]
    assert project.manifest_path == tmp_path / "artifacts.yaml"
    assert project.artifact_dir("t") == tmp_path / "build" / "t"
    with pytest.raises(KeyError, match=r"unknown artifact 'tt' \(did you mean 't'\?\)"):
        project.build(["tt"])
    with pytest.raises(TypeError, match="pass a list of artifact names, not one string"):
        project.verify("t")  # type: ignore[arg-type]
    assert project.report("t") is None


@pytest.mark.slow
def test_build_verify_status_and_reports(verified_seed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = clone_project(verified_seed, tmp_path / "clone").root
    (root / "artifacts.yaml").write_text(TOWER_MANIFEST + STRICT)
    # The project's directory is the manifest's, not the cwd.
    monkeypatch.chdir(tmp_path)
    project = edgebuild.open_project(root / "artifacts.yaml")
    fingerprint = project.fingerprint("t")

    assert project.status() == [
        ArtifactStatus("t", "up to date", fingerprint, (), "verified"),
        ArtifactStatus("strict", "missing", fingerprint, (), "restorable from the store"),
    ]
    logged: list[str] = []
    assert project.build(["strict"], log=logged.append) == {"strict": fingerprint}
    assert logged == [f"[strict] restored from the store in {logged[0].split(' in ')[1]}"]

    result = project.verify()
    assert isinstance(result, VerifyResult)
    assert result.passed == ("t",) and result.not_run == ()
    assert list(result.failed) == ["strict"]
    assert result.failed["strict"].startswith("strict: verification failed: provider:DmlExecutionProvider = 0 (limit >= 1)")
    assert not result.ok
    assert result.summary == "verify: 1 passed, 1 failed (strict), 0 not run"

    report = project.report("t")
    assert isinstance(report, VerificationReport)
    assert report == result.reports["t"]
    assert (report.artifact, report.kind, report.fingerprint, report.passed) == ("t", "qwen3_5_vision_tower", fingerprint, True)
    on_disk = json.loads((root / "build" / "t" / "report.json").read_text())
    assert report.checks == tuple(Check(**check) for check in on_disk["checks"])
    assert report.verify_fingerprint == on_disk["verify_fingerprint"]
    assert report.thresholds["providers"] == ["CPUExecutionProvider"]
    cosine = next(check for check in report.checks if check.name == "cosine")
    assert cosine.passed and cosine.comparison == ">=" and cosine.limit == 0.9999
    strict = project.report("strict")
    assert strict.passed is False and [check.name for check in strict.failed_checks] == ["provider:DmlExecutionProvider"]

    # Like the commands, the API keeps the lock file beside the manifest.
    lock = json.loads((root / "artifacts.lock").read_text())["artifacts"]
    assert {name: entry["verified"] for name, entry in lock.items()} == {"t": True, "strict": False}
    assert not (tmp_path / "build").exists() and not (tmp_path / "artifacts.lock").exists()


def test_two_projects_with_different_remotes_share_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are per project, never written into the environment behind the caller."""
    import os

    monkeypatch.setenv("EDGEBUILD_REMOTE_CACHE", str(tmp_path / "from-the-environment"))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "artifacts.yaml").write_text(TOWER_MANIFEST)
    def settings_in_environment() -> dict[str, str]:
        return {key: value for key, value in os.environ.items() if key.startswith("EDGEBUILD_")}

    before = settings_in_environment()
    first = edgebuild.open_project(tmp_path / "a" / "artifacts.yaml", remote_cache=str(tmp_path / "cache-a"))
    second = edgebuild.open_project(tmp_path / "b" / "artifacts.yaml", remote_cache=str(tmp_path / "cache-b"),
                                    remote_readonly=True)
    third = edgebuild.open_project(tmp_path / "b" / "artifacts.yaml")
    remotes = [project._workspace.remote for project in (first, second, third)]
    assert [remote.location.root for remote in remotes] == [
        str(tmp_path / "cache-a"), str(tmp_path / "cache-b"), str(tmp_path / "from-the-environment")]
    assert [remote.readonly for remote in remotes] == [False, True, False]
    assert settings_in_environment() == before
    with pytest.raises(TypeError):
        edgebuild.open_project(tmp_path / "a" / "artifacts.yaml", remote_cahce="typo")
