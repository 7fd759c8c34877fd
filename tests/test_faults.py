"""Faults at named points (edgebuild/faults.py), a disk that fills, and caches that are
damaged: what each leaves behind, and that the next run recovers."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.hashing import file_digest
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.core.record import read_record
from edgebuild.core.config import without_settings

from helpers import ProjectDir, clone_project

NO_REMOTE = {"EDGEBUILD_REMOTE_CACHE": "off"}


def unbuilt_clone(seed: Path, target: Path) -> ProjectDir:
    """A copy of the verified seed with nothing built or stored: the next build exports."""
    project = clone_project(seed, target)
    shutil.rmtree(project.root / "build")
    shutil.rmtree(project.root / "cache" / "store")
    return project


def leftovers(root: Path, name: str = "t") -> list[str]:
    scratch = root / "build" / ".tmp"
    return sorted(path.name for path in scratch.iterdir() if path.name.startswith(f"{name}~")) if scratch.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("point", ["build.before_record", "build.before_rename"])
@pytest.mark.parametrize("action", ["kill", "interrupt"])
def test_build_killed_or_interrupted_leaves_nothing_built(verified_seed: Path, tmp_path: Path, point: str, action: str) -> None:
    project = unbuilt_clone(verified_seed, tmp_path / "p")
    killed = project.doit("build", env=NO_REMOTE | {"EDGEBUILD_FAULT": f"{point}={action}"})
    assert killed.returncode != 0
    # The build ran in a worker process of its own: the doit process reports it by name.
    ending = ("was killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)" if action == "kill"
              else "was interrupted (SIGINT)")
    output = killed.stdout + killed.stderr
    assert re.search(rf"\nt: the build process \(pid \d+\) {re.escape(ending)}; nothing of it counts as built\n",
                     output), output
    assert not (project.root / "build" / "t").exists()
    status = project.doit("status")
    assert status.stdout.startswith("t  missing"), status.stdout
    if action == "interrupt":
        # Ctrl-C runs the cleanup: not even a scratch directory is left, so the next run
        # starts from nothing, as a first one does.
        assert leftovers(project.root) == []
        return
    # A kill leaves the scratch directory: the next run builds and removes it.
    again = project.doit("build", env=NO_REMOTE)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[t] built in" in again.stderr
    assert read_record(project.root / "build" / "t") is not None
    assert leftovers(project.root) == []


@pytest.mark.slow
def test_an_interrupt_fires_whatever_sigint_the_command_inherited(verified_seed: Path, tmp_path: Path) -> None:
    """``cmd &`` and ``nohup`` start a process with SIGINT ignored: the interrupt fault
    point, and Ctrl-C in a worker, must mean the same as in a terminal."""
    import signal

    project = unbuilt_clone(verified_seed, tmp_path / "p")
    environment = without_settings(os.environ)
    environment |= NO_REMOTE | {"EDGEBUILD_FAULT": "build.before_rename=interrupt"}
    result = subprocess.run([str(Path(sys.executable).with_name("doit")), "build"], cwd=project.root, env=environment,
                            capture_output=True, text=True, timeout=600,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert result.returncode != 0
    assert "was interrupted (SIGINT)" in result.stdout + result.stderr
    assert not (project.root / "build" / "t").exists() and leftovers(project.root) == []


@pytest.mark.slow
def test_store_write_killed_leaves_the_build_and_blobs_that_gc_removes(verified_seed: Path, tmp_path: Path) -> None:
    project = unbuilt_clone(verified_seed, tmp_path / "p")
    killed = project.doit("build", env=NO_REMOTE | {"EDGEBUILD_FAULT": "store.before_rename=kill"})
    assert killed.returncode != 0
    # The build itself was renamed into place before the store copy began: it is built,
    # and the message says so, as the next command finds it.
    assert re.search(r"\nt: the build process \(pid \d+\) was killed by SIGKILL \(out of memory\? the kernel's OOM "
                     r"killer sends SIGKILL\); build/t was complete and in place before it ended: t is up to date \(not "
                     r"verified\), as `doit status` says\n", killed.stdout + killed.stderr), killed.stdout + killed.stderr
    assert project.doit("status").stdout == "t  up to date (not verified)\n"
    state = Workspace.open(project.root / "artifacts.yaml", project.root)
    assert not state.store.has(state.fingerprint(state.artifact("t")))
    assert list(state.store.entries()) == []
    # The blobs were written, the entry naming them was not: no entry reaches them, and
    # gc removes them (once they are older than its grace for a write in progress).
    blobs = state.store.blobs()
    built = [path for path in (project.root / "build" / "t").rglob("*") if path.is_file()]
    assert sorted(blobs) == sorted({file_digest(path) for path in built})
    assert state.store.gc(None, None, set()).unreached_blobs == 0
    assert state.store.gc(None, None, set(), unreached_grace_seconds=0).unreached_blobs == len(blobs)
    assert state.store.blobs() == {}
    # Verifying keeps the verified build in the store.
    verified = project.doit("verify", env=NO_REMOTE)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert state.store.has(state.fingerprint(state.artifact("t")))


@pytest.mark.slow
def test_verify_killed_after_its_passing_report_is_kept_and_pushed_by_its_run(verified_seed: Path, tmp_path: Path) -> None:
    """Killed between its report and the store: the summary said "1 failed" while `doit
    status` said verified (issue 60). The run that started it keeps and pushes the build
    itself, so its summary, `doit status`, the store and the remote agree."""
    project = clone_project(verified_seed, tmp_path / "p")
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    # Without its report the build is judged again (a passing report for the current
    # verification fingerprint would be kept and pushed without judging).
    (project.root / "build" / "t" / "report.json").unlink()
    killed = project.doit("verify", env=env | {"EDGEBUILD_FAULT": "verify.after_report=kill"})
    said = killed.stdout + killed.stderr
    assert killed.returncode == 0, said
    assert ("was killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL); its report was complete and "
            "passed before it ended: t is verified, and kept in the store and pushed by the run that started it") in said
    assert "remote cache: pushed" in killed.stderr and "verify: 1 passed, 0 failed, 0 not run" in said, said
    assert len(list((remote / "v1" / "entries").rglob("*.json"))) == 1
    assert project.doit("status", env=env).stdout == "t  up to date (verified)\n"
    workspace = project.project()
    artifact = workspace.artifact("t")
    assert workspace.store.has_report(artifact.fingerprint, artifact.verify_fingerprint)
    again = project.doit("verify", env=env)
    assert again.returncode == 0 and "-- verify:t" in again.stdout, again.stdout + again.stderr


def _file_size_limit(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_a_disk_that_fills_is_one_line_and_leaves_the_previous_build(verified_seed: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands for a full disk: writes past 512 KiB fail (EFBIG) as they
    would with ENOSPC. The tower's 1 MB of weights cannot be written."""
    project = clone_project(verified_seed, tmp_path / "p")
    previous = (project.root / "build" / "t" / "model.onnx.data").read_bytes()
    (project.root / "artifacts.yaml").write_text((project.root / "artifacts.yaml").read_text() + "    opset: 20\n")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("doit")), "build"], cwd=project.root, capture_output=True, text=True,
        timeout=600, preexec_fn=_file_size_limit(512 * 1024), env={**os.environ, **NO_REMOTE},
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "t: cannot build: File too large" in output, output
    assert "Traceback" not in output
    assert (project.root / "build" / "t" / "model.onnx.data").read_bytes() == previous
    assert leftovers(project.root) == []


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"[]", b"SQLite format 3\x00" + b"\xa5" * 8000])
def test_damaged_stat_cache_is_said_and_rebuilt(verified_seed: Path, tmp_path: Path, content: bytes) -> None:
    """Issue 39: a damaged stat cache was rebuilt without a word."""
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache" / "statcache.sqlite"
    for suffix in ("-wal", "-shm"):
        Path(f"{cache}{suffix}").unlink(missing_ok=True)
    cache.write_bytes(content)
    status = project.doit("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout == "t  up to date (verified)\n"
    assert status.stderr.startswith(f"edgebuild: {cache}: damaged stat cache (file is not a database); started afresh")
    assert status.stderr.count("\n") == 1, status.stderr
    with sqlite3.connect(cache) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert connection.execute("SELECT count(*) FROM files").fetchone()[0] > 0


@pytest.mark.slow
@pytest.mark.parametrize("content, said", [
    ("[]", "is not one this version reads"),
    ('{"format": 1, "hash"', "is unreadable (not valid JSON: "),
    ('{"format": 1, "hash": "blake3", "files": {"x": {"stat": 3, "ranges": []}}}', None),
])
def test_the_json_stat_cache_of_earlier_versions_is_taken_over(verified_seed: Path, tmp_path: Path, content: str,
                                                               said: str | None) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    legacy = project.root / "cache" / "statcache.json"
    legacy.write_text(content)
    status = project.doit("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout == "t  up to date (verified)\n"
    if said is None:
        assert status.stderr == ""
    else:
        assert status.stderr.startswith(f"edgebuild: {project.root / 'cache' / 'statcache.sqlite'}: the stat cache of "
                                        f"the earlier version, statcache.json, {said}")
        assert status.stderr.count("\n") == 1, status.stderr
    assert not legacy.exists()


@pytest.mark.slow
def test_truncated_doit_state_is_set_aside(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    state = project.root / "cache" / "doit.json"
    state.write_text(state.read_text()[:40])
    result = project.doit("build", env=NO_REMOTE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.startswith(f"edgebuild: {state}: unreadable doit state (")
    assert "moved to doit.json.unreadable, starting afresh" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    # edgebuild's fingerprints decide: up to date without doit's state.
    assert result.stdout == "-- t\n"
    json.loads(state.read_text())


@pytest.mark.slow
def test_unwritable_stat_cache_is_one_line(verified_seed: Path, tmp_path: Path) -> None:
    """A stat cache that cannot be written (here a directory in its place: as root, file
    modes do not stop writes) is a cache: the build goes on without it, and says so once,
    its path named (the command and its worker process each met it; the worker's line is
    not repeated). tests/test_cache_without_cache.py: read-only, full, locked, damaged."""
    project = unbuilt_clone(verified_seed, tmp_path / "p")
    cache = project.root / "cache" / "statcache.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{cache}{suffix}").unlink(missing_ok=True)
    cache.mkdir()
    result = project.doit("build", env=NO_REMOTE)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[t] built in" in result.stderr
    said = f"edgebuild: {cache}: a directory, not a regular file: digests taken afresh and not kept\n"
    assert output.count(said) == 1, output
    assert "Traceback" not in output
    assert cache.is_dir() and list(cache.iterdir()) == []
