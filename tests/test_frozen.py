"""Frozen runs: a gather or publish runner that has no checkpoint pulls by the fingerprints
of the committed lock file, takes only what a trusted key signed, and refuses a lock
that is not this checkout's, by artifact name. Through the real doit CLI and git."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import ProjectDir, commit, git, signing_env

MANIFEST = """\
checkpoints:
  qwen:
    path: ckpt
artifacts:
  t:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
"""


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory, qwen_checkpoint: Path, keys: dict[str, Path]) -> dict:
    """The protected branch's runner: it has the checkpoint, verifies, pushes signed, and
    the lock file is committed; the remote it pushed to."""
    root = tmp_path_factory.mktemp("frozen")
    remote = root / "remote"
    remote.mkdir()
    (root / "ci").mkdir()
    ci = ProjectDir(root / "ci")
    ci.manifest(MANIFEST)
    shutil.copytree(qwen_checkpoint, ci.root / "ckpt")
    (ci.root / ".gitignore").write_text("build/\ncache/\nckpt/\n")
    result = ci.doit("verify", env=signing_env(keys, str(remote)))
    assert result.returncode == 0, result.stdout + result.stderr
    commit(ci.root, "dodo.py", "artifacts.yaml", "artifacts.lock", ".gitignore", message="verified")
    return {"ci": ci.root, "remote": str(remote)}


def gather_runner(pushed: dict, target: Path) -> ProjectDir:
    """A fresh clone of the commit: no checkpoint, nothing built."""
    subprocess.run(["git", "clone", "-q", str(pushed["ci"]), str(target)], check=True, capture_output=True, timeout=60)
    assert not (target / "ckpt").exists()
    return ProjectDir.existing(target)


def trusting_env(pushed: dict, keys: dict[str, Path]) -> dict[str, str]:
    return {"EDGEBUILD_REMOTE_CACHE": pushed["remote"], "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"}


@pytest.mark.slow
def test_a_frozen_gather_with_no_checkpoint_pulls_verifies_and_publishes(pushed: dict, keys: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    gather = gather_runner(pushed, tmp_path / "gather")
    # Not frozen, it needs the checkpoint to compute the fingerprint.
    unfrozen = gather.doit("verify", "--pull-only", env=trusting_env(pushed, keys))
    assert unfrozen.returncode != 0 and "checkpoint directory" in unfrozen.stdout + unfrozen.stderr

    verified = gather.doit("verify", "--frozen", env=trusting_env(pushed, keys))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"[t] pulled from the remote cache {pushed['remote']} in " in verified.stderr
    assert "-- verify:t\n" in verified.stdout and "built in" not in verified.stderr
    assert verified.stdout.splitlines()[-1] == "verify: 1 passed, 0 failed, 0 not run"
    # The lock file is what the run read: untouched; nothing looked for the checkpoint.
    assert git(gather.root, "status", "--porcelain") == ""
    assert not (gather.root / "ckpt").exists() and not (gather.root / "cache" / "fixtures").exists()
    ci_build = pushed["ci"] / "build" / "t"
    for name in ("model.onnx", "model.onnx.data"):
        assert (gather.root / "build" / "t" / name).read_bytes() == (ci_build / name).read_bytes()

    destination = tmp_path / "published"
    published = gather.doit("publish", "--frozen", "--to", str(destination), env=trusting_env(pushed, keys))
    assert published.returncode == 0, published.stdout + published.stderr
    index = json.loads((destination / "index.json").read_text())
    fingerprint = json.loads((pushed["ci"] / "artifacts.lock").read_text())["artifacts"]["t"]["fingerprint"]
    assert {name: list(rows) for name, rows in index["artifacts"].items()} == {"t": [fingerprint]}
    provenance = json.loads((destination / "t" / fingerprint / "provenance.json").read_text())
    assert provenance["git"]["commit"] == git(pushed["ci"], "rev-parse", "HEAD") and provenance["git"]["dirty"] is False


@pytest.mark.slow
@pytest.mark.parametrize("edit, expected", [
    (lambda root: (root / "artifacts.yaml").write_text(MANIFEST.replace("image_size: 64", "image_size: 96")),
     "t: artifacts.lock at HEAD was written for other parameters (image_size differ; run doit verify without --frozen "
     "(with the checkpoints) and commit artifacts.lock)"),
    (lambda root: (root / "artifacts.yaml").write_text(MANIFEST + "  u:\n    kind: qwen3_5_vision_tower\n"
                                                       "    checkpoint: qwen\n    image_size: 96\n"),
     "u: artifacts.lock at HEAD has no entry for it; --frozen takes every fingerprint from it (run doit verify "
     "without --frozen (with the checkpoints) and commit artifacts.lock)"),
])
def test_a_lock_that_is_not_the_manifests_is_one_line_naming_the_artifact(edit, expected: str, pushed: dict,
                                                                          keys: dict[str, Path], tmp_path: Path) -> None:
    gather = gather_runner(pushed, tmp_path / "gather")
    edit(gather.root)
    refused = gather.doit("verify", "--frozen", env=trusting_env(pushed, keys))
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert expected in output, output
    refused_name = expected.split(":")[0]
    assert "Traceback" not in output and not (gather.root / "build" / refused_name).exists()


@pytest.mark.slow
def test_frozen_needs_a_trusted_key_and_a_committed_lock(pushed: dict, keys: dict[str, Path], tmp_path: Path) -> None:
    gather = gather_runner(pushed, tmp_path / "gather")
    keyless = gather.doit("verify", "--frozen", env={"EDGEBUILD_REMOTE_CACHE": pushed["remote"]})
    assert keyless.returncode != 0
    assert ("--frozen judges nothing here (the checkpoints need not be present), so it takes only builds signed by "
            "a trusted key, and none is set (EDGEBUILD_TRUSTED_KEYS)") in keyless.stdout + keyless.stderr
    git(gather.root, "rm", "-q", "--cached", "artifacts.lock")
    git(gather.root, "commit", "-q", "-m", "no lock")
    uncommitted = gather.doit("verify", "--frozen", env=trusting_env(pushed, keys))
    assert uncommitted.returncode == 2
    assert uncommitted.stderr.strip().splitlines()[-1] == (
        f"edgebuild: error: {gather.root / 'artifacts.lock'}: not committed at HEAD (or not in a git work tree); "
        "--frozen takes every fingerprint from the committed lock file: build and verify with the checkpoints, then "
        "commit artifacts.lock"
    )
    assert "Traceback" not in uncommitted.stdout + uncommitted.stderr
