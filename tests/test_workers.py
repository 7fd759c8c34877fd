"""Worker processes (edgebuild/workers.py): each build and verification runs in a process
of its own; its edgebuild errors come back as one line of the same class, a crash is
reported by artifact name, and a build whose report already passed is not judged again."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edgebuild.errors import ParameterError, WorkerError
from edgebuild.run.workers import _process_environment, run_worker_at
from edgebuild.core.config import without_settings

from helpers import REPO, ProjectDir, clone_project

NO_REMOTE = {"EDGEBUILD_REMOTE_CACHE": "off"}


@pytest.mark.slow
def test_an_edgebuild_error_comes_back_as_the_same_class_and_line(project_dir: ProjectDir) -> None:
    path = project_dir.manifest(
        "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\n"
        "artifacts:\n  odd:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 450\n"
    )
    lines: list[tuple[str, str]] = []
    with pytest.raises(ParameterError) as caught:
        run_worker_at("build", str(path), str(project_dir.root), "odd", relay=lambda stream, line: lines.append((stream, line)))
    message = str(caught.value)
    assert message.startswith(
        f"{path}:8:5: artifacts -> odd -> image_size: height 450 is not a multiple of patch_size x spatial_merge_size"
    )
    assert "\n" not in message
    # The worker printed no traceback of its own: the message is the whole story.
    assert not any("Traceback" in line for _, line in lines)
    assert not (project_dir.root / "build" / "odd").exists()


ADDRESS_SPACE_LIMIT = 600 << 20


@pytest.mark.slow
def test_a_worker_out_of_memory_says_so_in_one_line(project_dir: ProjectDir, qwen_checkpoint: Path) -> None:
    """Under an address-space limit too small to map torch, ``import torch`` fails with an
    ImportError ("failed to map segment from shared object"): the line says memory, and
    the limit, not the ImportError's traceback."""
    import resource
    import subprocess
    import sys

    project_dir.manifest(
        f"checkpoints:\n  qwen:\n    path: {qwen_checkpoint}\n"
        "artifacts:\n  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
    )

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

    environment = without_settings(os.environ) | NO_REMOTE
    result = subprocess.run([str(Path(sys.executable).with_name("doit")), "build", "t"], cwd=project_dir.root,
                            env=environment, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert re.search(r"t: the build process ran out of memory at a peak of [0-9.]+ GiB resident "
                     r"\(an address-space limit of 0\.59 GiB, ulimit -v\); raise the limit, or build it on a machine "
                     r"with more memory", output), output
    assert "Traceback" not in output and "ImportError" not in output
    assert not (project_dir.root / "build" / "t").exists()


@pytest.mark.slow
def test_a_manifest_edited_after_planning_builds_nothing(project_dir: ProjectDir, qwen_checkpoint: Path) -> None:
    """The local path, as ``doit build`` runs it: the driver planned ``t`` at one
    fingerprint; the manifest is edited before its worker starts; the worker, which
    reads the manifest again, refuses rather than build other parameters under the
    planned name (the cluster path refuses the same way)."""
    from edgebuild.errors import PlanChanged
    from edgebuild.run.workers import run_worker

    text = (f"checkpoints:\n  qwen:\n    path: {qwen_checkpoint}\n"
            "artifacts:\n  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n")
    path = project_dir.manifest(text)
    workspace = project_dir.project()
    planned = workspace.artifact("t")
    planned_fingerprint = planned.fingerprint
    path.write_text(text.replace("image_size: 64", "image_size: 96"))
    with pytest.raises(PlanChanged) as caught:
        run_worker("build", workspace, planned, relay=lambda stream, line: None, env=dict(os.environ) | NO_REMOTE)
    assert str(caught.value).startswith(f"t: its fingerprint changed since this run planned it ({planned_fingerprint[:12]} -> ")
    assert str(caught.value).endswith("nothing was built, run the command again")
    assert not (project_dir.root / "build" / "t").exists()


def test_worker_runs_this_checkouts_edgebuild_first() -> None:
    environment = _process_environment({"PYTHONPATH": os.pathsep.join(["/elsewhere", str(REPO)])})
    assert environment["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/elsewhere"]
    assert environment["PYTHONUNBUFFERED"] == "1"


@pytest.mark.slow
def test_failed_verification_is_one_line_without_a_traceback(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    project.manifest(
        "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\n"
        "artifacts:\n  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
        "    verify:\n      max_abs: 0.0\n"
    )
    result = project.doit("verify", env=NO_REMOTE)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output
    failures = [line for line in output.splitlines() if "t: verification failed:" in line]
    assert len(failures) == 1 and re.search(r"t: verification failed: max_abs = \S+ \(limit <= 0\): onnxruntime CPU vs ", failures[0]), output


@pytest.mark.slow
def test_a_killed_worker_is_reported_by_artifact_name_and_the_next_run_recovers(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    killed = project.doit("verify", env=NO_REMOTE | {"EDGEBUILD_FAULT": "verify.after_report=kill"})
    # The report was written, and passed, before the kill: said, and kept by this run.
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert re.search(
        r"\[t\] the verify process \(pid \d+\) was killed by SIGKILL \(out of memory\? the kernel's OOM killer sends "
        r"SIGKILL\); its report was complete and passed before it ended: t is verified, and kept in the store and "
        r"pushed by the run that started it\n",
        killed.stdout + killed.stderr,
    ), killed.stdout + killed.stderr
    assert "Traceback" not in killed.stdout + killed.stderr
    assert project.doit("status", env=NO_REMOTE).stdout == "t  up to date (verified)\n"
    # The report was written before the kill and passed: the next run keeps it without judging
    # again (the store kept the seed's identical report: nothing is left to do at all).
    again = project.doit("verify", env=NO_REMOTE)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "-- verify:t" in again.stdout
    assert "# t (qwen3_5_vision_tower)" not in again.stderr
    # Without the store's copy, the step keeps it, judging nothing.
    import shutil

    shutil.rmtree(project.root / "cache" / "store")
    kept = project.doit("verify", env=NO_REMOTE)
    assert "[t] verified already: its report passed at this verification fingerprint; not judged again" in kept.stderr
    assert "# t (qwen3_5_vision_tower)" not in kept.stderr


@pytest.mark.slow
def test_an_unexpected_exception_shows_the_workers_traceback(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    result = project.doit("verify", env=NO_REMOTE | {"EDGEBUILD_FAULT": "verify.after_report=raise"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    # A bug, not a fault edgebuild explains: the worker's own traceback, then the artifact's name.
    assert "edgebuild.core.faults.InjectedFault: EDGEBUILD_FAULT=verify.after_report=raise" in output
    assert re.search(r"t: the verify process \(pid \d+\) failed with exit status 1 \(its traceback is above\)", output), output


@pytest.mark.parametrize("status, raw, seen, lost, said", [
    (-15, b"", False, False, "was killed by SIGTERM"),
    (-9, b"", False, False, "was killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)"),
    (130, b'{"interrupted": true}\n', False, False, "was interrupted (SIGINT)"),
    # Said only when one was relayed: an exit status alone is no traceback.
    (1, b"", True, False, "failed with exit status 1 (its traceback is above)"),
    (3, b"", False, False, "failed with exit status 3, with no traceback (code it ran ended the process: os._exit, or a "
                          "native library's crash)"),
    (0, b"", False, False, "exited with status 0 without handing back its result (code it ran ended the process: "
                          "os._exit?)"),
    # A fork server gone is not the OOM killer, though the worker is reported as killed.
    (-9, b"", False, True, "ended with the fork server it was forked from (the server was stopped or killed before the "
                          "worker ended; a shared one by another command, or by hand)"),
])
def test_how_a_worker_ended_is_said_as_it_happened(status: int, raw: bytes, seen: bool, lost: bool, said: str) -> None:
    """The parent's reading of a worker's end, without a build; what it left behind is
    read from disk after (``_left_behind``, in the tests that kill real workers)."""
    from edgebuild.run.workers import WorkerCrash, _outcome

    with pytest.raises(WorkerCrash) as caught:
        _outcome("build", "tower", 4242, status, raw, traceback=seen, server_lost=lost)
    assert str(caught.value) == f"tower: the build process (pid 4242) {said}"
