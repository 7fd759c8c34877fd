"""One scheduler (edgebuild/run/scheduler.py) behind the doit commands and the Python
API: the same rule for "needs build" and "needs verify", exports in worker processes
either way, and early cutoff -- an artifact made from a source is keyed by the
source's bytes, so a source rebuilt to identical bytes rebuilds nothing after it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import edgebuild
from edgebuild.run.workspace import Workspace

from helpers import REPO, TOWER_MANIFEST, ProjectDir, clone_project

WIDE = "  u:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: [64, 96]\n"


def _fresh_runner(root: Path) -> None:
    """What a fresh CI runner lacks: builds, the store, doit's state, the stat cache."""
    for path in ("build", "cache/store", "cache/doit.json", "cache/statcache.sqlite", "cache/statcache.sqlite-wal",
                 "cache/statcache.sqlite-shm", "artifacts.lock"):
        target = root / path
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


@pytest.mark.slow
def test_read_only_remote_api_and_cli_agree(verified_seed: Path, tmp_path: Path) -> None:
    """A pull request's runner: one artifact pulled from a read-only remote, one built and
    verified here (never pushed). doit and the API both call both verified, and neither
    judges anything again."""
    remote = tmp_path / "remote"
    remote.mkdir()
    pusher = clone_project(verified_seed, tmp_path / "pusher")
    pushed = pusher.doit("verify", env={"EDGEBUILD_REMOTE_CACHE": str(remote)})
    assert pushed.returncode == 0, pushed.stderr
    assert "remote cache: pushed" in pushed.stderr

    reader = clone_project(verified_seed, tmp_path / "reader")
    _fresh_runner(reader.root)
    reader.manifest(TOWER_MANIFEST + WIDE)
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    first = reader.doit("verify", "--remote-readonly", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "[t] pulled from the remote cache" in first.stderr
    assert "[u] built in" in first.stderr
    assert "read-only" in first.stderr and "verify: 2 passed, 0 failed, 0 not run" in first.stdout
    fingerprint_u = reader.project().artifact("u").fingerprint
    assert not any(remote.rglob(f"{fingerprint_u}.json"))

    again = reader.doit("verify", "--remote-readonly", env=env)
    assert (again.returncode, again.stdout) == (0, "-- t\n-- verify:t\n-- u\n-- verify:u\nverify: 2 passed, 0 failed, 0 not run\n")
    status = reader.doit("status", env=env)
    assert status.stdout == "t  up to date (verified)\nu  up to date (verified)\n"

    project = edgebuild.open_project(reader.root / "artifacts.yaml", remote_cache=str(remote), remote_readonly=True)
    for _ in range(2):
        lines: list[str] = []
        result = project.verify(log=lines.append)
        assert result.passed == ("t", "u") and result.ok
        # Nothing pulled, exported or judged: both are verified here at their current fingerprints.
        assert lines == []
    assert not any(remote.rglob(f"{fingerprint_u}.json"))


@pytest.mark.slow
def test_the_api_exports_in_a_worker_process(tmp_path: Path, qwen_checkpoint: Path) -> None:
    """An export holds the model and its graph: the API, like doit, runs it in a process of
    its own, so the caller's memory and imports stay as they were. (The checkpoint is a
    directory: generating a fixture would import torch here.)"""
    (tmp_path / "artifacts.yaml").write_text(TOWER_MANIFEST.replace("    fixture: qwen3_5_vl_tiny", f"    path: {qwen_checkpoint}"))
    code = textwrap.dedent(f"""
        import sys, edgebuild
        project = edgebuild.open_project({str(tmp_path / 'artifacts.yaml')!r}, remote_cache="off")
        lines = []
        stat_cache = project._workspace.stat_cache
        project.status()
        hashed = stat_cache.bytes_hashed
        result = project.verify(log=lines.append)
        print(result.summary)
        print("torch" in sys.modules, "onnxruntime" in sys.modules)
        print(any(line.startswith("[t] built in") for line in lines))
        # The outputs' digests, as the build worker saved them: read back, not hashed here.
        # What is hashed here is the two report files, to check the record's seal of them.
        print(stat_cache.bytes_hashed - hashed)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    reports = sum((tmp_path / "build" / "t" / name).stat().st_size for name in ("report.json", "report.md"))
    assert result.stdout.splitlines() == ["verify: 1 passed, 0 failed, 0 not run", "False False", "True", str(reports)]


# --- early cutoff --------------------------------------------------------------------------

CHAIN = TOWER_MANIFEST + """\
  q:
    kind: qwen3_5_tower_qdq
    source: t
    calibration:
      patches: [patches.safetensors]
"""


def _package_copy(root: Path) -> Path:
    shutil.copytree(REPO / "edgebuild", root / "edgebuild", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    return root


@pytest.mark.slow
def test_a_source_rebuilt_to_identical_bytes_rebuilds_nothing_after_it(tmp_path: Path) -> None:
    """An unused function added to the tower's build code: the tower's fingerprint changes,
    it is exported again -- to the same bytes -- and the QDQ graph made from it stays up
    to date, with its fingerprint unchanged."""
    import numpy
    from safetensors.numpy import save_file

    (tmp_path / "project").mkdir()
    project = ProjectDir(tmp_path / "project")
    project.manifest(CHAIN)
    patches = numpy.random.default_rng(0).uniform(-1, 1, (2, 16, 1536)).astype(numpy.float32)
    save_file({"patches": patches}, str(project.root / "patches.safetensors"))
    first = project.doit("build", env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert first.returncode == 0, first.stderr
    assert "[t] built in" in first.stderr and "[q] built in" in first.stderr
    before = {name: project.project().artifact(name).fingerprint for name in ("t", "q")}
    tower_bytes = json.loads((project.root / "build" / "t" / ".edgebuild.json").read_text())["outputs"]

    copy = _package_copy(tmp_path / "copy")
    build_module = copy / "edgebuild" / "kinds" / "qwen3_5_tower" / "build.py"
    build_module.write_text(build_module.read_text() + "\n\ndef _an_unused_function() -> None:\n    pass\n")
    env = {"EDGEBUILD_REMOTE_CACHE": "off", "PYTHONPATH": str(copy)}
    status = project.doit("status", env=env)
    assert status.stdout.splitlines()[:2] == ["t  stale", "     - edgebuild/kinds/qwen3_5_tower/build.py changed"]
    second = project.doit("build", env=env)
    assert second.returncode == 0, second.stderr
    assert "[t] built in" in second.stderr
    assert "[q] built in" not in second.stderr and "[q]" not in second.stderr
    assert "-- q\n" in second.stdout
    assert json.loads((project.root / "build" / "t" / ".edgebuild.json").read_text())["outputs"] == tower_bytes
    after = subprocess.run(
        [sys.executable, "-c", "import sys; from edgebuild.run.workspace import Workspace; "
         f"w = Workspace.open({str(project.root / 'artifacts.yaml')!r}); print(w.fingerprint(w.artifact('t')), w.fingerprint(w.artifact('q')))"],
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert after.returncode == 0, after.stderr
    tower, qdq = after.stdout.split()
    assert tower != before["t"] and qdq == before["q"]
