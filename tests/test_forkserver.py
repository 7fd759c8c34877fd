"""Workers forked from the fork server: each still a process of its own (killed alone,
its exit status its own), the server kept for the next one, and a fresh interpreter
wherever the server cannot serve (switched off, another environment)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edgebuild.core.config import Settings
from edgebuild.errors import WorkerError
from edgebuild.run import forkserver
from edgebuild.run.workers import _process_environment, run_worker
from edgebuild.run.workspace import Workspace

from helpers import clone_project


def lines() -> tuple[list[str], object]:
    seen: list[str] = []
    return seen, lambda stream, line: seen.append(line)


@pytest.mark.slow
def test_a_killed_forked_worker_dies_alone_and_the_next_one_forks_from_the_same_server(verified_seed: Path,
                                                                                       tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    workspace = Workspace.open(project.root / "artifacts.yaml", project.root,
                               Settings.from_environ().replace(remote_cache="off"))
    artifact = workspace.artifact("t")
    environment = _process_environment(workspace.worker_environment())
    server = forkserver.server_for(environment)
    assert server is not None and server.process.poll() is None

    with pytest.raises(WorkerError) as killed:
        run_worker("verify", workspace, artifact, lines()[1], env=dict(os.environ, EDGEBUILD_FAULT="verify.after_report=kill"))
    assert re.fullmatch(r"t: the verify process \(pid \d+\) was killed by SIGKILL \(out of memory\? .*", str(killed.value))
    pid = int(re.search(r"pid (\d+)", str(killed.value)).group(1))
    assert pid not in (os.getpid(), server.process.pid)
    # The server lives on, and the next worker is forked from it: a verification that passes.
    assert server.process.poll() is None and forkserver.server_for(environment) is server
    seen, relay = lines()
    assert run_worker("verify", workspace, artifact, relay) == {"verify_fingerprint": artifact.verify_fingerprint}
    assert any("# t (qwen3_5_vision_tower): PASSED" in line for line in seen), seen


def test_a_server_per_environment_and_none_where_switched_off() -> None:
    environment = _process_environment(dict(os.environ))
    server = forkserver.server_for(environment)
    if server is None:
        pytest.skip("no fork server could start in this process")
    # Edgebuild's own settings differ per worker: the same server.
    assert forkserver.server_for(environment | {"EDGEBUILD_JOBS": "2"}) is server
    # Anything a library may have read at import differs: a server of its own.
    other = forkserver.server_for(environment | {"A_LIBRARY_SETTING_READ_AT_IMPORT": "on"})
    assert other is not None and other is not server
    assert forkserver.server_for(environment) is server
    assert forkserver.server_for(environment | {"EDGEBUILD_FORK_SERVER": "0"}) is None
